"""The state of a topic at any point of its history, folded in plain Python from every
record ever produced: no hashes, no NumPy, no Shale view.

A record's *time*, as the topic's order counts it, is its event time under event-time
order (for a record without one, the publish time of its entry: the latest publish time
of the records written with it), else that publish time.  The state at a point is, of
the records before the point's first id, the latest of each key (the last by id under
offset order, the greatest ``(time, id)`` under event-time order) that is not a tombstone
and, with a key TTL, not older than ``now`` less the TTL.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from shale.ledger.ids import MessageId
from shale.ledger.ordering import TopicOrder
from shale.ledger.record import Message

__all__ = ["History", "State", "diff"]

#: key -> the id of its record
State = dict[bytes, MessageId]


@dataclass
class History:
    """Every record produced (removed ones included), by id."""

    records: dict[MessageId, Message] = field(default_factory=dict)

    def add(self, messages: Iterable[Message]) -> None:
        for m in messages:
            self.records.setdefault(m.id, m)

    def ordered(self) -> list[Message]:
        return [self.records[i] for i in sorted(self.records)]

    def entry_publish(self) -> dict[tuple[int, int], int]:
        out: dict[tuple[int, int], int] = {}
        for m in self.records.values():
            k = (m.id.ledger, m.id.entry)
            out[k] = max(out.get(k, m.publish_time), m.publish_time)
        return out

    def cut_at_time(self, ms: int) -> MessageId | None:
        """The first id of a record published after ``ms`` (None: there is none)."""
        return next((m.id for m in self.ordered() if m.publish_time > ms), None)

    def state(self, end: MessageId | None, order: TopicOrder, now_ms: int) -> State:
        """The state of the records with ids below ``end`` (None: all of them)."""
        entries = self.entry_publish()

        def time(m: Message) -> int:
            publish = entries[(m.id.ledger, m.id.entry)]
            if order.by_event_time and m.event_time is not None:
                return m.event_time
            return publish

        winner: dict[bytes, tuple[int, MessageId, Message]] = {}
        for m in self.ordered():
            if end is not None and m.id >= end:
                break
            if m.key is None:
                continue
            rank = (time(m) if order.by_event_time else 0, m.id)
            held = winner.get(m.key)
            if held is None or rank >= held[:2]:
                winner[m.key] = (rank[0], m.id, m)
        out: State = {}
        for key, (_, mid, m) in winner.items():
            if m.is_tombstone:
                continue
            if order.key_ttl_ms and order.expired_at(time(m), now_ms):
                continue
            out[key] = mid
        return out


def diff(a: State, b: State) -> tuple[State, set[bytes]]:
    """What changed from ``a`` to ``b``: the keys upserted (with their ids) and deleted."""
    upserts = {k: i for k, i in b.items() if a.get(k) != i}
    return upserts, set(a) - set(b)
