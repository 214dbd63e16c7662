"""Retention by ledger: ``shale truncate``, which never removes what no compaction has seen
unless told to.

Removing a ledger whose records all lie at or below the compaction horizon loses
nothing a compacted reader sees: the compacted ledger keeps the latest record of every
key.  Removing one with records above the horizon loses those records for good; that
takes ``allow_uncompacted``, and the plan says how many records it costs.

Nor does retention remove a ledger an active subscription has yet to read
(:mod:`shale.metadata.subscriptions`): one with records at or after its position.  That
takes ``allow_unread``; the subscription then meets a gap (``shale read --on-gap``).

A retained snapshot (``snapshot-retention``) is read, and rolled back to, with the
ledgers above its own horizon: retention keeps them while it is retained.  Removing them
takes ``drop_snapshots``, which drops the snapshots that need them first — but never a
tagged one (:mod:`shale.maintenance.tags`): its tag is removed first.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from shale.ledger.errors import InvalidInputError
from shale.ledger.ids import MessageId
from shale.ledger.values import dataclass
from shale.metadata.handle import Topic, opened
from shale.metadata.state import CompactionState, LedgerInfo
from shale.metadata.subscriptions import Subscription, expiry_of
from shale.metadata.topic import TopicMetadata
from shale.metadata.view import TopicView, records_above, wholly_below
from shale.settings.units import count

__all__ = ["Holder", "RetentionCut", "TruncationPlan", "UnreadRecordsError", "plan_truncation", "policy_retention",
           "retention_cut", "retention_hold", "truncate"]


class UnreadRecordsError(InvalidInputError):
    """A truncation would remove records an active subscription has yet to read."""


@dataclass(frozen=True, slots=True)
class Holder:
    """What keeps a ledger a retention rule lets go: the compaction horizon (records above
    it no compaction has kept), an active subscription that has yet to read it, or a
    retained snapshot (``tag``: a tagged one) with records above its horizon in it."""

    kind: str  # "horizon", "subscription", "snapshot" or "tag"
    name: str = ""  # the subscription, the snapshot's epoch, the tag
    at: MessageId | None = None  # the horizon, or the subscription's position

    def human(self) -> str:
        if self.kind == "horizon":
            return (f"records above the compaction horizon {self.at} (compact first)" if self.at is not None
                    else "records no compaction has kept yet (compact first)")
        if self.kind == "subscription":
            return f"subscription {self.name!r} (at {self.at}: it has yet to read them)"
        if self.kind == "tag":
            return f"the tagged snapshot {self.name!r} (its records above the horizon {self.at})"
        return f"the retained snapshot of epoch {self.name} (its records above the horizon {self.at})"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name or None, "at": None if self.at is None else str(self.at)}


@dataclass(frozen=True, slots=True)
class RetentionCut:
    """Where a retention rule cuts (``before_ledger``: the ledgers below it go), and what
    keeps the ledgers the rule lets go beyond the cut: ``held`` of them, from ledger
    ``held_from`` on, by ``held_by`` (none: the rule itself stops there)."""

    before_ledger: int
    held: int = 0
    held_from: int | None = None
    held_by: tuple[Holder, ...] = ()

    def human(self) -> str:
        """Why the rule stops where it does, in words ("" when nothing holds it back)."""
        if not self.held_by:
            return ""
        return (f"{count(self.held, 'more ledger')} {'is' if self.held == 1 else 'are'} past the rule but kept, "
                f"from ledger {self.held_from} on: held back by " + ", ".join(h.human() for h in self.held_by))

    def to_json(self) -> dict[str, Any] | None:
        if not self.held_by:
            return None
        return {"ledgers": self.held, "from_ledger": self.held_from, "by": [h.to_json() for h in self.held_by]}


@dataclass(frozen=True, slots=True)
class TruncationPlan:
    """What removing the ledgers below ``before_ledger`` does."""

    topic: str
    before_ledger: int
    horizon: MessageId | None
    removed: tuple[LedgerInfo, ...]
    #: removed ledgers holding records above the horizon, and how many such records
    uncompacted: tuple[int, ...]
    records_lost: int
    dry_run: bool = False
    generation: int | None = None
    ledgers_left: int | None = None
    #: the retention rule that chose ``before_ledger``, as given (``--older-than 30d``), if one did
    rule: str = ""
    #: the active subscriptions that have yet to read some of the removed ledgers
    unread_by: tuple[str, ...] = ()
    #: epochs of retained snapshots with records above their horizons in removed ledgers
    snapshots: tuple[int, ...] = ()
    #: what keeps the ledgers the rule lets go beyond the cut (a rule's plan only)
    cut: RetentionCut | None = None

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "dry_run": self.dry_run, "before_ledger": self.before_ledger,
                "horizon": str(self.horizon) if self.horizon else None,
                "removed": [lg.id for lg in self.removed], "records_removed": sum(lg.records for lg in self.removed),
                "bytes_removed": sum(lg.bytes for lg in self.removed), "uncompacted": list(self.uncompacted),
                "records_lost": self.records_lost, "generation": self.generation, "ledgers": self.ledgers_left,
                "unread_by": list(self.unread_by),
                "snapshots_dropped": list(self.snapshots),
                "held_back": None if self.cut is None else self.cut.to_json()}

    def human(self) -> str:
        held = "" if self.cut is None or not self.cut.held_by else f"; {self.cut.human()}"
        if not self.removed:
            nothing = "nothing would go" if self.dry_run else "nothing removed"
            if self.rule:
                return f"{self.topic}: no ledger to remove by {self.rule}; {nothing}{held}"
            return f"{self.topic}: no ledger below {self.before_ledger}; {nothing}{held}"
        verb = "would remove" if self.dry_run else "removed"
        ids = f"{self.removed[0].id}" if len(self.removed) == 1 else f"{self.removed[0].id}-{self.removed[-1].id}"
        text = (f"{self.topic}: {verb} {count(len(self.removed), 'ledger')} ({ids}), "
                f"{count(sum(lg.records for lg in self.removed), 'record')}, "
                f"{count(sum(lg.bytes for lg in self.removed), 'byte')}")
        if self.records_lost:
            text += f"; {self.records_lost:,} of them above the horizon, never compacted"
        if self.unread_by:
            text += f"; unread by subscription{'s' if len(self.unread_by) > 1 else ''} {', '.join(self.unread_by)}"
        if self.snapshots:
            verb = "would drop" if self.dry_run else "dropped"
            text += f"; {verb} the retained snapshots of epoch {', '.join(map(str, self.snapshots))}"
        return text + held

    def by_rule(self, rule: str, cut: RetentionCut | None = None) -> TruncationPlan:
        """This plan, saying that ``rule`` chose what it removes (and, in ``cut``, what
        keeps the ledgers it lets go beyond)."""
        return dataclasses.replace(self, rule=rule, cut=cut)


def _active(topic: Topic | TopicMetadata, now_ms: int | None = None) -> list[Subscription]:
    """The topic's active subscriptions (by its ``subscription-expiry``, at ``now_ms``, by
    default this machine's clock, the one commits are stamped by), as its handle lists them."""
    t = opened(topic)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    expiry = expiry_of(t.policy)
    return [s for s in t.subscriptions if s.active(now, expiry)]


