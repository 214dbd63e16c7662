"""What a :class:`~shale.producer.writer.TopicWriter` appended: each ledger it sealed and
registered, and the totals ``shale produce`` prints."""

from __future__ import annotations

from shale.ledger.ids import MessageId
from shale.ledger.values import dataclass
from shale.settings.units import count

__all__ = ["ProduceResult", "SealedLedger"]


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
    #: the idempotent producer's id (None: none), and the records it skipped: those an
    #: earlier run with the same id had appended (the first ``skipped`` it was given)
    producer: str | None = None
    skipped: int = 0

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
            "producer": self.producer,
            "skipped": self.skipped,
        }

    def human(self) -> str:
        """One line for a person."""
        skipped = (f"; skipped the first {count(self.skipped, 'record')}, appended before by producer "
                   f"{self.producer!r}" if self.skipped else "")
        if not self.records:
            return f"{self.topic}: nothing appended{skipped}"
        return (f"{self.topic}: appended {count(self.records, 'record')} ({count(self.tombstones, 'tombstone')}, "
                f"{self.keyless:,} without a key) in {count(len(self.ledgers), 'ledger')} of "
                f"{count(sum(lg.bytes for lg in self.ledgers), 'byte')}, ids {self.first_id} to {self.last_id}"
                f"{skipped}")
