"""Reading a topic, in full or through its compacted view.

A compacted read (``read_compacted=True``) serves every position at or below the
published horizon from the compacted ledger and every position above it from the
original ledgers; the switch happens at ``horizon.successor()``, so there is no gap and
no duplicate.  A reader that opts out sees every original record.  What each read covers
comes from the topic's view (:class:`~shale.metadata.view.TopicView`); the reader adds
what depends on its own history: where it stands, the removed ledgers it had listed, and
the gaps retention opened ahead of it.
"""

from __future__ import annotations

import datetime
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar, cast

import numpy as np
import numpy.typing as npt

from shale.ledger.deletions import read_deletions
from shale.ledger.errors import GapError, InvalidInputError, ObjectNotFoundError
from shale.ledger.format import KIND_ORIGINAL
from shale.ledger.ids import MIN_ID, MessageId
from shale.ledger.ordering import TopicOrder, record_time
from shale.ledger.reader import DEFAULT_CHUNK_BYTES, LedgerFile
from shale.ledger.record import Message
from shale.metadata.asof import AsOf, Point, point_ms, resolve_point
from shale.metadata.positions import TIME_HELP, parse_time, position_at
from shale.metadata.state import CompactionState, LedgerInfo, TopicState
from shale.metadata.topic import TopicMetadata
from shale.metadata.view import Segment, TopicView, wholly_below
from shale.reader.arrow import (
    DEFAULT_BATCH_ROWS,
    DEFAULT_MAX_BATCH_BYTES,
    BatchReader,
    decode_threads,
    require_pyarrow,
    schema,
)
from shale.reader.arrow import require as _require
from shale.reader.batches import MessageBatch
from shale.reader.gaps import Gap, GapListener, OnGap, check_on_gap, log_gap, log_start
from shale.reader.outage import OutageListener, Rider, log_outage
from shale.reader.subscriber import Subscribing
from shale.settings.kinds import shown
from shale.storage import StorageOptions

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["EARLIEST", "LATEST", "Position", "TopicReader", "parse_position", "parse_start"]

EARLIEST: Final = "earliest"
LATEST: Final = "latest"
#: Where a reader starts: ``earliest``, ``latest``, a message id, or (a time) the first
#: record published then or later
Position = MessageId | Literal["earliest", "latest"] | datetime.datetime
_T = TypeVar("_T")


def parse_position(text: str) -> MessageId | Literal["earliest", "latest"]:
    """``earliest``, ``latest`` or a message id ``L:E:B``."""
    t = text.strip().lower()
    if t in (EARLIEST, LATEST):
        return EARLIEST if t == EARLIEST else LATEST
    return MessageId.parse(text)


def parse_start(text: str, now_ms: int | None = None) -> Position:
    """:func:`parse_position`, or a time (``--start`` of ``shale read`` and ``export``:
    :data:`~shale.metadata.positions.TIME_HELP`; ``-DURATION`` counts back from
    ``now_ms``, the clock by default) as a UTC datetime."""
    t = text.strip()
    if (t.count(":") == 2 and t.replace(":", "").isdigit()) or t.lower() in (EARLIEST, LATEST):
        return parse_position(text)  # (as given: an id has one spelling, without spaces)
    ms = parse_time(t, int(time.time() * 1000) if now_ms is None else now_ms)
    if ms is None:
        raise InvalidInputError(f"{shown(t)!r} is not a position: expected earliest, latest, a message id "
                                f"LEDGER:ENTRY:BATCH or {TIME_HELP}")
    return datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(milliseconds=ms)


