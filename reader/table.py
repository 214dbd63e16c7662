"""A table view: the latest value of every key (Pulsar's TableView).

Built from a compacted read: the compacted ledger first, then the tail above the
horizon.  Tombstones remove keys; records without a key are ignored.

Which record of a key is its latest follows the topic's order
(:func:`~shale.metadata.view.reading_order`), as every reader of the table does.  Under
offset order the record read last wins.  Under event-time order the record with the
greatest time wins (its event time, or for a record without one the publish time of the
entry it was first written in, from the footers), a later id breaking ties: a late record
older than the key's current value is ignored, and so is a late one older than the
tombstone that deleted its key (the view remembers the time of each key's winning
tombstone for that).  With a key TTL, a key whose winning record is older than the TTL is
not in the view: "now" is read once per :meth:`TableView.refresh`, and each refresh also drops the
keys that expired since, telling listeners as of a deletion.

The view is built from Arrow batches where pyarrow is installed: the table of the view as
it is when the view is made (:func:`~shale.reader.latest.plan_table`, footers first, then
only the latest record of each live key) is held as the batches it was read in, keys and
values in their buffers, found through a hash index (:class:`~shale.reader.table_rows.TableRows`);
what later refreshes read is applied message by message over it.  Without pyarrow, every
record is applied message by message.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

from shale.ledger.errors import ObjectNotFoundError, TransientStorageError
from shale.ledger.ids import MessageId
from shale.ledger.ordering import TopicOrder
from shale.ledger.record import Message
from shale.metadata.asof import AsOf
from shale.metadata.view import reading_order
from shale.reader.arrow import DEFAULT_MAX_BATCH_BYTES, require_pyarrow, schema
from shale.reader.arrow import require as _require
from shale.reader.latest import latest_batches, plan_table, table_batches
from shale.reader.outage import OutageListener, Rider, log_outage
from shale.reader.topic_reader import EARLIEST, TopicReader

if TYPE_CHECKING:
    import pyarrow as pa

    from shale.reader.table_rows import TableRows

__all__ = ["Listener", "TableView"]

#: Told of each change to the view: the key and its new value (None: deleted).
Listener = Callable[[bytes, bytes | None], None]

#: Stale entries the expiry queue holds at most beyond twice the keys it ages, before it
#: is built again from the live ones.
_QUEUE_SLACK: Final = 1024
#: Plans made at most when objects of the view are removed before they are read.
_PLANS: Final = 3


class TableView(Mapping[bytes, bytes]):
    """``key -> latest value`` of a topic; :meth:`refresh` catches up with new records.

    The order and key TTL are the topic's when the view is built (:attr:`order`); build a
    new view after they change (which rewrites the compacted view).  ``clock`` gives "now"
    in seconds, for a key TTL.  ``as_of`` (an epoch, a time, a message id or a tag): the
    table as it was at that point, nothing written later, in the order of the view it is
    read from and with the point's time as "now" for a key TTL (:mod:`shale.metadata.asof`);
    refreshing adds nothing to it.  ``from_snapshot`` (an epoch): the table of that
    retained snapshot's view and every record above its horizon now (what a rollback to
    it would publish)."""

    def __init__(self, topic_uri: str, *, metadata_uri: str | None = None,
                 clock: Callable[[], float] = time.time, as_of: AsOf | None = None,
                 from_snapshot: int | str | None = None) -> None:
        self._uri, self._metadata_uri = topic_uri, metadata_uri
        #: what "now" is read from, in seconds (for a key TTL)
        self._clock = clock
        self._reader = TopicReader(topic_uri, metadata_uri=metadata_uri, read_compacted=True, start=EARLIEST,
                                   as_of=as_of, from_snapshot=from_snapshot)
        #: the order and key TTL the view decides by
        self.order: TopicOrder = reading_order(self._reader.meta, self._reader.compaction)
        #: the rows the view was built with (None: without pyarrow, every record is in _latest)
        self._rows: TableRows | None = None
        #: each key's latest message, of those applied since the view was built
        self._latest: dict[bytes, Message] = {}
        #: each key's winning time, when the order needs times
        self._times: dict[bytes, int] = {}
        #: under event-time order, the time of each deleted key's winning tombstone
        self._deleted: dict[bytes, int] = {}
        #: with a key TTL: (time, key) of every winner set, oldest first (stale ones skipped)
        self._queue: list[tuple[int, bytes]] = []
        #: the "now" of the last refresh (what the key TTL counted from)
        self._now: int | None = None
        self._listeners: list[Listener] = []
        self._load()
        self.refresh()

    def _now_ms(self) -> int:
        """What a key TTL counts from: the point's time as of a point, else the clock."""
        point = self._reader.point
        return int(self._clock() * 1000) if point is None or point.now_ms is None else point.now_ms

    def _load(self) -> None:
        """The table of the view as it is now, read in Arrow batches and held as they are
        (where pyarrow is installed); the reader then stands past every ledger it listed."""
        import importlib.util

        if importlib.util.find_spec("pyarrow") is None:
            return  # (refresh applies every record)
        from shale.reader.table_rows import TableRows

        r = self._reader
        end = MessageId(r.topic.last_ledger_id + 1, 0, 0)
        now = self._now_ms() if self.order.key_ttl_ms else None
        if not self.order.is_default:
            self._now = now
        for attempt in range(_PLANS):
            plan = plan_table(r.meta, end=end, order=self.order, now_ms=now, as_of=r.as_of,
                              from_snapshot=r.from_snapshot)
            try:
                batches = list(latest_batches(r.meta, plan.plan))
            except ObjectNotFoundError:  # retired and collected since it was planned: plan again
                if attempt == _PLANS - 1:
                    raise
                continue
            hi, times, tombstones = plan.hi, plan.times, plan.tombstones
            del plan  # (its record indexes, before the index is built)
            self._rows = TableRows(batches, hi, times, tombstones)
            r.seek(end)
            return

    def refresh(self) -> int:
        """Apply every message published since the last refresh; return how many.  Each
        listener hears of every change: ``(key, value)``, value None for a deletion (a
        key that expired included)."""
        if self.order.is_default:
            return self._refresh_by_offset()
        now = self._now = self._now_ms()
        n = 0
        for m, t in self._reader.timed_messages(self.order):
            n += 1
            if m.key is not None:
                self._apply(m, m.key, t, now)
        self._expire(now)
        return n

    def _refresh_by_offset(self) -> int:
        """:meth:`refresh` under offset order without a key TTL: the record read last wins."""
        n = 0
        for m in self._reader:
            n += 1
            if m.key is None:
                continue
            self._drop_row(m.key)
            if m.is_tombstone:
                self._latest.pop(m.key, None)
            else:
                self._latest[m.key] = m
            for listener in self._listeners:
                listener(m.key, None if m.is_tombstone else m.value)
        return n

    def _apply(self, m: Message, key: bytes, t: int, now: int) -> None:
        """Take ``m`` (time ``t``) into the view if it wins for its key."""
        order = self.order
        if order.by_event_time:
            held = self._held(key)
            if held is not None and t < held:
                return  # late: older than the key's winner (equal times: the later id wins)
        held_row = self._drop_row(key)
        if m.is_tombstone or order.expired_at(t, now):
            had = self._latest.pop(key, None) is not None or held_row
            self._times.pop(key, None)
            self._deleted.pop(key, None)
            if m.is_tombstone and order.by_event_time:
                self._deleted[key] = t
                self._queue_for_expiry(t, key)
            # (a winner already expired: anything older that comes later is expired too)
            if m.is_tombstone or had:
                self._tell(key, None)
            return
        self._latest[key] = m
        self._times[key] = t
        self._deleted.pop(key, None)
        self._queue_for_expiry(t, key)
        self._tell(key, m.value)

    def _held(self, key: bytes) -> int | None:
        """The time of ``key``'s winner, or of the tombstone that deleted it, if any."""
        held = self._times.get(key, self._deleted.get(key))
        if held is not None or self._rows is None:
            return held
        row = self._rows.find(key)
        if row >= 0:
            assert self._rows.times is not None
            return int(self._rows.times[row])
        return self._rows.tombstone_time(key)

    def _drop_row(self, key: bytes) -> bool:
        """``key`` is applied anew: the rows built with no longer answer for it (whether
        they held a value for it)."""
        if self._rows is None:
            return False
        row = self._rows.find(key)
        if row >= 0:
            self._rows.kill(row)
        if self.order.by_event_time:
            self._rows.forget_tombstone(key)
        return row >= 0

    def _queue_for_expiry(self, t: int, key: bytes) -> None:
        if self.order.key_ttl_ms:
            heapq.heappush(self._queue, (t, key))

    def _expire(self, now: int) -> None:
        """Drop the keys whose winner's time is past the key TTL at ``now`` (and forget the
        tombstones that are: whatever comes late for their keys is older, so expired too),
        telling listeners in the order of those times."""
        if not self.order.key_ttl_ms:
            return
        queue = self._queue
        dropped: list[tuple[int, bytes]] = []
        while queue and self.order.expired_at(queue[0][0], now):
            t, key = heapq.heappop(queue)
            if self._times.get(key) == t:  # still its winner's time
                del self._latest[key], self._times[key]
                dropped.append((t, key))
            elif self._deleted.get(key) == t:
                del self._deleted[key]
        built = [] if self._rows is None else self._rows.expire(self.order, now)
        for _, key in heapq.merge(dropped, built):
            self._tell(key, None)
        if len(queue) > 2 * (len(self._times) + len(self._deleted)) + _QUEUE_SLACK:
            self._queue = [(t, k) for k, t in (*self._times.items(), *self._deleted.items())]
            heapq.heapify(self._queue)

    def _tell(self, key: bytes, value: bytes | None) -> None:
        for listener in self._listeners:
            listener(key, value)

    def listen(self, listener: Listener) -> None:
        """Call ``listener(key, value)`` on every change :meth:`refresh` applies from now on."""
        self._listeners.append(listener)

    def for_each_and_listen(self, listener: Listener) -> None:
        """Call ``listener`` for every key now, then on every change (Pulsar's
        ``TableView.forEachAndListen``)."""
        for m in self.messages():
            listener(m.key or b"", m.value)
        self.listen(listener)

    def follow(self, poll_interval: float = 1.0, stop: threading.Event | None = None, *,
               retry_for: float = math.inf, outage_listener: OutageListener | None = None) -> None:
        """Keep the view current: refresh every ``poll_interval`` seconds until ``stop``
        is set (listeners hear of each change), riding out storage outages for
        ``retry_for`` seconds, each told once as it starts and once as it ends to
        ``outage_listener`` (:mod:`shale.reader.outage`; default a warning logged)."""
        stop = stop or threading.Event()
        # (a stop set during an outage ends the wait, and the follow at the next failure)
        rider = Rider(self._uri, retry_for, outage_listener or log_outage, first_wait=poll_interval,
                      sleep=stop.wait, give_up=stop.is_set)
        try:
            while not stop.is_set():
                rider.call(self.refresh)
                stop.wait(poll_interval)
        except TransientStorageError:
            if not stop.is_set():
                raise

    def message(self, key: bytes) -> Message:
        """The whole latest message of ``key`` (id, properties, times)."""
        got = self._latest.get(key)
        if got is not None:
            return got
        row = -1 if self._rows is None else self._rows.find(key)
        if row < 0:
            raise KeyError(key)
        assert self._rows is not None
        return self._rows.message(row)

    def messages(self) -> Iterator[Message]:
        """Latest messages in id order."""
        applied = sorted(self._latest.values(), key=lambda m: m.id)
        if self._rows is None:
            return iter(applied)
        return heapq.merge(self._rows.messages(), applied, key=lambda m: m.id)

    def to_arrow(self, *, utf8: bool = False, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> pa.Table:
        """The view as an Arrow table, as of the last :meth:`refresh`: the latest record of
        every live key, in id order, with the columns of :mod:`shale.reader.arrow` (read
        afresh from the topic's compacted view, in columns: footers first, then only the
        records of the table, in batches of at most ``max_batch_bytes``; see
        :mod:`shale.reader.latest`), decided by the view's order and, for a key TTL, the
        "now" of the last refresh.  Needs pyarrow."""
        pa = require_pyarrow()
        # (records published since the last refresh are not in the view yet)
        batches = table_batches(self._reader.meta, end=self._reader.position, utf8=utf8,
                                max_batch_bytes=max_batch_bytes, order=self.order, now_ms=self._now,
                                as_of=self._reader.as_of, from_snapshot=self._reader.from_snapshot)
        return pa.Table.from_batches(list(batches), schema=schema(utf8))

    def to_pandas(self, *, utf8: bool = False, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> Any:
        """:meth:`to_arrow` as a pandas DataFrame (pandas must be installed)."""
        _require("pandas")
        return self.to_arrow(utf8=utf8, max_batch_bytes=max_batch_bytes).to_pandas()

    def to_polars(self, *, utf8: bool = False, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> Any:
        """:meth:`to_arrow` as a Polars DataFrame (polars must be installed)."""
        polars = _require("polars")

        return polars.from_arrow(self.to_arrow(utf8=utf8, max_batch_bytes=max_batch_bytes))

    def __getitem__(self, key: bytes) -> bytes:
        got = self._latest.get(key)
        if got is not None:
            value = got.value
        else:
            row = -1 if self._rows is None else self._rows.find(key)
            if row < 0:
                raise KeyError(key)
            assert self._rows is not None
            value = self._rows.value(row)
        return value if value is not None else b""

    def __contains__(self, key: object) -> bool:
        if key in self._latest:
            return True
        return isinstance(key, bytes) and self._rows is not None and self._rows.find(key) >= 0

    def __iter__(self) -> Iterator[bytes]:
        """The keys: those the view was built with in the id order of their records, then
        those applied since."""
        if self._rows is not None:
            yield from self._rows.keys()
        yield from self._latest

    def __len__(self) -> int:
        return len(self._latest) + (0 if self._rows is None else self._rows.live)
