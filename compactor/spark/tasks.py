"""What the Spark engine's tasks run: NumPy over footer arrays, and the same raw copy as
the local engine.  Nothing here imports PySpark.

The driver plans from the metadata only: it knows each object's key, size and record
count, never its footer.  Records are addressed by their position in the run (previous
compacted parts first, then new ledgers, in id order), exactly as the local engine
numbers them.  Consecutive slices are grouped into map tasks (small ledgers share one):

* **map** (one task per group of slices): read each slice's footer, keep the latest
  record of each key within the slice, decide what becomes of it if it wins overall
  (kept, or dropped: a tombstone past its retention, a record past the key TTL), and send
  these candidates to the reduce bucket of their hash, packed
  (:func:`~shale.compactor.spark.shuffle.pack_candidates`: the hash, the position, a flag
  byte, and the record's time under event order); report to the driver where the slice
  may be cut for pass two (entry boundaries, by ``split_bytes`` and ``split_records``),
  and its record counts;
* **reduce** (one task per hash bucket): keep the latest record of each key (the
  greatest ``(time, position)`` under event order), drop the winners the map side marked,
  and group the kept positions by the slice they came from; report the counts, and how
  many records of each previous part survive;
* **write** (:mod:`~shale.compactor.spark.writes`, one task per group of splits, planned
  by the driver from the map reports): copy the kept records of its splits, in order.

Tasks take and give :class:`~shale.compactor.spark.shuffle.Row` values; the engine's
plans carry them as Arrow batches (:mod:`~shale.compactor.spark.frames`).  A Shale error
inside a task (corrupt data, a missing object) does not fail the task: the task emits it
as a :attr:`~shale.compactor.spark.shuffle.Kind.ERROR` row, which flows through to the
driver, and the driver raises the same error.  So Spark neither retries a deterministic
failure nor logs a traceback for it, and the command still prints one line.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from shale.compactor.config import CompactionConfig
from shale.compactor.keyfilter import KeyFilter
from shale.compactor.rules import held_tombstones, latest_by_event_time, latest_of_each_key, tombstone_fate
from shale.compactor.spark.newkeys import settle
from shale.compactor.spark.shuffle import (
    DROPPED,
    HELD,
    TOMBSTONE,
    Candidates,
    Kind,
    Row,
    pack_candidates,
    pack_offsets,
    unpack_candidates,
)
from shale.ledger.codecs import Dictionary, dictionary_source
from shale.ledger.deletions import read_deletions
from shale.ledger.errors import CorruptLedgerError, ShaleError, TransientStorageError, error_detail, error_from_detail
from shale.ledger.format import FLAG_HAS_KEY, FLAG_TOMBSTONE
from shale.ledger.ordering import TopicOrder, decoded_times
from shale.ledger.reader import LedgerFile
from shale.ledger.values import dataclass
from shale.storage import Location

__all__ = [
    "SplitSpec",
    "TaskContext",
    "candidate_bytes",
    "cut_slice",
    "error_from_record",
    "forget_opened",
    "group_splits",
    "map_task",
    "reduce_partition",
    "task_errors",
]

#: Bytes a reduce task holds per candidate: position, the hash's halves, flags (and time).
_HELD_BYTES: Final = 25
_HELD_TIMED_BYTES: Final = 33


@dataclass(frozen=True, slots=True)
class SplitSpec:
    """Records ``[start, stop)`` of one ledger object; ``base`` is the run position of ``start``."""

    key: str
    ledger_id: int
    kind: int
    start: int
    stop: int
    base: int
    bytes: int  # entry bytes the split covers (for a whole slice before pass one: an estimate)
    deletions: str | None = None  # key of the part's deletion vector, if it has one
    object_records: int = 0  # what the metadata says the whole object holds (0: not checked)
    previous: bool = False  # of a previous compacted part (else of a new ledger)

    @property
    def records(self) -> int:
        return self.stop - self.start


def candidate_bytes(order: TopicOrder) -> int:
    """Bytes a reduce task holds per candidate under ``order`` (times only under event order)."""
    return _HELD_TIMED_BYTES if order.by_event_time else _HELD_BYTES


def _winners(hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64], times: npt.NDArray[np.int64] | None,
             order: TopicOrder) -> npt.NDArray[np.intp]:
    """Indexes of each key's winner among records in position order: the greatest
    ``(time, position)`` under event order, else the last."""
    if order.by_event_time:
        assert times is not None
        return latest_by_event_time(hi, lo, times)
    return latest_of_each_key(hi, lo)


def group_splits(splits: Sequence[SplitSpec], split_bytes: int, split_records: int) -> list[tuple[int, int]]:
    """Consecutive splits ``[j0, j1)`` that one task handles together: small ledgers
    share a task up to the same limits as a split."""
    groups: list[tuple[int, int]] = []
    j0, size, recs = 0, 0, 0
    for j, sp in enumerate(splits):
        if j > j0 and (size + sp.bytes > split_bytes or recs + sp.records > split_records):
            groups.append((j0, j))
            j0, size, recs = j, 0, 0
        size += sp.bytes
        recs += sp.records
    if splits:
        groups.append((j0, len(splits)))
    return groups


def cut_slice(f: LedgerFile, start: int, stop: int, split_bytes: int,
              split_records: int) -> Iterator[tuple[int, int, int]]:
    """Cut records ``[start, stop)`` of ``f`` into ``(start, stop, entry bytes)`` splits of
    at most ``split_bytes`` of entries and ``split_records`` records (at least one entry
    each), at entry boundaries, so each entry is copied by exactly one task."""
    if stop <= start:
        return
    foot = f.footer
    # boundary k: where entry k starts (k = n_entries: where the last one ends)
    rec_start = foot.e_rec_start.astype(np.int64)
    offs = foot.col("e_offset").astype(np.int64)
    at = np.append(offs, offs[-1] + int(foot.col("e_length")[-1]))
    e = int(foot.entry_of(start))  # entry holding the first record
    e_end = int(np.searchsorted(rec_start, stop, side="left"))  # boundary at or after the last record
    a = start
    while a < stop:
        by_bytes = int(np.searchsorted(at, at[e] + split_bytes, side="right")) - 1
        by_records = int(np.searchsorted(rec_start, a + split_records, side="right")) - 1
        nxt = min(max(min(by_bytes, by_records), e + 1), e_end)
        b = min(int(rec_start[nxt]), stop)
        yield a, b, int(at[nxt] - at[e])
        a, e = b, nxt


@dataclass(frozen=True, slots=True)
class TaskContext:
    """Everything pass one's tasks need, in the closure of the functions Spark runs:
    one whole-slice :class:`SplitSpec` per slice of the plan, nothing per record."""

    #: the topic's folder, its store pickled with the options it was opened with (without
    #: credentials when the engine is told not to forward them)
    topic: Location
    slices: tuple[SplitSpec, ...]
    bases: npt.NDArray[np.int64]  # slices' first run positions, ascending
    tasks: tuple[tuple[int, int], ...]  # the slices [i0, i1) each map task handles
    compacted: int  # the first slices are the previous parts
    reduce_partitions: int
    split_bytes: int
    split_records: int
    now_ms: int
    config: CompactionConfig
    dictionaries: tuple[Dictionary, ...] = ()  # the topic's trained zstd dictionaries
    new_keys: KeyFilter | None = None  # the new records' keys, when previous parts settle their own
    hold_from: int | None = None  # tombstones from this run position on are held for subscriptions (the plan's)

    def location(self) -> Location:
        return self.topic

    def open(self, loc: Location, sp: SplitSpec) -> LedgerFile:
        ident = (loc.store.url(sp.key), sp.ledger_id, sp.kind)
        f = _LAST_OPENED.get(ident)
        if f is None:
            # Consecutive splits of one big ledger share its footer: keep the last one.
            f = LedgerFile.open(loc.store, sp.key, ledger_id=sp.ledger_id, kind=sp.kind,
                                dictionaries=dictionary_source(self.dictionaries))
            _LAST_OPENED.clear()
            _LAST_OPENED[ident] = f
        return f

    def gone(self, loc: Location, sp: SplitSpec, f: LedgerFile) -> npt.NDArray[np.bool_] | None:
        """Records of ``sp`` its part's deletion vector removes (None: it has none)."""
        if sp.deletions is None:
            return None
        gone = _LAST_DELETIONS.get(sp.deletions)
        if gone is None:
            gone = read_deletions(loc.store, sp.deletions, f.n_records)
            _LAST_DELETIONS.clear()
            _LAST_DELETIONS[sp.deletions] = gone
        return gone[sp.start:sp.stop]

    def present(self, loc: Location, sp: SplitSpec, f: LedgerFile) -> npt.NDArray[np.bool_] | None:
        """Records of ``sp`` that no deletion vector removed (None: all of them)."""
        gone = self.gone(loc, sp, f)
        return None if gone is None else ~gone


