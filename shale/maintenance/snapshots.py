"""Snapshots and rollback: earlier compacted views kept readable, and published again.

Every publish (a compaction's, a rollback's) replaces the published view.  :func:`succeed`
decides what the replaced view and the snapshots before it become under the topic's
``snapshot-retention`` (a count: the newest N views stay readable, the published one
included; 1 keeps none, as before snapshots existed) and ``snapshot-retention-age`` (a
view replaced less than this long ago stays too): kept as snapshots, or dropped.  What no
view the new state keeps names any more (parts, deletion vectors) is retired as before, and
deleted by garbage collection once the grace period has passed; nothing a retained view
names is ever retired.

:func:`rollback` publishes a retained snapshot's view again, as a new epoch, with the same
compare-and-swap and epoch fencing as a compaction: a compaction planned from the epoch
the rollback replaced loses its publish (exit 3), and a rollback that finds another epoch
published first loses too.  The next compaction builds on the view rolled back to: its
parts and, above its horizon, the original ledgers (retention keeps them while a
retained snapshot needs them).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Final

from shale.ledger.errors import (
    ConflictError,
    InvalidInputError,
    SnapshotNotFoundError,
    StateUnknownError,
    TransientStorageError,
)
from shale.ledger.ids import MIN_ID, MessageId
from shale.ledger.ordering import TopicOrder
from shale.ledger.values import dataclass
from shale.metadata.handle import Topic, opened
from shale.metadata.requirements import AssertEpoch, AssertTopicGeneration, RequirementFailedError
from shale.metadata.snapshots import retained_text
from shale.metadata.state import CompactedPart, CompactionState, RetiredSet, Snapshot, TopicState
from shale.metadata.topic import COMPACTION_DOC, TopicMetadata
from shale.metadata.view import TopicView
from shale.runtime import interrupts

__all__ = ["RollbackResult", "drop_snapshots", "kept_snapshots", "refuse_tagged", "rollback", "succeed"]

#: Swaps a rollback tries when the state changed in ways that leave it valid (garbage
#: collection trimming the retired list, a truncation's stamp).
_ATTEMPTS: Final = 10


def kept_snapshots(prev: CompactionState, *, keep: int, keep_age_ms: int, now_ms: int) -> tuple[Snapshot, ...]:
    """The snapshots a state replacing ``prev`` at ``now_ms`` (the store's clock) retains:
    of ``prev``'s view and its snapshots, the newest ``keep - 1``, every one replaced
    less than ``keep_age_ms`` ago and every one a tag names, oldest first."""
    if keep < 1 or keep_age_ms < 0:
        raise InvalidInputError("snapshot retention keeps at least the published view (1), for no negative age")
    candidates = [*prev.snapshots, *((prev.as_snapshot(now_ms),) if prev.epoch else ())]
    newest = {s.epoch for s in candidates[max(0, len(candidates) - (keep - 1)):]} if keep > 1 else set()
    newest |= set(prev.tags.values())
    return tuple(s for s in candidates if s.epoch in newest or now_ms - s.replaced_ms < keep_age_ms)


def _in_order(views: list[tuple[CompactedPart, ...]], names: set[str]) -> tuple[str, ...]:
    """``names`` in the order ``views`` name them: parts first, then deletion vectors,
    then Arrow caches."""
    order = [p.object for parts in views for p in parts]
    order += [p.deletions for parts in views for p in parts if p.deletions]
    order += [p.arrow_cache for parts in views for p in parts if p.arrow_cache]
    return tuple(o for o in dict.fromkeys(order) if o in names)


def succeed(prev: CompactionState, new: CompactionState, *, retired_ms: int, keep: int = 1,
            keep_age_ms: int = 0) -> CompactionState:
    """``new`` as the state that replaces ``prev``: with the snapshots it keeps
    (:func:`kept_snapshots`, judged at ``retired_ms``, the store's clock), ``prev``'s tags
    and ``prev``'s retired sets, to which what no view it keeps names any more is added,
    stamped ``retired_ms`` (readers of the replaced views have the grace period from then)."""
    snapshots = kept_snapshots(prev, keep=keep, keep_age_ms=keep_age_ms, now_ms=retired_ms)
    new = replace(new, snapshots=snapshots, retired=prev.retired, tags=dict(prev.tags))
    gone = prev.retained_objects() - new.retained_objects()
    if not gone:
        return new
    named = _in_order([*(s.parts for s in prev.snapshots), prev.parts], gone)
    return replace(new, retired=(*prev.retired, RetiredSet(named, retired_ms, prev.epoch)))


def drop_snapshots(meta: TopicMetadata, epochs: tuple[int, ...], *, now_ms: int | None = None,
                   horizon: MessageId | None = None) -> CompactionState:
    """Drop the retained snapshots of ``epochs`` (one compare-and-swap, read again on a
    conflict), retiring what no view left names (stamped ``now_ms``, the store's clock).
    ``horizon``: the published horizon the caller planned with; a view published since
    below it (a rollback) is refused, since the plan no longer holds; so is a snapshot a
    tag names (tagged since the plan, maybe): a tag is removed first, on purpose."""
    stamp = meta.now_ms() if now_ms is None else now_ms

    def dropped(state: CompactionState) -> CompactionState | None:
        if horizon is not None and (state.horizon is None or state.horizon < horizon):
            raise InvalidInputError(f"{meta.uri}: the compacted view was rolled back to horizon {state.horizon} "
                                    f"while the truncation was planned against {horizon}; nothing was removed: "
                                    "plan it again")
        refuse_tagged(meta.uri, state, epochs, f"dropping the snapshots of epoch {', '.join(map(str, epochs))}")
        kept = tuple(s for s in state.snapshots if s.epoch not in epochs)
        if len(kept) == len(state.snapshots):
            return None
        new = replace(state, snapshots=kept)
        gone = state.retained_objects() - new.retained_objects()
        if not gone:
            return new
        named = _in_order([s.parts for s in state.snapshots if s.epoch in epochs], gone)
        return replace(new, retired=(*state.retired, RetiredSet(named, stamp, state.epoch)))

    return meta.update_compaction(dropped, what="dropping snapshots")


def refuse_tagged(uri: str, state: CompactionState, epochs: tuple[int, ...], doing: str) -> None:
    """:class:`~shale.ledger.errors.InvalidInputError` when a tag of ``state`` names one
    of ``epochs``, which ``doing`` would drop: a tagged view goes only once its tag does."""
    tagged = {name: e for name, e in sorted(state.tags.items()) if e in epochs}
    if tagged:
        names = ", ".join(f"{n} (epoch {e})" for n, e in tagged.items())
        many = len(tagged) > 1
        raise InvalidInputError(f"{uri}: {doing} would drop the tagged view{'s' if many else ''} {names}: a tagged "
                                f"view is never dropped; remove {'each' if many else 'its'} tag first (shale "
                                f"snapshots {uri} --untag NAME); nothing was removed")


# ------------------------------------------------------------------------ rollback


@dataclass(frozen=True, slots=True)
class RollbackResult:
    """What a rollback published (or, dry, would publish)."""

    topic: str
    from_epoch: int
    to_epoch: int
    #: the epoch published (the view of ``to_epoch`` again)
    epoch: int
    horizon: MessageId | None
    order: TopicOrder
    snapshots: tuple[int, ...]
    retired: int
    dry_run: bool = False
    #: a warning for the operator ("" when none): the view's order differs from the policy's
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "dry_run": self.dry_run, "from_epoch": self.from_epoch,
                "to_epoch": self.to_epoch, "epoch": self.epoch, "horizon": str(self.horizon) if self.horizon else None,
                **self.order.to_json(), "snapshots": list(self.snapshots), "retired": self.retired,
                "note": self.note or None}

    def human(self) -> str:
        verb = "would publish" if self.dry_run else "published"
        kept = ", ".join(map(str, self.snapshots)) or "none"
        text = (f"{self.topic}: {verb} the view of epoch {self.to_epoch} as epoch {self.epoch} (horizon "
                f"{self.horizon or 'none'}, replacing epoch {self.from_epoch}); snapshots retained: {kept}")
        if self.retired:
            text += f"; {self.retired} object{'s' if self.retired != 1 else ''} retired for gc"
        if self.dry_run:
            text += f" (shale read {self.topic} --from-snapshot {self.to_epoch} shows what it would read)"
        return text


def _removed_above(topic: TopicState, target: CompactionState) -> str:
    """Why the view of ``target`` cannot be published again ("" when it can): retention
    removed ledgers holding records above its horizon, which its readers need."""
    start = MIN_ID if target.horizon is None else target.horizon.successor()
    gone = TopicView(topic, target).removed_from(start)
    if gone is None:
        return ""
    return (f"retention removed ledgers up to {gone.through}, holding records above its horizon {target.horizon}: "
            "its readers would miss them")


def _rolled_back(current: CompactionState, target: CompactionState, now_ms: int) -> CompactionState:
    """The view of ``target`` as the epoch after ``current``'s (its parts keep the ids of
    the epochs that wrote them)."""
    parts = tuple(p if p.ledger_id is not None else replace(p, ledger_id=target.epoch) for p in target.parts)
    last_run = {**target.last_run, "rollback": {"from_epoch": current.epoch, "to_epoch": target.epoch}}
    return CompactionState(epoch=current.epoch + 1, horizon=target.horizon, compacted_ledger=target.compacted_ledger,
                           parts=parts, keys=target.keys, tombstones=target.tombstones, compacted_ms=now_ms,
                           last_run=last_run, topic_generation=current.topic_generation, order=target.order)


def _note(t: Topic, order: TopicOrder) -> str:
    """A warning when the view rolled back to is in another order or key TTL than the
    topic's policy sets: the next compaction would refuse it, or age it otherwise."""
    meta, policy = t.meta, t.policy.order
    if policy.order != order.order:
        return (f"{meta.uri}: note: the view is now in {order.order} order and the topic's policy says "
                f"{policy.order}: compactions in {policy.order} order are refused until one rewrites it "
                f"(shale compact {meta.uri} --rewrite); set the policy back with shale config {meta.uri} "
                f"--set order={order.order}")
    if policy.key_ttl_ms != order.key_ttl_ms:
        return (f"{meta.uri}: note: the view was decided with a key TTL of {order.key_ttl_ms} ms and the topic's "
                f"policy says {policy.key_ttl_ms} ms: the next compaction applies the policy's")
    return ""


def rollback(topic: Topic | TopicMetadata, to_epoch: int, *, keep: int | None = None, keep_age_ms: int | None = None,
             dry_run: bool = False, clock: Callable[[], float] | None = None,
             store_now_ms: int | None = None, planned: CompactionState | None = None) -> RollbackResult:
    """Publish the view of the retained epoch ``to_epoch`` again, as the epoch after the
    published one (which becomes a snapshot under ``keep`` and ``keep_age_ms``, as a
    compaction's would; when not given, ``snapshot-retention`` and
    ``snapshot-retention-age`` by the one precedence rule: the run's flag, the topic's
    policy, the variable, the default, as the topic's handle holds them).  Refused
    (:class:`~shale.ledger.errors.SnapshotNotFoundError`,
    :class:`~shale.ledger.errors.InvalidInputError`) for an epoch not retained, the
    published one, or one whose records above its horizon retention removed; a
    :class:`~shale.ledger.errors.ConflictError` when another epoch is published first.
    ``clock`` (seconds) stamps when the view was published; ``store_now_ms`` (the store's
    clock, read when not given) when the replaced one was replaced.  ``planned``: the
    state the caller chose ``to_epoch`` in (read when not given); a publish since then
    makes the rollback lose, as one since it read the state itself would."""
    t = opened(topic)
    meta = t.meta
    where = meta.docs.url(COMPACTION_DOC)
    planned = t.compaction if planned is None else planned
    from_epoch = planned.epoch
    if to_epoch == from_epoch and from_epoch:
        raise InvalidInputError(f"{meta.uri}: epoch {to_epoch} is the published view already; nothing to roll back")
    if planned.at_epoch(to_epoch) is None or to_epoch < 1:
        raise SnapshotNotFoundError(f"{where}: epoch {to_epoch} is not retained (retained: {retained_text(planned)}; "
                                    "the snapshot-retention policy says how many are kept)")
    now_ms = int((clock or time.time)() * 1000)
    retired_ms = meta.now_ms() if store_now_ms is None else store_now_ms
    keep = t.value("snapshot-retention") if keep is None else keep
    keep_age_ms = t.value("snapshot-retention-age") if keep_age_ms is None else keep_age_ms
    current = planned
    for _ in range(_ATTEMPTS):
        new = _attempt(meta, current, from_epoch, to_epoch, now_ms, retired_ms, keep, keep_age_ms)
        result = RollbackResult(meta.uri, from_epoch, to_epoch, new.epoch, new.horizon, new.order,
                                tuple(s.epoch for s in new.snapshots),
                                sum(len(r.objects) for r in new.retired) - sum(len(r.objects) for r in current.retired),
                                dry_run, _note(t, new.order))
        if dry_run or _swapped(meta, new, current, from_epoch):
            return result
        current = meta.load_compaction()
    raise ConflictError(f"{meta.uri}: the compaction state kept changing; the rollback gave up after {_ATTEMPTS} "
                        "attempts (nothing was rolled back)")


def _attempt(meta: TopicMetadata, current: CompactionState, from_epoch: int, to_epoch: int, now_ms: int,
             retired_ms: int, keep: int, keep_age_ms: int) -> CompactionState:
    """The state a rollback from ``current`` publishes (checked against the topic as it is)."""
    where = meta.docs.url(COMPACTION_DOC)
    if current.epoch != from_epoch:
        raise RequirementFailedError(f"{where}: another compactor published epoch {current.epoch} first (the "
                                     f"rollback planned from epoch {from_epoch}); nothing was rolled back",
                                     AssertEpoch(from_epoch))
    target = current.at_epoch(to_epoch)
    if target is None:  # dropped meanwhile (a truncation that dropped snapshots)
        raise SnapshotNotFoundError(f"{where}: epoch {to_epoch} is not retained any more (retained: "
                                    f"{retained_text(current)})")
    why = _removed_above(meta.load_topic(), target)
    if why:
        raise InvalidInputError(f"{meta.uri}: cannot roll back to epoch {to_epoch}: {why}")
    return succeed(current, _rolled_back(current, target, now_ms), retired_ms=retired_ms, keep=keep,
                   keep_age_ms=keep_age_ms)


def _swapped(meta: TopicMetadata, new: CompactionState, current: CompactionState, from_epoch: int) -> bool:
    """One compare-and-swap from ``current`` to ``new``, fenced by the epoch the rollback
    planned from and the topic generation it checked: True when it landed, False when
    the state changed in a way that leaves the rollback valid (try again)."""
    requirements = (AssertEpoch(from_epoch), AssertTopicGeneration(current.topic_generation))
    try:
        with interrupts.deferring():  # an interrupt lets the swap finish: its outcome is then known
            meta.publish_compaction(new, current, requirements)
    except RequirementFailedError as e:
        raise RequirementFailedError(f"{e}; nothing was rolled back", e.requirement) from None
    except ConflictError:
        return False
    except (StateUnknownError, TransientStorageError):
        found = meta.load_compaction()
        if found.epoch != new.epoch or found.parts != new.parts or found.compacted_ms != new.compacted_ms:
            raise
    return True
