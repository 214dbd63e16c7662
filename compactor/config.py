"""Settings of a compaction run (defaults follow Kafka's and Pulsar's where they agree)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from shale.ledger.codecs import DEFAULT_COMPRESSION, Compression
from shale.ledger.errors import InvalidInputError

__all__ = ["DEFAULT_DELETE_RETENTION_MS", "DEFAULT_GC_GRACE_MS", "DEFAULT_MAX_MAP_BYTES", "DEFAULT_ORPHAN_GRACE_MS",
           "MIN_ORPHAN_GRACE_MS",
           "CompactionConfig"]

DEFAULT_DELETE_RETENTION_MS: Final = 24 * 3_600_000  # Kafka's delete.retention.ms
DEFAULT_GC_GRACE_MS: Final = 5 * 60_000  # Kafka waits 60 s (file.delete.delay.ms); readers of objects are slower
DEFAULT_ORPHAN_GRACE_MS: Final = 3_600_000
#: 1 GiB holds about 44.7 million keys at 24 bytes each (Kafka's default buffer is 128 MiB).
DEFAULT_MAX_MAP_BYTES: Final = 1 << 30
#: Writers give up on an upload older than a third of this before publishing it, and
#: garbage collection never treats anything younger as an orphan.
MIN_ORPHAN_GRACE_MS: Final = 15 * 60_000


@dataclass(frozen=True, slots=True)
class CompactionConfig:
    """How a run compacts.

    * ``min_compaction_lag_ms`` — records younger than this are not compacted yet.
    * ``delete_retention_ms`` — how long a tombstone stays in the compacted ledger after
      the first compaction that kept it (0 drops tombstones at once, as Pulsar does).
    * ``retain_null_key`` — keep records without a key in place instead of dropping them.
    * ``min_dirty_ratio`` — skip the run when dirty bytes / live bytes is below this.
    * ``gc_grace_ms`` — retired compacted ledgers are deleted only after this long.
    * ``max_map_bytes`` — the most pass one's key map may hold (24 bytes per key written
      since the last run); when the new keys need more, the run compacts up to where
      they fit and the next run continues (local engine).
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
    """

    min_compaction_lag_ms: int = 0
    delete_retention_ms: int = DEFAULT_DELETE_RETENTION_MS
    retain_null_key: bool = False
    min_dirty_ratio: float = 0.0
    dry_run: bool = False
    gc_grace_ms: int = DEFAULT_GC_GRACE_MS
    orphan_grace_ms: int = DEFAULT_ORPHAN_GRACE_MS
    collect_garbage: bool = True
    max_part_bytes: int = 256 * 1024 * 1024
    max_map_bytes: int = DEFAULT_MAX_MAP_BYTES
    reuse_min_bytes: int = 8 * 1024 * 1024
    reuse_min_live: float = 0.5
    read_parallelism: int = 4
    max_read_bytes_per_s: int = 0
    max_write_bytes_per_s: int = 0
    chunk_bytes: int = 8 * 1024 * 1024
    workers: int = 0
    compression: Compression = DEFAULT_COMPRESSION
    entry_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        for name in ("min_compaction_lag_ms", "delete_retention_ms", "gc_grace_ms", "orphan_grace_ms"):
            if getattr(self, name) < 0:
                raise InvalidInputError(f"{name} must not be negative")
        if self.orphan_grace_ms < MIN_ORPHAN_GRACE_MS:
            raise InvalidInputError(f"orphan grace must be at least {MIN_ORPHAN_GRACE_MS // 60_000} minutes")
        if not 0.0 <= self.min_dirty_ratio <= 1.0:
            raise InvalidInputError(f"min dirty ratio {self.min_dirty_ratio} must be between 0 and 1")
        if not 0.0 <= self.reuse_min_live <= 1.0 or self.reuse_min_bytes < 0:
            raise InvalidInputError("reuse limits must be a share between 0 and 1 and a size >= 0")
        if not 1 <= self.read_parallelism <= 64:
            raise InvalidInputError(f"read parallelism {self.read_parallelism} must be between 1 and 64")
        if self.max_read_bytes_per_s < 0 or self.max_write_bytes_per_s < 0:
            raise InvalidInputError("byte-rate limits must not be negative")
        if not 0 <= self.workers <= 64:
            raise InvalidInputError(f"workers {self.workers} must be between 0 (automatic) and 64")
        if self.max_map_bytes < 24:
            raise InvalidInputError("max map bytes must be at least 24 (one key)")
        if not 1 << 10 <= self.entry_bytes <= 16 << 20:
            raise InvalidInputError("entry bytes must be from 1 KiB to 16 MiB")
        if self.max_part_bytes < 1 << 16 or self.chunk_bytes < 1 << 12:
            raise InvalidInputError("max part bytes must be >= 64 KiB and chunk bytes >= 4 KiB")

    def to_json(self) -> dict[str, Any]:
        return {"min_compaction_lag_ms": self.min_compaction_lag_ms,
                "delete_retention_ms": self.delete_retention_ms,
                "retain_null_key": self.retain_null_key, "min_dirty_ratio": self.min_dirty_ratio,
                "compression": str(self.compression)}