class TopicReader(Subscribing):
    """Iterates a topic's messages in id order from a position.

    Iterating reads to the end of the topic as it is when the end is reached (new
    ledgers registered meanwhile are included); iterate again later to continue.
    ``seek`` re-reads the metadata, so a reader picks up a newer compaction state when
    it opens or re-seeks.  If a compacted ledger it is reading is retired and deleted
    underneath it, the reader moves to the newest state without losing its place.

    When retention removed records the reader had yet to read (:mod:`shale.reader.gaps`
    says precisely when that is), ``on_gap`` decides: ``error`` (the default) raises
    :class:`~shale.ledger.errors.GapError` naming the range, ``skip`` goes on past it,
    ``compacted`` reads the range from the compacted view; ``gap_listener`` is told of
    every gap gone past (default: a warning on the ``shale.reader`` logger).  Removed
    ledgers the reader had listed are still read while their objects last (they stay for
    the orphan grace), so a reader only a little behind loses nothing.

    ``as_of`` (an epoch, a time, a message id or a tag) reads the topic as it was at that
    point, nothing written later (:mod:`shale.metadata.asof`; implies ``read_compacted``):
    the point is resolved once, when the reader is made, and every read ends there.
    ``from_snapshot`` (an epoch) reads that retained snapshot's compacted view and then
    every record above its horizon as the topic holds them now: what a rollback to it
    would publish (:func:`~shale.metadata.snapshots.view_as_of`).

    ``storage_options`` say how to reach the topic's storage
    (:class:`~shale.storage.StorageOptions`; read from the environment when not given).

    ``subscription`` names a durable subscription: the reader starts where it last
    committed (a new one is created at ``start``); :meth:`commit`, ``auto_commit`` or
    ``commit_every`` (every N messages returned, once more is asked for, and when every
    message there is was returned; ``before_commit`` is called first) commits the position
    after the last message returned (:mod:`shale.reader.subscriber`).

    ``retry_for`` (seconds) rides out storage outages: a read that finds the store
    unreachable is tried again with backoff for that long (None: for ever when following,
    else not at all), each outage told once as it starts and once as it ends to
    ``outage_listener`` (:mod:`shale.reader.outage`).
    """

    def __init__(self, topic_uri: str, *, metadata_uri: str | None = None, read_compacted: bool = False,
                 start: Position = EARLIEST, chunk_bytes: int = DEFAULT_CHUNK_BYTES, follow: bool = False,
                 poll_interval: float = 1.0, on_gap: OnGap = "error", gap_listener: GapListener | None = None,
                 storage_options: StorageOptions | None = None, subscription: str | None = None,
                 auto_commit: bool = False, as_of: AsOf | None = None, from_snapshot: int | str | None = None,
                 max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES, commit_every: int | None = None,
                 before_commit: Callable[[], None] | None = None, retry_for: float | None = None,
                 outage_listener: OutageListener | None = None) -> None:
        if as_of is not None and from_snapshot is not None:
            raise InvalidInputError("give as_of (the topic as it was) or from_snapshot (a snapshot, then everything "
                                    "since), not both")
        if subscription is not None and (as_of is not None or from_snapshot is not None):
            raise InvalidInputError("a subscription reads the topic as it is now: give it without as_of or "
                                    "from_snapshot")
        if follow and as_of is not None:
            raise InvalidInputError("a read as of a point ends there: following reads the topic as it grows")
        self.meta = TopicMetadata.open(topic_uri, metadata_uri, storage_options)
        #: the point this reader reads the topic as of (None: as it is)
        self.as_of = as_of
        #: the retained snapshot read, then everything since, instead of the published view
        self.from_snapshot = from_snapshot
        #: what the point covers, resolved once (None: no point)
        self.point: Point | None = None
        self.read_compacted = read_compacted or as_of is not None or from_snapshot is not None
        self.chunk_bytes = chunk_bytes
        #: the most a message read holds decompressed at once: a bigger entry is read on its
        #: own, as a stream (an lz4 block bigger than this and than its biggest record is refused)
        self.max_batch_bytes = max_batch_bytes
        #: iterating never ends: it waits for new ledgers, looking every ``poll_interval`` s
        self.follow = follow
        self.poll_interval = poll_interval
        #: what reading does when records it had yet to read were removed: error, skip, compacted
        self.on_gap: OnGap = check_on_gap(on_gap)
        #: told of each gap the reader goes past (``skip``, ``compacted``)
        self.gap_listener: GapListener = gap_listener or log_gap
        #: reads tried again through storage outages for ``retry_for`` (None: for ever when following)
        self._rider = Rider(self.meta.uri, (math.inf if follow else 0.0) if retry_for is None else retry_for,
                            outage_listener or log_outage, first_wait=poll_interval)
        self._it: Iterator[Message] | None = None
        self._pending: Message | None = None
        self._files: OrderedDict[str, LedgerFile] = OrderedDict()
        self._open_ahead = False  # (set while Arrow batches are read: see _opened)
        self._gone: tuple[str, npt.NDArray[np.bool_] | None] = ("", None)
        self._topic: TopicState = self.meta.load_topic()
        if as_of is not None:
            self.point = resolve_point(self.meta, self._topic, self.meta.load_compaction(), as_of)
        #: ids from here on are past the point this reader reads as of (None: no bound)
        self._end = None if self.point is None else self.point.end
        self._compaction: CompactionState = CompactionState()
        self._next: MessageId = MIN_ID
        #: records below this id that are gone are no gap: they went before an ``earliest`` reader began
        self._floor: MessageId = MIN_ID
        #: where an ``earliest`` reader that has read nothing yet stands (None: any other reader)
        self._fresh: MessageId | None = None
        #: removed ledgers this reader had listed and has yet to finish: read while their objects last
        self._behind: tuple[LedgerInfo, ...] = ()
        #: records gone unread: from this id to the end of that removed ledger
        self._gap: tuple[MessageId, int] | None = None
        self.seek(self._subscribe(self.meta, subscription, start, auto_commit, commit_every, before_commit,
                                  int(poll_interval * 1000) if follow else 0))

    # ---------------------------------------------------------------- positioning

    @property
    def position(self) -> MessageId:
        """The smallest id the next message may have (once an original ledger is read to
        its end, the first id of the next ledger)."""
        return self._next

    @property
    def compaction(self) -> CompactionState:
        """The compaction state this reader currently follows."""
        return self._compaction

    @property
    def topic(self) -> TopicState:
        return self._topic

    def _load_compaction(self) -> CompactionState:
        """The compaction state this reader follows: the published one, the view its point
        is read from, or the snapshot it reads from."""
        if self.point is not None:
            return self.point.base
        if self.from_snapshot is not None:
            return self.meta.load_compaction_as_of(self.from_snapshot)
        return self.meta.load_compaction()

    def refresh(self) -> None:
        """Re-read the ledger list and the compaction state."""
        self._adopt(self.meta.load_topic())
        if self.read_compacted:
            self._compaction = self._load_compaction()

    def seek(self, position: Position) -> None:
        """Move to ``earliest`` (the oldest record left), ``latest`` or the first message
        with id ``>= position``.  An id at or below a ledger retention removed is a gap,
        met by the next read."""
        self._it, self._pending = None, None
        self._behind, self._gap, self._fresh, self._floor = (), None, None, MIN_ID
        self._topic = self.meta.load_topic()
        if self.read_compacted:
            self._compaction = self._load_compaction()
        if position == EARLIEST:
            # Kafka's log start: what retention removed before the reader began is no gap
            # (a compacted reader still reads the compacted view from the first id).
            self._floor = log_start(self._topic)
            self._next = MIN_ID if self.read_compacted else self._floor
            self._fresh = self._next
        elif position == LATEST:
            self._next = MessageId(self._topic.last_ledger_id + 1, 0, 0)
        elif isinstance(position, datetime.datetime):  # Kafka's offsetsForTimes
            self._next = position_at(self.meta, self._topic, point_ms(position))
            self._removed_from(self._next)
        else:
            self._next = position if isinstance(position, MessageId) else MessageId.parse(str(position))
            self._removed_from(self._next)

    def _adopt(self, new: TopicState) -> None:
        """Take ``new`` as the ledger list, noting what retention removed that this reader
        has yet to read."""
        old, self._topic = self._topic, new
        if self._fresh is not None and self._next == self._fresh:
            # ``earliest`` and nothing read yet: it starts at the oldest record left
            self._floor = log_start(new)
            if not self.read_compacted:
                self._next = max(self._next, self._floor)
            self._fresh = self._next
            return
        start = max(self._next, self._floor)
        if TopicView(new).removed_from(start) is None:
            return
        through = new.removed_through
        # Removed ledgers this reader had listed and not finished: their objects stay until
        # the orphan grace has passed since the truncation, and are read while they do.
        known = {lg.id: lg for lg in (*self._behind, *old.ledgers)}
        self._behind = tuple(known[i] for i in sorted(known) if i <= through and not wholly_below(known[i], start))
        if self.read_compacted:
            self._removed_from(start)  # crossed through the compacted view
        elif through > old.last_ledger_id:
            # registered and removed since this reader last listed the topic: never seen, gone
            self._removed_from(max(start, MessageId(old.last_ledger_id + 1, 0, 0)))

    def _removed_from(self, first: MessageId) -> None:
        """Records from ``first`` up to the last removed ledger are gone unread: a gap to cross."""
        gone = TopicView(self._topic).removed_from(first)
        if gone is None:
            return
        first, through = gone.first, gone.through
        if self._gap is not None:
            first, through = min(first, self._gap[0]), max(through, self._gap[1])
        self._gap = (first, through)

    # ------------------------------------------------------------------- reading

    def __iter__(self) -> Iterator[Message]:
        """The messages from the position on: to the end of the topic as it is, or, when
        following, forever (waiting for new ledgers)."""
        if self.follow:
            return self._following()
        return self._drain()

    def _drain(self) -> Iterator[Message]:
        self._it = None  # each pass starts from the position and the newest state
        while (m := self._take()) is not None:
            self._handed(m)
            yield m
            self._asked()
        self._handed(None)
        self._tick()

    def _following(self) -> Iterator[Message]:
        while True:
            m = self.read_next(timeout=None)
            if m is not None:
                yield m

    def _take(self) -> Message | None:
        """The next message if the topic has one now, else None (looked for again next time);
        read again through a storage outage (:mod:`shale.reader.outage`)."""
        return self._rider.call(self._take_once)

    def _take_once(self) -> Message | None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            return pending
        if self._it is None:
            self._it = self._messages()
        try:
            m = next(self._it, None)
        except BaseException:
            self._it = None  # the next look starts again from the position (a gap is met again)
            raise
        if m is None:
            self._it = None  # at the end: the next look starts from the ledger list again
        return m

    def has_message_available(self) -> bool:
        """Whether a message is there to read now (Pulsar's ``Reader.hasMessageAvailable``)."""
        if self._pending is None:
            self._pending = self._take()
        return self._pending is not None

    def read_next(self, timeout: float | None = None) -> Message | None:
        """The next message, waiting up to ``timeout`` seconds for one to be published
        (None: as long as it takes); None if none came (Pulsar's ``Reader.readNext``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._asked()
        while True:
            m = self._take()
            self._handed(m)
            if m is not None:
                return m
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            self._rider.call(self._tick)
            time.sleep(self.poll_interval if left is None else min(self.poll_interval, left))

    def read(self, limit: int | None = None) -> list[Message]:
        """Up to ``limit`` messages there are now (all of them when ``None``); never waits.
        Should records it had yet to read have been removed, it returns the messages before
        them, and the next call raises :class:`~shale.ledger.errors.GapError`."""
        self._tick()  # what the last read returned was handled
        out: list[Message] = []
        # Each read starts from the position and the newest state: a reader resumed later
        # must not go on from bytes it read before (its compacted part may be gone since).
        self._it = None
        while limit is None or len(out) < limit:
            try:
                m = self._take()
            except GapError:
                if out:
                    break  # the position stands before the gap: met again next time
                raise
            if m is None:
                break
            out.append(m)
        return out

    def timed_messages(self, order: TopicOrder) -> Iterator[tuple[Message, int]]:
        """The messages there are now from the position on (never waits, even when
        following), each with its time as ``order`` counts it (:mod:`shale.ledger.ordering`):
        under event-time order its event time, or for a message without one the publish
        time of the entry it was first written in; otherwise that publish time.  Both come
        from the footers (a message's own ``publish_time`` may be earlier than its entry's).
        The position moves past what was read."""
        if self._pending is not None:  # a message looked at but not taken is read again
            self._next, self._pending = self._pending.id, None
        self._it = None

        def read(f: LedgerFile, start: int, gone: npt.NDArray[np.bool_] | None) -> Iterator[tuple[Message, int]]:
            publish = f.footer.record_publish()[start:]
            if gone is not None:  # the records _file_messages gives: those from start not gone
                publish = publish[~gone[start:]]
            for p, m in zip(publish, self._file_messages(f, start, gone), strict=False):
                yield m, record_time(m.event_time, int(p)) if order.by_event_time else int(p)

        return self._walk(read)

    def _open(self, seg: Segment, opened: LedgerFile | None = None) -> LedgerFile:
        """``seg``'s ledger, from the cache or opened (``opened``: already, by _opened)."""
        key = self.meta.topic.key(seg.object)
        f = self._files.get(key)
        if f is None:
            f = opened or seg.open(self.meta)
            self._files[key] = f
            if len(self._files) > 64:
                self._files.popitem(last=False)
        else:
            self._files.move_to_end(key)
        return f

    def _opened(self, segs: Iterator[Segment]) -> Iterator[tuple[Segment, LedgerFile]]:
        """Each of ``segs`` with its ledger opened.  While Arrow batches are read, the next
        one's footer is read and checked on a thread of its own as the caller reads this
        one, so that the decoding threads do not wait for it between parts; whatever
        opening it raises is raised when it is reached, as it would have been."""
        if not self._open_ahead:
            for seg in segs:
                yield seg, self._open(seg)
            return
        from concurrent.futures import ThreadPoolExecutor

        def first_open(seg: Segment) -> LedgerFile | None:
            # (only reads the cache: this thread is the only one to change it, between opens)
            return None if self.meta.topic.key(seg.object) in self._files else seg.open(self.meta)

        with ThreadPoolExecutor(1, thread_name_prefix="shale-open") as pool:
            nxt = next(segs, None)
            ahead = pool.submit(first_open, nxt) if nxt is not None else None
            while nxt is not None and ahead is not None:
                seg, opening = nxt, ahead
                f = self._open(seg, opening.result())
                nxt = next(segs, None)
                ahead = pool.submit(first_open, nxt) if nxt is not None else None
                yield seg, f

    def _deletions(self, seg: Segment, records: int) -> npt.NDArray[np.bool_] | None:
        """The part's deleted records (superseded since it was written), if any."""
        if not seg.deletions:
            return None
        key = self.meta.topic.key(seg.deletions)
        if self._gone[0] != key:
            self._gone = (key, read_deletions(self.meta.topic.store, key, records))
        return self._gone[1]

    def _messages(self) -> Iterator[Message]:
        return self._walk(self._file_messages)

    def _file_messages(self, f: LedgerFile, start: int, gone: npt.NDArray[np.bool_] | None) -> Iterator[Message]:
        """The messages of ``f`` from record ``start`` on, skipping ``gone``; the position
        moves past each record read."""
        stop = None
        if gone is not None:  # a deleted or cut tail is not even decoded
            live = np.flatnonzero(~gone[start:])
            stop = start + (int(live[-1]) + 1 if live.size else 0)
        last = f.n_records - 1 if f.footer.kind == KIND_ORIGINAL else -1
        for i, m in enumerate(f.messages(start, stop, chunk_bytes=self.chunk_bytes, hold_bytes=self.max_batch_bytes),
                              start):
            # Past an original ledger's last record the next id is in a later ledger: saying
            # so keeps the position exact should retention remove this ledger.
            self._next = MessageId(m.id.ledger + 1, 0, 0) if i == last else m.id.successor()
            if gone is None or not gone[i]:
                yield m

    def _walk(self, read: Callable[[LedgerFile, int, npt.NDArray[np.bool_] | None], Iterator[_T]]) -> Iterator[_T]:
        """What ``read`` yields of each ledger and part, in id order from the position: the
        compacted view first when reading compacted, then the original ledgers, looking for
        new ones until the topic stops growing.  ``read(f, start, gone)`` reads records
        ``start..`` of ``f`` (those ``gone`` skipped) and moves the position past them.
        Records removed before they were read are a gap, crossed as ``on_gap`` says."""
        if self.subscriber is not None:
            read = self.subscriber.committing(read)
        if self._end is not None:
            read = _bounded(read, self._end)
        if self.read_compacted:
            yield from self._compacted_part(read)
        while True:
            yield from self._original_part(read)
            old = self._topic
            self._adopt(self.meta.load_topic())
            if self._gap is None and self._topic.last_ledger_id == old.last_ledger_id:
                return

    def _compacted_part(self, read: Callable[[LedgerFile, int, npt.NDArray[np.bool_] | None], Iterator[_T]],
                        stop: MessageId | None = None) -> Iterator[_T]:
        """The compacted view from the position to its horizon (``stop``: to that id only,
        where the position then stands)."""
        while True:
            state = self._compaction
            view = TopicView(self._topic, state, self._end)
            if not view.holds(self._next):
                return
            try:
                for seg, f in self._opened(view.parts(self._next, stop)):  # (the point's bound: _bounded)
                    f.arrow_cache = seg.arrow_cache(self.meta)  # (read by Arrow batches)
                    gone = self._deletions(seg, f.n_records)
                    if stop is not None and (cut := f.find(stop)) < f.n_records:
                        gone = np.zeros(f.n_records, dtype=np.bool_) if gone is None else gone.copy()
                        gone[cut:] = True
                    yield from read(f, f.find(self._next), gone)
            except ObjectNotFoundError:
                # Retired and deleted under us: follow the newest state from where we are.
                newer = self._load_compaction()
                if newer.version == state.version:
                    raise
                self._compaction = newer
                continue
            self._next = stop if stop is not None else view.tail_start(self._next)
            return

    def _original_part(self, read: Callable[[LedgerFile, int, npt.NDArray[np.bool_] | None], Iterator[_T]]
                       ) -> Iterator[_T]:
        """The original ledgers from the position: removed ones still there that this reader
        had listed, then the gap if any, then the listed ones."""
        while True:
            view = TopicView(self._topic, end=self._end)
            for seg in view.ledgers(self._next, among=self._behind):
                if self.read_compacted or (self._gap is not None and seg.ledger_id >= self._gap[0].ledger):
                    break
                try:
                    yield from self._ledger(seg, read)
                except ObjectNotFoundError:
                    self._removed_from(self._next)  # collected: what is left of the removed range is gone
                    break
            if self._gap is not None:
                yield from self._cross_gap(read)
            self._behind = ()
            view = TopicView(self._topic, end=self._end)
            self._next = view.skip(self._next)
            for seg in view.ledgers(self._next):
                try:
                    yield from self._ledger(seg, read)
                except ObjectNotFoundError:
                    newer = self.meta.load_topic()
                    if newer.ledger(seg.ledger_id) is not None or seg.ledger_id > newer.removed_through:
                        raise  # not removed by retention: an object missing
                    self._adopt(newer)
                    self._removed_from(self._next)  # removed and collected while this reader read it
                    break
            else:
                return

    def _ledger(self, seg: Segment, read: Callable[[LedgerFile, int, npt.NDArray[np.bool_] | None], Iterator[_T]]
                ) -> Iterator[_T]:
        f = self._open(seg)
        yield from read(f, f.find(self._next), None)
        self._next = max(self._next, MessageId(seg.ledger_id + 1, 0, 0))  # sealed: nothing more comes in it

    def _cross_gap(self, read: Callable[[LedgerFile, int, npt.NDArray[np.bool_] | None], Iterator[_T]]
                   ) -> Iterator[_T]:
        """Go past the gap as ``on_gap`` says: raise, skip it, or read it from the compacted
        view (a compacted reader always does, as far as the view holds it)."""
        assert self._gap is not None
        gap = Gap(self.meta.uri, max(self._gap[0], self._next), self._gap[1])
        if self._next >= gap.resume:
            self._gap = None
            return
        if self.read_compacted or self.on_gap == "compacted":
            state = self._compaction = self._load_compaction()
            covered = min(TopicView(self._topic, state).covered(self._behind), gap.resume)
            if self.read_compacted:
                yield from self._compacted_part(read)
            elif covered > gap.first:
                if covered >= gap.resume:
                    self.gap_listener(replace(gap, how="compacted", horizon=state.horizon))
                self._next = gap.first  # only removed ledgers lie between: read or gone
                yield from self._compacted_part(read, covered)
            self._next = max(self._next, covered)
            if self._next >= gap.resume:
                self._gap = None
                return
            gap = replace(gap, first=max(self._next, gap.first), horizon=state.horizon, uncovered=True)
        if self.on_gap != "skip":
            raise gap.error()
        self._next, self._gap = gap.resume, None
        self.gap_listener(replace(gap, how="skipped"))

    # --------------------------------------------------------------------- Arrow

    def iter_batches(self, rows: int | None = DEFAULT_BATCH_ROWS, *, utf8: bool = False, id_text: bool = False,
                     max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> Iterator[pa.RecordBatch]:
        """The messages from the position to the end of the topic as it is now, as Arrow
        record batches of at most ``rows`` rows (None: no limit) and ``max_batch_bytes``
        bytes of records once decompressed (a record bigger than that comes alone); the
        reader decompresses no more than ``max_batch_bytes`` at once across its threads
        (:class:`~shale.reader.arrow.BatchReader`).  :mod:`shale.reader.arrow` gives the
        columns; ``utf8``: keys and values as text; ``id_text``: the ids' text too.  Never
        waits, even when following; the position moves past each batch as it is handed
        out (:meth:`message_batches`).  Needs pyarrow (``shale[arrow]``)."""
        for batch in self.message_batches(rows, utf8=utf8, id_text=id_text, max_batch_bytes=max_batch_bytes):
            yield batch.records

    def message_batches(self, rows: int | None = DEFAULT_BATCH_ROWS, *, limit: int | None = None,
                        utf8: bool = False, id_text: bool = False, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
                        check_first: bool = False) -> Iterator[MessageBatch]:
        """:meth:`iter_batches` as :class:`~shale.reader.batches.MessageBatch` objects (the
        records, and where the reader stands after each of them), at most ``limit``
        messages in all (None: every one there is now).  The position moves past each
        batch as it is handed out, as it moves past each message :meth:`read_next` returns;
        with ``auto_commit``, what was handed out is committed as the reader moves on to the
        next ledger or part and when it reaches the end of what there is.  ``check_first``:
        an entry given in several batches has every record checked before the first is
        given, as a read of messages checks it (else its frame is checked before the last)."""
        if (yield from self._batches(rows, limit, (utf8, id_text, check_first), max_batch_bytes)):
            self._tick()

    def read_batches(self, limit: int | None = None, *, rows: int | None = DEFAULT_BATCH_ROWS,
                     max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> list[MessageBatch]:
        """:meth:`read` in batches: up to ``limit`` messages there are now (all of them when
        ``None``) as :class:`~shale.reader.batches.MessageBatch` objects of at most ``rows``
        rows and ``max_batch_bytes`` bytes of records (their Arrow columns in ``records``);
        never waits.  Should records it had yet to read have been removed, it returns the
        batches before them, and the next call raises :class:`~shale.ledger.errors.GapError`."""
        self._tick()  # what the last read returned was handled
        out: list[MessageBatch] = []
        try:
            for batch in self._batches(rows, limit, (False, False, True), max_batch_bytes):
                out.append(batch)
        except GapError:
            if not out:
                raise
        return out

    def _batches(self, rows: int | None, limit: int | None, how: tuple[bool, bool, bool],
                 max_batch_bytes: int) -> Generator[MessageBatch, None, bool]:
        """The batches of :meth:`message_batches` (``how``: utf8, id_text, check_first);
        returns whether it read to the end of what there is (rather than stopping at
        ``limit``)."""
        utf8, id_text, check_first = how
        require_pyarrow()
        if self._pending is not None:  # a message looked at but not taken is read again
            self._next, self._pending = self._pending.id, None
        self._it = None
        if limit is not None and limit <= 0:
            return False
        with BatchReader(decode_threads(), max_batch_bytes=max_batch_bytes, rows=rows, chunk_bytes=self.chunk_bytes,
                         utf8=utf8, id_text=id_text, check_first=check_first) as reader:

            def read(f: LedgerFile, start: int, gone: npt.NDArray[np.bool_] | None) -> Iterator[MessageBatch]:
                records = np.arange(start, f.n_records, dtype=np.int64)
                if gone is not None:
                    records = records[~gone[start:]]
                last = f.record_id(f.n_records - 1) if f.footer.kind == KIND_ORIGINAL and f.n_records else None
                for records_batch in reader.batches(f, records):
                    batch = MessageBatch(records_batch, last)
                    self._next = batch.after(len(batch) - 1)  # (handed out: as a message is)
                    yield batch

            self._open_ahead = True
            walk = cast(Generator[MessageBatch, None, None], self._walk(read))
            try:
                for batch in walk:
                    if limit is not None and len(batch) >= limit:
                        if len(batch) > limit:
                            batch = batch.head(limit)
                            self._next = batch.after(limit - 1)
                        yield batch
                        return False
                    if limit is not None:
                        limit -= len(batch)
                    yield batch
            finally:
                walk.close()
                self._open_ahead = False
        return True

    def to_arrow(self, *, utf8: bool = False, id_text: bool = False,
                 max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> pa.Table:
        """:meth:`iter_batches`, as one table (which holds what it holds: only the reading
        is bounded by ``max_batch_bytes``)."""
        pa = require_pyarrow()
        return pa.Table.from_batches(list(self.iter_batches(utf8=utf8, id_text=id_text,
                                                            max_batch_bytes=max_batch_bytes)),
                                     schema=schema(utf8, id_text))

    def to_pandas(self, *, utf8: bool = False, id_text: bool = False,
                  max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> Any:
        """:meth:`to_arrow` as a pandas DataFrame (pandas must be installed)."""
        _require("pandas")
        return self.to_arrow(utf8=utf8, id_text=id_text, max_batch_bytes=max_batch_bytes).to_pandas()

    def to_polars(self, *, utf8: bool = False, id_text: bool = False,
                  max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> Any:
        """:meth:`to_arrow` as a Polars DataFrame (polars must be installed)."""
        polars = _require("polars")
        return polars.from_arrow(self.to_arrow(utf8=utf8, id_text=id_text, max_batch_bytes=max_batch_bytes))

    def close(self) -> None:
        """Commit what was handed out (with ``auto_commit``) and let the subscription go;
        forget the opened objects."""
        s = self.subscriber
        if s is not None and s.auto and s.member is not None and self._handed_out() != s.subscription.position:
            if s.before_commit is not None:
                s.before_commit()
            s.commit(leave=True)  # the last commit says the reader leaves
        self._tick()
        self._leave()
        self._files.clear()

    def __enter__(self) -> TopicReader:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
            return
        # what was handed out may not have been handled: not committed
        self._files.clear()
        try:
            self._leave()
        except Exception:  # (storage failing as it fails: the error being raised says more)
            if self.subscriber is not None:
                self.subscriber.member = None


def _bounded(read: Callable[[LedgerFile, int, npt.NDArray[np.bool_] | None], Iterator[_T]], end: MessageId
             ) -> Callable[[LedgerFile, int, npt.NDArray[np.bool_] | None], Iterator[_T]]:
    """``read`` of the records below ``end`` only: those from ``end`` on are skipped as
    deleted ones are, and not even decoded."""

    def bounded(f: LedgerFile, start: int, gone: npt.NDArray[np.bool_] | None) -> Iterator[_T]:
        cut = f.find(end)
        if cut < f.n_records:
            gone = np.zeros(f.n_records, dtype=np.bool_) if gone is None else gone.copy()
            gone[cut:] = True
        return read(f, start, gone)

    return bounded
