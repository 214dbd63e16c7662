"""Settings of a compaction run (defaults follow Kafka's and Pulsar's where they agree)."""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from shale.ledger.codecs import Compression
from shale.ledger.errors import InvalidInputError
from shale.ledger.ordering import TopicOrder
from shale.ledger.values import dataclass
from shale.settings import SETTINGS, Setting, Settings
from shale.settings.kinds import Duration, Size

__all__ = ["DEFAULT_DELETE_RETENTION_MS", "DEFAULT_GC_GRACE_MS", "DEFAULT_MAX_MAP_BYTES", "DEFAULT_ORPHAN_GRACE_MS",
           "MIN_ORPHAN_GRACE_MS", "RUN_WIDE", "CompactionConfig"]

def _least(name: str) -> int:
    kind = SETTINGS[name].kind
    return kind.least if isinstance(kind, Duration | Size) else 0


# The defaults and limits of the settings a command line may give are the settings
# model's (shale.settings.SETTINGS): named here for the code that needs them.
DEFAULT_DELETE_RETENTION_MS: Final[int] = SETTINGS["delete-retention"].default  # Kafka's delete.retention.ms
# Kafka waits 60 s (file.delete.delay.ms); readers of objects are slower
DEFAULT_GC_GRACE_MS: Final[int] = SETTINGS["gc-grace"].default
DEFAULT_ORPHAN_GRACE_MS: Final[int] = SETTINGS["orphan-grace"].default
#: 1 GiB holds about 44.7 million keys at 24 bytes each (Kafka's default buffer is 128 MiB).
DEFAULT_MAX_MAP_BYTES: Final = 1 << 30
#: Writers give up on an upload older than a third of this before publishing it, and
#: garbage collection never treats anything younger as an orphan.
MIN_ORPHAN_GRACE_MS: Final[int] = _least("orphan-grace")


#: The settings of ``compact`` that are the run's rather than one topic's compaction's:
#: which topics, how many at once, where the passes run, what is shown and pushed.  Every
#: other setting of ``compact`` is a field of :class:`CompactionConfig` (checked below).
RUN_WIDE: Final = frozenset({"topics", "all", "metadata", "max-topics", "parallel", "max-compaction-lag", "json",
                             "log-format", "pushgateway", "pushgateway-job", "print-config", "engine", "spark-master",
                             "spark-remote", "spark-conf", "spark-split-size", "no-forward-credentials",
                             "iceberg-property"})


def _setting(name: str, **default: Any) -> Any:
    """A field made from the setting ``name`` of the settings model: its default (unless
    ``default`` gives another, for a setting whose default is said in words), checked by
    its kind when the config is made, and filled from it by :meth:`CompactionConfig.from_settings`."""
    s = SETTINGS[name]
    return dataclasses.field(default=default.get("default", s.default), metadata={"setting": name})


