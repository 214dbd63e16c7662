"""Whole commands through an HTTP proxy that fails a share of S3 requests (503 SlowDown,
500, connection resets before and after the store acted, answers after the client's
timeout): produce, compact and verify still succeed through retries, conditional
writes whose answer was lost are recognised, and a run whose retries run out fails in
one line with nothing published."""

from __future__ import annotations

import json
import os
import random

import pytest

from shale.maintenance.verify import verify_topic
from shale.metadata.topic import TopicMetadata
from tests.conftest import run_cli
from tests.flaky_proxy import FlakyProxy

pytestmark = pytest.mark.s3

LONG = os.environ.get("SHALE_LONG_TESTS") == "1"
# short client timeouts so that "slow" answers time out quickly
FAST = {"SHALE_S3_READ_TIMEOUT": "1", "SHALE_S3_CONNECT_TIMEOUT": "1"}
#: Requests three rounds of produce, compact and verify make with no fault at all.
MIN_REQUESTS = 150


def records(seed: int, n: int) -> str:
    rnd = random.Random(seed)
    return "".join(json.dumps({"key": f"k{rnd.randrange(800)}", "value": None if rnd.random() < 0.05 else f"v{i}"})
                   + "\n" for i in range(n))


@pytest.mark.timeout(3600 if LONG else 600)
def test_commands_succeed_through_a_flaky_proxy(moto_endpoint: str, s3_bucket: str) -> None:
    uri = f"s3://{s3_bucket}/topic"
    faults = {"503": 0.08, "500": 0.04, "reset": 0.04, "lost": 0.04, "slow": 0.01}
    rounds = 8 if LONG else 3
    with FlakyProxy(moto_endpoint, faults, seed=7, slow_seconds=1.5) as proxy:
        env = {"AWS_ENDPOINT_URL": proxy.url, **FAST}
        for r in range(rounds):
            p = run_cli("produce", uri, "--max-ledger-records", "1000", input=records(r, 4_000), env=env)
            assert p.returncode == 0, p.stderr
            c = run_cli("compact", uri, "--json", "--delete-retention", "0s", env=env)
            assert c.returncode == 0, c.stderr
            assert json.loads(c.stdout)["status"] == "compacted"
            v = run_cli("verify", uri, env=env)
            assert v.returncode == 0, v.stdout + v.stderr
        print(f"\nflaky proxy: {proxy.requests} requests, injected {dict(proxy.injected)}")
        # Faults are spread evenly over the requests, so their counts follow from how many
        # requests there were, whatever the order threads sent them in; and the commands
        # make at least MIN_REQUESTS (retries and heartbeats only add to those).
        assert proxy.requests >= MIN_REQUESTS
        assert all(proxy.injected[f] >= share * proxy.requests - 3 for f, share in faults.items()), proxy.injected
        assert sum(proxy.injected.values()) > 20 and all(proxy.injected[f] for f in ("503", "500", "reset", "lost"))
    # checked directly against the store, past the proxy
    meta = TopicMetadata.open(uri)
    assert meta.load_compaction().epoch == rounds
    assert verify_topic(meta).ok
    assert len(meta.load_topic().ledgers) == 4 * rounds  # no ledger lost or registered twice


def test_a_run_whose_retries_run_out_publishes_nothing(moto_endpoint: str, s3_bucket: str) -> None:
    uri = f"s3://{s3_bucket}/topic"
    assert run_cli("produce", uri, input=records(1, 3_000)).returncode == 0
    # every write fails: the compacted part cannot be uploaded
    with FlakyProxy(moto_endpoint, {"503": 1.0}, methods=frozenset({"PUT", "POST"})) as proxy:
        c = run_cli("compact", uri, env={"AWS_ENDPOINT_URL": proxy.url, **FAST})
    assert c.returncode == 1, c.stderr
    assert c.stderr.count("\n") == 1 and "SlowDown" in c.stderr and "testing-secret-key" not in c.stderr
    assert proxy.injected["503"] >= 6  # retried, bounded
    meta = TopicMetadata.open(uri)
    assert meta.load_compaction().horizon is None
    assert not list(meta.topic.store.list(meta.topic.key("compacted") + "/"))


def test_conditional_writes_whose_answers_are_lost_are_never_taken_for_conflicts(
        moto_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A third of the writes land but their answers are lost.  Only Shale's own retry
    policy may retry (it recognises its own landed write); were the S3 client to retry on
    its own, its second attempt would fail the precondition its first one changed, and a
    single writer would see a conflict that never was."""
    from shale.ledger.errors import ConflictError
    from shale.storage._s3 import S3Store

    with FlakyProxy(moto_endpoint, {"lost": 0.3}, seed=11, methods=frozenset({"PUT"})) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        monkeypatch.setenv("SHALE_S3_READ_TIMEOUT", "2")
        store = S3Store(s3_bucket)
        token = store.put_if_absent("doc", b"0")
        for i in range(1, 40):
            try:
                token = store.put_if_match("doc", str(i).encode(), token)
            except ConflictError as e:  # pragma: no cover - the failure this test exists for
                pytest.fail(f"write {i} of one writer was taken for a conflict: {e}")
        assert store.get("doc") == b"39"
        assert proxy.injected["lost"] > 5
