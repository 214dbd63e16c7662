"""Many topics per run: ``compact --all PREFIX``, filthiest first, ``--max-topics``,
``--parallel``, ``--max-compaction-lag``; one topic's failure does not stop the others."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from shale.cli.errors import EXIT_SOME_FAILED, run_exit_code
from shale.compactor import CompactionConfig, Compactor
from shale.compactor.topics import choose
from shale.maintenance.listing import discover_topics
from shale.maintenance.verify import verify_topic
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from tests.conftest import make_root, run_cli, run_cli_here

DAY = 86_400.0


def produce(uri: str, n: int, *, first: int = 0, t: float | None = None) -> None:
    clock = (lambda: t) if t is not None else time.time
    with TopicWriter(uri, max_ledger_records=50, batch_size=10, clock=clock) as w:
        for i in range(first, first + n):
            w.append(f"k{i % 17}", f"v{i}")


def lines(stdout: str) -> list[dict[str, object]]:
    """The topics' JSON lines (the run's last line, which names no topic, left out)."""
    return [x for x in map(json.loads, filter(str.strip, stdout.splitlines())) if "topic" in x]


def run_line(stdout: str) -> dict[str, object]:
    """The run's last JSON line: how many topics ended each way."""
    last = json.loads(stdout.splitlines()[-1])
    assert "topic" not in last, last
    return dict(last)


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
    assert r.returncode == 7, r.stderr  # some failed, the others completed
    status = {str(x["topic"]).rsplit("/", 1)[1]: (x["status"], x["exit_code"]) for x in lines(r.stdout)}
    assert status == {"t0": ("compacted", 0), "t1": ("compacted", 0), "t2": ("error", 4), "t3": ("compacted", 0)}
    assert run_line(r.stdout) == {"topics": 4, "compacted": 3, "nothing_to_do": 0, "skipped": 0, "dry_run": 0,
                                  "failed": 1, "failed_topics": [{"topic": uris[2], "exit_code": 4}], "exit_code": 7}


def test_a_fleet_with_one_misconfigured_topic_completes_the_others(tmp_path: Path) -> None:
    """Four topics, one of them given a policy it cannot be compacted under (event-time
    order on a view compacted in offset order, without --rewrite): the other three are
    compacted, the run says which failed and how, and exits 7, not 2 (which would tell a
    scheduler the run's own settings are wrong)."""
    uris = [str(tmp_path / "topics" / name) for name in ("a", "b", "c", "d")]
    for uri in uris:
        produce(uri, 60)
    assert run_cli_here("compact", "--all", str(tmp_path / "topics")).returncode == 0
    assert run_cli_here("config", uris[1], "--set", "order=event-time").returncode == 0
    for uri in uris:
        produce(uri, 60, first=60)
    r = run_cli("compact", "--all", str(tmp_path / "topics"))
    assert r.returncode == 7, r.stderr
    out = r.stdout.splitlines()
    assert sorted(x.split(":")[0] for x in out[:-1]) == [uris[0], uris[2], uris[3]]
    assert all(": compacted to horizon" in x for x in out[:-1])
    assert out[-1] == (f"compact: 4 topics: 3 compacted, 0 with nothing to do, 0 skipped, 1 failed: {uris[1]} "
                       "(exit 2); exit code 7")
    assert r.stderr.count("\n") == 1 and f"{uris[1]}: the compacted view is in offset order" in r.stderr
    for uri in (uris[0], uris[2], uris[3]):
        assert TopicMetadata.open(uri).load_compaction().epoch == 2
    assert TopicMetadata.open(uris[1]).load_compaction().epoch == 1
    # one topic alone ends as that topic: its own code
    assert run_cli_here("compact", uris[1]).returncode == 2
    # and the summary counts nothing to do and skipped, in JSON too
    r = run_cli_here("compact", "--all", str(tmp_path / "topics"), "--json")
    assert r.returncode == 7 and run_line(r.stdout)["nothing_to_do"] == 3


def test_the_exit_code_of_a_run_of_many_topics() -> None:
    assert run_exit_code([]) == 0 and run_exit_code([0, 0, 0]) == 0
    assert run_exit_code([0, 2, 0]) == EXIT_SOME_FAILED == 7
    assert run_exit_code([3, 0]) == 7  # a lost race among completed topics
    assert run_exit_code([2]) == 2 and run_exit_code([2, 2]) == 2  # every topic failed: the worst
    assert run_exit_code([2, 1, 3]) == 1 and run_exit_code([1, 4]) == 4


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


def test_a_prefix_without_topics_is_exit_0_with_a_notice(tmp_path: Path) -> None:
    """A new deployment has no topic yet: its nightly run succeeds, saying so (a prefix
    that stays empty pushes no metrics, and ShaleCompactionNotRunning fires)."""
    r = run_cli("compact", "--all", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stderr == f"compact: warning: no topics under {tmp_path} yet (a topic is a folder holding " \
        "_meta/topic.json): nothing to compact\n"
    assert r.stdout == "compact: 0 topics: 0 compacted, 0 with nothing to do, 0 skipped, 0 failed; exit code 0\n"
    r = run_cli_here("compact", "--all", str(tmp_path), "--json")
    assert r.returncode == 0 and run_line(r.stdout) == {
        "topics": 0, "compacted": 0, "nothing_to_do": 0, "skipped": 0, "dry_run": 0, "failed": 0,
        "failed_topics": [], "exit_code": 0}
