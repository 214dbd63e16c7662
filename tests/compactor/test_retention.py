"""Retention (truncation) while compactions run: Kafka's generation check.

Truncating a topic stamps the compaction state, so a run planned before the truncation
loses its publish race: it publishes nothing, removes its output and exits 3, and the
next run compacts what is left.  Ledger ids are never reused, and the removed objects
outlive the orphan grace for readers still reading them."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from shale.compactor import CompactionConfig, Compactor, collect_garbage
from shale.compactor.verify import verify_topic
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
