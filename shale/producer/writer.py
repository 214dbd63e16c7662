"""The producer side: append records to a topic as sealed, registered ledgers.

Records are batched into entries (``batch_size`` records each, or fewer once they reach
``max_entry_bytes``), each compressed with the topic's compression (``compression``, else
the topic's policy, else zstd level 1), and entries into a ledger object built in memory.
A ledger is sealed when it reaches ``max_ledger_records`` or ``max_ledger_bytes``, when
its oldest record has waited ``max_ledger_age_ms`` (:mod:`shale.producer.linger`), or on
:meth:`TopicWriter.flush`: it is uploaded under a unique name, then registered in the
topic's ledger list with one compare-and-swap (with a ``producer_id``, together with the
producer's mark: :mod:`shale.producer.idempotence`).  A writer that loses the race to
another writer re-labels its ledger with the next free id, uploads it again and retries;
ledgers are never lost or interleaved.
"""

from __future__ import annotations

import functools
import io
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import field
from types import TracebackType
from typing import Any, Final

import numpy as np

from shale.ledger.codecs import DEFAULT_COMPRESSION, Buffer, Codec, Compression, parse_compression
from shale.ledger.encoder import EncodedColumns, RecordColumns, Refused, encode_columns, entry_end
from shale.ledger.errors import (
    ConflictError,
    InvalidInputError,
    RecordTooLargeError,
    StorageError,
    TopicNotFoundError,
)
from shale.ledger.format import FLAG_HAS_KEY, FLAG_TOMBSTONE, KIND_ORIGINAL
from shale.ledger.ids import MessageId
from shale.ledger.record import (
    DEFAULT_MAX_RECORD_BYTES,
    EVENT_TIME_MAX_MS,
    EVENT_TIME_RANGE,
    Record,
    check_record_size,
    event_time_in_range,
    validate_record,
)
from shale.ledger.values import dataclass
from shale.ledger.writer import EncodedEntry, LedgerWriter, encode_entry, relabel_ledger
from shale.metadata.dictionaries import resolve_compression
from shale.metadata.handle import Topic
from shale.metadata.layout import ledger_object_name
from shale.metadata.state import LedgerInfo, TopicState
from shale.producer.columns import DEFAULT_KEY_FIELD, DEFAULT_VALUE_FIELD, Fields, check_event_times, record_columns
from shale.producer.compressing import Compressed, Compressing
from shale.producer.idempotence import DEFAULT_PRODUCER_EXPIRY_MS, ProducerSequence
from shale.producer.linger import Linger
from shale.producer.result import ProduceResult, SealedLedger
from shale.storage import Location, StorageOptions

__all__ = ["ProduceResult", "SealedLedger", "TopicWriter"]

#: Records are sealed into an entry once they come to about this many bytes (or
#: ``batch_size`` records): entries compress well from a few KiB, and a reader seeking to
#: one record decompresses its entry only.
DEFAULT_MAX_ENTRY_BYTES: Final = 1 << 20

#: An uploaded ledger older than this is not registered any more (garbage collection may
#: treat unregistered objects older than its orphan grace as leftovers); it is re-uploaded.
UNREGISTERED_MAX_AGE_S: Final = 300.0


@dataclass(slots=True)
class _Upload:
    """A sealed ledger between registration attempts: its bytes (re-labelled when another
    writer took its id), its unique name suffix, the name of its latest upload, and the
    names whose registration had an unknown outcome: such a write may still land, even
    after a later read did not show it (a request can outlive the client's timeout), so
    such an object is never deleted here and a later listing of it counts as this
    writer's."""

    data: bytes
    label: int
    nonce: str
    uncertain: set[str] = field(default_factory=set)
    pending: str | None = None

    @property
    def names(self) -> set[str]:
        """Every name under which this ledger may be registered."""
        return self.uncertain | ({self.pending} if self.pending else set())

    def unknown(self, _error: StorageError) -> None:
        """The latest registration's outcome is unknown: its object is never deleted."""
        if self.pending:
            self.uncertain.add(self.pending)

    def drop_pending(self, topic: Location) -> None:
        """Delete the latest upload, known not to be registered (unless it is uncertain)."""
        if self.pending is not None and self.pending not in self.uncertain:
            topic.store.delete(topic.key(self.pending))
        self.pending = None


def _registered(state: TopicState, names: set[str]) -> LedgerInfo | None:
    """The ledger list's entry for one of ``names`` (this writer's uploads), if any."""
    return next((lg for lg in state.ledgers if lg.object in names), None)


