"""The retry policies, defined once: storage requests and compare-and-swap loops.

A storage request retries only a :class:`~shale.ledger.errors.TransientStorageError`;
conflicts and missing objects never are.  A compare-and-swap loop retries only a
:class:`~shale.ledger.errors.ConflictError`, re-reading the state on every attempt (see
:meth:`shale.metadata.documents.DocumentStore.update`).  Both are frozen values, picklable
with the default ``sleep``; ``sleep`` is injectable so tests do not wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shale.ledger.errors import ConflictError, TransientStorageError

if TYPE_CHECKING:
    import tenacity

__all__ = ["ConflictPolicy", "RetryPolicy"]


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