def _unread_by(removed: tuple[LedgerInfo, ...], active: list[Subscription]) -> tuple[str, ...]:
    """The subscriptions among ``active`` with records of ``removed`` still to read."""
    return tuple(s.name for s in active if any(not wholly_below(lg, s.position) for lg in removed))


def plan_truncation(meta: TopicMetadata, before_ledger: int) -> TruncationPlan:
    """What removing the ledgers with ids below ``before_ledger`` would remove and lose."""
    topic, state = meta.load_topic(), meta.load_compaction()
    last = topic.last_ledger_id
    if before_ledger < 1:
        raise InvalidInputError(f"--before-ledger {before_ledger}: ledger ids start at 1")
    if before_ledger > last + 1:
        raise InvalidInputError(f"{meta.uri}: --before-ledger {before_ledger} is past the last ledger ({last}); "
                                f"{last + 1} would remove every ledger")
    removed = tuple(lg for lg in topic.ledgers if lg.id < before_ledger)
    view = TopicView(topic, state)
    uncompacted, lost = [], 0
    for lg in removed:
        above = view.records_above_exact(meta, lg)
        if above:
            uncompacted.append(lg.id)
            lost += above
    held = tuple(s.epoch for s in state.snapshots if any(records_above(meta, lg, s.horizon) for lg in removed))
    return TruncationPlan(meta.uri, before_ledger, view.horizon, removed, tuple(uncompacted), lost,
                          unread_by=_unread_by(removed, _active(meta)) if removed else (), snapshots=held)


def retention_cut(topic: Topic | TopicMetadata, *, older_than_ms: int | None = None, keep_bytes: int | None = None,
                  allow_uncompacted: bool = False, allow_unread: bool = False, now_ms: int | None = None,
                  drop_snapshots: bool = False) -> int:
    """The ``before_ledger`` of :func:`retention_hold` (which says what holds ledgers back)."""
    return retention_hold(topic, older_than_ms=older_than_ms, keep_bytes=keep_bytes,
                          allow_uncompacted=allow_uncompacted, allow_unread=allow_unread, now_ms=now_ms,
                          drop_snapshots=drop_snapshots).before_ledger


