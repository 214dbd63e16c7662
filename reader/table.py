"""A table view: the latest value of every key (Pulsar's TableView).

Built from a compacted read: the compacted ledger first, then the tail above the
horizon.  Tombstones remove keys; records without a key are ignored.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from shale.ledger.record import Message
from shale.reader.topic_reader import EARLIEST, TopicReader

__all__ = ["TableView"]


class TableView(Mapping[bytes, bytes]):
    """``key -> latest value`` of a topic; :meth:`refresh` catches up with new records."""

    def __init__(self, topic_uri: str, *, metadata_uri: str | None = None) -> None:
        self._reader = TopicReader(topic_uri, metadata_uri=metadata_uri, read_compacted=True, start=EARLIEST)
        self._latest: dict[bytes, Message] = {}
        self.refresh()

    def refresh(self) -> int:
        """Apply every message published since the last refresh; return how many."""
        n = 0
        for m in self._reader:
            n += 1
            if m.key is None:
                continue
            if m.is_tombstone:
                self._latest.pop(m.key, None)
            else:
                self._latest[m.key] = m
        return n

    def message(self, key: bytes) -> Message:
        """The whole latest message of ``key`` (id, properties, times)."""
        return self._latest[key]

    def messages(self) -> Iterator[Message]:
        """Latest messages in id order."""
        return iter(sorted(self._latest.values(), key=lambda m: m.id))

    def __getitem__(self, key: bytes) -> bytes:
        value = self._latest[key].value
        return value if value is not None else b""

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._latest)

    def __len__(self) -> int:
        return len(self._latest)
