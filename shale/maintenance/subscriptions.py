"""``shale subscriptions``: a topic's durable subscriptions with their lag and the reader
holding each, as ``kafka-consumer-groups --describe`` shows consumer groups (creating,
deleting and resetting them: :mod:`shale.maintenance.resets`).

A subscription's **lag** is what a plain read from its position has left: the records and
stored bytes of the topic's ledgers from there on (a ledger the position lies inside
counts from the position's entry; exactly, from its footer, or estimated from the
metadata where no footer may be read, as ``shale topics`` does).  Its **compacted lag**
is what a compacted read from there has left: the live records of the compacted parts
from its position (one per key), then every record above the horizon.  Only an
**active** subscription holds anything back (:mod:`shale.metadata.subscriptions`); the
slowest one is the active one with the greatest lag.
"""

from __future__ import annotations

import time
from typing import Any

from shale.ledger.ids import MessageId
from shale.ledger.values import dataclass
from shale.metadata.handle import Topic, opened
from shale.metadata.state import TopicState
from shale.metadata.subscriptions import CLOCK_SKEW_MS, Member, Subscription, Subscriptions, expiry_of
from shale.metadata.topic import TopicMetadata
from shale.metadata.view import Removed, TopicView, wholly_below
from shale.settings.units import format_duration, format_time

__all__ = ["Lag", "SubscriptionList", "SubscriptionStatus", "ago", "compacted_lag", "lag_of", "list_subscriptions",
           "slowest", "subscription_statuses"]


@dataclass(frozen=True, slots=True)
class Lag:
    """What a plain read from a position has left: records and stored bytes."""

    records: int = 0
    bytes: int = 0


def lag_of(meta: TopicMetadata, topic: TopicState, position: MessageId, *, footers: bool = True) -> Lag:
    """The records and stored bytes of ``topic``'s ledgers from ``position`` on; the ledger
    the position lies inside is counted from the position's entry, by its footer (with
    ``footers``) or in proportion to its entries."""
    records = size = 0
    for lg in topic.ledgers:
        if wholly_below(lg, position):
            continue
        if position <= lg.first_id:
            records, size = records + lg.records, size + lg.bytes
        elif footers:
            from shale.metadata.positions import open_ledger  # (not at import: every compaction imports this module)

            f = open_ledger(meta, lg)
            at = f.find(position)
            if at < f.n_records:
                records += f.n_records - at
                size += lg.bytes - int(f.footer.col("e_offset")[int(f.footer.entry_of(at))])
        else:  # as if every entry held as many records and bytes
            share = (lg.entries - position.entry) / lg.entries
            records += max(0, round(lg.records * share) - position.batch)
            size += round(lg.bytes * share)
    return Lag(records, size)


def compacted_lag(meta: TopicMetadata, view: TopicView, position: MessageId) -> int:
    """The records a compacted read of ``view`` from ``position`` has left: the live
    records of the compacted parts from there (from the metadata, a footer and deletion
    vector read only for the part the position lies inside), then every record of the
    ledgers above the horizon (a footer read for the ledger the position lies inside)."""
    n = 0
    for seg in view.segments(position):
        if isinstance(seg, Removed):
            continue  # what retention removed is read by no one
        part = seg.part
        if part is not None and part.first_id is not None and part.first_id >= position:
            n += part.records - part.deleted
        elif part is not None or seg.starts_inside:
            f = seg.open(meta)
            n += len(seg.live(meta, f))
        else:
            n += seg.records
    return n


