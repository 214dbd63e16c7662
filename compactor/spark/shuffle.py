"""What the Spark engine's plans move between tasks: rows of four columns, and the packed
arrays inside them.  Nothing here imports PySpark.

Every DataFrame the engine builds has the schema :data:`ROWS`: ``route`` (the shuffle
key), ``kind`` (what the row carries, :class:`Kind`), ``ref`` (a bucket, a slice, a split
or a task) and ``data`` (bytes).  Records never become rows: a row carries the packed
arrays of many records (one per slice and reduce bucket), so Spark's per-row costs (an
UnsafeRow's null bitmap and length, its copy between Arrow and the JVM) are paid per
chunk, and the bytes through the shuffle are the arrays' own.

Candidates travel as :func:`pack_candidates` lays them out: the two halves of the 128-bit
key hash as they are (16 bytes: random, nothing compresses them), then the position
within the slice as a delta from the previous candidate's, a flag byte and, only where
the order needs it, the record's time, these compressed with zstd (the deltas of a
bucket's candidates are small, the flags mostly zero): about 17 bytes a candidate in
offset order.  Nothing a reduce task decides needs more: a candidate's fate if it wins
(kept, or dropped as an expired tombstone or past the key TTL) is decided on the map side,
where the record's times and first-kept time are read, and pass two reads the first-kept
time of the tombstones it keeps from the footer it copies from.

Rows reach the reduce (or write) task of their ``ref`` through Spark's own hash
partitioning (``repartition(n, "route")``): :func:`routes` finds, for each partition,
an integer Spark hashes into it (Murmur3, seed 42, as ``HashPartitioning`` does), so
each bucket lands alone in its partition.  Nothing depends on that for correctness: a
task given the rows of several buckets or write tasks handles each of them.
"""

from __future__ import annotations

import enum
import struct
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt
import zstandard

__all__ = [
    "ROWS",
    "Candidates",
    "Kind",
    "Row",
    "pack_candidates",
    "pack_offsets",
    "routes",
    "spark_hash",
    "unpack_candidates",
    "unpack_offsets",
]

#: The schema of every DataFrame of the engine's plans (a Spark DDL string).
ROWS: Final = "route int, kind int, ref long, data binary"


class Kind(enum.IntEnum):
    """What a row carries."""

    CANDIDATES = 1  # pass one, map to reduce: one slice's candidates of one bucket (ref: the bucket)
    MAP_REPORT = 2  # a map task's report on one slice, JSON (ref: the slice)
    STATS = 3  # a reduce task's counts, JSON
    ERROR = 4  # a Shale error raised in a task, JSON, on its way to the driver
    KEPT = 5  # kept records of one slice (pass one's output; ref: the slice) or split (pass two's input)
    TASK = 6  # pass two: the row that makes a write task run, whatever else it receives (ref: the task)
    WRITTEN = 7  # what a write task wrote, JSON (ref: the task)
    FILTER = 8  # a part of a filter of new keys (ref: which part)
    WARM = 9  # a warm-up task ran


class Row(NamedTuple):
    """One row on its way out of a task: ``dest`` is the partition it is for."""

    dest: int
    kind: Kind
    ref: int
    data: bytes


# --------------------------------------------------------------------------- routing

_C1, _C2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)


def _rotl(x: npt.NDArray[np.uint32], r: int) -> npt.NDArray[np.uint32]:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def spark_hash(values: npt.NDArray[np.int32], seed: int = 42) -> npt.NDArray[np.int32]:
    """Spark's ``hash()`` of 32-bit integers (Murmur3 x86 32-bit, ``hashInt``), the hash
    its ``HashPartitioning`` takes the partition from."""
    with np.errstate(over="ignore"):
        k = values.astype(np.int32).view(np.uint32) * _C1
        k = _rotl(k, 15) * _C2
        h = np.uint32(seed) ^ k
        h = _rotl(h, 13) * np.uint32(5) + np.uint32(0xE6546B64)
        h ^= np.uint32(4)
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
    return h.view(np.int32)


def routes(partitions: int) -> npt.NDArray[np.int32]:
    """For each of ``partitions`` partitions, the least non-negative integer whose row
    ``repartition(partitions, "route")`` sends there."""
    out = np.full(partitions, -1, dtype=np.int64)
    start, step = 0, max(1024, 16 * partitions)
    while (out < 0).any():
        values = np.arange(start, start + step, dtype=np.int64)
        part = np.mod(spark_hash(values.astype(np.int32)).astype(np.int64), partitions)
        # the first value of each partition in this range, for the partitions still without one
        first = np.full(partitions, -1, dtype=np.int64)
        first[part[::-1]] = values[::-1]
        out = np.where(out < 0, first, out)
        start += step
    return out.astype(np.int32)


