"""Writes done in a thread of their own (:mod:`shale.storage.write_behind`): order kept, the
caller told when a buffer is free again, failures raised, nothing written after abort.

No test measures time: a write is held by an event (the caller goes on while it is in
progress), or the writes run only when a test or the code under test asks for them
(:class:`StepPool`), so each ordering is forced rather than hoped for."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from shale.storage import ObjectWriter
from shale.storage.write_behind import WriteBehind

DEADLOCK_GUARD_S = 30  # only ever reached when the code under test is broken


class Recorder(ObjectWriter):
    """Copies what it is given and logs every call; fails the write whose index is
    ``fail_at``; write number ``hold_at`` waits for :attr:`release` (set by the test),
    after setting :attr:`holding`."""

    def __init__(self, fail_at: int = -1, hold_at: int = -1) -> None:
        self.got: list[bytes] = []
        self.log: list[str] = []
        self.fail_at, self.hold_at = fail_at, hold_at
        self.holding, self.release = threading.Event(), threading.Event()
        self.calls = 0
        self.closed = self.aborted = False
        self.threads: set[str] = set()

    def write(self, data: bytes | bytearray | memoryview, /) -> int:
        index = self.calls
        self.calls += 1
        self.threads.add(threading.current_thread().name)
        if index == self.hold_at:
            self.holding.set()
            assert self.release.wait(DEADLOCK_GUARD_S), "the test never released the held write"
        if index == self.fail_at:
            self.log.append(f"fail {index}")
            raise OSError(28, "No space left on device")
        self.got.append(bytes(data))
        self.log.append(f"write {index}")
        return len(data)

    def close(self) -> None:
        self.closed = True
        self.log.append("close")

    def abort(self) -> None:
        self.aborted = True
        self.log.append("abort")


class _StepFuture(Future[Any]):
    """A future whose work runs when someone needs its outcome (or :meth:`StepPool.run_all`)."""

    def __init__(self, pool: StepPool) -> None:
        super().__init__()
        self._step_pool = pool

    def result(self, timeout: float | None = None) -> Any:
        self._step_pool.run_until(self)
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._step_pool.run_until(self)
        return super().exception(timeout)


class StepPool(ThreadPoolExecutor):
    """A one-thread pool that never runs anything on its own: submitted calls wait, in
    order, until a future's outcome is asked for (every call before it runs first) or
    the test calls :meth:`run_all`."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.queue: deque[tuple[_StepFuture, Callable[..., Any], tuple[Any, ...]]] = deque()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        assert not kwargs
        fut = _StepFuture(self)
        self.queue.append((fut, fn, args))
        return fut

    def _run_one(self) -> None:
        fut, fn, args = self.queue.popleft()
        try:
            fut.set_result(fn(*args))
        except BaseException as e:
            fut.set_exception(e)

    def run_until(self, target: Future[Any]) -> None:
        while not target.done():
            assert self.queue, "waited for a write that was never submitted"
            self._run_one()

    def run_all(self) -> None:
        while self.queue:
            self._run_one()


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="shale-write") as p:
        yield p


def test_the_caller_goes_on_while_a_write_is_in_progress(pool: ThreadPoolExecutor) -> None:
    inner = Recorder(hold_at=0)
    w = WriteBehind(inner, pool)
    for i in range(10):
        assert w.write(bytes([i]) * 3) == 3
    # every write() returned while the first write was still in progress
    assert inner.holding.wait(DEADLOCK_GUARD_S)
    assert inner.got == [] and w.submitted == 10
    inner.release.set()
    w.close()
    assert inner.got == [bytes([i]) * 3 for i in range(10)]
    assert inner.log[-1] == "close"
    assert inner.closed and inner.threads == {"shale-write_0"}


def test_wait_for_tells_when_a_reused_buffer_is_free() -> None:
    inner = Recorder()
    pool = StepPool()
    w = WriteBehind(inner, pool)
    buf = bytearray(b"first")
    w.write(memoryview(buf))
    mark = w.submitted
    w.write(b"second")
    w.write(b"third")
    assert inner.got == []  # nothing written yet: the buffer is still in use
    w.wait_for(mark)
    assert inner.got == [b"first"]  # written before the buffer changes, and nothing more waited for
    buf[:] = b"XXXXX"
    w.wait_for(mark)  # done already
    assert inner.got == [b"first"]
    w.close()
    assert inner.got == [b"first", b"second", b"third"] and inner.log[-1] == "close"


def test_pending_bytes_are_bounded() -> None:
    inner = Recorder()
    pool = StepPool()
    w = WriteBehind(inner, pool, max_pending_bytes=10)
    for i in range(6):
        w.write(b"12345")
        # a third pending write would pass the bound: the oldest is waited for first
        assert w._pending_bytes <= 10 and len(pool.queue) <= 2
        assert len(inner.got) == max(0, i - 1)
    w.close()
    assert len(inner.got) == 6


def test_a_failed_write_is_raised_and_the_object_never_closed(pool: ThreadPoolExecutor) -> None:
    inner = Recorder(fail_at=2)
    w = WriteBehind(inner, pool)
    with pytest.raises(OSError, match="No space"):
        for i in range(6):
            w.write(bytes([i]))
        w.close()
    assert not inner.closed
    w.abort()
    assert inner.aborted


def test_a_failed_write_is_raised_by_the_next_call_that_waits_for_it() -> None:
    inner = Recorder(fail_at=1)
    pool = StepPool()
    w = WriteBehind(inner, pool)
    w.write(b"a")
    w.write(b"b")
    w.write(b"c")  # not yet known to have failed: nothing has run
    with pytest.raises(OSError, match="No space"):
        w.close()
    assert inner.log == ["write 0", "fail 1"] and not inner.closed


def test_abort_lets_every_write_finish_first() -> None:
    inner = Recorder()
    pool = StepPool()
    w = WriteBehind(inner, pool)
    for i in range(5):
        w.write(bytes([i]))
    assert inner.log == []
    w.abort()
    pool.run_all()  # anything abort left queued would run now, after it
    assert inner.log == [f"write {i}" for i in range(5)] + ["abort"]  # nothing lands after the abort
    assert inner.aborted and not inner.closed