def retention_hold(topic: Topic | TopicMetadata, *, older_than_ms: int | None = None, keep_bytes: int | None = None,
                   allow_uncompacted: bool = False, allow_unread: bool = False, now_ms: int | None = None,
                   drop_snapshots: bool = False) -> RetentionCut:
    """Where a retention rule cuts the topic: the oldest ledgers it lets go (Kafka's
    ``retention.ms`` and ``retention.bytes``): those whose last record is older than
    ``older_than_ms``, or beyond the newest ``keep_bytes`` of ledgers.  It stops at the
    first ledger with records above the horizon unless ``allow_uncompacted``, at the first
    one an active subscription has yet to read unless ``allow_unread``, and at the first
    with records above a retained snapshot's horizon — a tagged one's even with
    ``drop_snapshots``; the cut says which of them held it back, and how many ledgers the
    rule would let go past it.  From the documents the topic's handle holds (read on first
    use): the cut is only ever as far as they allow, and the truncation checks them again."""
    if (older_than_ms is None) == (keep_bytes is None):
        raise InvalidInputError("give one retention rule: --older-than DURATION or --keep-bytes SIZE")
    t = opened(topic)
    meta, view = t.meta, t.view()
    now = meta.now_ms() if now_ms is None else now_ms
    ledgers = view.topic.ledgers
    left = view.topic.bytes
    cut = ledgers[0].id if ledgers else view.topic.last_ledger_id + 1
    active = [] if allow_unread or not ledgers else _active(t)
    for i, lg in enumerate(ledgers):
        if not _expired(lg, now, older_than_ms, keep_bytes, left):
            break
        holders = _holders(meta, view, lg, t.compaction, active, allow_uncompacted=allow_uncompacted,
                           drop_snapshots=drop_snapshots)
        if holders:
            held = 0
            for later in ledgers[i:]:
                if not _expired(later, now, older_than_ms, keep_bytes, left):
                    break
                held, left = held + 1, left - later.bytes
            return RetentionCut(cut, held, lg.id, holders)
        left -= lg.bytes
        cut = lg.id + 1
    return RetentionCut(cut)


def _expired(lg: LedgerInfo, now_ms: int, older_than_ms: int | None, keep_bytes: int | None, left: int) -> bool:
    """Whether the rule lets ``lg`` go, ``left`` bytes of ledgers being left with it."""
    return now_ms - lg.last_publish > older_than_ms if older_than_ms is not None else left > (keep_bytes or 0)


def _holders(meta: TopicMetadata, view: TopicView, lg: LedgerInfo, state: CompactionState,
             active: list[Subscription], *,
             allow_uncompacted: bool, drop_snapshots: bool) -> tuple[Holder, ...]:
    """What keeps ``lg``: the horizon, the active subscriptions that have yet to read it,
    the retained snapshots (with ``drop_snapshots``, the tagged ones) with records above
    their horizons in it."""
    out = []
    if not allow_uncompacted and view.records_above_exact(meta, lg):
        out.append(Holder("horizon", at=view.horizon))
    out += [Holder("subscription", s.name, s.position) for s in active if not wholly_below(lg, s.position)]
    tags = {epoch: name for name, epoch in sorted(state.tags.items(), reverse=True)}
    for snap in state.snapshots:
        tag = tags.get(snap.epoch)
        if (tag is not None or not drop_snapshots) and records_above(meta, lg, snap.horizon):
            out.append(Holder("tag", tag, snap.horizon) if tag is not None
                       else Holder("snapshot", str(snap.epoch), snap.horizon))
    return tuple(out)


