"""One rule for what lies above the horizon: :class:`~shale.metadata.view.TopicView` says it,
exactly (from the footer of the ledger the horizon lies in) and estimated (from the
metadata alone), and every consumer agrees with it: the compaction plan, ``shale status``,
the topic choice of ``compact --all``, a run's backlog, ``shale topics``, retention and the
Spark stream's gap and first batch.

Topics are built with random ledgers, entries and publish times, compacted (or not), given
a horizon at any record (inside an entry, at a ledger's end...) and truncated (or not),
and the view is checked against what the footers of every ledger say, record by record."""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shale.compactor import CompactionConfig, Compactor
from shale.compactor.plan import make_plan
from shale.compactor.topics import assess, backlog
from shale.ledger.ids import MIN_ID, MessageId
from shale.ledger.reader import LedgerFile
from shale.maintenance.listing import describe_topic
from shale.maintenance.retention import plan_truncation
from shale.maintenance.status import topic_status
from shale.metadata.state import LedgerInfo
from shale.metadata.topic import TopicMetadata
from shale.metadata.view import TopicView
from shale.producer import TopicWriter
from tests.needs import need_module

T0_S = 1_700_000_000


class Clock:
    """Whole seconds that move on by one at every call."""

    def __init__(self) -> None:
        self.s = T0_S

    def __call__(self) -> float:
        self.s += 1
        return float(self.s)


@dataclass(frozen=True, slots=True)
class Rec:
    """One record as its ledger's footer says it."""

    id: MessageId
    published_ms: int
    entry: int  # its entry's index in the ledger
    entry_bytes: int  # that entry's stored bytes


@dataclass(frozen=True, slots=True)
class Built:
    uri: str
    meta: TopicMetadata
    records: dict[int, list[Rec]]  # by ledger id, every ledger ever written
    removed: tuple[int, ...]  # ledger ids retention removed


def _records(meta: TopicMetadata, lg: LedgerInfo) -> list[Rec]:
    f = LedgerFile.open(meta.topic.store, meta.topic.key(lg.object), ledger_id=lg.id)
    foot = f.footer
    entries = foot.entry_of(np.arange(f.n_records))
    published, lengths = foot.col("e_publish"), foot.col("e_length")
    return [Rec(f.record_id(i), int(published[e]), int(e), int(lengths[e])) for i, e in enumerate(entries)]


@st.composite
def topics(draw: st.DrawFn) -> Built:
    """A topic on a store of its own: 1 to 4 ledgers, maybe compacted, given a horizon at a
    record drawn among all of them (or none), maybe truncated."""
    uri = f"memory://horizon-{uuid.uuid4().hex[:12]}/t"
    clock = Clock()
    for _ in range(draw(st.integers(1, 4), label="ledgers")):
        n = draw(st.integers(1, 9), label="records")
        with TopicWriter(uri, batch_size=draw(st.integers(1, 4), label="batch"), max_ledger_records=n,
                         clock=clock) as w:
            for i in range(n):
                w.append(f"k{i % 3}".encode(), b"v" * draw(st.integers(0, 40)))
    meta = TopicMetadata.open(uri)
    ledgers = meta.load_topic().ledgers
    records = {lg.id: _records(meta, lg) for lg in ledgers}
    if draw(st.booleans(), label="compacted"):
        Compactor(meta, CompactionConfig(delete_retention_ms=0)).run()
    everything = [r.id for lg in ledgers for r in records[lg.id]]
    at = draw(st.none() | st.sampled_from(everything), label="horizon")
    state = meta.load_compaction()
    if at is not None and (state.horizon is None or at >= state.horizon):
        meta.update_compaction(lambda s: dataclasses.replace(s, horizon=at, epoch=max(s.epoch, 1),
                                                             compacted_ledger=s.compacted_ledger
                                                             or "000000000001-0123456789ab"))
    removed: tuple[int, ...] = ()
    before = draw(st.integers(ledgers[0].id, ledgers[-1].id + 1), label="truncate before")
    if before > ledgers[0].id:
        _, gone = meta.truncate(before)
        removed = tuple(lg.id for lg in gone)
    return Built(uri, meta, records, removed)


