"""Topic policies (``shale config``), retention by age and size (``shale truncate``, and the
policy ``compact`` applies after it publishes), and listing topics (``shale topics``),
driven through the console scripts on a local folder and on the moto server."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from tests.conftest import run_cli_here


def _produce(topic: str, ledgers: int, per: int = 10, *, tombstones: bool = False, t: float | None = None) -> None:
    clock = (lambda: t) if t is not None else time.time
    with TopicWriter(topic, max_ledger_records=per, clock=clock) as w:
        for i in range(ledgers * per):
            w.append(f"k{i % 7}", None if tombstones and i % 7 == 0 else f"v{i}")


def _config(topic: str, *args: str) -> dict[str, str]:
    r = run_cli_here("config", topic, *args, "--json")
    assert r.returncode == 0, r.stderr
    doc: dict[str, str] = json.loads(r.stdout)["policy"]
    return doc


# ------------------------------------------------------------------------- shale config

def test_config_sets_shows_and_unsets_a_topics_policy(disk_topic_uri: str) -> None:
    _produce(disk_topic_uri, 1)
    assert _config(disk_topic_uri) == {}
    got = _config(disk_topic_uri, "--set", "delete-retention=7d", "--set", "min-compaction-lag=1h30m",
                  "--set", "retention-bytes=500GB", "--set", "retain-null-key=yes")
    assert got == {"delete-retention": "7d", "min-compaction-lag": "90m", "retention-bytes": "500GB",
                   "retain-null-key": "true"}
    assert _config(disk_topic_uri, "--unset", "min-compaction-lag") == {
        "delete-retention": "7d", "retention-bytes": "500GB", "retain-null-key": "true"}
    text = run_cli_here("config", disk_topic_uri)
    assert text.returncode == 0 and "delete-retention  7d" in text.stdout, text.stdout
    # the document beside the topic's others, changed by compare-and-swap
    policy = TopicMetadata.open(disk_topic_uri).load_policy()
    assert policy.version == 2 and policy.values.delete_retention_ms == 7 * 86_400_000


@pytest.mark.parametrize(("args", "needle"), [
    (("--set", "delete-retention=soon"), "delete-retention"),
    (("--set", "no-such-setting=1"), "unknown policy setting 'no-such-setting'"),
    (("--set", "min-dirty-ratio=2"), "between 0 and 1"),
    (("--set", "delete-retention"), "NAME=VALUE"),
    (("--unset", "bogus"), "unknown policy setting"),
])
def test_a_bad_policy_setting_is_refused_and_changes_nothing(tmp_path: Path, args: tuple[str, ...],
                                                            needle: str) -> None:
    topic = str(tmp_path / "t")
    _produce(topic, 1)
    r = run_cli_here("config", topic, *args)
    assert r.returncode == 2 and needle in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert TopicMetadata.open(topic).load_policy().version == 0


def test_config_of_a_missing_topic_is_refused(tmp_path: Path) -> None:
    r = run_cli_here("config", str(tmp_path / "none"), "--set", "delete-retention=1d")
    assert r.returncode == 2 and "no topic" in r.stderr, r.stderr
    assert not (tmp_path / "none").exists()


# --------------------------------------------------- compact applies each topic's policy

def _tombstones_kept(topic: str) -> int:
    return TopicMetadata.open(topic).load_compaction().tombstones


def test_flag_beats_policy_beats_variable_beats_default(tmp_path: Path) -> None:
    """delete-retention: the default (24h) keeps tombstones; the topic's policy of 0 drops
    them even when SHALE_DELETE_RETENTION says 24h; the run's flag of 24h keeps them."""
    topics = {name: str(tmp_path / name) for name in ("default", "policy", "flag")}
    for t in topics.values():
        _produce(t, 2, tombstones=True)
    for t in (topics["policy"], topics["flag"]):
        _config(t, "--set", "delete-retention=0")
    env = {"SHALE_DELETE_RETENTION": "24h"}
    assert run_cli_here("compact", topics["default"], env=env).returncode == 0
    assert run_cli_here("compact", topics["policy"], env=env).returncode == 0
    assert run_cli_here("compact", topics["flag"], "--delete-retention", "24h", env=env).returncode == 0
    assert _tombstones_kept(topics["default"]) > 0
    assert _tombstones_kept(topics["policy"]) == 0
    assert _tombstones_kept(topics["flag"]) > 0


