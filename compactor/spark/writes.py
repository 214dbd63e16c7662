"""Pass two of the Spark engine, task side: the kept records regrouped by split, and the
write tasks that copy them.  Nothing here imports PySpark.

Pass one's reduce tasks give the kept records of each slice (:attr:`Kind.KEPT` rows,
offsets within the slice); :func:`resplit` cuts them by the splits the driver planned
and sends each to the write task of its split; each write task (one per group of
splits) copies the kept records of its splits, in order, into parts named
``part-<task>-<n>.ledger`` under the run folder, with the local engine's writer; a
previous part the driver chose to keep in place gets a deletion vector
``deletions-<task>-<n>.bin`` instead.  A write task also receives a
:attr:`Kind.TASK` row naming it, so that it runs even when no kept record reaches it (it
may still have keyless records to keep, or a part to keep in place).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator

import numpy as np
import numpy.typing as npt

from shale.compactor.pass_two import Copy, Work, reuse_part, write_parts, write_vectors
from shale.compactor.plan import Slice
from shale.compactor.spark.newkeys import settle
from shale.compactor.spark.shuffle import Kind, Row, pack_offsets, unpack_offsets
from shale.compactor.spark.tasks import SplitSpec, TaskContext, task_errors
from shale.ledger.format import FLAG_HAS_KEY, FLAG_TOMBSTONE, KIND_COMPACTED
from shale.ledger.values import dataclass
from shale.metadata.state import CompactedPart
from shale.storage import Location

__all__ = ["WriteContext", "resplit", "task_rows", "write_rows"]


@dataclass(frozen=True, slots=True)
class WriteContext:
    """What pass two's tasks need: the splits the driver cut from the map reports."""

    run: TaskContext
    splits: tuple[SplitSpec, ...]
    bases: npt.NDArray[np.int64]  # splits' first run positions, ascending
    tasks: tuple[tuple[int, int], ...]  # the splits [j0, j1) each write task handles
    keep_in_place: tuple[CompactedPart | None, ...]  # per split: the previous part it keeps, if so

    def task_of(self) -> npt.NDArray[np.int64]:
        """The write task of each split."""
        out = np.zeros(len(self.splits), dtype=np.int64)
        for t, (j0, j1) in enumerate(self.tasks):
            out[j0:j1] = t
        return out


def resplit(ctx: WriteContext, task_of: npt.NDArray[np.int64], kind: int, ref: int,
            data: bytes | memoryview) -> Iterator[Row]:
    """One slice's kept records from a reduce task, cut by the splits that hold them, each
    bound for its split's write task."""
    if kind != Kind.KEPT:
        yield Row(0, Kind(kind), ref, bytes(data))  # an error (a lost pass one task rerun), to the first task
        return
    pos = unpack_offsets(data) + ctx.run.bases[ref]  # rising
    split_of = np.searchsorted(ctx.bases, pos, side="right") - 1
    bounds = np.r_[np.flatnonzero(np.r_[True, split_of[1:] != split_of[:-1]]), len(pos)] if len(pos) else []
    for a, b in itertools.pairwise(bounds):
        j = int(split_of[a])
        yield Row(int(task_of[j]), Kind.KEPT, j, pack_offsets(pos[a:b] - ctx.bases[j]))


def task_rows(tasks: Iterable[int]) -> Iterator[Row]:
    """The row that makes each write task run."""
    for t in tasks:
        yield Row(t, Kind.TASK, t, b"")


def write_rows(ctx: WriteContext, run_dir: str, epoch: int,
               rows: Iterable[tuple[int, int, memoryview]]) -> Iterator[Row]:
    """Pass two for the write tasks whose rows these are (one, unless Spark's partitioning
    put several in one partition): what each wrote, as a :attr:`Kind.WRITTEN` row."""
    task_of = ctx.task_of()
    todo: dict[int, dict[int, list[npt.NDArray[np.int64]]]] = {}
    for kind, ref, data in rows:
        if kind == Kind.ERROR:
            # a pass one task rerun for this job (lost cached output) failed: write nothing
            yield Row(0, Kind.ERROR, 0, bytes(data))
            return
        if kind == Kind.TASK:
            todo.setdefault(ref, {})
        elif kind == Kind.KEPT:
            todo.setdefault(int(task_of[ref]), {}).setdefault(ref, []).append(unpack_offsets(data))
    for t in sorted(todo):
        yield from task_errors(_write_task(ctx, run_dir, epoch, t, todo[t]))


def _write_task(ctx: WriteContext, run_dir: str, epoch: int, t: int,
                by_split: dict[int, list[npt.NDArray[np.int64]]]) -> Iterator[Row]:
    """Write the kept records of task ``t``'s splits, in order, into parts
    ``part-<t>-<n>.ledger`` (and the deletion vectors of the previous parts it keeps in
    place)."""
    if t >= len(ctx.tasks):
        return
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
    done = {"parts": [p.to_json() for p in out.parts], "records_written": out.records_written,
            "records_reused": out.records_reused, "bytes_written": out.bytes_written, "bytes_read": out.bytes_read}
    yield Row(0, Kind.WRITTEN, t, json.dumps(done).encode())


def _split_work(ctx: WriteContext, loc: Location, todo: list[int], by_split: dict[int, list[npt.NDArray[np.int64]]],
                vector_prefix: str, vectors: list[tuple[str, bytes]]) -> Iterator[Work]:
    for j in todo:
        sp = ctx.splits[j]
        chunks = by_split.get(j, [])
        f = ctx.run.open(loc, sp)
        keep = np.zeros(sp.records, dtype=bool)
        if chunks:
            keep[np.concatenate(chunks)] = True
        gone = ctx.run.gone(loc, sp, f)
        settled = settle(ctx.run, sp, f, None if gone is None else ~gone)
        if settled is not None:
            keep |= settled.keep
        flags = f.footer.col("r_flags")[sp.start:sp.stop]
        # A kept tombstone is kept from its first-kept time (KIP-534), now if no run kept it yet.
        since = np.zeros(sp.records, dtype=np.int64)
        tombs = np.flatnonzero(keep & ((flags & FLAG_TOMBSTONE) != 0))
        recorded = f.footer.delete_since()[sp.start:sp.stop][tombs]
        since[tombs] = np.where(recorded > 0, recorded, ctx.run.now_ms)
        if ctx.run.config.retain_null_key:
            keyless = (flags & FLAG_HAS_KEY) == 0
            keep[keyless if gone is None else keyless & ~gone] = True
        part = ctx.keep_in_place[j]
        if part is not None:
            # the whole part, kept where it is: only its deletion vector may be new
            assert part.ledger_id is not None
            yield reuse_part(part, part.ledger_id, ~keep, gone, f"{vector_prefix}{len(vectors):05d}.bin", vectors)
            continue
        yield Copy(Slice(f, sp.start, sp.stop, sp.kind == KIND_COMPACTED), keep, since)
