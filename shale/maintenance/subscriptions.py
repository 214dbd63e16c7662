"""``shale subscriptions``: a topic's durable subscriptions with their lag, and creating,
deleting and resetting them, as ``kafka-consumer-groups`` does for consumer groups.

A subscription's **lag** is what a plain read from its position has left: the records and
stored bytes of the topic's ledgers from there on (a ledger the position lies inside
counts from the position's entry; exactly, from its footer, or estimated from the
metadata where no footer may be read, as ``shale topics`` does).  Only an **active**
subscription holds anything back (:mod:`shale.metadata.subscriptions`); the slowest one
is the active one with the greatest lag.
"""

from __future__ import annotations

import datetime
import re
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from shale.ledger.errors import InvalidInputError
from shale.ledger.format import KIND_ORIGINAL
from shale.ledger.ids import MIN_ID, MessageId
from shale.ledger.reader import LedgerFile
from shale.metadata.handle import Topic, opened
from shale.metadata.state import LedgerInfo, TopicState
from shale.metadata.subscriptions import CLOCK_SKEW_MS, Subscription, Subscriptions, check_name, expiry_of
from shale.metadata.topic import TopicMetadata
from shale.metadata.view import wholly_below
from shale.settings.kinds import shown
from shale.settings.units import count, format_duration, format_time

__all__ = ["Lag", "SubscriptionChange", "SubscriptionList", "SubscriptionStatus", "change_subscription", "lag_of",
           "list_subscriptions", "slowest", "subscription_statuses", "target_position"]


@dataclass(frozen=True, slots=True)
class Lag:
    """What a plain read from a position has left: records and stored bytes."""

    records: int = 0
    bytes: int = 0


def _ledger_file(meta: TopicMetadata, lg: LedgerInfo) -> LedgerFile:
    return LedgerFile.open(meta.topic.store, meta.topic.key(lg.object), ledger_id=lg.id, kind=KIND_ORIGINAL,
                           dictionaries=meta.dictionaries)


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
            f = _ledger_file(meta, lg)
            at = f.find(position)
            if at < f.n_records:
                records += f.n_records - at
                size += lg.bytes - int(f.footer.col("e_offset")[int(f.footer.entry_of(at))])
        else:  # as if every entry held as many records and bytes
            share = (lg.entries - position.entry) / lg.entries
            records += max(0, round(lg.records * share) - position.batch)
            size += round(lg.bytes * share)
    return Lag(records, size)


@dataclass(frozen=True, slots=True)
class SubscriptionStatus:
    """One subscription, its lag, and whether it is active (else expired)."""

    subscription: Subscription
    lag: Lag
    active: bool
    #: when it counts as having last committed (its commit time, unless that was too far
    #: ahead of this clock: :meth:`~shale.metadata.subscriptions.Subscription.commit_ms`)
    commit_ms: int = 0
    #: its commit time was too far ahead of this clock to be believed
    ahead: bool = False

    def to_json(self) -> dict[str, Any]:
        s = self.subscription
        return {"name": s.name, "position": str(s.position), "lag_records": self.lag.records,
                "lag_bytes": self.lag.bytes, "committed_ms": s.committed_ms, "created_ms": s.created_ms,
                "state": "active" if self.active else "expired", "commit_ahead": self.ahead}


def subscription_statuses(topic: Topic | TopicMetadata, *, now_ms: int | None = None,
                          footers: bool = True) -> list[SubscriptionStatus]:
    """Every subscription of the topic with its lag, active or expired by the topic's
    ``subscription-expiry`` at ``now_ms`` (this machine's clock when None), from the
    documents the topic's handle holds (read on first use); a subscription past the end of
    the topic is corrupt metadata naming its document."""
    t = opened(topic)
    subs = t.subscriptions
    if not subs:
        return []
    state = t.state
    for s in subs:
        state = Subscriptions(t.meta).check_found(s, state)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    expiry = expiry_of(t.policy)
    return [SubscriptionStatus(s, lag_of(t.meta, state, s.position, footers=footers), s.active(now, expiry),
                               s.commit_ms(now), s.ahead(now)) for s in subs]