_LAST_DELETIONS: dict[str, npt.NDArray[np.bool_]] = {}
# Objects are immutable, so a footer read once stays right; one per worker process.
_LAST_OPENED: dict[tuple[str, int, int], LedgerFile] = {}


def forget_opened() -> None:
    """Drop the footer kept from the last :meth:`TaskContext.open` (the driver calls it
    after building a filter of new keys itself, so as not to hold a footer)."""
    _LAST_OPENED.clear()


def task_errors(gen: Iterator[Row]) -> Iterator[Row]:
    """Emit a Shale error as an :attr:`~Kind.ERROR` row instead of failing the task."""
    try:
        yield from gen
    except TransientStorageError:
        raise  # Spark retries the task, as the local engine's storage layer retries a request
    except ShaleError as e:
        yield Row(0, Kind.ERROR, 0, json.dumps(error_detail(e)).encode())


def error_from_record(raw: bytes) -> ShaleError:
    """The driver's copy of an error a task emitted."""
    return error_from_detail(json.loads(raw))


def map_task(ctx: TaskContext, task_indexes: Iterable[int]) -> Iterator[Row]:
    """Pass one, map side: candidates of each slice of the tasks, by reduce bucket, and
    a report per slice."""
    return task_errors(_map_task(ctx, task_indexes))


