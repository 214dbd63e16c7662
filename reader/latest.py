"""The latest record of every live key, in memory bounded by record counts: two passes.

A topic's table (``shale read --table``, ``shale export --table``,
:meth:`TableView.to_arrow <shale.reader.TableView.to_arrow>`) is the latest record of every
key in its compacted view, less the keys whose latest record is a tombstone, in id order.
It is found without holding the view:

1. **Pass one** (:func:`plan_latest`) reads footers only.  The objects of the view as it
   is now — the compacted parts below the horizon (less their deletion vectors) and the
   original ledgers above it: :class:`~shale.metadata.view.TopicView` — carry each
   record's 128-bit key hash and flags.  The records with a key are folded
   (:func:`last_of_each_key`): the last record of each hash in id order is its key's
   latest, and is chosen unless it is a tombstone.  Memory follows the number of records
   (about 33 bytes per record with a key at the peak, measured; see :func:`plan_latest`),
   never their values.
2. **Pass two** reads only the chosen records of the same objects, in id order: as Arrow
   batches (:func:`latest_batches`, bounded by decompressed bytes as every
   :class:`~shale.reader.arrow.BatchReader` is) or as messages (:func:`latest_messages`,
   one entry decompressed at a time).

Which record of a key is its latest follows the topic's order
(:func:`~shale.metadata.view.reading_order`: the published view's, else the topic's
policy).  Under offset order it is the last in id order, as above.  Under event-time order
pass one also takes each record's time from the footers (its event time, or for a record
without one the publish time of its entry: :meth:`~shale.ledger.ordering.TopicOrder.times`)
and the record with the greatest time wins, the later id breaking ties
(:func:`~shale.ledger.latest.latest_by_event_time`); 8 more bytes per record.  With a key
TTL, a key whose winner's time (its publish time under offset order) is older than "now"
less the TTL is left out as if deleted; "now" is taken once per plan.

Pass two reads what pass one planned and nothing else, so a record published in between
is not in the table: objects never change once written (a new deletion vector is a new
object).  As compaction does, the table knows a key by its 128-bit hash.

Why two passes rather than sorting the records by key in bounded memory (spilling runs
and merging them): the footers already hold what deciding needs, so the first pass
costs footer reads and about 33 bytes per record, the values are read once, only for
the records kept, and the table comes out in id order — the order every other read
gives — with nothing written aside.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, TypeVar

import numpy as np
import numpy.typing as npt

from shale.ledger.errors import ObjectNotFoundError
from shale.ledger.format import FLAG_HAS_KEY, FLAG_TOMBSTONE
from shale.ledger.ids import MessageId
from shale.ledger.latest import latest_by_event_time
from shale.ledger.ordering import TopicOrder, decoded_times
from shale.ledger.reader import DEFAULT_CHUNK_BYTES
from shale.ledger.record import Message
from shale.metadata.asof import AsOf
from shale.metadata.topic import TopicMetadata
from shale.metadata.view import Segment, TopicView
from shale.reader.arrow import DEFAULT_BATCH_ROWS, DEFAULT_MAX_BATCH_BYTES, BatchReader, decode_threads, require_pyarrow

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Chosen", "LatestPlan", "last_of_each_key", "latest_batches", "latest_messages", "plan_latest",
           "table_batches", "table_messages"]

#: Records compared at once when looking for where hashes change along the sort order
#: (bounds the gathered copies to a few MiB, beside the per-record arrays).
_COMPARE_RECORDS: Final = 1 << 19
#: Plans made at most when objects of the view are removed before pass two reads them.
_PLANS: Final = 3
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Chosen:
    """The records of one object of the view that are in the table (indexes, rising)."""

    segment: Segment
    records: npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class LatestPlan:
    """What pass one chose, object by object in id order, how many records it folded, the
    order it decided by, and how many keys it left out as expired."""

    chosen: tuple[Chosen, ...]
    records: int
    order: TopicOrder = field(default_factory=TopicOrder)
    expired: int = 0

    @property
    def rows(self) -> int:
        """How many rows the table has."""
        return sum(len(c.records) for c in self.chosen)


def plan_latest(meta: TopicMetadata, *, end: MessageId | None = None, order: TopicOrder | None = None,
                now_ms: int | None = None, as_of: AsOf | None = None,
                from_snapshot: int | str | None = None) -> LatestPlan:
    """Pass one: the records of the table of the view as it is now (``end``: of the
    records with ids below ``end`` only), reading footers alone (and, under event-time
    order, the records of a compacted part whose footer does not give their times).

    ``order``: decide by it rather than by the topic's (:func:`reading_order
    <shale.metadata.view.reading_order>`); ``now_ms``: what a key TTL counts from (default:
    the point's time as of a point, else the clock, read once); ``as_of``: of the topic as
    it was at that point (:mod:`shale.metadata.asof`), decided in the order of the view it
    is read from; ``from_snapshot``: of a retained snapshot's view and every record
    above its horizon now (:func:`~shale.metadata.snapshots.view_as_of`).

    Memory: for every record with a key, its two hashes (16 bytes), its index (4), whether
    it is a tombstone (1) and its place in the sort order (8), and under event-time order
    or with a key TTL its time (8); and 16 bytes per key while the fold ends."""
    view = TopicView.load(meta, as_of=as_of, from_snapshot=from_snapshot)
    order = view.order(meta) if order is None else order
    now_ms = _ttl_now(order, now_ms, view)
    segments = [s for s in view.segments(end=end) if isinstance(s, Segment) and s.records > 0]
    # Each object's record count bounds what it adds: filled in place, never concatenated.
    bound = sum(s.records for s in segments)
    hi = np.empty(bound, dtype=np.uint64)
    lo = np.empty(bound, dtype=np.uint64)
    index = np.empty(bound, dtype=np.uint32)  # (an object holds fewer than 2**32 records: its footer is bounded)
    tombstone = np.empty(bound, dtype=np.bool_)
    # (offset order without a TTL, the default, needs no times: none are gathered)
    times = np.empty(bound, dtype=np.int64) if order.needs_times else None
    starts = [0]
    for segment in segments:
        f = segment.open(meta)
        records = segment.live(meta, f)
        flags = f.footer.col("r_flags")[records]
        keyed = records[(flags & FLAG_HAS_KEY) != 0]
        a, b = starts[-1], starts[-1] + len(keyed)
        hi[a:b] = f.footer.col("r_hash_hi")[keyed]
        lo[a:b] = f.footer.col("r_hash_lo")[keyed]
        index[a:b] = keyed
        tombstone[a:b] = (f.footer.col("r_flags")[keyed] & FLAG_TOMBSTONE) != 0
        if times is not None and len(keyed):
            first = int(keyed[0])
            times[a:b] = decoded_times(f, order, first, int(keyed[-1]) + 1)[keyed - first]
        starts.append(b)
        del f, records, flags, keyed
    n = starts[-1]
    latest = _winners(hi[:n], lo[:n], None if times is None else times[:n], order)
    del hi, lo
    latest = latest[~tombstone[latest]]
    expired = 0
    if order.key_ttl_ms:
        assert times is not None and now_ms is not None
        gone = order.expired(times[latest], now_ms)
        expired = int(np.count_nonzero(gone))
        latest = latest[~gone]
    del times
    cut = np.searchsorted(latest, starts)
    chosen = tuple(Chosen(segment, index[latest[cut[i]:cut[i + 1]]].astype(np.int64))
                   for i, segment in enumerate(segments) if cut[i + 1] > cut[i])
    return LatestPlan(chosen, n, order, expired)


def _ttl_now(order: TopicOrder, now_ms: int | None, view: TopicView) -> int | None:
    """What a key TTL counts from: ``now_ms`` when given, else the point the view is read
    as of, else the clock (None without a TTL)."""
    if not order.key_ttl_ms or now_ms is not None:
        return now_ms
    return int(time.time() * 1000) if view.now_ms is None else view.now_ms


def _winners(hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64], times: npt.NDArray[np.int64] | None,
             order: TopicOrder) -> npt.NDArray[np.int64]:
    """Positions (rising) of the latest record of each key ``(hi, lo)`` under ``order``
    (``times``: each record's, when the order needs them)."""
    if not order.by_event_time:
        return last_of_each_key(hi, lo)
    assert times is not None
    return np.sort(latest_by_event_time(hi, lo, times)).astype(np.int64, copy=False)


def last_of_each_key(hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
    """Positions (rising) of the last occurrence of every distinct 128-bit hash ``(hi, lo)``.

    The positions are sorted by ``hi``; each run of one ``hi`` is one key, whose last
    occurrence is the run's greatest position.  A run that holds more than one ``lo`` (two
    keys whose hashes share their high 64 bits: one pair of keys in about 10**19) is
    settled key by key."""
    n = len(hi)
    if not n:
        return np.empty(0, dtype=np.int64)
    order = np.argsort(hi).astype(np.int64, copy=False)
    new_hi = _changes(hi, order)
    same_hi_new_lo = _changes(lo, order)
    same_hi_new_lo &= ~new_hi
    runs = np.flatnonzero(new_hi)
    del new_hi
    last = np.maximum.reduceat(order, runs)
    if same_hi_new_lo.any():
        mixed = np.unique(np.searchsorted(runs, np.flatnonzero(same_hi_new_lo), side="right") - 1)
        ends = np.r_[runs[1:], n]
        settled = []
        for r in mixed.tolist():
            members = order[runs[r]:ends[r]]
            by_lo = members[np.lexsort((members, lo[members]))]  # by lo, then position
            tail = np.r_[lo[by_lo][1:] != lo[by_lo][:-1], True]
            settled.append(by_lo[tail])
        keep = np.ones(len(last), dtype=np.bool_)
        keep[mixed] = False
        last = np.concatenate([last[keep], *settled])
    del order
    last.sort()
    return last


def _changes(values: npt.NDArray[np.uint64], order: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Whether ``values`` changes at each step along ``order`` (the first step: True),
    gathered a slice at a time."""
    n = len(order)
    out = np.empty(n, dtype=np.bool_)
    out[0] = True
    for a in range(1, n, _COMPARE_RECORDS):
        b = min(n, a + _COMPARE_RECORDS)
        v = values[order[a - 1:b]]
        np.not_equal(v[1:], v[:-1], out=out[a:b])
    return out


def latest_batches(meta: TopicMetadata, plan: LatestPlan, *, utf8: bool = False,
                   max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
                   rows: int | None = DEFAULT_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """Pass two as Arrow record batches (the columns of :mod:`shale.reader.arrow`), each
    of at most ``max_batch_bytes`` of records and ``rows`` rows (needs pyarrow)."""
    require_pyarrow()
    with BatchReader(decode_threads(), max_batch_bytes=max_batch_bytes, rows=rows,
                     chunk_bytes=min(DEFAULT_CHUNK_BYTES, max_batch_bytes), utf8=utf8) as reader:
        for c in plan.chosen:
            yield from reader.batches(c.segment.open(meta), c.records)


def latest_messages(meta: TopicMetadata, plan: LatestPlan, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                    hold_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> Iterator[Message]:
    """Pass two as messages, one entry decompressed and one record decoded at a time
    (:meth:`~shale.ledger.reader.LedgerFile.messages_at`), in ranged reads of about
    ``chunk_bytes``, holding no more than ``hold_bytes`` decompressed at once (an entry
    bigger than that read as a stream)."""
    for c in plan.chosen:
        yield from c.segment.open(meta).messages_at(c.records, chunk_bytes=chunk_bytes, hold_bytes=hold_bytes)


def table_batches(meta: TopicMetadata, *, end: MessageId | None = None, utf8: bool = False,
                  max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES, rows: int | None = DEFAULT_BATCH_ROWS,
                  order: TopicOrder | None = None, now_ms: int | None = None,
                  as_of: AsOf | None = None, from_snapshot: int | str | None = None) -> Iterator[pa.RecordBatch]:
    """Both passes, as Arrow record batches (:func:`plan_latest`, :func:`latest_batches`)."""
    return _planned(meta, end, order, now_ms, (as_of, from_snapshot),
                    lambda plan: latest_batches(meta, plan, utf8=utf8, max_batch_bytes=max_batch_bytes, rows=rows))


def table_messages(meta: TopicMetadata, *, end: MessageId | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                   order: TopicOrder | None = None, now_ms: int | None = None,
                   as_of: AsOf | None = None, from_snapshot: int | str | None = None,
                   hold_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> Iterator[Message]:
    """Both passes, as messages (:func:`plan_latest`, :func:`latest_messages`)."""
    return _planned(meta, end, order, now_ms, (as_of, from_snapshot),
                    lambda plan: latest_messages(meta, plan, chunk_bytes=chunk_bytes, hold_bytes=hold_bytes))


def _planned(meta: TopicMetadata, end: MessageId | None, order: TopicOrder | None, now_ms: int | None,
             view: tuple[AsOf | None, int | str | None], read: Callable[[LatestPlan], Iterator[_T]]) -> Iterator[_T]:
    """What ``read`` gives of a plan of the table.  An object of the view removed before
    pass two has given anything (a newer compaction retired it, gc deleted it once its
    grace was over) is no loss: the table is planned again from the newest view (with
    the same "now" for a key TTL: the read is one read)."""
    as_of, from_snapshot = view
    if now_ms is None and as_of is None:
        now_ms = int(time.time() * 1000)
    for attempt in range(_PLANS):
        plan = plan_latest(meta, end=end, order=order, now_ms=now_ms, as_of=as_of, from_snapshot=from_snapshot)
        given = False
        try:
            for item in read(plan):
                given = True
                yield item
            return
        except ObjectNotFoundError:
            if given or attempt == _PLANS - 1:
                raise
