"""What the Spark engine's tasks run: NumPy over footer arrays, and the same raw copy as
the local engine.  Nothing here imports PySpark.

Records are addressed by their position in the run (previous compacted parts first,
then new ledgers, in id order), exactly as the local engine numbers them:

Consecutive splits are grouped into tasks (small ledgers share one):

* **map** (one task per group): read each split's footer rows, keep the latest record of
  each key within the split, and send each survivor ``(hash, position, flags,
  first-kept time)`` — 33 bytes — to the reduce partition of its hash;
* **reduce** (one task per hash partition): keep the latest position of each key, apply
  the tombstone rules, and send each kept position to the split it came from;
* **write** (one task per group): copy the kept records of its splits, in order, into
  parts named ``part-<task>-<n>.ledger`` under the run folder.

A Shale error inside a task (corrupt data, a missing object) does not fail the task:
the task emits it as a record under :data:`ERROR_KEY`, which flows through to the
driver, and the driver raises the same error.  So Spark neither retries a deterministic
failure nor logs a traceback for it, and the command still prints one line.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from shale.compactor.config import CompactionConfig
from shale.compactor.pass_two import Copy, write_parts
from shale.compactor.plan import Slice
from shale.compactor.rules import latest_of_each_key, tombstone_fate
from shale.compactor.spark.environment import ForwardedEnvironment
from shale.ledger.codecs import Dictionary, dictionary_source
from shale.ledger.deletions import read_deletions
from shale.ledger.errors import ShaleError, TransientStorageError, error_detail, error_from_detail
from shale.ledger.format import FLAG_HAS_KEY, FLAG_TOMBSTONE, KIND_COMPACTED
from shale.ledger.reader import LedgerFile
from shale.ledger.storage import Location, resolve

__all__ = [
    "CANDIDATE",
    "ERROR_KEY",
    "KEPT",
    "STATS_KEY",
    "SplitSpec",
    "TaskContext",
    "error_from_record",
    "map_task",
    "reduce_partition",
    "write_task",
]

#: One candidate survivor in pass one's shuffle.
CANDIDATE: Final = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("pos", "<i8"), ("since", "<i8"), ("flags", "u1")])
#: One kept record sent from a reduce task to the write task of its split.
KEPT: Final = np.dtype([("pos", "<i8"), ("since", "<i8")])
#: The key under which reduce tasks report their counts.
STATS_KEY: Final = -1
#: The key of a Shale error raised in a task, on its way to the driver.
ERROR_KEY: Final = -2


@dataclass(frozen=True, slots=True)
class SplitSpec:
    """Records ``[start, stop)`` of one ledger object; ``base`` is the run position of ``start``."""

    key: str
    ledger_id: int
    kind: int
    start: int
    stop: int
    base: int
    bytes: int  # entry bytes the split covers
    deletions: str | None = None  # key of the part's deletion vector, if it has one

    @property
    def records(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True, slots=True)
class TaskContext:
    """Everything a task needs, sent once to each executor as a broadcast."""

    topic_uri: str
    environment: ForwardedEnvironment
    splits: tuple[SplitSpec, ...]
    bases: npt.NDArray[np.int64]  # splits' first run positions, ascending
    tasks: tuple[tuple[int, int], ...]  # the splits [j0, j1) each map and write task handles
    task_of: npt.NDArray[np.int64]  # split -> task
    reduce_partitions: int
    now_ms: int
    config: CompactionConfig
    dictionaries: tuple[Dictionary, ...] = ()  # the topic's trained zstd dictionaries

    def location(self) -> Location:
        self.environment.apply()
        return resolve(self.topic_uri)

    def open(self, loc: Location, j: int) -> LedgerFile:
        sp = self.splits[j]
        ident = (loc.store.url(sp.key), sp.ledger_id, sp.kind)
        f = _LAST_OPENED.get(ident)
        if f is None:
            # Consecutive splits of one big ledger share its footer: keep the last one.
            f = LedgerFile.open(loc.store, sp.key, ledger_id=sp.ledger_id, kind=sp.kind,
                                dictionaries=dictionary_source(self.dictionaries))
            _LAST_OPENED.clear()
            _LAST_OPENED[ident] = f
        return f


    def present(self, loc: Location, j: int, f: LedgerFile) -> npt.NDArray[np.bool_] | None:
        """Records of split ``j`` that no deletion vector removed (None: all of them)."""
        sp = self.splits[j]
        if sp.deletions is None:
            return None
        gone = _LAST_DELETIONS.get(sp.deletions)
        if gone is None:
            gone = read_deletions(loc.store, sp.deletions, f.n_records)
            _LAST_DELETIONS.clear()
            _LAST_DELETIONS[sp.deletions] = gone
        return ~gone[sp.start:sp.stop]


_LAST_DELETIONS: dict[str, npt.NDArray[np.bool_]] = {}
# Objects are immutable, so a footer read once stays right; one per worker process.
_LAST_OPENED: dict[tuple[str, int, int], LedgerFile] = {}


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
    """Pass one, map side: candidates of each split of the tasks, by reduce partition."""
    return _task_errors(_map_task(ctx, task_indexes))


def _map_task(ctx: TaskContext, task_indexes: Iterable[int]) -> Iterator[tuple[int, bytes]]:
    loc = ctx.location()
    parts = ctx.reduce_partitions
    for j in (j for t in task_indexes for j in range(*ctx.tasks[t])):
        sp = ctx.splits[j]
        f = ctx.open(loc, j)
        foot = f.footer
        flags = foot.col("r_flags")[sp.start:sp.stop]
        present = ctx.present(loc, j, f)
        has_key = (flags & FLAG_HAS_KEY) != 0
        keyed = np.flatnonzero(has_key if present is None else has_key & present)
        hi = foot.col("r_hash_hi")[sp.start:sp.stop][keyed]
        lo = foot.col("r_hash_lo")[sp.start:sp.stop][keyed]
        # The latest of each key within the split is the only one that can win overall.
        # In position order, so every chunk a reduce task receives is sorted by position.
        idx = np.sort(keyed[latest_of_each_key(hi, lo)])
        cand = np.empty(len(idx), dtype=CANDIDATE)
        cand["hi"] = foot.col("r_hash_hi")[sp.start:sp.stop][idx]
        cand["lo"] = foot.col("r_hash_lo")[sp.start:sp.stop][idx]
        cand["pos"] = sp.base + idx
        cand["since"] = foot.delete_since()[sp.start:sp.stop][idx]
        cand["flags"] = flags[idx]
        # 16-bit buckets sort by radix; stable keeps each bucket in position order
        btype = np.uint16 if parts <= 1 << 16 else np.int64
        bucket = (cand["hi"] % np.uint64(parts)).astype(btype)
        order = np.argsort(bucket, kind="stable")
        cand, bucket = cand[order], bucket[order]
        if len(bucket):
            firsts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
            for a, b in zip(firsts, np.r_[firsts[1:], len(bucket)], strict=True):
                yield int(bucket[a]), cand[a:b].tobytes()


def reduce_partition(ctx: TaskContext, items: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, bytes]]:
    """Pass one, reduce side: the latest record of each key in this hash partition,
    minus expired tombstones, grouped by the split that holds it; then this task's counts."""
    return _task_errors(_reduce_partition(ctx, items))


