"""Pass two on several processes: the local engine's copy, spread over the CPU cores.

Pass two's copy does Python-level work for every surviving record (slicing it out of the
read buffer) and every rebuilt frame (a checksum), so threads cannot share it; forked
processes can.  The work is cut at entry boundaries into groups of about equal bytes;
each group is copied by one worker into its own parts (``part-<group>-<n>.ledger``), and
the parts are returned in group order, so the compacted ledger holds the same records in
the same order as one process would write.  Workers are forked, so they inherit the
footers and survivor flags already in memory: nothing large crosses a pipe but the list
of parts each one wrote.

Everything a worker writes lies under the run folder, like everything else the run
writes, so a failed run is cleaned up the same way whoever failed.  A worker that dies
(killed, out of memory) fails the run; the others are waited for before the run removes
its folder.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from shale.compactor.config import CompactionConfig
from shale.compactor.pass_two import Copy, PassTwoResult, Work, write_parts
from shale.ledger.errors import ShaleError, error_detail, error_from_detail
from shale.ledger.format import FRAME_HEADER
from shale.ledger.values import dataclass
from shale.metadata.state import CompactedPart
from shale.storage import Location

__all__ = ["MIN_PARALLEL_BYTES", "import_ahead", "split_work", "work_bytes", "write_parts_in_workers"]

#: Below this many bytes to copy, a second process costs more than it saves.
MIN_PARALLEL_BYTES = 64 << 20
#: Groups per worker: more groups balance uneven work (the biggest go first, and what is
#: left at the end is small), fewer make fewer parts.
GROUPS_PER_WORKER = 6
#: What copying one surviving record costs (gathering its footer columns, writing it and
#: its footer entry), in bytes read and checked: a calibration, measured by
#: ``bench/compare.py`` (see bench/README.md).
KEPT_RECORD_COST = 600


#: The thread importing what the workers need, once started (see :func:`import_ahead`).
_AHEAD: list[threading.Thread] = []
_AHEAD_LOCK = threading.Lock()


def import_ahead() -> None:
    """Start importing what :func:`write_parts_in_workers` needs (the process pool, and
    zstd) in a thread of its own, once per process: called as pass one starts, so that
    pass two finds them imported instead of importing them on the run's critical path.
    The thread has ended before any worker is forked."""
    with _AHEAD_LOCK:
        if _AHEAD:
            return
        t = threading.Thread(target=_import_pool, name="shale-import-ahead", daemon=True)
        _AHEAD.append(t)
        t.start()


def _import_pool() -> None:
    import concurrent.futures.process  # noqa: F401
    import multiprocessing  # noqa: F401

    try:
        import zstandard  # noqa: F401
    except ImportError:  # (then nothing of the topic is stored with it)
        pass


def work_bytes(item: Work) -> int:
    """Bytes of entries pass two reads for ``item``, as they are decompressed."""
    return 0 if isinstance(item, CompactedPart) else item.slice.raw_data_bytes()


def _entry_costs(item: Copy) -> tuple[int, Any]:
    """The first entry of the slice and the cost of copying each of its entries: its
    bytes (read and checked, decompressed) plus a fixed cost per surviving record (sliced out and
    re-framed in Python).  Survivors crowd towards the newest records, so bytes alone
    would leave the last group with most of the work."""
    s, keep, _ = item
    foot = s.file.footer
    starts = foot.e_rec_start
    e0 = int(foot.entry_of(s.start))
    e1 = int(foot.entry_of(s.stop - 1)) + 1
    bounds = np.clip(starts[e0:e1 + 1], s.start, s.stop) - s.start
    kept = np.add.reduceat(keep, bounds[:-1], dtype=np.int64) if len(keep) else np.zeros(e1 - e0, np.int64)
    # a compressed entry costs what it holds decompressed (it is decompressed when partly kept)
    return e0, foot.raw_lengths()[e0:e1] + FRAME_HEADER.size + KEPT_RECORD_COST * kept


def work_cost(item: Work) -> int:
    return 0 if isinstance(item, CompactedPart) else int(_entry_costs(item)[1].sum())


def _cut(item: Copy, target: int) -> list[Work]:
    """Cut one slice's work at entry boundaries into pieces costing about ``target``."""
    s, keep, since = item
    e0, costs = _entry_costs(item)
    ends = np.cumsum(costs)
    # a piece ends after the entry where the running cost crosses a multiple of target
    at = np.searchsorted(ends, np.arange(target, int(ends[-1]), target))  # ascending
    # (np.unique would do, but its first call imports numpy.ma, which nothing else here needs)
    marks = at[np.r_[True, at[1:] != at[:-1]]] + 1 if len(at) else at + 1
    starts = s.file.footer.e_rec_start
    cuts = [s.start, *(int(starts[e0 + m]) for m in marks if m < len(costs)), s.stop]
    out: list[Work] = []
    for a, b in itertools.pairwise(sorted(set(cuts))):
        i, j = a - s.start, b - s.start
        gone = s.gone[i:j] if s.gone is not None else None
        out.append(Copy(dataclasses.replace(s, start=a, stop=b, gone=gone), keep[i:j], since[i:j]))
    return out


@dataclass(frozen=True, slots=True)
class _Group:
    items: tuple[Work, ...]  # work to copy, or nothing when ...
    reused: CompactedPart | None = None  # ... the group is a previous part kept in place
    cost: int = 0


