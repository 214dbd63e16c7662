"""Positions in a topic as people give them: a message id checked against the ledger it
names, the first record published at or after a time (Kafka's ``offsetsForTimes``), and a
position moved by a number of records (``kafka-consumer-groups --shift-by``).

Records are counted in the plain topic, the original ledgers left, in id order: record
index ``0`` is the oldest record left, and the index of a position is how many records
lie before it.  Ledgers are known from the metadata (their record counts); a footer is
read only for the ledger a position or an index falls inside.
"""

from __future__ import annotations

import datetime
from typing import Final

import numpy as np

from shale.ledger.errors import InvalidInputError
from shale.ledger.format import KIND_ORIGINAL
from shale.ledger.ids import MIN_ID, MessageId
from shale.ledger.reader import LedgerFile
from shale.metadata.state import LedgerInfo, TopicState
from shale.metadata.topic import TopicMetadata
from shale.settings.kinds import shown
from shale.settings.units import count, parse_duration

__all__ = ["TIME_HELP", "check_id", "open_ledger", "parse_time", "position_at", "record_at", "record_index", "shift"]

#: How a time is written wherever a position may be one.
TIME_HELP: Final = ("a time: ISO 8601 (UTC unless it names a zone, e.g. 2024-05-01T12:00:00Z), milliseconds since "
                    "1970 (1714564800000 or 1714564800000ms), or -DURATION before now (-1h, -30m)")
#: Milliseconds since 1970 of the year 9999's end: a time past it is no time.
_LAST_MS: Final = 253_402_300_799_999


def open_ledger(meta: TopicMetadata, lg: LedgerInfo) -> LedgerFile:
    """``lg``'s object, its footer read and checked."""
    return LedgerFile.open(meta.topic.store, meta.topic.key(lg.object), ledger_id=lg.id, kind=KIND_ORIGINAL,
                           dictionaries=meta.dictionaries)


def parse_time(text: str, now_ms: int) -> int | None:
    """``text`` as a time in milliseconds since 1970 (:data:`TIME_HELP`; ``-DURATION`` is
    counted back from ``now_ms``); None when it is not written as one.  A time out of
    range (before 1970, after 9999) is :class:`InvalidInputError`."""
    t = text.strip()
    if t.startswith("-"):
        try:
            back = parse_duration(t[1:])
        except InvalidInputError as e:
            raise InvalidInputError(f"{shown(t)!r}: -DURATION before now: {e}") from None
        return max(0, now_ms - back)
    digits = t[:-2] if t.endswith("ms") else t
    if digits.isascii() and digits.isdigit():
        ms = int(digits) if len(digits) <= 16 else _LAST_MS + 1
        if ms > _LAST_MS:
            raise InvalidInputError(f"{shown(t)!r}: milliseconds since 1970 up to {_LAST_MS} (the year 9999)")
        return ms
    try:
        when = datetime.datetime.fromisoformat(t)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return max(0, (when - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)) // datetime.timedelta(milliseconds=1))


def position_at(meta: TopicMetadata, topic: TopicState, ms: int) -> MessageId:
    """The id of the first record (in id order) published at ``ms`` or later; past the
    last record (``latest``) when there is none (Kafka's offsets for times)."""
    for lg in topic.ledgers:
        if lg.last_publish < ms:
            continue
        f = open_ledger(meta, lg)
        late = np.flatnonzero(f.footer.col("e_publish") >= ms)
        if len(late):
            return f.record_id(int(f.footer.e_rec_start[int(late[0])]))
    return topic.next_id


def check_id(meta: TopicMetadata, topic: TopicState, position: MessageId, what: str = "position") -> MessageId:
    """``position`` if it lies within the topic: at most ``latest`` (the id its next
    ledger starts at) and, in a ledger the topic holds, naming one of its entries and one
    of that entry's records (its footer read for a batch index above 0).  A ledger the
    topic does not hold (removed, or never written) is read from the next one on.  Else
    :class:`InvalidInputError` naming ``what`` and where the ledger ends."""
    latest = topic.next_id
    if position > latest:
        raise InvalidInputError(f"{what} {position}: past the end of {meta.uri} (latest is {latest}, where its next "
                                "ledger starts): a subscription there would never read again")
    lg = topic.ledger(position.ledger)
    if lg is None:
        return position
    after = _after(topic, lg)
    if position.entry >= lg.entries:
        raise InvalidInputError(
            f"{what} {position}: past the end of ledger {lg.id}, which holds {count(lg.entries, 'entry', 'entries')} "
            f"(0 to {lg.entries - 1}); the position after its last record is {after}")
    if position.batch:
        f = open_ledger(meta, lg)
        rec = f.footer.e_rec_start
        held = int(rec[position.entry + 1]) - int(rec[position.entry])
        if position.batch >= held:
            raise InvalidInputError(
                f"{what} {position}: past the end of entry {position.entry} of ledger {lg.id}, which holds "
                f"{count(held, 'record')} (batch 0 to {held - 1})")
    return position


def _after(topic: TopicState, lg: LedgerInfo) -> MessageId:
    """The id of the record after ``lg``'s last: the next ledger's first, or ``latest``."""
    later = [x for x in topic.ledgers if x.id > lg.id]
    return later[0].first_id if later else topic.next_id


def record_index(meta: TopicMetadata, topic: TopicState, position: MessageId) -> int:
    """How many records of the plain topic lie before ``position``."""
    before = 0
    for lg in topic.ledgers:
        if position <= lg.first_id:
            return before
        if position.ledger > lg.id:
            before += lg.records
            continue
        return before + open_ledger(meta, lg).find(position)
    return before


def record_at(meta: TopicMetadata, topic: TopicState, index: int) -> MessageId:
    """The id of record ``index`` of the plain topic (0: the oldest left); ``latest`` from
    the topic's record count on."""
    for lg in topic.ledgers:
        if index < lg.records:
            return open_ledger(meta, lg).record_id(index)
        index -= lg.records
    return topic.next_id


def shift(meta: TopicMetadata, topic: TopicState, position: MessageId, n: int) -> MessageId:
    """``position`` moved by ``n`` records (back when negative), as the plain topic counts
    them: at most to ``latest``, and back at most to ``earliest`` (``0:0:0``) when the
    shift would go before the oldest record left."""
    target = record_index(meta, topic, position) + n
    if target < 0 or (target == 0 and position == MIN_ID):
        return MIN_ID
    return record_at(meta, topic, min(target, topic.records))
