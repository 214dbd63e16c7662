"""Corrupt input and flaky storage: clear errors, retries only where they are safe,
and nothing published."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from shale.cli.errors import exit_code_of
from shale.compactor import Compactor, parse_duration
from shale.compactor.units import format_duration
from shale.ledger.errors import (
    AlreadyExistsError,
    ConflictError,
    CorruptLedgerError,
    InvalidInputError,
    ObjectNotFoundError,
    TransientStorageError,
)
from shale.ledger.reader import LedgerFile
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.storage._s3 import S3Store
from shale.storage.retry import RetryPolicy
from tests.conftest import run_cli


def _produce(uri: str, n: int = 200) -> None:
    with TopicWriter(uri, batch_size=10, max_ledger_records=100) as w:
        for i in range(n):
            w.append(f"k{i % 13}", f"value-{i}")


def _flip_live_entry(meta: TopicMetadata) -> str:
    """Corrupt the last entry of the last ledger: it holds live records, so it is read."""
    lg = meta.load_topic().ledgers[-1]
    data_end = LedgerFile.open(meta.topic.store, meta.topic.key(lg.object)).footer.data_end
    return _flip(meta, -1, data_end - 5)


def _flip(meta: TopicMetadata, ledger_index: int, at: int) -> str:
    lg = meta.load_topic().ledgers[ledger_index]
    key = meta.topic.key(lg.object)
    data = bytearray(meta.topic.store.get(key))
    data[at] ^= 0x40
    meta.topic.store.put(key, bytes(data))
    return lg.object


@pytest.mark.parametrize("where", ["entry", "footer", "truncated"])
def test_corrupt_ledger_fails_the_run_and_publishes_nothing(topic_uri: str, where: str) -> None:
    _produce(topic_uri)
    meta = TopicMetadata.open(topic_uri)
    if where == "truncated":
        lg = meta.load_topic().ledgers[1]
        key = meta.topic.key(lg.object)
        meta.topic.store.put(key, meta.topic.store.get(key)[:-100])
        name = lg.object
    else:
        lg = meta.load_topic().ledgers[1]
        data_end = LedgerFile.open(meta.topic.store, meta.topic.key(lg.object)).footer.data_end
        # the last entry holds the latest record of several keys, so it is always read
        name = _flip(meta, 1, data_end - 5 if where == "entry" else lg.bytes - 120)
    with pytest.raises(CorruptLedgerError) as e:
        Compactor(topic_uri).run()
    assert name in str(e.value) and exit_code_of(e.value) == 4
    assert "byte" in str(e.value)
    assert meta.load_compaction().epoch == 0
    assert list(meta.topic.store.list(meta.topic.key("compacted"))) == []


def test_a_corrupt_ledger_is_its_topics_exit_code_4_and_other_topics_still_compact(tmp_path: Path) -> None:
    bad, good = str(tmp_path / "bad"), str(tmp_path / "good")
    _produce(bad)
    _produce(good)
    meta = TopicMetadata.open(bad)
    name = _flip_live_entry(meta)
    p = run_cli("--json", bad, good, script="compact")
    assert p.returncode == 7  # some topics failed, the others completed; the failed one's own code is 4
    *out, run = [json.loads(x) for x in p.stdout.splitlines()]
    assert out[0]["status"] == "error" and name in out[0]["error"] and "checksum" in out[0]["error"]
    assert out[0]["exit_code"] == 4 and run["failed_topics"] == [{"topic": bad, "exit_code": 4}]
    assert out[1]["status"] == "compacted"
    p = run_cli(bad, script="compact")
    assert p.returncode == 4 and len(p.stderr.strip().splitlines()) == 1 and name in p.stderr


def test_missing_ledger_object_is_named(topic_uri: str) -> None:
    _produce(topic_uri)
    meta = TopicMetadata.open(topic_uri)
    lg = meta.load_topic().ledgers[0]
    meta.topic.store.delete(meta.topic.key(lg.object))
    with pytest.raises(ObjectNotFoundError, match=lg.object):
        Compactor(topic_uri).run()
    assert meta.load_compaction().epoch == 0


def test_durations() -> None:
    assert parse_duration("500ms") == 500
    assert parse_duration("30s") == 30_000
    assert parse_duration("10m") == 600_000
    assert parse_duration("24h") == 86_400_000
    assert parse_duration("7d") == 7 * 86_400_000
    assert parse_duration("90") == 90_000
    assert parse_duration("1.5s") == 1500
    assert format_duration(86_400_000) == "1d" and format_duration(300_000) == "5m"
    for bad in ("", "5x", "-1s", "ten minutes", "1 h h"):
        with pytest.raises(InvalidInputError, match="duration"):
            parse_duration(bad)


# ------------------------------------------------------------ S3 retries


class Flaky:
    """Wraps a real boto3 client (talking to moto) and injects failures before or after
    the real call."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.plan: dict[str, list[str]] = {}
        self.calls: dict[str, int] = {}

    def __getattr__(self, op: str) -> Any:
        real = getattr(self.client, op)

        def call(**kwargs: Any) -> Any:
            self.calls[op] = self.calls.get(op, 0) + 1
            todo = self.plan.get(op, [])
            action = todo.pop(0) if todo else "ok"
            from botocore.exceptions import ClientError, ConnectionClosedError

            if action == "503":
                raise ClientError({"Error": {"Code": "SlowDown", "Message": "slow"},
                                   "ResponseMetadata": {"HTTPStatusCode": 503}}, op)
            if action == "500":
                raise ClientError({"Error": {"Code": "InternalError", "Message": "x"},
                                   "ResponseMetadata": {"HTTPStatusCode": 500}}, op)
            result = real(**kwargs)
            if action == "lost-response":
                raise ConnectionClosedError(endpoint_url="http://moto")
            return result

        return call


