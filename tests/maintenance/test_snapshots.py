"""Snapshots and rollback against the plain model (tests/compaction_model.py), on a local
folder and on S3 (moto).

Each epoch's view is folded by the model as the runs publish it and kept; every retained
epoch must then read — as records, as a table, by epoch and by time — as the model's view
of that epoch, before and after garbage collection, which must delete nothing a retained
view reads and keep nothing more.  A rollback publishes an earlier view again, and the
next compaction builds on it as the model does from that view.
"""

from __future__ import annotations

import copy
import datetime
import json
import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from shale.compactor import CompactionConfig, Compactor, collect_garbage
from shale.compactor.config import MIN_ORPHAN_GRACE_MS
from shale.ledger.errors import InvalidInputError, SnapshotNotFoundError
from shale.ledger.record import Message
from shale.maintenance.retention import retention_cut, truncate
from shale.maintenance.snapshots import rollback
from shale.maintenance.verify import verify_topic
from shale.metadata.layout import is_compacted_object
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TableView, TopicReader
from tests.compaction_model import CompactionModel, every_record, row

HOUR_MS = 3_600_000
T0 = 1_700_000_000.0


class Clock:
    """Seconds, moved by the test."""

    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def produce(uri: str, clock: Clock, seed: int, n: int = 240, keys: int = 60) -> None:
    """``n`` records on ``keys`` keys (about one in ten a tombstone, some without a key),
    in ledgers of 100 records."""
    rnd = random.Random(seed)
    with TopicWriter(uri, max_ledger_records=100, batch_size=8, clock=clock) as w:
        for i in range(n):
            key = None if rnd.random() < 0.03 else f"k{rnd.randrange(keys)}"
            w.append(key, None if rnd.random() < 0.1 else f"{seed}-{i}")


class Epochs:
    """The topic, its runs and the model's view of every epoch published."""

    def __init__(self, uri: str, config: CompactionConfig, keys: int = 60) -> None:
        self.uri, self.config, self.clock, self.keys = uri, config, Clock(), keys
        self.meta = TopicMetadata.open(uri)
        self.model = CompactionModel()
        self.views: dict[int, CompactionModel] = {}
        self.records: list[Message] = []  # every record, as of the last run

    def compact(self, seed: int) -> int:
        """New records, an hour later a run (and the model's): the epoch published."""
        produce(self.uri, self.clock, seed, keys=self.keys)
        self.clock.t += 3600
        s = Compactor(self.uri, self.config, clock=self.clock).run()
        assert s.status == "compacted", (s.status, s.error, s.message)
        self.records = every_record(self.uri)
        self.model.run(self.records, now_ms=int(self.clock.t * 1000), retention_ms=self.config.delete_retention_ms)
        assert s.horizon == str(self.model.horizon)
        self.views[s.epoch or 0] = copy.deepcopy(self.model)
        return s.epoch or 0

    def want(self, epoch: int) -> list[Any]:
        return self.views[epoch].rows(self.records)

    def check(self, epoch: int) -> None:
        """Epoch ``epoch`` reads as the model's view of it: from the snapshot, records and
        table; as of it, the same through its horizon and nothing above."""
        with TopicReader(self.uri, from_snapshot=epoch) as r:
            got = [row(m) for m in r.read()]
        assert got == self.want(epoch), f"epoch {epoch}"
        table = TableView(self.uri, from_snapshot=epoch)
        assert dict(table) == latest(self.views[epoch].view(self.records)), f"table of epoch {epoch}"
        horizon = self.views[epoch].horizon
        below = [m for m in self.views[epoch].view(self.records) if horizon is not None and m.id <= horizon]
        with TopicReader(self.uri, as_of=epoch) as r:
            assert [row(m) for m in r.read()] == [row(m) for m in below], f"as of epoch {epoch}"
        assert dict(TableView(self.uri, as_of=epoch)) == latest(below), f"table as of epoch {epoch}"


def latest(view: Sequence[Message]) -> dict[bytes, bytes]:
    """The table of a compacted read: the latest value of every live key."""
    out: dict[bytes, bytes] = {}
    for m in view:
        if m.key is None:
            continue
        if m.is_tombstone:
            out.pop(m.key, None)
        else:
            out[m.key] = m.value or b""
    return out


def stored_compacted(meta: TopicMetadata) -> set[str]:
    loc = meta.topic
    return {loc.relative(o.key) for o in loc.store.list(loc.key("compacted") + "/")}


