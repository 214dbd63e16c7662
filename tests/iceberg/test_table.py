"""A topic's Iceberg table equals its compacted view at every epoch, for every reader:
pyiceberg (the writer's library), Polars' and DuckDB's own Iceberg readers, ``shale read
--table --as-of`` and a dict model folded from every record produced
(:mod:`tests.history_model`); across updates, deletes, key TTL expiry and event-time
order; with time travel to every kept epoch.  And it is written incrementally: an epoch
that changes 1 % of the keys writes a few per cent of the table.

``SHALE_LONG_TESTS=1`` runs the comparison over 30 epochs instead of 4 (with rewrites and
delete-file merges along the way), every reader at every epoch."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from shale.iceberg import IcebergTarget, sync_table
from shale.iceberg.state import snapshot_epoch
from shale.ledger.ids import MessageId
from shale.ledger.ordering import TopicOrder
from shale.reader.latest import table_batches
from tests.compaction_model import every_record
from tests.history_model import History
from tests.iceberg.conftest import Topic, load_table
from tests.iceberg.readers import Rows, duckdb_rows, polars_rows, pyiceberg_rows, rows_of, view_rows
from tests.needs import need_module

need_module("pyiceberg")
need_module("pyarrow")

DAY_MS = 86_400_000
LONG = os.environ.get("SHALE_LONG_TESTS") == "1"


def shale_rows(topic: Topic, epoch: int, utf8: bool) -> Rows:
    """The view as of ``epoch``, as the reader library gives it."""
    import pyarrow as pa

    from shale.reader.arrow import schema

    t = pa.Table.from_batches(list(table_batches(topic.meta(), utf8=utf8, as_of=epoch)), schema=schema(utf8))
    return rows_of(*(t.column(c).to_pylist() for c in ("key", "value", "ledger", "entry", "batch")))


def model_rows(history: History, topic: Topic, epoch: int, utf8: bool) -> Rows:
    """The dict model's table as of ``epoch``: every record up to its horizon, folded."""
    state = topic.meta().load_compaction().at_epoch(epoch)
    assert state is not None and state.horizon is not None
    order = state.order
    chosen = history.state(state.horizon.successor(), order, state.compacted_ms)
    out: Rows = {}
    for key, mid in chosen.items():
        value = history.records[mid].value
        out[key.decode() if utf8 else key] = (value.decode() if utf8 and value is not None else value, mid)
    return out


@pytest.mark.parametrize(("order", "fmt"), [("offset", "binary"), ("event-time", "json")])
def test_every_epoch_is_the_view_for_every_reader(order: str, fmt: str, topic: Topic, catalog_uri: str) -> None:
    utf8 = fmt != "binary"
    target = IcebergTarget(catalog_uri, "shale.t", value_format=fmt)
    ttl = DAY_MS if order == "event-time" else 0
    config: dict[str, Any] = {"order": order, "key_ttl_ms": ttl, "snapshot_retention": 3}
    history = History()
    now = int(time.time() * 1000)
    topic.produce(400, event_times=order == "event-time", now_ms=now - 3 * DAY_MS)  # (past the TTL: expire)
    for round_ in range(30 if LONG else 4):
        if round_:
            topic.produce(60 + 30 * round_, tombstones=0.2, event_times=order == "event-time", keys=200)
        history.add(every_record(topic.uri))
        s = topic.compact(**config)
        result = sync_table(topic.meta(), target, grace_ms=0)
        assert result.status == "committed" and result.epoch == s.epoch
        # (from the two views' parts, but for the first epoch and under a key TTL)
        assert result.planned_by == ("views" if round_ and not ttl else "table")
        table = load_table(catalog_uri)
        got = pyiceberg_rows(table)
        assert got == shale_rows(topic, s.epoch, utf8) == model_rows(history, topic, s.epoch, utf8)
        assert snapshot_epoch(table.current_snapshot()) == s.epoch
        if LONG:
            assert got == polars_rows(table) == duckdb_rows(table.metadata_location)
    if ttl:
        assert s.keys_expired or len(got) < 200  # (the keys written only 3 days ago are gone)
    assert got == view_rows(topic.uri, s.epoch, utf8)
    assert got == polars_rows(table) == duckdb_rows(table.metadata_location)
    kept = topic.meta().load_compaction().retained_epochs
    by_epoch = {snapshot_epoch(sn): sn.snapshot_id for sn in table.metadata.snapshots}
    assert set(by_epoch) == set(kept)  # (the epochs the topic no longer keeps were expired)
    for epoch in kept:  # time travel: each kept epoch's snapshot is that epoch's view
        want = shale_rows(topic, epoch, utf8)
        sid = by_epoch[epoch]
        assert pyiceberg_rows(table, sid) == want == polars_rows(table, sid)
        assert duckdb_rows(table.metadata_location, sid) == want


