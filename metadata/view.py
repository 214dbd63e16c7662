"""What a read of a topic covers, derived in one place: the view.

A **plain** read covers the original ledgers from a position.  A **compacted** read covers
the compacted parts up to the published horizon, each less its deletion vector, then the
original ledgers from the horizon's successor (the horizon is inclusive): no gap, no
duplicate.  Retention removes the oldest ledgers, always a prefix (ids up to the topic's
``removed_through``); records a read had yet to reach that are gone are named as a
:class:`Removed` range, with how far the compacted view still holds them.

:class:`TopicView` derives all of it from the two metadata documents alone, as
:class:`Segment` values: which object, which of its records (indexes, from the record
counts the metadata gives) and which ids each covers.  A segment's exact record indexes
come from the object's footer once it is open (:meth:`Segment.span`).  Every reader of
the topic goes through it: :class:`~shale.reader.TopicReader` (iteration and Arrow
batches), the splits engines read in parallel (:mod:`shale.reader.splits`), point lookups
(:mod:`shale.reader.lookup`), the table (:mod:`shale.reader.latest`), ``shale verify``
and the compaction planner.

It also says, in one place, which order every reader of "the latest value" decides by
(:func:`reading_order`), and what lies above the horizon (what a run has yet to compact),
by two rules named as such: *estimated* from the metadata alone, the horizon's own ledger
counted as compacted whole (what ``compact --all`` orders topics by, ``shale topics``
shows and the Pushgateway's dirty ratio after a run reports), and *exact*, the footer of
the ledger the horizon lies in read where the metadata cannot tell (``shale status``, a
run's backlog, retention).  The Spark stream, status, the backlog and retention all ask
the view.

It lives in ``metadata``, below both the readers and the compactor (which never import
each other), because both build on it and it needs nothing but the metadata documents
and, to resolve record indexes, the ledger format.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from shale.ledger.deletions import read_deletions
from shale.ledger.format import KIND_COMPACTED, KIND_ORIGINAL
from shale.ledger.ids import MIN_ID, MessageId
from shale.ledger.ordering import TopicOrder
from shale.ledger.reader import LedgerFile
from shale.ledger.values import dataclass
from shale.metadata.state import CompactedPart, CompactionState, LedgerInfo, TopicState

if TYPE_CHECKING:
    from shale.metadata.asof import AsOf
    from shale.metadata.topic import TopicMetadata

__all__ = ["Removed", "Segment", "TopicView", "dirty_ratio", "log_start", "reading_order", "records_above",
           "wholly_below"]


def wholly_below(lg: LedgerInfo, position: MessageId) -> bool:
    """Whether every record of ``lg`` lies below ``position``."""
    return lg.id < position.ledger or (lg.id == position.ledger and position.entry >= lg.entries)


def log_start(topic: TopicState) -> MessageId:
    """The smallest id a record of ``topic`` may still have: past every removed ledger."""
    return MessageId(topic.removed_through + 1, 0, 0) if topic.removed_through else MIN_ID


def dirty_ratio(dirty_bytes: float, compacted_live_bytes: float) -> float:
    """Kafka's dirty ratio: bytes above the horizon over all live bytes (those plus the
    live bytes of the compacted ledger); 0 when nothing is above the horizon."""
    total = dirty_bytes + compacted_live_bytes
    return dirty_bytes / total if dirty_bytes and total else 0.0


def records_above(meta: TopicMetadata, lg: LedgerInfo, horizon: MessageId | None) -> int:
    """How many records of ``lg`` have ids above ``horizon`` (None: every one), exactly:
    the metadata answers for every ledger but the one the horizon lies in, whose footer
    says where it falls (one read)."""
    if horizon is None or lg.id > horizon.ledger:
        return lg.records
    if wholly_below(lg, horizon.successor()):
        return 0
    f = LedgerFile.open(meta.topic.store, meta.topic.key(lg.object), ledger_id=lg.id)
    return f.n_records - f.find(horizon.successor())


def _entry_bytes(f: LedgerFile, lo: int, hi: int) -> int:
    """Stored bytes of the entries holding ``f``'s records ``[lo, hi)`` (its footer aside)."""
    if hi <= lo:
        return 0
    foot = f.footer
    e0, e1 = int(foot.entry_of(lo)), int(foot.entry_of(hi - 1))
    offs, lens = foot.col("e_offset"), foot.col("e_length")
    return int(offs[e1]) + int(lens[e1]) - int(offs[e0])


def reading_order(meta: TopicMetadata, state: CompactionState | None) -> TopicOrder:
    """The order and key TTL by which the readers of "the latest value" (the table, point
    lookups, :class:`~shale.reader.TableView`, the Spark source's table) decide it: those
    the published compacted view (``state``) was compacted with, since its parts hold the
    winners by them; before the first compaction, those the topic's policy sets (read
    then, and only then); else the default, offset order with no key TTL."""
    if state is not None and state.epoch > 0:
        return state.order
    return meta.load_policy().order


