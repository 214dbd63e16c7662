"""Defects a new user met end to end, each pinned: an oversized record loses nothing,
commands refuse topics that die with their process, two topics never share a metadata
location, truncation never removes what no compaction has seen unless told, and status
reports a damaged topic instead of failing on it."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from shale.ledger.errors import RecordTooLargeError
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.storage import register_backend, resolve
from tests.conftest import run_cli

# ------------------------------------------------------------ an oversized record


def test_an_oversized_record_is_refused_when_added_and_nothing_before_it_is_lost(topic_uri: str) -> None:
    w = TopicWriter(topic_uri, max_record_bytes=1000, batch_size=100)
    for i in range(250):
        w.append(f"k{i}", "v" * 10)
    with pytest.raises(RecordTooLargeError, match="exceeds the maximum of 1000 bytes"):
        w.append("big", "x" * 2000)
    result = w.close()
    assert result.records == 250
    assert TopicMetadata.open(topic_uri).load_topic().records == 250


def test_produce_names_the_line_of_an_oversized_record_and_registers_the_rest(tmp_path: Path) -> None:
    good = "".join(json.dumps({"key": f"k{i}", "value": "v"}) + "\n" for i in range(250))
    big = json.dumps({"key": "big", "value": "x" * (65 << 20)}) + "\n"
    path = tmp_path / "in.jsonl"
    path.write_text(good + big)
    topic = str(tmp_path / "t")
    r = run_cli("produce", topic, "--input", str(path))
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and f"{path}:251" in r.stderr and "exceeds the maximum" in r.stderr
    assert "250 earlier records were appended" in r.stderr
    assert TopicMetadata.open(topic).load_topic().records == 250


# ------------------------------------------------- topics that die with the process

@pytest.mark.parametrize("args", [
    ("produce", "memory://x/t"), ("read", "memory://x/t"), ("status", "memory://x/t"), ("compact", "memory://x/t"),
    ("gc", "memory://x/t"), ("truncate", "memory://x/t", "--before-ledger", "1"), ("verify", "memory://x/t"),
    ("status", "/tmp/t", "--metadata", "memory://m"), ("compact", "--all", "memory://x"),
])
def test_commands_refuse_memory_topics(args: tuple[str, ...]) -> None:
    r = run_cli(*args, input="")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and "memory://" in r.stderr and "process" in r.stderr, r.stderr


def test_the_compact_command_refuses_memory_topics_too() -> None:
    r = run_cli("memory://x/t", script="compact")
    assert r.returncode == 2 and "memory://" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_the_python_api_keeps_memory_topics() -> None:
    uri = f"memory://api-{uuid.uuid4().hex[:8]}/t"
    with TopicWriter(uri) as w:
        w.append("k", "v")
    assert TopicMetadata.open(uri).load_topic().records == 1


# ------------------------------------------------------ one metadata folder per topic

def _fsspec_memory(netloc: str):  # type: ignore[no-untyped-def]
    import fsspec

    from shale.storage._fsspec import FsspecStore

    return FsspecStore(fsspec.filesystem("memory"), "fsmem", netloc)


def test_topics_on_two_hosts_keep_their_metadata_apart() -> None:
    """fsspec topics ``fsmem://host-a/topics/t`` and ``fsmem://host-b/topics/t`` with one
    ``--metadata`` folder: each has its own documents."""
    register_backend("fsmem", _fsspec_memory)
    meta = f"memory://meta-{uuid.uuid4().hex[:8]}"
    run = uuid.uuid4().hex[:8]
    a, b = f"fsmem://host-a-{run}/topics/t", f"fsmem://host-b-{run}/topics/t"
    for uri, n in ((a, 3), (b, 5)):
        with TopicWriter(uri, metadata_uri=meta) as w:
            for i in range(n):
                w.append(f"k{i}", "v")
    ma, mb = TopicMetadata.open(a, meta), TopicMetadata.open(b, meta)
    assert (ma.load_topic().records, mb.load_topic().records) == (3, 5)
    assert ma.docs.url("topic.json") != mb.docs.url("topic.json")
    assert f"host-a-{run}" in ma.docs.url("topic.json") and f"host-b-{run}" in mb.docs.url("topic.json")


@pytest.mark.s3
def test_topics_in_two_buckets_keep_their_metadata_apart(s3_bucket: str, moto_endpoint: str, tmp_path: Path) -> None:
    import boto3

    other = f"shale-test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=other)
    meta = str(tmp_path / "meta")
    for bucket, n in ((s3_bucket, 2), (other, 4)):
        r = run_cli("produce", f"s3://{bucket}/topics/t", "--metadata", meta,
                    input="".join(json.dumps({"key": f"k{i}", "value": "v"}) + "\n" for i in range(n)))
        assert r.returncode == 0, r.stderr
    got = [json.loads(run_cli("status", f"s3://{b}/topics/t", "--metadata", meta, "--json").stdout)["records"]
           for b in (s3_bucket, other)]
    assert got == [2, 4]


def test_each_store_names_its_own_canonical_location() -> None:
    register_backend("fsmem", _fsspec_memory)
    assert resolve("fsmem://Host-A/x").store.authority != resolve("fsmem://host-b/x").store.authority
    assert resolve("memory://one/x").store.authority == "one"
    assert resolve("/tmp/x").store.authority == ""


# ------------------------------------------- truncation above the horizon, and dry runs

def _produce(topic: str, ledgers: int, per: int = 10) -> None:
    with TopicWriter(topic, max_ledger_records=per) as w:
        for i in range(ledgers * per):
            w.append(f"k{i % 7}", f"v{i}")


def test_truncate_refuses_ledgers_above_the_horizon_and_says_what_it_would_lose(disk_topic_uri: str) -> None:
    _produce(disk_topic_uri, 3)
    assert run_cli("compact", disk_topic_uri).returncode == 0
    _produce(disk_topic_uri, 2)  # ledgers 4 and 5: above the horizon
    r = run_cli("truncate", disk_topic_uri, "--before-ledger", "5")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "10 records" in r.stderr and "ledger 4" in r.stderr and "--allow-uncompacted" in r.stderr
    assert len(TopicMetadata.open(disk_topic_uri).load_topic().ledgers) == 5  # nothing removed
    # below the horizon: fine
    r = run_cli("truncate", disk_topic_uri, "--before-ledger", "4", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["removed"] == [1, 2, 3] and doc["records_lost"] == 0 and doc["ledgers"] == 2
    # told to: it does, and says how many records that lost
    r = run_cli("truncate", disk_topic_uri, "--before-ledger", "5", "--allow-uncompacted", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["records_lost"] == 10, r.stderr
    assert [lg.id for lg in TopicMetadata.open(disk_topic_uri).load_topic().ledgers] == [5]


def test_truncate_dry_run_removes_nothing_and_lists_what_would_go(tmp_path: Path) -> None:
    topic = str(tmp_path / "t")
    _produce(topic, 3)
    assert run_cli("compact", topic).returncode == 0
    before = sorted(p.name for p in (tmp_path / "t").rglob("*"))
    r = run_cli("truncate", topic, "--before-ledger", "3", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "would remove 2 ledgers (1-2), 20 records" in r.stdout
    assert sorted(p.name for p in (tmp_path / "t").rglob("*")) == before
    assert len(TopicMetadata.open(topic).load_topic().ledgers) == 3


@pytest.mark.parametrize(("n", "needle"), [("9", "past the last ledger (3)"), ("0", "start at 1")])
def test_truncate_refuses_a_ledger_id_out_of_range(tmp_path: Path, n: str, needle: str) -> None:
    topic = str(tmp_path / "t")
    _produce(topic, 3)
    r = run_cli("truncate", topic, "--before-ledger", n, "--allow-uncompacted")
    assert r.returncode == 2 and needle in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert len(TopicMetadata.open(topic).load_topic().ledgers) == 3


# ------------------------------------------------------------- status of a damaged topic

def test_status_reports_a_damaged_topic_and_names_the_damaged_object(disk_topic_uri: str) -> None:
    topic = disk_topic_uri
    _produce(topic, 3)
    meta = TopicMetadata.open(topic)
    lg = meta.load_topic().ledgers[-1]
    store, key = meta.topic.store, meta.topic.key(lg.object)
    data = bytearray(store.get(key))
    data[-10] ^= 0xFF  # the footer's trailer
    store.delete(key)
    store.put(key, bytes(data))
    r = run_cli("status", topic, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ledgers"] == 3 and doc["records"] == 30
    assert [d["object"] for d in doc["damaged"]] == [lg.object]
    assert lg.object.split("/")[-1] in r.stderr and r.stderr.count("\n") == 1  # a warning line names it
    text = run_cli("status", topic)
    assert text.returncode == 0 and "damaged" in text.stdout and lg.object in text.stdout


def test_gc_grace_zero_deletes_the_compacted_ledger_the_run_just_retired(tmp_path: Path) -> None:
    topic = str(tmp_path / "t")
    _produce(topic, 2)
    assert run_cli("compact", topic).returncode == 0
    first = TopicMetadata.open(topic).load_compaction()
    _produce(topic, 1)
    r = run_cli("compact", topic, "--gc-grace", "0", "--json")
    assert r.returncode == 0, r.stderr
    state = TopicMetadata.open(topic).load_compaction()
    assert state.epoch == 2 and state.retired == ()
    # what the first run wrote and the second no longer names is gone already
    gone = {p.object for p in first.parts} - {p.object for p in state.parts}
    assert gone and not any((tmp_path / "t" / name).exists() for name in gone)
    assert all((tmp_path / "t" / p.object).exists() for p in state.parts)


# ------------------------------------------------------------------ messages for people

def test_run_summaries_read_as_text_not_python(tmp_path: Path) -> None:
    topic = str(tmp_path / "t")
    _produce(topic, 1)
    dry = run_cli("compact", topic, "--dry-run")
    first = run_cli("compact", topic)
    _produce(topic, 1)
    second = run_cli("compact", topic)
    for r in (dry, first, second):
        assert r.returncode == 0, r.stderr
        for python in ("None", "(s)", "1 ledgers", "0 part"):
            assert python not in r.stdout, (python, r.stdout)
    assert "the first compaction" in first.stdout and "previous compacted ledger" not in first.stdout
    assert "from 1 ledger," in first.stdout and "in 1 part," in first.stdout
    assert "would keep 7 records" in dry.stdout
    assert "(was 1:0:9)" in second.stdout and "and the previous compacted ledger" in second.stdout


@pytest.mark.s3
def test_a_missing_bucket_says_so(moto_endpoint: str) -> None:
    for args in (("status", "s3://shale-no-such-bucket/t"), ("read", "s3://shale-no-such-bucket/t"),
                 ("produce", "s3://shale-no-such-bucket/t")):
        r = run_cli(*args, input="")
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "no such bucket 'shale-no-such-bucket'" in r.stderr and "no topic" not in r.stderr, r.stderr
    r = run_cli("compact", "--all", "s3://shale-no-such-bucket/topics")
    assert r.returncode == 2 and "no such bucket" in r.stderr, r.stderr


@pytest.mark.parametrize(("env", "needle"), [
    ({"AWS_ENDPOINT_URL": "not a url"}, "AWS_ENDPOINT_URL 'not a url' is not an endpoint URL"),
    ({"AWS_PROFILE": "shale-no-such-profile"}, "AWS_PROFILE 'shale-no-such-profile': no such profile"),
])
def test_bad_aws_settings_are_one_line_usage_errors(env: dict[str, str], needle: str) -> None:
    r = run_cli("status", "s3://bucket/t", env={"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y", **env})
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr
    assert "Error" not in r.stderr  # no Python class name


def test_an_unreachable_endpoint_is_named() -> None:
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
           "SHALE_S3_CONNECT_TIMEOUT": "1", "SHALE_S3_ATTEMPTS": "2"}
    r = run_cli("status", "s3://bucket/t", env=env)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "http://127.0.0.1:9" in r.stderr and "EndpointConnectionError" not in r.stderr


@pytest.mark.parametrize("scheme", ["s3a", "s3n"])
def test_hadoop_s3_schemes_say_to_use_s3(scheme: str) -> None:
    r = run_cli("status", f"{scheme}://bucket/topics/t")
    assert r.returncode == 2 and "use s3://bucket/topics/t" in r.stderr and r.stderr.count("\n") == 1, r.stderr


# ----------------------------------------------------------------------------- scrub

def test_verify_scrub_finds_a_flipped_byte_in_a_superseded_entry(disk_topic_uri: str, tmp_path: Path) -> None:
    # ledger 1 holds old values of k0..k9, every one superseded by ledger 2
    _produce(disk_topic_uri, 2, per=10)
    with TopicWriter(disk_topic_uri, max_ledger_records=10) as w:
        for i in range(10):
            w.append(f"k{i % 7}", f"new{i}")
    assert run_cli("compact", disk_topic_uri).returncode == 0
    meta = TopicMetadata.open(disk_topic_uri)
    first = meta.load_topic().ledgers[0]
    store, key = meta.topic.store, meta.topic.key(first.object)
    data = bytearray(store.get(key))
    data[40] ^= 0x01  # inside the first entry's payload
    store.delete(key)
    store.put(key, bytes(data))
    # neither compaction nor plain verification reads that entry again
    assert run_cli("compact", disk_topic_uri).returncode == 0
    assert run_cli("verify", disk_topic_uri).returncode == 0
    r = run_cli("verify", disk_topic_uri, "--scrub", "--json", "--max-read-bytes-per-second", "1MB")
    assert r.returncode == 4, r.stderr
    doc = json.loads(r.stdout.splitlines()[0])
    assert doc["ok"] is False and [d["object"] for d in doc["damaged"]] == [first.object]
    assert "checksum" in doc["damaged"][0]["error"] or "frame" in doc["damaged"][0]["error"]
    assert doc["objects"] == len(meta.load_topic().ledgers) + len(meta.load_compaction().parts)
    text = run_cli("verify", disk_topic_uri, "--scrub")
    assert text.returncode == 4 and f"damaged {first.object}" in text.stdout, text.stdout


def test_scrub_counts_objects_collected_meanwhile_as_gone_not_damaged(topic_uri: str) -> None:
    from shale.compactor import CompactionConfig, Compactor
    from shale.maintenance.scrub import scrub_topic

    def produce(n: int, tag: str) -> None:
        with TopicWriter(topic_uri, max_ledger_records=10) as w:
            for i in range(n):
                w.append(f"k{i % 50}", f"{tag}{i}")

    produce(200, "a")
    assert Compactor(topic_uri, CompactionConfig(reuse_min_bytes=1 << 40)).run().status == "compacted"
    produce(200, "b")
    fired: list[str] = []

    def meanwhile(done: int, total: int) -> None:
        # a long, throttled scrub sees compactions publish and their gc collect retired parts
        if not fired:
            fired.append(Compactor(topic_uri, CompactionConfig(gc_grace_ms=0, reuse_min_bytes=1 << 40)).run().status)

    report = scrub_topic(TopicMetadata.open(topic_uri), progress=meanwhile)
    assert fired == ["compacted"]
    assert report.ok and report.gone >= 1, report.human()
