"""Time travel and change reads against a model of every record ever produced
(:mod:`tests.history_model`): the state as of every retained epoch, of times between
produces and of message ids, across compaction, truncation and gc, in offset order, in
event-time order and with a key TTL; the changes between random pairs of points equal the
model's difference, by both ways of finding them; a point the kept history cannot answer
is refused, never answered with later data."""

from __future__ import annotations

import datetime
import random
import time
from typing import Any

import pytest

from shale.compactor import CompactionConfig, Compactor, collect_garbage
from shale.compactor.config import MIN_ORPHAN_GRACE_MS
from shale.ledger.errors import SnapshotNotFoundError
from shale.ledger.ids import MIN_ID, MessageId
from shale.ledger.ordering import EVENT_TIME, OFFSET, TopicOrder
from shale.maintenance.retention import retention_cut, truncate
from shale.metadata.asof import AsOf
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from shale.reader.changes import _by_tables, changes, plan_changes
from shale.reader.latest import plan_latest, table_messages
from tests.compaction_model import every_record
from tests.conftest import make_root
from tests.history_model import History, State, diff

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


class Scenario:
    """A topic produced, compacted, truncated and collected at random, with a clock the
    test moves: every record kept in the model before retention can remove it."""

    def __init__(self, uri: str, order: TopicOrder, seed: int) -> None:
        self.uri, self.order, self.rnd = uri, order, random.Random(seed)
        # the history ends days before the present: "now" for an id (the present) then
        # finds every key past a key TTL, away from its boundary
        self.t = time.time() - 40 * 86400
        self.meta: TopicMetadata | None = None  # (the topic is made by the first produce)
        self.history = History()
        self.times: list[int] = []

    def clock(self) -> float:
        return self.t

    def produce(self, n: int) -> None:
        rnd = self.rnd
        self.times.append(int(self.t * 1000))
        with TopicWriter(self.uri, max_ledger_records=rnd.randrange(15, 50), batch_size=rnd.randrange(1, 5),
                         clock=self.clock) as w:
            for _ in range(n):
                key = None if rnd.random() < 0.03 else f"k{rnd.randrange(25)}"
                value = None if rnd.random() < 0.12 else f"v{rnd.randrange(10**6)}"
                event = None
                if self.order.by_event_time and rnd.random() < 0.8:
                    event = int(self.t * 1000) - rnd.randrange(0, 30) * HOUR_MS  # late ones too
                w.append(key, value, event_time=event)
                self.t += rnd.choice((1, 60, 600, 3600))
        self.times.append(int(self.t * 1000))
        if self.meta is None:
            self.meta = TopicMetadata.open(self.uri)
            self.meta.update_policy({"order": self.order.order, "key_ttl_ms": self.order.key_ttl_ms,
                                     "snapshot_retention": 3})
        self.history.add(every_record(self.uri))

    def compact(self) -> None:
        self.t += 60
        # Under event-time order a record older than a delete, arriving once its tombstone
        # was dropped, brings its key back (docs/compaction.md): tombstones are kept there.
        retention = 1000 * DAY_MS if self.order.by_event_time else self.rnd.choice((0, 2 * HOUR_MS))
        config = CompactionConfig(order=self.order.order, key_ttl_ms=self.order.key_ttl_ms, snapshot_retention=3,
                                  delete_retention_ms=retention)
        s = Compactor(self.uri, config, clock=self.clock).run()
        assert s.status in ("compacted", "nothing to do"), (s.status, s.message)
        self.t += 60

    def truncate(self) -> None:
        assert self.meta is not None
        cut = retention_cut(self.meta, older_than_ms=0, now_ms=int(self.t * 1000) + DAY_MS)
        topic = self.meta.load_topic()
        if topic.ledgers and cut > topic.ledgers[0].id:
            truncate(self.meta, cut)

    def gc(self) -> None:
        assert self.meta is not None
        collect_garbage(self.meta, now_ms=self.meta.now_ms() + 10 * MIN_ORPHAN_GRACE_MS, grace_ms=0,
                        orphan_grace_ms=MIN_ORPHAN_GRACE_MS)


def _state(meta: TopicMetadata, as_of: AsOf | None) -> State:
    out: State = {}
    for m in table_messages(meta, as_of=as_of):
        assert m.key is not None
        out[m.key] = m.id
    return out


def _expected(s: Scenario, point: AsOf | None) -> State:
    """The model's state at ``point`` (None: now)."""
    assert s.meta is not None
    present = int(time.time() * 1000)
    if point is None:
        return s.history.state(None, s.order, present)
    if isinstance(point, int):
        view = s.meta.load_compaction().at_epoch(point)
        assert view is not None
        end = MIN_ID if view.horizon is None else view.horizon.successor()
        return s.history.state(end, view.order, view.compacted_ms)
    if isinstance(point, MessageId):
        return s.history.state(point.successor(), s.order, present)
    assert isinstance(point, datetime.datetime)
    ms = int(point.timestamp() * 1000)
    return s.history.state(s.history.cut_at_time(ms), s.order, ms)


def _points(s: Scenario) -> list[AsOf]:
    """Points to read as of: every retained epoch, times between and inside produces, ids."""
    assert s.meta is not None
    rnd = s.rnd
    state = s.meta.load_compaction()
    times = [*rnd.sample(s.times, min(4, len(s.times))), rnd.randrange(s.times[0] - HOUR_MS, int(s.t * 1000))]
    ids = rnd.sample(sorted(s.history.records), min(3, len(s.history.records)))
    return [*state.retained_epochs, *(datetime.datetime.fromtimestamp(t / 1000, datetime.UTC) for t in times), *ids]


