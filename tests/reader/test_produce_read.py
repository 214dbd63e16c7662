"""Producer and plain reader: round trips, seeking, rolling, concurrent writers."""

from __future__ import annotations

import base64
import json
import threading

import pytest

from shale.ledger.ids import MessageId
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import LATEST, TopicReader
from tests.conftest import run_cli, run_cli_here


def produce(uri: str, n: int, **kw: int) -> None:
    with TopicWriter(uri, **kw) as w:
        for i in range(n):
            w.append(f"k{i % 7}", f"v{i}", {"i": str(i)}, event_time=i)


def test_round_trip_and_ids(topic_uri: str) -> None:
    with TopicWriter(topic_uri, batch_size=3, max_ledger_records=10) as w:
        for i in range(25):
            w.append(f"k{i}", f"v{i}", {"i": str(i)}, event_time=1000 + i)
        w.append(None, "keyless")
        w.append("gone", None)
    res = w.result
    assert res.records == 27 and res.tombstones == 1 and res.keyless == 1
    assert len(res.ledgers) == 3  # 10 + 10 + 7 records, ledgers roll at 10 records
    assert str(res.first_id) == "1:0:0" and str(res.last_id) == "3:2:0"
    msgs = TopicReader(topic_uri).read()
    assert [m.value for m in msgs[:25]] == [f"v{i}".encode() for i in range(25)]
    assert msgs[0].id == MessageId(1, 0, 0) and msgs[3].id == MessageId(1, 1, 0)
    assert msgs[10].id == MessageId(2, 0, 0)
    assert msgs[4].properties == {"i": "4"} and msgs[4].event_time == 1004
    assert msgs[25].key is None and msgs[26].is_tombstone
    ids = [m.id for m in msgs]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert msgs[-1].id == res.last_id


def test_seek_positions(topic_uri: str) -> None:
    produce(topic_uri, 30, batch_size=4, max_ledger_records=12)
    r = TopicReader(topic_uri, start=MessageId(2, 1, 2))
    first = r.read(1)[0]
    assert first.id == MessageId(2, 1, 2) and first.value == b"v18"
    # a position that does not exist reads from the next existing one
    r.seek(MessageId(1, 2, 99))
    assert r.read(1)[0].id == MessageId(2, 0, 0)
    r.seek(MessageId(1, 9, 0))
    assert r.read(1)[0].id == MessageId(2, 0, 0)
    r.seek(MessageId(0, 0, 0))
    assert r.read(1)[0].id == MessageId(1, 0, 0)
    r.seek(MessageId(99, 0, 0))
    assert r.read() == []
    r.seek(LATEST)
    assert r.read() == []
    produce(topic_uri, 2)
    assert [m.value for m in r.read()] == [b"v0", b"v1"]


def test_reader_continues_where_it_stopped(topic_uri: str) -> None:
    produce(topic_uri, 10, batch_size=3)
    r = TopicReader(topic_uri)
    a = r.read(4)
    b = r.read()
    assert [m.value for m in a + b] == [f"v{i}".encode() for i in range(10)]
    assert r.read() == []


def test_ledgers_roll_by_bytes(topic_uri: str) -> None:
    with TopicWriter(topic_uri, batch_size=1, max_ledger_bytes=2000, compression="none") as w:
        for _ in range(50):
            w.append("k", "x" * 100)
    state = TopicMetadata.open(topic_uri).load_topic()
    assert len(state.ledgers) > 3
    # a ledger stops growing at the first entry that reaches the limit
    assert all(lg.bytes < 2000 + 150 for lg in state.ledgers)
    assert sum(lg.records for lg in state.ledgers) == 50


