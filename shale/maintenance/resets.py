"""Creating, deleting and resetting a topic's durable subscriptions, as
``kafka-consumer-groups`` does for consumer groups.

A reset is planned before anything is written: for each subscription, where it stands and
where it would go, its lag before and after, and the reader holding it.  The plan is what
a dry run prints (``shale subscriptions --reset`` without ``--execute``); executing it
moves each subscription with one compare-and-swap of its document.  It refuses them all,
before moving any, while a reader holds one of them
(:meth:`~shale.metadata.subscriptions.Subscriptions.check_free`), unless forced.

Where a reset puts a subscription (:class:`Target`): ``--to`` ``earliest`` (``0:0:0``:
the compacted view's start, then every record left), ``latest`` (past the last record),
``current`` (where it stands), a message id within the topic
(:func:`~shale.metadata.positions.check_id`) or a time (the first record published then
or later: :func:`~shale.metadata.positions.position_at`); ``--shift-by N`` records from
where it stands (:func:`~shale.metadata.positions.shift`); ``--by-duration D``, the first
record published within ``D`` of now.  ``--from-file`` gives each subscription its own
``--to``.
"""

from __future__ import annotations

import csv
import io
import re
import time
from typing import Any, Final

from shale.ledger.errors import InUseError, InvalidInputError
from shale.ledger.ids import MIN_ID, MessageId
from shale.ledger.values import dataclass
from shale.maintenance.subscriptions import Lag, ago, lag_of
from shale.metadata.handle import Topic, opened
from shale.metadata.positions import TIME_HELP, check_id, parse_time, position_at, shift
from shale.metadata.state import TopicState
from shale.metadata.subscriptions import Member, Subscription, Subscriptions, check_name
from shale.metadata.topic import TopicMetadata
from shale.metadata.view import log_start
from shale.settings.kinds import shown
from shale.settings.units import count, parse_duration

__all__ = ["ResetPlan", "ResetRow", "SubscriptionChange", "Target", "change_subscription", "gap_note", "plan_file",
           "removed_through", "reset_subscriptions", "target_position"]

_TO_HELP: Final = f"expected earliest, latest, current, a message id LEDGER:ENTRY:BATCH or {TIME_HELP}"
_ID: Final = re.compile(r"[0-9]+:[0-9]+:[0-9]+", re.ASCII)


@dataclass(frozen=True, slots=True)
class Target:
    """Where a reset puts a subscription: one of ``--to``, ``--shift-by``, ``--by-duration``."""

    to: str | None = None
    shift_by: int | None = None
    by_duration: str | None = None

    def __post_init__(self) -> None:
        given = [f for f, v in (("--to", self.to), ("--shift-by", self.shift_by),
                                ("--by-duration", self.by_duration)) if v is not None]
        if len(given) > 1:
            raise InvalidInputError(f"give one of {', '.join(given)}: each says where the subscription goes")

    @property
    def given(self) -> bool:
        return (self.to, self.shift_by, self.by_duration) != (None, None, None)


def target_position(meta: TopicMetadata, target: Target | str, topic: TopicState | None = None, *,
                    current: MessageId | None = None, now_ms: int | None = None) -> MessageId:
    """Where ``target`` puts a subscription standing at ``current`` (None: a new one),
    judged at ``now_ms`` (the clock by default); :class:`InvalidInputError` naming the flag
    for a target that is not one, or an id outside the topic."""
    if isinstance(target, str):
        target = Target(to=target)
    topic = meta.load_topic() if topic is None else topic
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if target.shift_by is not None:
        if current is None:
            raise InvalidInputError("--shift-by moves an existing subscription: give --to for a new one")
        return shift(meta, topic, current, target.shift_by)
    if target.by_duration is not None:
        text = target.by_duration.strip()
        try:
            back = parse_duration(text[1:] if text.startswith("-") else text)
        except InvalidInputError as e:
            raise InvalidInputError(f"--by-duration {shown(text)!r}: {e}") from None
        return position_at(meta, topic, max(0, now - back))
    return _to(meta, topic, "earliest" if target.to is None else target.to, current, now)


