"""Pass one's key map: 24 bytes per key, only keys written since the last run, bounded
by ``max_map_bytes`` with partial cleaning that ends where one unbounded run ends."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from shale.compactor import CompactionConfig, Compactor
from shale.ledger.errors import InvalidInputError
from shale.maintenance.verify import verify_topic
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from tests.conftest import make_root, run_cli

T0 = 1_700_000_000.0
HOUR = 3600.0


def produce(uri: str, seed: int, n: int, keys: int, t: float) -> None:
    rnd = random.Random(seed)
    with TopicWriter(uri, max_ledger_records=2_000, batch_size=7, clock=lambda: t) as w:
        for i in range(n):
            key = None if rnd.random() < 0.03 else f"key-{rnd.randrange(keys)}"
            value = None if key is not None and rnd.random() < 0.1 else f"v{seed}-{i}"
            w.append(key, value)


def compacted(uri: str) -> list[tuple[str, Any, Any]]:
    with TopicReader(uri, read_compacted=True) as r:
        return [(str(m.id), m.key, m.value) for m in r.read()]


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "s3":
        request.applymarker(pytest.mark.s3)
    return make_root(str(request.param), request, tmp_path)


@pytest.mark.parametrize("retain", [False, True])
def test_small_map_progresses_over_runs_to_the_unbounded_result(root: str, retain: bool) -> None:
    small, big = f"{root}/small", f"{root}/big"
    cfg = dict(delete_retention_ms=int(HOUR * 1000), retain_null_key=retain)
    for rnd, n in enumerate((12_000, 3_000)):
        for u in (small, big):
            produce(u, seed=rnd, n=n, keys=5_000, t=T0 + rnd * HOUR)
        now = T0 + (rnd + 0.5) * HOUR
        one = Compactor(big, CompactionConfig(**cfg), clock=lambda now=now: now).run()  # type: ignore[arg-type]
        assert one.status == "compacted" and one.deferred_records == 0
        limit = 1024 * 24  # 1,024 keys
        runs = []
        while True:
            s = Compactor(small, CompactionConfig(max_map_bytes=limit, **cfg),  # type: ignore[arg-type]
                          clock=lambda now=now: now).run()
            if s.status == "nothing-to-do":
                break
            assert s.status == "compacted", s.error
            runs.append(s)
            assert len(runs) < 50, "no progress"
            # the map never holds more than the limit, plus at most one entry (7 records)
            assert s.map_keys <= 1024 + 7 and s.map_bytes == 24 * s.map_keys
            # over the limit only when the first ledger's first entry alone does not fit
            assert s.map_keys <= 1024 or s.ledgers_read == 1
        assert len(runs) >= 3  # the limit forced several runs
        assert [r.deferred_records > 0 for r in runs] == [True] * (len(runs) - 1) + [False]
        assert "next run" in runs[0].message
        deferred = [r.deferred_records for r in runs]
        assert deferred == sorted(deferred, reverse=True)
        # the same published state as one unbounded run
        assert compacted(small) == compacted(big)
        a, b = TopicMetadata.open(small).load_compaction(), TopicMetadata.open(big).load_compaction()
        assert (a.horizon, a.keys, a.tombstones) == (b.horizon, b.keys, b.tombstones)


def test_map_holds_only_keys_written_since_the_last_run(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    produce(uri, seed=1, n=20_000, keys=8_000, t=T0)
    first = Compactor(uri, clock=lambda: T0 + HOUR).run()
    assert first.map_keys > 7_000
    with TopicWriter(uri, clock=lambda: T0 + HOUR) as w:
        for i in range(300):
            w.append(f"key-{i % 120}", f"new-{i}")
    second = Compactor(uri, clock=lambda: T0 + 2 * HOUR).run()
    assert second.status == "compacted"
    assert second.map_keys == 120 and second.map_bytes == 120 * 24  # not the topic's 8,000 keys
    live = {m.key for m in TopicReader(uri, read_compacted=True) if m.key is not None and m.value is not None}
    assert second.keys == len(live) >= first.keys


def test_cli_max_map_bytes(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    produce(uri, seed=2, n=6_000, keys=3_000, t=T0)
    res = run_cli(uri, "--max-map-bytes", "24KiB", "--json", script="compact")
    assert res.returncode == 0, res.stderr
    assert '"deferred_records":' in res.stdout and "key map was full" in res.stdout
    res = run_cli(uri, "--max-map-bytes", "12", script="compact")
    assert res.returncode == 2 and "at least 24" in res.stderr


def test_a_partial_run_is_continued_whatever_the_dirty_ratio(tmp_path: Path) -> None:
    small, big = str(tmp_path / "small"), str(tmp_path / "big")
    for u in (small, big):
        produce(u, seed=5, n=8_000, keys=4_000, t=T0)
    Compactor(big, clock=lambda: T0 + HOUR).run()
    runs = 0
    while True:
        s = Compactor(small, CompactionConfig(max_map_bytes=24 * 1000, min_dirty_ratio=0.9),
                      clock=lambda: T0 + HOUR).run()
        if s.status != "compacted":
            break
        runs += 1
        assert runs < 30
    assert runs >= 2 and s.status == "nothing-to-do"  # never "skipped" while records were owed
    assert compacted(small) == compacted(big)


@pytest.mark.parametrize("order", ["offset", "event-time"])
def test_a_rewrite_whose_keys_do_not_fit_is_refused_and_publishes_nothing(tmp_path: Path, order: str) -> None:
    """A rewrite reads the ledgers again from the first, below the previous horizon: a
    key map full before it must not cut the run there (the published state named a part
    with records above its horizon, and every command then refused the topic)."""
    uri = str(tmp_path / "t")
    produce(uri, seed=6, n=400, keys=60, t=T0)
    Compactor(uri, CompactionConfig(order=order), clock=lambda: T0 + HOUR).run()
    produce(uri, seed=7, n=100, keys=60, t=T0 + HOUR)
    meta = TopicMetadata.open(uri)
    before, view = meta.load_compaction(), compacted(uri)
    with pytest.raises(InvalidInputError, match=r"a rewrite weighs every record up to the previous horizon .* "
                                                r"do not fit in the key map \(\d+ keys"):
        Compactor(uri, CompactionConfig(order=order, rewrite=True, max_map_bytes=24 * 10),
                  clock=lambda: T0 + 2 * HOUR).run()
    after = meta.load_compaction()
    assert (after.epoch, after.version, after.horizon) == (before.epoch, before.version, before.horizon)
    assert compacted(uri) == view
    s = Compactor(uri, CompactionConfig(order=order, rewrite=True), clock=lambda: T0 + 2 * HOUR).run()
    assert s.status == "compacted" and s.deferred_records == 0
    assert verify_topic(meta).ok