def _check_points(s: Scenario) -> dict[str, int]:
    """Every point reads as the model says, or is refused only where the kept history
    cannot answer it; a read of its records holds nothing past it."""
    assert s.meta is not None
    seen = {"answered": 0, "refused": 0}
    topic, state = s.meta.load_topic(), s.meta.load_compaction()
    views = [state.at_epoch(e) for e in state.retained_epochs]
    oldest_ms = min((v.compacted_ms for v in views if v is not None), default=None)
    for point in _points(s):
        try:
            got = _state(s.meta, point)
        except SnapshotNotFoundError as e:
            seen["refused"] += 1
            assert topic.removed_through > 0 and not isinstance(point, int), (point, e)
            if isinstance(point, datetime.datetime):
                assert oldest_ms is None or point.timestamp() * 1000 < oldest_ms, (point, e)
            assert "older than the history kept" in str(e)
            continue
        seen["answered"] += 1
        assert got == _expected(s, point), point
        with TopicReader(s.uri, as_of=point) as r:
            read = r.read()
        end = _end(s, point)
        assert all(m.id < end for m in read) if end is not None else True, point
        assert all(m.id in s.history.records for m in read), point
        if isinstance(point, datetime.datetime):  # the Arrow path ends there too
            with TopicReader(s.uri, as_of=point) as r:
                assert r.to_arrow(id_text=True).column("id").to_pylist() == [str(m.id) for m in read], point
    return seen


def _end(s: Scenario, point: AsOf) -> MessageId | None:
    assert s.meta is not None
    if isinstance(point, int):
        view = s.meta.load_compaction().at_epoch(point)
        assert view is not None
        return MIN_ID if view.horizon is None else view.horizon.successor()
    if isinstance(point, MessageId):
        return point.successor()
    assert isinstance(point, datetime.datetime)
    return s.history.cut_at_time(int(point.timestamp() * 1000))


def _check_changes(s: Scenario, pairs: int) -> int:
    """Changes between random pairs of points equal the model's difference; between two
    epochs, the views' way and the tables' way agree."""
    assert s.meta is not None
    points: list[AsOf | None] = [*_points(s), None]
    checked = 0
    for _ in range(pairs):
        a, b = s.rnd.choice(points[:-1]), s.rnd.choice(points)
        try:
            got = list(changes(s.meta, a, b))
        except SnapshotNotFoundError:
            continue
        want_up, want_del = diff(_expected(s, a), _expected(s, b))
        assert {c.key: c.message.id for c in got if c.op == "upsert" and c.message} == want_up, (a, b)
        assert {c.key for c in got if c.op == "delete"} == want_del, (a, b)
        assert len(got) == len(want_up) + len(want_del)
        plan = plan_changes(s.meta, a, b)
        if plan.how == "views":
            tables = _by_tables(s.meta, plan_latest(s.meta, as_of=a), plan_latest(s.meta, as_of=b))
            assert _ids(s, plan.upserts) == _ids(s, tables.upserts) and _ids(s, plan.deletes) == _ids(
                s, tables.deletes), (a, b)
        checked += 1
    return checked


def _ids(s: Scenario, chosen: Any) -> set[MessageId]:
    assert s.meta is not None
    return {c.segment.open(s.meta).record_id(int(i)) for c in chosen for i in c.records}


ORDERS = {"offset": TopicOrder(OFFSET), "event-time": TopicOrder(EVENT_TIME),
          "key-ttl": TopicOrder(OFFSET, key_ttl_ms=2 * DAY_MS)}


def _campaign(uri: str, order: TopicOrder, seed: int, rounds: int = 6) -> dict[str, int]:
    s = Scenario(uri, order, seed)
    seen = {"answered": 0, "refused": 0, "changes": 0}
    for i in range(rounds):
        s.produce(s.rnd.randrange(20, 70))
        if s.rnd.random() < 0.8:
            s.compact()
        if i >= 2 and s.rnd.random() < 0.5:
            s.truncate()
        if s.rnd.random() < 0.4:
            s.gc()
        if i % 2 or i == rounds - 1:
            for k, v in _check_points(s).items():
                seen[k] += v
            seen["changes"] += _check_changes(s, 4)
    return seen


@pytest.mark.parametrize("order", sorted(ORDERS))
def test_every_point_reads_as_the_model_says(tmp_path: Any, order: str) -> None:
    totals = {"answered": 0, "refused": 0, "changes": 0}
    for seed in range(2):
        for k, v in _campaign(str(tmp_path / f"t{seed}"), ORDERS[order], seed * 31 + len(order)).items():
            totals[k] += v
    assert totals["answered"] > 20 and totals["refused"] > 0 and totals["changes"] > 5, totals


@pytest.mark.s3
def test_every_point_reads_as_the_model_says_on_s3(request: pytest.FixtureRequest, tmp_path: Any) -> None:
    seen = _campaign(f"{make_root('s3', request, tmp_path)}/topics/travel", ORDERS["offset"], 7, rounds=5)
    assert seen["answered"] > 10 and seen["changes"] > 2, seen
