"""Message ids: ``(ledger id, entry id, batch index)``, totally ordered.

The one text form is ``"<ledger>:<entry>:<batch>"`` (e.g. ``"3:17:0"``), each part in
decimal without a sign, a leading zero or spaces around: an id has exactly one spelling,
so one given by a person or found in a document is compared, shown and stored as it was
written.
"""

from __future__ import annotations

import re
from typing import Final

from shale.ledger.errors import InvalidInputError
from shale.ledger.values import dataclass

__all__ = ["MAX_ID", "MIN_ID", "MessageId"]

# ASCII digits only, at most as many as each part's range holds (20, 20, 10), so that a
# text of thousands of digits is refused as what it is rather than converted
_ID_RE: Final = re.compile(r"(0|[1-9][0-9]{0,19}):(0|[1-9][0-9]{0,19}):(0|[1-9][0-9]{0,9})", re.ASCII)
_U64: Final = (1 << 64) - 1
_U32: Final = (1 << 32) - 1


@dataclass(frozen=True, slots=True, order=True)
class MessageId:
    """The permanent identity of a record: it never changes, compaction included."""

    ledger: int
    entry: int
    batch: int = 0

    def __post_init__(self) -> None:
        if not (0 <= self.ledger <= _U64 and 0 <= self.entry <= _U64 and 0 <= self.batch <= _U32):
            raise InvalidInputError(f"message id out of range: {self.ledger}:{self.entry}:{self.batch}")

    def __str__(self) -> str:
        return f"{self.ledger}:{self.entry}:{self.batch}"

    @classmethod
    def parse(cls, text: str) -> MessageId:
        """Parse the text form ``"ledger:entry:batch"`` (nothing else: no spaces around, no
        leading zero); raise :class:`InvalidInputError`."""
        m = _ID_RE.fullmatch(text) if isinstance(text, str) else None
        shown = str(text) if len(str(text)) <= 40 else str(text)[:37] + "..."
        if m is None:
            raise InvalidInputError(
                f"bad message id {shown!r}: expected LEDGER:ENTRY:BATCH, e.g. 3:17:0, in decimal without spaces "
                "or leading zeros (LEDGER and ENTRY below 2^64, BATCH below 2^32)"
            )
        ledger, entry, batch = (int(g) for g in m.groups())
        if ledger > _U64 or entry > _U64 or batch > _U32:
            raise InvalidInputError(f"message id {shown!r} is out of range: LEDGER and ENTRY are below 2^64, "
                                    "BATCH below 2^32")
        return cls(ledger, entry, batch)

    def successor(self) -> MessageId:
        """The smallest id strictly greater than this one."""
        if self.batch < _U32:
            return MessageId(self.ledger, self.entry, self.batch + 1)
        return MessageId(self.ledger, self.entry + 1, 0)

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.ledger, self.entry, self.batch)


MIN_ID: Final = MessageId(0, 0, 0)
MAX_ID: Final = MessageId(_U64, _U64, _U32)