def test_compact_all_applies_each_topics_own_policy(tmp_path: Path) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for t in (a, b):
        _produce(t, 2)
    assert run_cli_here("compact", "--all", str(tmp_path)).returncode == 0
    for t in (a, b):
        _produce(t, 1)
    _config(b, "--set", "min-dirty-ratio=0.99")  # b is not dirty enough any more: skipped
    r = run_cli_here("compact", "--all", str(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    got = {Path(x["topic"]).name: x["status"] for x in map(json.loads, r.stdout.splitlines()) if "topic" in x}
    assert got == {"a": "compacted", "b": "skipped"}


def test_retention_policy_applies_after_each_publish(tmp_path: Path) -> None:
    topic = str(tmp_path / "t")
    old = time.time() - 3 * 86_400
    _produce(topic, 3, t=old)
    _config(topic, "--set", "retention=1d")
    r = run_cli_here("compact", topic)
    assert r.returncode == 0 and "retention removed 3 ledgers" in r.stdout, r.stdout
    meta = TopicMetadata.open(topic)
    assert meta.load_topic().ledgers == ()
    # the compacted view is whole: the latest record of every key
    assert len({m.key for m in TopicReader(topic, read_compacted=True)}) == 7


# ------------------------------------------------------------- truncate by age and size

def test_truncate_by_age_and_by_size_keeps_what_is_above_the_horizon(disk_topic_uri: str) -> None:
    _produce(disk_topic_uri, 3, t=time.time() - 10 * 86_400)
    _produce(disk_topic_uri, 1)  # recent
    assert run_cli_here("compact", disk_topic_uri).returncode == 0
    _produce(disk_topic_uri, 1, t=time.time() - 20 * 86_400)  # old, but above the horizon
    r = run_cli_here("truncate", disk_topic_uri, "--older-than", "7d", "--dry-run", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["removed"] == [1, 2, 3], r.stderr
    sizes = {lg.id: lg.bytes for lg in TopicMetadata.open(disk_topic_uri).load_topic().ledgers}
    keep = sizes[3] + sizes[4] + sizes[5]  # room for the newest three
    r = run_cli_here("truncate", disk_topic_uri, "--keep-bytes", str(keep), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["removed"] == [1, 2], r.stderr
    r = run_cli_here("truncate", disk_topic_uri, "--older-than", "7d", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["removed"] == [3], r.stderr
    # ledger 5 is old but above the horizon: kept unless told
    r = run_cli_here("truncate", disk_topic_uri, "--keep-bytes", "0", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["removed"] == [4], r.stderr
    assert [lg.id for lg in TopicMetadata.open(disk_topic_uri).load_topic().ledgers] == [5]


def test_truncate_needs_exactly_one_rule(tmp_path: Path) -> None:
    topic = str(tmp_path / "t")
    _produce(topic, 1)
    assert run_cli_here("truncate", topic).returncode == 2
    r = run_cli_here("truncate", topic, "--older-than", "1d", "--keep-bytes", "1GB")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr


# ------------------------------------------------------------------------ shale topics

def test_topics_lists_every_topic_under_a_prefix(disk_topic_uri: str) -> None:
    root = disk_topic_uri.rsplit("/", 1)[0]
    a, b, broken = f"{root}/a", f"{root}/b", f"{root}/c"
    _produce(a, 2)
    _produce(b, 1)
    _produce(broken, 1)
    assert run_cli_here("compact", a).returncode == 0
    _config(b, "--set", "delete-retention=1h")
    meta = TopicMetadata.open(broken)
    meta.docs.location.store.put(meta.docs.location.key("topic.json"), b"not json")
    r = run_cli_here("topics", root, "--json")
    assert r.returncode == 0, r.stderr
    rows = {x["topic"].rsplit("/", 1)[1]: x for x in map(json.loads, r.stdout.splitlines())}
    assert set(rows) == {"a", "b", "c"}
    assert rows["a"]["ledgers"] == 2 and rows["a"]["records"] == 20 and rows["a"]["horizon"] == "2:0:9"
    assert rows["a"]["dirty_ratio"] == 0.0 and rows["a"]["last_compaction_ms"]
    assert rows["b"]["policy"] == {"delete-retention": "1h"} and rows["b"]["dirty_ratio"] == 1.0
    assert rows["c"]["error"] and "topic.json" in rows["c"]["error"]
    text = run_cli_here("topics", root)
    assert text.returncode == 0 and text.stdout.splitlines()[0].split()[:2] == ["TOPIC", "LEDGERS"]
    assert "delete-retention=1h" in text.stdout and "error:" in text.stdout


def test_topics_under_a_prefix_without_topics_is_an_error(tmp_path: Path) -> None:
    r = run_cli_here("topics", str(tmp_path))
    assert r.returncode == 2 and "no topics under" in r.stderr, r.stderr


def test_a_topics_own_max_compaction_lag_makes_it_overdue(tmp_path: Path) -> None:
    """No flag and no variable: the policy's max compaction lag makes the topic overdue
    (compacted whatever its dirty ratio); a run's variable does not beat the policy."""
    old = time.time() - 3 * 86_400
    for name in ("a", "b"):
        _produce(str(tmp_path / name), 4, t=old)
    assert run_cli_here("compact", "--all", str(tmp_path)).returncode == 0
    for name in ("a", "b"):
        _produce(str(tmp_path / name), 1, per=1, t=time.time() - 2 * 86_400)
    _config(str(tmp_path / "a"), "--set", "max-compaction-lag=1h")

    def statuses(*args: str, env: dict[str, str] | None = None) -> dict[str, str]:
        r = run_cli_here("compact", *args, "--min-dirty-ratio", "0.9", "--json", env=env)
        assert r.returncode == 0, r.stderr
        return {Path(x["topic"]).name: x["status"] for x in map(json.loads, r.stdout.splitlines()) if "topic" in x}

    assert statuses(str(tmp_path / "b"), str(tmp_path / "a")) == {"a": "compacted", "b": "skipped"}
    _produce(str(tmp_path / "a"), 1, per=1, t=time.time() - 2 * 86_400)
    got = statuses("--all", str(tmp_path), env={"SHALE_MAX_COMPACTION_LAG": "30d"})
    assert got == {"a": "compacted", "b": "skipped"}


# ------------------------------------------------------------------------ shale create

def test_create_gives_a_topic_its_policy_before_anything_is_produced(tmp_path: Path) -> None:
    topic = str(tmp_path / "t")
    r = run_cli_here("create", topic, "--set", "compression=lz4", "--set", "retention=7d")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{topic}: created, policy compression=lz4, retention=7d\n"
    meta = TopicMetadata.open(topic)
    assert meta.load_topic().ledgers == () and _config(topic) == {"compression": "lz4", "retention": "7d"}
    # the first produce already runs under it
    with TopicWriter(topic) as w:
        assert w.compression.codec.name == "LZ4"
        w.append("k", "v")
    # an existing topic, a bad setting, a topic inside another: refused, nothing written
    r = run_cli_here("create", topic, "--set", "retention=1d")
    assert r.returncode == 2 and "exists there already" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert _config(topic)["retention"] == "7d"
    for args in (("--set", "retention=forever"), ("--set", "no-such-setting=1"), ("--set", "compression=zstd-dict")):
        r = run_cli_here("create", str(tmp_path / "u"), *args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert not (tmp_path / "u").exists()
    r = run_cli_here("create", f"{topic}/inner", "--set", "retention=1d")
    assert r.returncode == 2 and "inside the topic" in r.stderr, r.stderr
    assert not TopicMetadata.open(f"{topic}/inner").docs.read("policy.json")
    r = run_cli_here("create", str(tmp_path / "plain"), "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == {"topic": str(tmp_path / "plain"), "created": True,
                                                          "policy": {}}
