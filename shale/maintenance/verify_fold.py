"""``shale verify``'s own fold: the latest record of every key, computed apart from the
compactor's.

Compaction decides "latest" with :func:`shale.compactor.rules.latest_of_each_key` (a hash table
in C, or a sort of packed words in NumPy).  Verification must not share that code, or a
bug in it would pass unseen: this module imports neither, and folds by a plain argsort
of the high hash halves, the greatest position of each run of equal halves, and an exact
three-key sort for the rare runs that hold several keys.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["latest_per_key", "latest_per_key_by_time"]


def latest_per_key(hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64]) -> npt.NDArray[np.intp]:
    """Positions of the last occurrence of every distinct 128-bit hash ``(hi, lo)``,
    ordered by ``hi``, then ``lo``.  Positions are indexes into ``hi`` and ``lo``, which
    hold the records in id order, so the greatest position of a key is its latest
    record."""
    n = len(hi)
    if not n:
        return np.empty(0, dtype=np.intp)
    order = np.argsort(hi)  # not stable: each run's greatest position is taken below
    shi = hi[order]
    starts = np.flatnonzero(np.concatenate(([True], shi[1:] != shi[:-1])))
    del shi
    slo = lo[order]
    # a run whose low halves are not all equal holds several keys
    split = np.concatenate(([False], slo[1:] != slo[:-1]))
    del slo
    split[starts] = False
    latest = np.maximum.reduceat(order, starts)
    if not split.any():
        return latest.astype(np.intp, copy=False)
    run = np.zeros(n, dtype=np.intp)  # each sorted record's run
    run[starts[1:]] = 1
    np.cumsum(run, out=run)
    mixed = np.zeros(len(starts), dtype=bool)
    mixed[run[split]] = True
    exact = _last_of_each(hi, lo, order[mixed[run]])
    both = np.concatenate((latest[~mixed], exact))
    # runs are whole high halves, so plain and exact ones never share one, and the exact
    # ones come ordered by low half within theirs, which a stable sort keeps
    return both[np.argsort(hi[both], kind="stable")].astype(np.intp, copy=False)


def _last_of_each(hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64],
                  members: npt.NDArray[np.intp]) -> npt.NDArray[np.intp]:
    """Among positions ``members``, the greatest of each distinct ``(hi, lo)``, ordered
    by ``(hi, lo)``."""
    o = members[np.lexsort((members, lo[members], hi[members]))]
    h, lw = hi[o], lo[o]
    last = np.ones(len(o), dtype=bool)
    last[:-1] = (h[1:] != h[:-1]) | (lw[1:] != lw[:-1])
    return o[last]


def latest_per_key_by_time(hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64],
                           times: npt.NDArray[np.int64]) -> npt.NDArray[np.intp]:
    """Under event-time order: the position of the record with the greatest
    ``(time, position)`` of every distinct hash ``(hi, lo)``, ordered by ``hi``, then
    ``lo`` (one exact four-key sort)."""
    n = len(hi)
    if not n:
        return np.empty(0, dtype=np.intp)
    o = np.lexsort((np.arange(n), times, lo, hi))
    h, lw = hi[o], lo[o]
    last = np.ones(n, dtype=bool)
    last[:-1] = (h[1:] != h[:-1]) | (lw[1:] != lw[:-1])
    return o[last].astype(np.intp, copy=False)
