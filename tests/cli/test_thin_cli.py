"""The command line only parses, calls the library and renders: engines are made and
refused by the library (an engine says what it can do, so nothing tells engines apart by
name, and ``--max-memory`` with ``--engine spark`` is refused as Spark's settings are without
it), a subscription's commits follow the reader's own cadence, and every command's display
comes from one progress module."""

from __future__ import annotations

import ast
import uuid
from pathlib import Path

import pytest

from shale.compactor.engine import LocalEngine, engine_for
from shale.ledger.errors import InvalidInputError
from shale.ledger.ids import MessageId
from shale.metadata.subscriptions import Subscriptions
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from shale.settings import resolve
from tests.conftest import run_cli_here
from tests.needs import need_module

ROOT = Path(__file__).resolve().parents[2]


def _produce(uri: str, n: int) -> None:
    with TopicWriter(uri, max_ledger_records=4, batch_size=2) as w:
        for i in range(n):
            w.append(f"k{i}".encode(), b"v")


@pytest.mark.parametrize(("given", "env", "named"), [
    (["--max-memory", "1GiB"], {}, "--max-memory"),
    ([], {"SHALE_MAX_MEMORY": "1GiB"}, "SHALE_MAX_MEMORY"),
])
def test_max_memory_with_spark_is_refused_as_sparks_settings_are_without_it(
        tmp_path: Path, given: list[str], env: dict[str, str], named: str) -> None:
    need_module("pyspark")
    topic = str(tmp_path / "t")
    _produce(topic, 8)
    r = run_cli_here("compact", topic, "--engine", "spark", *given, env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"{named} bounds the local engine's memory" in r.stderr
    assert not (tmp_path / "t" / "compacted").exists()  # nothing ran
    reverse = run_cli_here("compact", topic, "--spark-master", "local[1]")
    assert reverse.returncode == 2 and "--spark-master needs --engine spark" in reverse.stderr


def test_engines_say_what_they_can_do() -> None:
    need_module("pyspark")
    from shale.compactor.spark.engine import SparkEngine

    local = engine_for(resolve("compact", {"topics": ["/t"], "max-memory": 64 << 20}))
    assert isinstance(local, LocalEngine) and local.bounds_memory and not local.starts_application
    local.ready()
    local.close()
    spark = engine_for(resolve("compact", {"topics": ["/t"], "engine": "spark"}))
    assert isinstance(spark, SparkEngine) and not spark.bounds_memory and spark.starts_application
    with pytest.raises(InvalidInputError, match="max-memory"):
        engine_for(resolve("compact", {"topics": ["/t"], "engine": "spark", "max-memory": 64 << 20}))


def _sources(*folders: str) -> list[Path]:
    return [p for f in folders for p in sorted((ROOT / f).rglob("*.py"))]


def test_nothing_tells_engines_apart_by_name() -> None:
    for path in _sources("compactor", "shale/cli"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and node.left.attr == "name" \
                    and any(isinstance(c, ast.Constant) and c.value in ("local", "spark") for c in node.comparators):
                pytest.fail(f"{path.relative_to(ROOT)}:{node.lineno}: an engine told apart by name")


def test_every_display_comes_from_the_progress_module() -> None:
    for path in _sources("shale/cli"):
        if path.name == "progress.py":
            continue
        text = path.read_text()
        assert "rich" not in text and "isatty" not in text and "\\r" not in text, path.name


def test_a_subscription_commits_at_the_readers_cadence() -> None:
    uri = f"memory://cadence-{uuid.uuid4().hex[:12]}/t"
    _produce(uri, 10)
    subs = Subscriptions(TopicMetadata.open(uri))
    flushed: list[MessageId | None] = []

    def committed() -> MessageId | None:
        sub = subs.load("s")
        return None if sub is None else sub.position

    def before_commit() -> None:
        flushed.append(committed())

    with TopicReader(uri, subscription="s", commit_every=3, before_commit=before_commit) as r:
        start = committed()
        seen = []
        for m in r:
            seen.append((m.id, committed()))
        end = committed()
    ids = [i for i, _ in seen]
    # each commit comes when the fourth, seventh... record is asked for: past the three before it, not past it
    commits = [c for _, c in seen]
    changed = [k for k in range(1, len(commits)) if commits[k] != commits[k - 1]]
    assert commits[0] == start and changed == [3, 6, 9]
    assert all(commits[k] is not None and ids[k - 1] < commits[k] <= ids[k] for k in changed)
    assert end == r.position  # and at the end of what there is
    assert flushed == [start, commits[3], commits[6], commits[9]]  # told before each commit, before it moved
    with pytest.raises(InvalidInputError, match="commit_every"):
        TopicReader(uri, subscription="t", commit_every=0)
