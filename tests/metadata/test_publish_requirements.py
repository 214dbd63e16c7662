"""A publish states what it requires (pyiceberg's table requirements): the epoch the run
planned from and the topic generation it read.  A publish that loses names the
requirement that failed; one that loses while every requirement holds says so."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shale.cli.errors import exit_code_of
from shale.compactor import Compactor
from shale.ledger.errors import ConflictError
from shale.metadata.requirements import AssertEpoch, AssertTopicGeneration, RequirementFailedError
from shale.metadata.state import CompactionState
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter


def _topic(uri: str, ledgers: int = 3) -> TopicMetadata:
    with TopicWriter(uri, max_ledger_records=10) as w:
        for i in range(10 * ledgers):
            w.append(f"k{i % 7}", f"v{i}")
    return TopicMetadata.open(uri)


def _next(state: CompactionState, tag: str) -> CompactionState:
    """A state one epoch on (never written in these tests: it loses)."""
    return replace(state, epoch=state.epoch + 1, compacted_ledger=f"{state.epoch + 1:012d}-{tag * 12}")


def _compacted(uri: str) -> CompactionState:
    assert Compactor(uri).run().status == "compacted"
    return TopicMetadata.open(uri).load_compaction()


def test_a_requirement_the_expected_state_fails_writes_nothing(topic_uri: str) -> None:
    meta = _topic(topic_uri)
    prev = meta.load_compaction()
    with pytest.raises(RequirementFailedError) as info:
        meta.publish_compaction(_next(prev, "a"), prev, (AssertEpoch(prev.epoch + 1),))
    assert isinstance(info.value.requirement, AssertEpoch) and "compaction.json" in str(info.value)
    assert meta.load_compaction() == prev


def test_another_publish_fails_the_epoch_requirement(topic_uri: str) -> None:
    meta = _topic(topic_uri)
    prev = meta.load_compaction()
    winner = _compacted(topic_uri)
    with pytest.raises(RequirementFailedError) as info:
        meta.publish_compaction(_next(prev, "b"), prev, (AssertEpoch(prev.epoch), AssertTopicGeneration(0)))
    assert isinstance(info.value.requirement, AssertEpoch)
    assert "another compactor published epoch 1 first (this run planned from epoch 0)" in str(info.value)
    assert exit_code_of(info.value) == 3
    assert meta.load_compaction() == winner


def test_a_truncation_fails_the_generation_requirement(topic_uri: str) -> None:
    meta = _topic(topic_uri)
    first = _compacted(topic_uri)
    read = meta.load_topic().generation
    meta.truncate(2)  # stamps the compaction state with the new generation
    with pytest.raises(RequirementFailedError) as info:
        meta.publish_compaction(_next(first, "c"), first, (AssertEpoch(first.epoch), AssertTopicGeneration(read)))
    assert isinstance(info.value.requirement, AssertTopicGeneration)
    assert f"topic generation {read + 1}, this run read {read}" in str(info.value)


def test_a_change_that_meets_every_requirement_is_a_plain_conflict(topic_uri: str) -> None:
    meta = _topic(topic_uri)
    prev = _compacted(topic_uri)
    # the kind of change garbage collection makes: same epoch, same generation
    meta.publish_compaction(replace(prev, compacted_ms=prev.compacted_ms + 1), prev)
    with pytest.raises(ConflictError) as info:
        meta.publish_compaction(_next(prev, "d"), prev, (AssertEpoch(prev.epoch), AssertTopicGeneration(0)))
    assert not isinstance(info.value, RequirementFailedError)


def test_the_compactor_reports_the_failed_requirement(topic_uri: str) -> None:
    _topic(topic_uri)
    winner: list[str] = []

    def sneak_in(msg: str) -> None:
        if msg == "publishing" and not winner:
            winner.append(Compactor(topic_uri).run().status)

    s = Compactor(topic_uri, progress=sneak_in).run()
    assert s.status == "conflict" and not s.ok
    assert "another compactor published epoch 1 first (this run planned from epoch 0)" in s.message
