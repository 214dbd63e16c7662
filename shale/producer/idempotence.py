"""An idempotent producer (``shale produce --producer-id``, ``TopicWriter(producer_id=...)``):
a retried run skips what an earlier run with the same id appended, as Kafka's idempotent
producer drops a batch it already has.

A producer numbers the records it is given from 0, in order (for ``shale produce``: the
records of its input, blank lines aside).  Each ledger it seals is registered together
with its mark — the number after the ledger's last record — in the same compare-and-swap
of the ledger list (:class:`~shale.metadata.state.ProducerMark`), so the two never
disagree: a producer killed after uploading a ledger and before registering it left
neither, one killed after registering left both.  A writer opened with the id reads the
mark and skips every record numbered below it.  What is deduplicated is therefore a
prefix of the input, by position (not by content): a retry must give the same records
in the same order, and a different input needs an id of its own.  A mark is kept
``producer-expiry`` (default 7 days) after the last ledger it registered, by the
producer's clock; then the id is forgotten, and a run with it appends everything.

Two writers with one id at once: the second to register finds the mark past the start of
its ledger and stops (:class:`~shale.ledger.errors.ProducerFencedError`, exit 3), having
registered nothing of that ledger; running it again skips what the first appended.
"""

from __future__ import annotations

import re
from typing import Final

from shale.ledger.errors import InvalidInputError, ProducerFencedError
from shale.ledger.values import dataclass
from shale.metadata.schema import PRODUCER_ID
from shale.metadata.state import ProducerMark, TopicState
from shale.settings.units import count

__all__ = ["DEFAULT_PRODUCER_EXPIRY_MS", "ProducerSequence", "check_producer_id"]

#: How long a producer's mark is kept after its last registration (Kafka keeps a
#: transactional id 7 days: ``transactional.id.expiration.ms``).
DEFAULT_PRODUCER_EXPIRY_MS: Final = 7 * 24 * 3_600_000

_ID: Final = re.compile(PRODUCER_ID)


def check_producer_id(name: str) -> str:
    """``name`` if it can be a producer id, else an :class:`InvalidInputError` saying why."""
    if not _ID.fullmatch(name):
        raise InvalidInputError(f"producer id {name[:220]!r}: use 1 to 200 letters, digits or . _ : @ / + = -, "
                                "starting with a letter or a digit")
    return name


@dataclass(slots=True)
class ProducerSequence:
    """One writer's numbering of the records it is given, under producer id ``id``."""

    id: str
    expiry_ms: int
    #: records numbered below this were registered by an earlier run: skipped
    skip: int = 0
    #: records given so far (skipped or not)
    given: int = 0
    #: the number after the last record put in a ledger
    end: int = 0

    @classmethod
    def open(cls, producer_id: str, state: TopicState, now_ms: int, expiry_ms: int) -> ProducerSequence:
        """The sequence of a writer starting now on the topic ``state`` describes."""
        mark = state.producers.get(check_producer_id(producer_id))
        skip = mark.next if mark is not None and mark.live(now_ms, expiry_ms) else 0
        return cls(producer_id, expiry_ms, skip, 0, skip)

    @property
    def skipped(self) -> int:
        return min(self.given, self.skip)

    def give(self, n: int) -> int:
        """``n`` more records are given: how many of them (the first ones) to skip."""
        skip = max(0, min(n, self.skip - self.given))
        self.given += n
        return skip

    def mark(self, state: TopicState, ledger_id: int, records: int, now_ms: int) -> tuple[str, ProducerMark]:
        """The mark to register with ledger ``ledger_id`` (its last ``records`` records
        put in a ledger, numbered up to :attr:`end`) on ``state``:
        :class:`ProducerFencedError` when another writer with this id registered some of
        them meanwhile."""
        first = self.end - records
        found = state.producers.get(self.id)
        if found is not None and found.live(now_ms, self.expiry_ms) and found.next > first:
            raise ProducerFencedError(
                f"producer {self.id!r}: another writer with this id registered records {first:,} to "
                f"{found.next - 1:,} first (ledger {found.ledger}), {count(records, 'record')} of this ledger "
                "among them; nothing of it was registered. Give each writer its own producer id; running this "
                "one again skips what the other appended")
        return self.id, ProducerMark(self.end, ledger_id, now_ms)
