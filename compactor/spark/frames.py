"""The Spark engine's plans: DataFrames whose work is done by Arrow-native Python
functions (``mapInArrow``), and those functions.  Nothing here imports PySpark: the
plans are built through the session and DataFrame objects the engine hands in, which may
be a classic session's or a Spark Connect client's, and the functions run in Spark's
Python workers on Arrow batches of :data:`~shale.compactor.spark.shuffle.ROWS`.

Pass one is ``range(tasks)`` → map → ``repartition(buckets, "route")`` → reduce, cached
(``persist``): its report rows are collected first, then pass two reads its kept rows →
resplit → (with one row naming each write task) ``repartition(tasks, "route")`` → write.
Everything a task needs travels in the function's closure (the plan carries it, and
Spark sends each stage's functions once per executor), so nothing is broadcast and no
RDD is involved: the same plans run under Spark Connect, where neither exists.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from shale.compactor.keyfilter import KeyFilter
from shale.compactor.spark.newkeys import filter_task
from shale.compactor.spark.shuffle import ROWS, Kind, Row, routes
from shale.compactor.spark.tasks import TaskContext, map_task, reduce_partition
from shale.compactor.spark.writes import WriteContext, resplit, task_rows, write_rows
from shale.ledger.values import dataclass

__all__ = ["collect_rows", "count_tasks", "filter_of_new_keys", "pass_one", "pass_two"]

_SCHEMA: Final = pa.schema([("route", pa.int32()), ("kind", pa.int32()), ("ref", pa.int64()), ("data", pa.binary())])
#: Rows a task buffers before handing Spark a batch: a batch at most this many bytes
#: (and Arrow's binary columns hold under 2 GiB)...
_BATCH_BYTES: Final = 32 << 20
#: ... or this many rows.
_BATCH_ROWS: Final = 4096
#: Parts a filter of new keys is cut into, each merged by a task of its own.
_FILTER_PARTS: Final = 8


def rows_in(batches: Iterable[pa.RecordBatch]) -> Iterator[tuple[int, int, memoryview]]:
    """``(kind, ref, data)`` of each row (``data`` a view of the batch's buffer)."""
    for b in batches:
        kinds, refs, data = b.column(1).to_numpy(), b.column(2).to_numpy(), b.column(3)
        for i in range(b.num_rows):
            buf = data[i].as_buffer()
            yield int(kinds[i]), int(refs[i]), memoryview(b"" if buf is None else buf)


def batches_out(rows: Iterable[Row], route: npt.NDArray[np.int32] | None = None) -> Iterator[pa.RecordBatch]:
    """Arrow batches of these rows, each ``route`` the one that takes it to its ``dest``
    partition (none: no shuffle follows)."""
    held: list[Row] = []
    size = 0

    def batch() -> pa.RecordBatch:
        dests = np.fromiter((r.dest for r in held), dtype=np.int64, count=len(held))
        return pa.RecordBatch.from_arrays(
            [pa.array(dests.astype(np.int32) if route is None else route[dests], pa.int32()),
             pa.array([int(r.kind) for r in held], pa.int32()), pa.array([r.ref for r in held], pa.int64()),
             pa.array([r.data for r in held], pa.binary())], schema=_SCHEMA)

    for r in rows:
        held.append(r)
        size += len(r.data)
        if size >= _BATCH_BYTES or len(held) >= _BATCH_ROWS:
            yield batch()
            held, size = [], 0
    if held:
        yield batch()


def _ids(batches: Iterable[pa.RecordBatch]) -> list[int]:
    """The ids of a ``range`` DataFrame's partition."""
    return [int(x) for b in batches for x in b.column(0).to_numpy()]


# ----------------------------------------------------------- what the tasks run
# Callable objects rather than closures: their class travels by reference (a task imports
# this module), their fields by value, and Spark's plans show their names.


@dataclass(frozen=True, slots=True)
class _Map:
    ctx: TaskContext
    route: npt.NDArray[np.int32]
    __name__ = "shale_pass_one_map"

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return batches_out(map_task(self.ctx, _ids(batches)), self.route)


@dataclass(frozen=True, slots=True)
class _Reduce:
    ctx: TaskContext
    __name__ = "shale_pass_one_reduce"

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return batches_out(reduce_partition(self.ctx, rows_in(batches)))


@dataclass(frozen=True, slots=True)
class _Resplit:
    ctx: WriteContext
    route: npt.NDArray[np.int32]
    __name__ = "shale_pass_two_resplit"

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task_of = self.ctx.task_of()
        rows = (r for kind, ref, data in rows_in(batches) for r in resplit(self.ctx, task_of, kind, ref, data))
        return batches_out(rows, self.route)


@dataclass(frozen=True, slots=True)
class _Tasks:
    route: npt.NDArray[np.int32]
    __name__ = "shale_pass_two_tasks"

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return batches_out(task_rows(_ids(batches)), self.route)


@dataclass(frozen=True, slots=True)
class _Write:
    ctx: WriteContext
    run_dir: str
    epoch: int
    __name__ = "shale_pass_two_write"

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return batches_out(write_rows(self.ctx, self.run_dir, self.epoch, rows_in(batches)))


@dataclass(frozen=True, slots=True)
class _Filter:
    ctx: TaskContext
    size: int
    todo: tuple[int, ...]
    route: npt.NDArray[np.int32]
    __name__ = "shale_new_keys"

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        tasks = [self.todo[i] for i in _ids(batches)]
        bits = next(filter_task(self.ctx, self.size, tasks)).bits
        pieces = np.array_split(bits, len(self.route))
        return batches_out((Row(c, Kind.FILTER, c, p.tobytes()) for c, p in enumerate(pieces)), self.route)


def _union(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    merged: dict[int, npt.NDArray[np.uint8]] = {}
    for _, ref, data in rows_in(batches):
        bits = np.frombuffer(data, dtype=np.uint8)
        merged[ref] = bits | merged[ref] if ref in merged else bits.copy()
    return batches_out(Row(0, Kind.FILTER, c, bits.tobytes()) for c, bits in sorted(merged.items()))


_union.__name__ = "shale_new_keys_union"


def _warm(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for _ in batches:
        pass
    return batches_out([Row(0, Kind.WARM, 0, b"")])


_warm.__name__ = "shale_warm_up"


# ----------------------------------------------------------- the plans (driver side)


def collect_rows(frame: Any) -> list[tuple[int, int, bytes]]:
    """``(kind, ref, data)`` of every row of ``frame``, through Arrow."""
    table = frame.select("kind", "ref", "data").toArrow()
    return list(zip(table.column(0).to_pylist(), table.column(1).to_pylist(), table.column(2).to_pylist(),
                    strict=True))


def pass_one(session: Any, ctx: TaskContext) -> Any:
    """Pass one's plan: the reduce tasks' rows (kept records, counts, the map reports
    and errors passed through), cached for pass two."""
    maps = session.range(0, len(ctx.tasks), 1, len(ctx.tasks)).mapInArrow(
        _Map(ctx, routes(ctx.reduce_partitions)), ROWS)
    return maps.repartition(ctx.reduce_partitions, "route").mapInArrow(_Reduce(ctx), ROWS).persist()


def pass_two(session: Any, reduced: Any, ctx: WriteContext, run_dir: str, epoch: int) -> Any:
    """Pass two's plan: what each write task wrote (and errors)."""
    n = max(1, len(ctx.tasks))
    route = routes(n)
    kept = reduced.filter(f"kind IN ({Kind.KEPT.value}, {Kind.ERROR.value})").mapInArrow(_Resplit(ctx, route), ROWS)
    tasks = session.range(0, len(ctx.tasks), 1, 1).mapInArrow(_Tasks(route), ROWS)
    return kept.union(tasks).repartition(n, "route").mapInArrow(_Write(ctx, run_dir, epoch), ROWS)


def filter_of_new_keys(session: Any, ctx: TaskContext, size: int, todo: list[int]) -> KeyFilter:
    """The filter of the new records' keys in these map tasks' slices, built by a task
    per map task and merged by a few tasks, part by part: the driver receives one filter."""
    parts = min(_FILTER_PARTS, max(1, size // (1 << 20)))
    frame = session.range(0, len(todo), 1, len(todo)).mapInArrow(_Filter(ctx, size, tuple(todo), routes(parts)), ROWS)
    merged = sorted((ref, data) for _, ref, data in collect_rows(frame.repartition(parts, "route")
                                                                  .mapInArrow(_union, ROWS)))
    return KeyFilter(np.frombuffer(b"".join(data for _, data in merged), dtype=np.uint8).copy())


def count_tasks(session: Any) -> int:
    """Run one task per core of the application (Spark's default parallelism, which
    ``range`` takes as its partitions), doing nothing: return how many ran."""
    return len(collect_rows(session.range(0, 1 << 20).mapInArrow(_warm, ROWS)))
