"""Point lookup: the latest record of one key, reading only what can hold it.

Every ledger and compacted part carries the 128-bit hash of each record's key in its
footer.  A lookup reads the footers of the objects of the compacted view
(:class:`~shale.metadata.view.TopicView`) newest first: the ledgers above the horizon and,
if the key is not there, the compacted parts; it then reads only the entries whose
records' hashes match, and compares the keys themselves (a hash match alone is never
taken for the key).  Nothing else of the topic is read.

The topic's order decides which record is the latest
(:func:`~shale.metadata.view.reading_order`).  Under offset order it is the newest match,
and the lookup stops there.  Under event-time order a late record may lie anywhere, so
every footer of the view is read; the matches are taken greatest time first (their
times come from the footers: :meth:`~shale.ledger.ordering.TopicOrder.times`), the later
id breaking ties, and the first whose key is the key wins.  With a key TTL, a key whose
winner is older than the TTL (counted from the clock, read once) is not found, as if
deleted (:attr:`Lookup.expired`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from shale.ledger.format import KIND_ORIGINAL
from shale.ledger.ordering import TopicOrder, record_time
from shale.ledger.reader import LedgerFile
from shale.ledger.record import Message, key_hash
from shale.ledger.values import dataclass
from shale.metadata.asof import AsOf
from shale.metadata.topic import TopicMetadata
from shale.metadata.view import Segment, TopicView
from shale.settings.units import format_duration, format_time

__all__ = ["Lookup", "lookup", "why_no_value"]


@dataclass(frozen=True, slots=True)
class Lookup:
    """The answer to a lookup: the key's latest message (None if the key has none, or it
    expired; a tombstone if its latest is one), and what was read to find it.
    ``expired``: the key's latest record is older than the topic's key TTL."""

    key: bytes
    message: Message | None
    footers_read: int
    entries_read: int
    expired: bool = False

    @property
    def value(self) -> bytes | None:
        return None if self.message is None or self.message.is_tombstone else self.message.value


def _matches(f: LedgerFile, hi: int, lo: int) -> Iterator[int]:
    """Indexes of the records whose key hash is ``(hi, lo)``, newest first."""
    his, los = f.footer.col("r_hash_hi"), f.footer.col("r_hash_lo")
    found = np.flatnonzero((his == np.uint64(hi)) & (los == np.uint64(lo)))
    return (int(i) for i in found[::-1])


def lookup(meta: TopicMetadata, key: bytes, *, now_ms: int | None = None, as_of: AsOf | None = None) -> Lookup:
    """The latest record of ``key`` in the compacted view plus the tail above the horizon
    (the same answer a compacted read would end on, under the topic's order).
    ``now_ms``: what a key TTL counts from (default: the point's time as of a point, else
    the clock); ``as_of``: as the topic was at that point (:mod:`shale.metadata.asof`)."""
    view = TopicView.load(meta, as_of=as_of)
    order = view.order(meta)
    now = now_ms if now_ms is not None else view.now_ms if view.now_ms is not None else int(time.time() * 1000)
    # newest first: the tail's ledgers, then the compacted parts (at most one live record per key)
    segments = [s for s in view.segments() if isinstance(s, Segment)]
    if order.by_event_time:
        return _by_event_time(meta, key, list(reversed(segments)), order, now)
    hi, lo = key_hash(key)
    footers = entries = 0
    for segment in reversed(segments):
        f = segment.open(meta)
        footers += 1
        for i in _live_matches(meta, segment, f, hi, lo):
            entries += 1
            m = next(f.messages(i, i + 1))
            if m.key == key:  # the first match found is the latest
                if order.expired_at(int(f.footer.record_publish()[i]), now):
                    return Lookup(key, None, footers, entries, expired=True)
                return Lookup(key, m, footers, entries)
    return Lookup(key, None, footers, entries)


def _live_matches(meta: TopicMetadata, segment: Segment, f: LedgerFile, hi: int, lo: int) -> Iterator[int]:
    """The records of ``segment`` (``f`` opened) whose key hash is ``(hi, lo)`` and that a
    read of the view gives, newest first."""
    first, stop = segment.span(f)
    gone = segment.deleted(meta, f.n_records)
    for i in _matches(f, hi, lo):
        if (gone is not None and gone[i]) or i >= stop:  # deleted, or past the point read as of
            continue
        if i < first:
            break  # at or below the horizon: the compacted view answers for it
        yield i


def _by_event_time(meta: TopicMetadata, key: bytes, newest_first: list[Segment], order: TopicOrder,
                   now: int) -> Lookup:
    """:func:`lookup` under event-time order: every matching record of every footer, the
    greatest ``(time, id)`` whose key is ``key`` wins."""
    hi, lo = key_hash(key)
    entries = 0
    # (time, -segment, index): segment 0 is the newest, so this orders equal times by id
    found: list[tuple[int, int, int, LedgerFile]] = []
    decoded: dict[tuple[int, int], Message] = {}
    for n, segment in enumerate(newest_first):
        f = segment.open(meta)
        for i in _live_matches(meta, segment, f, hi, lo):
            times = order.times(f.footer, i, i + 1)
            if times is not None:
                t = int(times[0])
            else:  # a part whose footer does not give event times: the record says
                entries += 1
                m = decoded[(n, i)] = next(f.messages(i, i + 1))
                t = record_time(m.event_time, int(f.footer.record_publish()[i]))
            found.append((t, -n, i, f))
    found.sort(key=lambda c: c[:3], reverse=True)
    for t, neg_n, i, f in found:
        if (-neg_n, i) not in decoded:
            entries += 1
            decoded[(-neg_n, i)] = next(f.messages(i, i + 1))
        m = decoded[(-neg_n, i)]
        if m.key == key:
            if order.expired_at(t, now):
                return Lookup(key, None, len(newest_first), entries, expired=True)
            return Lookup(key, m, len(newest_first), entries)
    return Lookup(key, None, len(newest_first), entries)


def why_no_value(meta: TopicMetadata, key: bytes, found: Lookup, *, as_of: AsOf | None = None,
                 now_ms: int | None = None) -> str:
    """Why ``key`` has no value, in words, given what :func:`lookup` ``found``: deleted or
    expired as the view says; else from the original ledgers the compacted view replaced
    (their footers read newest first, the entries whose hashes match decoded), which hold
    its records until retention removes them: deleted (a tombstone compaction dropped
    past the delete retention), expired (a record older than the key TTL compaction
    dropped), never written (no ledger holds it and retention removed none), or no record
    left (retention removed ledgers that might have).  Reads footers only on this path."""
    if found.expired:
        return "expired"
    if found.message is not None:
        return "deleted"
    view = TopicView.load(meta, as_of=as_of)
    order = view.order(meta)
    now = now_ms if now_ms is not None else view.now_ms if view.now_ms is not None else int(time.time() * 1000)
    latest = _latest_original(meta, view, key, order)
    if latest is not None:
        m, t = latest
        if m.is_tombstone:
            return "deleted: its latest record is a tombstone, which a compaction dropped past the delete retention"
        if order.expired_at(t, now):
            return (f"expired: its latest record ({format_time(t)} UTC) is older than the key TTL "
                    f"({format_duration(order.key_ttl_ms)}), and a compaction dropped it")
        return "no live record"
    if view.topic.removed_through:
        return (f"no record of it left: never written, or only in ledgers retention removed (up to ledger "
                f"{view.topic.removed_through})")
    return "never written"


def _latest_original(meta: TopicMetadata, view: TopicView, key: bytes, order: TopicOrder
                     ) -> tuple[Message, int] | None:
    """The latest record of ``key`` (under ``order``) among the original ledgers kept at
    or below the view's horizon, with its time; None when none holds it."""
    horizon, end = view.horizon, view.end
    hi, lo = key_hash(key)
    best: tuple[int, int, int, Message] | None = None  # (time, ledger, index, record)
    for lg in reversed(view.topic.ledgers):
        if horizon is None or lg.first_id > horizon or (end is not None and lg.first_id >= end):
            continue  # above the horizon: the view read it already
        f = LedgerFile.open(meta.topic.store, meta.topic.key(lg.object), ledger_id=lg.id, kind=KIND_ORIGINAL,
                            dictionaries=meta.dictionaries)
        stop = min(f.find(horizon.successor()), f.n_records if end is None else f.find(end))
        for i in _matches(f, hi, lo):
            if i >= stop:
                continue
            m = next(f.messages(i, i + 1))
            if m.key != key:
                continue
            times = order.times(f.footer, i, i + 1)
            t = int(times[0]) if times is not None else record_time(m.event_time, int(f.footer.record_publish()[i]))
            if best is None or (t, lg.id, i) > best[:3]:
                best = (t, lg.id, i, m)
            if not order.by_event_time:
                return m, t  # the newest by offset: no other can win
    return None if best is None else (best[3], best[0])