def _out_bytes(item: Work) -> int:
    """About how many bytes copying ``item`` writes: its survivors at its mean record size."""
    if isinstance(item, CompactedPart):
        return 0
    s, keep, _ = item
    return int(np.count_nonzero(keep)) * s.data_bytes() // max(1, s.records)


def split_work(work: Sequence[Work], workers: int, min_out_bytes: int = 0) -> list[_Group]:
    """Consecutive groups of about equal cost, in order; a part kept in place is a group
    of its own (nothing to copy).  A group also writes about ``min_out_bytes`` at least
    (but the last before a kept part, or the last of all; and never more than a share
    that leaves every worker some groups): each group writes its own parts, and a part
    smaller than the next run keeps in place would be copied again."""
    costs = [work_cost(w) for w in work]
    target = max(1, -(-sum(costs) // max(1, workers * GROUPS_PER_WORKER)))
    outs = [_out_bytes(w) if min_out_bytes else 0 for w in work]
    # never so high that the workers would not all get something to do
    min_out_bytes = min(min_out_bytes, sum(outs) // max(1, 2 * workers))
    groups: list[_Group] = []
    current: list[Work] = []
    size = out = 0

    def close() -> None:
        nonlocal current, size, out
        if current:
            groups.append(_Group(tuple(current), cost=size))
        current, size, out = [], 0, 0

    for item, cost, item_out in zip(work, costs, outs, strict=True):
        if isinstance(item, CompactedPart):
            close()
            groups.append(_Group((), item))
            continue
        pieces = _cut(item, target) if cost > target else [item]
        for piece in pieces:
            current.append(piece)
            size += work_cost(piece) if len(pieces) > 1 else cost
            if min_out_bytes:
                out += _out_bytes(piece) if len(pieces) > 1 else item_out
            if size >= target and out >= min_out_bytes:
                close()
    close()
    return groups


# The job a worker process serves, set in each worker as it starts (forked, so the
# arguments are inherited rather than pickled; a module global in the parent would be
# shared by runs compacting other topics in other threads).
_JOB: dict[str, Any] = {}


def _serve(job: dict[str, Any]) -> None:
    _JOB.update(job)


def _copy_group(g: int) -> tuple[PassTwoResult | None, dict[str, Any] | None]:
    job = _JOB
    try:
        out = write_parts(job["groups"][g].items, job["config"], topic=job["topic"], run_dir=job["run_dir"],
                          epoch=job["epoch"], now_ms=job["now_ms"], on_object=lambda _name: None,
                          name_prefix=f"part-{g:05d}-")
        return out, None
    except ShaleError as e:
        # Shale errors carry fields a pickle would lose; send what the parent needs.
        return None, error_detail(e)


def write_parts_in_workers(work: Sequence[Work], config: CompactionConfig, workers: int, *, topic: Location,
                           run_dir: str, epoch: int, now_ms: int,
                           on_object: Callable[[str], None]) -> PassTwoResult:
    """:func:`~shale.compactor.pass_two.write_parts` over ``workers`` forked processes."""
    # imported here: a run small enough for one process never pays for them
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    for t in _AHEAD:
        t.join()  # (no thread may run across the fork)
    groups = split_work(work, workers, min_out_bytes=config.reuse_min_bytes)
    shared = max(1, min(workers, sum(g.reused is None for g in groups)))
    # Byte-rate limits hold for the run as a whole, so each worker gets its share.
    config = dataclasses.replace(config, max_read_bytes_per_s=-(-config.max_read_bytes_per_s // shared),
                                 max_write_bytes_per_s=-(-config.max_write_bytes_per_s // shared))
    job = {"groups": groups, "config": config, "topic": topic, "run_dir": run_dir, "epoch": epoch, "now_ms": now_ms}
    result = PassTwoResult()
    with ProcessPoolExecutor(max_workers=shared, mp_context=multiprocessing.get_context("fork"),
                             initializer=_serve, initargs=(job,)) as pool:
        # Costliest groups first (longest processing time first): whatever is left when
        # a worker runs out of work is one of the small ones.  Results are taken in order.
        futures: list[Future[tuple[PassTwoResult | None, dict[str, Any] | None]] | None] = [None] * len(groups)
        for g in sorted((g for g, group in enumerate(groups) if group.reused is None), key=lambda g: -groups[g].cost):
            futures[g] = pool.submit(_copy_group, g)
        try:
            for group, fut in zip(groups, futures, strict=True):
                if group.reused is not None:
                    result.parts.append(group.reused)
                    result.records_reused += group.reused.live
                    continue
                assert fut is not None
                try:
                    out, error = fut.result()
                except BrokenProcessPool as e:
                    raise ShaleError(f"{topic.store.url(topic.key(run_dir))}: a pass-two worker process "
                                     "died (killed or out of memory); nothing was published") from e
                if error is not None:
                    raise error_from_detail(error)
                assert out is not None
                for p in out.parts:
                    on_object(p.object)
                result.parts.extend(out.parts)
                result.records_written += out.records_written
                result.bytes_written += out.bytes_written
                result.bytes_read += out.bytes_read
        except BaseException:
            # Let running workers finish before the run removes its folder, so none
            # writes into it afterwards.
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return result
