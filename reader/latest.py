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
from dataclasses import field
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
from shale.ledger.values import dataclass
from shale.metadata.asof import AsOf
from shale.metadata.topic import TopicMetadata
from shale.metadata.view import Segment, TopicView
from shale.reader.arrow import DEFAULT_BATCH_ROWS, DEFAULT_MAX_BATCH_BYTES, BatchReader, decode_threads, require_pyarrow

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Chosen", "LatestPlan", "TablePlan", "last_of_each_key", "latest_batches", "latest_messages", "plan_latest",
           "plan_table", "table_batches", "table_messages", "table_rows"]

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


@dataclass(frozen=True, slots=True)
class TablePlan:
    """:func:`plan_latest`'s plan with what a :class:`~shale.reader.TableView` holds beside
    the rows: the high half of each row's 128-bit key hash (``hi``, in the order of the
    plan's rows), each row's time when the order needs times (else None), and under
    event-time order the keys whose winner is a tombstone not expired (``tombstones``:
    their hashes and times; a late record older than one changes nothing)."""

    plan: LatestPlan
    hi: npt.NDArray[np.uint64]
    times: npt.NDArray[np.int64] | None
    tombstones: tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], npt.NDArray[np.int64]]


@dataclass(frozen=True, slots=True)
class _Fold:
    """Pass one's arrays: for every record with a key of the view's objects (those of
    ``segments[i]`` at ``starts[i]:starts[i + 1]``), its hashes, index, tombstone flag and
    time (when the order needs them); and the winner of each key (positions, rising)."""

    segments: list[Segment]
    starts: list[int]
    hi: npt.NDArray[np.uint64]
    lo: npt.NDArray[np.uint64]
    index: npt.NDArray[np.uint32]
    tombstone: npt.NDArray[np.bool_]
    times: npt.NDArray[np.int64] | None
    winners: npt.NDArray[np.int64]


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
    return plan_table(meta, end=end, order=order, now_ms=now_ms, as_of=as_of, from_snapshot=from_snapshot).plan


def plan_table(meta: TopicMetadata, *, end: MessageId | None = None, order: TopicOrder | None = None,
               now_ms: int | None = None, as_of: AsOf | None = None,
               from_snapshot: int | str | None = None) -> TablePlan:
    """:func:`plan_latest`, with what a table view holds beside its rows (:class:`TablePlan`)."""
    view = TopicView.load(meta, as_of=as_of, from_snapshot=from_snapshot)
    order = view.order(meta) if order is None else order
    now_ms = _ttl_now(order, now_ms, view)
    fold = _fold(meta, view, order, end)
    latest = fold.winners
    dead = latest[fold.tombstone[latest]]
    latest = latest[~fold.tombstone[latest]]
    expired = 0
    if order.key_ttl_ms:
        assert fold.times is not None and now_ms is not None
        gone = order.expired(fold.times[latest], now_ms)
        expired = int(np.count_nonzero(gone))
        latest = latest[~gone]
        dead = dead[~order.expired(fold.times[dead], now_ms)]
    cut = np.searchsorted(latest, fold.starts)
    chosen = tuple(Chosen(segment, fold.index[latest[cut[i]:cut[i + 1]]].astype(np.int64))
                   for i, segment in enumerate(fold.segments) if cut[i + 1] > cut[i])
    times = None if fold.times is None else fold.times[latest]
    if not order.by_event_time or fold.times is None:
        dead = dead[:0]
    dead_times = np.empty(0, dtype=np.int64) if fold.times is None else fold.times[dead]
    return TablePlan(LatestPlan(chosen, int(fold.starts[-1]), order, expired), fold.hi[latest], times,
                     (fold.hi[dead], fold.lo[dead], dead_times))


