"""The producer side: append records to a topic as sealed, registered ledgers.

Records are batched into entries (``batch_size`` records each) and entries into a
ledger object built in memory.  A ledger is sealed when it reaches
``max_ledger_records`` or ``max_ledger_bytes`` (or on :meth:`TopicWriter.flush`): it is
uploaded under a unique name, then registered in the topic's ledger list with one
compare-and-swap.  A writer that loses the race to another writer re-labels its ledger
with the next free id, uploads it again and retries; ledgers are never lost or
interleaved.
"""

from __future__ import annotations

import io
import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Final

from ledger.errors import ConflictError, InvalidInputError, StateUnknownError, TransientStorageError
from ledger.format import KIND_ORIGINAL
from ledger.ids import MessageId
from ledger.record import DEFAULT_MAX_RECORD_BYTES, Record, validate_record
from ledger.writer import LedgerWriter, encode_entry, relabel_ledger
from metadata.layout import ledger_object_name
from metadata.state import LedgerInfo, TopicState
from metadata.topic import TopicMetadata

__all__ = ["ProduceResult", "SealedLedger", "TopicWriter"]

#: An uploaded ledger older than this is not registered any more (garbage collection may
#: treat unregistered objects older than its orphan grace as leftovers); it is re-uploaded.
UNREGISTERED_MAX_AGE_S: Final = 300.0


@dataclass(frozen=True, slots=True)
class SealedLedger:
    """A ledger this writer sealed and registered."""

    id: int
    object: str
    records: int
    entries: int
    bytes: int
    first_id: MessageId
    last_id: MessageId


@dataclass(frozen=True, slots=True)
class ProduceResult:
    """What a writer appended, in total."""

    topic: str
    ledgers: tuple[SealedLedger, ...]
    records: int
    tombstones: int
    keyless: int

    @property
    def first_id(self) -> MessageId | None:
        return self.ledgers[0].first_id if self.ledgers else None

    @property
    def last_id(self) -> MessageId | None:
        return self.ledgers[-1].last_id if self.ledgers else None

    def to_json(self) -> dict[str, object]:
        return {
            "topic": self.topic,
            "records": self.records,
            "ledgers": len(self.ledgers),
            "bytes": sum(lg.bytes for lg in self.ledgers),
            "tombstones": self.tombstones,
            "keyless": self.keyless,
            "first_id": str(self.first_id) if self.first_id else None,
            "last_id": str(self.last_id) if self.last_id else None,
        }