def _above(recs: list[Rec], h: MessageId | None) -> list[Rec]:
    return [r for r in recs if h is None or r.id > h]


def _bytes_above(recs: list[Rec], h: MessageId | None) -> int:
    """Stored bytes of the entries holding a record above ``h``."""
    return sum({r.entry: r.entry_bytes for r in _above(recs, h)}.values())


_SETTINGS = settings(max_examples=30, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@_SETTINGS
@given(topics())
def test_the_view_says_exactly_what_lies_above_the_horizon(t: Built) -> None:
    view = TopicView.load(t.meta)
    h = view.horizon
    ledgers = view.topic.ledgers
    for lg in ledgers:
        assert view.records_above_exact(t.meta, lg) == len(_above(t.records[lg.id], h))
    assert view.ledgers_wholly_above() == tuple(
        lg for lg in ledgers if len(_above(t.records[lg.id], h)) == len(t.records[lg.id]))
    # (a ledger wholly above: its first publish as the metadata says it; the one the horizon
    # lies in: the publish time of the entries after the horizon, as its footer says them)
    wholly = view.ledgers_wholly_above()
    times = [lg.first_publish for lg in wholly] + [
        r.published_ms for lg in ledgers if lg not in wholly for r in _above(t.records[lg.id], h)]
    assert view.oldest_above_exact(t.meta) == min(times, default=None)
    assert view.oldest_above_estimated() == min((lg.first_publish for lg in view.ledgers_wholly_above()),
                                                default=None)
    dirty, _ = view.dirt_exact(t.meta)
    assert dirty == sum(_bytes_above(t.records[lg.id], h) for lg in ledgers)
    estimated, _ = view.dirt_estimated()
    assert estimated == sum(lg.bytes for lg in view.ledgers_wholly_above())


@_SETTINGS
@given(topics())
def test_every_consumer_agrees_with_the_view(t: Built) -> None:
    view = TopicView.load(t.meta)
    exact, estimated = view.dirt_exact(t.meta), view.dirt_estimated()
    # the compaction plan (no lag) and shale status: exact
    plan = make_plan(t.meta, now_ms=(T0_S + 10_000) * 1000, min_compaction_lag_ms=0)
    assert (plan.dirty_bytes, plan.dirty_ratio) == exact
    doc = topic_status(t.uri)["compaction"]
    assert (doc["dirty_bytes"], doc["dirty_ratio"]) == (exact[0], round(exact[1], 6))
    # compact --all's choice, shale topics: estimated; the backlog's age: exact
    choice = assess(t.uri, now_ms=(T0_S + 10_000) * 1000)
    assert (choice.dirty_ratio, choice.oldest_uncompacted_ms) == (estimated[1], view.oldest_above_estimated())
    assert describe_topic(t.uri).dirty_ratio == estimated[1]
    b = backlog(t.uri)
    assert (b.dirty_ratio, b.oldest_ms) == (estimated[1], view.oldest_above_exact(t.meta))
    # retention: the records a truncation would lose are those above the horizon
    for before in range(view.topic.ledgers[0].id if view.topic.ledgers else 1, view.topic.last_ledger_id + 2):
        lost = plan_truncation(t.meta, before).records_lost
        assert lost == sum(view.records_above_exact(t.meta, lg) for lg in view.topic.ledgers if lg.id < before)


@_SETTINGS
@given(topics(), st.data())
def test_the_spark_streams_gaps_and_first_batch_follow_the_view(t: Built, data: st.DataObject) -> None:
    need_module("pyspark")
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from shale.spark.source import ReadOptions
    from shale.spark.stream import ShaleStreamReader

    view = TopicView.load(t.meta)
    h = view.horizon
    removed = [r.id for lid in t.removed for r in t.records[lid]]
    everything = sorted({MIN_ID, *(r.id for recs in t.records.values() for r in recs)})
    for compacted in (False, True):
        options = {"path": t.uri, "compacted": str(compacted).lower(), "failOnDataLoss": "false"}
        stream = ShaleStreamReader(ReadOptions.of(options), options)
        start = data.draw(st.sampled_from(everything), label="start")
        gap = stream._lost(view.topic, {"next": str(start), "view": compacted}, exact=True)
        # lost: a removed record at or after the start that the view (when read) does not hold
        lost = [r for r in removed if r >= start and not (compacted and h is not None and r <= h)]
        if compacted and start == MIN_ID:
            lost = []  # earliest: the view, then the tail
        assert (gap is not None) == bool(lost), (start, lost, gap)
        below = [lg for lg in view.topic.ledgers if lg not in view.ledgers_wholly_above()]
        if compacted and view.holds(MIN_ID) and below and view.compacted_records:
            # the first batch reads the view whole: it ends with the last ledger not wholly above it
            end = stream.latestOffset({"next": str(MIN_ID), "view": True}, ReadMaxRows(1))
            assert end == {"next": str(MessageId(below[-1].id, below[-1].entries, 0)), "view": False}


def test_a_horizon_inside_an_entry_counts_the_rest_of_that_entry() -> None:
    """The exact age of the backlog: the records after the horizon in its own entry were
    published with that entry, and count (a rule that skipped to the next entry would
    find none, or a later time)."""
    uri = f"memory://horizon-{uuid.uuid4().hex[:12]}/t"
    clock = Clock()
    with TopicWriter(uri, batch_size=3, max_ledger_records=3, clock=clock) as w:
        for i in range(3):
            w.append(f"k{i}".encode(), b"v")
    meta = TopicMetadata.open(uri)
    lg = meta.load_topic().ledgers[0]
    (rec, *_) = _records(meta, lg)
    meta.update_compaction(lambda s: dataclasses.replace(s, horizon=rec.id, epoch=1,
                                                         compacted_ledger="000000000001-0123456789ab"))
    view = TopicView.load(meta)
    assert view.records_above_exact(meta, lg) == 2
    assert view.oldest_above_exact(meta) == rec.published_ms
    assert backlog(uri).oldest_ms == rec.published_ms



def test_a_compacted_stream_meets_the_records_removed_above_the_horizon() -> None:
    """A compacted stream started inside a ledger that retention removed with records above
    the horizon (``truncate --allow-uncompacted``) has lost those: the view holds only what
    lies at or below its horizon (a rule that took the horizon's whole ledger as held would
    go on in silence)."""
    need_module("pyspark")
    from shale.spark.source import ReadOptions
    from shale.spark.stream import ShaleStreamReader

    uri = f"memory://horizon-{uuid.uuid4().hex[:12]}/t"
    clock = Clock()
    for _ in range(2):
        with TopicWriter(uri, batch_size=1, max_ledger_records=3, clock=clock) as w:
            for i in range(3):
                w.append(f"k{i}".encode(), b"v")
    meta = TopicMetadata.open(uri)
    first = meta.load_topic().ledgers[0]
    meta.update_compaction(lambda s: dataclasses.replace(s, horizon=MessageId(first.id, 0, 0), epoch=1,
                                                         compacted_ledger="000000000001-0123456789ab"))
    meta.truncate(first.id + 1)  # two records above the horizon go with it
    options = {"path": uri, "compacted": "true"}
    stream = ShaleStreamReader(ReadOptions.of(options), options)
    gap = stream._lost(meta.load_topic(), {"next": str(MessageId(first.id, 0, 0)), "view": True}, exact=True)
    assert gap is not None and gap.first == MessageId(first.id, 0, 1) and gap.through == first.id
