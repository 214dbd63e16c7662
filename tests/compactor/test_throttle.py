"""Pass two's byte-rate limits and parallel reads."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from shale.compactor import CompactionConfig, Compactor, pass_two
from shale.producer import TopicWriter
from shale.reader import TopicReader
from shale.runtime.throttle import Throttle
from tests.conftest import run_cli


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self._lock = threading.Lock()  # reads and writes are throttled in two threads

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        with self._lock:
            self.now += s


def test_throttle_keeps_the_average_rate() -> None:
    t = FakeTime()
    th = Throttle(1000, clock=t.clock, sleep=t.sleep)
    th(1000)  # one second's burst passes at once
    assert t.now == 100.0
    for _ in range(10):
        th(500)
    # 6,000 bytes at 1,000 B/s, one second of burst: five seconds in all
    assert abs(t.now - 105.0) < 1e-9 and abs(th.slept - 5.0) < 1e-9
    unlimited = Throttle(0, clock=t.clock, sleep=t.sleep)
    unlimited(10**9)
    assert abs(t.now - 105.0) < 1e-9


def _topic(tmp_path: Path) -> str:
    uri = str(tmp_path / "t")
    # stored uncompressed, so that entry bytes, not footers, make most of what is read
    with TopicWriter(uri, max_ledger_records=3_000, clock=lambda: 1_700_000_000.0, compression="none") as w:
        for i in range(12_000):
            w.append(f"k{i % 4_000}", "v" * 60 + str(i))
    return uri


def _compacted(uri: str) -> list[tuple[str, bytes | None]]:
    return [(str(m.id), m.value) for m in TopicReader(uri, read_compacted=True)]


def test_pass_two_reports_every_byte_it_reads_and_writes_to_its_throttles(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Throttle] = []
    fake = FakeTime()

    class Recording(Throttle):
        def __init__(self, rate: int) -> None:
            super().__init__(rate, clock=fake.clock, sleep=fake.sleep)
            self.total = 0
            made.append(self)

        def __call__(self, nbytes: int) -> None:
            self.total += nbytes
            super().__call__(nbytes)

    monkeypatch.setattr(pass_two, "Throttle", Recording)
    uri = _topic(tmp_path)
    s = Compactor(uri, CompactionConfig(max_read_bytes_per_s=100_000, max_write_bytes_per_s=50_000,
                                        chunk_bytes=1 << 14), clock=lambda: 1_700_000_100.0).run()
    assert s.status == "compacted"
    reads, writes = made
    assert (reads.rate, writes.rate) == (100_000, 50_000)
    assert writes.total == s.bytes_written  # every byte of every part
    assert 0 < reads.total <= s.bytes_read and reads.total > s.bytes_written // 2
    # the throttles made the run wait for the bytes past their first second (reads and
    # writes run side by side, so each limit holds over the run's whole time)
    assert reads.slept + writes.slept == pytest.approx(fake.now - 100.0)
    assert fake.now - 100.0 >= (writes.total - 50_000) / 50_000 - 1e-6
    assert fake.now - 100.0 >= (reads.total - 100_000) / 100_000 - 1e-6
    assert writes.slept > 0


def test_write_limit_slows_a_real_run(tmp_path: Path) -> None:
    uri = _topic(tmp_path)
    rate = 100_000
    t = time.perf_counter()
    s = Compactor(uri, CompactionConfig(max_write_bytes_per_s=rate), clock=lambda: 1_700_000_100.0).run()
    assert s.status == "compacted" and s.bytes_written > 2 * rate
    assert time.perf_counter() - t >= (s.bytes_written - rate) / rate * 0.95


def test_parallel_reads_write_the_same_ledger(tmp_path: Path) -> None:
    results = []
    for n in (1, 2, 8):
        uri = _topic(tmp_path / f"p{n}")
        s = Compactor(uri, CompactionConfig(read_parallelism=n, chunk_bytes=1 << 12),
                      clock=lambda: 1_700_000_100.0).run()
        assert s.status == "compacted"
        results.append(_compacted(uri))
    assert results[0] == results[1] == results[2] and len(results[0]) == 4_000


def test_cli_flags(tmp_path: Path) -> None:
    uri = _topic(tmp_path)
    res = run_cli(uri, "--read-parallelism", "0", script="compact")
    assert res.returncode == 2 and "between 1 and 64" in res.stderr
    res = run_cli(uri, "--read-parallelism", "2", "--max-read-bytes-per-second", "64MiB",
                  "--max-write-bytes-per-second", "64MiB", "--json", script="compact")
    assert res.returncode == 0 and '"status":"compacted"' in res.stdout
