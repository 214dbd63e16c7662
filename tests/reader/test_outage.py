"""A follower rides out a storage outage: ``shale read --follow`` against moto behind a
proxy that is made to fail every request (tests/flaky_proxy.py) tries again with backoff
instead of giving up, says so once when the outage starts and once when it ends, and
reads on from where it was, nothing skipped or doubled.  ``--retry-for`` bounds it; a
read that does not follow gives up at once, as before.

The outage is forced (the proxy fails everything from a point the test chooses, until
the follower has tried again twice), never timed."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

import pytest

from shale.ledger.errors import TransientStorageError
from shale.producer import TopicWriter
from shale.reader import TableView
from shale.reader.outage import MAX_WAIT_S, Outage, Rider
from tests.flaky_proxy import FlakyProxy
from tests.gates import GUARD_S

pytestmark = pytest.mark.s3


def _produce(topic: str, *keys: str) -> None:
    with TopicWriter(topic) as w:
        for k in keys:
            w.append(k, f"value of {k}")


def _lines(stream: IO[str]) -> queue.Queue[str]:
    got: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stream:
            got.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return got


def _next(got: queue.Queue[str], proc: subprocess.Popen[str]) -> str:
    """The next line, within the guard, while ``proc`` lives."""
    for _ in range(int(GUARD_S / 0.1)):
        try:
            return got.get(timeout=0.1)
        except queue.Empty:
            assert proc.poll() is None, f"exited {proc.returncode}"
    raise AssertionError("nothing came within the guard")


def _until(condition: object) -> None:
    for _ in range(int(GUARD_S / 0.01)):
        if callable(condition) and condition():
            return
        threading.Event().wait(0.01)  # how often to look, not how long anything takes
    raise AssertionError("not reached within the guard")


def _shale(proxy: FlakyProxy, *args: str) -> subprocess.Popen[str]:
    # one try per request: the store's own retries would only make the outage longer to reach
    env = {**os.environ, "AWS_ENDPOINT_URL": proxy.url, "SHALE_S3_ATTEMPTS": "1"}
    return subprocess.Popen([str(Path(sys.executable).parent / "shale"), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, bufsize=1)


def test_a_follower_rides_out_an_outage_and_reads_on(moto_endpoint: str, s3_bucket: str) -> None:
    topic = f"s3://{s3_bucket}/topics/t"
    _produce(topic, "k0")
    with FlakyProxy(moto_endpoint, {}) as proxy:
        follower = _shale(proxy, "read", topic, "--follow", "--poll-interval", "200ms")
        assert follower.stdout is not None and follower.stderr is not None
        out, err = _lines(follower.stdout), _lines(follower.stderr)
        try:
            assert json.loads(_next(out, follower))["key"] == "k0"
            proxy.faults = {"503": 1.0}  # the store is gone
            said = _next(err, follower)
            assert said.startswith(f"shale: warning: {topic}: storage unreachable (") and "until it is back" in said
            failed = proxy.injected["503"]
            _until(lambda: proxy.injected["503"] >= failed + 2)  # it kept trying, quietly
            proxy.faults = {}  # back
            _produce(topic, "k1", "k2")
            assert [json.loads(_next(out, follower))["key"] for _ in range(2)] == ["k1", "k2"]
            back = _next(err, follower)
            assert back.startswith(f"shale: {topic}: storage reachable again after ")
            assert back.endswith("s; reading on\n")
        finally:
            follower.send_signal(signal.SIGINT)
            follower.wait(timeout=GUARD_S)
        assert follower.returncode == 0
        assert err.empty() and out.empty()  # the outage said once at each end; nothing read twice


def test_retry_for_bounds_it_and_a_plain_read_does_not_wait(moto_endpoint: str, s3_bucket: str) -> None:
    topic = f"s3://{s3_bucket}/topics/t"
    _produce(topic, "k0")
    with FlakyProxy(moto_endpoint, {}) as proxy:
        follower = _shale(proxy, "read", topic, "--follow", "--poll-interval", "100ms", "--retry-for", "1s")
        assert follower.stdout is not None and follower.stderr is not None
        out = _lines(follower.stdout)
        assert json.loads(_next(out, follower))["key"] == "k0"
        proxy.faults = {"500": 1.0}
        follower.wait(timeout=GUARD_S)
        said = follower.stderr.read().splitlines()
        assert follower.returncode == 1, said
        assert len(said) == 2 and "storage unreachable (" in said[0] and "for up to 1s (retry-for)" in said[0]
        assert said[1].startswith(f"shale: error: {topic}: storage unreachable for ") and \
            "longer than retry-for 1s" in said[1], said
        plain = _shale(proxy, "read", topic)
        _, plain_err = plain.communicate(timeout=GUARD_S)
        assert plain.returncode == 1 and plain_err.count("\n") == 1 and "unreachable" not in plain_err, plain_err


def test_the_waits_double_up_to_the_cap_and_the_outage_is_told_once_at_each_end() -> None:
    """The rider's own clock and sleep are given: the waits are counted, not timed."""
    now = [0.0]
    waits: list[float] = []
    told: list[Outage] = []

    def sleep(s: float) -> None:
        waits.append(s)
        now[0] += s

    failures = iter(range(10))

    def read() -> str:
        if next(failures, None) is not None:
            raise TransientStorageError("SlowDown (transient)")
        return "read"

    rider = Rider("s3://b/t", float("inf"), told.append, first_wait=0.2, clock=lambda: now[0], sleep=sleep)
    assert rider.call(read) == "read"
    assert waits == [min(MAX_WAIT_S, 0.2 * 2 ** i) for i in range(10)]
    assert [o.ended for o in told] == [False, True] and told[1].seconds == pytest.approx(sum(waits))
    assert rider.call(lambda: "again") == "again" and len(told) == 2  # no outage, nothing told