def test_an_epoch_changing_one_percent_writes_a_few_percent(topic: Topic, catalog_uri: str) -> None:
    target = IcebergTarget(catalog_uri, "shale.t")
    topic.keys = 5000
    topic.produce(5000, tombstones=0.0, pad=200)
    topic.produce(5000, tombstones=0.0, pad=200)
    topic.compact()
    full = sync_table(topic.meta(), target)
    topic.produce(50, tombstones=0.2, pad=200)  # 1 % of the keys: updates and deletes
    topic.compact()
    step = sync_table(topic.meta(), target)
    assert step.status == "committed" and 0 < step.added <= 50 and 0 < step.deleted <= 50  # (an update: both)
    assert step.bytes_written < 0.05 * full.table_bytes
    assert pyiceberg_rows(load_table(catalog_uri)) == shale_rows(topic, step.epoch, False)


def test_again_at_the_same_epoch_adds_no_snapshot(topic: Topic, catalog_uri: str) -> None:
    target = IcebergTarget(catalog_uri, "shale.t")
    topic.produce(300)
    topic.compact()
    first = sync_table(topic.meta(), target)
    again = sync_table(topic.meta(), target)
    assert (first.status, again.status) == ("committed", "current")
    assert again.snapshot_id == first.snapshot_id and again.rows == first.rows
    assert len(load_table(catalog_uri).metadata.snapshots) == 1


