"""The one retry policy for storage requests.

Only :class:`~ledger.errors.TransientStorageError` is retried; conflicts and missing
objects never are.  ``sleep`` is injectable so tests do not wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import tenacity

from ledger.errors import TransientStorageError

__all__ = ["RetryPolicy"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded exponential backoff with jitter for transient storage errors."""

    attempts: int = 6
    initial_wait: float = 0.05
    max_wait: float = 5.0
    sleep: Callable[[float], None] = field(default=time.sleep)

    def retrying(self) -> tenacity.Retrying:
        return tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.attempts),
            wait=(tenacity.wait_exponential(multiplier=self.initial_wait, max=self.max_wait)
                  + tenacity.wait_random(0, self.initial_wait)),
            retry=tenacity.retry_if_exception_type(TransientStorageError),
            reraise=True,
            sleep=self.sleep,
        )