def collect_everything(meta: TopicMetadata) -> list[str]:
    """gc with every grace over: what it deletes."""
    report = collect_garbage(meta, now_ms=meta.now_ms() + 10 * MIN_ORPHAN_GRACE_MS, grace_ms=0,
                             orphan_grace_ms=MIN_ORPHAN_GRACE_MS)
    return report.retired_deleted + report.orphans_deleted


def test_every_retained_epoch_reads_as_the_model_before_and_after_gc(disk_topic_uri: str) -> None:
    # parts kept in place with deletion vectors: views share parts, each with its own vectors
    config = CompactionConfig(snapshot_retention=3, delete_retention_ms=2 * HOUR_MS, reuse_min_bytes=0,
                              reuse_min_live=0.1, max_part_bytes=64 << 10)
    e = Epochs(disk_topic_uri, config, keys=600)
    for seed in range(4):
        epoch = e.compact(seed)
        state = e.meta.load_compaction()
        assert state.retained_epochs == tuple(range(max(1, epoch - 2), epoch + 1))
        e.check(epoch - 1 if epoch > 1 else epoch)
        # gc deletes what no retained view names, and nothing a retained one reads
        deleted = collect_everything(e.meta)
        state = e.meta.load_compaction()
        assert not set(deleted) & state.retained_objects()
        assert {o for o in stored_compacted(e.meta) if is_compacted_object(o)} == state.retained_objects()
        for kept in state.retained_epochs:
            e.check(kept)
    assert any(p.deletions for p in state.parts) or any(p.deletions for s in state.snapshots for p in s.parts)
    # by time: the view published at or before it, and every record published by then
    for snap in state.snapshots:
        when_ms = snap.compacted_ms + 1000
        when = datetime.datetime.fromtimestamp(when_ms / 1000, datetime.UTC)
        with TopicReader(disk_topic_uri, as_of=when) as r:
            got = [row(m) for m in r.read()]
        assert got == [row(m) for m in e.views[snap.epoch].view(e.records) if m.publish_time <= when_ms]
    with pytest.raises(SnapshotNotFoundError, match=r"epoch 1 is not retained.*retained: epoch 2 .*epoch 3 .*epoch 4"):
        TopicReader(disk_topic_uri, as_of=1)
    # before the first record: nothing (retention removed nothing, so every point can be read)
    with TopicReader(disk_topic_uri, as_of=datetime.datetime(2000, 1, 1)) as r:
        assert r.read() == []


def test_one_snapshot_kept_is_todays_behaviour(tmp_path: Any) -> None:
    """snapshot-retention 1 (the default): no snapshot, the document as before, the
    replaced view retired whole."""
    e = Epochs(str(tmp_path / "t"), CompactionConfig(delete_retention_ms=0))
    e.compact(1)
    first = e.meta.load_compaction()
    e.compact(2)
    state = e.meta.load_compaction()
    assert "snapshots" not in state.to_json() and state.snapshots == ()
    assert [r.objects for r in state.retired] == [tuple(p.object for p in first.parts)]
    e.check(2)
    with pytest.raises(SnapshotNotFoundError):
        TopicReader(e.uri, as_of=1)


def test_the_age_keeps_views_replaced_less_than_it_ago_and_lowering_the_count_retires_them(tmp_path: Any) -> None:
    config = CompactionConfig(snapshot_retention=1, snapshot_retention_age_ms=2 * HOUR_MS, delete_retention_ms=0)
    e = Epochs(str(tmp_path / "t"), config)
    for seed in range(4):
        e.compact(seed)
    # a run every hour: the views replaced 0 and 1 hours ago stay, the one replaced 2 hours ago went
    state = e.meta.load_compaction()
    assert state.retained_epochs == (2, 3, 4)
    assert [s.replaced_ms for s in state.snapshots] == [int((T0 + h * 3600) * 1000) for h in (3, 4)]
    # fewer kept: the next publish drops them, and gc deletes what only they named
    e.config = replace(config, snapshot_retention_age_ms=0)
    e.compact(9)
    state = e.meta.load_compaction()
    assert state.retained_epochs == (5,)
    collect_everything(e.meta)
    assert {o for o in stored_compacted(e.meta) if is_compacted_object(o)} == state.retained_objects()
    e.check(5)


