"""A table view: the latest value of every key (Pulsar's TableView).

Built from a compacted read: the compacted ledger first, then the tail above the
horizon.  Tombstones remove keys; records without a key are ignored.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from shale.ledger.record import Message
from shale.reader.arrow import DEFAULT_MAX_BATCH_BYTES, require_pyarrow, schema
from shale.reader.arrow import require as _require
from shale.reader.latest import table_batches
from shale.reader.topic_reader import EARLIEST, TopicReader

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Listener", "TableView"]

#: Told of each change to the view: the key and its new value (None: deleted).
Listener = Callable[[bytes, bytes | None], None]


class TableView(Mapping[bytes, bytes]):
    """``key -> latest value`` of a topic; :meth:`refresh` catches up with new records."""

    def __init__(self, topic_uri: str, *, metadata_uri: str | None = None) -> None:
        self._uri, self._metadata_uri = topic_uri, metadata_uri
        self._reader = TopicReader(topic_uri, metadata_uri=metadata_uri, read_compacted=True, start=EARLIEST)
        self._latest: dict[bytes, Message] = {}
        self._listeners: list[Listener] = []
        self.refresh()

    def refresh(self) -> int:
        """Apply every message published since the last refresh; return how many.  Each
        listener hears of every change: ``(key, value)``, value None for a deletion."""
        n = 0
        for m in self._reader:
            n += 1
            if m.key is None:
                continue
            if m.is_tombstone:
                self._latest.pop(m.key, None)
            else:
                self._latest[m.key] = m
            for listener in self._listeners:
                listener(m.key, None if m.is_tombstone else m.value)
        return n

    def listen(self, listener: Listener) -> None:
        """Call ``listener(key, value)`` on every change :meth:`refresh` applies from now on."""
        self._listeners.append(listener)

    def for_each_and_listen(self, listener: Listener) -> None:
        """Call ``listener`` for every key now, then on every change (Pulsar's
        ``TableView.forEachAndListen``)."""
        for m in self.messages():
            listener(m.key or b"", m.value)
        self.listen(listener)

    def follow(self, poll_interval: float = 1.0, stop: threading.Event | None = None) -> None:
        """Keep the view current: refresh every ``poll_interval`` seconds until ``stop``
        is set (listeners hear of each change)."""
        stop = stop or threading.Event()
        while not stop.is_set():
            self.refresh()
            stop.wait(poll_interval)

    def message(self, key: bytes) -> Message:
        """The whole latest message of ``key`` (id, properties, times)."""
        return self._latest[key]

    def messages(self) -> Iterator[Message]:
        """Latest messages in id order."""
        return iter(sorted(self._latest.values(), key=lambda m: m.id))

    def to_arrow(self, *, utf8: bool = False, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> pa.Table:
        """The view as an Arrow table, as of the last :meth:`refresh`: the latest record of
        every live key, in id order, with the columns of :mod:`shale.reader.arrow` (read
        afresh from the topic's compacted view, in columns: footers first, then only the
        records of the table, in batches of at most ``max_batch_bytes``; see
        :mod:`shale.reader.latest`).  Needs pyarrow."""
        pa = require_pyarrow()
        # (records published since the last refresh are not in the view yet)
        batches = table_batches(self._reader.meta, end=self._reader.position, utf8=utf8,
                                max_batch_bytes=max_batch_bytes)
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
        value = self._latest[key].value
        return value if value is not None else b""

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._latest)

    def __len__(self) -> int:
        return len(self._latest)
