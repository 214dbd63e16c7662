"""``compact --all`` from Python: :func:`shale.compactor.compact_topics` chooses the topics,
compacts each under its own policy, applies retention after the publish and reports
through events, as the command does (the command only logs, shows and pushes them)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from shale.compactor import RunEvent, compact_topics
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.settings import resolve


def produce(uri: str, n: int, *, first: int = 0, t: float | None = None) -> None:
    clock = (lambda: t) if t is not None else time.time
    with TopicWriter(uri, max_ledger_records=50, batch_size=10, clock=clock) as w:
        for i in range(first, first + n):
            w.append(f"k{i % 17}", None if i % 13 == 0 else f"v{i}")


def test_compact_topics_does_what_compact_all_does(tmp_path: Path) -> None:
    a, b, c = (str(tmp_path / n) for n in "abc")
    produce(a, 40)
    produce(b, 200)
    produce(c, 120, t=time.time() - 3 * 86_400)
    TopicMetadata.open(c).update_policy({"delete_retention_ms": 0, "retention_ms": 86_400_000})
    events: list[RunEvent] = []
    lock = threading.Lock()

    def seen(e: RunEvent) -> None:
        with lock:
            events.append(e)

    summaries = compact_topics({"all": str(tmp_path), "max-topics": 2, "parallel": 2}, on_event=seen)
    # the filthiest first, at most two: all three are never compacted (ratio 1), so by name
    assert [s.topic for s in summaries] == [a, b] and all(s.status == "compacted" for s in summaries)
    kinds = [e.kind for e in events]
    assert kinds[0] == "run.start" and events[0].topics == 2
    assert kinds.count("topic.start") == kinds.count("topic.done") == 2
    assert {e.summary.topic for e in events if e.summary} == {a, b}
    phases = [e.phase for e in events if e.kind == "topic.phase" and e.topic == a]
    assert phases[0] == "planning" and phases[-1] == "publishing"
    # c's own policy: its tombstones go at once, and its old ledgers after the publish
    [s] = compact_topics(resolve("compact", {"topics": [c]}))
    assert s.status == "compacted" and s.tombstones_dropped > 0 and "retention removed 3 ledgers" in s.message
    assert TopicMetadata.open(c).load_topic().ledgers == ()
    # a flag beats the policy: the tombstones of a topic whose policy drops them are kept
    produce(a, 13, first=40)
    TopicMetadata.open(a).update_policy({"delete_retention_ms": 0})
    [s] = compact_topics({"topics": [a], "delete-retention": 3_600_000})
    assert s.tombstones_kept > 0 and s.tombstones_dropped == 0


def test_one_topics_failure_is_its_summary_and_a_bad_choice_is_raised(tmp_path: Path) -> None:
    good, missing = str(tmp_path / "good"), str(tmp_path / "missing")
    produce(good, 30)
    summaries = compact_topics({"topics": [missing, good]})
    assert [s.status for s in summaries] == ["error", "compacted"]
    assert "no topic" in str(summaries[0].error) and isinstance(summaries[0].failure, FileNotFoundError)
    seen: list[RunEvent] = []
    assert compact_topics({"all": str(tmp_path / "empty")}, on_event=seen.append) == []  # none yet: no error
    assert [(e.kind, e.topic) for e in seen] == [("run.empty", str(tmp_path / "empty"))]
    with pytest.raises(ValueError, match="not both"):
        compact_topics({"topics": [good], "all": str(tmp_path)})
    with pytest.raises(ValueError, match="no topic given"):
        compact_topics({})
