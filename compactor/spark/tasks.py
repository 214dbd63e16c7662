"""What the Spark engine's tasks run: NumPy over footer arrays, and the same raw copy as
the local engine.  Nothing here imports PySpark.

The driver plans from the metadata only: it knows each object's key, size and record
count, never its footer.  Records are addressed by their position in the run (previous
compacted parts first, then new ledgers, in id order), exactly as the local engine
numbers them.  Consecutive slices are grouped into map tasks (small ledgers share one):

* **map** (one task per group of slices): read each slice's footer, keep the latest
  record of each key within the slice, and send each survivor ``(hash, position, flags,
  first-kept time)`` — 33 bytes, as NumPy buffers — to the reduce partition of its hash
  (41 bytes with the record's time, when the topic's order or key TTL needs it:
  :mod:`shale.ledger.ordering`); report to the driver where the slice may be cut for
  pass two (entry boundaries, by ``split_bytes`` and ``split_records``), and its record
  counts;
* **reduce** (one task per hash partition): keep the latest record of each key (the
  greatest ``(time, position)`` under event-time order), drop the winners past the key
  TTL, apply the tombstone rules (tombstones an active subscription has yet to read held
  from the plan's ``hold_from`` on), and group the kept positions by the slice they came
  from; report the counts, and how many records of each previous part survive;
* **write** (one task per group of splits, planned by the driver from the map reports):
  copy the kept records of its splits, in order, into parts named
  ``part-<task>-<n>.ledger`` under the run folder; a previous part the driver chose to
  keep in place gets a deletion vector ``deletions-<task>-<n>.bin`` instead.

A Shale error inside a task (corrupt data, a missing object) does not fail the task:
the task emits it as a record under :data:`ERROR_KEY`, which flows through to the
driver, and the driver raises the same error.  So Spark neither retries a deterministic
failure nor logs a traceback for it, and the command still prints one line.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from shale.compactor.config import CompactionConfig
from shale.compactor.keyfilter import KeyFilter
from shale.compactor.pass_two import Copy, Work, reuse_part, write_parts, write_vectors
from shale.compactor.plan import Slice
from shale.compactor.rules import (
    held_past_retention,
    held_tombstones,
    latest_by_event_time,
    latest_of_each_key,
    tombstone_fate,
)
from shale.compactor.spark.newkeys import settle
from shale.ledger.codecs import Dictionary, dictionary_source
from shale.ledger.deletions import read_deletions
from shale.ledger.errors import CorruptLedgerError, ShaleError, TransientStorageError, error_detail, error_from_detail
from shale.ledger.format import FLAG_HAS_KEY, FLAG_TOMBSTONE, KIND_COMPACTED
from shale.ledger.ordering import TopicOrder, decoded_times
from shale.ledger.reader import LedgerFile
from shale.metadata.state import CompactedPart
from shale.storage import Location

__all__ = [
    "CANDIDATE",
    "ERROR_KEY",
    "KEPT",
    "MAP_KEY",
    "STATS_KEY",
    "SplitSpec",
    "TaskContext",
    "WriteContext",
    "candidate_type",
    "cut_slice",
    "error_from_record",
    "forget_opened",
    "group_splits",
    "map_task",
    "reduce_partition",
    "resplit",
    "write_task",
]

#: One candidate survivor in pass one's shuffle.
CANDIDATE: Final = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("pos", "<i8"), ("since", "<i8"), ("flags", "u1")])
#: A candidate with its record's time, when the topic's order or key TTL needs it.
TIMED_CANDIDATE: Final = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("pos", "<i8"), ("since", "<i8"), ("flags", "u1"),
                                   ("time", "<i8")])
#: One kept record sent from a reduce task to the write task of its split.
KEPT: Final = np.dtype([("pos", "<i8"), ("since", "<i8")])
#: The key under which reduce tasks report their counts.
STATS_KEY: Final = -1
#: The key of a Shale error raised in a task, on its way to the driver.
ERROR_KEY: Final = -2
#: The key under which map tasks report each slice's cuts and counts.
MAP_KEY: Final = -3


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


def candidate_type(order: TopicOrder) -> np.dtype[Any]:
    """The rows pass one shuffles under ``order``: times travel only when deciding needs them."""
    return TIMED_CANDIDATE if order.needs_times else CANDIDATE


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
    """Everything pass one's tasks need, sent once to each executor as a broadcast:
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