@pytest.fixture
def flaky(s3_bucket: str) -> tuple[S3Store, Flaky, list[float]]:
    import boto3

    sleeps: list[float] = []
    client = Flaky(boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1"))
    store = S3Store(s3_bucket, retry=RetryPolicy(attempts=4, sleep=sleeps.append), client=client)
    return store, client, sleeps


def test_transient_errors_are_retried_with_backoff(flaky: tuple[S3Store, Flaky, list[float]]) -> None:
    store, client, sleeps = flaky
    client.plan["put_object"] = ["503", "500"]
    store.put("a", b"data")
    assert client.calls["put_object"] == 3 and len(sleeps) == 2 and sleeps[1] >= sleeps[0] * 0.5
    client.plan["get_object"] = ["503"]
    assert store.get("a") == b"data"


def test_retries_are_bounded(flaky: tuple[S3Store, Flaky, list[float]]) -> None:
    store, client, _ = flaky
    client.plan["put_object"] = ["503"] * 10
    with pytest.raises(TransientStorageError, match="SlowDown"):
        store.put("a", b"data")
    assert client.calls["put_object"] == 4


def test_conflicts_and_missing_objects_are_never_retried(flaky: tuple[S3Store, Flaky, list[float]]) -> None:
    store, client, sleeps = flaky
    token = store.put_if_absent("doc", b"v1")
    with pytest.raises(AlreadyExistsError):
        store.put_if_absent("doc", b"v2")
    store.put_if_match("doc", b"v2", token)
    with pytest.raises(ConflictError):
        store.put_if_match("doc", b"v3", token)
    with pytest.raises(ObjectNotFoundError):
        store.get("missing")
    assert client.calls["put_object"] == 4 and sleeps == []


def test_retried_conditional_write_recognises_its_own_success(
        flaky: tuple[S3Store, Flaky, list[float]]) -> None:
    store, client, _ = flaky
    # the create reaches S3, the response is lost, the retry sees 412: it was our write
    client.plan["put_object"] = ["lost-response"]
    token = store.put_if_absent("doc", b"mine")
    assert store.get_with_token("doc") == (b"mine", token)
    client.plan["put_object"] = ["lost-response"]
    store.put_if_match("doc", b"mine too", token)
    assert store.get("doc") == b"mine too"
    # but another writer's object is still a conflict
    with pytest.raises(AlreadyExistsError):
        store.put_if_absent("doc", b"someone else")


def test_credentials_never_appear_in_errors(flaky: tuple[S3Store, Flaky, list[float]]) -> None:
    store, client, _ = flaky
    client.plan["get_object"] = ["503"] * 10
    with pytest.raises(TransientStorageError) as e:
        store.get("x")
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in str(e.value)
    assert os.environ["AWS_ACCESS_KEY_ID"] not in str(e.value)
