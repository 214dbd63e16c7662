"""Four ``compact`` processes started together on one topic, round after round, while a
producer keeps appending: every epoch is published by exactly one of them, the others
exit with the conflict code and leave nothing behind, and the final view equals one
recomputed from scratch.

Every other round is held: its four processes wait just before they publish until all
four are there (:mod:`tests.gates`), so they always overlap — one wins, three lose the
race — however fast or loaded the machine.  The rounds between run free: whatever
interleaving they get, the same checks hold.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from shale.cli.errors import EXIT_CONFLICT
from shale.compactor import CompactionConfig, Compactor
from shale.maintenance.verify import verify_topic
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from tests.conftest import make_root
from tests.gates import Gate, start_held_compact

LONG = os.environ.get("SHALE_LONG_TESTS") == "1"
ROUNDS = 25 if LONG else 5
PROCESSES = 4


def produce_until(uri: str, stop: threading.Event, counts: Counter[str]) -> None:
    rnd = random.Random(5)
    while not stop.is_set():
        with TopicWriter(uri, max_ledger_records=1_000, batch_size=50) as w:
            for i in range(2_000):
                w.append(f"key-{rnd.randrange(3_000)}", None if rnd.random() < 0.05 else f"v{counts['n'] + i}")
        counts["n"] += 2_000
        stop.wait(0.2)  # a steady stream, not a flood: rounds must not slow to a crawl


def start_compactor(uri: str, gate: Gate | None) -> subprocess.Popen[str]:
    args = (uri, "--json", "--delete-retention", "0s")
    if gate is not None:
        return start_held_compact(gate, *args)
    exe = Path(sys.executable).parent / "compact"
    return subprocess.Popen([str(exe), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def append_round(uri: str, rnd: random.Random) -> None:
    """New records before a round, so that every process of it has work to do."""
    with TopicWriter(uri, max_ledger_records=1_000, batch_size=50) as w:
        for i in range(500):
            w.append(f"key-{rnd.randrange(3_000)}", f"round-{i}")


def leftovers(uri: str) -> set[str]:
    """Objects under compacted/ that no published state names, and unfinished writes."""
    meta = TopicMetadata.open(uri)
    store, topic = meta.topic.store, meta.topic
    listed = {topic.relative(o.key) for o in store.list(topic.key("compacted") + "/")}
    unfinished = {topic.relative(o.key) for o in store.unfinished_writes(topic.key("compacted") + "/")}
    return (listed - meta.load_compaction().referenced_objects()) | unfinished


def campaign(uri: str, gates: Path) -> Counter[str]:
    with TopicWriter(uri) as w:
        w.append("seed", "x")
    stop, produced = threading.Event(), Counter[str]()
    producer = threading.Thread(target=produce_until, args=(uri, stop, produced))
    producer.start()
    outcomes: Counter[str] = Counter()
    rnd = random.Random(8)
    try:
        for r in range(ROUNDS):
            append_round(uri, rnd)
            before = TopicMetadata.open(uri).load_compaction().epoch
            gate = Gate(gates / f"round-{r}") if r % 2 == 0 else None
            procs = [start_compactor(uri, gate) for _ in range(PROCESSES)]
            reached = [False] * PROCESSES
            if gate is not None:  # all four plan from epoch `before`; none publishes until all are there
                reached = gate.wait(procs)
                gate.open()
            epochs, statuses, errors = [], [], []
            for p in procs:
                out, err = p.communicate(timeout=300)
                errors.append(err)
                summary = json.loads(out.strip().splitlines()[-1])
                statuses.append(summary["status"])
                if summary["status"] == "compacted":
                    assert p.returncode == 0
                    epochs.append(summary["epoch"])
                elif summary["status"] == "conflict":
                    assert p.returncode == EXIT_CONFLICT, err
                else:
                    assert summary["status"] == "nothing-to-do" and p.returncode == 0, (summary, err)
            outcomes.update(f"{s} ({'held' if gate else 'free'})" for s in statuses)
            if gate is not None:  # overlapped: exactly one won the race
                assert reached == [True] * PROCESSES, (statuses, errors)
                assert sorted(statuses) == ["compacted"] + ["conflict"] * (PROCESSES - 1), statuses
            # each epoch published once, by one process, with no epoch skipped (a round
            # always has new records, and whoever publishes first from `before` wins)
            assert epochs and sorted(epochs) == list(range(before + 1, before + 1 + len(epochs)))
            assert TopicMetadata.open(uri).load_compaction().epoch == before + len(epochs)
            # the losers removed what they wrote; the winners left only published objects
            assert not leftovers(uri), leftovers(uri)
            assert verify_topic(TopicMetadata.open(uri)).ok
    finally:
        stop.set()
        producer.join()
    s = Compactor(uri, CompactionConfig(delete_retention_ms=0)).run()
    assert s.status in ("compacted", "nothing-to-do")
    report = verify_topic(TopicMetadata.open(uri))
    assert report.ok and report.keys_expected > 1_000, report.human()
    outcomes["records produced"] = produced["n"]
    return outcomes


HELD_ROUNDS = (ROUNDS + 1) // 2


@pytest.mark.timeout(3600 if LONG else 600)
def test_four_compactors_and_a_producer_local(tmp_path: Path) -> None:
    outcomes = campaign(str(tmp_path / "topic"), tmp_path / "gates")
    print(f"\n{ROUNDS} rounds of {PROCESSES} compactors on a local folder: {dict(outcomes)}")
    assert outcomes["conflict (held)"] == (PROCESSES - 1) * HELD_ROUNDS


@pytest.mark.timeout(3600 if LONG else 600)
@pytest.mark.s3
def test_four_compactors_and_a_producer_moto(s3_bucket: str, tmp_path: Path) -> None:
    outcomes = campaign(f"s3://{s3_bucket}/topic", tmp_path / "gates")
    print(f"\n{ROUNDS} rounds of {PROCESSES} compactors on the moto server: {dict(outcomes)}")
    assert outcomes["conflict (held)"] == (PROCESSES - 1) * HELD_ROUNDS



@pytest.mark.timeout(3600 if LONG else 600)
@pytest.mark.seaweedfs
def test_four_compactors_and_a_producer_seaweedfs(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Unserialised: SeaweedFS makes each conditional write atomic itself, as S3 does,
    where the moto server must run one request at a time."""
    outcomes = campaign(f"{make_root('seaweedfs', request, tmp_path)}/topic", tmp_path / "gates")
    print(f"\n{ROUNDS} rounds of {PROCESSES} compactors on SeaweedFS: {dict(outcomes)}")
    assert outcomes["conflict (held)"] == (PROCESSES - 1) * HELD_ROUNDS
