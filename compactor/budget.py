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

An entry that holds more, decompressed, than one of pass two's reads may (a sixteenth of
a process's share) is copied alone, as a stream (:mod:`shale.compactor.big_entries`):
in place of the read's buffers it holds a piece of its stored bytes, its decompressor
(a zstd frame's window, read from the frame's header; an lz4 block whole, stored and
decompressed), its biggest record, a group's output and the compressor, and the rows of
its records.  The footers say all of that but the window before anything is read
(:class:`BigEntry`), so a bound one of them cannot fit in is refused before the run
reads anything, naming the entry and the least bound that would do.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import field
from typing import Final

import numpy as np
import numpy.typing as npt

from shale.compactor.big_entries import GROUP_BYTES, PART_ROWS_BYTES, PIECE_BYTES, ROW_BYTES
from shale.compactor.config import CompactionConfig
from shale.compactor.keymap import EVENT_KEY_BYTES, KEY_BYTES
from shale.compactor.plan import Plan
from shale.ledger.codecs import Codec, Compression
from shale.ledger.errors import InvalidInputError
from shale.ledger.format import FRAME_HEADER
from shale.ledger.reader import LedgerFile
from shale.ledger.stream import FRAME_HEADER_MAX, ZSTD_STREAM_BYTES, zstd_window
from shale.ledger.values import dataclass
from shale.runtime.cpus import worker_count
from shale.settings import SETTINGS
from shale.settings.units import format_size

__all__ = ["LOCAL_OVERHEAD", "MAP_BYTES_PER_KEY", "OBJECT_STORE_OVERHEAD", "RUN_BYTES_PER_RECORD", "BigEntry",
           "Footprint", "MemoryBudget", "big_entry_bytes", "bounded", "least_memory", "memory_budget"]

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
#: The least ``--max-memory`` a command line takes.
_LEAST_SETTING: Final[int] = SETTINGS["max-memory"].kind.least  # type: ignore[attr-defined]
#: A zstd entry bigger than this has its frame's header read while planning (its
#: window); a smaller one is counted as if its window were its whole content.
PEEK_BYTES: Final = 4 << 20


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
class BigEntry:
    """An entry that may be copied as a stream (:mod:`shale.compactor.big_entries`), by
    its footer: ``raw`` bytes decompressed, its biggest ``record``, what its decompressor
    and its records' rows hold (``held``), and where it is (``where``: the object and
    entry, as errors name them)."""

    raw: int
    record: int
    held: int
    where: str
    codec: int = Codec.NONE


@dataclass(frozen=True, slots=True)
class Footprint:
    """What a plan costs whatever the bound: its records, the most of one object, and
    the footers it holds as bytes (read from object storage, or too small to map); and
    its entries that may be big (:class:`BigEntry`: bigger than the smallest read, the
    most demanding ones, biggest first)."""

    records: int
    largest_slice: int
    held_footer_bytes: int
    big: tuple[BigEntry, ...] = field(default=())

    @classmethod
    def of(cls, plan: Plan) -> Footprint:
        """The footprint of a plan made with footers (the frames' headers of its biggest
        zstd entries read)."""
        files = {id(s.file): s.file for s in plan.slices}
        big: list[BigEntry] = []
        for s in plan.slices:
            if s.records:
                big.extend(_big_entries(s.file, int(s.file.footer.entry_of(s.start)),
                                        int(s.file.footer.entry_of(s.stop - 1)) + 1))
                s.file.release_pages()
        return cls(sum(s.records for s in plan.slices), max((s.object.records for s in plan.slices), default=0),
                   sum(f.footer_bytes for f in files.values() if not f.footer_mapped), _frontier(big))

    @property
    def bytes(self) -> int:
        return (self.records * RUN_BYTES_PER_RECORD + self.largest_slice * SLICE_BYTES_PER_RECORD
                + self.held_footer_bytes)


