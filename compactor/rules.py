"""The rules both engines decide survivors by: which record of a key is the latest, and
when a tombstone expires."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["latest_of_each_key", "tombstone_fate"]


def latest_of_each_key(hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64]) -> npt.NDArray[np.intp]:
    """Indexes of the last occurrence of every distinct 128-bit hash ``(hi, lo)``, in no
    particular order.  Both engines decide "latest" with this one function.

    One unstable sort on the high 64 bits groups equal hashes; the greatest index of each
    group is its latest occurrence.  Two keys sharing the high 64 bits but not the low
    ones (about one chance in 10^7 for ten million keys) would share a group, so the
    rare input where that happens takes the exact two-key sort instead.
    """
    n = len(hi)
    if not n:
        return np.empty(0, dtype=np.intp)
    order = np.argsort(hi)
    shi = hi[order]
    first = np.empty(n, dtype=bool)
    first[0] = True
    np.not_equal(shi[1:], shi[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    slo = lo[order]
    group = np.cumsum(first) - 1
    if not np.array_equal(slo, slo[starts][group]):
        return _latest_exact(hi, lo)
    return np.maximum.reduceat(order, starts).astype(np.intp, copy=False)


def _latest_exact(hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64]) -> npt.NDArray[np.intp]:
    order = np.lexsort((lo, hi))  # stable: equal hashes stay in index order
    shi, slo = hi[order], lo[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = (shi[1:] != shi[:-1]) | (slo[1:] != slo[:-1])
    return order[last]


def tombstone_fate(since: npt.NDArray[np.int64], now_ms: int,
                   delete_retention_ms: int) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
    """For tombstones that are the latest record of their key: which expire now, and
    since when each is kept (KIP-534: counted from the first run that kept it).

    ``since`` is the tombstone's recorded first-kept time, 0 when no run kept it yet.
    """
    if delete_retention_ms == 0:
        return np.ones(len(since), dtype=bool), np.zeros(len(since), dtype=np.int64)
    first_kept = np.where(since > 0, since, now_ms).astype(np.int64)
    return now_ms - first_kept >= delete_retention_ms, first_kept
