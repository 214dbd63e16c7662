"""Byte-rate limits for pass two's reads and writes (Kafka's cleaner throttle).

A compaction competes with producers and readers for the same disks, network and
request budget; ``--max-read-bytes-per-second`` and ``--max-write-bytes-per-second``
keep it to a share.  With the Spark engine each task is limited on its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from shale.ledger.storage import ObjectWriter

__all__ = ["Throttle", "ThrottledWriter"]


class Throttle:
    """Lets ``rate`` bytes per second through on average (``rate`` 0: no limit).

    Callers report bytes after moving them; the throttle sleeps long enough that the
    total so far never runs ahead of ``rate`` by more than one second's worth.
    """

    def __init__(self, rate: int, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.rate = rate
        self.clock, self.sleep = clock, sleep
        self._lock = threading.Lock()
        self._start: float | None = None
        self._bytes = 0
        self.slept = 0.0

    def __call__(self, nbytes: int) -> None:
        if self.rate <= 0 or nbytes <= 0:
            return
        with self._lock:
            now = self.clock()
            if self._start is None:
                self._start = now
            self._bytes += nbytes
            due = self._start + (self._bytes - self.rate) / self.rate  # one second of burst allowed
            wait = due - now
        if wait > 0:
            self.sleep(wait)
            self.slept += wait


class ThrottledWriter(ObjectWriter):
    """An object writer whose bytes pass through a :class:`Throttle`."""

    def __init__(self, inner: ObjectWriter, throttle: Throttle) -> None:
        self.inner, self.throttle = inner, throttle

    def write(self, data: bytes | bytearray | memoryview, /) -> int:
        n = self.inner.write(data)
        self.throttle(len(data))
        return n

    def close(self) -> None:
        self.inner.close()

    def abort(self) -> None:
        self.inner.abort()
