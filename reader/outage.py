"""Riding out storage outages: a reader whose store stops answering (5xx, throttling,
timeouts, resets, refused connections: :class:`~shale.ledger.errors.TransientStorageError`
once the store's own retries ran out) tries again with backoff, for ``retry_for`` seconds
(a follower: for ever), instead of giving up — as a Kafka consumer reconnects.

Each outage is told once when it starts and once when it ends (:class:`Outage`, to the
reader's ``outage_listener``; default: a warning on the ``shale.reader`` logger), not at
every attempt.  The waits double from the reader's poll interval up to 30 seconds.  A read
tried again starts from the reader's position, as after any failure: nothing is skipped
or read twice.  Past ``retry_for`` the last error is raised, saying how long storage was
unreachable.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Final, TypeVar

from shale.ledger.errors import TransientStorageError, error_line
from shale.ledger.values import dataclass

__all__ = ["MAX_WAIT_S", "Outage", "OutageListener", "Rider", "log_outage"]

#: The longest wait between two attempts during an outage.
MAX_WAIT_S: Final = 30.0

_T = TypeVar("_T")


def _for(retry_for: float) -> str:
    return "until it is back" if math.isinf(retry_for) else f"for up to {retry_for:g}s (retry-for)"


@dataclass(frozen=True, slots=True)
class Outage:
    """Storage stopped answering ``topic``'s reader (``ended`` False: it just did; True:
    it answers again, after ``seconds``).  ``error`` is the first failure."""

    topic: str
    error: str
    seconds: float = 0.0
    ended: bool = False
    retry_for: float = math.inf

    def human(self) -> str:
        if self.ended:
            return f"{self.topic}: storage reachable again after {self.seconds:.1f}s; reading on"
        return f"{self.topic}: storage unreachable ({self.error}); trying again {_for(self.retry_for)}"


#: Told of each outage twice: when it starts and when it ends.
OutageListener = Callable[[Outage], None]


def log_outage(outage: Outage) -> None:
    """The default listener: a warning on the ``shale.reader`` logger."""
    import logging  # (here: a read that meets none imports no logging)

    logging.getLogger("shale.reader").warning("%s", outage.human())


class Rider:
    """Calls a reader's reads through outages of ``topic``'s storage (see the module)."""

    def __init__(self, topic: str, retry_for: float, listener: OutageListener, *, first_wait: float,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], Any] = time.sleep,
                 give_up: Callable[[], bool] | None = None) -> None:
        self.topic, self.retry_for, self.listener = topic, retry_for, listener
        #: asked at each failure: True ends the outage's retries at once (a follow stopped)
        self._give_up = give_up or (lambda: False)
        self.first_wait = max(first_wait, 0.01)
        self._clock, self._sleep = clock, sleep
        self._since: float | None = None
        self._error = ""
        self._attempts = 0

    def call(self, read: Callable[[], _T]) -> _T:
        """``read()``, tried again through an outage for at most ``retry_for`` seconds."""
        while True:
            try:
                result = read()
            except TransientStorageError as e:
                self._failed(e)
                continue
            if self._since is not None:
                self.listener(Outage(self.topic, self._error, self._clock() - self._since, True, self.retry_for))
                self._since, self._attempts = None, 0
            return result

    def _failed(self, e: TransientStorageError) -> None:
        """Wait before the next attempt, or raise ``e`` once the outage lasted ``retry_for``."""
        if self.retry_for <= 0 or self._give_up():
            raise e
        now = self._clock()
        if self._since is None:
            self._since, self._error = now, error_line(e)
            self.listener(Outage(self.topic, self._error, 0.0, False, self.retry_for))
        lasted = now - self._since
        if lasted >= self.retry_for:
            raise TransientStorageError(f"{self.topic}: storage unreachable for {lasted:.1f}s, longer than retry-for "
                                        f"{self.retry_for:g}s: {error_line(e)}") from e
        wait = min(MAX_WAIT_S, self.first_wait * 2 ** min(self._attempts, 30), self.retry_for - lasted)
        self._attempts += 1
        self._sleep(wait)