@dataclass(frozen=True, slots=True)
class Segment:
    """Records ``[first, stop)`` (indexes, from the metadata's record count) of one object
    of the view, those with ids in ``[start, end)`` (``end`` None: no bound), less the
    records its deletion vector (``deletions``) removes.

    ``part`` is the compacted part, ``ledger`` the original ledger, as the metadata
    describes it."""

    object: str  # relative to the topic's folder
    ledger_id: int
    kind: int  # KIND_ORIGINAL or KIND_COMPACTED
    first: int
    stop: int
    start: MessageId
    end: MessageId | None = None
    deletions: str | None = None
    part: CompactedPart | None = None
    ledger: LedgerInfo | None = None

    @property
    def compacted(self) -> bool:
        """Whether this is a compacted part (else an original ledger)."""
        return self.kind == KIND_COMPACTED

    @property
    def records(self) -> int:
        """How many records the segment spans at most."""
        return self.stop - self.first

    @property
    def starts_inside(self) -> bool:
        """Whether its ids begin past the first record of its ledger: where its records
        begin is then known only from the footer."""
        return not self.compacted and self.start > MessageId(self.ledger_id, 0, 0)

    def span(self, f: LedgerFile) -> tuple[int, int]:
        """The record indexes ``[lo, hi)`` of ``f`` (this segment's object, opened) that it
        covers: its records with ids in its bounds."""
        lo = max(self.first, f.find(self.start))
        hi = min(self.stop, f.n_records)
        if self.end is not None:
            hi = min(hi, f.find(self.end))
        return lo, max(lo, hi)

    def open(self, meta: TopicMetadata) -> LedgerFile:
        """The segment's object, opened (its footer read and checked against its id and kind)."""
        return LedgerFile.open(meta.topic.store, meta.topic.key(self.object), ledger_id=self.ledger_id,
                               kind=self.kind, dictionaries=meta.dictionaries)

    def arrow_cache(self, meta: TopicMetadata) -> str | None:
        """The key of the part's Arrow cache (:mod:`shale.ledger.arrow_cache`), if it has one."""
        return meta.topic.key(self.part.arrow_cache) if self.part is not None and self.part.arrow_cache else None

    def deleted(self, meta: TopicMetadata, records: int) -> npt.NDArray[np.bool_] | None:
        """Per record of the object (``records`` of them), whether its deletion vector
        removed it; None when it has none."""
        if not self.deletions:
            return None
        return read_deletions(meta.topic.store, meta.topic.key(self.deletions), records)

    def live(self, meta: TopicMetadata, f: LedgerFile) -> npt.NDArray[np.int64]:
        """The record indexes of ``f`` (this segment's object, opened) a read of the segment
        gives: its :meth:`span`, less what its deletion vector removed."""
        lo, hi = self.span(f)
        records = np.arange(lo, hi, dtype=np.int64)
        gone = self.deleted(meta, f.n_records)
        return records if gone is None else records[~gone[records]]


@dataclass(frozen=True, slots=True)
class Removed:
    """Records from id ``first`` through the end of ledger ``through`` that retention
    removed before a read reached them.  The compacted view holds the latest record of
    every key among those below ``covered``; ``horizon`` is its horizon (None: none)."""

    first: MessageId
    through: int
    covered: MessageId
    horizon: MessageId | None = None

    @property
    def resume(self) -> MessageId:
        """The first id past the range: where the records left go on."""
        return MessageId(self.through + 1, 0, 0)

    @property
    def uncovered(self) -> bool:
        """Whether part of the range is held by no compacted view."""
        return self.covered < self.resume