def memory_budget(config: CompactionConfig, footprint: Footprint) -> MemoryBudget:
    """How ``config.max_memory`` is spent on a run of this ``footprint`` (an
    :class:`InvalidInputError` naming the setting when that leaves too little: for the
    run as a whole, or for a big entry, named, that no copying process could hold)."""
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
            f"give at least {least_memory(config, footprint)}MiB")
    need, entry = _big_need(config, footprint, left)
    if need > left:
        kind = "an lz4 block, decompressed whole" if entry.codec == Codec.LZ4 else "copied as a stream"
        raise InvalidInputError(
            f"--max-memory {format_size(total)} is too small for {entry.where} ({_mib(entry.raw)} decompressed, "
            f"its biggest record {_mib(entry.record)}; {kind}, it takes {_mib(need)} beside the "
            f"{_mib(run_wide)} the run holds throughout); give at least {least_memory(config, footprint)}MiB")
    # pass two: each process its share, in sixteenths: the reads in flight 2, a read's
    # entries decompressed 1 (in a buffer that may double: 2), the batch re-framed from
    # them 1 (two such buffers, each of which may double: 4), the records' columns
    # gathered for it 1, the part's footer 2 (4 while it is encoded), the writes waiting 2
    processes = max(1, min(worker_count(config.workers), left // MIN_PROCESS_BYTES))
    while processes > 1 and _big_need(config, footprint, left // processes)[0] > left // processes:
        processes -= 1  # (fewer processes, each with room for the biggest entry)
    share = left // processes
    chunk = max(_MIN_CHUNK, min(config.chunk_bytes, share // 16))
    parallelism = max(1, min(config.read_parallelism, share // 8 // chunk))
    part = max(64 << 10, min(config.max_part_bytes, share // 8))
    write_behind = max(chunk, share // 8)
    # pass one: a window of records in flight, the rest for the map; under event-time
    # order, less what decoding the event times of objects whose footers lack them holds
    # (reads of a chunk decompressed, or a big entry read as a stream)
    by_event = config.topic_order.by_event_time
    window = max(_MIN_WINDOW, left // 8 // WINDOW_BYTES_PER_RECORD)
    decode = max(4 * chunk, _big_need(config, footprint, share)[0]) if by_event else 0
    per_key = EVENT_MAP_BYTES_PER_KEY if by_event else MAP_BYTES_PER_KEY
    unit = EVENT_KEY_BYTES if by_event else KEY_BYTES
    keys = max(1, (left - window * WINDOW_BYTES_PER_RECORD - decode) // per_key)
    map_bytes = min(config.max_map_bytes, keys * unit)
    return MemoryBudget(total, records, map_bytes, window, processes, chunk, chunk,
                        max(1, chunk // COLUMN_BYTES_PER_RECORD), parallelism, part, write_behind)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f}MiB"


def _read_share(config: CompactionConfig, share: int) -> int:
    """The most one of pass two's reads holds decompressed, for a process's ``share``
    (``chunk_raw_bytes``, as :func:`memory_budget` sets it)."""
    return max(_MIN_CHUNK, min(config.chunk_bytes, share // 16))


def big_entry_bytes(entry: BigEntry, compression: Compression) -> int:
    """What copying ``entry`` as a stream holds at most (besides what the run holds
    throughout): its decompressor and rows, its biggest record (or a group of records),
    a group's output and the compressor, the stored pieces being read and written, and
    the rows of the part it joins."""
    out = GROUP_BYTES + _compressor_bytes(compression, max(GROUP_BYTES, entry.record))
    return entry.held + max(GROUP_BYTES, entry.record) + out + 2 * PIECE_BYTES + PART_ROWS_BYTES


def _big_need(config: CompactionConfig, footprint: Footprint, share: int) -> tuple[int, BigEntry]:
    """The most a process with ``share`` holds for one big entry (an entry bigger than
    its reads), and that entry (0 and a placeholder with none)."""
    limit = _read_share(config, share)
    best, which = 0, BigEntry(0, 0, 0, "")
    for e in footprint.big:
        if e.raw <= limit:
            break  # (biggest first)
        need = big_entry_bytes(e, config.compression)
        if need > best:
            best, which = need, e
    return best, which


def least_memory(config: CompactionConfig, footprint: Footprint) -> int:
    """The least ``--max-memory``, in MiB, that a run of this ``footprint`` fits in."""
    def fits(mib: int) -> bool:
        left = (mib << 20) - footprint.bytes
        return left >= MIN_LEFT and _big_need(config, footprint, left)[0] <= left

    lo, hi = 1, max(_LEAST_SETTING >> 20, -(-(footprint.bytes + MIN_LEFT) >> 20))
    while not fits(hi):
        lo, hi = hi, hi * 2
    while lo < hi:  # (the least that fits, between a bound that does not and one that does)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
    return hi


def _compressor_bytes(compression: Compression, size: int) -> int:
    """What compressing ``size`` bytes as a zstd stream holds (its context; with a
    dictionary, the dictionary's tables too); nothing for another codec."""
    if compression.codec not in (Codec.ZSTD, Codec.ZSTD_DICT):
        return 0
    extra = 4 * len(compression.dictionary.data) if compression.dictionary is not None else 0
    # (a context grows with the size by powers of two: counted for the next one up)
    return _context_bytes(compression.level, 1 << max(0, size - 1).bit_length()) + extra


@functools.lru_cache(maxsize=128)
def _context_bytes(level: int, size: int) -> int:
    import zstandard

    return int(zstandard.ZstdCompressionParameters.from_level(level, source_size=size)
               .estimated_compression_context_size())


def _big_entries(f: LedgerFile, e0: int, e1: int) -> list[BigEntry]:
    """The entries ``[e0, e1)`` of ``f`` bigger than the smallest read (:data:`_MIN_CHUNK`)."""
    foot = f.footer
    raw = foot.raw_lengths()[e0:e1]
    pick = np.flatnonzero(raw > _MIN_CHUNK) + e0
    if not len(pick):
        return []
    starts = foot.e_rec_start.astype(np.int64)
    counts = starts[pick + 1] - starts[pick]
    first = int(starts[e0])
    # (each entry's biggest record: entries hold one record at least)
    record = np.maximum.reduceat(foot.col("r_size")[first:int(starts[e1])], starts[e0:e1] - first)[pick - e0]
    record = record.astype(np.int64)
    codecs = foot.codecs()[pick]
    raw = raw[pick - e0]
    held = counts * ROW_BYTES
    lz4 = codecs == Codec.LZ4
    held[lz4] += raw[lz4] + foot.col("e_length")[pick[lz4]].astype(np.int64)
    zstd = (codecs == Codec.ZSTD) | (codecs == Codec.ZSTD_DICT)
    held[zstd] += _windows(f, pick[zstd], raw[zstd]) + ZSTD_STREAM_BYTES
    return [BigEntry(int(r), int(m), int(h), f.entry_where(int(e)), int(c)) for e, r, m, h, c in
            zip(pick.tolist(), raw.tolist(), record.tolist(), held.tolist(), codecs.tolist(), strict=True)]


def _windows(f: LedgerFile, entries: npt.NDArray[np.int64], raw: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The window streaming each zstd entry holds (:func:`~shale.ledger.stream.zstd_window`),
    read from its frame's header when it is bigger than :data:`PEEK_BYTES`, else taken to
    be its whole content."""
    out = raw.copy()
    peek = np.flatnonzero(raw > PEEK_BYTES)
    if not len(peek):
        return out
    at = f.footer.col("e_offset")[entries[peek]].astype(np.int64) + FRAME_HEADER.size

    def window(i: int) -> int:
        a = int(at[i])
        return zstd_window(f.store.get_view(f.key, a, a + FRAME_HEADER_MAX), int(raw[peek[i]]))

    with ThreadPoolExecutor(max_workers=min(8, len(peek)), thread_name_prefix="shale-peek") as pool:
        out[peek] = list(pool.map(window, range(len(peek))))
    return out


def _frontier(entries: list[BigEntry]) -> tuple[BigEntry, ...]:
    """``entries`` biggest first, less those that hold no more, and have no bigger record,
    than a bigger one (:func:`_big_need` takes the most demanding of those bigger than a
    read)."""
    out: list[BigEntry] = []
    # those kept so far that no other kept one dominates, by what they hold (rising) and
    # so by their biggest record (falling): the first holding as much as an entry has the
    # biggest record of all those that do
    helds: list[int] = []
    records: list[int] = []
    for e in sorted(entries, key=lambda e: -e.raw):
        i = bisect.bisect_left(helds, e.held)
        if i < len(helds) and records[i] >= e.record:
            continue
        out.append(e)
        j = i
        while j > 0 and records[j - 1] <= e.record:  # (those it dominates go)
            j -= 1
        k = i + 1 if i < len(helds) and helds[i] == e.held else i
        helds[j:k], records[j:k] = [e.held], [e.record]
    return tuple(out)


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