def test_past_retry_for_the_last_error_is_raised_naming_how_long() -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    def read() -> str:
        raise TransientStorageError("InternalError (transient)")

    rider = Rider("s3://b/t", 5.0, lambda o: None, first_wait=1.0, clock=lambda: now[0], sleep=sleep)
    with pytest.raises(TransientStorageError, match=r"^s3://b/t: storage unreachable for 5\.0s, longer than "
                       r"retry-for 5s: .*InternalError"):
        rider.call(read)
    with pytest.raises(TransientStorageError, match=r"^SlowDown"):  # retry-for 0: at once, as it was
        Rider("s3://b/t", 0.0, lambda o: None, first_wait=1.0).call(
            lambda: (_ for _ in ()).throw(TransientStorageError("SlowDown")))


def test_a_table_views_follow_rides_out_an_outage_and_a_stop_during_one_ends_it(
        moto_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    topic = f"s3://{s3_bucket}/topics/t"
    _produce(topic, "k0")
    with FlakyProxy(moto_endpoint, {}) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        monkeypatch.setenv("SHALE_S3_ATTEMPTS", "1")
        view = TableView(topic)
        told: list[Outage] = []
        changed: queue.Queue[bytes] = queue.Queue()
        view.listen(lambda key, value: changed.put(key))
        stop, failed = threading.Event(), []

        def follow() -> None:
            try:
                view.follow(0.05, stop, outage_listener=told.append)
            except BaseException as e:  # handed to the test
                failed.append(e)

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        proxy.faults = {"503": 1.0}
        _until(lambda: len(told) == 1)
        tried = proxy.injected["503"]
        _until(lambda: proxy.injected["503"] >= tried + 2)  # it kept trying, quietly
        assert len(told) == 1 and not failed
        proxy.faults = {}
        _produce(topic, "k1")
        assert changed.get(timeout=GUARD_S) == b"k1"
        _until(lambda: len(told) == 2)
        assert [o.ended for o in told] == [False, True] and view[b"k1"] == b"value of k1"
        proxy.faults = {"503": 1.0}  # down again, and the follow is stopped meanwhile
        _until(lambda: len(told) == 3)
        stop.set()
        follower.join(GUARD_S)
        assert not follower.is_alive() and not failed, failed
        assert [o.ended for o in told] == [False, True, False]