def test_concurrent_writers_never_lose_or_interleave(topic_uri: str) -> None:
    def write(name: str) -> None:
        with TopicWriter(topic_uri, batch_size=5, max_ledger_records=20) as w:
            for i in range(100):
                w.append(name, f"{name}-{i}")

    ts = [threading.Thread(target=write, args=(f"w{i}",)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    state = TopicMetadata.open(topic_uri).load_topic()
    assert [lg.id for lg in state.ledgers] == list(range(1, len(state.ledgers) + 1))
    msgs = TopicReader(topic_uri).read()
    assert len(msgs) == 400
    by_writer: dict[str, list[int]] = {}
    for m in msgs:
        name, i = m.value.decode().split("-")  # type: ignore[union-attr]
        by_writer.setdefault(name, []).append(int(i))
    # every writer's records are all there, in its own order
    assert all(v == list(range(100)) for v in by_writer.values()) and len(by_writer) == 4
    # each ledger holds one writer's records only
    for lg in state.ledgers:
        names = {m.key for m in msgs if m.id.ledger == lg.id}
        assert len(names) == 1
    # no unregistered ledger objects were left behind by the losers
    loc = TopicMetadata.open(topic_uri).topic
    objects = {loc.relative(o.key) for o in loc.store.list(loc.key("ledgers"))}
    assert objects == {lg.object for lg in state.ledgers}


@pytest.mark.slow
def test_cli_round_trip_100k_records_byte_exact(disk_topic_uri: str, tmp_path: object) -> None:
    lines = []
    for i in range(100_000):
        rec: dict[str, object] = {"key": f"user-{i % 9973}", "properties": {"seq": str(i)}}
        if i % 10 == 3:
            rec["value_b64"] = base64.b64encode(bytes([i % 256, 0xFF, 0xFE, i % 7])).decode()
        elif i % 1000 == 5:
            rec["value"] = None
        else:
            rec["value"] = f"value-{i}-é"
        if i % 3 == 0:
            rec["event_time"] = i
        if i % 5000 == 7:
            rec["key"] = None
        lines.append(rec)
    text = "".join(json.dumps(r) + "\n" for r in lines)
    p = run_cli("produce", disk_topic_uri, "--max-ledger-records", "30000", "--batch-size", "64", "--json",
                input=text)
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert summary["records"] == 100_000 and summary["ledgers"] == 4
    assert summary["first_id"] == "1:0:0"
    r = run_cli("read", disk_topic_uri)
    assert r.returncode == 0, r.stderr
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(out) == 100_000
    assert out[-1]["id"] == summary["last_id"]
    for src, got in zip(lines, out, strict=True):
        assert got["key"] == src["key"]
        assert got["properties"] == src["properties"]
        assert got["event_time"] == src.get("event_time")
        if "value_b64" in src:
            assert got["value_b64"] == src["value_b64"]
        else:
            assert got["value"] == src["value"]
    st = run_cli("status", disk_topic_uri, "--json")
    status = json.loads(st.stdout)
    assert status["records"] == 100_000 and status["ledgers"] == 4 and status["last_id"] == summary["last_id"]


def test_cli_read_start_and_limit(disk_topic_uri: str) -> None:
    topic_uri = disk_topic_uri
    produce(topic_uri, 20, batch_size=5)
    p = run_cli_here("read", topic_uri, "--start", "1:2:3", "--limit", "2")
    assert p.returncode == 0, p.stderr
    got = [json.loads(x) for x in p.stdout.splitlines()]
    assert [g["id"] for g in got] == ["1:2:3", "1:2:4"] and got[0]["value"] == "v13"
    p = run_cli_here("read", topic_uri, "--start", "latest")
    assert p.returncode == 0 and p.stdout == ""


def test_metadata_elsewhere(tmp_path: object, root_uri: str) -> None:
    """``--metadata`` keeps the documents on another store; readers pass the same URI."""
    import pathlib

    meta_uri = str(pathlib.Path(str(tmp_path)) / "metadata-store")
    topic = f"{root_uri}/topics/elsewhere"
    with TopicWriter(topic, metadata_uri=meta_uri) as w:
        w.append("k", "v1")
        w.append("k", "v2")
    from shale.compactor import Compactor

    assert Compactor(topic, metadata_uri=meta_uri).run().status == "compacted"
    assert [m.value for m in TopicReader(topic, metadata_uri=meta_uri, read_compacted=True).read()] == [b"v2"]
    meta = TopicMetadata.open(topic, meta_uri)
    assert meta.meta.store.exists(meta.meta.key("topic.json"))
    assert not meta.topic.store.exists(meta.topic.key("_meta/topic.json"))
    with pytest.raises(FileNotFoundError):
        TopicReader(topic)