@dataclass(frozen=True, slots=True)
class TopicView:
    """The view of one topic as two metadata documents describe it: the original ledgers
    of ``topic`` and, for a compacted view, what ``compaction`` published (None: the plain
    view, original ledgers only)."""

    topic: TopicState
    compaction: CompactionState | None = None
    #: only ids below this one (None: no bound): a read as of a point stops there
    end: MessageId | None = None
    #: what a key TTL counts from (None: the present): the point's time, as of a point
    now_ms: int | None = None

    @classmethod
    def load(cls, meta: TopicMetadata, *, compacted: bool = True, as_of: AsOf | None = None,
             from_snapshot: int | str | None = None) -> TopicView:
        """The view as it is now: the ledger list, then (compacted) the compaction state,
        read after it so that it covers at least what the list lacks.  ``as_of`` (an
        epoch, a time, a message id or a tag): the topic as it was at that point, nothing
        written later (:mod:`shale.metadata.asof`); ``from_snapshot`` (an epoch): that
        retained snapshot's compacted view, then every ledger above its horizon as the
        topic holds them now (:func:`~shale.metadata.snapshots.view_as_of`)."""
        topic = meta.load_topic()
        if as_of is not None:
            from shale.metadata.asof import resolve_point

            point = resolve_point(meta, topic, meta.load_compaction(), as_of)
            return cls(topic, point.base, point.end, point.now_ms)
        if from_snapshot is not None:
            return cls(topic, meta.load_compaction_as_of(from_snapshot))
        return cls(topic, meta.load_compaction() if compacted else None)

    def bound(self, end: MessageId | None) -> MessageId | None:
        """The lower of ``end`` and the view's own bound (None: neither bounds it)."""
        if end is None or self.end is None:
            return self.end if end is None else end
        return min(end, self.end)

    def order(self, meta: TopicMetadata) -> TopicOrder:
        """:func:`reading_order` of this view (``meta``: its topic's, for the policy)."""
        return reading_order(meta, self.compaction)

    @property
    def horizon(self) -> MessageId | None:
        """The last id the compacted parts answer for (None: a plain view, or never compacted)."""
        return None if self.compaction is None else self.compaction.horizon

    def holds(self, position: MessageId) -> bool:
        """Whether a read from ``position`` starts in the compacted parts."""
        h = self.horizon
        return h is not None and position <= h

    def tail_start(self, start: MessageId) -> MessageId:
        """Where the original ledgers take over from a read of the view begun at ``start``."""
        h = self.horizon
        return start if h is None else max(start, h.successor())

    # ---------------------------------------------------------------- segments

    def segments(self, start: MessageId | None = None, end: MessageId | None = None, *,
                 max_records: int | None = None) -> Iterator[Segment | Removed]:
        """What a read of the view covers, in id order: the compacted parts holding ids from
        ``start`` (for a compacted view), then the original ledgers from where they take
        over, each ledger whole or in slices of at most ``max_records`` records; only ids
        below ``end``, when given.

        ``start`` None reads from the oldest record left (every part, whole; what retention
        removed before is no gap).  From an id, the records from there that retention
        removed (:meth:`removed_from`) come before the ledgers as a :class:`Removed` range:
        in a compacted view, only those the view does not hold (:meth:`uncovered`).  The
        view's own :attr:`end` bounds it too."""
        end = self.bound(end)
        yield from self.parts(start, end)
        tail = self.tail_start(MIN_ID if start is None else start)
        if start is not None:
            gone = self.removed_from(tail)
            if gone is not None and self.compaction is not None:
                gone = self.uncovered(gone)
            if gone is not None and (end is None or gone.first < end):
                yield gone
        yield from self.ledgers(tail, end, max_records=max_records)

    def parts(self, start: MessageId | None = None, stop: MessageId | None = None) -> Iterator[Segment]:
        """The compacted parts holding ids from ``start`` up to the horizon, before ``stop``.
        ``start`` None: every published part, whole (those without records too)."""
        state = self.compaction
        stop = self.bound(stop)
        if state is None or (start is not None and not self.holds(start)):
            return
        for part in state.parts:
            if start is not None and (part.last_id is None or part.last_id < start):
                continue
            if stop is not None and part.first_id is not None and part.first_id >= stop:
                break
            yield Segment(part.object, state.part_ledger_id(part), KIND_COMPACTED, 0, part.records,
                          MIN_ID if start is None else start, stop, part.deletions, part=part)

    def ledgers(self, start: MessageId = MIN_ID, end: MessageId | None = None, *, max_records: int | None = None,
                among: Iterable[LedgerInfo] | None = None) -> Iterator[Segment]:
        """The original ledgers with ids from ``start`` and below ``end``, whole or in slices
        of at most ``max_records`` records each (record indexes from the metadata: a slice
        wholly before ``start`` covers nothing).  ``among``: these ledgers (removed ones a
        reader had listed) rather than the topic's."""
        end = self.bound(end)
        step = None if max_records is None else max(1, max_records)
        for lg in self.topic.ledgers if among is None else among:
            if wholly_below(lg, start):
                continue
            if end is not None and lg.first_id >= end:
                break
            for first in range(0, max(lg.records, 1), step or max(lg.records, 1)):
                stop = lg.records if step is None else min(lg.records, first + step)
                yield Segment(lg.object, lg.id, KIND_ORIGINAL, first, stop, start, end, ledger=lg)

    def skip(self, position: MessageId) -> MessageId:
        """``position`` moved past the sealed ledgers wholly below it: a ledger read to its
        end leaves a read at the first id of the next one."""
        for lg in self.topic.ledgers:
            if not wholly_below(lg, position):
                break
            position = max(position, MessageId(lg.id + 1, 0, 0))
        return position

    # ---------------------------------------------------------------- retention

    def removed_from(self, first: MessageId) -> Removed | None:
        """Records from ``first`` on that retention removed (None: none were)."""
        through = self.topic.removed_through
        last = self.topic.removed_last
        if through < 1 or first.ledger > through or (last is not None and first > last):
            return None
        return Removed(first, through, min(self.covered(), MessageId(through + 1, 0, 0)), self.horizon)

    def covered(self, listed: Iterable[LedgerInfo] = ()) -> MessageId:
        """The first id past what the compacted view holds: past its horizon, or past the
        horizon's ledger when retention removed that ledger and nothing in it lay above the
        horizon: the topic's ``removed_last`` says so of the last ledger removed; else a
        removed ledger a reader had ``listed`` does, and without either, truncation is
        taken to have removed only ledgers wholly at or below the horizon (as it does unless
        told otherwise)."""
        h = self.horizon
        if h is None:
            return MIN_ID
        if h.ledger > self.topic.removed_through:
            return h.successor()
        last = self.topic.removed_last
        if last is not None and h.ledger == last.ledger:
            return h.successor() if h < last else MessageId(h.ledger + 1, 0, 0)
        known = next((lg for lg in listed if lg.id == h.ledger), None)
        if known is not None and h.entry + 1 < known.entries:
            return h.successor()
        return MessageId(h.ledger + 1, 0, 0)

    def uncovered(self, gone: Removed) -> Removed | None:
        """What of ``gone`` a read of the compacted view cannot give (None: nothing; it
        holds the latest record of every key of the rest)."""
        first = max(gone.first, gone.covered)
        return None if first >= gone.resume else Removed(first, gone.through, gone.covered, gone.horizon)

    # ------------------------------------------------------------- above the horizon

    def ledgers_wholly_above(self) -> tuple[LedgerInfo, ...]:
        """The ledgers whose every record lies above the horizon (every ledger, with none):
        from the metadata alone."""
        h = self.horizon
        return tuple(lg for lg in self.topic.ledgers if h is None or lg.id > h.ledger)

    @property
    def compacted_records(self) -> int:
        """The records a read of the compacted parts gives (their live records)."""
        return 0 if self.compaction is None else sum(p.live for p in self.compaction.parts)

    def dirt_estimated(self) -> tuple[int, float]:
        """Bytes above the horizon and the dirty ratio, estimated from the metadata alone:
        the ledgers wholly above it, whole, over those plus each compacted part's bytes in
        proportion to its live records (the horizon's own ledger counted as compacted)."""
        dirty = sum(lg.bytes for lg in self.ledgers_wholly_above())
        parts = self.compaction.parts if self.compaction is not None else ()
        compacted = sum(p.bytes * (p.live / p.records) for p in parts if p.records)
        return dirty, dirty_ratio(dirty, compacted)

    def dirt_exact(self, meta: TopicMetadata) -> tuple[int, float]:
        """Bytes above the horizon and the dirty ratio, exactly: the entry bytes of the
        records above it over those plus the compacted parts' entry bytes in proportion to
        their live records (footers excluded on both sides), which is what a run planned now
        without a minimum lag finds.  Reads the footer of every part and of every ledger from
        the horizon's own on."""
        dirty = 0
        for seg in self.ledgers(self.tail_start(MIN_ID)):
            f = seg.open(meta)
            dirty += _entry_bytes(f, seg.span(f)[0], f.n_records)
        live = 0
        for seg in self.parts():
            f, part = seg.open(meta), seg.part
            share = part.live / part.records if part is not None and part.records else 1
            live += int(_entry_bytes(f, 0, f.n_records) * share)
        return dirty, dirty_ratio(dirty, live)

    def records_above_exact(self, meta: TopicMetadata, lg: LedgerInfo) -> int:
        """How many records of ``lg`` lie above the horizon (:func:`records_above`)."""
        return records_above(meta, lg, self.horizon)

    def oldest_above_estimated(self) -> int | None:
        """The first publish time among the ledgers wholly above the horizon (None: none
        is), from the metadata alone."""
        return min((lg.first_publish for lg in self.ledgers_wholly_above()), default=None)

    def oldest_above_exact(self, meta: TopicMetadata) -> int | None:
        """The publish time of the oldest record above the horizon (None: none is): the
        ledgers wholly above it say theirs, and the footer of the one it lies in says when
        the entries after it were published (one read)."""
        times = [lg.first_publish for lg in self.ledgers_wholly_above()]
        h = self.horizon
        at = self.topic.ledger(h.ledger) if h is not None else None
        if at is not None and h is not None and not wholly_below(at, h.successor()):
            f = LedgerFile.open(meta.topic.store, meta.topic.key(at.object), ledger_id=at.id, kind=KIND_ORIGINAL,
                                dictionaries=meta.dictionaries)
            first = f.find(h.successor())
            if first < f.n_records:
                times.append(int(f.footer.col("e_publish")[int(f.footer.entry_of(first)):].min()))
        return min(times, default=None)

