"""``shale verify``: a published view that matches passes; one that lost, kept or aged
records is caught and named."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.cli import main as shale_main
from shale.cli.errors import EXIT_MISMATCH
from shale.compactor import CompactionConfig, Compactor, keymap, rules
from shale.compactor.rules import latest_by_sorting
from shale.ledger import latest as ledger_latest
from shale.maintenance import verify, verify_fold
from shale.maintenance.verify import verify_topic
from shale.maintenance.verify_fold import latest_per_key
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from tests.conftest import run_cli_here

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
    r = run_cli_here("verify", uri, "--json")
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
    r = run_cli_here("verify", uri)
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
    r = run_cli_here("verify", uri)
    assert r.returncode == 4 and part.name in r.stderr and r.stderr.count("\n") == 1


@pytest.mark.parametrize("args", [["verify", "/nonexistent/topic"], ["verify"]])
def test_bad_usage_exits_2(args: list[str]) -> None:
    r = run_cli_here(*args)
    assert r.returncode == 2 and r.stderr.count("\n") == 1


# ------------------------------------------------- verify's fold is not the compactor's


def _one_wrong(real: Callable[..., Any], calls: list[int]) -> Callable[..., Any]:
    """``real`` (``latest_positions``), except that the first key, in hash order, with an
    earlier record gets that earlier record as its latest."""
    def wrong(hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64]) -> npt.NDArray[np.intp]:
        got = real(hi, lo)
        got = (latest_by_sorting(hi, lo) if got is None else got).copy()
        for j, i in enumerate(got.tolist()):
            earlier = np.flatnonzero((hi[:i] == hi[i]) & (lo[:i] == lo[i]))
            if len(earlier):
                got[j] = earlier[-1]
                calls.append(i)
                break
        return np.asarray(got)
    return wrong


def test_a_wrong_latest_in_the_compactors_fold_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A compaction whose "latest of each key" picks an older record for one key: verify,
    run in the same process with the same broken function, still reports it."""
    uri = str(tmp_path / "t")
    produce(uri, 1, 3_000, T0)
    calls: list[int] = []
    # the broken choice is made where every user of rules.latest_of_each_key gets it
    # (compaction's key map, and anything else that imports it) ...
    monkeypatch.setattr(ledger_latest, "latest_positions", _one_wrong(ledger_latest.latest_positions, calls))
    # ... and compaction takes that path rather than the key table in C
    monkeypatch.setattr(keymap, "new_key_table", lambda expected=0: None)
    compact(uri, 1)
    assert calls, "the compaction never asked for the latest of each key"
    report = verify_topic(TopicMetadata.open(uri))
    assert report.stale == 1 and report.missing == report.extra == 0, report.human()
    assert shale_main(["verify", uri]) == EXIT_MISMATCH
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "stale: compacted record" in out, out


HALVES = st.sampled_from([0, 1, 2, 7, 2**32, 2**63 - 1, 2**63, 2**64 - 1]).map(np.uint64)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(HALVES, HALVES), max_size=200), st.integers(0, 3))
def test_verifys_fold_agrees_with_the_compactors(keys: list[tuple[np.uint64, np.uint64]], shift: int) -> None:
    """On keys whose high halves collide (and repeat), both folds pick the same records,
    in the same order, and those are the last occurrence of each key."""
    hi = np.array([k[0] for k in keys], dtype=np.uint64) >> np.uint64(shift)
    lo = np.array([k[1] for k in keys], dtype=np.uint64)
    mine = latest_per_key(hi, lo)
    last = {(int(h), int(low)): i for i, (h, low) in enumerate(zip(hi, lo, strict=True))}
    assert mine.tolist() == [last[k] for k in sorted(last)]
    assert np.array_equal(mine, rules.latest_of_each_key(hi, lo))
    assert np.array_equal(mine, latest_by_sorting(hi, lo))


def _imports(module: Any) -> set[str]:
    import ast

    tree = ast.parse(Path(module.__file__).read_text())
    return ({n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
            | {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names})


def test_verifys_fold_imports_nothing_of_the_compactors() -> None:
    assert _imports(verify_fold) <= {"__future__", "numpy", "numpy.typing"}, _imports(verify_fold)
    assert not _imports(verify) & {"shale.compactor.rules", "shale.ledger.kernels", "shale.compactor.keymap",
                                   "shale.compactor.pass_one"}, _imports(verify)


def test_scrub_says_one_byte_count(tmp_path: Path) -> None:
    """What a scrub reports having checked is what its progress counted, and what ``shale
    status`` says the objects hold: each object's stored size, frames and footer."""
    uri = str(tmp_path / "t")
    produce(uri, 1, 3_000, T0)
    assert Compactor(uri, CompactionConfig()).run().status == "compacted"
    produce(uri, 2, 500, T0 + HOUR)
    seen: list[tuple[int, int]] = []
    from shale.maintenance.scrub import scrub_topic

    report = scrub_topic(TopicMetadata.open(uri), progress=lambda done, total: seen.append((done, total)))
    meta = TopicMetadata.open(uri)
    stored = sum(lg.bytes for lg in meta.load_topic().ledgers) + sum(p.bytes for p in meta.load_compaction().parts)
    assert report.ok and seen[-1] == (stored, stored) and report.bytes_checked == stored
    r = run_cli_here("verify", uri, "--scrub", "--json")
    assert r.returncode == 0 and json.loads(r.stdout.splitlines()[0])["bytes_checked"] == stored, r.stdout