def _map_task(ctx: TaskContext, task_indexes: Iterable[int]) -> Iterator[Row]:
    loc = ctx.location()
    for i in (i for t in task_indexes for i in range(*ctx.tasks[t])):
        sp = ctx.slices[i]
        f = ctx.open(loc, sp)
        if sp.stop > f.n_records or (sp.object_records and f.n_records != sp.object_records):
            # The driver planned from the metadata: an object that disagrees is not what it names.
            where = loc.store.url(sp.key)
            raise CorruptLedgerError(f"{where}: holds {f.n_records} records where the metadata says "
                                     f"{sp.object_records or sp.stop}", path=where)
        foot = f.footer
        flags = foot.col("r_flags")[sp.start:sp.stop]
        present = ctx.present(loc, sp, f)
        has_key = (flags & FLAG_HAS_KEY) != 0
        keyed_mask = has_key if present is None else has_key & present
        n_keyed = int(np.count_nonzero(keyed_mask))
        rule = ctx.config.topic_order
        times = decoded_times(f, rule, sp.start, sp.stop) if rule.needs_times else None
        settled = settle(ctx, sp, f, present, times)
        if settled is not None:
            keyed_mask = settled.pending  # only these go to the reduce side
        keyed = np.flatnonzero(keyed_mask)
        hi = foot.col("r_hash_hi")[sp.start:sp.stop]
        lo = foot.col("r_hash_lo")[sp.start:sp.stop]
        # The winner of each key within the slice is the only one that can win overall.
        idx = np.sort(keyed[_winners(hi[keyed], lo[keyed], None if times is None else times[keyed], rule)])
        fate = _fates(ctx, sp, f, idx, flags, times)
        yield from _candidate_rows(sp.base, idx, hi[idx], lo[idx], fate,
                                   times[idx] if times is not None and rule.by_event_time else None,
                                   ctx.reduce_partitions)
        present_n = sp.records if present is None else int(np.count_nonzero(present))
        cuts = [list(c) for c in cut_slice(f, sp.start, sp.stop, ctx.split_bytes, ctx.split_records)]
        report = {"slice": i, "records": present_n, "keyless": present_n - n_keyed, "footer_bytes": f.footer_bytes,
                  "cuts": cuts, "candidates": len(idx)}
        if settled is not None:
            report["settled"] = settled.counts()
        yield Row(0, Kind.MAP_REPORT, i, json.dumps(report).encode())


def _fates(ctx: TaskContext, sp: SplitSpec, f: LedgerFile, idx: npt.NDArray[np.intp], flags: npt.NDArray[np.uint8],
           times: npt.NDArray[np.int64] | None) -> npt.NDArray[np.uint8]:
    """Each candidate's flags: a tombstone, and dropped if it wins (past the key TTL, aged
    by the time that orders; a tombstone past its retention, not held for a subscription)."""
    rule = ctx.config.topic_order
    is_tomb = (flags[idx] & FLAG_TOMBSTONE) != 0
    dropped = rule.expired(times[idx], ctx.now_ms) if rule.key_ttl_ms and times is not None \
        else np.zeros(len(idx), dtype=bool)
    tomb = np.flatnonzero(is_tomb & ~dropped)
    since = f.footer.delete_since()[sp.start:sp.stop][idx[tomb]]
    expired, first_kept = tombstone_fate(since, ctx.now_ms, ctx.config.delete_retention_ms,
                                held=held_tombstones(sp.base + idx[tomb], ctx.hold_from),
                                max_hold_ms=ctx.config.max_tombstone_hold_ms)
    dropped[tomb[expired]] = True
    # kept past its retention: only a subscription's hold keeps it (counted where it wins)
    held = np.zeros(len(idx), dtype=bool)
    held[tomb[~expired & (ctx.now_ms - first_kept >= ctx.config.delete_retention_ms)]] = True
    out: npt.NDArray[np.uint8] = (is_tomb * np.uint8(TOMBSTONE) | dropped * np.uint8(DROPPED)
                                  | held * np.uint8(HELD)).astype(np.uint8)
    return out