@dataclass(frozen=True, slots=True)
class WriteContext:
    """What pass two's tasks need: the splits the driver cut from the map reports."""

    run: TaskContext
    splits: tuple[SplitSpec, ...]
    bases: npt.NDArray[np.int64]  # splits' first run positions, ascending
    tasks: tuple[tuple[int, int], ...]  # the splits [j0, j1) each write task handles
    keep_in_place: tuple[CompactedPart | None, ...]  # per split: the previous part it keeps, if so


_LAST_DELETIONS: dict[str, npt.NDArray[np.bool_]] = {}
# Objects are immutable, so a footer read once stays right; one per worker process.
_LAST_OPENED: dict[tuple[str, int, int], LedgerFile] = {}


def forget_opened() -> None:
    """Drop the footer kept from the last :meth:`TaskContext.open` (the driver calls it
    after building a filter of new keys itself, so as not to hold a footer)."""
    _LAST_OPENED.clear()


def _task_errors(gen: Iterator[tuple[int, Any]]) -> Iterator[tuple[int, Any]]:
    """Emit a Shale error as an ``ERROR_KEY`` record instead of failing the task."""
    try:
        yield from gen
    except TransientStorageError:
        raise  # Spark retries the task, as the local engine's storage layer retries a request
    except ShaleError as e:
        yield ERROR_KEY, json.dumps(error_detail(e)).encode()


def error_from_record(raw: bytes) -> ShaleError:
    """The driver's copy of an error a task emitted."""
    return error_from_detail(json.loads(raw))


def map_task(ctx: TaskContext, task_indexes: Iterable[int]) -> Iterator[tuple[int, bytes]]:
    """Pass one, map side: candidates of each slice of the tasks, by reduce partition,
    and a report per slice under :data:`MAP_KEY`."""
    return _task_errors(_map_task(ctx, task_indexes))


def _map_task(ctx: TaskContext, task_indexes: Iterable[int]) -> Iterator[tuple[int, bytes]]:
    loc = ctx.location()
    parts = ctx.reduce_partitions
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
        hi = foot.col("r_hash_hi")[sp.start:sp.stop][keyed]
        lo = foot.col("r_hash_lo")[sp.start:sp.stop][keyed]
        # The winner of each key within the slice is the only one that can win overall.
        # In position order, so every chunk a reduce task receives is sorted by position.
        idx = np.sort(keyed[_winners(hi, lo, None if times is None else times[keyed], rule)])
        cand = np.empty(len(idx), dtype=candidate_type(rule))
        cand["hi"] = foot.col("r_hash_hi")[sp.start:sp.stop][idx]
        cand["lo"] = foot.col("r_hash_lo")[sp.start:sp.stop][idx]
        cand["pos"] = sp.base + idx
        cand["since"] = foot.delete_since()[sp.start:sp.stop][idx]
        cand["flags"] = flags[idx]
        if times is not None:
            cand["time"] = times[idx]
        # 16-bit buckets sort by radix; stable keeps each bucket in position order
        btype = np.uint16 if parts <= 1 << 16 else np.int64
        bucket = (cand["hi"] % np.uint64(parts)).astype(btype)
        order = np.argsort(bucket, kind="stable")
        cand, bucket = cand[order], bucket[order]
        if len(bucket):
            firsts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
            for a, b in zip(firsts, np.r_[firsts[1:], len(bucket)], strict=True):
                yield int(bucket[a]), cand[a:b].tobytes()
        present_n = sp.records if present is None else int(np.count_nonzero(present))
        keyless = present_n - n_keyed
        cuts = [list(c) for c in cut_slice(f, sp.start, sp.stop, ctx.split_bytes, ctx.split_records)]
        report = {"slice": i, "records": present_n, "keyless": keyless, "footer_bytes": f.footer_bytes, "cuts": cuts}
        if settled is not None:
            report["settled"] = settled.counts()
        yield MAP_KEY, json.dumps(report).encode()