def test_retention_keeps_the_ledgers_a_retained_snapshot_reads(disk_topic_uri: str) -> None:
    e = Epochs(disk_topic_uri, CompactionConfig(snapshot_retention=2, delete_retention_ms=0))
    for seed in range(3):
        e.compact(seed)
    state = e.meta.load_compaction()
    (snap,) = state.snapshots
    assert snap.horizon is not None and state.horizon is not None and snap.horizon < state.horizon
    # by rule: stop at the first ledger with records above the snapshot's horizon
    cut = retention_cut(e.meta, older_than_ms=0)
    records = every_record(disk_topic_uri)
    want = e.want(state.epoch)  # (the records of removed ledgers stay in the compacted view)
    assert cut == min(m.id.ledger for m in records if m.id > snap.horizon)
    assert cut < max(m.id.ledger for m in records if m.id <= state.horizon)
    # by hand: refused, naming the snapshot; with drop_snapshots it goes first
    past = state.horizon.ledger
    with pytest.raises(InvalidInputError, match=f"retained snapshot of epoch {snap.epoch}.*--drop-snapshots"):
        truncate(e.meta, past)
    assert truncate(e.meta, past, dry_run=True, drop_snapshots=True).snapshots == (snap.epoch,)
    assert e.meta.load_compaction().retained_epochs == (snap.epoch, state.epoch)
    done = truncate(e.meta, past, drop_snapshots=True)
    assert done.snapshots == (snap.epoch,) and "dropped the retained snapshots of epoch 2" in done.human()
    after = e.meta.load_compaction()
    assert after.retained_epochs == (state.epoch,)
    assert set(after.retired[-1].objects) == snap.objects() - after.retained_objects()
    with pytest.raises(SnapshotNotFoundError):
        TopicReader(disk_topic_uri, as_of=snap.epoch)
    with TopicReader(disk_topic_uri, as_of=state.epoch) as r:
        assert [row(m) for m in r.read()] == want


def test_rollback_then_compaction_builds_on_the_view_rolled_back_to(disk_topic_uri: str) -> None:
    config = CompactionConfig(snapshot_retention=3, delete_retention_ms=2 * HOUR_MS, reuse_min_bytes=0,
                              reuse_min_live=0.1)
    e = Epochs(disk_topic_uri, config, keys=600)
    for seed in range(3):
        e.compact(seed)
    e.clock.t += 60
    done = rollback(e.meta, 1, keep=3, clock=e.clock, store_now_ms=int(e.clock.t * 1000))
    assert (done.from_epoch, done.to_epoch, done.epoch, done.snapshots) == (3, 1, 4, (2, 3))
    state = e.meta.load_compaction()
    assert state.epoch == 4 and state.horizon == e.views[1].horizon
    assert state.last_run["rollback"] == {"from_epoch": 3, "to_epoch": 1}
    e.views[4], e.model = copy.deepcopy(e.views[1]), copy.deepcopy(e.views[1])  # the model goes back too
    for kept in (2, 3, 4):
        e.check(kept)
    with TopicReader(disk_topic_uri, read_compacted=True) as r:
        assert [row(m) for m in r.read()] == e.want(4)
    # the next run reads the rolled-back parts and every ledger above its horizon again
    assert e.compact(7) == 5
    assert e.meta.load_compaction().retained_epochs == (3, 4, 5)
    for kept in (3, 4, 5):
        e.check(kept)
    assert verify_topic(e.meta).ok
    assert e.meta.load_compaction().retained_objects() <= stored_compacted(e.meta)
    collect_everything(e.meta)
    for kept in (3, 4, 5):
        e.check(kept)


def test_a_rollback_is_refused_when_it_cannot_give_the_view_back(tmp_path: Any) -> None:
    e = Epochs(str(tmp_path / "t"), CompactionConfig(snapshot_retention=2, delete_retention_ms=0))
    for seed in range(2):
        e.compact(seed)
    before = e.meta.load_compaction()
    with pytest.raises(SnapshotNotFoundError, match=r"epoch 7 is not retained \(retained: epoch 1 .*epoch 2 "):
        rollback(e.meta, 7)
    with pytest.raises(InvalidInputError, match="epoch 2 is the published view already"):
        rollback(e.meta, 2)
    # a ledger above epoch 1's horizon removed behind retention's back: its readers would miss it
    horizon = before.snapshots[0].horizon
    assert horizon is not None and any(m.id.ledger == horizon.ledger + 1 for m in e.records)
    e.meta.truncate(horizon.ledger + 2)
    with pytest.raises(InvalidInputError, match="cannot roll back to epoch 1: retention removed ledgers up to"):
        rollback(e.meta, 1)
    after = e.meta.load_compaction()
    assert (after.epoch, after.parts, after.snapshots) == (before.epoch, before.parts, before.snapshots)


