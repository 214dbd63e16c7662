"""Compaction semantics and guarantees (log-compaction-guarantees.txt, PIP-14)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shale.compactor import CompactionConfig, Compactor, collect_garbage
from shale.ledger.errors import TopicNotFoundError
from shale.ledger.ids import MessageId
from shale.ledger.ordering import EVENT_TIME, OFFSET
from shale.ledger.record import Message, Record
from shale.metadata.subscriptions import Subscriptions
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TableView, TopicReader
from tests.conftest import run_cli, run_cli_here

HOUR = 3_600_000


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def produce(uri: str, items: list[tuple[str | None, str | None]], clock: Clock | None = None, **kw: int | str) -> None:
    opts: dict[str, object] = {"batch_size": 3, "max_ledger_records": 10, **kw}
    if clock is not None:
        opts["clock"] = clock
    with TopicWriter(uri, **opts) as w:  # type: ignore[arg-type]
        for k, v in items:
            w.append(k, v)


def full(uri: str) -> list[Message]:
    return TopicReader(uri).read()


def compacted(uri: str, start: MessageId | None = None) -> list[Message]:
    return TopicReader(uri, read_compacted=True, **({"start": start} if start else {})).read()


def expected_view(records: list[Message], horizon: MessageId | None, *, keep_tombstones: bool,
                  retain_null_key: bool = False) -> list[Message]:
    """The plain-dict model of a compacted read."""
    below = [m for m in records if horizon is not None and m.id <= horizon]
    latest: dict[bytes, MessageId] = {}
    for m in below:
        if m.key is not None:
            latest[m.key] = m.id
    out = []
    for m in below:
        if m.key is None:
            if retain_null_key:
                out.append(m)
        elif latest[m.key] == m.id and (keep_tombstones or not m.is_tombstone):
            out.append(m)
    return out + [m for m in records if horizon is None or m.id > horizon]


def updates(n: int, keys: int) -> list[tuple[str | None, str | None]]:
    return [(f"k{i % keys}", f"v{i}") for i in range(n)]


def test_four_guarantees(topic_uri: str) -> None:
    produce(topic_uri, updates(60, 7) + [("k3", None), (None, "no key")])
    before = full(topic_uri)
    s = Compactor(topic_uri).run()
    assert s.status == "compacted" and s.keys == 6 and s.tombstones_kept == 1 and s.keyless_dropped == 1
    horizon = MessageId.parse(s.horizon or "")
    assert horizon == before[-1].id  # Pulsar's inclusive horizon: the last record compacted
    view = compacted(topic_uri)
    # 4. from the start: the final state of every key, in write order (tombstone kept 24 h)
    assert view == expected_view(before, horizon, keep_tombstones=True)
    assert {m.key: m.value for m in view} == {f"k{i}".encode(): v for i, v in
                                             [(i, f"v{max(j for j in range(60) if j % 7 == i)}".encode())
                                              for i in range(7)] if i != 3} | {b"k3": None}
    # 2. order kept  3. ids unchanged: every message equals its original
    ids = [m.id for m in view]
    assert ids == sorted(ids)
    by_id = {m.id: m for m in before}
    assert all(by_id[m.id] == m for m in view)
    # original ledgers untouched: a plain read is byte-for-byte what it was
    assert full(topic_uri) == before
    # 1. a consumer in the head sees every new record, ids sequential
    produce(topic_uri, updates(5, 2))
    tail = compacted(topic_uri, start=horizon.successor())
    assert [m.value for m in tail] == [f"v{i}".encode() for i in range(5)]


def test_no_gap_no_duplicate_at_the_horizon(topic_uri: str) -> None:
    produce(topic_uri, updates(40, 5))
    Compactor(topic_uri).run()
    produce(topic_uri, updates(17, 5))
    allm = full(topic_uri)
    h = TopicMetadata.open(topic_uri).load_compaction().horizon
    view = compacted(topic_uri)
    assert view == expected_view(allm, h, keep_tombstones=True)
    assert len({m.id for m in view}) == len(view)
    assert [m for m in view if h is not None and m.id > h] == [m for m in allm if h is not None and m.id > h]


def test_seek_to_compacted_away_id_reads_next_survivor(topic_uri: str) -> None:
    produce(topic_uri, updates(30, 3))
    before = full(topic_uri)
    Compactor(topic_uri).run()
    view = compacted(topic_uri)
    survivors = {m.id for m in view}
    for m in before:
        got = compacted(topic_uri, start=m.id)
        assert got == [v for v in view if v.id >= m.id]
        if m.id not in survivors:
            assert not got or got[0].id > m.id


def test_tombstone_retention_counts_from_first_compaction(topic_uri: str) -> None:
    clock = Clock()
    produce(topic_uri, [("a", "1"), ("b", "1"), ("a", None)], clock)
    cfg = CompactionConfig(delete_retention_ms=2 * HOUR)
    assert Compactor(topic_uri, cfg, clock=clock).run().tombstones_kept == 1
    clock.advance(3600)
    produce(topic_uri, [("c", "1")], clock)
    s = Compactor(topic_uri, cfg, clock=clock).run()
    assert s.tombstones_kept == 1 and s.tombstones_dropped == 0  # 1 h after it was first kept
    assert [m.key for m in compacted(topic_uri)] == [b"b", b"a", b"c"]
    clock.advance(3600)
    # no new records, but the tombstone expired: the run still has work to do
    s = Compactor(topic_uri, cfg, clock=clock).run()
    assert s.status == "compacted" and s.tombstones_dropped == 1 and s.tombstones_kept == 0
    assert [m.key for m in compacted(topic_uri)] == [b"b", b"c"]
    assert Compactor(topic_uri, cfg, clock=clock).run().status == "nothing-to-do"


def test_delete_retention_zero_drops_tombstones_at_once(topic_uri: str) -> None:
    produce(topic_uri, [("a", "1"), ("b", "1"), ("a", ""), ("c", None)])
    s = Compactor(topic_uri, CompactionConfig(delete_retention_ms=0)).run()
    assert s.tombstones_dropped == 2 and s.keys == 1
    assert [(m.key, m.value) for m in compacted(topic_uri)] == [(b"b", b"1")]


@pytest.mark.parametrize("order", [OFFSET, EVENT_TIME])
def test_a_winning_tombstone_past_the_key_ttl_goes_at_once(tmp_path: Path, order: str) -> None:
    """Key expiry drops a key whose winner is older than the TTL as if it were deleted: a
    winning tombstone that old goes too, at once, though no run has kept it for the delete
    retention (a day) and an active subscription has yet to read it (key expiry is a rule
    of age, never held); a younger tombstone stays for its retention."""
    clock = Clock()
    uri = str(tmp_path / "t")
    produce(uri, [("a", "1"), ("b", "1"), ("a", None), ("c", "1")], clock)
    clock.advance(3 * 3600)
    produce(uri, [("d", "1"), ("d", None), ("e", "1")], clock)
    Subscriptions(TopicMetadata.open(uri)).create("app", now_ms=int(clock() * 1000))
    cfg = CompactionConfig(order=order, key_ttl_ms=2 * HOUR, delete_retention_ms=24 * HOUR)
    s = Compactor(uri, cfg, clock=clock).run()
    assert (s.status, s.tombstones_dropped, s.tombstones_kept, s.keys_expired, s.keys) == (
        "compacted", 1, 1, 2, 1), s
    assert [(m.key, m.value) for m in compacted(uri)] == [(b"d", None), (b"e", b"1")]


def test_keyless_records_dropped_or_retained(topic_uri: str, tmp_path: object) -> None:
    items = [(None, "x0"), ("a", "1"), (None, "x1"), ("a", "2")]
    produce(topic_uri, items)
    s = Compactor(topic_uri).run()
    assert s.keyless_dropped == 2
    assert [m.value for m in compacted(topic_uri)] == [b"2"]
    other = topic_uri + "-retain"
    produce(other, items)
    s = Compactor(other, CompactionConfig(retain_null_key=True)).run()
    assert s.keyless_kept == 2 and s.keyless_dropped == 0
    assert [m.value for m in compacted(other)] == [b"x0", b"x1", b"2"]


def test_batch_ids_survive_compaction(topic_uri: str) -> None:
    produce(topic_uri, [("a", "1"), ("b", "1"), ("c", "1"), ("a", "2"), ("b", "2"), ("d", "1")], batch_size=3)
    Compactor(topic_uri).run()
    view = compacted(topic_uri)
    assert [(str(m.id), m.key) for m in view] == [("1:0:2", b"c"), ("1:1:0", b"a"), ("1:1:1", b"b"),
                                                   ("1:1:2", b"d")]


def test_incremental_equals_from_scratch(topic_uri: str) -> None:
    scratch = topic_uri + "-scratch"
    for round_ in range(5):
        items = [(f"k{(i * 7 + round_) % 23}", f"r{round_}-{i}" if i % 11 else None) for i in range(40)]
        items += [(None, f"nk{round_}")]
        produce(topic_uri, items)
        produce(scratch, items)  # the same ledgers, never compacted in between
        s = Compactor(topic_uri).run()
        assert s.status == "compacted" and s.ledgers_read == 5
    Compactor(scratch).run()
    inc = [(m.id, m.key, m.value, dict(m.properties)) for m in compacted(topic_uri)]
    fresh = [(m.id, m.key, m.value, dict(m.properties)) for m in compacted(scratch)]
    assert inc == fresh


def test_incremental_run_reads_only_new_data(topic_uri: str) -> None:
    produce(topic_uri, updates(1000, 50), max_ledger_records=100, batch_size=10)
    first = Compactor(topic_uri).run()
    assert first.records_read == 1000 and first.ledgers_read == 10
    produce(topic_uri, updates(10, 50), max_ledger_records=100, batch_size=10)
    second = Compactor(topic_uri).run()
    # 50 compacted records + 10 new ones, not the topic's 1010
    assert second.records_read == 60 and second.ledgers_read == 1


def test_min_compaction_lag_holds_back_young_records(topic_uri: str) -> None:
    clock = Clock()
    produce(topic_uri, updates(10, 3), clock)
    clock.advance(600)
    produce(topic_uri, updates(10, 3), clock)
    cfg = CompactionConfig(min_compaction_lag_ms=300_000)
    s = Compactor(topic_uri, cfg, clock=clock).run()
    assert s.status == "compacted" and s.records_read == 10 and s.held_back_records == 10
    view = compacted(topic_uri)
    assert len(view) == 3 + 10  # 3 keys compacted, the 10 young records untouched
    clock.advance(301)
    s = Compactor(topic_uri, cfg, clock=clock).run()
    assert s.status == "compacted" and s.held_back_records == 0
    assert len(compacted(topic_uri)) == 3


def test_min_dirty_ratio_skips(topic_uri: str) -> None:
    produce(topic_uri, updates(200, 100))
    Compactor(topic_uri).run()
    produce(topic_uri, updates(2, 100))
    s = Compactor(topic_uri, CompactionConfig(min_dirty_ratio=0.5)).run()
    assert s.status == "skipped" and s.ok and 0 < s.dirty_ratio < 0.5
    assert TopicMetadata.open(topic_uri).load_compaction().epoch == 1
    # a ratio at the threshold runs
    assert Compactor(topic_uri, CompactionConfig(min_dirty_ratio=s.dirty_ratio)).run().status == "compacted"


def test_dry_run_publishes_and_writes_nothing(topic_uri: str) -> None:
    produce(topic_uri, updates(50, 5))
    meta = TopicMetadata.open(topic_uri)
    before = sorted(o.key for o in meta.topic.store.list(meta.topic.prefix))
    s = Compactor(topic_uri, CompactionConfig(dry_run=True)).run()
    assert s.status == "dry-run" and s.records_written == 5 and s.keys == 5
    assert sorted(o.key for o in meta.topic.store.list(meta.topic.prefix)) == before
    assert meta.load_compaction().epoch == 0


def test_lost_publish_race_publishes_nothing_and_cleans_up(topic_uri: str) -> None:
    produce(topic_uri, updates(50, 5))
    meta = TopicMetadata.open(topic_uri)
    winner: list[str] = []

    def sneak_in(msg: str) -> None:
        if msg == "publishing" and not winner:
            winner.append(Compactor(topic_uri).run().status)

    s = Compactor(topic_uri, progress=sneak_in).run()
    assert winner == ["compacted"]
    assert s.status == "conflict" and not s.ok and "another compactor" in s.message
    state = meta.load_compaction()
    assert state.epoch == 1
    # only the winner's objects exist under compacted/
    objects = {meta.topic.relative(o.key) for o in meta.topic.store.list(meta.topic.key("compacted"))}
    assert objects == {p.object for p in state.parts}


def test_retired_ledger_deleted_only_after_grace(topic_uri: str) -> None:
    clock = Clock()
    produce(topic_uri, updates(30, 5), clock)
    cfg = CompactionConfig(gc_grace_ms=600_000)
    Compactor(topic_uri, cfg, clock=clock).run()
    meta = TopicMetadata.open(topic_uri)
    first = meta.load_compaction().parts[0].object
    produce(topic_uri, updates(5, 5), clock)
    Compactor(topic_uri, cfg, clock=clock).run()
    state = meta.load_compaction()
    assert state.retired and first in state.retired[0].objects
    assert meta.topic.store.exists(meta.topic.key(first))  # readers may still hold it
    clock.advance(601)
    report = collect_garbage(meta, now_ms=int(clock() * 1000), grace_ms=600_000, orphan_grace_ms=3_600_000)
    assert report.retired_deleted == [first]
    assert not meta.topic.store.exists(meta.topic.key(first))
    assert meta.load_compaction().retired == ()
    # nothing the published state refers to was touched
    assert all(meta.topic.store.exists(meta.topic.key(p.object)) for p in meta.load_compaction().parts)


def test_a_retired_part_is_deleted_once_exactly_the_grace_has_passed(tmp_path: Path) -> None:
    """``--gc-grace``: retired parts are deleted only after this long since they were
    retired; a millisecond before, gc leaves them (and says they wait), at the grace it
    deletes them."""
    clock = Clock()
    uri = str(tmp_path / "t")
    produce(uri, updates(30, 5), clock)
    cfg = CompactionConfig(gc_grace_ms=600_000)
    Compactor(uri, cfg, clock=clock).run()
    meta = TopicMetadata.open(uri)
    first = meta.load_compaction().parts[0].object
    produce(uri, updates(5, 5), clock)
    clock.advance(60)
    Compactor(uri, cfg, clock=clock).run()
    (retired,) = meta.load_compaction().retired
    assert retired.objects == (first,) and retired.retired_ms == int(clock() * 1000)
    early = collect_garbage(meta, now_ms=retired.retired_ms + 600_000 - 1, grace_ms=600_000, orphan_grace_ms=3_600_000)
    assert (early.retired_deleted, early.retired_waiting) == ([], 1)
    assert meta.topic.store.exists(meta.topic.key(first)) and meta.load_compaction().retired == (retired,)
    due = collect_garbage(meta, now_ms=retired.retired_ms + 600_000, grace_ms=600_000, orphan_grace_ms=3_600_000)
    assert (due.retired_deleted, due.retired_waiting) == ([first], 0)
    assert not meta.topic.store.exists(meta.topic.key(first)) and meta.load_compaction().retired == ()


def test_reader_moves_to_new_state_when_its_ledger_is_collected(topic_uri: str) -> None:
    produce(topic_uri, updates(200, 40), batch_size=5)
    Compactor(topic_uri).run()
    r = TopicReader(topic_uri, read_compacted=True, chunk_bytes=4096)
    got = r.read(10)
    produce(topic_uri, updates(40, 40))
    clock = Clock(10**10)
    Compactor(topic_uri, CompactionConfig(gc_grace_ms=0), clock=clock).run()
    meta = TopicMetadata.open(topic_uri)
    collect_garbage(meta, now_ms=int(clock() * 1000), grace_ms=0, orphan_grace_ms=3_600_000)
    got += r.read()
    # the reader lost nothing: it continued in the newer compacted ledger from its place
    ids = [m.id for m in got]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    latest = {m.key: m.value for m in full(topic_uri)}
    assert {m.key: m.value for m in got} == latest


def test_orphans_of_a_crashed_run_are_collected(topic_uri: str) -> None:
    produce(topic_uri, updates(20, 5))
    meta = TopicMetadata.open(topic_uri)
    orphan = meta.topic.key("compacted/000000000009-deadbeef0000/part-00000.ledger")
    meta.topic.store.put(orphan, b"half a ledger")
    stray = meta.topic.key("ledgers/00000000000000000002-0123456789ab.ledger")
    meta.topic.store.put(stray, b"never registered")
    Compactor(topic_uri).run()
    assert meta.topic.store.exists(orphan)  # too young to be judged
    later = int(meta.topic.store.stat(orphan).mtime * 1000) + 2 * HOUR
    report = collect_garbage(meta, now_ms=later, grace_ms=0, orphan_grace_ms=HOUR)
    assert sorted(report.orphans_deleted) == ["compacted/000000000009-deadbeef0000/part-00000.ledger",
                                              "ledgers/00000000000000000002-0123456789ab.ledger"]
    assert compacted(topic_uri) == expected_view(full(topic_uri),
                                                 meta.load_compaction().horizon, keep_tombstones=True)


def test_all_keys_deleted_reads_as_nothing(topic_uri: str) -> None:
    produce(topic_uri, [("a", "1"), ("b", "1"), ("a", None), ("b", None)])
    Compactor(topic_uri, CompactionConfig(delete_retention_ms=0)).run()
    assert compacted(topic_uri) == []
    assert len(TableView(topic_uri)) == 0
    produce(topic_uri, [("c", "1")])
    assert [m.key for m in compacted(topic_uri)] == [b"c"]


def test_table_view_is_latest_value_per_key(topic_uri: str) -> None:
    produce(topic_uri, updates(50, 6) + [("k2", None)])
    Compactor(topic_uri).run()
    produce(topic_uri, [("k0", "fresh"), ("k9", "new")])
    t = TableView(topic_uri)
    model: dict[bytes, bytes] = {}
    for m in full(topic_uri):
        if m.key is not None:
            if m.is_tombstone:
                model.pop(m.key, None)
            else:
                model[m.key] = m.value or b""
    assert dict(t) == model and t[b"k0"] == b"fresh" and b"k2" not in t
    produce(topic_uri, [("k9", None)])
    assert t.refresh() == 1 and b"k9" not in t


def test_parts_roll_at_max_part_bytes(topic_uri: str) -> None:
    produce(topic_uri, [(f"key-{i}", "x" * 200) for i in range(2000)], max_ledger_records=1000, batch_size=50,
            compression="none")
    s = Compactor(topic_uri, CompactionConfig(max_part_bytes=1 << 16)).run()
    assert s.parts > 3
    state = TopicMetadata.open(topic_uri).load_compaction()
    assert [p.first_id for p in state.parts] == sorted(p.first_id for p in state.parts)  # type: ignore[type-var]
    assert len(compacted(topic_uri)) == 2000
    start = state.parts[2].first_id
    assert start is not None and compacted(topic_uri, start=start)[0].id == start


def test_missing_topic_is_an_error(root_uri: str) -> None:
    with pytest.raises(TopicNotFoundError):
        Compactor(root_uri + "/nope").run()


def test_send_keeps_publish_time(topic_uri: str) -> None:
    with TopicWriter(topic_uri) as w:
        w.send(Record(b"k", b"v", {}, 1234))
    assert full(topic_uri)[0].publish_time == 1234


def test_compact_cli_json_and_status(disk_topic_uri: str) -> None:
    lines = "".join(json.dumps({"key": f"k{i % 10}", "value": f"v{i}"}) + "\n" for i in range(500))
    assert run_cli_here("produce", disk_topic_uri, "--max-ledger-records", "100", input=lines).returncode == 0
    p = run_cli_here("--json", disk_topic_uri, "--delete-retention", "0", script="compact")
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert summary["status"] == "compacted" and summary["keys"] == 10 and summary["records_written"] == 10
    assert summary["records_read"] == 500 and summary["epoch"] == 1 and summary["horizon"] == "5:0:99"
    assert set(summary["durations"]) >= {"plan", "pass_one", "pass_two", "publish", "total"}
    p = run_cli_here("compact", disk_topic_uri, "--json")
    assert json.loads(p.stdout)["status"] == "nothing-to-do" and p.returncode == 0
    st = json.loads(run_cli_here("status", disk_topic_uri, "--json").stdout)
    c = st["compaction"]
    assert c["horizon"] == "5:0:99" and c["epoch"] == 1 and c["keys"] == 10 and c["dirty_ratio"] == 0.0
    assert c["last_compaction_ms"] and c["compacted_ledger"]
    r = run_cli_here("read", disk_topic_uri, "--compacted")
    assert [json.loads(x)["value"] for x in r.stdout.splitlines()] == [f"v{490 + i}" for i in range(10)]
    t = run_cli_here("read", disk_topic_uri, "--compacted", "--table")
    assert len(t.stdout.splitlines()) == 10
    # human summary
    assert run_cli_here("produce", disk_topic_uri, input="".join(lines.splitlines(keepends=True)[:100])).returncode == 0
    h = run_cli_here(disk_topic_uri, script="compact")
    assert h.returncode == 0 and "compacted to horizon" in h.stdout and "10 keys" in h.stdout


def test_compact_cli_exit_codes(disk_topic_uri: str, tmp_path: object) -> None:
    assert run_cli(disk_topic_uri + "-missing", script="compact").returncode == 2
    assert run_cli(disk_topic_uri, "--min-dirty-ratio", "2", script="compact").returncode == 2
    assert run_cli(disk_topic_uri, "--delete-retention", "soon", script="compact").returncode == 2
    h = run_cli("--help", script="compact")
    assert h.returncode == 0 and "exit codes" in h.stdout and "lost the publish race" in h.stdout


def test_compact_several_topics_reports_each_and_some_failed(disk_topic_uri: str) -> None:
    lines = "".join(json.dumps({"key": f"k{i % 3}", "value": "v"}) + "\n" for i in range(30))
    run_cli_here("produce", disk_topic_uri, input=lines)
    missing = disk_topic_uri + "-missing"
    p = run_cli_here("--json", disk_topic_uri, missing, script="compact")
    *out, run = [json.loads(x) for x in p.stdout.splitlines()]
    assert [o["status"] for o in out] == ["compacted", "error"]
    assert "no topic" in out[1]["error"] and out[1]["exit_code"] == 2
    # one topic failed, the other completed: 7, the failed one named with its own code
    assert p.returncode == 7 and run["failed_topics"] == [{"topic": missing, "exit_code": 2}]
    # every topic failed: the worst of their codes
    p = run_cli_here("--json", missing, missing + "-too", script="compact")
    assert p.returncode == 2


def test_status_dirty_ratio_is_the_one_compact_uses(topic_uri: str) -> None:
    from shale.maintenance.status import topic_status

    produce(topic_uri, updates(200, 100))
    Compactor(topic_uri).run()
    produce(topic_uri, updates(7, 100))
    shown = topic_status(topic_uri)["compaction"]["dirty_ratio"]
    s = Compactor(topic_uri, CompactionConfig(min_dirty_ratio=1.0)).run()
    assert s.status == "skipped" and 0 < shown < 1 and shown == round(s.dirty_ratio, 6)


@pytest.mark.parametrize("backend_local", [True, False])
def test_planning_reads_footers_in_parallel_only_where_it_pays(tmp_path: object, backend_local: bool,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Footers of a local folder are read by at most one thread per CPU (the reads are
    CPU work); an object store's are read several at a time (each read waits on latency).

    The first reads wait until that many are under way at once, so the test sees the
    parallelism itself, not whatever a thread pool happened to do on a loaded machine."""
    import concurrent.futures
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import shale.compactor.plan as plan_module
    from shale.compactor.plan import make_plan
    from shale.ledger.reader import LedgerFile

    uri = f"{tmp_path}/topics/orders"
    produce(uri, updates(200, 10))  # 20 ledgers
    meta = TopicMetadata.open(uri)
    monkeypatch.setattr(type(meta.topic.store), "reads_are_local", backend_local)
    monkeypatch.setattr(plan_module, "available_cpus", lambda: 1)
    pools: list[int] = []

    class Pool(ThreadPoolExecutor):
        def __init__(self, max_workers: int, **kwargs: Any) -> None:
            pools.append(max_workers)
            super().__init__(max_workers, **kwargs)

    monkeypatch.setattr(concurrent.futures, "ThreadPoolExecutor", Pool)  # (imported where planning starts one)
    monkeypatch.setattr(plan_module, "INLINE_FOOTER_RECORDS", 0)  # (a small topic's are read on one thread)
    at_once = 1 if backend_local else plan_module.FOOTER_READS
    together = threading.Barrier(at_once, timeout=60)  # broken (an error) if fewer ever run at once
    threads: set[str] = set()
    lock = threading.Lock()
    calls = [0]

    def held_open(key: str, lid: int | None, kind: int) -> LedgerFile:
        with lock:
            threads.add(threading.current_thread().name)
            calls[0] += 1
            first = calls[0] <= at_once
        if first:
            together.wait()  # the first `at_once` reads are all under way before any ends
        return LedgerFile.open(meta.topic.store, key, ledger_id=lid, kind=kind)

    plan = make_plan(meta, now_ms=2_000_000_000_000, min_compaction_lag_ms=0, open_file=held_open)
    assert plan.ledgers_read == 20
    assert pools == [at_once]
    # no more threads than the pool's, and with the first reads held, as many as it has
    assert len(threads) == at_once, threads