def _too_large(cols: RecordColumns, row: int, first: int, limit: int, key: str, value: str) -> str:
    sizes = {key: int(cols.key.lengths()[row]), value: int(cols.value.lengths()[row])}
    name = max(sizes, key=lambda k: sizes[k])
    return (f"column {name!r}, row {first + row}: {sizes[name]:,} bytes make a record over the maximum of "
            f"{limit:,} bytes")


def _size(b: bytes | bytearray | memoryview | None) -> int:
    return 0 if b is None else memoryview(b).nbytes


def _existing(topic: Topic) -> TopicState | None:
    """The topic's ledger list as its handle holds it (None: there is no topic yet)."""
    try:
        return topic.state
    except TopicNotFoundError:
        return None


class TopicWriter:
    """Appends records to a topic; use it as a context manager (closing flushes).

    ``topic_uri``: the topic's URI, or its handle (:class:`~shale.metadata.handle.Topic`,
    whose ledger list and policy it starts from rather than reading them again).
    ``storage_options`` say how to reach the topic's storage
    (:class:`~shale.storage.StorageOptions`; read from the environment when not given).

    ``max_ledger_age_ms`` (None: the topic's ``max-ledger-age`` policy, else 0) seals the
    ledger once its oldest record has waited that long, when a record is appended or
    :meth:`seal_if_due` is called (a writer left idle seals nothing by itself).
    ``producer_id`` makes the writer idempotent: the records it is given are numbered from
    0, and those an earlier writer with the id registered are skipped
    (:mod:`shale.producer.idempotence`; its mark is kept ``producer_expiry_ms``, None: the
    topic's ``producer-expiry`` policy, else 7 days).

    >>> with TopicWriter("/tmp/topics/users") as w:          # doctest: +SKIP
    ...     w.append(b"user-1", b"alice@example.com")
    >>> w.result.last_id                                      # doctest: +SKIP
    """

    def __init__(
        self,
        topic_uri: str | Topic,
        *,
        metadata_uri: str | None = None,
        max_ledger_records: int = 500_000,
        max_ledger_bytes: int = 64 * 1024 * 1024,
        batch_size: int = 1000,
        max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES,
        compression: Compression | str | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        register_attempts: int = 50,
        clock: Callable[[], float] = time.time,
        storage_options: StorageOptions | None = None,
        max_ledger_age_ms: int | None = None,
        producer_id: str | None = None,
        producer_expiry_ms: int | None = None,
    ) -> None:
        if max_ledger_records < 1 or max_ledger_bytes < 1 or batch_size < 1 or max_entry_bytes < 1:
            raise InvalidInputError("max ledger records, max ledger bytes, max entry bytes and batch size must be >= 1")
        topic = topic_uri if isinstance(topic_uri, Topic) else Topic.open(topic_uri, metadata_uri, storage_options)
        self.meta = topic.meta
        if isinstance(compression, str):
            compression = parse_compression(compression)
        policy = topic.policy
        self._compression = resolve_compression(self.meta, compression or policy.compression or DEFAULT_COMPRESSION)
        #: seals the ledger once its oldest record has waited this long
        self.linger = Linger(max_ledger_age_ms if max_ledger_age_ms is not None
                             else int(policy.get("max_ledger_age_ms") or 0))
        self.max_entry_bytes = max_entry_bytes
        self._batch_bytes = 0
        self.max_ledger_records = max_ledger_records
        self.max_ledger_bytes = max_ledger_bytes
        self.batch_size = batch_size
        self.max_record_bytes = max_record_bytes
        self.register_attempts = register_attempts
        self._clock = clock
        self._state: TopicState = _existing(topic) or self.meta.create_topic()
        #: the idempotent producer's numbering (None: not idempotent)
        self.sequence = None if producer_id is None else ProducerSequence.open(
            producer_id, self._state, int(clock() * 1000), producer_expiry_ms if producer_expiry_ms is not None
            else int(policy.get("producer_expiry_ms") or DEFAULT_PRODUCER_EXPIRY_MS))
        self._batch: list[Record] = []
        #: entries of :meth:`append_batch` being compressed (added to the ledger in order)
        self._compressing = Compressing()
        self._buf: io.BytesIO | None = None
        self._ledger: LedgerWriter | None = None
        self._first_publish = 0
        self._last_publish = 0
        self._sealed: list[SealedLedger] = []
        self._records = self._tombstones = self._keyless = 0
        self._closed = False

    @property
    def ledger_records(self) -> int:
        """Records in the ledger being built (appended, not sealed yet)."""
        return ((self._ledger.n_records if self._ledger is not None else 0) + self._compressing.records
                + len(self._batch))

    @property
    def compression(self) -> Compression:
        """How new entries are compressed: as asked, else as the topic's policy says, else
        the default.  Setting it changes the codec from the next entry on (one ledger may
        mix codecs)."""
        return self._compression

    @compression.setter
    def compression(self, value: Compression | str) -> None:
        self._compression = resolve_compression(self.meta, parse_compression(value) if isinstance(value, str)
                                                else value)
        if self._ledger is not None:
            self._ledger.compression = self._compression

    # ------------------------------------------------------------------ appending

    def append(self, key: bytes | str | None, value: bytes | str | None,
               properties: Mapping[str, str] | None = None, event_time: int | None = None) -> None:
        """Append one record (``str`` keys and values are encoded as UTF-8).

        A ``None`` or empty value makes the record a tombstone for its key.  ``event_time``
        is in milliseconds since the Unix epoch, within
        :data:`~shale.ledger.record.EVENT_TIME_RANGE` (years 0001 to 9999).
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
        # refuse it now, not when its batch is encoded: the records before it stay good
        validate_record(record)
        # times every reader of an export can hold (the format itself would take any int64)
        if record.event_time is not None and not event_time_in_range(record.event_time):
            raise InvalidInputError(f"event time {record.event_time} is outside {EVENT_TIME_RANGE}")
        if record.publish_time > EVENT_TIME_MAX_MS:
            raise InvalidInputError(f"publish time {record.publish_time} is after year 9999 "
                                    f"({EVENT_TIME_MAX_MS} ms)")
        check_record_size(record, self.max_record_bytes)
        self._land(self._compressing.drain())  # (the ledger's count below must hold them)
        if self.sequence is not None and self.sequence.give(1):
            return  # appended before, by an earlier writer with this producer id
        self.linger.pending()
        self._batch.append(record)
        # (an upper bound of the record's encoded size: exact sizes are known once encoded)
        self._batch_bytes += 32 + _size(record.key) + _size(record.value) + sum(
            len(k) + len(v) + 4 for k, v in (record.properties or {}).items())
        self._records += 1
        if record.key is None:
            self._keyless += 1
        elif not record.value:
            self._tombstones += 1
        in_ledger = self._ledger.n_records if self._ledger is not None else 0
        # An entry never makes a ledger exceed max_ledger_records.
        if (len(self._batch) >= self.batch_size or self._batch_bytes >= self.max_entry_bytes
                or in_ledger + len(self._batch) >= self.max_ledger_records):
            self._flush_batch()
        self.seal_if_due()

    def append_batch(self, data: Any, *, key: str = DEFAULT_KEY_FIELD, value: str = DEFAULT_VALUE_FIELD,
                     properties: str | None = None, event_time: str | None = None) -> int:
        """Append a batch of records given as columns; return how many.

        ``data`` is a pyarrow ``Table`` or ``RecordBatch``, or a mapping of column name to
        a Python sequence.  ``key`` and ``value`` name binary or text columns (null: no
        key; null or empty value: a tombstone), ``properties`` a map of text to text and
        ``event_time`` a timestamp or integer milliseconds column (within
        :data:`~shale.ledger.record.EVENT_TIME_RANGE`, years 0001 to 9999).  The records get one
        publish time and are sealed into entries (and ledgers) as :meth:`append` would,
        without a Python call per record.  The whole batch is checked first: a problem is
        an :class:`InvalidInputError` naming the column and row, and nothing of the batch
        is appended.  The batch's last entries may still be compressing when this returns
        (on other threads, while the caller prepares its next batch): they come before
        anything appended later, and :meth:`settle`, :meth:`flush` and :meth:`close` wait
        for them; a batch that fills the ledger seals it before it returns.
        """
        if self._closed:
            raise InvalidInputError("the writer is closed")
        batches = record_columns(data, Fields(key, value, properties, event_time))
        now = max(int(self._clock() * 1000), self._last_publish)
        encoded = []
        first = 0
        for cols in batches:
            check_event_times(cols, event_time, first)
            got = encode_columns(cols, now, self.max_record_bytes)
            if isinstance(got, Refused) and got.why == "size":
                raise RecordTooLargeError(_too_large(cols, got.row, first, self.max_record_bytes, key, value))
            if isinstance(got, Refused):
                raise InvalidInputError(f"column {properties!r}, row {first + got.row}: a property is named twice")
            encoded.append(got)
            first += len(cols)
        self._flush_batch()  # records appended one by one before come first
        for enc in encoded:
            self._add_encoded(enc, 0 if self.sequence is None else self.sequence.give(len(enc.offsets)))
        self.seal_if_due()
        return first

    def _add_encoded(self, enc: EncodedColumns, skip: int = 0) -> None:
        """Add the records of ``enc`` but its first ``skip`` (appended before by this
        producer id) as entries."""
        n = len(enc.offsets)
        if skip < n:
            self.linger.pending()
        self._keyless += int(np.count_nonzero((enc.flags[skip:] & FLAG_HAS_KEY) == 0))
        self._tombstones += int(np.count_nonzero(enc.flags[skip:] == FLAG_HAS_KEY | FLAG_TOMBSTONE))
        # Entry boundaries first, counting as if no ledger were sealed early for its size
        # (an early seal only leaves more room: no entry can overflow a ledger).
        # Entries still being compressed come first.
        bounds: list[tuple[int, int]] = []
        i = skip
        in_ledger = ((self._ledger.n_records if self._ledger is not None else 0) + self._compressing.records) \
            % self.max_ledger_records
        while i < n:
            j = entry_end(enc, i, min(self.batch_size, self.max_ledger_records - in_ledger), self.max_entry_bytes)
            bounds.append((i, j))
            in_ledger = (in_ledger + j - i) % self.max_ledger_records
            i = j
        # Left compressing when this returns (the caller's next batch overlaps with it),
        # unless they may fill the ledger: a batch that fills one seals it before it returns.
        self._land(self._compressing.submit(enc, bounds, self.compression))
        ledger = self._ledger
        if ((ledger.n_records if ledger else 0) + self._compressing.records >= self.max_ledger_records
                or (ledger.estimated_size if ledger else 0) + self._compressing.bytes >= self.max_ledger_bytes):
            self.settle()

    def _land(self, entries: Iterator[Compressed]) -> None:
        """Add compressed entries to the ledger, in order."""
        try:
            for entry, packed in entries:
                self._records += entry.n_records
                self._add_entry(entry, entry.publish_time, packed)
        except BaseException:
            self._compressing.discard()
            raise

    def _flush_batch(self) -> None:
        if not self._batch:
            return
        self._land(self._compressing.drain())  # the entries of batches appended before come first
        entry = encode_entry(self._batch, max_record_bytes=self.max_record_bytes)
        first_publish = min(r.publish_time for r in self._batch)
        self._batch = []
        self._batch_bytes = 0
        self._add_entry(entry, first_publish)

    def _add_entry(self, entry: EncodedEntry, first_publish: int,
                   compressed: tuple[Codec, Buffer] | None = None) -> None:
        if self._ledger is None:
            self._buf = io.BytesIO()
            self._ledger = LedgerWriter(self._buf, kind=KIND_ORIGINAL, ledger_id=self._next_label(),
                                        created_ms=int(self._clock() * 1000), compression=self.compression)
            self._first_publish = first_publish
            self.linger.pending()  # (after a seal inside a batch, the rest of it waits from now)
        before = self._ledger.n_records
        self._ledger.add_entry(entry, compressed=compressed)
        if self.sequence is not None:
            self.sequence.end += self._ledger.n_records - before
        self._last_publish = max(self._last_publish, entry.publish_time)
        if (self._ledger.n_records >= self.max_ledger_records
                or self._ledger.estimated_size >= self.max_ledger_bytes):
            self._seal()

    def settle(self) -> None:
        """Add the entries still being compressed to the ledger, sealing it if they fill it
        (what a caller does before it waits for more records: :meth:`append_batch` returns
        while its last entries are compressed)."""
        self._land(self._compressing.drain())

    def flush(self) -> None:
        """Seal and register everything appended so far."""
        self._land(self._compressing.drain())
        self._flush_batch()
        if self._ledger is not None:
            self._seal()
        self.linger.sealed()

    def linger_due(self) -> float | None:
        """Seconds until what was appended must be sealed (0: now; None: nothing was, or
        the writer has no ``max_ledger_age_ms``)."""
        return self.linger.due()

    def seal_if_due(self) -> None:
        """Seal and register what was appended if its oldest record has waited
        ``max_ledger_age_ms`` (what a loop that also waits for other things calls)."""
        if self.linger.due() == 0.0:
            self.flush()

    # ------------------------------------------------------------------- sealing

    def _next_label(self) -> int:
        """The id a new ledger is labelled with (re-labelled if taken when registered)."""
        return self._state.last_ledger_id + 1

    def _seal(self) -> None:
        ledger, buf = self._ledger, self._buf
        if ledger is None or buf is None:
            return
        ledger.finish()
        upload = _Upload(buf.getvalue(), ledger.ledger_id, uuid.uuid4().hex[:12])
        try:
            self._state = self.meta.update_topic(functools.partial(self._with_ledger, ledger, upload),
                                                 current=self._state, attempts=self.register_attempts,
                                                 what="registering a ledger", on_unknown=upload.unknown)
        except ConflictError as exc:
            # The last attempt lost, or its outcome is unknown: an upload may be registered all the same.
            self._state = self.meta.load_topic()
            if _registered(self._state, upload.names) is None:
                upload.drop_pending(self.meta.topic)
                raise ConflictError(
                    f"{self.meta.uri}: could not register a ledger after {self.register_attempts} attempts; "
                    "too many writers are appending to this topic at once") from exc
        got = _registered(self._state, upload.names)
        assert got is not None  # the list written, or read, holds one of this writer's uploads
        if got.object != upload.pending:
            upload.drop_pending(self.meta.topic)  # an earlier upload landed late; this one is not needed
        lid, name = got.id, got.object
        self._sealed.append(SealedLedger(
            lid, name, ledger.n_records, ledger.n_entries, len(upload.data), MessageId(lid, 0, 0),
            MessageId(lid, ledger.n_entries - 1, ledger.last_entry_records - 1),
        ))
        self._ledger = self._buf = None
        if not self._batch:
            self.linger.sealed()

    def _with_ledger(self, ledger: LedgerWriter, upload: _Upload, state: TopicState) -> TopicState | None:
        """The ledger list ``state`` with the ledger uploaded as its next free id (the change
        :meth:`~shale.metadata.topic.TopicMetadata.update_topic` swaps in, again on a fresh
        list after a conflict), or ``None`` when one of this writer's uploads is registered already (a
        registration whose outcome was unknown landed after all).

        A registration whose outcome is unknown may have landed: the ledger list read
        again says, and an object that might be registered is never deleted (an
        unregistered one is left to garbage collection)."""
        if _registered(state, upload.names) is not None:
            return None
        topic = self.meta.topic
        upload.drop_pending(topic)  # the last attempt lost its race: nothing names its upload
        lid = state.last_ledger_id + 1
        now_ms = int(self._clock() * 1000)
        # (before the upload: a writer fenced off by another with its producer id uploads nothing)
        mark = None if self.sequence is None else self.sequence.mark(state, lid, ledger.n_records, now_ms)
        if lid != upload.label:
            upload.data, upload.label = relabel_ledger(upload.data, lid), lid
        name = ledger_object_name(lid, upload.nonce)
        topic.store.put(topic.key(name), upload.data)
        upload.pending = name
        uploaded = time.monotonic()
        info = LedgerInfo(lid, name, ledger.n_entries, ledger.n_records, len(upload.data),
                          self._first_publish, self._last_publish, now_ms, len(upload.data) + ledger.bytes_saved)
        if time.monotonic() - uploaded > UNREGISTERED_MAX_AGE_S:
            raise ConflictError("upload too old to register safely")
        return self.meta.appended(state, info, mark, None if self.sequence is None else self.sequence.expiry_ms)

    # --------------------------------------------------------------------- closing

    @property
    def result(self) -> ProduceResult:
        seq = self.sequence
        return ProduceResult(self.meta.uri, tuple(self._sealed), self._records - len(self._batch)
                             - (self._ledger.n_records if self._ledger else 0), self._tombstones,
                             self._keyless, None if seq is None else seq.id, 0 if seq is None else seq.skipped)

    def close(self) -> ProduceResult:
        """Flush and stop accepting records; return what was appended."""
        if not self._closed:
            try:
                self.flush()
            finally:
                self._compressing.close()
            self._closed = True
        return self.result

    def __enter__(self) -> TopicWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # Records already appended were accepted: seal them even if the caller failed later.
        self.close()