def _to(meta: TopicMetadata, topic: TopicState, text: str, current: MessageId | None, now: int) -> MessageId:
    t = text.strip().lower()
    if not t:  # (an empty --to, say an unset shell variable, is a bad --to, not earliest)
        raise InvalidInputError(f"--to is empty: {_TO_HELP}")
    if t in ("earliest", "latest"):
        return MIN_ID if t == "earliest" else topic.next_id
    if t == "current":
        if current is None:
            raise InvalidInputError("--to current keeps an existing subscription where it stands: a new one has none")
        return current
    if _ID.fullmatch(t):
        try:  # (the text as given: an id has one spelling, without spaces)
            position = MessageId.parse(text)
        except InvalidInputError as e:
            raise InvalidInputError(f"--to: {e}") from None
        return check_id(meta, topic, position, "--to")
    try:
        ms = parse_time(text, now)
    except InvalidInputError as e:
        raise InvalidInputError(f"--to: {e}") from None
    if ms is None:
        raise InvalidInputError(f"--to {shown(text.strip())!r}: {_TO_HELP}")
    return position_at(meta, topic, ms)


def plan_file(text: str, where: str) -> list[tuple[str, Target]]:
    """The subscriptions a ``--from-file`` CSV names, each with its ``--to``: one
    ``NAME,POSITION`` a line (a first line ``name,position`` is a header; blank lines and
    lines starting with ``#`` are skipped).  A bad line or a name given twice is
    :class:`InvalidInputError` naming ``where`` and the line."""
    rows: list[tuple[str, Target]] = []
    seen: set[str] = set()
    for n, fields in enumerate(csv.reader(io.StringIO(text)), 1):
        if not fields or not "".join(fields).strip() or fields[0].lstrip().startswith("#"):
            continue
        if len(fields) != 2:
            raise InvalidInputError(f"{where}, line {n}: expected NAME,POSITION, found {len(fields)} field"
                                    f"{'' if len(fields) == 1 else 's'}")
        name, position = (f.strip() for f in fields)
        if not rows and not seen and (name.lower(), position.lower()) == ("name", "position"):
            continue
        try:
            check_name(name)
        except InvalidInputError as e:
            raise InvalidInputError(f"{where}, line {n}: {e}") from None
        if name in seen:
            raise InvalidInputError(f"{where}, line {n}: subscription {name!r} is named twice")
        seen.add(name)
        rows.append((name, Target(to=position)))
    if not rows:
        raise InvalidInputError(f"{where}: names no subscription (lines NAME,POSITION)")
    return rows


@dataclass(frozen=True, slots=True)
class ResetRow:
    """One subscription of a reset: where it stands and where it goes, its lag before and
    after, and the reader holding it (None: none) with how long ago it last said so."""

    name: str
    before: MessageId
    after: MessageId
    lag_before: Lag
    lag_after: Lag
    holder: Member | None = None
    holder_age_ms: int = 0
    #: the topic's ``removed_through`` when ``after`` lies where retention removed the records, else 0
    removed_through: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"subscription": self.name, "before": str(self.before), "after": str(self.after),
                "after_removed": bool(self.removed_through),
                "lag_records_before": self.lag_before.records, "lag_records_after": self.lag_after.records,
                "lag_bytes_before": self.lag_before.bytes, "lag_bytes_after": self.lag_after.bytes,
                "held_by": None if self.holder is None else {"id": self.holder.id,
                                                             "heartbeat_age_ms": self.holder_age_ms}}

    def gap_note(self) -> str:
        """What a subscription put where retention removed the records meets, in words ("" if nothing)."""
        return gap_note(self.name, self.after, self.removed_through)

    def held(self) -> str:
        m = self.holder
        return "-" if m is None else f"{m.id} (heartbeat {ago(self.holder_age_ms)} ago)"