def test_a_rollback_after_ordinary_retention_gives_the_view_back(disk_topic_uri: str) -> None:
    """Retention removes ledgers wholly at or below the horizon: the epoch whose horizon
    ended the last ledger removed lost nothing above it, and stays a rollback target."""
    e = Epochs(disk_topic_uri, CompactionConfig(snapshot_retention=3, delete_retention_ms=0))
    e.compact(0)
    first = e.meta.load_compaction()
    assert first.horizon is not None and first.horizon == max(m.id for m in e.records)
    seen = {m.id: m for m in e.records}
    done = truncate(e.meta, first.horizon.ledger + 1)
    assert done.removed and done.removed[-1].id == first.horizon.ledger
    assert e.meta.load_topic().removed_last == first.horizon
    e.compact(1)
    seen.update((m.id, m) for m in e.records)
    records = [seen[i] for i in sorted(seen)]
    want = e.views[1].rows(records)
    assert rollback(e.meta, 1, dry_run=True).epoch == 3
    e.clock.t += 60
    done = rollback(e.meta, 1, keep=3, clock=e.clock, store_now_ms=int(e.clock.t * 1000))
    assert (done.from_epoch, done.to_epoch, done.epoch) == (2, 1, 3)
    for point in (1, 3):
        with TopicReader(disk_topic_uri, from_snapshot=point) as r:
            assert [row(m) for m in r.read()] == want, point
    with TopicReader(disk_topic_uri, read_compacted=True, on_gap="error") as r:
        assert [row(m) for m in r.read()] == want


def test_a_truncation_that_cannot_read_its_last_ledger_still_removes_it(tmp_path: Any) -> None:
    """The last removed ledger's end is recorded when its footer can be read; a damaged
    one still goes, and what lay past an id in it is then taken as unknown."""
    e = Epochs(str(tmp_path / "t"), CompactionConfig(snapshot_retention=2, delete_retention_ms=0))
    e.compact(0)
    e.compact(1)
    state = e.meta.load_compaction()
    horizon = state.snapshots[0].horizon
    assert horizon is not None
    lg = e.meta.load_topic().ledger(horizon.ledger)
    assert lg is not None
    e.meta.topic.store.put(e.meta.topic.key(lg.object), b"damaged")
    e.meta.truncate(horizon.ledger + 1)
    topic = e.meta.load_topic()
    assert topic.removed_through == horizon.ledger and topic.removed_last is None
    assert e.meta.load_compaction().retained_epochs == (1, 2)
    with pytest.raises(InvalidInputError, match="retention removed ledgers up to"):
        rollback(e.meta, 1)


def test_a_rollback_to_a_view_of_another_order_says_so_and_compactions_then_need_a_rewrite(tmp_path: Any) -> None:
    from shale.compactor.run_many import compact_topic
    from shale.settings import resolve

    e = Epochs(str(tmp_path / "t"), CompactionConfig(snapshot_retention=2, delete_retention_ms=0))
    e.compact(1)  # offset order
    e.meta.update_policy({"order": "event-time"})
    produce(e.uri, e.clock, 2)
    s = Compactor(e.uri, replace(e.config, order="event-time", rewrite=True), clock=e.clock).run()
    assert s.status == "compacted" and e.meta.load_compaction().order.order == "event-time"
    # as of epoch 1, "latest" is decided in epoch 1's own order
    table = TableView(e.uri, from_snapshot=1)
    assert table.order.order == "offset" and TableView(e.uri).order.order == "event-time"
    assert dict(table) == latest(e.views[1].view(every_record(e.uri)))
    done = rollback(e.meta, 1, keep=2)
    assert done.order.order == "offset" and "compactions in event-time order are refused" in done.note
    produce(e.uri, e.clock, 3)
    with pytest.raises(InvalidInputError, match=r"the compacted view is in offset order.*needs --rewrite"):
        compact_topic(e.uri, resolve("compact", {"topics": [e.uri]}))
    e.meta.update_policy({"order": "offset"})
    assert compact_topic(e.uri, resolve("compact", {"topics": [e.uri]})).status == "compacted"


