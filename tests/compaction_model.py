"""The compacted view of a topic as the rules define it, folded in plain Python over the
records a full read returns: no hashes, no NumPy, nothing shared with either engine.

A run moves the horizon to the last record before the first entry (above the previous
horizon) published after ``now - min compaction lag``; of the records up to the horizon
it keeps the latest of every key, a tombstone only until ``delete retention`` has passed
since the first run that kept it (counted from that run's ``now``; retention 0 drops
every tombstone) — or, when it lies at or after ``hold`` (the least position of the
active subscriptions), until it has been kept ``max hold`` —, and keyless records only
with ``retain_null_key``.  A compacted read
is what the runs kept, then every record above the horizon.

Both engines decide survivors with :mod:`shale.compactor.rules`; comparing their output
with this fold is what catches a mistake they share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shale.ledger.ids import MessageId
from shale.ledger.record import Message
from shale.reader import TopicReader


def every_record(uri: str) -> list[Message]:
    """Every record of the topic, in id order (the original ledgers, not the compacted view)."""
    with TopicReader(uri) as r:
        return r.read()


def row(m: Message) -> tuple[str, Any, Any, Any]:
    """A record as the Spark tests compare them."""
    return (str(m.id), m.key, m.value, m.properties)


@dataclass
class CompactionModel:
    """The horizon and the survivors of the runs so far."""

    horizon: MessageId | None = None
    kept: list[MessageId] = field(default_factory=list)
    first_kept: dict[MessageId, int] = field(default_factory=dict)  # tombstone -> the first run that kept it

    def bound(self, records: Sequence[Message], cutoff_ms: int) -> MessageId | None:
        """The horizon a run with this cutoff reaches: the last record before the first
        entry above the current horizon published after ``cutoff_ms``."""
        entries: dict[tuple[int, int], tuple[int, MessageId]] = {}
        for m in records:
            if self.horizon is not None and m.id <= self.horizon:
                continue
            k = (m.id.ledger, m.id.entry)
            published, last = entries.get(k, (m.publish_time, m.id))
            entries[k] = (max(published, m.publish_time), max(last, m.id))
        horizon = self.horizon
        for _, (published, last) in sorted(entries.items()):
            if published > cutoff_ms:
                break
            horizon = last
        return horizon

    def run(self, records: Sequence[Message], *, now_ms: int, lag_ms: int = 0, retention_ms: int,
            retain_null_key: bool = False, horizon: MessageId | None = None, hold: MessageId | None = None,
            max_hold_ms: int = 0) -> MessageId | None:
        """One run at ``now_ms``, to :meth:`bound` or to ``horizon`` when given (a run
        whose key map filled up stops short of the bound), holding the tombstones at or
        after ``hold`` until kept ``max_hold_ms``.  Returns the new horizon."""
        bound = self.bound(records, now_ms - lag_ms)
        if horizon is None:
            horizon = bound
        assert horizon is None or (bound is not None and horizon <= bound), (horizon, bound)
        keep = set(self.kept)
        prev = self.horizon
        candidates = [m for m in records
                      if m.id in keep or (horizon is not None and m.id <= horizon and (prev is None or m.id > prev))]
        latest = {m.key: m.id for m in candidates if m.key is not None}
        kept: list[MessageId] = []
        first_kept: dict[MessageId, int] = {}
        for m in candidates:
            if m.key is None:
                if retain_null_key:
                    kept.append(m.id)
                continue
            if latest[m.key] != m.id:
                continue
            if m.is_tombstone:
                since = self.first_kept.get(m.id, now_ms)
                held = hold is not None and m.id >= hold and now_ms - since < max_hold_ms
                if not held and (retention_ms == 0 or now_ms - since >= retention_ms):
                    continue
                first_kept[m.id] = since
            kept.append(m.id)
        self.horizon, self.kept, self.first_kept = horizon, kept, first_kept
        return horizon

    def view(self, records: Sequence[Message]) -> list[Message]:
        """What a compacted read returns now."""
        keep = set(self.kept)
        return [m for m in records if m.id in keep or self.horizon is None or m.id > self.horizon]

    def rows(self, records: Sequence[Message]) -> list[tuple[str, Any, Any, Any]]:
        """:meth:`view` as :func:`row` tuples."""
        return [row(m) for m in self.view(records)]
