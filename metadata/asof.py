"""Reads as of a point: the topic as it was at an epoch, a time or a message id.

A read *as of* a point shows the topic as it was then, with nothing written later, the
rule Iceberg's and Delta's time travel follow:

* an **epoch** (a retained snapshot, or the published view): that compacted view through
  its horizon, and nothing above it — what a compacted read gave of the records it had
  compacted, right after it was published;
* a **time** (:class:`~datetime.datetime`): every record published at or before it.  A
  record counts as published at its own publish time, and the read stops at the first
  record, in id order, published later: a ledger registered after an entry published
  later than the point was not there at the point either.  It is read from the newest
  retained view published at or before the time, then from the original ledgers above
  that view's horizon up to that first later record;
* a **message id** (:class:`~shale.ledger.ids.MessageId`): every record up to and
  including it, read from the newest retained view whose horizon is at or below it.

A point the kept history cannot answer is refused
(:class:`~shale.ledger.errors.SnapshotNotFoundError`) naming the earliest point that can
be read, never answered with later data: an epoch that is not retained, or a time or id
below every retained view's once retention has removed ledgers (before the first
truncation every record is still there, and any point can be read from them alone).

"Now", for a key TTL, is the point's time: the epoch's publish time, the time itself; for
an id, the present.  "The latest value" is decided in the base view's order and TTL.

:func:`resolve_point` turns a point into a :class:`Point` — the view a read starts from
and the first id past the point — which :class:`~shale.metadata.view.TopicView` and
every reader take.  A snapshot's view *with* everything since (what a rollback to it
would publish) is :func:`~shale.metadata.snapshots.view_as_of`, not this module.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

import numpy as np

from shale.ledger.errors import InvalidInputError, SnapshotNotFoundError
from shale.ledger.ids import MIN_ID, MessageId
from shale.ledger.values import dataclass
from shale.metadata.schema import TAG_NAME
from shale.metadata.snapshots import epoch_of_tag
from shale.metadata.state import CompactionState, LedgerInfo, TopicState
from shale.settings.kinds import shown
from shale.settings.units import format_time

if TYPE_CHECKING:
    from shale.metadata.topic import TopicMetadata

__all__ = ["MAX_EPOCH", "AsOf", "Point", "describe_point", "parse_point", "point_ms", "resolve_point", "time_text"]

#: A point: an epoch, a time, a message id, or a tag (a name given to a retained epoch).
AsOf = int | datetime.datetime | MessageId | str

#: Epochs, like ledger ids, lie below 2^62 (the documents' bound).
MAX_EPOCH: Final = (1 << 62) - 1
#: Times a point may name: years 0001 to 9999, what ``datetime`` holds.
_MIN_MS: Final = -62135596800000
_MAX_MS: Final = 253402300799999
_TAG: Final = re.compile(TAG_NAME)
_EXAMPLE: Final = ("an epoch (a whole number from 1), a time (ISO 8601, e.g. 2024-05-01T12:00:00Z, UTC without a "
                   "zone, or milliseconds since 1970 written 1714564800000ms) or a message id LEDGER:ENTRY:BATCH")


@dataclass(frozen=True, slots=True)
class Point:
    """What a read as of a point covers: ``base``'s compacted view (an empty state: none)
    up to its horizon, then the original ledgers above it, only ids below ``end``.
    ``now_ms`` is what a key TTL counts from (None: the present); ``label`` names the
    point in messages."""

    base: CompactionState
    end: MessageId
    now_ms: int | None
    label: str


def parse_point(text: str) -> AsOf:
    """``EPOCH``, ``TIME`` (ISO 8601, or ``MILLISms``), ``LEDGER:ENTRY:BATCH`` or a tag,
    as a person types it (``--as-of``, the Spark option ``asOf``)."""
    t = text.strip()
    if not t:
        raise InvalidInputError(f"an empty point: expected {_EXAMPLE}")
    if t.isascii() and t.isdigit():
        n = int(t) if len(t) <= 20 else MAX_EPOCH + 1
        if not 1 <= n <= MAX_EPOCH:
            raise InvalidInputError(f"epoch {shown(t)} is out of range: epochs run from 1 to {MAX_EPOCH}")
        if t != str(n):
            raise InvalidInputError(f"{t!r} is not an epoch: write it without leading zeros ({n})")
        return n
    if t.endswith("ms") and t[:-2].lstrip("-").isdigit() and t[:-2].isascii():
        return _from_ms(t)
    if t.count(":") == 2 and t.replace(":", "").isascii() and t.replace(":", "").isdigit():
        return MessageId.parse(t)
    try:
        when = datetime.datetime.fromisoformat(t)
    except ValueError:
        return _tag(t)
    return when if when.tzinfo is not None else when.replace(tzinfo=datetime.UTC)


def _from_ms(text: str) -> datetime.datetime:
    digits = text[:-2]
    ms = int(digits) if len(digits.lstrip("-")) <= 16 else _MAX_MS + 1
    if not _MIN_MS <= ms <= _MAX_MS:
        raise InvalidInputError(f"{shown(text)!r}: milliseconds since 1970 from {_MIN_MS} to {_MAX_MS} "
                                "(years 0001 to 9999)")
    return datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(milliseconds=ms)


def _tag(text: str) -> str:
    """A tag's name (:data:`~shale.metadata.schema.TAG_NAME`), or the error saying what a
    point is."""
    if not _TAG.fullmatch(text):
        raise InvalidInputError(f"{shown(text)!r} is not {_EXAMPLE}, nor a tag (a name starting with a letter)")
    return text


def point_ms(when: datetime.datetime) -> int:
    """``when`` in milliseconds since 1970 (UTC when it has no zone)."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    delta = when - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    return delta // datetime.timedelta(milliseconds=1)