class TopicWriter:
    """Appends records to a topic; use it as a context manager (closing flushes).

    >>> with TopicWriter("/tmp/topics/users") as w:          # doctest: +SKIP
    ...     w.append(b"user-1", b"alice@example.com")
    >>> w.result.last_id                                      # doctest: +SKIP
    """

    def __init__(
        self,
        topic_uri: str,
        *,
        metadata_uri: str | None = None,
        max_ledger_records: int = 500_000,
        max_ledger_bytes: int = 64 * 1024 * 1024,
        batch_size: int = 100,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        register_attempts: int = 50,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_ledger_records < 1 or max_ledger_bytes < 1 or batch_size < 1:
            raise InvalidInputError("max ledger records, max ledger bytes and batch size must be >= 1")
        self.meta = TopicMetadata.open(topic_uri, metadata_uri)
        self.max_ledger_records = max_ledger_records
        self.max_ledger_bytes = max_ledger_bytes
        self.batch_size = batch_size
        self.max_record_bytes = max_record_bytes
        self.register_attempts = register_attempts
        self._clock = clock
        self._state: TopicState = self.meta.create_topic()
        self._batch: list[Record] = []
        self._buf: io.BytesIO | None = None
        self._ledger: LedgerWriter | None = None
        self._first_publish = 0
        self._last_publish = 0
        self._sealed: list[SealedLedger] = []
        self._records = self._tombstones = self._keyless = 0
        self._closed = False

    # ------------------------------------------------------------------ appending

    def append(self, key: bytes | str | None, value: bytes | str | None,
               properties: Mapping[str, str] | None = None, event_time: int | None = None) -> None:
        """Append one record (``str`` keys and values are encoded as UTF-8).

        A ``None`` or empty value makes the record a tombstone for its key.
        """
        if isinstance(key, str):
            key = key.encode()
        if isinstance(value, str):
            value = value.encode()
        now = max(int(self._clock() * 1000), self._last_publish)
        self.send(Record(key, value, dict(properties or {}), now, event_time))

    def send(self, record: Record) -> None:
        """Append a prepared :class:`Record` (its publish time is kept)."""
        if self._closed:
            raise InvalidInputError("the writer is closed")
        validate_record(record)  # refuse it now, not when its batch is encoded
        self._batch.append(record)
        self._records += 1
        if record.key is None:
            self._keyless += 1
        elif not record.value:
            self._tombstones += 1
        in_ledger = self._ledger.n_records if self._ledger is not None else 0
        # An entry never makes a ledger exceed max_ledger_records.
        if len(self._batch) >= self.batch_size or in_ledger + len(self._batch) >= self.max_ledger_records:
            self._flush_batch()

    def _flush_batch(self) -> None:
        if not self._batch:
            return
        entry = encode_entry(self._batch, max_record_bytes=self.max_record_bytes)
        if self._ledger is None:
            self._buf = io.BytesIO()
            self._ledger = LedgerWriter(self._buf, kind=KIND_ORIGINAL,
                                        ledger_id=self._state.last_ledger_id + 1,
                                        created_ms=int(self._clock() * 1000))
            self._first_publish = min(r.publish_time for r in self._batch)
        self._ledger.add_entry(entry)
        self._last_publish = max(self._last_publish, entry.publish_time)
        self._batch = []
        if (self._ledger.n_records >= self.max_ledger_records
                or self._ledger.estimated_size >= self.max_ledger_bytes):
            self._seal()

    def flush(self) -> None:
        """Seal and register everything appended so far."""
        self._flush_batch()
        if self._ledger is not None:
            self._seal()

    # ------------------------------------------------------------------- sealing

    def _seal(self) -> None:
        ledger, buf = self._ledger, self._buf
        if ledger is None or buf is None:
            return
        ledger.finish()
        data = buf.getvalue()
        label = ledger.ledger_id
        store, topic = self.meta.topic.store, self.meta.topic
        nonce = uuid.uuid4().hex[:12]
        # Names whose registration had an unknown outcome: that write may still land, even
        # after a later read did not show it (a request can outlive the client's timeout),
        # so such an object is never deleted here and a later listing of it counts as ours.
        uncertain: set[str] = set()
        for attempt in range(self.register_attempts):
            state = self._state
            lid = state.last_ledger_id + 1
            if lid != label:
                data, label = relabel_ledger(data, lid), lid
            name = ledger_object_name(lid, nonce)
            key = topic.key(name)
            store.put(key, data)
            uploaded = time.monotonic()
            info = LedgerInfo(lid, name, ledger.n_entries, ledger.n_records, len(data),
                              self._first_publish, self._last_publish, int(self._clock() * 1000))
            try:
                if time.monotonic() - uploaded > UNREGISTERED_MAX_AGE_S:
                    raise ConflictError("upload too old to register safely")
                self._state = self.meta.append_ledger(info, state)
            except ConflictError:
                self._state = self.meta.load_topic()
                if self._registered(uncertain | {name}) is None:
                    if name not in uncertain:
                        store.delete(key)
                    time.sleep(random.uniform(0, min(0.5, 0.005 * 2 ** attempt)))
                    continue
            except (StateUnknownError, TransientStorageError):
                # The registration may have landed: the ledger list says.  Never delete
                # an object that might be registered; an unregistered one is left to
                # garbage collection.
                uncertain.add(name)
                self._state = self.meta.load_topic()
                if self._registered(uncertain) is None:
                    time.sleep(random.uniform(0, min(0.5, 0.005 * 2 ** attempt)))
                    continue
            got = self._registered(uncertain | {name})
            if got is not None and got.object != name:
                if name not in uncertain:
                    store.delete(key)  # an earlier upload landed late; this one is not needed
                lid, name = got.id, got.object
            self._sealed.append(SealedLedger(
                lid, name, ledger.n_records, ledger.n_entries, len(data), MessageId(lid, 0, 0),
                MessageId(lid, ledger.n_entries - 1, ledger.last_entry_records - 1),
            ))
            self._ledger = self._buf = None
            return
        raise ConflictError(
            f"{self.meta.uri}: could not register a ledger after {self.register_attempts} attempts; "
            "too many writers are appending to this topic at once")

    def _registered(self, names: set[str]) -> LedgerInfo | None:
        """The ledger list's entry for one of ``names`` (this writer's uploads), if any."""
        return next((lg for lg in self._state.ledgers if lg.object in names), None)

    # --------------------------------------------------------------------- closing

    @property
    def result(self) -> ProduceResult:
        return ProduceResult(self.meta.uri, tuple(self._sealed), self._records - len(self._batch)
                             - (self._ledger.n_records if self._ledger else 0), self._tombstones,
                             self._keyless)

    def close(self) -> ProduceResult:
        """Flush and stop accepting records; return what was appended."""
        if not self._closed:
            self.flush()
            self._closed = True
        return self.result

    def __enter__(self) -> TopicWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # Records already appended were accepted: seal them even if the caller failed later.
        self.close()
