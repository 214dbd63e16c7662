"""A topic's compacted view as an Iceberg table: one snapshot per epoch, incremental.

:func:`sync_table` brings the table to the topic's published epoch.  The snapshot holds
exactly ``shale read --table --as-of EPOCH``: the latest record of every live key through
the horizon (:func:`~shale.reader.latest.plan_latest` as of that epoch, its key TTL
counted from the epoch's publish time), nothing above it.  Its summary carries
``shale.epoch``, ``shale.horizon`` and ``shale.topic``; a table already at the epoch gets
no snapshot.

Incremental: the table is read as it is (:mod:`shale.iceberg.state`: the message ids of
its live rows), the difference between it and the view is found from the two epochs'
parts or from footers (:mod:`shale.iceberg.diff`), and only the difference is written: the
records the table lacks as new data files (read from the view's objects, only those), the
rows the view no longer holds removed by one position-delete file.  An epoch that changes
1 % of the keys writes about 1 % of the table.  Maintenance happens in the same commit: a
data file whose deleted fraction passes ``rewrite_fraction`` is rewritten (its live rows
copied into a new file, it and the delete files that only name removed files dropped),
and once more than :data:`~shale.iceberg.diff.MAX_DELETE_FILES` delete files are live they
are merged into one.

Two compactors, or a compactor and an export, may sync at once: each commit requires the
branch head it read, so one of them loses, reads the table again, and either finds the
epoch there (nothing to do: an epoch is never committed twice) or decides anew.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from shale.iceberg.catalog import IcebergTarget, open_catalog, translated
from shale.iceberg.diff import Diff, decide
from shale.iceberg.schema import arrow_schema, check_schema, rows_of, table_schema
from shale.iceberg.state import TableState, read_state, snapshot_epoch
from shale.ledger.errors import ConflictError, InvalidInputError
from shale.ledger.values import dataclass
from shale.metadata.topic import TopicMetadata
from shale.reader.latest import LatestPlan, latest_batches

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

__all__ = ["ATTEMPTS", "SyncResult", "sync_table"]

#: Commits tried when another writer changes the table meanwhile (each reads it again).
ATTEMPTS: Final = 5
#: Table properties set when Shale makes a table.
_PROPERTIES: Final = {"format-version": "2", "write.metadata.delete-after-commit.enabled": "true",
                      "write.metadata.previous-versions-max": "20", "write.parquet.compression-codec": "zstd"}


@dataclass(frozen=True, slots=True)
class SyncResult:
    """What a sync did: ``status`` ``committed`` (a snapshot was made) or ``current`` (the
    table already held the epoch); the table's rows after it, the rows added and deleted,
    the files rewritten, the bytes written and the table's live bytes, the snapshots
    expired, and how long it took."""

    topic: str
    table: str
    epoch: int
    horizon: str | None
    status: str
    snapshot_id: int | None = None
    rows: int = 0
    added: int = 0
    deleted: int = 0
    rewritten_files: int = 0
    bytes_written: int = 0
    table_bytes: int = 0
    expired: int = 0
    files_removed: int = 0
    seconds: float = 0.0
    #: how the difference was found: ``views`` (the two epochs' parts) or ``table`` (the
    #: whole table of the epoch; :mod:`shale.iceberg.diff`); empty when nothing was committed
    planned_by: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "table": self.table, "epoch": self.epoch, "horizon": self.horizon,
                "status": self.status, "snapshot_id": self.snapshot_id, "rows": self.rows, "added": self.added,
                "deleted": self.deleted, "rewritten_files": self.rewritten_files, "bytes_written": self.bytes_written,
                "table_bytes": self.table_bytes, "snapshots_expired": self.expired,
                "files_removed": self.files_removed, "seconds": round(self.seconds, 3), "planned_by": self.planned_by}

    def human(self) -> str:
        if self.status == "current":
            return f"{self.topic}: {self.table} already holds epoch {self.epoch} ({self.rows:,} rows)"
        return (f"{self.topic}: {self.table} at epoch {self.epoch}: {self.rows:,} rows, {self.added:,} added, "
                f"{self.deleted:,} deleted, {self.bytes_written:,} bytes written in {self.seconds:.2f}s")


def sync_table(meta: TopicMetadata, target: IcebergTarget, *, epoch: int | None = None, grace_ms: int = 5 * 60_000,
               orphan_grace_ms: int = 3_600_000, progress: Callable[[str], None] | None = None) -> SyncResult:
    """Bring ``target`` to ``meta``'s published epoch (``epoch``: to that retained epoch,
    unless the table holds a later one; see the module); expire the snapshots of epochs
    the topic no longer retains once they were replaced ``grace_ms`` ago, and remove the
    files only they read, and the files no snapshot names older than ``orphan_grace_ms``
    (:mod:`shale.iceberg.expire`)."""
    started = time.perf_counter()
    published = meta.load_compaction()
    if not published.epoch:
        raise InvalidInputError(f"{meta.uri} was never compacted: its Iceberg table holds a compacted view "
                                "(run compact first)")
    state = published if epoch is None else published.at_epoch(epoch)
    if state is None:
        raise InvalidInputError(f"{meta.uri} does not retain epoch {epoch} (it retains "
                                f"{', '.join(map(str, published.retained_epochs))})")
    catalog = open_catalog(target)
    with translated(target):
        table = _load_table(catalog, target, meta)
        for _ in range(ATTEMPTS):
            try:
                result = _sync_once(meta, table, target, state.epoch, str(state.horizon), progress)
                break
            except ConflictError:
                table = catalog.load_table(target.identifier)
        else:
            raise ConflictError(f"{target.shown} kept changing: {ATTEMPTS} commits lost to other writers")
        from shale.iceberg.expire import expire_snapshots, remove_orphans

        expired, removed = expire_snapshots(catalog.load_table(target.identifier), meta.load_compaction(),
                                            grace_ms=grace_ms)
        removed += remove_orphans(catalog.load_table(target.identifier), grace_ms=orphan_grace_ms)
    return dataclasses.replace(result, expired=expired, files_removed=removed, seconds=time.perf_counter() - started)


def _load_table(catalog: Catalog, target: IcebergTarget, meta: TopicMetadata) -> Table:
    """The table, made (with its namespace) when missing; one of another shape, or of
    another topic, is refused."""
    from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError

    namespace = target.identifier[:-1]
    try:
        table = catalog.load_table(target.identifier)
    except NoSuchTableError:
        try:
            catalog.create_namespace(namespace)
        except NamespaceAlreadyExistsError:
            pass
        fmt = target.value_format or "binary"
        props = {**_PROPERTIES, "shale.topic": meta.uri, "shale.value-format": fmt}
        try:
            return catalog.create_table(target.identifier, schema=table_schema(fmt), properties=props)
        except TableAlreadyExistsError:  # made meanwhile by another writer: checked as any other
            table = catalog.load_table(target.identifier)
    check_schema(table.schema(), target.value_format, target.shown)
    owner = table.properties.get("shale.topic")
    if owner != meta.uri:
        whose = f"holds the topic {owner}" if owner else "was not made by Shale"
        raise InvalidInputError(f"{target.shown} {whose}, not {meta.uri}: give another table")
    if table.format_version != 2:
        raise InvalidInputError(f"{target.shown} is Iceberg v{table.format_version}; Shale writes v2 tables")
    return table


def value_format(table: Table, target: IcebergTarget) -> str:
    """How ``table`` keeps keys and values: as asked, else as it was made."""
    strings = check_schema(table.schema(), target.value_format, target.shown)
    if target.value_format is not None:
        return target.value_format
    made = table.properties.get("shale.value-format")
    return made if made in ("text", "json") and strings else "text" if strings else "binary"


def _sync_once(meta: TopicMetadata, table: Table, target: IcebergTarget, epoch: int, horizon: str,
               progress: Callable[[str], None] | None) -> SyncResult:
    """One try: read the table, decide, write, commit (ConflictError: lost to another writer)."""
    from shale.iceberg.commit import commit_snapshot
    from shale.iceberg.files import FileWriter

    shown = target.table
    fmt = value_format(table, target)
    head = table.current_snapshot()
    done = snapshot_epoch(head)
    if head is not None and done is not None and done >= epoch:  # (its summary says so: nothing is read)
        totals = head.summary.additional_properties if head.summary else {}
        rows = int(totals.get("total-records", 0)) - int(totals.get("total-position-deletes", 0))
        return SyncResult(meta.uri, shown, done, head.summary.additional_properties.get("shale.horizon", horizon)
                          if head.summary else horizon, "current", head.snapshot_id, rows,
                          table_bytes=int(totals.get("total-files-size", 0)))
    current = read_state(table)
    if progress is not None:
        progress(f"planning epoch {epoch}")
    diff = decide(meta, current, epoch, target.rewrite_fraction)
    writer = FileWriter(table)
    try:
        data, deletes = _write(meta, table, diff, writer, fmt)
        props = {"shale.epoch": str(epoch), "shale.horizon": horizon, "shale.topic": meta.uri}
        removed = frozenset(diff.removed)
        committed = commit_snapshot(table, data, deletes, removed, props)
    except BaseException:
        writer.remove_written()
        raise
    snap = committed.current_snapshot()
    written = sum(int(f.file_size_in_bytes) for f in (*data, *deletes))
    added = sum(len(c.records) for c in diff.added)
    return SyncResult(meta.uri, shown, epoch, horizon, "committed", snap.snapshot_id if snap else None, diff.rows,
                      added, diff.deleted_rows, len(diff.rewrites), written, _live_bytes(current, data, deletes, diff),
                      planned_by=diff.how)


def _live_bytes(current: TableState, data: list[DataFile], deletes: list[DataFile], diff: Diff) -> int:
    kept = sum(int(d.file.file_size_in_bytes) for d in current.data if d.path not in diff.removed)
    kept += sum(int(f.file_size_in_bytes) for f, _ in current.deletes if str(f.file_path) not in diff.removed)
    return kept + sum(int(f.file_size_in_bytes) for f in (*data, *deletes))


def _write(meta: TopicMetadata, table: Table, diff: Diff, writer: Any,
           value_format: str) -> tuple[list[DataFile], list[DataFile]]:
    """The commit's files: the view's new records, the rewritten files' live rows, the
    deletes."""
    target = arrow_schema(value_format)
    added = LatestPlan(tuple(diff.added), 0)
    batches = latest_batches(meta, added, utf8=value_format != "binary")
    data = writer.data_files(rows_of(b, target) for b in batches)
    if diff.rewrites:
        data += writer.data_files(_kept_rows(table, diff.rewrites, target))
    deletes = [] if not diff.deletes else [writer.delete_file(diff.deletes)]
    return data, [d for d in deletes if d is not None]


def _kept_rows(table: Table, rewrites: list[tuple[str, npt.NDArray[np.int64]]], target: pa.Schema
               ) -> Iterator[pa.Table]:
    """The live rows of each file rewritten, read back from it."""
    import pyarrow.parquet as pq

    for path, keep in rewrites:
        with table.io.new_input(path).open() as f:
            t = pq.read_table(f)
        yield t.take(keep).select(target.names).cast(target)