def _candidate_rows(base: int, idx: npt.NDArray[np.intp], hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64],
                    fate: npt.NDArray[np.uint8], times: npt.NDArray[np.int64] | None, parts: int) -> Iterator[Row]:
    """One row per reduce bucket holding candidates, each in position order."""
    # 16-bit buckets sort by radix; stable keeps each bucket in position order
    btype = np.uint16 if parts <= 1 << 16 else np.int64
    bucket = (hi % np.uint64(parts)).astype(btype)
    order = np.argsort(bucket, kind="stable")
    bucket = bucket[order]
    if not len(bucket):
        return
    firsts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    for a, b in zip(firsts, np.r_[firsts[1:], len(bucket)], strict=True):
        sel = order[a:b]
        chunk = pack_candidates(base, idx[sel].astype(np.int64), hi[sel], lo[sel], fate[sel],
                                None if times is None else times[sel])
        yield Row(int(bucket[a]), Kind.CANDIDATES, int(bucket[a]), chunk)


def reduce_partition(ctx: TaskContext, rows: Iterable[tuple[int, int, memoryview]]) -> Iterator[Row]:
    """Pass one, reduce side: the latest record of each key in this hash partition, minus
    the winners the map side marked dropped, grouped by the slice that holds it; then this
    task's counts.  Map reports and errors pass through on their way to the driver."""
    return task_errors(_reduce_partition(ctx, rows))


def _merged(ctx: TaskContext, chunks: list[memoryview]) -> Candidates:
    """The candidates of all chunks, in position order."""
    parts = [unpack_candidates([c], ctx.config.topic_order.by_event_time) for c in chunks]
    # Each chunk is sorted by position and chunks of different slices do not overlap (nor
    # do those of one slice, when the bucket has its partition to itself), so ordering
    # chunks by their first position sorts everything.
    parts.sort(key=lambda c: int(c.pos[0]) if len(c.pos) else -1)
    cand = Candidates.concat(parts, ctx.config.topic_order.by_event_time)
    if len(cand.pos) > 1 and not bool(np.all(cand.pos[1:] > cand.pos[:-1])):
        cand = cand.take(np.argsort(cand.pos, kind="stable"))  # buckets sharing a partition
    return cand


def _reduce_partition(ctx: TaskContext, rows: Iterable[tuple[int, int, memoryview]]) -> Iterator[Row]:
    chunks = []
    for kind, ref, data in rows:
        if kind == Kind.CANDIDATES:
            chunks.append(data)
        elif kind in (Kind.MAP_REPORT, Kind.ERROR):
            yield Row(0, Kind(kind), ref, bytes(data))  # on its way to the driver
    if not chunks:
        return
    cand = _merged(ctx, chunks)
    del chunks
    win = _winners(cand.hi, cand.lo, cand.time, ctx.config.topic_order)
    flags = cand.flags[win]
    is_tomb = (flags & TOMBSTONE) != 0
    dropped = (flags & DROPPED) != 0
    kept = np.sort(cand.pos[win][~dropped])
    slice_of = np.searchsorted(ctx.bases, kept, side="right") - 1
    live: dict[int, int] = {}
    if len(kept):
        bounds = np.r_[np.flatnonzero(np.r_[True, slice_of[1:] != slice_of[:-1]]), len(kept)]
        for a, b in itertools.pairwise(bounds):
            i = int(slice_of[a])
            if i < ctx.compacted:
                live[i] = int(b - a)
            yield Row(0, Kind.KEPT, i, pack_offsets(kept[a:b] - ctx.bases[i]))
    counts = {"keys": len(win), "tombstones": int(np.count_nonzero(is_tomb)),
              "dropped": int(np.count_nonzero(is_tomb & dropped)), "expired": int(np.count_nonzero(~is_tomb & dropped)),
              "kept": len(kept), "candidates": len(cand.pos), "live": live,
              "held": int(np.count_nonzero(((flags & HELD) != 0) & ~dropped))}
    yield Row(0, Kind.STATS, 0, json.dumps(counts).encode())