def test_planning_reads_a_small_local_topics_footers_on_its_own_thread(tmp_path: object,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A small topic's footers on a local folder are read one after the other by the
    planning thread, with no thread pool started, and make the plan a pool makes."""
    import concurrent.futures
    import threading

    import shale.compactor.plan as plan_module
    from shale.compactor.plan import make_plan
    from shale.ledger.reader import LedgerFile

    uri = f"{tmp_path}/topics/orders"
    produce(uri, updates(200, 10))  # 20 ledgers
    meta = TopicMetadata.open(uri)
    readers: list[str] = []

    def noted(key: str, lid: int | None, kind: int) -> LedgerFile:
        readers.append(threading.current_thread().name)
        return LedgerFile.open(meta.topic.store, key, ledger_id=lid, kind=kind)

    monkeypatch.setattr(plan_module, "INLINE_FOOTER_RECORDS", 0)
    with_pool = make_plan(meta, now_ms=2_000_000_000_000, min_compaction_lag_ms=0, open_file=noted)
    assert len(readers) == 20 and threading.current_thread().name not in readers

    readers.clear()
    monkeypatch.undo()
    monkeypatch.setattr(concurrent.futures, "ThreadPoolExecutor", None)  # (one started: an error)
    inline = make_plan(meta, now_ms=2_000_000_000_000, min_compaction_lag_ms=0, open_file=noted)
    assert readers == [threading.current_thread().name] * 20
    assert [(s.ref, s.start, s.stop) for s in inline.slices] == [(s.ref, s.start, s.stop) for s in with_pool.slices]
    assert (inline.ledgers_read, inline.dirty_bytes, inline.dirty_ratio) == \
        (with_pool.ledgers_read, with_pool.dirty_bytes, with_pool.dirty_ratio)
