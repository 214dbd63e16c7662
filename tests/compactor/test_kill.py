"""Crash at any instant: ``compact`` processes killed with SIGKILL at seeded random moments.

Each trial appends records, starts a real ``compact`` process (garbage collection with
no grace, so kills also land while it deletes the previous parts), and kills its whole
process group at a moment of its run: at a seeded random delay (start-up, planning, pass
one, the copy, the publish or garbage collection, wherever it falls), or as soon as the
run is seen to reach a step — its run folder made, a part written, its state published —
so that the moments that matter are hit however fast or loaded the machine is.  A run
that ends before its kill is checked the same way.  After every kill:

* the published state loads and every object it names exists;
* readers see the old state or the new one, never a mix: the compacted view equals the
  one recomputed from the original ledgers at the published horizon
  (:func:`compactor.verify.verify_topic`), and a compacted read has no duplicate;
* a new run completes and verifies;
* garbage collection past the grace leaves exactly the objects the state names, and
  no unfinished write.

CI runs a bounded, seeded campaign on a local folder and on the moto server; run
``SHALE_LONG_TESTS=1 pytest tests/compactor/test_kill.py -s`` for a long one.  The counts print
with ``-s``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from shale.compactor import CompactionConfig, Compactor, collect_garbage
from shale.maintenance.verify import verify_topic
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader

LONG = os.environ.get("SHALE_LONG_TESTS") == "1"
TRIALS = 60 if LONG else 12


def produce(uri: str, rnd: random.Random, n: int) -> None:
    with TopicWriter(uri, max_ledger_records=3_000, batch_size=20) as w:
        for i in range(n):
            w.append(f"key-{rnd.randrange(4_000)}", None if rnd.random() < 0.05 else f"v{i}-" + "x" * 60)


def compact_process(uri: str) -> subprocess.Popen[bytes]:
    exe = Path(sys.executable).parent / "compact"
    return subprocess.Popen([str(exe), uri, "--gc-grace", "0s", "--delete-retention", "0s"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def check_after_kill(uri: str, epochs: tuple[int, int]) -> str:
    meta = TopicMetadata.open(uri)
    state = meta.load_compaction()
    assert state.epoch in epochs, (state.epoch, epochs)
    for obj in state.referenced_objects():
        assert meta.topic.store.exists(meta.topic.key(obj)), obj
    report = verify_topic(meta)
    assert report.ok, report.human()
    ids = [m.id for m in TopicReader(uri, read_compacted=True)]
    assert len(ids) == len(set(ids)) and ids == sorted(ids)
    return "new state" if state.epoch == epochs[1] else "old state"


def check_recovery(uri: str) -> None:
    s = Compactor(uri, CompactionConfig(delete_retention_ms=0)).run()
    assert s.status in ("compacted", "nothing-to-do"), s.error
    meta = TopicMetadata.open(uri)
    assert verify_topic(meta).ok
    grace = CompactionConfig().orphan_grace_ms
    collect_garbage(meta, now_ms=int(time.time() * 1000) + grace + 60_000, grace_ms=0, orphan_grace_ms=grace)
    state = meta.load_compaction()
    store, topic = meta.topic.store, meta.topic
    left = {topic.relative(o.key) for o in store.list(topic.key("compacted") + "/")}
    assert left == state.referenced_objects(), left ^ state.referenced_objects()
    assert not list(store.unfinished_writes(topic.key("compacted") + "/"))


#: What a trial waits to see before it kills the run (besides a random delay).
STEPS = ("a run folder", "a part", "the publish")


def _compacted(uri: str) -> set[str]:
    meta = TopicMetadata.open(uri)
    return {o.key for o in meta.topic.store.list(meta.topic.key("compacted") + "/")}


def _reached(uri: str, step: str, before: set[str], epoch: int) -> bool:
    """Whether the run under way has reached ``step``."""
    if step == "the publish":
        return TopicMetadata.open(uri).load_compaction().epoch > epoch
    new = _compacted(uri) - before
    return bool(new) if step == "a run folder" else any(k.endswith(".ledger") for k in new)


def _kill_when(proc: subprocess.Popen[bytes], uri: str, step: str, epoch: int, before: set[str]) -> bool:
    """Kill ``proc`` as soon as its run reaches ``step``; False if it ended first."""
    while proc.poll() is None:
        if _reached(uri, step, before, epoch):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            return True
        time.sleep(0.002)
    return False


def campaign(uri: str, seed: int) -> Counter[str]:
    rnd = random.Random(seed)
    produce(uri, rnd, 20_000)
    t = time.monotonic()
    assert compact_process(uri).wait(timeout=120) == 0
    duration = time.monotonic() - t  # start-up included: kills land there too
    outcomes: Counter[str] = Counter()
    for trial in range(TRIALS):
        produce(uri, rnd, 8_000)
        epoch = TopicMetadata.open(uri).load_compaction().epoch
        before = _compacted(uri)
        proc = compact_process(uri)
        step = STEPS[trial % (len(STEPS) + 1)] if trial % (len(STEPS) + 1) < len(STEPS) else None
        if step is None:
            try:
                proc.wait(timeout=rnd.uniform(0.05, 1.1 * duration))
                killed = False
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
                killed = True
        else:
            killed = _kill_when(proc, uri, step, epoch, before)
        if killed:
            outcomes[f"killed ({step or 'at random'}), " + check_after_kill(uri, (epoch, epoch + 1)) + " seen"] += 1
        else:
            assert proc.returncode == 0
            outcomes["finished before the kill"] += 1
        check_recovery(uri)
        outcomes["survived"] += 1
    return outcomes


def _report(where: str, outcomes: Counter[str]) -> None:
    print(f"\nSIGKILL campaign on {where}: {TRIALS} trials; " + ", ".join(f"{k}: {v}" for k, v in outcomes.items()))


@pytest.mark.timeout(3600 if LONG else 600)
def test_sigkill_campaign_local(tmp_path: Path) -> None:
    outcomes = campaign(str(tmp_path / "topic"), seed=11)
    _report("a local folder", outcomes)
    assert outcomes["survived"] == TRIALS
    assert any(k.startswith("killed") for k in outcomes)  # (each step is seen long before its run ends)


@pytest.mark.timeout(3600 if LONG else 600)
@pytest.mark.s3
def test_sigkill_campaign_moto(s3_bucket: str) -> None:
    outcomes = campaign(f"s3://{s3_bucket}/topic", seed=12)
    _report("the moto server", outcomes)
    assert outcomes["survived"] == TRIALS
    assert any(k.startswith("killed") for k in outcomes)  # (each step is seen long before its run ends)