def time_text(ms: int) -> str:
    """Milliseconds since 1970 as ``YYYY-MM-DDTHH:MM:SS(.fff)Z``, the milliseconds when
    there are some (a point between two publishes may lie within one second)."""
    text = format_time(ms, style="iso")
    return f"{text[:-1]}.{ms % 1000:03d}Z" if ms % 1000 and text[:1].isdigit() else text


def describe_point(as_of: AsOf) -> str:
    """``as_of`` in words: ``epoch 4``, ``2024-05-01T12:00:00Z``, ``id 3:0:1`` or ``tag 'x'``."""
    if isinstance(as_of, bool):
        return repr(as_of)
    if isinstance(as_of, int):
        return f"epoch {as_of}"
    if isinstance(as_of, datetime.datetime):
        return time_text(point_ms(as_of))
    if isinstance(as_of, MessageId):
        return f"id {as_of}"
    return f"tag {as_of!r}"


def _checked(as_of: object) -> AsOf:
    if isinstance(as_of, bool) or not isinstance(as_of, (int, datetime.datetime, MessageId, str)):
        raise InvalidInputError(f"as of {shown(repr(as_of))}: expected {_EXAMPLE}")
    if isinstance(as_of, int) and not 1 <= as_of <= MAX_EPOCH:
        raise InvalidInputError(f"epoch {as_of} is out of range: epochs run from 1 to {MAX_EPOCH}")
    if isinstance(as_of, str):
        return parse_point(as_of)
    return as_of


# ------------------------------------------------------------------------ resolving


def _views(state: CompactionState) -> Iterator[CompactionState]:
    """Every retained view (the published one and each snapshot), newest epoch first."""
    for epoch in reversed(state.retained_epochs):
        view = state.at_epoch(epoch)
        if view is not None:
            yield view


def _retained_text(state: CompactionState) -> str:
    views = list(_views(state))[::-1]
    if not views:
        return "none: the topic was never compacted"
    return ", ".join(f"epoch {v.epoch} (published {time_text(v.compacted_ms)}, horizon {v.horizon or 'none'})"
                     for v in views)


