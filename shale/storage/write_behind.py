"""Writes that go on in a thread of their own while the caller prepares the next batch.

Pass two alternates between building a batch of frames (gathering byte ranges, NumPy
over footer columns) and writing it.  The write is a system call that copies the batch
into the page cache (or a request to an object store) and holds no interpreter lock, so
doing it in a second thread overlaps the two.  Writes keep their order (one thread), at
most ``max_pending_bytes`` wait at a time (bounded memory), and a failed write is raised
by the next call.

The caller must not change a buffer it passed to :meth:`WriteBehind.write` until that
write is done: :attr:`WriteBehind.submitted` and :meth:`WriteBehind.wait_for` tell it
when a reused buffer is free again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from shale.storage.base import ObjectWriter

__all__ = ["ThrottledWriter", "WriteBehind"]


class WriteBehind(ObjectWriter):
    """``inner``'s writes done by ``pool`` (a single-thread executor, shared by the
    writers of one copy, which write one object at a time)."""

    def __init__(self, inner: ObjectWriter, pool: ThreadPoolExecutor, *, max_pending_bytes: int = 64 << 20) -> None:
        self.inner = inner
        self._pool = pool
        self._max_pending = max_pending_bytes
        self._pending: deque[tuple[Future[int], int]] = deque()  # oldest first, with their sizes
        self._pending_bytes = 0
        self._settled = 0  # writes seen to be finished (every write before them is too)
        self._submitted = 0

    @property
    def submitted(self) -> int:
        """Writes submitted so far (the mark to :meth:`wait_for`)."""
        return self._submitted

    def wait_for(self, mark: int) -> None:
        """Return once the first ``mark`` writes are done; raise the error of a failed one."""
        while self._settled < mark and self._pending:
            self._settle_oldest()

    def _settle_oldest(self) -> None:
        fut, size = self._pending.popleft()
        self._pending_bytes -= size
        self._settled += 1
        fut.result()  # a failed write fails the object

    def drain(self, limit: int) -> None:
        """Wait for the oldest writes until at most ``limit`` bytes wait (for a caller
        about to hold more of its own)."""
        while self._pending and self._pending_bytes > limit:
            self._settle_oldest()

    def write(self, data: bytes | bytearray | memoryview, /) -> int:
        size = len(data)
        while self._pending and (self._pending[0][0].done() or self._pending_bytes + size > self._max_pending):
            self._settle_oldest()
        self._pending.append((self._pool.submit(self.inner.write, data), size))
        self._pending_bytes += size
        self._submitted += 1
        return size

    def close(self) -> None:
        self.wait_for(self._submitted)
        self.inner.close()

    def abort(self) -> None:
        # Every write is let finish (or fail) first: none may land after the abort.
        while self._pending:
            fut, _ = self._pending.popleft()
            fut.exception()
        self._pending_bytes = 0
        self.inner.abort()


class ThrottledWriter(ObjectWriter):
    """An object writer whose bytes are reported to ``throttle`` after each write (a
    :class:`~shale.runtime.throttle.Throttle`, which sleeps to keep a byte rate)."""

    def __init__(self, inner: ObjectWriter, throttle: Callable[[int], None]) -> None:
        self.inner, self.throttle = inner, throttle

    def write(self, data: bytes | bytearray | memoryview, /) -> int:
        n = self.inner.write(data)
        self.throttle(len(data))
        return n

    def close(self) -> None:
        self.inner.close()

    def abort(self) -> None:
        self.inner.abort()