def test_rewrites_deleted_files_and_merges_delete_files(topic: Topic, catalog_uri: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import shale.iceberg.diff as sync_diff
    import shale.iceberg.sync as sync

    monkeypatch.setattr(sync_diff, "MAX_DELETE_FILES", 2)
    target = IcebergTarget(catalog_uri, "shale.t", rewrite_fraction=0.3)
    topic.produce(600, tombstones=0.0)
    topic.compact()
    sync_table(topic.meta(), target, grace_ms=0)
    rewritten = 0
    for _ in range(5):
        topic.produce(80, tombstones=0.1)
        topic.compact()
        r = sync_table(topic.meta(), target, grace_ms=0)
        rewritten += r.rewritten_files
        table = load_table(catalog_uri)
        assert pyiceberg_rows(table) == shale_rows(topic, r.epoch, False)
        state = sync.read_state(table)
        live = {d.path for d in state.data}
        assert len(state.deletes) <= 2
        assert all(names & live for _, names in state.deletes)  # none names only removed files
    assert rewritten  # (a file past 30 % deleted was rewritten)
    assert polars_rows(table) == pyiceberg_rows(table)


def test_expired_snapshots_lose_only_their_own_files(topic: Topic, catalog_uri: str) -> None:
    from shale.iceberg.expire import files_of

    target = IcebergTarget(catalog_uri, "shale.t")
    seen: set[str] = set()
    for _ in range(5):
        topic.produce(150)
        topic.compact(snapshot_retention=2)
        sync_table(topic.meta(), target, grace_ms=0)
        table = load_table(catalog_uri)
        seen |= {f for s in table.metadata.snapshots for f in files_of(table.io, s)}
    kept = {f for s in table.metadata.snapshots for f in files_of(table.io, s)}
    assert {snapshot_epoch(s) for s in table.metadata.snapshots} == set(topic.meta().load_compaction().retained_epochs)
    assert all(Path(f.removeprefix("file://")).exists() for f in kept)
    gone = seen - kept
    assert gone and not any(Path(f.removeprefix("file://")).exists() for f in gone)


def test_a_replaced_snapshot_is_kept_through_the_grace(topic: Topic, catalog_uri: str) -> None:
    target = IcebergTarget(catalog_uri, "shale.t")
    for _ in range(2):
        topic.produce(100)
        topic.compact()  # (snapshot retention 1: the topic keeps the published view only)
        r = sync_table(topic.meta(), target, grace_ms=3_600_000)
    assert r.expired == 0 and len(load_table(catalog_uri).metadata.snapshots) == 2
    assert sync_table(topic.meta(), target, grace_ms=0).expired == 1


def test_two_writers_never_commit_one_epoch_twice(topic: Topic, catalog_uri: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit that finds the table changed (here: the other writer committed the same
    epoch while it wrote) reads the table again and finds the epoch there."""
    import shale.iceberg.commit as commit

    target = IcebergTarget(catalog_uri, "shale.t")
    topic.produce(200)
    topic.compact()
    sync_table(topic.meta(), target)
    topic.produce(50)
    topic.compact()
    real = commit.commit_snapshot
    calls: list[str] = []

    def racing(table: Any, *args: Any) -> Any:
        calls.append("commit")
        if len(calls) == 1:  # the other writer wins the race
            monkeypatch.setattr(commit, "commit_snapshot", real)
            assert sync_table(topic.meta(), target).status == "committed"
            monkeypatch.setattr(commit, "commit_snapshot", racing)
        return real(table, *args)

    monkeypatch.setattr(commit, "commit_snapshot", racing)
    r = sync_table(topic.meta(), target)
    assert r.status == "current" and len(calls) == 1
    table = load_table(catalog_uri)
    epochs = [snapshot_epoch(s) for s in table.metadata.snapshots]
    assert epochs.count(r.epoch) == 1
    assert pyiceberg_rows(table) == shale_rows(topic, r.epoch, False)


def test_message_ids_and_columns(topic: Topic, catalog_uri: str) -> None:
    """Each column as the docs say: ids as longs, times as UTC microseconds, properties a map."""
    from shale.producer import TopicWriter

    with TopicWriter(topic.uri) as w:
        w.append("a", "1", properties={"p": "q"}, event_time=1_700_000_000_123)
        w.append("b", "2")
    topic.compact()
    sync_table(topic.meta(), IcebergTarget(catalog_uri, "shale.t", value_format="text"))
    rows = load_table(catalog_uri).scan().to_arrow().sort_by("key").to_pylist()
    assert [r["key"] for r in rows] == ["a", "b"] and rows[0]["properties"] == [("p", "q")]
    assert rows[0]["event_time"].timestamp() == 1_700_000_000.123 and rows[1]["event_time"] is None
    assert MessageId(rows[1]["ledger"], rows[1]["entry"], rows[1]["batch"]) > MessageId(rows[0]["ledger"],
                                                                                          rows[0]["entry"],
                                                                                          rows[0]["batch"])
    assert TopicOrder().order == "offset"


def test_ids_compare_as_ids_packed_or_not() -> None:
    """Ids that fit in 64 bits between them are packed into one number, others are
    20-byte strings: both sort and compare as the ids do."""
    import numpy as np

    from shale.iceberg.state import IdKeys

    for big in (False, True):
        ids = [(1, 5, 0), (1, 5, 3), (2, 0, 0), ((1 << 62) if big else 7, 1, 1), (2, 1 << 40 if big else 9, 2)]
        cols = tuple(np.array([i[k] for i in ids], dtype=np.uint64) for k in range(3))
        keys = IdKeys.fitting([cols])  # type: ignore[list-item]
        got = keys(cols)  # type: ignore[arg-type]
        assert (got.dtype == np.uint64) is not big
        assert [ids[i] for i in np.argsort(got, kind="stable")] == sorted(ids)
        assert len(set(got.tolist())) == len(ids)


def test_a_table_changed_behind_shales_back_is_decided_from_the_whole_view(topic: Topic, catalog_uri: str) -> None:
    """The two views' difference is checked against the table: a row someone else deleted
    makes the commit decide from the whole view, and the table comes out equal anyway."""
    from pyiceberg.expressions import EqualTo

    target = IcebergTarget(catalog_uri, "shale.t", value_format="text")
    topic.produce(300, tombstones=0.0)
    topic.compact(snapshot_retention=2)
    sync_table(topic.meta(), target)
    table = load_table(catalog_uri)
    victim = sorted(pyiceberg_rows(table))[0]
    shale_props = {k: v for k, v in table.current_snapshot().summary.additional_properties.items()
                   if k.startswith("shale.")}
    # pyiceberg's own copy-on-write delete, its snapshot still saying epoch 1
    table.delete(EqualTo("key", victim), snapshot_properties=shale_props)
    assert snapshot_epoch(load_table(catalog_uri).current_snapshot()) == 1
    topic.produce(30, tombstones=0.0)
    topic.compact(snapshot_retention=2)
    r = sync_table(topic.meta(), target)
    assert r.planned_by == "table"
    assert pyiceberg_rows(load_table(catalog_uri)) == shale_rows(topic, r.epoch, True)


def test_leftovers_of_a_killed_commit_go_after_the_orphan_grace(topic: Topic, catalog_uri: str) -> None:
    """A file no snapshot names (a writer killed before its commit) is removed once older
    than the orphan grace, a fresh one is not (its writer may still commit it), and
    neither a file a snapshot reads nor one of a table named inside this one is touched."""
    target = IcebergTarget(catalog_uri, "shale.t")
    topic.produce(200)
    topic.compact()
    sync_table(topic.meta(), target)
    table = load_table(catalog_uri)
    location = Path(table.location().removeprefix("file://"))
    old, fresh = location / "data" / "data-killed-00001.parquet", location / "metadata" / "killed-m0.avro"
    inner = location / "data" / "inner" / "data" / "x.parquet"  # (a table named shale.t.data.inner, say)
    for f in (old, fresh, inner):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"PAR1")
    stamp = time.time() - 7200
    os.utime(old, (stamp, stamp))
    os.utime(inner, (stamp, stamp))
    topic.produce(20)
    topic.compact()
    r = sync_table(topic.meta(), target, orphan_grace_ms=3_600_000)
    assert not old.exists() and fresh.exists() and inner.exists() and r.files_removed >= 1
    table = load_table(catalog_uri)
    assert pyiceberg_rows(table) == shale_rows(topic, r.epoch, False)  # (every file it reads is there)
