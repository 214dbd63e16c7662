"""Many topics per run: ``compact --all PREFIX``, filthiest first, ``--max-topics``,
``--parallel``, ``--max-compaction-lag``; one topic's failure does not stop the others."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from shale.compactor import CompactionConfig, Compactor
from shale.compactor.topics import choose
from shale.maintenance.listing import discover_topics
from shale.maintenance.verify import verify_topic
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from tests.conftest import make_root, run_cli

DAY = 86_400.0


def produce(uri: str, n: int, *, first: int = 0, t: float | None = None) -> None:
    clock = (lambda: t) if t is not None else time.time
    with TopicWriter(uri, max_ledger_records=50, batch_size=10, clock=clock) as w:
        for i in range(first, first + n):
            w.append(f"k{i % 17}", f"v{i}")


def lines(stdout: str) -> list[dict[str, object]]:
    return [json.loads(x) for x in stdout.splitlines() if x.strip()]


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_all_compacts_fifty_topics(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    root = make_root(kind, request, tmp_path)
    uris = [f"{root}/team-{i % 5}/topic-{i:02d}" for i in range(50)]
    for i, uri in enumerate(uris):
        produce(uri, 20 + i)
    assert discover_topics(root) == sorted(uris)
    r = run_cli("compact", "--all", root, "--json", "--parallel", "4")
    assert r.returncode == 0, r.stderr
    got = lines(r.stdout)
    assert sorted(str(x["topic"]) for x in got) == sorted(uris)
    assert {x["status"] for x in got} == {"compacted"}
    for uri in uris[::10]:
        assert verify_topic(TopicMetadata.open(uri)).ok
    again = run_cli("compact", "--all", root, "--json")
    assert {x["status"] for x in lines(again.stdout)} == {"nothing-to-do"}


def test_filthiest_first_and_max_topics(tmp_path: Path) -> None:
    a, b, c = (str(tmp_path / n) for n in "abc")
    for uri in (a, c):
        produce(uri, 400)
        assert Compactor(uri, CompactionConfig()).run().status == "compacted"
    produce(a, 20, first=400)  # a little new data: low ratio
    produce(c, 300, first=400)  # much new data: high ratio
    produce(b, 100)  # never compacted: ratio 1
    order = [x.uri for x in choose([a, b, c], now_ms=int(time.time() * 1000))]
    assert order == [b, c, a]
    r = run_cli("compact", a, b, c, "--json", "--max-topics", "2")
    assert r.returncode == 0, r.stderr
    assert [x["topic"] for x in lines(r.stdout)] == [b, c]
    assert TopicMetadata.open(a).load_compaction().epoch == 1  # left for a later run


def test_an_overdue_topic_is_compacted_whatever_its_ratio(tmp_path: Path) -> None:
    old, fresh = str(tmp_path / "old"), str(tmp_path / "fresh")
    for uri in (old, fresh):
        produce(uri, 400, t=time.time() - 3 * DAY)
        assert Compactor(uri, CompactionConfig()).run().status == "compacted"
    produce(old, 10, first=400, t=time.time() - 2 * DAY)  # little, but two days old
    produce(fresh, 10, first=400)
    r = run_cli("compact", fresh, old, "--json", "--min-dirty-ratio", "0.9", "--max-compaction-lag", "1d")
    assert r.returncode == 0, r.stderr
    got = lines(r.stdout)
    assert [x["topic"] for x in got] == [old, fresh]  # overdue first
    assert [x["status"] for x in got] == ["compacted", "skipped"]


def test_one_topic_failing_does_not_stop_the_others(tmp_path: Path) -> None:
    uris = [str(tmp_path / f"t{i}") for i in range(4)]
    for uri in uris:
        produce(uri, 120)
    victim = sorted((tmp_path / "t2" / "ledgers").glob("*.ledger"))[-1]  # its records all survive
    data = bytearray(victim.read_bytes())
    data[60] ^= 0xFF
    victim.write_bytes(bytes(data))
    r = run_cli("compact", "--all", str(tmp_path), "--json", "--parallel", "2")
    assert r.returncode == 4, r.stderr
    status = {str(x["topic"]).rsplit("/", 1)[1]: x["status"] for x in lines(r.stdout)}
    assert status == {"t0": "compacted", "t1": "compacted", "t2": "error", "t3": "compacted"}


@pytest.mark.parametrize("args", [
    ["compact"],
    ["compact", "/tmp/x", "--all", "/tmp"],
    ["compact", "--all", "/tmp", "--metadata", "/tmp/m"],
    ["compact", "--all", "/tmp", "--max-topics", "0"],
    ["compact", "--all", "/tmp", "--parallel", "0"],
])
def test_bad_usage_exits_2(args: list[str]) -> None:
    r = run_cli(*args)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr


def test_a_prefix_without_topics_is_an_error(tmp_path: Path) -> None:
    """A typo in the nightly prefix must not succeed quietly forever."""
    r = run_cli("compact", "--all", str(tmp_path))
    assert r.returncode == 2 and "no topics under" in r.stderr and r.stderr.count("\n") == 1, r.stderr
