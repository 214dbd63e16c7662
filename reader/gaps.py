"""Records a reader had yet to read that retention removed: when that is a gap, and what
a reader does about it.

Retention (``shale truncate``, a ``retention`` policy) removes the oldest ledgers of a
topic, always a prefix: after it every ledger id up to the topic's ``removed_through``
is gone for good (ids are never reused).  A reader whose next position lies at or below
that id would otherwise go on at the oldest ledger left and skip the removed records in
silence.  It is a **gap** when the reader was positioned there by the records it read or
by an explicit start id; a reader opened at ``earliest`` that has read nothing yet
simply starts at the oldest record left (Kafka's log start offset), and a reader that
read a removed ledger to its end lost nothing.

What then happens is the reader's ``on_gap`` choice (Kafka's ``auto.offset.reset`` for an
offset out of range, which is never silent either):

* ``error`` (the default): reading raises :class:`~shale.ledger.errors.GapError` naming
  the range, and keeps raising it until the reader is moved (``seek``);
* ``skip``: reading goes on at the first id past the range, and the reader says so;
* ``compacted``: the removed range is read from the newest compacted view instead (the
  latest value of each key whose latest record, as of the horizon, lies in it, in id
  order), then the original records above it.  What the view does not hold (records
  removed above the horizon by ``truncate --allow-uncompacted``) is still a gap, raised.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Literal

from shale.ledger.errors import GapError, InvalidInputError
from shale.ledger.ids import MessageId
from shale.ledger.values import dataclass
from shale.metadata.view import log_start

__all__ = ["ON_GAP_CHOICES", "Gap", "GapListener", "OnGap", "check_on_gap", "log_gap", "log_start"]

OnGap = Literal["error", "skip", "compacted"]
ON_GAP_CHOICES: Final[tuple[OnGap, ...]] = ("error", "skip", "compacted")

_REMEDY: Final = ("on-gap skip goes on there; on-gap compacted reads the latest value of their keys from the compacted "
                  "view")


def check_on_gap(value: str) -> OnGap:
    """``value`` if it is one of :data:`ON_GAP_CHOICES`, else a usage error naming it."""
    for choice in ON_GAP_CHOICES:
        if value == choice:
            return choice
    raise InvalidInputError(f"on_gap={value!r}: expected one of {', '.join(ON_GAP_CHOICES)}")


@dataclass(frozen=True, slots=True)
class Gap:
    """Records with ids from ``first`` up to the end of ledger ``through`` were removed
    before a reader read them.  ``how``: what the reader did about it (``skipped``, read
    from the ``compacted`` view, or ``stopped``: an error)."""

    topic: str
    first: MessageId
    through: int
    how: Literal["skipped", "compacted", "stopped"] = "stopped"
    #: the compaction horizon, when the view was read in their place or could not hold them
    horizon: MessageId | None = None
    #: the compacted view does not hold them: they were removed above its horizon
    uncovered: bool = False
    #: how a reader stopped at the gap goes on (default: the ``on_gap`` choices)
    remedy: str = ""

    @property
    def resume(self) -> MessageId:
        """The first id past the range: where reading goes on."""
        return MessageId(self.through + 1, 0, 0)

    @property
    def range(self) -> str:
        """``3:0:0 to 7:…``: the first id gone and the last removed ledger (the id of its
        last record is not known once the ledger is gone)."""
        return f"{self.first} to {self.through}:…"

    def human(self) -> str:
        """One line for a person: the range, and what was done or may be done about it."""
        head = f"{self.topic}: records {self.range} were removed (retention) before this reader read them"
        if self.how == "skipped":
            return f"{head}; skipped to {self.resume}"
        if self.how == "compacted":
            return (f"{head}; read the latest value of their keys from the compacted view instead "
                    f"(horizon {self.horizon})")
        if self.uncovered:
            held = f"above the compaction horizon {self.horizon}" if self.horizon else "and no compaction ran"
            return (f"{head}, {held}, so no compacted view holds them (truncate --allow-uncompacted); "
                    f"the topic goes on at {self.resume} ({self.remedy or 'on-gap skip goes on there'})")
        return (f"{head}; the topic goes on at {self.resume} ({self.remedy or _REMEDY})")

    def error(self) -> GapError:
        """The error a reader raises for this gap (exit code 6 on the command line)."""
        return GapError(self.human(), first=str(self.first))


#: Told of each gap a reader went past (``skip`` or ``compacted``).
GapListener = Callable[[Gap], None]


def log_gap(gap: Gap) -> None:
    """The default listener: one warning on the ``shale.reader`` logger (which Python
    prints on standard error when the application configured no logging)."""
    import logging  # (here: a read that meets none imports no logging)

    logging.getLogger("shale.reader").warning("%s", gap.human())
