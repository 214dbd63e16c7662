"""What active subscriptions hold back from a run: the tombstones they have yet to read.

A run lists the topic's subscriptions once, when it plans, and takes the least position
among the active ones (:func:`~shale.metadata.subscriptions.hold_floor`); every tombstone
at or after it stays past the delete retention, until it has been kept
``max-tombstone-hold`` (:func:`~shale.compactor.rules.tombstone_fate`).  Both engines
number the run's records alike (previous parts first, then the new ledgers, in id order),
so the hold reaches them as one run position (:attr:`~shale.compactor.plan.Plan.hold_from`):
the first record at or after the floor.  Finding it needs at most one footer.
"""

from __future__ import annotations

import dataclasses
from typing import Final

import numpy as np

from shale.compactor.config import CompactionConfig
from shale.compactor.plan import Plan, Slice, open_slice
from shale.compactor.rules import held_tombstones, tombstone_fate
from shale.ledger.format import FLAG_HAS_KEY, FLAG_TOMBSTONE
from shale.ledger.ids import MessageId
from shale.metadata.handle import Topic, opened
from shale.metadata.subscriptions import hold_floor
from shale.metadata.topic import TopicMetadata

__all__ = ["subscription_hold", "tombstones_drop", "with_hold"]

_TOMB_BITS: Final = np.uint8(FLAG_HAS_KEY | FLAG_TOMBSTONE)


def subscription_hold(topic: Topic | TopicMetadata, config: CompactionConfig, now_ms: int) -> MessageId | None:
    """The least position of the topic's subscriptions active at ``now_ms`` (None: none
    is, or the run holds nothing back: ``max_tombstone_hold_ms`` 0), as its handle lists
    them."""
    if config.max_tombstone_hold_ms == 0:
        return None
    return hold_floor(opened(topic).subscriptions, now_ms, config.subscription_expiry_ms)


def _first_at_or_after(meta: TopicMetadata, s: Slice, floor: MessageId) -> int | None:
    """Which record of ``s`` (counted from its start) is the first whose id is at or
    after ``floor``; None when every one is before it.  The metadata answers unless the
    floor falls inside the slice's object: then its footer does."""
    part = s.part
    if s.compacted and part is not None:
        if part.first_id is None or part.last_id is None or floor > part.last_id:
            return None
        if floor <= part.first_id:
            return 0
    elif floor.ledger != s.object.ledger_id:
        return 0 if floor.ledger < s.object.ledger_id else None
    at = min(max(open_slice(meta, s).file.find(floor), s.start), s.stop)
    return None if at >= s.stop else at - s.start


def with_hold(meta: TopicMetadata, plan: Plan, floor: MessageId | None) -> Plan:
    """``plan`` holding back the tombstones at or after ``floor`` (None: none)."""
    if floor is None:
        return plan
    base = 0
    for s in plan.slices:
        i = _first_at_or_after(meta, s, floor)
        if i is not None:
            return dataclasses.replace(plan, hold_floor=floor, hold_from=base + i)
        base += s.records
    return dataclasses.replace(plan, hold_floor=floor, hold_from=base)


def tombstones_drop(meta: TopicMetadata, plan: Plan, config: CompactionConfig, now_ms: int) -> bool:
    """Whether a run without new records would still drop a tombstone of the previous
    parts (past its retention and not held, or held past ``max_tombstone_hold_ms``): a
    run with nothing new revisits the held ones once they are released."""
    base = 0
    for s in plan.compacted:
        s = open_slice(meta, s)  # one at a time, when planned without footers
        foot = s.file.footer
        tomb_mask = (foot.col("r_flags")[s.start:s.stop] & _TOMB_BITS) == _TOMB_BITS  # (keyless: no tombstone)
        if s.gone is not None:
            tomb_mask &= ~s.gone
        tomb = np.flatnonzero(tomb_mask)
        expired = None
        if len(tomb):
            expired, _ = tombstone_fate(foot.delete_since()[s.start:s.stop][tomb], now_ms, config.delete_retention_ms,
                                        held=held_tombstones(base + tomb, plan.hold_from),
                                        max_hold_ms=config.max_tombstone_hold_ms)
        s.file.release_pages()  # a run with nothing new reads every part's flags: one at a time
        if expired is not None and expired.any():
            return True
        base += s.records
    return False
