"""Ages are judged by the store's clock: a garbage collection whose own clock runs ahead
must not take an upload whose registration is still in flight for an orphan."""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

import pytest

from shale.compactor import CompactionConfig, Compactor
from shale.ledger.reader import LedgerFile
from shale.maintenance.gc import collect_garbage
from shale.metadata.layout import ledger_object_name
from shale.metadata.state import LedgerInfo
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from tests.conftest import run_cli

SKEW_S = 20 * 60  # the gc's clock runs 20 minutes ahead
ORPHAN_GRACE = "15m"


def _topic(uri: str) -> TopicMetadata:
    with TopicWriter(uri) as w:
        w.append("a", "1")
    return TopicMetadata.open(uri)


def _upload_in_flight(meta: TopicMetadata) -> tuple[LedgerInfo, bytes]:
    """A ledger uploaded by a producer that has not registered it yet (as between its
    upload and its compare-and-swap), built from a copy of ledger 1 relabelled as 2."""
    from shale.ledger.writer import relabel_ledger

    first = meta.load_topic().ledgers[0]
    data = relabel_ledger(meta.topic.store.get(meta.topic.key(first.object)), 2)
    name = ledger_object_name(2, uuid.uuid4().hex[:12])
    meta.topic.store.put(meta.topic.key(name), data)
    return LedgerInfo(2, name, first.entries, first.records, len(data), first.first_publish, first.last_publish,
                      first.sealed_ms), data


def _register_and_read(meta: TopicMetadata, info: LedgerInfo, uri: str) -> None:
    meta.append_ledger(info, meta.load_topic())
    LedgerFile.open(meta.topic.store, meta.topic.key(info.object), ledger_id=2)
    assert [m.value for m in TopicReader(uri)] == [b"1", b"1"]


def test_store_clock_is_the_stores(disk_topic_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    meta = _topic(disk_topic_uri)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + SKEW_S)
    before = real()
    store_now = meta.now_ms() / 1000
    # the store's time, not this process's skewed clock (S3's Date has whole seconds)
    assert before - 1 <= store_now <= real() + 1


def test_gc_with_a_clock_ahead_keeps_an_upload_in_flight(disk_topic_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    meta = _topic(disk_topic_uri)
    info, _ = _upload_in_flight(meta)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + SKEW_S)
    report = collect_garbage(meta, grace_ms=0, orphan_grace_ms=15 * 60_000)
    assert info.object not in report.orphans_deleted
    # a compaction run's own collection judges by the store's clock too
    Compactor(disk_topic_uri, CompactionConfig(orphan_grace_ms=15 * 60_000)).run()
    _register_and_read(meta, info, disk_topic_uri)


def test_gc_command_with_a_clock_ahead(tmp_path: Path) -> None:
    """The same through the command, in a process whose every clock reading is 20
    minutes ahead (a ``sitecustomize`` skews ``time.time``): a process of its own, the
    skew would not reach a command run in this one."""
    uri = str(tmp_path / "t")
    meta = _topic(uri)
    info, _ = _upload_in_flight(meta)
    skew = tmp_path / "skew"
    skew.mkdir()
    (skew / "sitecustomize.py").write_text(
        f"import time\n_real = time.time\ntime.time = lambda: _real() + {SKEW_S}\n")
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(skew), os.environ.get("PYTHONPATH")]))}
    before = time.time()
    probe = run_cli("-c", "import time; print(time.time())", env=env, script="python")
    assert probe.returncode == 0 and float(probe.stdout) >= before + SKEW_S, ("the skew is in force", probe)
    r = run_cli("gc", uri, "--orphan-grace", ORPHAN_GRACE, "--grace", "0", env=env)
    assert r.returncode == 0, r.stderr
    assert info.object not in r.stdout
    r = run_cli("compact", uri, "--orphan-grace", ORPHAN_GRACE, env=env)
    assert r.returncode == 0, r.stderr
    _register_and_read(meta, info, uri)


def test_gc_still_collects_what_the_store_says_is_old(tmp_path: Path) -> None:
    """The other way round: an orphan the store stamped long ago is collected even when
    this machine's clock runs behind."""
    uri = str(tmp_path / "t")
    meta = _topic(uri)
    info, _ = _upload_in_flight(meta)
    path = Path(meta.topic.store.url(meta.topic.key(info.object)))
    old = time.time() - 3 * 3600
    os.utime(path, (old, old))
    report = collect_garbage(meta, grace_ms=0, orphan_grace_ms=15 * 60_000)
    assert report.orphans_deleted == [info.object]
    assert not path.exists()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