def _reduce_partition(ctx: TaskContext, items: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, bytes]]:
    chunks = []
    for k, v in items:
        if k == ERROR_KEY:
            yield k, v  # a map task's error, on its way to the driver
        else:
            chunks.append(np.frombuffer(v, dtype=CANDIDATE))
    # Each chunk is sorted by position and chunks of different splits do not overlap,
    # so ordering chunks by their first position sorts everything: the latest record of
    # a key is then its last occurrence.
    chunks.sort(key=lambda c: int(c["pos"][0]) if len(c) else -1)
    cand = np.concatenate(chunks) if chunks else np.empty(0, dtype=CANDIDATE)
    if len(cand) > 1 and not bool(np.all(cand["pos"][1:] > cand["pos"][:-1])):
        cand = cand[np.argsort(cand["pos"], kind="stable")]  # never expected; cheap to be sure
    win = cand[latest_of_each_key(cand["hi"], cand["lo"])]
    tomb = np.nonzero(win["flags"] & FLAG_TOMBSTONE)[0]
    expired, first_kept = tombstone_fate(win["since"][tomb], ctx.now_ms, ctx.config.delete_retention_ms)
    keep = np.ones(len(win), dtype=bool)
    keep[tomb[expired]] = False
    since = np.zeros(len(win), dtype=np.int64)
    since[tomb[~expired]] = first_kept[~expired]
    kept = np.empty(int(keep.sum()), dtype=KEPT)
    kept["pos"] = win["pos"][keep]
    kept["since"] = since[keep]
    split_of = np.searchsorted(ctx.bases, kept["pos"], side="right") - 1
    order = np.argsort(split_of, kind="stable")
    kept, split_of = kept[order], split_of[order]
    if len(kept):
        bounds = np.r_[np.flatnonzero(np.r_[True, split_of[1:] != split_of[:-1]]), len(kept)]
        for a, b in itertools.pairwise(bounds):
            yield int(split_of[a]), kept[a:b].tobytes()
    counts = {"keys": len(win), "tombstones": len(tomb), "dropped": int(expired.sum()), "kept": len(kept)}
    yield STATS_KEY, json.dumps(counts).encode()


def write_task(ctx: TaskContext, run_dir: str, epoch: int, t: int,
               items: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, Any]]:
    """Pass two for task ``t``: write the kept records of its splits, in order, into
    parts ``part-<t>-<n>.ledger``; yield ``(t, what was written)``."""
    return _task_errors(_write_task(ctx, run_dir, epoch, t, items))


def _write_task(ctx: TaskContext, run_dir: str, epoch: int, t: int,
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
    todo = [j for j in range(j0, j1) if j in by_split or ctx.config.retain_null_key]
    if not todo:
        return
    loc = ctx.location()
    out = write_parts(_split_work(ctx, loc, todo, by_split), ctx.config, topic=loc, run_dir=run_dir, epoch=epoch,
                      now_ms=ctx.now_ms, on_object=lambda _name: None, name_prefix=f"part-{t:06d}-")
    yield t, {"parts": [p.to_json() for p in out.parts], "records_written": out.records_written,
              "bytes_written": out.bytes_written, "bytes_read": out.bytes_read}


def _split_work(ctx: TaskContext, loc: Location, todo: list[int], by_split: dict[int, list[npt.NDArray[Any]]]
                ) -> Iterator[Copy]:
    for j in todo:
        sp = ctx.splits[j]
        chunks = by_split.get(j, [])
        kept = np.concatenate(chunks) if chunks else np.empty(0, dtype=KEPT)
        f = ctx.open(loc, j)
        keep = np.zeros(sp.records, dtype=bool)
        keep[kept["pos"] - sp.base] = True
        since = np.zeros(sp.records, dtype=np.int64)
        since[kept["pos"] - sp.base] = kept["since"]
        if ctx.config.retain_null_key:
            keyless = (f.footer.col("r_flags")[sp.start:sp.stop] & FLAG_HAS_KEY) == 0
            present = ctx.present(loc, j, f)
            keep[keyless if present is None else keyless & present] = True
        yield Copy(Slice(f, sp.start, sp.stop, sp.kind == KIND_COMPACTED), keep, since)
