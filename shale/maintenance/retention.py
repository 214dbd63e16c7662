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
from dataclasses import dataclass
from typing import Any

from shale.ledger.errors import InvalidInputError
from shale.ledger.ids import MessageId
from shale.metadata.handle import Topic, opened
from shale.metadata.state import CompactionState, LedgerInfo
from shale.metadata.subscriptions import Subscription, expiry_of
from shale.metadata.topic import TopicMetadata
from shale.metadata.view import TopicView, records_above, wholly_below
from shale.settings.units import count

__all__ = ["TruncationPlan", "UnreadRecordsError", "plan_truncation", "retention_cut", "truncate"]


class UnreadRecordsError(InvalidInputError):
    """A truncation would remove records an active subscription has yet to read."""


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

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "dry_run": self.dry_run, "before_ledger": self.before_ledger,
                "horizon": str(self.horizon) if self.horizon else None,
                "removed": [lg.id for lg in self.removed], "records_removed": sum(lg.records for lg in self.removed),
                "bytes_removed": sum(lg.bytes for lg in self.removed), "uncompacted": list(self.uncompacted),
                "records_lost": self.records_lost, "generation": self.generation, "ledgers": self.ledgers_left,
                "unread_by": list(self.unread_by),
                "snapshots_dropped": list(self.snapshots)}

    def human(self) -> str:
        if not self.removed:
            nothing = "nothing would go" if self.dry_run else "nothing removed"
            if self.rule:
                return f"{self.topic}: no ledger to remove by {self.rule}; {nothing}"
            return f"{self.topic}: no ledger below {self.before_ledger}; {nothing}"
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
        return text

    def by_rule(self, rule: str) -> TruncationPlan:
        """This plan, saying that ``rule`` chose what it removes."""
        return dataclasses.replace(self, rule=rule)


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


def _snapshot_floor(state: CompactionState, *, tagged_only: bool = False) -> tuple[bool, MessageId | None]:
    """Whether retained snapshots (with ``tagged_only``, the tagged ones) hold ledgers
    back, and the lowest of their horizons (records above it are read as of one of them)."""
    tagged = set(state.tags.values())
    horizons = [s.horizon for s in state.snapshots if not tagged_only or s.epoch in tagged]
    if not horizons:
        return False, None
    return True, None if any(h is None for h in horizons) else min(h for h in horizons if h is not None)


def retention_cut(topic: Topic | TopicMetadata, *, older_than_ms: int | None = None, keep_bytes: int | None = None,
                  allow_uncompacted: bool = False, allow_unread: bool = False, now_ms: int | None = None,
                  drop_snapshots: bool = False) -> int:
    """The ``before_ledger`` that removes the oldest ledgers a retention rule lets go
    (Kafka's ``retention.ms`` and ``retention.bytes``): those whose last record is older
    than ``older_than_ms``, or beyond the newest ``keep_bytes`` of ledgers.  It stops at
    the first ledger with records above the horizon unless ``allow_uncompacted``, and at
    the first one an active subscription has yet to read unless ``allow_unread``, and at the
    first with records above a retained snapshot's horizon — a tagged one's even with
    ``drop_snapshots``.  From the documents the topic's handle holds (read on first use):
    the cut is only ever as far as they allow, and the truncation checks them again."""
    if (older_than_ms is None) == (keep_bytes is None):
        raise InvalidInputError("give one retention rule: --older-than DURATION or --keep-bytes SIZE")
    t = opened(topic)
    meta, view = t.meta, t.view()
    now = meta.now_ms() if now_ms is None else now_ms
    left = view.topic.bytes
    ledgers = view.topic.ledgers
    cut = ledgers[0].id if ledgers else view.topic.last_ledger_id + 1
    unread_from = None if allow_unread or not ledgers else min((s.position for s in _active(t)), default=None)
    held, floor = _snapshot_floor(t.compaction, tagged_only=drop_snapshots)
    for lg in ledgers:
        expired = (now - lg.last_publish > older_than_ms) if older_than_ms is not None else left > (keep_bytes or 0)
        if not expired or (not allow_uncompacted and view.records_above_exact(meta, lg)) \
                or (unread_from is not None and not wholly_below(lg, unread_from)):
            break
        if held and records_above(meta, lg, floor):
            break
        left -= lg.bytes
        cut = lg.id + 1
    return cut


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