def _fold(meta: TopicMetadata, view: TopicView, order: TopicOrder, end: MessageId | None) -> _Fold:
    """Pass one over the footers of ``view``'s objects (ids below ``end``)."""
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
        has_key = (flags & FLAG_HAS_KEY) != 0
        keyed = records[has_key]
        a, b = starts[-1], starts[-1] + len(keyed)
        # (every record of a run keyed, as in a compacted part: sliced, not gathered)
        pick = slice(int(keyed[0]), int(keyed[-1]) + 1) if b > a and keyed[-1] - keyed[0] == b - a - 1 else keyed
        hi[a:b] = f.footer.col("r_hash_hi")[pick]
        lo[a:b] = f.footer.col("r_hash_lo")[pick]
        index[a:b] = keyed
        tombstone[a:b] = (flags[has_key] & FLAG_TOMBSTONE) != 0
        if times is not None and len(keyed):
            first = int(keyed[0])
            times[a:b] = decoded_times(f, order, first, int(keyed[-1]) + 1)[keyed - first]
        starts.append(b)
        del f, records, flags, has_key, keyed
    n = starts[-1]
    hi, lo, index, tombstone = hi[:n], lo[:n], index[:n], tombstone[:n]
    times = None if times is None else times[:n]
    return _Fold(segments, starts, hi, lo, index, tombstone, times, _winners(hi, lo, times, order))


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

    Each record's position is packed into the low bits of its ``hi`` and the packed words
    are sorted (a plain sort, several times faster than an argsort): a run of equal high
    bits is, nearly always, one key, whose last occurrence is the run's last word.  Runs
    whose members are not all one key (their high bits shared by chance, or two keys
    whose hashes share their 64 high bits) are settled key by key."""
    n = len(hi)
    if not n:
        return np.empty(0, dtype=np.int64)
    bits = max(1, (n - 1).bit_length())
    low = np.uint64((1 << bits) - 1)
    packed = np.bitwise_and(hi, ~low)
    for a in range(0, n, _COMPARE_RECORDS):  # (the positions a slice at a time: no copy of the whole)
        packed[a:a + _COMPARE_RECORDS] |= np.arange(a, min(n, a + _COMPARE_RECORDS), dtype=np.uint64)
    packed.sort()
    ends = np.empty(n, dtype=np.bool_)  # the last word of each run of equal high bits
    ends[-1] = True
    mixed = []
    for a in range(0, n - 1, _COMPARE_RECORDS):
        b = min(n - 1, a + _COMPARE_RECORDS)
        np.greater(packed[a + 1:b + 1] ^ packed[a:b], low, out=ends[a:b])
        same = np.flatnonzero(~ends[a:b]) + a  # neighbours in one run: must hold one key
        x, y = (packed[same] & low).astype(np.int64), (packed[same + 1] & low).astype(np.int64)
        mixed.append(same[(hi[x] != hi[y]) | (lo[x] != lo[y])])
    runs = np.flatnonzero(ends)
    del ends
    last = (packed[runs] & low).astype(np.int64)
    odd = np.concatenate(mixed) if mixed else np.empty(0, dtype=np.int64)
    if len(odd):
        last = _settle(hi, lo, packed, low, runs, last, odd)
    del packed
    last.sort()
    return last


def _settle(hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64], packed: npt.NDArray[np.uint64], low: np.uint64,
            runs: npt.NDArray[np.intp], last: npt.NDArray[np.int64], odd: npt.NDArray[np.intp]
            ) -> npt.NDArray[np.int64]:
    """``last`` with the runs that hold more than one key (``odd``: words inside them)
    settled key by key: the last position of each distinct ``(hi, lo)`` of the run."""
    which = np.unique(np.searchsorted(runs, odd))  # (a run ends at runs[r]: odd lie before their run's end)
    starts = np.r_[0, runs[:-1] + 1]
    settled = []
    for r in which.tolist():
        members = (packed[starts[r]:runs[r] + 1] & low).astype(np.int64)
        by_key = members[np.lexsort((members, lo[members], hi[members]))]  # by key, then position
        tail = np.r_[(hi[by_key][1:] != hi[by_key][:-1]) | (lo[by_key][1:] != lo[by_key][:-1]), True]
        settled.append(by_key[tail])
    keep = np.ones(len(last), dtype=np.bool_)
    keep[which] = False
    return np.concatenate([last[keep], *settled])


def latest_batches(meta: TopicMetadata, plan: LatestPlan, *, utf8: bool = False,
                   max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
                   rows: int | None = DEFAULT_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """Pass two as Arrow record batches (the columns of :mod:`shale.reader.arrow`), each
    of at most ``max_batch_bytes`` of records and ``rows`` rows (needs pyarrow)."""
    require_pyarrow()
    with BatchReader(decode_threads(), max_batch_bytes=max_batch_bytes, rows=rows,
                     chunk_bytes=min(DEFAULT_CHUNK_BYTES, max_batch_bytes), utf8=utf8) as reader:
        for c in plan.chosen:
            f = c.segment.open(meta)
            f.arrow_cache = c.segment.arrow_cache(meta)
            yield from reader.batches(f, c.records)


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


def table_rows(meta: TopicMetadata, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
               max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES, as_of: AsOf | None = None,
               from_snapshot: int | str | None = None,
               batch_rows: int | None = None) -> Iterator[Message | pa.RecordBatch]:
    """Both passes, as Arrow record batches (:func:`table_batches`) when the table has at
    least ``batch_rows`` rows (default :data:`~shale.reader.batches.BATCH_READ_RECORDS`)
    and pyarrow is installed, else as messages (:func:`table_messages`, holding at most
    ``max_batch_bytes`` decompressed)."""
    import importlib.util

    from shale.reader import batches

    least = batches.BATCH_READ_RECORDS if batch_rows is None else batch_rows

    def read(plan: LatestPlan) -> Iterator[Message | pa.RecordBatch]:
        if plan.rows >= least and importlib.util.find_spec("pyarrow") is not None:
            return latest_batches(meta, plan, max_batch_bytes=max_batch_bytes)
        return latest_messages(meta, plan, chunk_bytes=chunk_bytes, hold_bytes=max_batch_bytes)

    return _planned(meta, None, None, None, (as_of, from_snapshot), read)


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