def slowest(statuses: list[SubscriptionStatus]) -> SubscriptionStatus | None:
    """The active subscription with the greatest lag in records (None: none is active)."""
    return max((s for s in statuses if s.active), key=lambda s: (s.lag.records, s.lag.bytes), default=None)


def _when(ms: int) -> str:
    return format_time(ms)


@dataclass(frozen=True, slots=True)
class SubscriptionList:
    """What ``shale subscriptions T`` prints."""

    topic: str
    expiry_ms: int
    rows: tuple[SubscriptionStatus, ...]

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "subscription_expiry_ms": self.expiry_ms,
                "subscriptions": [r.to_json() for r in self.rows]}

    def human(self) -> str:
        if not self.rows:
            return (f"{self.topic}: no subscriptions (shale subscriptions {self.topic} --create NAME, or shale read "
                    f"{self.topic} --subscription NAME)")
        table = [("NAME", "POSITION", "LAG RECORDS", "LAG BYTES", "LAST COMMIT (UTC)", "STATE")]
        table += [(r.subscription.name, str(r.subscription.position), f"{r.lag.records:,}", f"{r.lag.bytes:,}",
                   _when(r.commit_ms) + (" (*)" if r.ahead else ""), "active" if r.active else "expired")
                  for r in self.rows]
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        lines = ["  ".join(c.rjust(w) if i in (2, 3) else c.ljust(w)
                           for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip() for row in table]
        lines.append(f"(a subscription that has not committed for {format_duration(self.expiry_ms)} expires: it "
                     "holds nothing back until it commits again)")
        lines += [f"(*) {r.subscription.name}: commit time {_when(r.subscription.committed_ms)} UTC in its document is "
                  f"more than {format_duration(CLOCK_SKEW_MS)} ahead of this clock: it counts as committed when the "
                  "document was last written" for r in self.rows if r.ahead]
        return "\n".join(lines)


def list_subscriptions(meta: Topic | TopicMetadata) -> SubscriptionList:
    """Every subscription of the topic, by name, with its lag and state."""
    t = opened(meta)
    return SubscriptionList(t.uri, expiry_of(t.policy), tuple(subscription_statuses(t)))


# ------------------------------------------------------------------ create, delete, reset

_TO_HELP = ("expected earliest, latest, a message id LEDGER:ENTRY:BATCH or a time (ISO 8601, e.g. "
            "2024-05-01T12:00:00Z)")


def _time_ms(text: str) -> int | None:
    """``text`` as a time (ISO 8601; UTC unless it names a zone), in ms; None if it is not one."""
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)


def _position_at(meta: TopicMetadata, topic: TopicState, ms: int) -> MessageId:
    """The id of the first record (in id order) published at ``ms`` or later; past the
    last record when there is none (Kafka's offsets for times)."""
    for lg in topic.ledgers:
        if lg.last_publish < ms:
            continue
        f = _ledger_file(meta, lg)
        late = np.flatnonzero(f.footer.col("e_publish") >= ms)
        if len(late):
            return f.record_id(int(f.footer.e_rec_start[int(late[0])]))
    return topic.next_id