@dataclass(frozen=True, slots=True)
class ResetPlan:
    """What a reset does (``executed``) or would do: one row per subscription.  ``single``:
    one subscription was named (``--reset NAME``), and its JSON is that row's."""

    topic: str
    rows: tuple[ResetRow, ...]
    executed: bool = False
    forced: bool = False
    single: bool = False

    def to_json(self) -> dict[str, Any]:
        head = {"topic": self.topic, "action": "reset", "dry_run": not self.executed}
        if self.single:
            return {**head, **self.rows[0].to_json()}
        return {**head, "subscriptions": [r.to_json() for r in self.rows]}

    def human(self) -> str:
        if self.single:
            lines = [self._one(self.rows[0])]
        else:
            verb = "reset" if self.executed else "would reset"
            lines = [f"{self.topic}: {verb} {count(len(self.rows), 'subscription')}"]
            table = [("SUBSCRIPTION", "POSITION", "NEW POSITION", "LAG", "NEW LAG", "HELD BY")]
            table += [(r.name, str(r.before), str(r.after), f"{r.lag_before.records:,}", f"{r.lag_after.records:,}",
                       r.held()) for r in self.rows]
            widths = [max(len(row[i]) for row in table) for i in range(6)]
            lines += ["  ".join(c.rjust(w) if i in (3, 4) else c.ljust(w)
                                for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip() for row in table]
        lines += [r.gap_note() for r in self.rows if r.removed_through]
        if not self.executed:
            held = [r.name for r in self.rows if r.holder is not None]
            lines.append("(a dry run: nothing changed; add --execute to reset"
                         + (f", and --force while a reader holds {', '.join(map(repr, held))})" if held else ")"))
        elif self.forced and any(r.holder is not None for r in self.rows):
            lines.append("(forced: the readers holding them fail at their next commit)")
        return "\n".join(lines)

    def _one(self, r: ResetRow) -> str:
        verb = "reset" if self.executed else "would reset"
        text = (f"{self.topic}: {verb} subscription {r.name!r} from {r.before} "
                f"({count(r.lag_before.records, 'record')} behind) to {r.after} "
                f"({count(r.lag_after.records, 'record')} behind)")
        return text if r.holder is None else f"{text}; held by reader {r.held()}"


def reset_subscriptions(handle: Topic | TopicMetadata, targets: list[tuple[str, Target]] | Target, *,
                        execute: bool = False, force: bool = False, single: bool = False,
                        now_ms: int | None = None) -> ResetPlan:
    """Plan the reset of each named subscription to its target (a :class:`Target` alone:
    every subscription of the topic, to it), and with ``execute`` carry it out; see the
    module.  :class:`~shale.metadata.subscriptions.SubscriptionNotFoundError` for a name
    the topic lacks, :class:`InUseError` (nothing moved) while a reader holds one, unless
    ``force``."""
    t = opened(handle)
    meta = t.meta
    subs = Subscriptions(meta)
    topic = t.state
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if isinstance(targets, Target):
        found = list(t.subscriptions)
        if not found:
            raise InvalidInputError(f"{meta.uri}: no subscriptions to reset")
        current = {s.name: s for s in found}
        targets = [(s.name, targets) for s in found]
    else:
        current = {name: subs.get(check_name(name)) for name, _ in targets}
    # (a position found past the end is not checked: a reset is how it is mended)
    rows = tuple(_row(meta, topic, current[name], t, now) for name, t in targets)
    plan = ResetPlan(meta.uri, rows, single=single)
    if not execute:
        return plan
    held = [r for r in rows if r.holder is not None]
    if held and not force:
        names = "; ".join(f"{r.name!r} by {r.held()}" for r in held)
        raise InUseError(f"{meta.uri}: cannot reset while readers hold {'it' if len(rows) == 1 else 'them'} "
                         f"({names}; a reader counts as gone three heartbeat intervals after its last): stop "
                         "them first, or --force (they then fail at their next commit); nothing was reset")
    for r in rows:
        subs.reset(r.name, r.after, topic=topic, force=force)
    return ResetPlan(meta.uri, rows, True, force, single)


def _row(meta: TopicMetadata, topic: TopicState, sub: Subscription, target: Target, now: int) -> ResetRow:
    after = target_position(meta, target, topic, current=sub.position, now_ms=now)
    m = sub.holder(now)
    return ResetRow(sub.name, sub.position, after, lag_of(meta, topic, sub.position), lag_of(meta, topic, after), m,
                    0 if m is None else m.age_ms(now, sub.written_ms), removed_through(topic, after))


def removed_through(topic: TopicState, position: MessageId) -> int:
    """The topic's ``removed_through`` if retention removed the records at ``position``
    (``earliest``, ``0:0:0``, is the oldest record left, never removed), else 0."""
    return topic.removed_through if MIN_ID < position < log_start(topic) else 0


def gap_note(name: str, position: MessageId, removed: int) -> str:
    """The line saying what a subscription put at ``position``, where retention removed
    the records (every ledger through ``removed``), meets: a plain read fails there as a
    gap (exit 6) unless told otherwise (:mod:`shale.reader.gaps`)."""
    return (f"(note: retention removed the records at {position}, every ledger through {removed}: a plain read of "
            f"{name!r} meets that gap (exit 6; shale read --on-gap), a compacted one reads them from the compacted "
            "view; --to earliest is the oldest record left)")


@dataclass(frozen=True, slots=True)
class SubscriptionChange:
    """What ``--create`` or ``--delete`` did (or, ``dry_run``, would do)."""

    topic: str
    name: str
    action: str  # create or delete
    before: MessageId | None = None
    after: MessageId | None = None
    lag_before: Lag | None = None
    lag_after: Lag | None = None
    dry_run: bool = False
    #: as :attr:`ResetRow.removed_through`
    removed_through: int = 0

    def to_json(self) -> dict[str, Any]:
        def lag(x: Lag | None) -> int | None:
            return None if x is None else x.records

        return {"topic": self.topic, "subscription": self.name, "action": self.action, "dry_run": self.dry_run,
                "after_removed": bool(self.removed_through),
                "before": str(self.before) if self.before else None, "after": str(self.after) if self.after else None,
                "lag_records_before": lag(self.lag_before), "lag_records_after": lag(self.lag_after)}

    def human(self) -> str:
        verb = f"would {self.action}" if self.dry_run else {"create": "created", "delete": "deleted"}[self.action]
        text = f"{self.topic}: {verb} subscription {self.name!r}"
        if self.before is not None and self.lag_before is not None:
            text += f" at {self.before} ({count(self.lag_before.records, 'record')} behind)"
        if self.after is not None and self.lag_after is not None:
            text += f" at {self.after} ({count(self.lag_after.records, 'record')} behind)"
            if self.removed_through:
                text += "\n" + gap_note(self.name, self.after, self.removed_through)
        return text


def change_subscription(handle: Topic | TopicMetadata, action: str, name: str, to: str | None = None, *,
                        dry_run: bool = False, force: bool = False) -> SubscriptionChange:
    """``--create NAME [--to X]`` or ``--delete NAME`` (refused while a reader holds it,
    unless ``force``), the ledger list as the topic's handle holds it."""
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
        subs.delete(name, force=force)
        return SubscriptionChange(meta.uri, name, action)
    after = target_position(meta, Target(to=to), topic)
    lag_after = lag_of(meta, topic, after)
    if dry_run:
        if subs.load(name) is not None:
            raise InvalidInputError(f"{meta.uri}: subscription {name!r} exists already")
    else:
        subs.create(name, after, topic=topic)
    return SubscriptionChange(meta.uri, name, action, None, after, None, lag_after, dry_run,
                              removed_through(topic, after))