# --------------------------------------------------------------------------- candidates

#: magic, whether times follow, the slice's first run position, how many, compressed length
_HEAD: Final = struct.Struct("<4sB3xqII")
_MAGIC: Final = b"SHC1"
_ZSTD_LEVEL: Final = 1
#: flags of a candidate
TOMBSTONE: Final = 1
DROPPED: Final = 2  # not kept if it wins: an expired tombstone, or past the key TTL
HELD: Final = 4  # a tombstone kept past its delete retention, for a subscription yet to read it


class Candidates(NamedTuple):
    """Candidates of one or more chunks, as arrays (``time``: only under event order,
    where it decides the winner)."""

    pos: npt.NDArray[np.int64]  # run positions
    hi: npt.NDArray[np.uint64]
    lo: npt.NDArray[np.uint64]
    flags: npt.NDArray[np.uint8]
    time: npt.NDArray[np.int64] | None

    def take(self, order: npt.NDArray[np.intp]) -> Candidates:
        """These candidates, reordered (or selected) by ``order``."""
        return Candidates(self.pos[order], self.hi[order], self.lo[order], self.flags[order],
                          None if self.time is None else self.time[order])

    @staticmethod
    def concat(parts: list[Candidates], timed: bool) -> Candidates:
        """All of ``parts``, in their order, as one set of arrays."""
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return Candidates(np.empty(0, np.int64), np.empty(0, np.uint64), np.empty(0, np.uint64),
                              np.empty(0, np.uint8), np.empty(0, np.int64) if timed else None)
        times = [p.time for p in parts if p.time is not None]
        return Candidates(np.concatenate([p.pos for p in parts]), np.concatenate([p.hi for p in parts]),
                          np.concatenate([p.lo for p in parts]), np.concatenate([p.flags for p in parts]),
                          np.concatenate(times) if timed else None)


def pack_candidates(base: int, offsets: npt.NDArray[np.int64], hi: npt.NDArray[np.uint64],
                    lo: npt.NDArray[np.uint64], flags: npt.NDArray[np.uint8],
                    time: npt.NDArray[np.int64] | None = None) -> bytes:
    """One chunk: candidates at run positions ``base + offsets`` (``offsets`` rising,
    below 2**32: an object holds fewer records)."""
    n = len(offsets)
    deltas = np.diff(offsets, prepend=0).astype(np.uint32)
    tail = [deltas.tobytes(), flags.astype(np.uint8).tobytes()]
    if time is not None:
        tail.append(time.astype("<i8").tobytes())
    packed = zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(b"".join(tail))
    head = _HEAD.pack(_MAGIC, time is not None, base, n, len(packed))
    return b"".join((head, hi.astype("<u8").tobytes(), lo.astype("<u8").tobytes(), packed))


def _unpack_one(raw: memoryview) -> tuple[Candidates, int]:
    magic, timed, base, n, size = _HEAD.unpack_from(raw)
    if magic != _MAGIC:
        raise ValueError("not a chunk of candidates")
    at = _HEAD.size
    hi = np.frombuffer(raw, dtype="<u8", count=n, offset=at)
    lo = np.frombuffer(raw, dtype="<u8", count=n, offset=at + 8 * n)
    at += 16 * n
    tail = zstandard.ZstdDecompressor().decompress(bytes(raw[at:at + size]), max_output_size=(13 if timed else 5) * n)
    deltas = np.frombuffer(tail, dtype="<u4", count=n)
    pos = np.cumsum(deltas, dtype=np.int64) + base
    flags = np.frombuffer(tail, dtype=np.uint8, count=n, offset=4 * n)
    time = np.frombuffer(tail, dtype="<i8", count=n, offset=5 * n) if timed else None
    return Candidates(pos, hi, lo, flags, time), at + size


def unpack_candidates(chunks: list[bytes | memoryview], timed: bool) -> Candidates:
    """The candidates of these chunks, in one set of arrays, in the chunks' order."""
    return Candidates.concat([_unpack_one(memoryview(c))[0] for c in chunks], timed)


# --------------------------------------------------------------------------- kept records


def pack_offsets(offsets: npt.NDArray[np.int64]) -> bytes:
    """Kept records' offsets within their slice or split (below 2**32)."""
    return offsets.astype("<u4").tobytes()


def unpack_offsets(raw: bytes | memoryview) -> npt.NDArray[np.int64]:
    return np.frombuffer(raw, dtype="<u4").astype(np.int64)
