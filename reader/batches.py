"""Messages in batches: consecutive records of one ledger or part as an Arrow record batch.

The batch form of a read (:meth:`TopicReader.message_batches
<shale.reader.TopicReader.message_batches>`, :meth:`~shale.reader.TopicReader.read_batches`)
gives :class:`MessageBatch` objects: the records as Arrow columns
(:mod:`shale.reader.arrow`), decoded a whole entry at a time without a Python object per
record, and where a reader stands after each of them, so that a consumer that handles
part of a batch knows the position to commit or to resume from.  :meth:`MessageBatch.messages`
makes the :class:`~shale.ledger.record.Message` objects when they are wanted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from shale.ledger.ids import MessageId
from shale.ledger.record import Message
from shale.ledger.values import dataclass

if TYPE_CHECKING:
    import pyarrow as pa

    from shale.reader.topic_reader import TopicReader

__all__ = ["BATCH_READ_RECORDS", "MessageBatch", "batch_messages", "records_ahead"]

#: A read of fewer records than this is read message by message where either would do:
#: below it, importing pyarrow and starting the decoding threads cost more than the
#: batches save (about 5 µs a record).
BATCH_READ_RECORDS: Final = 10_000


@dataclass(frozen=True, slots=True)
class MessageBatch:
    """Consecutive messages of one ledger or compacted part (``records``: the columns of
    :mod:`shale.reader.arrow`), in id order.  ``ledger_last``: the id of the last record
    of its ledger when that is an original ledger (past it, a reader stands at the next
    ledger's first id), else None."""

    records: pa.RecordBatch
    ledger_last: MessageId | None = None

    def __len__(self) -> int:
        return int(self.records.num_rows)

    def id(self, row: int) -> MessageId:
        """The message id of row ``row``."""
        col = self.records.column
        return MessageId(col("ledger")[row].as_py(), col("entry")[row].as_py(), col("batch")[row].as_py())

    def after(self, row: int) -> MessageId:
        """Where a reader stands once it has handed out rows up to ``row``: past that
        message, or at the next ledger's first id past an original ledger's last record
        (as :class:`~shale.reader.TopicReader` stands after a message)."""
        mid = self.id(row)
        if mid == self.ledger_last:
            return MessageId(mid.ledger + 1, 0, 0)
        return mid.successor()

    def head(self, rows: int) -> MessageBatch:
        """The first ``rows`` rows."""
        return MessageBatch(self.records.slice(0, rows), self.ledger_last)

    def messages(self) -> list[Message]:
        """The rows as :class:`~shale.ledger.record.Message` objects."""
        return batch_messages(self.records)


def _binary(values: list[Any]) -> list[bytes | None]:
    """Keys or values as bytes (a batch read with ``utf8`` holds them as text)."""
    return [v.encode("utf-8") if isinstance(v, str) else v for v in values]


def batch_messages(records: pa.RecordBatch) -> list[Message]:
    """The rows of a record batch of :mod:`shale.reader.arrow`'s columns as messages, each
    exactly as a reader decoding the record gives it (properties as a dict, in the order
    the record holds them: a name given twice keeps its first place and its last text)."""
    import pyarrow as pa

    col = records.column
    ids = zip(col("ledger").to_pylist(), col("entry").to_pylist(), col("batch").to_pylist(), strict=True)
    fields = zip(_binary(col("key").to_pylist()), _binary(col("value").to_pylist()), col("properties").to_pylist(),
                 col("publish_time").view(pa.int64()).to_pylist(), col("event_time").view(pa.int64()).to_pylist(),
                 strict=True)
    return [Message(MessageId(*mid), key, value, dict(props or ()), publish, event)
            for mid, (key, value, props, publish, event) in zip(ids, fields, strict=True)]


def records_ahead(reader: TopicReader) -> int:
    """About how many records ``reader`` has to read from its position to the end of the
    topic as it lists it (the ledgers it reads from; the compacted parts too when it
    reads the compacted view from below their horizon), from the metadata alone."""
    position = reader.position
    count = sum(lg.records for lg in reader.topic.ledgers if lg.id >= position.ledger)
    horizon = reader.compaction.horizon
    if reader.read_compacted and horizon is not None and position <= horizon:
        count += sum(part.records for part in reader.compaction.parts)
    return count
