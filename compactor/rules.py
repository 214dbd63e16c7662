"""The rules both engines decide survivors by: which record of a key is the latest
(:mod:`shale.ledger.latest`, shared with the readers of the table), and when a tombstone
expires."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from shale.ledger.latest import latest_by_event_time, latest_by_sorting, latest_of_each_key

__all__ = ["latest_by_event_time", "latest_by_sorting", "latest_of_each_key", "tombstone_fate"]


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