def reduce_partition(ctx: TaskContext, items: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, bytes]]:
    """Pass one, reduce side: the latest record of each key in this hash partition,
    minus expired tombstones, grouped by the slice that holds it; then this task's counts."""
    return _task_errors(_reduce_partition(ctx, items))


def _reduce_partition(ctx: TaskContext, items: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, bytes]]:
    rule = ctx.config.topic_order
    row = candidate_type(rule)
    chunks = []
    for k, v in items:
        if k in (ERROR_KEY, MAP_KEY):
            yield k, v  # a map task's error or report, on its way to the driver
        else:
            chunks.append(np.frombuffer(v, dtype=row))
    # Each chunk is sorted by position and chunks of different slices do not overlap,
    # so ordering chunks by their first position sorts everything: the latest record of
    # a key is then its last occurrence.
    chunks.sort(key=lambda c: int(c["pos"][0]) if len(c) else -1)
    cand = np.concatenate(chunks) if chunks else np.empty(0, dtype=row)
    del chunks
    if len(cand) > 1 and not bool(np.all(cand["pos"][1:] > cand["pos"][:-1])):
        cand = cand[np.argsort(cand["pos"], kind="stable")]  # never expected; cheap to be sure
    win = cand[_winners(cand["hi"], cand["lo"], cand["time"] if rule.needs_times else None, rule)]
    is_tomb = (win["flags"] & FLAG_TOMBSTONE) != 0
    # Winners past the key TTL go as if deleted (aged after the merge, by the time that
    # orders): a live one counts as expired, a tombstone as dropped.
    old = rule.expired(win["time"], ctx.now_ms) if rule.key_ttl_ms else np.zeros(len(win), dtype=bool)
    old_tombs = int(np.count_nonzero(old & is_tomb))
    tomb = np.nonzero(is_tomb & ~old)[0]
    expired, first_kept = tombstone_fate(win["since"][tomb], ctx.now_ms, ctx.config.delete_retention_ms,
                                         held=held_tombstones(win["pos"][tomb], ctx.hold_from),
                                         max_hold_ms=ctx.config.max_tombstone_hold_ms)
    keep = ~old
    keep[tomb[expired]] = False
    since = np.zeros(len(win), dtype=np.int64)
    since[tomb[~expired]] = first_kept[~expired]
    kept = np.empty(int(keep.sum()), dtype=KEPT)
    kept["pos"] = win["pos"][keep]
    kept["since"] = since[keep]
    slice_of = np.searchsorted(ctx.bases, kept["pos"], side="right") - 1
    order = np.argsort(slice_of, kind="stable")
    kept, slice_of = kept[order], slice_of[order]
    live: dict[int, int] = {}
    if len(kept):
        bounds = np.r_[np.flatnonzero(np.r_[True, slice_of[1:] != slice_of[:-1]]), len(kept)]
        for a, b in itertools.pairwise(bounds):
            i = int(slice_of[a])
            if i < ctx.compacted:
                live[i] = int(b - a)
            yield i, kept[a:b].tobytes()
    counts = {"keys": len(win), "tombstones": int(np.count_nonzero(is_tomb)), "dropped": int(expired.sum()) + old_tombs,
              "expired": int(np.count_nonzero(old)) - old_tombs, "kept": len(kept), "candidates": len(cand),
              "live": live,
              "held": held_past_retention(expired, first_kept, ctx.now_ms, ctx.config.delete_retention_ms)}
    yield STATS_KEY, json.dumps(counts).encode()


