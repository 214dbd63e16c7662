"""Writes done in a thread of their own (:mod:`ledger.write_behind`): order kept, the
caller told when a buffer is free again, failures raised, nothing written after abort."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from ledger.storage import ObjectWriter
from ledger.write_behind import WriteBehind


class Slow(ObjectWriter):
    """Copies what it is given, slowly; fails the write whose index is ``fail_at``."""

    def __init__(self, delay: float = 0.01, fail_at: int = -1) -> None:
        self.got: list[bytes] = []
        self.delay, self.fail_at = delay, fail_at
        self.closed = self.aborted = False
        self.threads: set[str] = set()

    def write(self, data: bytes | bytearray | memoryview, /) -> int:
        time.sleep(self.delay)
        self.threads.add(threading.current_thread().name)
        if len(self.got) == self.fail_at:
            raise OSError(28, "No space left on device")
        self.got.append(bytes(data))
        return len(data)

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="shale-write") as p:
        yield p


def test_writes_keep_their_order_and_run_in_the_pool(pool: ThreadPoolExecutor) -> None:
    inner = Slow()
    w = WriteBehind(inner, pool)
    t = time.perf_counter()
    for i in range(10):
        assert w.write(bytes([i]) * 3) == 3
    assert time.perf_counter() - t < 0.05  # the caller did not wait for 10 slow writes
    w.close()
    assert inner.got == [bytes([i]) * 3 for i in range(10)]
    assert inner.closed and inner.threads == {"shale-write_0"}


def test_wait_for_tells_when_a_reused_buffer_is_free(pool: ThreadPoolExecutor) -> None:
    inner = Slow(delay=0.02)
    w = WriteBehind(inner, pool)
    buf = bytearray(b"first")
    w.write(memoryview(buf))
    mark = w.submitted
    w.write(b"second")
    w.wait_for(mark)
    assert inner.got[0] == b"first"  # written before the buffer changes
    buf[:] = b"XXXXX"
    w.close()
    assert inner.got == [b"first", b"second"]


def test_pending_bytes_are_bounded(pool: ThreadPoolExecutor) -> None:
    inner = Slow(delay=0.005)
    w = WriteBehind(inner, pool, max_pending_bytes=10)
    for _ in range(6):
        w.write(b"12345")
        assert w._pending_bytes <= 10
    w.close()
    assert len(inner.got) == 6


def test_a_failed_write_is_raised_and_the_object_never_closed(pool: ThreadPoolExecutor) -> None:
    inner = Slow(fail_at=2)
    w = WriteBehind(inner, pool)
    with pytest.raises(OSError, match="No space"):
        for i in range(6):
            w.write(bytes([i]))
        w.close()
    assert not inner.closed
    w.abort()
    assert inner.aborted


def test_abort_lets_every_write_finish_first(pool: ThreadPoolExecutor) -> None:
    inner = Slow(delay=0.01)
    w = WriteBehind(inner, pool)
    for i in range(5):
        w.write(bytes([i]))
    w.abort()
    n = len(inner.got)
    time.sleep(0.05)
    assert len(inner.got) == n == 5  # nothing lands after the abort
    assert inner.aborted and not inner.closed
