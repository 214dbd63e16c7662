"""Byte-rate limits for pass two's reads and writes (Kafka's cleaner throttle).

A compaction competes with producers and readers for the same disks, network and
request budget; ``--max-read-bytes-per-second`` and ``--max-write-bytes-per-second``
keep it to a share.  With the Spark engine each task is limited on its own.

A throttle is also where long work notices that it should stop: once the process is
interrupted (:mod:`shale.runtime.interrupts`) every call raises ``KeyboardInterrupt``,
limited or not, and a throttled wait ends within a tenth of a second; :meth:`Throttle.cancel`
ends a run's own waits at once when it fails.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final

from shale.runtime.interrupts import interrupted

#: How often a throttled wait looks whether the process was interrupted (the interrupt
#: handler only sets a flag: waking waits from a signal handler could deadlock).
_POLL_S: Final = 0.1

__all__ = ["Throttle"]


class Throttle:
    """Lets ``rate`` bytes per second through on average (``rate`` 0: no limit).

    Callers report bytes after moving them; the throttle sleeps long enough that the
    total so far never runs ahead of ``rate`` by more than one second's worth.  ``sleep``
    replaces the wait (tests); the real one ends early on :meth:`cancel` or an interrupt.
    """

    def __init__(self, rate: int, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] | None = None) -> None:
        self.rate = rate
        self.clock, self.sleep = clock, sleep
        self._lock = threading.Lock()
        self._start: float | None = None
        self._bytes = 0
        self._cancelled = threading.Event()
        self.slept = 0.0

    def __call__(self, nbytes: int) -> None:
        if interrupted():
            raise KeyboardInterrupt
        if self.rate <= 0 or nbytes <= 0 or self._cancelled.is_set():
            return
        with self._lock:
            now = self.clock()
            if self._start is None:
                self._start = now
            self._bytes += nbytes
            due = self._start + (self._bytes - self.rate) / self.rate  # one second of burst allowed
            wait = due - now
        if wait > 0:
            self._wait(wait)
            self.slept += wait

    def cancel(self) -> None:
        """End every wait now and let everything through from now on (the work it
        paces has failed or stopped, and its threads are being waited for)."""
        self._cancelled.set()

    def _wait(self, seconds: float) -> None:
        if self.sleep is not None:
            self.sleep(seconds)
            return
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if self._cancelled.wait(min(left, _POLL_S)):
                return
            if interrupted():
                raise KeyboardInterrupt