def truncate(meta: TopicMetadata, before_ledger: int, *, allow_uncompacted: bool = False, allow_unread: bool = False,
             dry_run: bool = False, drop_snapshots: bool = False) -> TruncationPlan:
    """Remove the ledgers below ``before_ledger``; refuse, unless ``allow_uncompacted``,
    when that removes records above the compaction horizon, unless ``allow_unread``,
    records an active subscription has yet to read, and unless ``drop_snapshots`` (which
    then drops them first; never a tagged one) records above a retained snapshot's.  With
    ``dry_run`` only plan.

    The horizon only moves up, so a plan that found every removed record compacted stays
    true until the removal lands: a rollback lowers it only to a retained snapshot's
    horizon, which the plan held to as well, unless the plan drops that snapshot — and the
    drop is refused once a rollback has lowered the horizon."""
    plan = plan_truncation(meta, before_ledger)
    if plan.records_lost and not allow_uncompacted:
        h = f"the horizon {plan.horizon}" if plan.horizon else "no compaction yet"
        raise InvalidInputError(
            f"{meta.uri}: removing the ledgers below {before_ledger} would lose "
            f"{count(plan.records_lost, 'record')} no compaction has kept "
            f"(ledger{'s' if len(plan.uncompacted) > 1 else ''} {', '.join(map(str, plan.uncompacted))}; {h}): "
            "compact first, or pass --allow-uncompacted")
    if plan.unread_by and not allow_unread:
        raise UnreadRecordsError(
            f"{meta.uri}: removing the ledgers below {before_ledger} would remove records subscription"
            f"{'s' if len(plan.unread_by) > 1 else ''} {', '.join(map(repr, plan.unread_by))} "
            f"{'have' if len(plan.unread_by) > 1 else 'has'} yet to read (shale subscriptions {meta.uri}): let "
            "them catch up, delete or reset them, or pass --allow-unread")
    if plan.snapshots:
        from shale.maintenance.snapshots import refuse_tagged

        refuse_tagged(meta.uri, meta.load_compaction(), plan.snapshots, f"removing the ledgers below {before_ledger}")
    if plan.snapshots and not drop_snapshots:
        raise InvalidInputError(
            f"{meta.uri}: removing the ledgers below {before_ledger} would remove records above the horizon of the "
            f"retained snapshot{'s' if len(plan.snapshots) > 1 else ''} of epoch {', '.join(map(str, plan.snapshots))}"
            ", which reads as of them and rollbacks to them need: pass --drop-snapshots to drop them, or wait until "
            "newer compactions replace them (snapshot-retention)")
    if dry_run:
        return dataclasses.replace(plan, dry_run=True)
    if plan.snapshots:
        from shale.maintenance.snapshots import drop_snapshots as drop

        drop(meta, plan.snapshots, horizon=plan.horizon)
    state, removed = meta.truncate(before_ledger)
    done = plan_of_removed(plan, tuple(removed))
    return dataclasses.replace(done, generation=state.generation, ledgers_left=len(state.ledgers),
                               unread_by=plan.unread_by, snapshots=plan.snapshots)


def plan_of_removed(plan: TruncationPlan, removed: tuple[LedgerInfo, ...]) -> TruncationPlan:
    """``plan`` restricted to what the truncation actually removed (another truncation may
    have removed some of them first)."""
    ids = {lg.id for lg in removed}
    uncompacted = tuple(i for i in plan.uncompacted if i in ids)
    lost = plan.records_lost if uncompacted == plan.uncompacted else sum(
        lg.records for lg in removed if lg.id in uncompacted)
    return TruncationPlan(plan.topic, plan.before_ledger, plan.horizon, removed, uncompacted, lost)


def policy_retention(topic: Topic | TopicMetadata, *, dry_run: bool = False,
                     now_ms: int | None = None) -> TruncationPlan:
    """The topic's own retention (its policy's ``retention`` and ``retention-bytes``, as
    ``compact`` applies them after every run): the oldest ledgers either rule lets go,
    never one with records above the horizon, one an active subscription has yet to read,
    or one a retained snapshot needs — those stay, and the plan says what holds them
    (:attr:`TruncationPlan.cut`).  A subscription created meanwhile makes it remove
    nothing (the next run's cut leaves its ledgers).  :class:`InvalidInputError` when the
    policy sets no retention.  From the documents the topic's handle holds; forgotten once
    ledgers were removed."""
    t = opened(topic)
    meta, policy = t.meta, t.policy
    rules = [(name, kind, value) for name, kind, value in (
        ("retention", "older_than_ms", policy.get("retention_ms")),
        ("retention-bytes", "keep_bytes", policy.get("retention_bytes"))) if value is not None]
    if not rules:
        raise InvalidInputError(f"{meta.uri}: its policy sets no retention (shale config {meta.uri} --set "
                                "retention=7d, or retention-bytes=10GiB)")
    from shale.settings import POLICY_SETTINGS

    cuts = [retention_hold(t, now_ms=now_ms, **{kind: value}) for _, kind, value in rules]
    before = max(c.before_ledger for c in cuts)
    held = next((c for c in cuts if c.held_by and c.before_ledger == before), RetentionCut(before))
    shown = ", ".join(f"{name}={POLICY_SETTINGS[name].kind.show(value)}" for name, _, value in rules)
    try:
        done = truncate(meta, before, dry_run=dry_run)
        if done.removed and not dry_run:
            t.forget()  # (truncated: what the handle held is gone)
    except UnreadRecordsError:  # a subscription created or reset since the cut: it keeps its ledgers
        done = plan_of_removed(plan_truncation(meta, before), ())
    return done.by_rule(f"the policy's {shown}", held)