def target_position(meta: TopicMetadata, text: str, topic: TopicState | None = None) -> MessageId:
    """Where ``--to`` puts a subscription: ``earliest`` (``0:0:0``: the compacted view's
    start, then every record left), ``latest`` (past the last record: the id the topic's
    next ledger starts at), a message id in its one text form (at most ``latest``: past
    it a subscription would never read again), or a time (the first record published
    then or later)."""
    if not text.strip():
        raise InvalidInputError(f"--to is empty: {_TO_HELP}")
    topic = meta.load_topic() if topic is None else topic
    latest = topic.next_id
    t = text.strip().lower()
    if t in ("earliest", "latest"):
        return MIN_ID if t == "earliest" else latest
    if re.fullmatch(r"[0-9]+:[0-9]+:[0-9]+", t, re.ASCII):
        try:
            position = MessageId.parse(text)
        except InvalidInputError as e:
            raise InvalidInputError(f"--to: {e}") from None
        if position > latest:
            raise InvalidInputError(f"--to {position}: past the end of {meta.uri} (latest is {latest}, where its next "
                                    "ledger starts): a subscription there would never read again")
        return position
    ms = _time_ms(text.strip())
    if ms is None:
        raise InvalidInputError(f"--to {shown(text)!r}: {_TO_HELP}")
    return _position_at(meta, topic, ms)


@dataclass(frozen=True, slots=True)
class SubscriptionChange:
    """What ``--create``, ``--delete`` or ``--reset`` did (or, ``dry_run``, would do)."""

    topic: str
    name: str
    action: str  # create, delete or reset
    before: MessageId | None = None
    after: MessageId | None = None
    lag_before: Lag | None = None
    lag_after: Lag | None = None
    dry_run: bool = False

    def to_json(self) -> dict[str, Any]:
        def lag(x: Lag | None) -> int | None:
            return None if x is None else x.records

        return {"topic": self.topic, "subscription": self.name, "action": self.action, "dry_run": self.dry_run,
                "before": str(self.before) if self.before else None, "after": str(self.after) if self.after else None,
                "lag_records_before": lag(self.lag_before), "lag_records_after": lag(self.lag_after)}

    def human(self) -> str:
        verb = {"create": "created", "delete": "deleted", "reset": "reset"}[self.action]
        verb = f"would {self.action}" if self.dry_run else verb
        text = f"{self.topic}: {verb} subscription {self.name!r}"
        if self.before is not None and self.lag_before is not None:
            text += f" {'at' if self.action == 'delete' else 'from'} {self.before} " \
                    f"({count(self.lag_before.records, 'record')} behind)"
        if self.after is not None and self.lag_after is not None:
            text += f" {'to' if self.action == 'reset' else 'at'} {self.after} " \
                    f"({count(self.lag_after.records, 'record')} behind)"
        return text


def change_subscription(handle: Topic | TopicMetadata, action: str, name: str, to: str | None = None, *,
                        dry_run: bool = False) -> SubscriptionChange:
    """``--create NAME [--to X]``, ``--delete NAME`` or ``--reset NAME --to X`` (the ledger
    list as the topic's handle holds it: a position past it is checked against the list
    read again)."""
    t = opened(handle)
    meta = t.meta
    subs = Subscriptions(meta)
    check_name(name)
    topic = t.state
    if action == "delete":
        if dry_run:
            old = subs.get(name)
            return SubscriptionChange(meta.uri, name, action, old.position, None, lag_of(meta, topic, old.position),
                                      dry_run=True)
        subs.delete(name)
        return SubscriptionChange(meta.uri, name, action)
    if action == "reset" and to is None:
        raise InvalidInputError("--reset needs --to earliest|latest|ID|TIME")
    # (an empty --to, say an unset shell variable, is a bad --to, not earliest)
    after = target_position(meta, "earliest" if to is None else to, topic)
    lag_after = lag_of(meta, topic, after)
    if action == "create":
        if dry_run:
            if subs.load(name) is not None:
                raise InvalidInputError(f"{meta.uri}: subscription {name!r} exists already")
        else:
            subs.create(name, after, topic=topic)
        return SubscriptionChange(meta.uri, name, action, None, after, None, lag_after, dry_run)
    old = subs.get(name) if dry_run else subs.reset(name, after, topic=topic)[0]
    return SubscriptionChange(meta.uri, name, action, old.position, after, lag_of(meta, topic, old.position),
                              lag_after, dry_run)