def test_a_snapshot_survives_the_json_round_trip(tmp_path: Any) -> None:
    e = Epochs(str(tmp_path / "t"), CompactionConfig(snapshot_retention=2, key_ttl_ms=HOUR_MS * 50))
    e.compact(1)
    e.compact(2)
    raw = json.loads((tmp_path / "t" / "_meta" / "compaction.json").read_text())["value"]
    (snap,) = raw["snapshots"]
    assert snap["epoch"] == 1 and snap["key_ttl_ms"] == HOUR_MS * 50 and "decided_ms" in snap["last_run"]
    state = e.meta.load_compaction()
    assert state.snapshots[0].to_json() == snap


# ------------------------------------------------------------------ rollback racing a compaction


def leftovers(meta: TopicMetadata) -> set[str]:
    """Compacted objects no published state names (a loser's output left behind)."""
    return stored_compacted(meta) - meta.load_compaction().referenced_objects()


def test_a_compactor_that_planned_before_a_rollback_loses_its_race(disk_topic_uri: str, tmp_path: Any) -> None:
    """The compactor is held just before it publishes; the rollback publishes first; the
    compactor then loses (exit 3), removes its output, and the next run builds on the
    view rolled back to."""
    from shale.cli.errors import EXIT_CONFLICT
    from tests.conftest import run_cli_here
    from tests.gates import Gate, start_held_compact

    config = CompactionConfig(snapshot_retention=3, delete_retention_ms=0)
    e = Epochs(disk_topic_uri, config)
    for seed in range(2):
        e.compact(seed)
    produce(e.uri, e.clock, 5)
    gate = Gate(tmp_path / "gate")
    proc = start_held_compact(gate, e.uri, "--json", "--delete-retention", "0s", "--snapshot-retention", "3")
    try:
        assert gate.wait([proc]) == [True], proc.communicate()
        r = run_cli_here("rollback", e.uri, "--to-epoch", "1", "--snapshot-retention", "3", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["epoch"] == 3
    finally:
        gate.open()
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == EXIT_CONFLICT, (out, err)
    assert json.loads(out)["status"] == "conflict" and "another compactor published epoch 3 first" in out
    assert not leftovers(e.meta)
    state = e.meta.load_compaction()
    assert (state.epoch, state.horizon, state.retained_epochs) == (3, e.views[1].horizon, (1, 2, 3))
    e.model, e.views[3] = copy.deepcopy(e.views[1]), copy.deepcopy(e.views[1])
    assert e.compact(6) == 4
    for kept in (2, 3, 4):
        e.check(kept)


def test_a_rollback_that_planned_before_a_compaction_loses_its_race(tmp_path: Any) -> None:
    """The rollback is held just before its swap; a compaction publishes first; the
    rollback then loses (exit 3, one line) and publishes nothing.  (On a local folder: the
    race the other way runs on S3 too.)"""
    from shale.cli.errors import EXIT_CONFLICT
    from tests.gates import Gate, start_held

    e = Epochs(str(tmp_path / "t"), CompactionConfig(snapshot_retention=3, delete_retention_ms=0))
    for seed in range(2):
        e.compact(seed)
    gate = Gate(tmp_path / "gate")
    proc = start_held(gate, "shale", "shale.maintenance.snapshots:_swapped", "rollback", e.uri, "--to-epoch", "1")
    try:
        assert gate.wait([proc]) == [True], proc.communicate()
        assert e.compact(3) == 3
    finally:
        gate.open()
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == EXIT_CONFLICT, (out, err)
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert "another compactor published epoch 3 first" in err and "nothing was rolled back" in err, err
    state = e.meta.load_compaction()
    assert (state.epoch, state.horizon, state.retained_epochs) == (3, e.views[3].horizon, (1, 2, 3))
    for kept in (1, 2, 3):
        e.check(kept)


def test_a_rollback_keeps_as_the_policy_says_and_a_truncation_planned_before_it_drops_nothing(tmp_path: Any) -> None:
    from shale.maintenance.snapshots import drop_snapshots

    e = Epochs(str(tmp_path / "t"), CompactionConfig(snapshot_retention=3, delete_retention_ms=0))
    for seed in range(3):
        e.compact(seed)
    planned = e.meta.load_compaction()
    e.meta.update_policy({"snapshot_retention": 3})
    assert rollback(e.meta, 1).snapshots == (2, 3)  # the policy's retention, not the default
    # a truncation planned against epoch 3's horizon must not drop snapshots now: the view went down
    with pytest.raises(InvalidInputError, match=r"rolled back to horizon .* nothing was removed"):
        drop_snapshots(e.meta, (2,), horizon=planned.horizon)
    assert e.meta.load_compaction().retained_epochs == (2, 3, 4)
