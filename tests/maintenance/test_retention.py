"""Retention (truncation) while compactions run: Kafka's generation check.

Truncating a topic stamps the compaction state, so a run planned before the truncation
loses its publish race: it publishes nothing, removes its output and exits 3, and the
next run compacts what is left.  Ledger ids are never reused, and the removed objects
outlive the orphan grace for readers still reading them."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest

from shale.compactor import CompactionConfig, Compactor, collect_garbage
from shale.ledger.errors import InvalidInputError
from shale.maintenance.retention import plan_truncation, retention_cut, truncate
from shale.maintenance.verify import verify_topic
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from tests.conftest import run_cli_here


def produce(uri: str, seed: int, n: int) -> None:
    rnd = random.Random(seed)
    with TopicWriter(uri, max_ledger_records=1_000, batch_size=20) as w:
        for i in range(n):
            w.append(f"k{rnd.randrange(1_500)}", f"{seed}-{i}")


def test_a_truncation_during_a_run_makes_it_publish_nothing(disk_topic_uri: str) -> None:
    uri = disk_topic_uri
    produce(uri, 1, 6_000)
    assert Compactor(uri, CompactionConfig()).run().status == "compacted"
    produce(uri, 2, 3_000)
    meta = TopicMetadata.open(uri)
    before = meta.load_compaction()
    first_new = [lg.id for lg in meta.load_topic().ledgers][6]

    def truncate_mid_run(msg: str) -> None:
        if msg.startswith("pass two"):  # the run has read the footers and decided
            meta.truncate(first_new + 1)

    s = Compactor(uri, CompactionConfig(), progress=truncate_mid_run).run()
    assert s.status == "conflict" and "truncated" in s.message, s.message
    state = meta.load_compaction()
    assert state.epoch == before.epoch and state.horizon == before.horizon
    assert state.topic_generation == 1
    listed = {meta.topic.relative(o.key) for o in meta.topic.store.list(meta.topic.key("compacted") + "/")}
    assert listed == state.referenced_objects()  # the loser's output is gone
    # the next run plans against the truncated topic and publishes
    again = Compactor(uri, CompactionConfig()).run()
    assert again.status == "compacted", again.error
    report = verify_topic(meta)
    assert report.ok, report.human()
    assert report.unverifiable > 0  # compacted records of removed ledgers: kept, as a compacted topic keeps keys


def test_ids_stay_monotonic_and_removed_ledgers_wait_for_the_grace(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    produce(uri, 1, 3_000)
    meta = TopicMetadata.open(uri)
    last = meta.load_topic().last_ledger_id
    r = run_cli_here("truncate", uri, "--before-ledger", str(last + 1), "--allow-uncompacted", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["ledgers"] == 0 and out["generation"] == 1 and len(out["removed"]) == 3
    produce(uri, 2, 500)
    ids = [lg.id for lg in meta.load_topic().ledgers]
    assert ids and min(ids) > last  # never reused
    assert next(m.value for m in TopicReader(uri)) == b"2-0"
    grace = CompactionConfig().orphan_grace_ms
    now = int(time.time() * 1000)
    kept = collect_garbage(meta, now_ms=now + 60_000, grace_ms=0, orphan_grace_ms=grace)
    assert not any(o.startswith("ledgers/") for o in kept.orphans_deleted)  # readers may still need them
    later = collect_garbage(meta, now_ms=now + grace + 60_000, grace_ms=0, orphan_grace_ms=grace)
    assert len([o for o in later.orphans_deleted if o.startswith("ledgers/")]) == 3
    assert run_cli_here("truncate", uri, "--before-ledger", "x").returncode == 2
    assert run_cli_here("truncate", str(tmp_path / "missing"), "--before-ledger", "3").returncode == 2


def test_removed_ledgers_wait_for_the_grace_after_the_truncation_however_old_they_are(tmp_path: Path) -> None:
    """Ledgers written long ago (older than the orphan grace themselves) and removed now
    stay until the grace has passed since the truncation, for the readers that had listed
    them: gc takes them at the truncation plus the grace, not a millisecond before."""
    uri = str(tmp_path / "t")
    produce(uri, 1, 3_000)
    meta = TopicMetadata.open(uri)
    grace = CompactionConfig().orphan_grace_ms
    written = time.time() - 2 * grace / 1000
    for f in (tmp_path / "t" / "ledgers").iterdir():
        os.utime(f, (written, written))
    plan = truncate(meta, meta.load_topic().last_ledger_id + 1, allow_uncompacted=True)
    assert len(plan.removed) == 3
    truncated = meta.load_topic().truncated_ms
    kept = collect_garbage(meta, now_ms=truncated + grace - 1, grace_ms=0, orphan_grace_ms=grace)
    assert not any(o.startswith("ledgers/") for o in kept.orphans_deleted), kept.orphans_deleted
    assert len(list((tmp_path / "t" / "ledgers").iterdir())) == 3
    gone = collect_garbage(meta, now_ms=truncated + grace, grace_ms=0, orphan_grace_ms=grace)
    assert sorted(gone.orphans_deleted) == sorted(lg.object for lg in plan.removed)


def _timed(uri: str, times_s: list[float]) -> None:
    """One ledger of one record per entry (``k<i>``), published at ``times_s``."""
    clock = [0.0]
    with TopicWriter(uri, max_ledger_records=len(times_s), batch_size=1, clock=lambda: clock[0]) as w:
        for i, t in enumerate(times_s):
            clock[0] = t
            w.append(f"k{i}", f"v{i}")


def test_a_horizon_inside_a_ledger_keeps_that_ledger_from_retention(tmp_path: Path) -> None:
    """The minimum compaction lag stopped the horizon one record before the end of ledger
    2: removing ledger 2 would lose that record, so truncate refuses (counting it) and a
    retention rule stops before it."""
    uri = str(tmp_path / "t")
    t0 = 1_700_000_000.0
    _timed(uri, [t0] * 4)
    _timed(uri, [t0] * 4 + [t0 + 7200])
    _timed(uri, [t0 + 7200] * 2)
    lag = 3_600_000
    s = Compactor(uri, CompactionConfig(min_compaction_lag_ms=lag), clock=lambda: t0 + 7200).run()
    meta = TopicMetadata.open(uri)
    assert s.status == "compacted" and str(meta.load_compaction().horizon) == "2:3:0"
    plan = plan_truncation(meta, 3)
    assert (plan.uncompacted, plan.records_lost) == ((2,), 1)
    with pytest.raises(InvalidInputError, match=r"would lose 1 record no compaction has kept \(ledger 2; the horizon "):
        truncate(meta, 3)
    assert [lg.id for lg in meta.load_topic().ledgers] == [1, 2, 3]
    assert retention_cut(meta, older_than_ms=0, now_ms=int((t0 + 10**6) * 1000)) == 2  # ledger 1 only


def test_retention_by_age_removes_a_ledger_only_once_it_is_older_than_the_age(tmp_path: Path) -> None:
    """``--older-than D``: a ledger whose last record is exactly D old stays; a
    millisecond later it goes."""
    uri = str(tmp_path / "t")
    _timed(uri, [1_700_000_000.0, 1_700_000_000.5])
    _timed(uri, [1_700_000_001.0])
    assert Compactor(uri, CompactionConfig()).run().status == "compacted"
    meta = TopicMetadata.open(uri)
    last = meta.load_topic().ledgers[0].last_publish
    assert last == 1_700_000_000_500
    assert retention_cut(meta, older_than_ms=3_600_000, now_ms=last + 3_600_000) == 1
    assert retention_cut(meta, older_than_ms=3_600_000, now_ms=last + 3_600_001) == 2
