"""Reading a topic, in full or through its compacted view.

A compacted read (``read_compacted=True``) serves every position at or below the
published horizon from the compacted ledger and every position above it from the
original ledgers; the switch happens at ``horizon.successor()``, so there is no gap and
no duplicate.  A reader that opts out sees every original record.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

import numpy as np
import numpy.typing as npt

from shale.ledger.deletions import read_deletions
from shale.ledger.errors import ObjectNotFoundError
from shale.ledger.format import KIND_COMPACTED, KIND_ORIGINAL
from shale.ledger.ids import MIN_ID, MessageId
from shale.ledger.reader import DEFAULT_CHUNK_BYTES, LedgerFile
from shale.ledger.record import Message
from shale.metadata.state import CompactedPart, CompactionState, TopicState
from shale.metadata.topic import TopicMetadata
from shale.reader.arrow import DEFAULT_BATCH_ROWS, DEFAULT_MAX_BATCH_BYTES, BatchReader, require_pyarrow, schema
from shale.reader.arrow import require as _require

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["EARLIEST", "LATEST", "Position", "TopicReader", "parse_position"]

EARLIEST: Final = "earliest"
LATEST: Final = "latest"
Position = MessageId | Literal["earliest", "latest"]
_T = TypeVar("_T")


def parse_position(text: str) -> Position:
    """``earliest``, ``latest`` or a message id ``L:E:B``."""
    t = text.strip().lower()
    if t in (EARLIEST, LATEST):
        return EARLIEST if t == EARLIEST else LATEST
    return MessageId.parse(text)


class TopicReader:
    """Iterates a topic's messages in id order from a position.

    Iterating reads to the end of the topic as it is when the end is reached (new
    ledgers registered meanwhile are included); iterate again later to continue.
    ``seek`` re-reads the metadata, so a reader picks up a newer compaction state when
    it opens or re-seeks.  If a compacted ledger it is reading is retired and deleted
    underneath it, the reader moves to the newest state without losing its place.
    """

    def __init__(self, topic_uri: str, *, metadata_uri: str | None = None, read_compacted: bool = False,
                 start: Position = EARLIEST, chunk_bytes: int = DEFAULT_CHUNK_BYTES, follow: bool = False,
                 poll_interval: float = 1.0) -> None:
        self.meta = TopicMetadata.open(topic_uri, metadata_uri)
        self.read_compacted = read_compacted
        self.chunk_bytes = chunk_bytes
        #: iterating never ends: it waits for new ledgers, looking every ``poll_interval`` s
        self.follow = follow
        self.poll_interval = poll_interval
        self._it: Iterator[Message] | None = None
        self._pending: Message | None = None
        self._files: OrderedDict[str, LedgerFile] = OrderedDict()
        self._gone: tuple[str, npt.NDArray[np.bool_] | None] = ("", None)
        self._topic: TopicState = self.meta.load_topic()
        self._compaction: CompactionState = CompactionState()
        self._next: MessageId = MIN_ID
        self.seek(start)

    # ---------------------------------------------------------------- positioning

    @property
    def position(self) -> MessageId:
        """The smallest id the next message may have."""
        return self._next

    @property
    def compaction(self) -> CompactionState:
        """The compaction state this reader currently follows."""
        return self._compaction

    @property
    def topic(self) -> TopicState:
        return self._topic

    def refresh(self) -> None:
        """Re-read the ledger list and the compaction state."""
        self._topic = self.meta.load_topic()
        if self.read_compacted:
            self._compaction = self.meta.load_compaction()

    def seek(self, position: Position) -> None:
        """Move to ``earliest``, ``latest`` or the first message with id ``>= position``."""
        self._it, self._pending = None, None
        self.refresh()
        if position == EARLIEST:
            self._next = MIN_ID
        elif position == LATEST:
            last = self._topic.ledgers[-1] if self._topic.ledgers else None
            self._next = MessageId(last.id, last.entries, 0) if last else MIN_ID
        elif isinstance(position, MessageId):
            self._next = position
        else:
            self._next = MessageId.parse(str(position))

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
            yield m

    def _following(self) -> Iterator[Message]:
        while True:
            m = self.read_next(timeout=None)
            if m is not None:
                yield m

    def _take(self) -> Message | None:
        """The next message if the topic has one now, else None (looked for again next time)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            return pending
        if self._it is None:
            self._it = self._messages()
        m = next(self._it, None)
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
        while True:
            m = self._take()
            if m is not None:
                return m
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            time.sleep(self.poll_interval if left is None else min(self.poll_interval, left))

    def read(self, limit: int | None = None) -> list[Message]:
        """Up to ``limit`` messages there are now (all of them when ``None``); never waits."""
        out: list[Message] = []
        # Each read starts from the position and the newest state: a reader resumed later
        # must not go on from bytes it read before (its compacted part may be gone since).
        self._it = None
        while limit is None or len(out) < limit:
            m = self._take()
            if m is None:
                break
            out.append(m)
        return out

    def _open(self, key: str, ledger_id: int, kind: int) -> LedgerFile:
        f = self._files.get(key)
        if f is None:
            f = LedgerFile.open(self.meta.topic.store, key, ledger_id=ledger_id, kind=kind,
                                dictionaries=self.meta.dictionaries)
            self._files[key] = f
            if len(self._files) > 64:
                self._files.popitem(last=False)
        else:
            self._files.move_to_end(key)
        return f

    def _deletions(self, part: CompactedPart, records: int) -> npt.NDArray[np.bool_] | None:
        """The part's deleted records (superseded since it was written), if any."""
        if not part.deletions:
            return None
        key = self.meta.topic.key(part.deletions)
        if self._gone[0] != key:
            self._gone = (key, read_deletions(self.meta.topic.store, key, records))
        return self._gone[1]

    def _messages(self) -> Iterator[Message]:
        return self._walk(self._file_messages)

    def _file_messages(self, f: LedgerFile, start: int, gone: npt.NDArray[np.bool_] | None) -> Iterator[Message]:
        """The messages of ``f`` from record ``start`` on, skipping ``gone``; the position
        moves past each record read."""
        for i, m in enumerate(f.messages(start, chunk_bytes=self.chunk_bytes), start):
            self._next = m.id.successor()
            if gone is None or not gone[i]:
                yield m

    def _walk(self, read: Callable[[LedgerFile, int, npt.NDArray[np.bool_] | None], Iterator[_T]]) -> Iterator[_T]:
        """What ``read`` yields of each ledger and part, in id order from the position: the
        compacted view first when reading compacted, then the original ledgers, looking for
        new ones until the topic stops growing.  ``read(f, start, gone)`` reads records
        ``start..`` of ``f`` (those ``gone`` skipped) and moves the position past them."""
        if self.read_compacted:
            yield from self._compacted_part(read)
        while True:
            yield from self._original_part(read)
            old = self._topic
            self._topic = self.meta.load_topic()
            if self.read_compacted and self._topic.removed_through >= max(self._next.ledger, 1):
                # Ledgers this reader has yet to read were removed (retention keeps only what
                # a compaction covers): their records are in the newest compacted view.
                self._compaction = self.meta.load_compaction()
                yield from self._compacted_part(read)
            if self._topic.last_ledger_id == old.last_ledger_id:
                return

    def _compacted_part(self, read: Callable[[LedgerFile, int, npt.NDArray[np.bool_] | None], Iterator[_T]]
                        ) -> Iterator[_T]:
        while True:
            state = self._compaction
            if state.horizon is None or self._next > state.horizon:
                return
            try:
                for part in state.parts:
                    if part.last_id is None or part.last_id < self._next:
                        continue
                    f = self._open(self.meta.topic.key(part.object), state.part_ledger_id(part), KIND_COMPACTED)
                    yield from read(f, f.find(self._next), self._deletions(part, f.n_records))
            except ObjectNotFoundError:
                # Retired and deleted under us: follow the newest state from where we are.
                newer = self.meta.load_compaction()
                if newer.version == state.version:
                    raise
                self._compaction = newer
                continue
            self._next = max(self._next, state.horizon.successor())
            return

    def _original_part(self, read: Callable[[LedgerFile, int, npt.NDArray[np.bool_] | None], Iterator[_T]]
                       ) -> Iterator[_T]:
        for lg in self._topic.ledgers:
            if lg.id < self._next.ledger or (lg.id == self._next.ledger and self._next.entry >= lg.entries):
                continue
            f = self._open(self.meta.topic.key(lg.object), lg.id, KIND_ORIGINAL)
            yield from read(f, f.find(self._next), None)

    # --------------------------------------------------------------------- Arrow

    def iter_batches(self, rows: int | None = DEFAULT_BATCH_ROWS, *, utf8: bool = False, id_text: bool = False,
                     max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> Iterator[pa.RecordBatch]:
        """The messages from the position to the end of the topic as it is now, as Arrow
        record batches of at most ``rows`` rows (None: no limit) and ``max_batch_bytes``
        bytes of records once decompressed (a record bigger than that comes alone); the
        reader decompresses no more than ``max_batch_bytes`` at once across its threads
        (:class:`~shale.reader.arrow.BatchReader`).  :mod:`shale.reader.arrow` gives the
        columns; ``utf8``: keys and values as text; ``id_text``: the ids' text too.  Never
        waits, even when following; the position moves past what was read.  Needs pyarrow
        (``shale[arrow]``)."""
        require_pyarrow()
        if self._pending is not None:  # a message looked at but not taken is read again
            self._next, self._pending = self._pending.id, None
        self._it = None
        with BatchReader(min(2, len(os.sched_getaffinity(0))), max_batch_bytes=max_batch_bytes, rows=rows,
                         chunk_bytes=self.chunk_bytes, utf8=utf8, id_text=id_text) as reader:

            def read(f: LedgerFile, start: int, gone: npt.NDArray[np.bool_] | None) -> Iterator[pa.RecordBatch]:
                records = np.arange(start, f.n_records, dtype=np.int64)
                if gone is not None:
                    records = records[~gone[start:]]
                yield from reader.batches(f, records)
                if f.n_records > start:
                    self._next = f.record_id(f.n_records - 1).successor()

            yield from self._walk(read)

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
        self._files.clear()

    def __enter__(self) -> TopicReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
