"""The retry policies, defined once: storage requests and compare-and-swap loops.

A storage request retries only a :class:`~shale.ledger.errors.TransientStorageError`;
conflicts and missing objects never are.  A compare-and-swap loop retries only a
:class:`~shale.ledger.errors.ConflictError`, re-reading the state on every attempt (see
:meth:`shale.metadata.documents.DocumentStore.update`).  Both are frozen values, picklable
with the default ``sleep``; ``sleep`` is injectable so tests do not wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import field
from types import TracebackType
from typing import TYPE_CHECKING

from shale.ledger.errors import ConflictError, TransientStorageError
from shale.ledger.values import dataclass

if TYPE_CHECKING:
    import tenacity

__all__ = ["Attempt", "ConflictPolicy", "RetryPolicy"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded exponential backoff with jitter for transient storage errors."""

    attempts: int = 6
    initial_wait: float = 0.05
    max_wait: float = 5.0
    sleep: Callable[[float], None] = field(default=time.sleep)

    def retrying(self) -> tenacity.Retrying:
        """A tenacity loop under this policy (``for attempt in ...: with attempt: ...``)."""
        import tenacity  # (imported where a loop is made: not every command retries)

        return tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.attempts),
            wait=(tenacity.wait_exponential(multiplier=self.initial_wait, max=self.max_wait)
                  + tenacity.wait_random(0, self.initial_wait)),
            retry=tenacity.retry_if_exception_type(TransientStorageError),
            reraise=True,
            sleep=self.sleep,
        )


@dataclass(frozen=True, slots=True)
class ConflictPolicy:
    """Every compare-and-swap loop's policy: retried only on a conflict (another writer
    swapped first), with random exponential backoff so that contenders spread out, a
    bounded number of times.  Each attempt must re-read the state it swaps from; the
    last conflict is raised when the attempts run out."""

    attempts: int = 20
    initial_wait: float = 0.005
    max_wait: float = 0.5
    sleep: Callable[[float], None] = field(default=time.sleep)

    def retrying(self, what: str = "") -> tenacity.Retrying:
        """A tenacity loop under this policy; ``what`` names the loop in the log line
        written before each wait."""
        import logging  # (here, with tenacity: a command that swaps nothing needs neither)

        import tenacity

        log = logging.getLogger("shale")

        def note(state: tenacity.RetryCallState) -> None:
            log.debug("%s: conflict on attempt %d, trying again", what or "compare-and-swap", state.attempt_number)

        return tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.attempts),
            wait=tenacity.wait_random_exponential(multiplier=self.initial_wait, max=self.max_wait),
            retry=tenacity.retry_if_exception_type(ConflictError),
            reraise=True,
            sleep=self.sleep,
            before_sleep=note,
        )

    def loop(self, what: str = "") -> Iterator[Attempt]:
        """The attempts of a compare-and-swap loop (``for attempt in ...: with attempt:
        ...``), as :meth:`retrying` makes them: the same waits, log lines and bound, the
        last conflict raised when the attempts run out.  The first attempt is made
        without tenacity, which is imported and set up only once an attempt conflicts
        (most loops swap at the first try).  ``attempt.number`` counts from 1."""
        first = Attempt(1)
        yield first
        if first.conflict is None:
            return  # (the block ended without a conflict: the loop is over, as tenacity ends it)
        number = 1
        for attempt in self.retrying(what):
            if number == 1:  # tenacity's first attempt: the conflict the first one met, again
                number = 2
                with attempt:
                    raise first.conflict
                continue
            yield Attempt(number, attempt)
            number += 1


class Attempt:
    """One attempt of :meth:`ConflictPolicy.loop`: a context manager around the
    attempt's work.  The first lets anything but a conflict through and keeps the
    conflict for the loop; the later ones are tenacity's."""

    __slots__ = ("_managed", "conflict", "number")

    def __init__(self, number: int, managed: tenacity.AttemptManager | None = None) -> None:
        self.number = number
        self.conflict: ConflictError | None = None
        self._managed = managed

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> bool | None:
        if self._managed is not None:
            return self._managed.__exit__(kind, error, tb)
        if isinstance(error, ConflictError):
            self.conflict = error
            return True
        return None

