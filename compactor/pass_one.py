"""Pass one: the latest position of every key, from footers only.

Every ledger footer carries the 128-bit key hash and flags of each record as dense
arrays, so this pass never reads a payload.  Positions are indexes into the run's
records in id order (previous compacted parts first, then the new ledgers); a stable
sort by key hash puts each key's latest position last in its group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from compactor.config import CompactionConfig
from compactor.plan import Plan
from ledger.format import FLAG_HAS_KEY, FLAG_TOMBSTONE

__all__ = ["Survivors", "latest_of_each_key", "pass_one", "tombstone_fate"]


@dataclass(frozen=True, slots=True, eq=False)
class Survivors:
    """Which of the run's records survive, and the counts a summary reports."""

    keep: npt.NDArray[np.bool_]  # one flag per record read, in run order
    delete_since: npt.NDArray[np.int64]  # per record: when a kept tombstone was first kept
    offsets: tuple[int, ...]  # where each slice of the plan starts in ``keep``
    records_read: int
    keys: int  # live keys (latest record is not a tombstone)
    tombstones_kept: int
    tombstones_dropped: int
    keyless_kept: int
    keyless_dropped: int
    footer_bytes: int

    @property
    def records_kept(self) -> int:
        return int(self.keep.sum())

    def slice_keep(self, i: int) -> npt.NDArray[np.bool_]:
        return self.keep[self.offsets[i]:self.offsets[i + 1]]

    def slice_delete_since(self, i: int) -> npt.NDArray[np.int64]:
        return self.delete_since[self.offsets[i]:self.offsets[i + 1]]


def _column(plan: Plan, name: str, dtype: Any) -> npt.NDArray[Any]:
    parts = [s.file.footer.col(name)[s.start:s.stop] for s in plan.slices]
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.empty(0, dtype)


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


def pass_one(plan: Plan, config: CompactionConfig, now_ms: int) -> Survivors:
    """Decide the survivors of ``plan`` under ``config`` at time ``now_ms``."""
    offsets = [0]
    for s in plan.slices:
        offsets.append(offsets[-1] + s.records)
    n = offsets[-1]
    flags = _column(plan, "r_flags", np.uint8)
    hi = _column(plan, "r_hash_hi", np.uint64)
    lo = _column(plan, "r_hash_lo", np.uint64)
    since_parts = [s.file.footer.delete_since()[s.start:s.stop] for s in plan.slices]
    since = np.concatenate(since_parts) if since_parts else np.empty(0, np.int64)

    keyed = np.nonzero(flags & FLAG_HAS_KEY)[0]
    keep = np.zeros(n, dtype=bool)
    latest = keyed[latest_of_each_key(hi[keyed], lo[keyed])]
    keep[latest] = True
    tomb = latest[(flags[latest] & FLAG_TOMBSTONE) != 0]

    # Tombstones stay for delete_retention after the first run that kept them (KIP-534).
    new_since = np.zeros(n, dtype=np.int64)
    expired, first_kept = tombstone_fate(since[tomb], now_ms, config.delete_retention_ms)
    drop = tomb[expired]
    new_since[tomb[~expired]] = first_kept[~expired]
    keep[drop] = False

    keyless = n - len(keyed)
    if config.retain_null_key and keyless:
        keep[(flags & FLAG_HAS_KEY) == 0] = True
    return Survivors(
        keep=keep, delete_since=new_since, offsets=tuple(offsets), records_read=n,
        keys=len(latest) - len(tomb), tombstones_kept=len(tomb) - len(drop), tombstones_dropped=len(drop),
        keyless_kept=keyless if config.retain_null_key else 0,
        keyless_dropped=0 if config.retain_null_key else keyless,
        footer_bytes=sum(s.file.footer_bytes for s in plan.slices),
    )