def resolve_point(meta: TopicMetadata, topic: TopicState, state: CompactionState, as_of: AsOf) -> Point:
    """What a read as of ``as_of`` covers, in a topic whose ledger list is ``topic`` and
    whose compaction state is ``state`` (read after it); a
    :class:`~shale.ledger.errors.SnapshotNotFoundError` when the kept history cannot
    answer it, naming the earliest point that can be read."""
    from shale.metadata.topic import COMPACTION_DOC

    where = meta.docs.url(COMPACTION_DOC)
    as_of = _checked(as_of)
    if isinstance(as_of, str):
        as_of = epoch_of_tag(state, as_of, where)
    if isinstance(as_of, int):
        view = state.at_epoch(as_of)
        if view is None or as_of < 1:
            raise SnapshotNotFoundError(f"{where}: epoch {as_of} is not retained (retained: {_retained_text(state)}; "
                                        "the snapshot-retention policy says how many are kept)")
        end = MIN_ID if view.horizon is None else view.horizon.successor()
        return Point(view, end, view.compacted_ms, f"epoch {as_of}")
    if isinstance(as_of, MessageId):
        end = as_of.successor()
        return _from_base(topic, state, end, None, f"id {as_of}", lambda v: v.horizon is None or v.horizon < end,
                          where)
    ms = point_ms(as_of)
    end = _cut(meta, topic, ms)
    label = time_text(ms)
    return _from_base(topic, state, end, ms, label if label[:1].isdigit() else f"a time {label}",
                      lambda v: v.compacted_ms <= ms and (v.horizon is None or v.horizon < end), where)


def _from_base(topic: TopicState, state: CompactionState, end: MessageId, now_ms: int | None, label: str,
               fits: Callable[[CompactionState], bool], where: str) -> Point:
    """The point read from the newest retained view ``fits`` accepts whose ledgers above
    its horizon, up to ``end``, are all still there (or from the original ledgers alone)."""
    from shale.metadata.view import TopicView

    for base in (*(v for v in _views(state) if fits(v)), CompactionState()):
        view = TopicView(topic, base)
        tail = view.tail_start(MIN_ID)
        if tail >= end or view.removed_from(tail) is None:
            return Point(base, end, now_ms, label)
    raise SnapshotNotFoundError(f"{where}: {label} is older than the history kept: {_earliest(topic, state, now_ms)}")


def _earliest(topic: TopicState, state: CompactionState, ms: int | None) -> str:
    views = list(_views(state))
    if not views:
        return (f"retention removed ledgers up to {topic.removed_through} and no compacted view is retained, so "
                "no earlier state can be read")
    oldest = min(views, key=lambda v: (v.compacted_ms, v.epoch) if ms is not None else (v.horizon or MIN_ID, v.epoch))
    if ms is not None:
        return f"the earliest time that can be read is {time_text(oldest.compacted_ms)} (epoch {oldest.epoch}'s view)"
    return f"the earliest id that can be read is {oldest.horizon or MIN_ID} (epoch {oldest.epoch}'s horizon)"


def _cut(meta: TopicMetadata, topic: TopicState, ms: int) -> MessageId:
    """The first id of ``topic``, in id order, of a record published after ``ms``: where a
    read as of that time stops (past the last ledger when there is none)."""
    for lg in topic.ledgers:
        if lg.last_publish > ms:
            return MessageId(lg.id, 0, 0) if lg.first_publish > ms else _cut_inside(meta, lg, ms)
    return MessageId(topic.last_ledger_id + 1, 0, 0)


def _cut_inside(meta: TopicMetadata, lg: LedgerInfo, ms: int) -> MessageId:
    """The first record of ``lg`` published after ``ms``: its footer gives each entry's
    latest publish time, and the first entry that is later says which of its records is."""
    from shale.ledger.reader import LedgerFile

    f = LedgerFile.open(meta.topic.store, meta.topic.key(lg.object), ledger_id=lg.id, dictionaries=meta.dictionaries)
    later = np.flatnonzero(f.footer.col("e_publish") > ms)
    if not len(later):
        return MessageId(lg.id + 1, 0, 0)
    entry = int(later[0])
    first, stop = int(f.footer.e_rec_start[entry]), int(f.footer.e_rec_start[entry + 1])
    for i, m in enumerate(f.messages(first, stop), first):
        if m.publish_time > ms:
            return f.record_id(i)
    return f.record_id(stop - 1).successor()
