"""Tags on retained views against the plain model (tests/compaction_model.py), on a local
folder and on S3 (moto): a tagged view outlives ``snapshot-retention`` across compactions,
garbage collection and retention, reads as its epoch does, and falls under the retention
again at the next publish once untagged; ``truncate --drop-snapshots`` never drops it;
tagging races a compaction (forced with gates) without losing a tag; ``rollback
--to-time`` publishes the view current at a time.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from shale.compactor import CompactionConfig
from shale.ledger.errors import ConflictError, InvalidInputError, SnapshotNotFoundError
from shale.ledger.ids import MessageId
from shale.maintenance.retention import retention_cut, truncate
from shale.maintenance.snapshots import drop_snapshots, rollback
from shale.maintenance.tags import epoch_at, list_views, tag_view, untag_view
from shale.metadata.layout import is_compacted_object
from shale.metadata.snapshots import epoch_of_tag, parse_as_of
from shale.reader import TableView, TopicReader
from tests.compaction_model import every_record, row
from tests.maintenance.test_snapshots import T0, Epochs, collect_everything, produce, stored_compacted


def rows_as_of(uri: str, as_of: Any) -> list[Any]:
    with TopicReader(uri, as_of=as_of) as r:
        return [row(m) for m in r.read()]


def rows_from(uri: str, snapshot: Any) -> list[Any]:
    """A snapshot's view, then every record since (what the model's ``want`` gives)."""
    with TopicReader(uri, from_snapshot=snapshot) as r:
        return [row(m) for m in r.read()]


def gc_keeps_every_retained_object(e: Epochs) -> None:
    """gc with every grace over deletes nothing a retained view reads, and everything else."""
    deleted = collect_everything(e.meta)
    state = e.meta.load_compaction()
    assert not set(deleted) & state.retained_objects()
    assert {o for o in stored_compacted(e.meta) if is_compacted_object(o)} == state.retained_objects()


def first_ledger_above(uri: str, horizon: MessageId | None) -> int:
    return min(m.id.ledger for m in every_record(uri) if horizon is None or m.id > horizon)


def test_a_tag_keeps_a_view_past_retention_until_it_is_removed(disk_topic_uri: str) -> None:
    e = Epochs(disk_topic_uri, CompactionConfig(delete_retention_ms=0))  # one view kept: the published one
    assert e.compact(1) == 1
    done = tag_view(e.meta, "first")  # the published epoch
    assert (done.epoch, done.changed, done.tags) == (1, True, {"first": 1})
    for seed in (2, 3):
        epoch = e.compact(seed)
        state = e.meta.load_compaction()
        # the published view, and the tagged one besides
        assert state.retained_epochs == (1, epoch) and state.tags == {"first": 1}
        gc_keeps_every_retained_object(e)
    e.check(1)
    # a tag reads exactly what its epoch reads: records and table
    assert rows_as_of(e.uri, "first") == rows_as_of(e.uri, 1)
    assert rows_from(e.uri, "first") == rows_from(e.uri, 1) == e.want(1)
    assert dict(TableView(e.uri, as_of="first")) == dict(TableView(e.uri, as_of=1))
    assert epoch_of_tag(state, "first") == 1
    # retention holds back the ledgers above the tagged view's horizon
    first = state.snapshots[0]
    assert retention_cut(e.meta, older_than_ms=0) == first_ledger_above(e.uri, first.horizon)
    assert [r["tags"] for r in list_views(e.meta).rows] == [["first"], []]
    # untagged: kept until the next publish, which applies the retention to it
    gone = untag_view(e.meta, "first")
    assert (gone.epoch, gone.tags) == (1, {}) and "again at the next publish" in gone.human()
    assert e.meta.load_compaction().retained_epochs == (1, 3)
    assert rows_from(e.uri, 1) == e.want(1)
    assert e.compact(4) == 4
    state = e.meta.load_compaction()
    assert state.retained_epochs == (4,) and state.tags == {}
    assert set(state.retired[-1].objects) >= first.objects() - state.retained_objects()
    gc_keeps_every_retained_object(e)
    with pytest.raises(SnapshotNotFoundError, match="no compacted view is tagged 'first' \\(tags: none"):
        TopicReader(e.uri, as_of="first")
    e.check(4)


def test_tags_are_checked_and_a_tag_names_one_epoch(tmp_path: Path) -> None:
    e = Epochs(str(tmp_path / "t"), CompactionConfig(snapshot_retention=2, delete_retention_ms=0))
    with pytest.raises(SnapshotNotFoundError, match="never compacted: no view to tag"):
        tag_view(e.meta, "early")
    e.compact(1)
    e.compact(2)
    for bad in ("42", "2024-05-01", "2024-05-01T12:00:00Z", "", "_x", ".hidden", "a/b", "a b", "x" * 201, "é"):
        with pytest.raises(InvalidInputError, match=r"bad tag name .*starting with a letter"):
            tag_view(e.meta, bad)
    with pytest.raises(SnapshotNotFoundError, match=r"epoch 7 is not retained \(retained: epoch 1 .*nothing was "
                                                    "tagged"):
        tag_view(e.meta, "v", 7)
    assert tag_view(e.meta, "v", 1).changed
    version = e.meta.load_compaction().version
    again = tag_view(e.meta, "v", 1)  # the same tag again: nothing written
    assert not again.changed and "already tagged" in again.human()
    assert e.meta.load_compaction().version == version
    with pytest.raises(InvalidInputError, match="the tag 'v' names epoch 1 already: remove it first"):
        tag_view(e.meta, "v", 2)
    assert tag_view(e.meta, "w", 1).tags == {"v": 1, "w": 1}  # a view may carry several
    assert "still tagged w" in untag_view(e.meta, "v").human()
    with pytest.raises(SnapshotNotFoundError, match=r"no compacted view is tagged 'v' \(tags: w \(epoch 1\)"):
        untag_view(e.meta, "v")
    assert e.meta.load_compaction().to_json()["tags"] == {"w": 1}


def test_as_of_takes_an_epoch_a_time_or_a_tag() -> None:
    assert parse_as_of("12") == 12
    assert parse_as_of("release-1.2") == "release-1.2"
    assert parse_as_of("2024-05-01T12:00:00Z") == datetime.datetime(2024, 5, 1, 12, tzinfo=datetime.UTC)
    assert parse_as_of("20240501") == 20240501  # digits are an epoch, never a tag
    assert parse_as_of("2024-05-01") == datetime.datetime(2024, 5, 1, tzinfo=datetime.UTC)
    for bad in ("12 noon", "2024-13-45", "-3"):
        with pytest.raises(InvalidInputError, match=r"is not an epoch .*, a time .* or a tag"):
            parse_as_of(bad)
    with pytest.raises(InvalidInputError, match=r"epoch 0 is out of range"):
        parse_as_of("0")


def test_truncate_never_drops_a_tagged_view(tmp_path: Path) -> None:
    e = Epochs(str(tmp_path / "t"), CompactionConfig(snapshot_retention=3, delete_retention_ms=0))
    for seed in range(3):
        e.compact(seed)
    tag_view(e.meta, "keep", 2)
    state = e.meta.load_compaction()
    assert state.horizon is not None
    past = state.horizon.ledger
    for dry in (True, False):
        with pytest.raises(InvalidInputError, match=r"removing the ledgers below \d+ would drop the tagged view keep "
                                                    r"\(epoch 2\): a tagged view is never dropped.*--untag NAME"):
            truncate(e.meta, past, drop_snapshots=True, dry_run=dry)
    assert e.meta.load_compaction() == state
    # a rule with --drop-snapshots drops the untagged snapshot and stops at the tagged one's horizon
    cut = retention_cut(e.meta, older_than_ms=0, drop_snapshots=True)
    assert cut == first_ledger_above(e.uri, state.snapshots[1].horizon)
    assert truncate(e.meta, cut, drop_snapshots=True).snapshots == (1,)
    assert e.meta.load_compaction().retained_epochs == (2, 3)
    e.check(2)
    # dropping it by epoch (a truncation planned before the tag) is refused too
    with pytest.raises(InvalidInputError, match=r"dropping the snapshots of epoch 2 would drop the tagged view "
                                                r"keep \(epoch 2\)"):
        drop_snapshots(e.meta, (2,))
    untag_view(e.meta, "keep")
    assert truncate(e.meta, past, drop_snapshots=True).snapshots == (2,)
    assert e.meta.load_compaction().retained_epochs == (3,)


def test_rollback_to_a_time_publishes_the_view_current_then(disk_topic_uri: str) -> None:
    e = Epochs(disk_topic_uri, CompactionConfig(snapshot_retention=3, delete_retention_ms=0))
    for seed in range(4):
        e.compact(seed)  # epoch N published at T0 + N hours (the run's clock)
    state = e.meta.load_compaction()
    where = "compaction.json"
    assert state.retained_epochs == (2, 3, 4)
    at = [int((T0 + h * 3600) * 1000) for h in range(6)]
    assert [s.compacted_ms for s in state.snapshots] == at[2:4]
    assert [epoch_at(state, ms, where) for ms in (at[2], at[3] - 1, at[3], at[4] - 1, at[4], at[5])] == \
        [2, 2, 3, 3, 4, 4]
    with pytest.raises(SnapshotNotFoundError, match=r"no retained view was published by 2023-11-15T00:13:19\.999Z: "
                                                    r"the earliest retained, epoch 2, was published "
                                                    r"2023-11-15T00:13:20\.000Z"):
        epoch_at(state, at[2] - 1, where)
    e.clock.t += 60
    dry = rollback(e.meta, epoch_at(state, at[3] + 1, where), dry_run=True, keep=3, planned=state)
    assert (dry.to_epoch, dry.epoch, dry.dry_run) == (3, 5, True) and e.meta.load_compaction() == state
    done = rollback(e.meta, epoch_at(state, at[3] + 1, where), keep=3, clock=e.clock, planned=state)
    assert (done.from_epoch, done.to_epoch, done.epoch) == (4, 3, 5)
    assert rows_from(e.uri, 5) == e.want(3)
    # a state read before another publish: the rollback loses, nothing is rolled back
    with pytest.raises(ConflictError, match="another compactor published epoch 5 first"):
        rollback(e.meta, 2, keep=3, planned=state)
    assert e.meta.load_compaction().retained_epochs == (3, 4, 5)


# ------------------------------------------------------------------ tagging racing a compaction


def test_a_compaction_planned_before_a_tag_loses_and_the_tag_stays(disk_topic_uri: str, tmp_path: Path) -> None:
    """The compactor is held just before it publishes; the tag lands first; the compactor
    then loses (exit 3) rather than publish without the tag, and the next run keeps it."""
    from shale.cli.errors import EXIT_CONFLICT
    from tests.conftest import run_cli_here
    from tests.gates import Gate, start_held_compact

    e = Epochs(disk_topic_uri, CompactionConfig(delete_retention_ms=0))  # one view kept: the tag alone keeps it
    e.compact(1)
    produce(e.uri, e.clock, 2)
    gate = Gate(tmp_path / "gate")
    proc = start_held_compact(gate, e.uri, "--json", "--delete-retention", "0s")
    try:
        assert gate.wait([proc]) == [True], proc.communicate()
        r = run_cli_here("snapshots", e.uri, "--tag", "before")
        assert r.returncode == 0, r.stderr
    finally:
        gate.open()
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == EXIT_CONFLICT, (out, err)
    assert e.meta.load_compaction().tags == {"before": 1}
    assert e.compact(3) == 2
    state = e.meta.load_compaction()
    assert state.retained_epochs == (1, 2) and state.tags == {"before": 1}
    gc_keeps_every_retained_object(e)
    e.check(1)


@pytest.mark.parametrize("keep", [1, 2])
def test_tagging_the_published_view_while_a_compaction_publishes(tmp_path: Path, keep: int) -> None:
    """The tagging is held just before its compare-and-swap; a compaction publishes
    first.  Kept as a snapshot, the view is tagged on the next attempt; dropped by that
    publish, the tag is refused (exit 2, one line) and nothing is written."""
    from tests.gates import Gate, start_held

    e = Epochs(str(tmp_path / "t"), CompactionConfig(snapshot_retention=keep, delete_retention_ms=0))
    e.compact(1)
    gate = Gate(tmp_path / "gate")
    proc = start_held(gate, "shale", "shale.metadata.documents:DocumentStore.replace", "snapshots", e.uri,
                      "--tag", "now", "--json")
    try:
        assert gate.wait([proc]) == [True], proc.communicate()
        assert e.compact(2) == 2
    finally:
        gate.open()
        out, err = proc.communicate(timeout=300)
    state = e.meta.load_compaction()
    if keep == 1:
        assert proc.returncode == 2 and out == "", (out, err)
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert "epoch 1 is not retained any more (a publish dropped it meanwhile)" in err, err
        assert state.tags == {} and state.retained_epochs == (2,)
    else:
        assert proc.returncode == 0, (out, err)
        assert state.tags == {"now": 1} and state.retained_epochs == (1, 2)
        assert e.compact(3) == 3 and e.meta.load_compaction().retained_epochs == (1, 2, 3)
        e.check(1)