@dataclass(frozen=True, slots=True)
class CompactionConfig:
    """How a run compacts.

    * ``min_compaction_lag_ms`` — records younger than this are not compacted yet.
    * ``delete_retention_ms`` — how long a tombstone stays in the compacted ledger after
      the first compaction that kept it (0 drops tombstones at once, as Pulsar does).
    * ``subscription_expiry_ms`` — a subscription that has not committed for this long
      holds nothing back; ``max_tombstone_hold_ms`` — a tombstone past the delete retention
      that an active subscription has yet to read stays until it has been kept this long
      (0: subscriptions hold no tombstone back) (:mod:`shale.metadata.subscriptions`).
    * ``retain_null_key`` — keep records without a key in place instead of dropping them.
    * ``arrow_cache`` — write an Arrow cache beside each part written
      (:mod:`shale.ledger.arrow_cache`).
    * ``min_dirty_ratio`` — skip the run when dirty bytes / live bytes is below this.
    * ``gc_grace_ms`` — retired compacted ledgers are deleted only after this long.
    * ``max_map_bytes`` — the most pass one's key map may hold (24 bytes per key written
      since the last run); when the new keys need more, the run compacts up to where
      they fit and the next run continues (local engine).
    * ``max_memory`` — the most the whole run may hold (local engine; ``None``: no bound
      but the other settings): the run's buffers, reads and writes in flight and key map
      are sized from it (:mod:`shale.compactor.budget`), the key map taking what the rest
      leaves, within ``max_map_bytes``.  What it sets: ``map_window_records`` — records
      handed to pass one's key map at once (0: a ledger at a time);
      ``chunk_raw_bytes`` / ``chunk_records`` — the most one of pass two's reads may
      hold decompressed, and in records (0: no limit but ``chunk_bytes`` stored); and
      ``write_behind_bytes`` — bytes pass two's writes may keep waiting, per process.
    * ``reuse_min_bytes`` / ``reuse_min_live`` — an incremental run keeps a previous
      compacted part in place, with a deletion vector for its superseded records, when the
      part has at least this many bytes and this share of its records still live; other
      parts are copied (and small ones merged).  The local engine reuses; Spark copies.
    * ``read_parallelism`` — ranged reads pass two keeps in flight (chunks of
      ``chunk_bytes``), so memory for reads is about their product.
    * ``max_read_bytes_per_s`` / ``max_write_bytes_per_s`` — pass two's byte-rate limits
      (0: none).
    * ``workers`` — processes the local engine's pass two copies with (0: one per
      available CPU, at most 8); small runs use one.
    * ``compression`` — how the entries a run writes anew are compressed: the survivors of
      partly kept entries, packed into entries of about ``entry_bytes`` (decompressed).
      Entries whose records all survive keep their stored bytes, whatever their codec.
    * ``orphan_grace_ms`` — unreferenced leftovers (crashed runs, lost races) are deleted
      only after this long; it must exceed the longest pause a writer can take between
      uploading and publishing.
    * ``event_times`` — the parts keep each record's event time in their footers (column
      ``r_event``); otherwise (the default) pass two gathers none and the parts say
      nothing of them (docs/format.md).  Runs whose order needs times keep them
      whatever this says (:attr:`keeps_times`).
    * ``order`` — which record of a key wins: ``offset`` or ``event-time``
      (:mod:`shale.ledger.ordering`); ``key_ttl_ms`` — keys whose winner is older than
      this are dropped (0: never).
    * ``rewrite`` — compact every original ledger still kept again, with the compacted
      view, as a first run would (needed to change the order of a compacted view).
    * ``snapshot_retention`` / ``snapshot_retention_age_ms`` — how many published views
      stay readable, the new one included (1: only it), and for how long a view replaced
      stays readable whatever their count (0: not by age): :mod:`shale.maintenance.snapshots`.
    """

    min_compaction_lag_ms: int = _setting("min-compaction-lag")
    delete_retention_ms: int = _setting("delete-retention")
    retain_null_key: bool = _setting("retain-null-key")
    arrow_cache: bool = _setting("arrow-cache")
    subscription_expiry_ms: int = _setting("subscription-expiry")
    max_tombstone_hold_ms: int = _setting("max-tombstone-hold")
    min_dirty_ratio: float = _setting("min-dirty-ratio")
    dry_run: bool = _setting("dry-run")
    gc_grace_ms: int = _setting("gc-grace")
    orphan_grace_ms: int = _setting("orphan-grace")
    collect_garbage: bool = _setting("no-gc", default=True)  # (the flag says the opposite)
    max_part_bytes: int = _setting("max-part-bytes")
    max_map_bytes: int = _setting("max-map-bytes", default=DEFAULT_MAX_MAP_BYTES)
    max_memory: int | None = _setting("max-memory")
    map_window_records: int = 0
    reuse_min_bytes: int = 8 * 1024 * 1024
    reuse_min_live: float = 0.5
    read_parallelism: int = _setting("read-parallelism")
    max_read_bytes_per_s: int = _setting("max-read-bytes-per-second")
    max_write_bytes_per_s: int = _setting("max-write-bytes-per-second")
    chunk_bytes: int = 8 * 1024 * 1024
    chunk_raw_bytes: int = 0
    chunk_records: int = 0
    workers: int = _setting("workers")
    compression: Compression = _setting("compression")
    entry_bytes: int = 64 * 1024
    write_behind_bytes: int = 64 << 20
    event_times: bool = False
    order: str = _setting("order")
    key_ttl_ms: int = _setting("key-ttl")
    rewrite: bool = _setting("rewrite")
    snapshot_retention: int = _setting("snapshot-retention")
    snapshot_retention_age_ms: int = _setting("snapshot-retention-age")

    def __post_init__(self) -> None:
        # the settings a command line gives are checked as their flags are
        for name, s in _FIELDS.items():
            if getattr(self, name) is None:
                continue  # a setting with no default, not given
            try:
                s.kind.check(getattr(self, name))
            except InvalidInputError as e:
                raise InvalidInputError(f"{name}: {e}") from None
        if not 0.0 <= self.reuse_min_live <= 1.0 or self.reuse_min_bytes < 0:
            raise InvalidInputError("reuse limits must be a share between 0 and 1 and a size >= 0")
        if not 1 << 10 <= self.entry_bytes <= 16 << 20:
            raise InvalidInputError("entry bytes must be from 1 KiB to 16 MiB")
        if self.chunk_bytes < 1 << 12:
            raise InvalidInputError("chunk bytes must be at least 4 KiB")

    @property
    def topic_order(self) -> TopicOrder:
        """The order and key TTL this run decides by."""
        return TopicOrder(self.order, self.key_ttl_ms)

    @property
    def keeps_times(self) -> bool:
        """Whether the parts this run writes keep each record's event and publish times."""
        return self.event_times or self.topic_order.needs_times

    @classmethod
    def from_settings(cls, settings: Settings) -> CompactionConfig:
        """The run settings ``compact``'s resolved settings give (a topic's policy applied
        or not: :meth:`~shale.settings.Settings.with_policy`); a setting with no value
        (``--max-map-bytes`` unset) keeps this class's default."""
        values = {name: settings.value(s.name) for name, s in _FIELDS.items()
                  if s.name in settings and settings.value(s.name) is not None}
        if "collect_garbage" in values:
            values["collect_garbage"] = not values["collect_garbage"]  # (given as --no-gc)
        parallel = settings.value("parallel") if "parallel" in settings else None
        if values.get("max_memory") and isinstance(parallel, int) and parallel > 1:
            # topics compacted at once share the process: each gets its share
            values["max_memory"] = max(_least("max-memory"), values["max_memory"] // parallel)
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        """What a published state records of the settings it was compacted with."""
        return {"min_compaction_lag_ms": self.min_compaction_lag_ms,
                "delete_retention_ms": self.delete_retention_ms,
                "retain_null_key": self.retain_null_key, "min_dirty_ratio": self.min_dirty_ratio,
                "compression": str(self.compression), **self.topic_order.to_json()}


#: The fields made from the settings model, by field name.
_FIELDS: Final[dict[str, Setting]] = {f.name: SETTINGS[f.metadata["setting"]]
                                      for f in dataclasses.fields(CompactionConfig) if "setting" in f.metadata}


def _check_complete() -> None:
    """Every setting of ``compact`` that is not the run's own is a field made from it."""
    made = {s.name for s in _FIELDS.values()}
    missing = [s.name for s in SETTINGS.values() if "compact" in s.commands and s.name not in RUN_WIDE | made]
    if missing:
        raise TypeError(f"CompactionConfig has no field made from the setting(s) {', '.join(missing)}: add one, "
                        "or name it in RUN_WIDE")


_check_complete()
