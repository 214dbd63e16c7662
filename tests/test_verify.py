"""``shale verify``: a published view that matches passes; one that lost, kept or aged
records is caught and named."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from shale.compactor import CompactionConfig, Compactor
from shale.compactor.verify import EXIT_MISMATCH, verify_topic
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from tests.conftest import run_cli

T0 = 1_700_000_000.0
HOUR = 3600.0


def produce(uri: str, seed: int, n: int, t: float) -> None:
    rnd = random.Random(seed)
    with TopicWriter(uri, max_ledger_records=2_000, batch_size=20, clock=lambda: t) as w:
        for i in range(n):
            w.append(f"key-{rnd.randrange(1_500)}", None if rnd.random() < 0.1 else f"{seed}-{i}")
        w.append(None, "keyless")


def compact(uri: str, hour: int, **kw: object) -> None:
    config = CompactionConfig(delete_retention_ms=int(1.5 * HOUR * 1000), reuse_min_bytes=0, **kw)  # type: ignore[arg-type]
    assert Compactor(uri, config, clock=lambda: T0 + hour * HOUR).run().status == "compacted"


def test_views_built_by_several_runs_verify(disk_topic_uri: str) -> None:
    uri = disk_topic_uri
    for hour, seed in enumerate((1, 2, 3), start=1):
        produce(uri, seed, 6_000 if hour == 1 else 600, T0 + (hour - 1) * HOUR)
        compact(uri, hour, retain_null_key=hour == 2)
        report = verify_topic(TopicMetadata.open(uri))
        assert report.ok, report.human()
        assert report.keys_expected > 1_000 and report.records_checked >= report.keys_expected
        assert report.frames_checked > 0 and report.unverifiable == 0
    r = run_cli("verify", uri, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ok"] is True


def _tamper(uri: str, change: object) -> None:
    path = Path(uri) / "_meta" / "compaction.json"
    doc = json.loads(path.read_text())
    change(doc["value"])  # type: ignore[operator]
    path.write_text(json.dumps(doc))


def test_a_lost_part_is_missing_keys(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    produce(uri, 1, 6_000, T0)
    compact(uri, 1, max_part_bytes=1 << 16)
    _tamper(uri, lambda v: v["parts"].pop(0))
    r = run_cli("verify", uri)
    assert r.returncode == EXIT_MISMATCH, r.stdout + r.stderr
    assert "MISMATCH" in r.stdout and "missing: the key of record" in r.stdout
    assert verify_topic(TopicMetadata.open(uri)).missing > 0


def test_a_horizon_moved_without_compacting_is_stale_and_missing(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    produce(uri, 1, 4_000, T0)
    compact(uri, 1)
    produce(uri, 2, 4_000, T0 + HOUR)
    last = TopicMetadata.open(uri).load_topic().ledgers[-1]
    _tamper(uri, lambda v: v.__setitem__("horizon", f"{last.id}:0:0"))
    report = verify_topic(TopicMetadata.open(uri))
    assert not report.ok and report.stale > 0 and report.missing > 0
    assert any(e.startswith("stale: compacted record") for e in report.examples)


def test_a_superseded_record_brought_back_is_stale(tmp_path: Path) -> None:
    """A deletion vector that forgets a superseded record brings back an old value."""
    uri = str(tmp_path / "t")
    produce(uri, 1, 4_000, T0)
    compact(uri, 1)
    produce(uri, 2, 400, T0 + HOUR)
    compact(uri, 2)
    state = TopicMetadata.open(uri).load_compaction()
    assert any(p.deletions for p in state.parts)
    _tamper(uri, lambda v: [(p.pop("deletions", None), p.pop("deleted", None)) for p in v["parts"]])
    report = verify_topic(TopicMetadata.open(uri))
    assert not report.ok and report.stale > 0


def test_a_corrupt_compacted_part_exits_4(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    produce(uri, 1, 4_000, T0)
    compact(uri, 1)
    part = next((tmp_path / "t" / "compacted").rglob("*.ledger"))
    data = bytearray(part.read_bytes())
    data[100] ^= 0x40
    part.write_bytes(bytes(data))
    r = run_cli("verify", uri)
    assert r.returncode == 4 and part.name in r.stderr and r.stderr.count("\n") == 1


@pytest.mark.parametrize("args", [["verify", "/nonexistent/topic"], ["verify"]])
def test_bad_usage_exits_2(args: list[str]) -> None:
    r = run_cli(*args)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