def ago(ms: int) -> str:
    """A time span in words, to the second (``3s``, ``2m 5s``, ``1h 0m``, ``3d 4h``)."""
    s = max(0, ms) // 1000
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86_400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86_400}d {s % 86_400 // 3600}h"


@dataclass(frozen=True, slots=True)
class SubscriptionStatus:
    """One subscription, its lag, whether it is active (else expired), and the reader
    holding it."""

    subscription: Subscription
    lag: Lag
    active: bool
    #: when it counts as having last committed (its commit time, unless that was too far
    #: ahead of this clock: :meth:`~shale.metadata.subscriptions.Subscription.commit_ms`)
    commit_ms: int = 0
    #: its commit time was too far ahead of this clock to be believed
    ahead: bool = False
    #: when it expires (expired) without a commit: its commit time and the topic's expiry
    expires_ms: int = 0
    #: how long ago the reader its document names last said so (None: none is named)
    heartbeat_age_ms: int | None = None
    #: whether that reader holds it still (its heartbeat is younger than its timeout)
    held: bool = False
    #: what a compacted read from its position has left (None: not asked for)
    compacted_lag: int | None = None

    @property
    def member(self) -> Member | None:
        return self.subscription.member

    @property
    def state(self) -> str:
        return "active" if self.active else "expired"

    def to_json(self) -> dict[str, Any]:
        s, m = self.subscription, self.subscription.member
        return {"name": s.name, "position": str(s.position), "lag_records": self.lag.records,
                "lag_bytes": self.lag.bytes, "lag_compacted_records": self.compacted_lag,
                "committed_ms": s.committed_ms, "created_ms": s.created_ms, "state": self.state,
                "commit_ahead": self.ahead, "expires_ms": self.expires_ms,
                "member": None if m is None else {"id": m.id, "heartbeat_age_ms": self.heartbeat_age_ms,
                                                  "timeout_ms": m.timeout_ms, "holds": self.held}}


def subscription_statuses(topic: Topic | TopicMetadata, *, now_ms: int | None = None, footers: bool = True,
                          compacted: bool = False) -> list[SubscriptionStatus]:
    """Every subscription of the topic with its lag, active or expired by the topic's
    ``subscription-expiry`` at ``now_ms`` (this machine's clock when None), and the reader
    holding it, from the documents the topic's handle holds (read on first use); with
    ``compacted``, its :func:`compacted_lag` too.  A subscription past the end of the topic
    is corrupt metadata naming its document."""
    t = opened(topic)
    subs = t.subscriptions
    if not subs:
        return []
    state = t.state
    for s in subs:
        state = Subscriptions(t.meta).check_found(s, state)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    expiry = expiry_of(t.policy)
    view = TopicView(state, t.compaction) if compacted else None
    return [SubscriptionStatus(
        s, lag_of(t.meta, state, s.position, footers=footers), s.active(now, expiry), s.commit_ms(now), s.ahead(now),
        min(s.commit_ms(now) + expiry, (1 << 62) - 1),
        None if s.member is None else s.member.age_ms(now, s.written_ms), s.holder(now) is not None,
        None if view is None else compacted_lag(t.meta, view, s.position)) for s in subs]


def slowest(statuses: list[SubscriptionStatus]) -> SubscriptionStatus | None:
    """The active subscription with the greatest lag in records (None: none is active)."""
    return max((s for s in statuses if s.active), key=lambda s: (s.lag.records, s.lag.bytes), default=None)


def _when(ms: int) -> str:
    return format_time(ms)


@dataclass(frozen=True, slots=True)
class SubscriptionList:
    """What ``shale subscriptions T`` prints (``describe``: with each one's compacted lag
    and the reader holding it)."""

    topic: str
    expiry_ms: int
    rows: tuple[SubscriptionStatus, ...]
    describe: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "subscription_expiry_ms": self.expiry_ms,
                "subscriptions": [r.to_json() for r in self.rows]}

    def human(self) -> str:
        if not self.rows:
            return (f"{self.topic}: no subscriptions (shale subscriptions {self.topic} --create NAME, or shale read "
                    f"{self.topic} --subscription NAME)")
        head = ["NAME", "POSITION", "LAG RECORDS", "LAG BYTES"]
        right = {2, 3}
        if self.describe:
            head.append("LAG COMPACTED")
            right.add(4)
        head += ["LAST COMMIT (UTC)", "STATE", "READER"]
        table = [tuple(head)] + [self._row(r) for r in self.rows]
        widths = [max(len(row[i]) for row in table) for i in range(len(head))]
        lines = ["  ".join(c.rjust(w) if i in right else c.ljust(w)
                           for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip() for row in table]
        lines.append(f"(a subscription that has not committed for {format_duration(self.expiry_ms)} expires: it "
                     "holds nothing back until it commits again)")
        if self.describe:
            lines.append("(LAG COMPACTED: the records a compacted read from its position has left, one per key up to "
                         "the horizon, then every record above it)")
        lines += [f"(*) {r.subscription.name}: commit time {_when(r.subscription.committed_ms)} UTC in its document is "
                  f"more than {format_duration(CLOCK_SKEW_MS)} ahead of this clock: it counts as committed when the "
                  "document was last written" for r in self.rows if r.ahead]
        return "\n".join(lines)

    def _row(self, r: SubscriptionStatus) -> tuple[str, ...]:
        row = [r.subscription.name, str(r.subscription.position), f"{r.lag.records:,}", f"{r.lag.bytes:,}"]
        if self.describe:
            row.append("-" if r.compacted_lag is None else f"{r.compacted_lag:,}")
        m = r.member
        reader = "-" if m is None or (not r.held and not self.describe) else \
            f"{m.id} (heartbeat {ago(r.heartbeat_age_ms or 0)} ago{'' if r.held else ', gone'})"
        return (*row, _when(r.commit_ms) + (" (*)" if r.ahead else ""), r.state, reader)


def list_subscriptions(meta: Topic | TopicMetadata, *, describe: bool = False) -> SubscriptionList:
    """Every subscription of the topic, by name, with its lag, state and reader (with
    ``describe``: its compacted lag, and a reader gone too)."""
    t = opened(meta)
    return SubscriptionList(t.uri, expiry_of(t.policy), tuple(subscription_statuses(t, compacted=describe)),
                            describe)
