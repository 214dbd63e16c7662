"""The Iceberg table as commands ask for it: ``shale export --format iceberg``, and every
``compact`` of a topic whose policy names a table.

The table's settings (``iceberg-catalog``, ``iceberg-table``, ``iceberg-warehouse``,
``iceberg-value-format``, ``iceberg-rewrite-fraction``; shale/settings/model.py) come as
every setting does: the command's flag, else the topic's policy, else a ``SHALE_*``
variable, else the default; ``iceberg-property`` from the flags (or
``SHALE_ICEBERG_PROPERTY``, one a line) only, never from a policy document, since a
catalog's credentials have no place there.

After a publish (:func:`after_publish`, the hook :func:`~shale.compactor.compact_topics`
calls), the table is brought to the published epoch.  It runs after every run that did
not fail, nothing to compact included, so that a table a failed commit left behind
catches up at the next run.  Its failure never undoes or blocks the compaction: it is
written into the run's summary (``iceberg``, and the exit code of the error), and the
compaction stands.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from shale.iceberg.catalog import IcebergTarget
from shale.ledger.errors import InvalidInputError, error_line
from shale.ledger.masking import mask_secrets

if TYPE_CHECKING:
    from shale.compactor.summary import RunSummary
    from shale.iceberg.sync import SyncResult
    from shale.metadata.policy import TopicPolicy
    from shale.metadata.topic import TopicMetadata
    from shale.settings import Settings

__all__ = ["after_publish", "export_iceberg", "target_of"]

_FIELDS = ("iceberg_catalog", "iceberg_table", "iceberg_warehouse", "iceberg_value_format",
           "iceberg_rewrite_fraction")


def target_of(given: Mapping[str, Any], policy: Mapping[str, Any],
              properties: tuple[tuple[str, str], ...] = ()) -> IcebergTarget | None:
    """The table ``given`` (settings by field name, None where not given) names, else the
    one ``policy`` names; None when neither names a catalog."""
    values = {f: given.get(f) if given.get(f) is not None else policy.get(f) for f in _FIELDS}
    if values["iceberg_catalog"] is None and values["iceberg_table"] is None:
        return None
    if values["iceberg_catalog"] is None or values["iceberg_table"] is None:
        missing = "--iceberg-catalog" if values["iceberg_catalog"] is None else "--iceberg-table"
        raise InvalidInputError(f"an Iceberg table needs both a catalog and a table name: {missing} is missing "
                                "(a flag, or the topic's policy: shale config TOPIC --set NAME=VALUE)")
    return IcebergTarget(values["iceberg_catalog"], values["iceberg_table"], values["iceberg_warehouse"],
                         values["iceberg_value_format"], properties,
                         0.2 if values["iceberg_rewrite_fraction"] is None else values["iceberg_rewrite_fraction"])


def _given(settings: Settings) -> dict[str, Any]:
    """The Iceberg settings (the topic's policy applied) that did not come from their
    defaults, by field name."""
    from shale.settings import Source

    out = {}
    for name in ("iceberg-catalog", "iceberg-table", "iceberg-warehouse", "iceberg-value-format",
                 "iceberg-rewrite-fraction"):
        v = settings[name]
        out[v.setting.py_name] = None if v.source is Source.DEFAULT else v.value
    return out


def export_iceberg(topic_uri: str, settings: Settings, metadata_uri: str | None = None) -> SyncResult:
    """``shale export --format iceberg``: bring the table the flags (else the topic's
    policy) name to the topic's published epoch."""
    from shale.iceberg.sync import sync_table
    from shale.metadata.topic import TopicMetadata

    meta = TopicMetadata.open(topic_uri, metadata_uri)
    meta.load_topic()  # (a missing topic is said as such, before any catalog is reached)
    own = settings.with_policy(meta.load_policy().to_json())
    target = target_of(_given(own), {}, tuple(settings.value("iceberg-property")))
    if target is None:
        raise InvalidInputError("--format iceberg needs --iceberg-catalog URI and --iceberg-table NS.NAME (or the "
                                "topic's policy: shale config TOPIC --set iceberg-catalog=URI --set "
                                "iceberg-table=NS.NAME)")
    _refuse_inside(meta, target)
    return sync_table(meta, target)


def _refuse_inside(meta: TopicMetadata, target: IcebergTarget) -> None:
    """A warehouse inside the topic is refused: a writer writes only where it owns."""
    w = target.warehouse
    if w is None:
        return
    import os

    def norm(u: str) -> str:
        u = u.removeprefix("file://")
        return os.path.abspath(u) if "://" not in u else u.rstrip("/")

    topic = norm(meta.uri)
    if norm(w) == topic or norm(w).startswith(topic.rstrip("/") + "/"):
        raise InvalidInputError(f"the Iceberg warehouse {w} lies inside the topic {meta.uri}: give a folder of its own")


def after_publish(meta: TopicMetadata, policy: TopicPolicy, settings: Settings, summary: RunSummary) -> None:
    """The compaction hook (see the module): a topic whose policy names a table has it
    brought to the published epoch, the outcome in ``summary``."""
    if not summary.ok or summary.status == "dry-run":
        return
    try:
        target = target_of({}, policy.to_json(), tuple(settings.value("iceberg-property")))
    except InvalidInputError as e:
        _failed(summary, e, policy.get("iceberg_table") or "?")
        return
    if target is None or not meta.load_compaction().epoch:
        return
    from shale.iceberg.sync import sync_table

    try:
        _refuse_inside(meta, target)
        result = sync_table(meta, target, grace_ms=settings.value("gc-grace"),
                            orphan_grace_ms=settings.value("orphan-grace"))
    except Exception as e:  # never the compaction's failure: reported beside it
        _failed(summary, e, target.table)
        return
    summary.iceberg = result.to_json()
    note = (f"Iceberg table {target.table} at epoch {result.epoch}" if result.status == "committed"
            else f"Iceberg table {target.table} already at epoch {result.epoch}")
    summary.message = f"{summary.message}; {note}" if summary.message else note


def _failed(summary: RunSummary, e: Exception, table: str) -> None:
    line = mask_secrets(error_line(e))
    summary.iceberg = {"table": table, "status": "error", "error": line}
    summary.iceberg_failure = e
    note = f"Iceberg table {table} not brought up to date: {line}"
    summary.message = f"{summary.message}; {note}" if summary.message else note
