"""Tags and rollback by time from the command line (in this process): ``shale snapshots``
(listing, ``--tag``, ``--untag``), ``read --as-of TAG``, ``rollback --to-tag`` and
``--to-time``; bad input is one line and exit 2, a hostile ``tags`` field exit 4."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shale.cli.errors import EXIT_CORRUPT, EXIT_USAGE
from shale.metadata.topic import TopicMetadata
from tests.cli.test_snapshot_cli import _one_line, _produce
from tests.conftest import run_cli_here


@pytest.fixture
def topic(tmp_path: Path) -> str:
    """A topic compacted three times under a policy keeping three views."""
    uri = str(tmp_path / "t")
    _produce(uri, 0)
    assert run_cli_here("config", uri, "--set", "snapshot-retention=3").returncode == 0
    for round_ in range(3):
        _produce(uri, round_ + 1)
        r = run_cli_here("--delete-retention", "0s", uri, script="compact")
        assert r.returncode == 0, r.stderr
    return uri


def ok(*args: str) -> str:
    r = run_cli_here(*args)
    assert r.returncode == 0, (args, r.stderr)
    return r.stdout


def test_snapshots_lists_the_retained_views_as_status_does(topic: str) -> None:
    ok("snapshots", topic, "--tag", "v1", "--epoch", "1")
    lines = ok("snapshots", topic).splitlines()
    assert [x.split(":")[0] for x in lines] == ["snapshot  epoch 1", "snapshot  epoch 2", "published epoch 3"]
    assert lines[0].endswith(", tagged v1") and "replaced" not in lines[2]
    assert all("live record" in x and "offset order" in x for x in lines)
    # the same lines as shale status's, from the same code
    status = [x for x in ok("status", topic).splitlines() if x.startswith("snapshot  ")]
    assert status == lines[:2]
    doc = json.loads(ok("snapshots", topic, "--json"))
    assert (doc["epoch"], doc["tags"]) == (3, {"v1": 1})
    assert [(v["epoch"], v["published"], v["tags"]) for v in doc["views"]] == [(1, False, ["v1"]), (2, False, []),
                                                                              (3, True, [])]
    state = TopicMetadata.open(topic).load_compaction()
    assert [v["compacted_ms"] for v in doc["views"]] == [*(s.compacted_ms for s in state.snapshots),
                                                         state.compacted_ms]
    assert json.loads(ok("status", topic, "--json"))["compaction"]["tags"] == {"v1": 1}


def test_a_tag_reads_as_its_epoch_and_is_rolled_back_to(topic: str) -> None:
    assert "tagged the view of epoch 3 'latest-good'" in ok("snapshots", topic, "--tag", "latest-good")
    assert json.loads(ok("snapshots", topic, "--tag", "v1", "--epoch", "1", "--json"))["tags"] == {
        "latest-good": 3, "v1": 1}
    for extra in ((), ("--table",)):
        assert ok("read", topic, "--as-of", "v1", *extra) == ok("read", topic, "--as-of", "1", *extra)
    assert ok("read", topic, "--as-of", "v1") != ok("read", topic, "--as-of", "latest-good")
    before = TopicMetadata.open(topic).load_compaction()
    dry = ok("rollback", topic, "--to-tag", "v1", "--dry-run")
    assert "would publish the view of epoch 1 as epoch 4" in dry
    assert TopicMetadata.open(topic).load_compaction() == before
    done = json.loads(ok("rollback", topic, "--to-tag", "v1", "--json"))
    assert (done["to_epoch"], done["epoch"]) == (1, 4)
    assert ok("read", topic, "--compacted") == ok("read", topic, "--from-snapshot", "v1")
    assert "still" not in ok("snapshots", topic, "--untag", "v1")
    _one_line(run_cli_here("read", topic, "--as-of", "v1"), EXIT_USAGE, "no compacted view is tagged 'v1' "
              "(tags: latest-good (epoch 3)")


def test_rollback_to_a_time_from_the_command_line(topic: str) -> None:
    state = TopicMetadata.open(topic).load_compaction()
    first, second = (s.compacted_ms for s in state.snapshots)
    dry = ok("rollback", topic, "--to-time", str(second), "--dry-run", "--json")
    assert json.loads(dry)["to_epoch"] == 2 and TopicMetadata.open(topic).load_compaction() == state
    iso = json.loads(ok("rollback", topic, "--to-time", _iso(second + 1), "--dry-run", "--json"))
    assert iso["to_epoch"] == 2
    assert json.loads(ok("rollback", topic, "--to-time", str(second - 1), "--dry-run", "--json"))["to_epoch"] == 1
    _one_line(run_cli_here("rollback", topic, "--to-time", str(first - 1)), EXIT_USAGE,
              "no retained view was published by", f"the earliest retained, epoch 1, was published {_iso(first)}")
    _one_line(run_cli_here("rollback", topic, "--to-time", str(state.compacted_ms)), EXIT_USAGE,
              "epoch 3 is the published view already")
    want = ok("read", topic, "--from-snapshot", "1")
    done = json.loads(ok("rollback", topic, "--to-time", _iso(first), "--json"))
    assert (done["to_epoch"], done["epoch"]) == (1, 4)
    assert ok("read", topic, "--compacted") == want


def _iso(ms: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def test_bad_input_is_one_line_and_exit_2(topic: str) -> None:
    before = TopicMetadata.open(topic).load_compaction()
    cases: list[tuple[tuple[str, ...], str]] = [
        (("snapshots", topic, "--epoch", "1"), "--epoch goes with --tag"),
        (("snapshots", topic, "--tag", "a", "--untag", "b"), "give --tag or --untag, not both"),
        (("snapshots", topic, "--tag", "12"), "bad tag name '12'"),
        (("snapshots", topic, "--tag", "2024-05-01"), "starting with a letter"),
        (("snapshots", topic, "--tag", "x", "--epoch", "9"), "epoch 9 is not retained (retained: epoch 1 "),
        (("snapshots", topic, "--tag", "x", "--epoch", "0"), "--epoch"),
        (("snapshots", topic, "--untag", "nope"), "no compacted view is tagged 'nope' (tags: none"),
        (("snapshots", topic + "-missing"), "no topic at"),
        (("read", topic, "--as-of", "12 noon"), "is not an epoch (a whole number from 1), a time"),
        (("read", topic, "--as-of", "nope"), "no compacted view is tagged 'nope'"),
        (("rollback", topic, "--to-tag", "nope"), "no compacted view is tagged 'nope'"),
        (("rollback", topic, "--to-time", "soon"), "'soon' is not a time: ISO 8601"),
        (("rollback", topic, "--to-epoch", "1", "--to-tag", "x"), "give --to-epoch or --to-tag, not both"),
        (("rollback", topic), "one of the arguments --to-epoch --to-time --to-tag is required"),
    ]
    for args, needle in cases:
        _one_line(run_cli_here(*args), EXIT_USAGE, needle)
    ok("snapshots", topic, "--tag", "v", "--epoch", "1")
    _one_line(run_cli_here("snapshots", topic, "--tag", "v", "--epoch", "2"), EXIT_USAGE,
              "the tag 'v' names epoch 1 already")
    after = TopicMetadata.open(topic).load_compaction()
    assert after.tags == {"v": 1} and (after.epoch, after.snapshots) == (before.epoch, before.snapshots)


def test_a_topic_never_compacted_has_no_view_to_list_or_tag(tmp_path: Path) -> None:
    uri = str(tmp_path / "fresh")
    _produce(uri, 0)
    assert ok("snapshots", uri) == f"{uri}: no compacted view: the topic was never compacted\n"
    assert json.loads(ok("snapshots", uri, "--json")) == {"topic": uri, "epoch": 0, "views": [], "tags": {}}
    _one_line(run_cli_here("snapshots", uri, "--tag", "v"), EXIT_USAGE, "never compacted: no view to tag")
    _one_line(run_cli_here("rollback", uri, "--to-time", "0"), EXIT_USAGE, "no retained view was published by "
              "1970-01-01T00:00:00.000Z: the topic was never compacted")
    assert not (Path(uri) / "_meta" / "compaction.json").exists()


HOSTILE: list[tuple[str, Any, str]] = [
    ("an epoch as a name", {"12": 1}, "field tags (a key): expected `str` matching regex"),
    ("a path as a name", {"a/../b": 1}, "field tags (a key)"),
    ("a name too long", {"x" * 201: 1}, "field tags (a key)"),
    ("an epoch not retained", {"x": 9}, "field tags.x: epoch 9 is not a retained view (retained: 1, 2, 3)"),
    ("epoch 0", {"x": 0}, "field tags[...]: expected `int` >= 1"),
    ("not a mapping", ["x"], "field tags: expected `object`, got `array`"),
    ("a flag as an epoch", {"x": True}, "field tags[...]: expected `int`, got `bool`"),
]


@pytest.mark.parametrize("case, tags, needle", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_tag_is_refused_with_exit_4_and_nothing_is_deleted(topic: str, case: str, tags: Any,
                                                                      needle: str) -> None:
    path = Path(topic) / "_meta" / "compaction.json"
    doc = json.loads(path.read_text())
    doc["value"]["tags"] = tags
    path.write_text(json.dumps(doc))
    files = {p: p.read_bytes() for p in Path(topic).rglob("*") if p.is_file()}
    for args in (("snapshots", topic), ("snapshots", topic, "--tag", "fine", "--epoch", "1"),
                 ("read", topic, "--as-of", "1"), ("rollback", topic, "--to-epoch", "1"), ("status", topic),
                 ("gc", topic, "--gc-grace", "0s"), ("truncate", topic, "--older-than", "0s")):
        _one_line(run_cli_here(*args), EXIT_CORRUPT, "compaction.json: " + needle)
    assert {p: p.read_bytes() for p in Path(topic).rglob("*") if p.is_file()} == files
