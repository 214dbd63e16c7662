"""The rules both engines decide survivors by: which record of a key is the latest
(:mod:`shale.ledger.latest`, shared with the readers of the table), and when a tombstone
expires."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from shale.ledger.latest import latest_by_event_time, latest_by_sorting, latest_of_each_key

__all__ = ["held_past_retention", "held_tombstones", "latest_by_event_time", "latest_by_sorting", "latest_of_each_key",
           "tombstone_fate"]


def held_tombstones(positions: npt.NDArray[np.int64], hold_from: int | None) -> npt.NDArray[np.bool_] | None:
    """Which of the tombstones at these run positions an active subscription has yet to
    read: those at or after ``hold_from``, the run position of the first record at or
    after the least position of the active subscriptions (None: none is active)."""
    return None if hold_from is None else positions >= hold_from


def tombstone_fate(since: npt.NDArray[np.int64], now_ms: int, delete_retention_ms: int, *,
                   held: npt.NDArray[np.bool_] | None = None,
                   max_hold_ms: int = 0) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
    """For tombstones that are the latest record of their key: which expire now, and
    since when each is kept (KIP-534: counted from the first run that kept it).

    ``since`` is the tombstone's recorded first-kept time, 0 when no run kept it yet.  A
    tombstone ``held`` for an active subscription that has yet to read it stays past the
    delete retention until it has been kept ``max_hold_ms`` (0: nothing is held), so no
    active subscriber misses a delete.
    """
    if held is None or max_hold_ms == 0 or not held.any():
        if delete_retention_ms == 0:
            return np.ones(len(since), dtype=bool), np.zeros(len(since), dtype=np.int64)
        held = None
    first_kept = np.where(since > 0, since, now_ms).astype(np.int64)
    kept_for = now_ms - first_kept
    expired = kept_for >= delete_retention_ms
    if held is not None:
        expired &= ~held | (kept_for >= max_hold_ms)
    return expired, first_kept


def held_past_retention(expired: npt.NDArray[np.bool_], first_kept: npt.NDArray[np.int64], now_ms: int,
                        delete_retention_ms: int) -> int:
    """How many of the tombstones :func:`tombstone_fate` judged (``expired``, ``first_kept``)
    stay past their delete retention: only a subscription's hold keeps those."""
    return int(np.count_nonzero(~expired & (now_ms - first_kept >= delete_retention_ms)))