def resplit(ctx: WriteContext, item: tuple[int, bytes]) -> Iterator[tuple[int, bytes]]:
    """One slice's kept positions from a reduce task, grouped by the split that holds them."""
    i, raw = item
    if i < 0:
        yield item  # an error, on its way to the driver
        return
    kept = np.frombuffer(raw, dtype=KEPT)
    split_of = np.searchsorted(ctx.bases, kept["pos"], side="right") - 1
    if len(kept) and bool((split_of == split_of[0]).all()):
        yield int(split_of[0]), raw  # all in one split: as it came (positions are in no order)
        return
    order = np.argsort(split_of, kind="stable")
    kept, split_of = kept[order], split_of[order]
    bounds = np.r_[np.flatnonzero(np.r_[True, split_of[1:] != split_of[:-1]]), len(kept)]
    for a, b in itertools.pairwise(bounds):
        yield int(split_of[a]), kept[a:b].tobytes()


def write_task(ctx: WriteContext, run_dir: str, epoch: int, t: int,
               items: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, Any]]:
    """Pass two for task ``t``: write the kept records of its splits, in order, into
    parts ``part-<t>-<n>.ledger`` (and the deletion vectors of the previous parts it
    keeps in place); yield ``(t, what was written)``."""
    return _task_errors(_write_task(ctx, run_dir, epoch, t, items))


def _write_task(ctx: WriteContext, run_dir: str, epoch: int, t: int,
                items: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, Any]]:
    if t >= len(ctx.tasks):
        return
    by_split: dict[int, list[npt.NDArray[Any]]] = {}
    for j, v in items:
        if j == ERROR_KEY:
            # a map task re-run for this job (lost shuffle files) failed: write nothing
            yield ERROR_KEY, v
            return
        by_split.setdefault(j, []).append(np.frombuffer(v, dtype=KEPT))
    j0, j1 = ctx.tasks[t]
    cfg = ctx.run.config
    settles = ctx.run.new_keys is not None
    todo = [j for j in range(j0, j1) if j in by_split or cfg.retain_null_key or ctx.keep_in_place[j] is not None
            or (settles and ctx.splits[j].previous)]
    if not todo:
        return
    loc = ctx.run.location()
    vectors: list[tuple[str, bytes]] = []
    work = list(_split_work(ctx, loc, todo, by_split, f"{run_dir}/deletions-{t:06d}-", vectors))
    # Written before the run can publish; a failed run's clean-up finds them under its folder.
    write_vectors(loc, vectors)
    out = write_parts(work, cfg, topic=loc, run_dir=run_dir, epoch=epoch, now_ms=ctx.run.now_ms,
                      on_object=lambda _name: None, name_prefix=f"part-{t:06d}-")
    yield t, {"parts": [p.to_json() for p in out.parts], "records_written": out.records_written,
              "records_reused": out.records_reused, "bytes_written": out.bytes_written,
              "bytes_read": out.bytes_read}


def _split_work(ctx: WriteContext, loc: Location, todo: list[int], by_split: dict[int, list[npt.NDArray[Any]]],
                vector_prefix: str, vectors: list[tuple[str, bytes]]) -> Iterator[Work]:
    for j in todo:
        sp = ctx.splits[j]
        chunks = by_split.get(j, [])
        kept = np.concatenate(chunks) if chunks else np.empty(0, dtype=KEPT)
        f = ctx.run.open(loc, sp)
        keep = np.zeros(sp.records, dtype=bool)
        keep[kept["pos"] - sp.base] = True
        gone = ctx.run.gone(loc, sp, f)
        settled = settle(ctx.run, sp, f, None if gone is None else ~gone)
        if settled is not None:
            keep |= settled.keep
        if ctx.run.config.retain_null_key:
            keyless = (f.footer.col("r_flags")[sp.start:sp.stop] & FLAG_HAS_KEY) == 0
            keep[keyless if gone is None else keyless & ~gone] = True
        part = ctx.keep_in_place[j]
        if part is not None:
            # the whole part, kept where it is: only its deletion vector may be new
            assert part.ledger_id is not None
            yield reuse_part(part, part.ledger_id, ~keep, gone, f"{vector_prefix}{len(vectors):05d}.bin", vectors)
            continue
        since = np.zeros(sp.records, dtype=np.int64) if settled is None else settled.since
        since[kept["pos"] - sp.base] = kept["since"]
        yield Copy(Slice(f, sp.start, sp.stop, sp.kind == KIND_COMPACTED), keep, since)
