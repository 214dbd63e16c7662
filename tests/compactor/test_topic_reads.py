"""A topic is opened once per run (:class:`~shale.metadata.handle.Topic`): ``compact --all``
over many topics reads each topic's documents once — choosing the topics, planning the
run, the subscriptions' hold, the backlog its metrics report — counted at the store, GET
by GET.  Garbage collection reads the state and the ledger list once more, after the
listing that finds orphans (what decides that an object is one must be what the store
holds then); nothing else reads again."""

from __future__ import annotations

import collections
import uuid
from collections.abc import Iterator

import pytest

from shale.compactor import RunEvent, compact_topics
from shale.compactor.topics import backlog
from shale.maintenance.status import topic_status
from shale.metadata.handle import Topic
from shale.metadata.subscriptions import Subscriptions
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.storage._memory import MemoryStore

TOPICS = 4
DOCUMENTS = ("topic.json", "compaction.json", "policy.json")


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[collections.Counter[str]]:
    """Every read of a versioned document from the memory stores, by key."""
    counts: collections.Counter[str] = collections.Counter()
    real = MemoryStore.get_with_token

    def counted(self: MemoryStore, key: str) -> tuple[bytes, str]:
        counts[key] += 1
        return real(self, key)

    monkeypatch.setattr(MemoryStore, "get_with_token", counted)
    yield counts


def _topics(subscribed: bool = True) -> str:
    root = f"memory://reads-{uuid.uuid4().hex[:12]}/topics"
    for i in range(TOPICS):
        with TopicWriter(f"{root}/t{i}", max_ledger_records=10) as w:
            for k in range(35):
                w.append(f"k{k % 7}".encode(), b"v" if k % 5 else None)
        meta = TopicMetadata.open(f"{root}/t{i}")
        meta.update_policy({"min_dirty_ratio": 0.0, "delete_retention_ms": 0})
        if subscribed:
            Subscriptions(meta).create("s", meta.load_topic().ledgers[1].first_id)
    return root


def _per_topic(counts: collections.Counter[str], root: str) -> dict[str, dict[str, int]]:
    prefix = root.split("/", 3)[-1]
    out: dict[str, dict[str, int]] = {}
    for key, n in counts.items():
        topic, _, rest = key.removeprefix(prefix + "/").partition("/_meta/")
        out.setdefault(topic, {})[rest] = n
    return out


def test_compact_all_reads_each_document_once_per_topic(reads: collections.Counter[str]) -> None:
    root = _topics()
    reads.clear()
    done: list[RunEvent] = []
    summaries = compact_topics({"all": root, "no-gc": True, "parallel": 2}, on_event=done.append, backlog=True)
    assert [s.status for s in summaries] == ["compacted"] * TOPICS
    per = _per_topic(reads, root)
    assert sorted(per) == [f"t{i}" for i in range(TOPICS)]
    for topic, counts in per.items():
        assert counts == {**dict.fromkeys(DOCUMENTS, 1), "subscriptions/s.json": 1}, topic
    # the backlog each topic.done carries was made from the same handle: no read of its own
    assert all(e.backlog is not None and e.backlog.subscription_lag.records > 0
               for e in done if e.kind == "topic.done")


def test_garbage_collection_reads_again_only_after_its_listing(reads: collections.Counter[str]) -> None:
    root = _topics(subscribed=False)
    reads.clear()
    compact_topics({"all": root})
    for topic, counts in _per_topic(reads, root).items():
        # the run's reads, then the state and the ledger list as they stand after the listing
        assert counts == {"topic.json": 2, "compaction.json": 2, "policy.json": 1}, topic


def test_status_and_the_backlog_read_each_document_once(reads: collections.Counter[str]) -> None:
    root = _topics()
    uri = f"{root}/t0"
    reads.clear()
    topic_status(uri)
    assert _per_topic(reads, root) == {"t0": {**dict.fromkeys(DOCUMENTS, 1), "subscriptions/s.json": 1}}
    reads.clear()
    t = Topic.open(uri)
    backlog(t)
    backlog(t)  # (the handle holds them)
    assert _per_topic(reads, root) == {"t0": {**dict.fromkeys(DOCUMENTS, 1), "subscriptions/s.json": 1}}


def test_a_long_run_holds_the_documents_of_its_first_topics_only(reads: collections.Counter[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Thousands of topics' ledger lists are not held for a whole run: past the first
    HELD_TOPICS in the order, a topic reads its documents again when it runs."""
    from shale.compactor import run_many

    monkeypatch.setattr(run_many, "HELD_TOPICS", 2)
    root = _topics(subscribed=False)
    reads.clear()
    compact_topics({"all": root, "no-gc": True, "max-topics": TOPICS})
    counts = sorted(c["topic.json"] for c in _per_topic(reads, root).values())
    assert counts == [1, 1, 2, 2]
