"""How a run spends ``--max-memory`` (``CompactionConfig.max_memory``).

A run holds, besides the interpreter and its libraries (a fixed overhead, stated in
docs/operations.md):

* for the whole run (:class:`Footprint`): a survival flag per record it reads, the
  masks of the slice being worked on, and the footers it holds as bytes (those read
  from object storage, and those too small to map);
* in pass one, the key map and the hash table it is built in
  (:data:`MAP_BYTES_PER_KEY` a key, against the 24 that ``max_map_bytes`` counts), and
  the records handed to it at once (:data:`WINDOW_BYTES_PER_RECORD` each);
* in pass two, per copying process: the ranged reads in flight, the entries of one read
  decompressed and re-framed, the footer of the part being written (it is written
  last) and the writes waiting for the disk or the network.

Footers mapped from local objects cost only the pages read since they were last given
back (:meth:`~shale.ledger.reader.LedgerFile.release_pages`: once checked, once each
slice is decided and once it is copied).  The two passes never run at once: each may
spend what the run-wide part leaves.  This module turns the bound into the settings
those parts already obey, so the code that holds memory needs no second notion of it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Final

from shale.compactor.config import CompactionConfig
from shale.compactor.cpus import worker_count
from shale.compactor.keymap import EVENT_KEY_BYTES, KEY_BYTES
from shale.compactor.plan import Plan
from shale.ledger.errors import InvalidInputError
from shale.settings.units import format_size

__all__ = ["LOCAL_OVERHEAD", "MAP_BYTES_PER_KEY", "OBJECT_STORE_OVERHEAD", "RUN_BYTES_PER_RECORD", "Footprint",
           "MemoryBudget", "bounded", "memory_budget"]

#: What a key costs in pass one at its peak: the hash table (slots of 24 bytes, at
#: most 60 % full: 40 a key), and, as it is read out in order for lookups while it is
#: kept, a sorted copy of its slots (24) and the map's arrays (24), and the filter and
#: the map's checks in passing.
MAP_BYTES_PER_KEY: Final = 104
#: Under event-time order: the same with slots of 32 bytes and each key's time.
EVENT_MAP_BYTES_PER_KEY: Final = 136
#: Per record the run reads: its survival flag, held for the whole run.
RUN_BYTES_PER_RECORD: Final = 1
#: Per record of the slice being decided or copied: the masks and positions worked out
#: for it (a slice is a ledger, a part, or the stretch of one a run reads).
SLICE_BYTES_PER_RECORD: Final = 12
#: The least that must be left once the run-wide part is paid for.
MIN_LEFT: Final = 16 << 20
#: Per record handed to the map at once: its hashes gathered, sorted and deduplicated.
WINDOW_BYTES_PER_RECORD: Final = 96
#: What a run holds besides ``max_memory`` (the interpreter, NumPy, zstd and the C
#: kernels), on a local folder and on object storage (boto3 and its connections too):
#: a container's memory limit is the bound plus this (docs/operations.md).
LOCAL_OVERHEAD: Final = 64 << 20
OBJECT_STORE_OVERHEAD: Final = 128 << 20
#: A pass-two process gets at least this much, or the run copies with fewer of them.
MIN_PROCESS_BYTES: Final = 24 << 20
#: Per record of one of pass two's reads: the columns gathered and worked out for it.
COLUMN_BYTES_PER_RECORD: Final = 128
_MIN_CHUNK: Final = 256 << 10
_MIN_WINDOW: Final = 1 << 14


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """How a run of ``records`` records spends ``total`` bytes."""

    total: int
    records: int
    #: the most pass one's key map may count, in ``max_map_bytes``'s units (24 bytes a key)
    map_bytes: int
    #: records handed to the key map at once
    window_records: int
    #: processes pass two copies with, and per process:
    processes: int
    chunk_bytes: int
    #: the most one read holds decompressed, and in records
    chunk_raw_bytes: int
    chunk_records: int
    read_parallelism: int
    max_part_bytes: int
    write_behind_bytes: int


@dataclass(frozen=True, slots=True)
class Footprint:
    """What a plan costs whatever the bound: its records, the most of one object, and
    the footers it holds as bytes (read from object storage, or too small to map)."""

    records: int
    largest_slice: int
    held_footer_bytes: int

    @classmethod
    def of(cls, plan: Plan) -> Footprint:
        """The footprint of a plan made with footers."""
        files = {id(s.file): s.file for s in plan.slices}
        return cls(sum(s.records for s in plan.slices), max((s.object.records for s in plan.slices), default=0),
                   sum(f.footer_bytes for f in files.values() if not f.footer_mapped))

    @property
    def bytes(self) -> int:
        return (self.records * RUN_BYTES_PER_RECORD + self.largest_slice * SLICE_BYTES_PER_RECORD
                + self.held_footer_bytes)


def memory_budget(config: CompactionConfig, footprint: Footprint) -> MemoryBudget:
    """How ``config.max_memory`` is spent on a run of this ``footprint`` (an
    :class:`InvalidInputError` naming the setting when that leaves too little)."""
    total = config.max_memory
    if total is None:
        raise ValueError("the run has no memory bound")
    records = footprint.records
    run_wide = footprint.bytes
    left = total - run_wide
    if left < MIN_LEFT:
        held = f", {_mib(footprint.held_footer_bytes)} of footers held in memory" if footprint.held_footer_bytes else ""
        raise InvalidInputError(
            f"--max-memory {format_size(total)} is too small for a run over {records:,} records (up to "
            f"{footprint.largest_slice:,} of one object{held}: {_mib(run_wide)} before the key map and buffers); "
            f"give at least {-(-(run_wide + MIN_LEFT) >> 20)}MiB")
    # pass one: a window of records in flight, the rest for the map
    window = max(_MIN_WINDOW, left // 8 // WINDOW_BYTES_PER_RECORD)
    per_key = EVENT_MAP_BYTES_PER_KEY if config.topic_order.by_event_time else MAP_BYTES_PER_KEY
    unit = EVENT_KEY_BYTES if config.topic_order.by_event_time else KEY_BYTES
    keys = max(1, (left - window * WINDOW_BYTES_PER_RECORD) // per_key)
    map_bytes = min(config.max_map_bytes, keys * unit)
    # pass two: each process its share, in sixteenths: the reads in flight 2, a read's
    # entries decompressed 1 (in a buffer that may double: 2), the batch re-framed from
    # them 1 (two such buffers, each of which may double: 4), the records' columns
    # gathered for it 1, the part's footer 2 (4 while it is encoded), the writes waiting 2
    processes = max(1, min(worker_count(config.workers), left // MIN_PROCESS_BYTES))
    share = left // processes
    chunk = max(_MIN_CHUNK, min(config.chunk_bytes, share // 16))
    parallelism = max(1, min(config.read_parallelism, share // 8 // chunk))
    part = max(64 << 10, min(config.max_part_bytes, share // 8))
    write_behind = max(chunk, share // 8)
    return MemoryBudget(total, records, map_bytes, window, processes, chunk, chunk,
                        max(1, chunk // COLUMN_BYTES_PER_RECORD), parallelism, part, write_behind)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f}MiB"


def bounded(config: CompactionConfig, plan: Plan) -> CompactionConfig:
    """``config`` with the settings its memory bound sets for a run of ``plan`` (made
    with footers; unchanged without a bound)."""
    if config.max_memory is None:
        return config
    b = memory_budget(config, Footprint.of(plan))
    return dataclasses.replace(config, max_map_bytes=b.map_bytes, map_window_records=b.window_records,
                               workers=b.processes, chunk_bytes=b.chunk_bytes, chunk_raw_bytes=b.chunk_raw_bytes,
                               chunk_records=b.chunk_records, read_parallelism=b.read_parallelism,
                               max_part_bytes=b.max_part_bytes, write_behind_bytes=b.write_behind_bytes)
