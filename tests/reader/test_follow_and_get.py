"""Tailing a topic (``shale read --follow``, ``TopicReader(follow=True)``, a following
``TableView``) and point lookups (``shale get``, :func:`shale.reader.lookup`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from shale.compactor import Compactor
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TableView, TopicReader, lookup
from tests.conftest import ROOT, run_cli, run_cli_here
from tests.gates import GUARD_S


def _produce(topic: str, items: list[tuple[str, str | None]], per: int = 10) -> None:
    with TopicWriter(topic, max_ledger_records=per) as w:
        for k, v in items:
            w.append(k, v)


def _updates(n: int, keys: int, tag: str = "v") -> list[tuple[str, str | None]]:
    return [(f"k{i % keys}", f"{tag}{i}") for i in range(n)]


# ------------------------------------------------------------------------- following

def test_a_following_reader_gets_records_produced_after_it_started(topic_uri: str) -> None:
    _produce(topic_uri, _updates(20, 5))
    r = TopicReader(topic_uri, follow=True, poll_interval=0.01)
    assert len(r.read(20)) == 20
    assert not r.has_message_available()
    assert r.read_next(timeout=0.05) is None  # (it looks once at least, whatever the timeout)
    _produce(topic_uri, [("late", "arrival")])
    assert r.has_message_available()
    m = r.read_next(timeout=GUARD_S)  # there already: the guard is reached only by a hang
    assert m is not None and m.key == b"late" and m.value == b"arrival"
    # iterating a following reader waits for more instead of ending
    got: list[bytes] = []

    def consume() -> None:
        for m in r:
            got.append(m.value or b"")
            if len(got) == 2:
                return

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    _produce(topic_uri, [("a", "1"), ("b", "2")], per=1)
    t.join(GUARD_S)
    assert not t.is_alive(), f"the follower hung after {got}"
    assert got == [b"1", b"2"]


def test_a_compacted_follower_switches_to_the_tail_with_no_gap_and_no_duplicate(topic_uri: str) -> None:
    _produce(topic_uri, _updates(100, 10))
    assert Compactor(topic_uri).run().status == "compacted"
    _produce(topic_uri, _updates(15, 10, tag="t"))  # above the horizon
    r = TopicReader(topic_uri, read_compacted=True, follow=True, poll_interval=0.01)
    first = r.read(10 + 15)
    state = TopicMetadata.open(topic_uri).load_compaction()
    assert state.horizon is not None
    assert [m.id <= state.horizon for m in first] == [True] * 10 + [False] * 15
    _produce(topic_uri, [("k1", "after")])
    m = r.read_next(timeout=GUARD_S)  # there already: the guard is reached only by a hang
    ids = [x.id for x in first] + [m.id if m else None]
    assert m is not None and m.value == b"after"
    assert ids == sorted(ids) and len(set(ids)) == len(ids)  # no duplicate, in order


def test_a_following_table_view_calls_its_listener(topic_uri: str) -> None:
    _produce(topic_uri, _updates(20, 4))
    view = TableView(topic_uri)
    seen: list[tuple[bytes, bytes | None]] = []
    two = threading.Event()

    def listener(key: bytes, value: bytes | None) -> None:
        seen.append((key, value))
        if len(seen) == 2:
            two.set()

    view.for_each_and_listen(listener)
    assert sorted(k for k, _ in seen) == [b"k0", b"k1", b"k2", b"k3"]
    seen.clear()
    two.clear()
    _produce(topic_uri, [("k9", "new"), ("k0", None)], per=1)
    stop = threading.Event()
    t = threading.Thread(target=view.follow, kwargs={"poll_interval": 0.01, "stop": stop}, daemon=True)
    t.start()
    heard = two.wait(GUARD_S)  # the guard is reached only when the changes never come
    stop.set()
    t.join(GUARD_S)
    assert heard and not t.is_alive(), seen
    assert seen == [(b"k9", b"new"), (b"k0", None)]
    assert view.get(b"k9") == b"new" and b"k0" not in view


def test_read_follow_prints_new_records_and_ctrl_c_exits_0(disk_topic_uri: str) -> None:
    _produce(disk_topic_uri, _updates(5, 5))
    assert Compactor(disk_topic_uri).run().status == "compacted"
    exe = Path(sys.executable).parent / "shale"
    p = subprocess.Popen([str(exe), "read", disk_topic_uri, "--compacted", "--follow", "--poll-interval", "50ms"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=os.environ.copy())
    try:
        assert p.stdout is not None
        lines = [p.stdout.readline() for _ in range(5)]
        _produce(disk_topic_uri, [("k1", "produced-after-start")])
        lines.append(p.stdout.readline())
    finally:
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    docs = [json.loads(x) for x in lines]
    assert docs[-1]["value"] == "produced-after-start"
    assert len({d["id"] for d in docs}) == 6
    assert out == "" or all(json.loads(x) for x in out.splitlines())  # whole records only


# ---------------------------------------------------------------------------- lookups

def test_lookup_answers_from_the_tail_then_the_compacted_view(topic_uri: str) -> None:
    _produce(topic_uri, _updates(200, 50))
    assert Compactor(topic_uri).run().status == "compacted"
    _produce(topic_uri, [("k3", "newer"), ("k4", None)])
    meta = TopicMetadata.open(topic_uri)
    view = TableView(topic_uri)
    for key in (b"k3", b"k4", b"k7", b"nope"):
        got = lookup(meta, key)
        assert got.value == view.get(key), key
    got = lookup(meta, b"k7")
    # only entries whose hashes match were read: one entry, in the compacted part
    assert got.entries_read == 1 and got.message is not None and got.message.value == b"v157"
    assert lookup(meta, b"nope").entries_read == 0


def test_shale_get_prints_the_latest_value(disk_topic_uri: str) -> None:
    _produce(disk_topic_uri, _updates(60, 6))
    assert run_cli_here("compact", disk_topic_uri).returncode == 0
    _produce(disk_topic_uri, [("k2", "fresh")])
    r = run_cli_here("get", disk_topic_uri, "k2")
    assert r.returncode == 0 and json.loads(r.stdout)["value"] == "fresh", r.stderr
    r = run_cli_here("get", disk_topic_uri, "k5")
    assert r.returncode == 0 and json.loads(r.stdout)["value"] == "v59", r.stderr
    r = run_cli_here("get", disk_topic_uri, "missing")
    assert r.returncode == 5 and r.stdout == "" and "no value for key 'missing'" in r.stderr, r.stderr


def test_shale_get_says_what_can_be_known_of_a_key_without_a_value(tmp_path: Path) -> None:
    """A key compaction dropped is not "never written": the original ledgers it replaced
    still hold its records, and say whether it was deleted or expired under the key TTL;
    "never written" only when no ledger holds it and retention removed none."""
    uri = str(tmp_path / "t")
    old = 1_700_000_000.0  # 2023: older than any key TTL of a day
    with TopicWriter(uri, batch_size=2, max_ledger_records=4, clock=lambda: old) as w:
        for k, v in (("stale", "v0"), ("gone", "v1"), ("gone", None), ("other", "v3")):
            w.append(k, v)
    _produce(uri, [("fresh", "v4")])

    def why(key: str) -> str:
        r = run_cli_here("get", uri, key)
        assert r.returncode == 5 and r.stdout == "", (key, r.stdout, r.stderr)
        head = f"shale: no value for key {key!r} in {uri} ("
        assert r.stderr.startswith(head) and r.stderr.endswith(")\n"), r.stderr
        return r.stderr[len(head):-2]

    assert why("gone") == "deleted" and why("nope") == "never written"  # before any compaction
    assert run_cli_here("config", uri, "--set", "key-ttl=1d").returncode == 0
    assert why("stale") == "expired"  # the view says so (its latest record is older than the TTL)
    assert run_cli_here("compact", uri, "--delete-retention", "0").returncode == 0
    assert why("stale") == ("expired: its latest record (2023-11-14 22:13:20 UTC) is older than the key TTL (1d), "
                            "and a compaction dropped it")
    assert why("gone") == "deleted: its latest record is a tombstone, which a compaction dropped past the delete " \
                          "retention"
    assert why("nope") == "never written"
    assert json.loads(run_cli_here("get", uri, "fresh").stdout)["value"] == "v4"
    # once retention removed the ledgers that held them, nothing is known for sure
    assert run_cli_here("truncate", uri, "--before-ledger", "2").returncode == 0
    assert why("stale") == why("nope") == ("no record of it left: never written, or only in ledgers retention "
                                           "removed (up to ledger 1)")


# ------------------------------------------------------------------------ value formats

def test_read_value_format_json_and_table_implies_compacted(tmp_path: Path) -> None:
    topic = str(tmp_path / "t")
    records = [{"key": "a", "value": {"name": "Ann", "n": 1}}, {"key": "b", "value": "plain"},
               {"key": "a", "value": {"name": "Ann", "n": 2}}]
    r = run_cli_here("produce", topic, input="".join(json.dumps(x) + "\n" for x in records))
    assert r.returncode == 0, r.stderr
    assert run_cli_here("compact", topic).returncode == 0
    r = run_cli_here("read", topic, "--table", "--value-format", "json")
    assert r.returncode == 0, r.stderr
    got = {d["key"]: d["value"] for d in map(json.loads, r.stdout.splitlines())}
    assert got == {"a": {"name": "Ann", "n": 2}, "b": "plain"}
    raw = [json.loads(x)["value"] for x in run_cli_here("read", topic).stdout.splitlines()]
    assert raw[0] == '{"name": "Ann", "n": 1}'  # text by default: the value as stored, as given


@pytest.mark.parametrize("bad", ['{"key": "a", "value": 5}', '{"key": "a", "value": true}'])
def test_produce_refuses_values_that_are_not_text_or_objects(tmp_path: Path, bad: str) -> None:
    r = run_cli_here("produce", str(tmp_path / "t"), input=bad + "\n")
    assert r.returncode == 2 and "<stdin>:1" in r.stderr, r.stderr


def test_read_follow_with_a_limit_ends_at_the_limit(tmp_path: Path) -> None:
    topic = str(tmp_path / "t")
    _produce(topic, _updates(8, 8))
    r = run_cli("read", topic, "--follow", "--limit", "5", timeout=60)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 5, r.stderr


def test_compacted_readers_follow_retention_into_the_compacted_view(tmp_path: Path) -> None:
    """Ledgers a view or a follower has yet to read are compacted and then removed by
    retention: their records come from the newer compacted view, none is lost."""
    topic = str(tmp_path / "t")
    _produce(topic, [(f"a{i}", "1") for i in range(20)])
    view = TableView(topic)
    heard: list[bytes] = []
    view.listen(lambda key, value: heard.append(key))
    follower = TopicReader(topic, read_compacted=True, follow=True, poll_interval=0.01)
    assert len(follower.read()) == 20
    _produce(topic, [(f"b{i}", "2") for i in range(20)])
    assert run_cli_here("config", topic, "--set", "retention-bytes=1").returncode == 0
    r = run_cli_here("compact", topic)
    assert r.returncode == 0 and "retention removed" in r.stdout, r.stdout
    assert TopicMetadata.open(topic).load_topic().ledgers == ()
    view.refresh()
    assert len(view) == 40 and sorted(heard) == sorted(f"b{i}".encode() for i in range(20))
    got = follower.read()
    assert sorted(m.key for m in got) == sorted(f"b{i}".encode() for i in range(20))
