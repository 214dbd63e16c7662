"""A Hypothesis state machine: every way to read a topic agrees with a plain dict model.

Producing (keys, tombstones, keyless records, entries of several records, many small
ledgers), compacting (incrementally, delete retention 0 and above, keyless records
dropped or kept, previous parts kept in place with deletion vectors), truncating
(retention, with and without ``allow_uncompacted``) and collecting garbage are
interleaved at random on one in-memory topic.  After every step each consumer of the
topic's view (:mod:`shale.metadata.view`) is compared with a model kept in plain lists,
sets and dicts:

* the plain read and the compacted read from ``earliest`` (messages and Arrow batches);
* the splits an engine reads in parallel, read one after another without Spark;
* a point lookup (``shale get``) of every key;
* the two-pass table (messages and Arrow batches) and a :class:`~shale.reader.TableView`;
* ``verify``.

A rule reads from a random position (ids of records retention removed included) with
each ``on_gap`` choice, plain and compacted, and compares what the reader gives, where
it stops with a :class:`~shale.ledger.errors.GapError`, and the splits from there.

Run long by hand with ``SHALE_LONG_TESTS=1`` (200 examples of up to 30 steps).
"""

from __future__ import annotations

import os
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any

import hypothesis.strategies as st
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from shale.compactor import CompactionConfig, Compactor, collect_garbage
from shale.ledger.codecs import parse_compression
from shale.ledger.errors import GapError, InvalidInputError
from shale.ledger.ids import MIN_ID, MessageId
from shale.ledger.record import Message
from shale.maintenance.retention import truncate
from shale.maintenance.verify import verify_topic
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TableView, TopicReader
from shale.reader.latest import table_batches, table_messages
from shale.reader.lookup import lookup
from shale.reader.splits import plan_splits, read_split

LONG = os.environ.get("SHALE_LONG_TESTS") == "1"

MINUTE = 60_000
HOUR = 60 * MINUTE
ORPHAN_GRACE = 15 * MINUTE
KEYS = (None, "a", "b", "c", "d", "e", "f", "g", "h")
Row = tuple[MessageId, bytes | None, bytes | None]  # id, key, value (None or b"": a tombstone when keyed)


class Clock:
    """Whole seconds, so the writer's and the compactor's milliseconds are exact."""

    def __init__(self) -> None:
        self.s = int(time.time())

    def __call__(self) -> float:
        return float(self.s)

    @property
    def ms(self) -> int:
        return self.s * 1000


@dataclass
class Rec:
    key: bytes | None
    value: bytes | None
    id: MessageId

    @property
    def tombstone(self) -> bool:
        return self.key is not None and not self.value

    def row(self) -> Row:
        return (self.id, self.key, self.value or None)


def rows(messages: list[Message]) -> list[Row]:
    return [(m.id, m.key, m.value or None) for m in messages]


def batch_rows(batches: list[Any]) -> list[Row]:
    out: list[Row] = []
    for b in batches:
        d = b.to_pydict()
        for ledger, entry, batch, key, value in zip(d["ledger"], d["entry"], d["batch"], d["key"], d["value"],
                                                    strict=True):
            out.append((MessageId(ledger, entry, batch), key, value or None))
    return out


def drain(reader: TopicReader) -> tuple[list[Message], GapError | None]:
    """Everything ``reader`` gives, and the gap error it stops at (if any)."""
    out: list[Message] = []
    while True:
        try:
            got = reader.read()
        except GapError as e:
            return out, e
        if not got:
            return out, None
        out += got


def batches_until_gap(reader: TopicReader) -> tuple[list[Any], GapError | None]:
    out: list[Any] = []
    try:
        for b in reader.iter_batches(rows=3):
            out.append(b)
    except GapError as e:
        return out, e
    return out, None


# now and then a value of 30 kB that does not compress, so that parts of 64 KiB roll
big_value = st.integers(0, 1 << 16).map(lambda seed: random.Random(seed).randbytes(30_000))
record_strategy = st.tuples(st.sampled_from(KEYS), st.one_of(st.none(), st.just(b""), st.binary(min_size=1, max_size=3),
                                                             st.binary(min_size=1, max_size=3), big_value))


class ViewMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.uri = f"memory://view-{uuid.uuid4().hex[:12]}/topic"
        self.clock = Clock()
        self.meta = TopicMetadata.open(self.uri)
        self.meta.create_topic()
        self.records: list[Rec] = []  # every record ever produced, in id order
        self.entries: dict[int, int] = {}  # ledger id -> entries
        self.removed_through = 0
        self.horizon: MessageId | None = None
        self.kept: set[MessageId] = set()  # ids the compacted parts hold
        self.first_kept: dict[MessageId, int] = {}  # tombstone -> when a run first kept it

    # ------------------------------------------------------------------ model

    def _exists(self, r: Rec) -> bool:
        return r.id.ledger > self.removed_through

    def _above(self, r: Rec) -> bool:
        return self.horizon is None or r.id > self.horizon

    def plain(self) -> list[Rec]:
        return [r for r in self.records if self._exists(r)]

    def compacted(self) -> list[Rec]:
        """The compacted view: what the parts hold, then the records above the horizon left."""
        return [r for r in self.records if r.id in self.kept or (self._above(r) and self._exists(r))]

    def covered(self) -> MessageId:
        """The first id past what the compacted view holds (as a reader that listed no
        removed ledger knows it)."""
        h = self.horizon
        if h is None:
            return MIN_ID
        return h.successor() if h.ledger > self.removed_through else MessageId(h.ledger + 1, 0, 0)

    def tail_start(self, p: MessageId) -> MessageId:
        return p if self.horizon is None else max(p, self.horizon.successor())

    def table(self) -> dict[bytes, Rec]:
        latest: dict[bytes, Rec] = {}
        for r in self.compacted():
            if r.key is not None:
                latest[r.key] = r
        return {k: r for k, r in latest.items() if not r.tombstone}

    def _expires(self, retention: int, now: int) -> bool:
        tombs = [r.id for r in self.records if r.id in self.kept and r.tombstone]
        return any(retention == 0 or now - self.first_kept[i] >= retention for i in tombs)

    def _apply(self, now: int, retention: int, retain: bool) -> bool:
        """One run: whether it compacts (else it has nothing to do)."""
        new = [r for r in self.records if self._above(r) and self._exists(r)]
        if not new and not self._expires(retention, now):
            return False
        cands = [r for r in self.records if r.id in self.kept] + new
        latest = {r.key: r.id for r in cands if r.key is not None}
        kept: set[MessageId] = set()
        first: dict[MessageId, int] = {}
        for r in cands:
            if r.key is None:
                if retain:
                    kept.add(r.id)
            elif latest[r.key] == r.id:
                if r.tombstone:
                    fk = self.first_kept.get(r.id, now)
                    if retention == 0 or now - fk >= retention:
                        continue
                    first[r.id] = fk
                kept.add(r.id)
        self.horizon = new[-1].id if new else self.horizon
        self.kept, self.first_kept = kept, first
        return True

    # ------------------------------------------------------------------ rules

    @initialize(records=st.lists(record_strategy, min_size=1, max_size=12))
    def start(self, records: list[tuple[Any, ...]]) -> None:
        self.produce(records, 2, 3, "zstd")

    @rule(records=st.lists(record_strategy, min_size=1, max_size=12), batch_size=st.integers(1, 4),
          max_ledger_records=st.integers(1, 6), codec=st.sampled_from(["none", "zstd", "lz4"]))
    def produce(self, records: list[tuple[Any, ...]], batch_size: int, max_ledger_records: int, codec: str) -> None:
        with TopicWriter(self.uri, batch_size=batch_size, max_ledger_records=max_ledger_records, clock=self.clock,
                         compression=codec) as w:
            for key, value in records:
                w.append(key, value)
        sealed = w.result.ledgers
        assert sum(lg.records for lg in sealed) == len(records)
        # the ids the records got, learned from a plain read of the new ledgers alone
        got = TopicReader(self.uri, start=sealed[0].first_id).read()
        assert [(m.key, m.value) for m in got] == [(k.encode() if k else None, v) for k, v in records]
        for m in got:
            lg = next(s for s in sealed if s.id == m.id.ledger)
            assert lg.first_id <= m.id <= lg.last_id
            self.records.append(Rec(m.key, m.value, m.id))
        self.entries.update((lg.id, lg.entries) for lg in sealed)

    @rule(seconds=st.sampled_from([0, 60, 1800, 3599, 3600, 7200]))
    def advance_clock(self, seconds: int) -> None:
        self.clock.s += seconds

    @rule(retention=st.sampled_from([0, HOUR]), retain=st.booleans(), in_place=st.sampled_from([True, True, False]),
          collect=st.booleans())
    def compact(self, retention: int, retain: bool, in_place: bool, collect: bool) -> None:
        """A run; with ``in_place`` previous parts stay where they are with deletion vectors,
        and parts and entries are small, so a run writes several."""
        now = self.clock.ms
        config = CompactionConfig(delete_retention_ms=retention, retain_null_key=retain, gc_grace_ms=0,
                                  orphan_grace_ms=ORPHAN_GRACE, collect_garbage=collect,
                                  reuse_min_bytes=0 if in_place else 8 << 20,
                                  max_part_bytes=64 << 10 if in_place else 256 << 20,
                                  entry_bytes=1 << 10 if in_place else 64 << 10,
                                  compression=parse_compression("none" if in_place else "zstd"))
        summary = Compactor(self.uri, config, clock=self.clock).run()
        compacts = self._apply(now, retention, retain)
        assert summary.status == ("compacted" if compacts else "nothing-to-do"), (summary, compacts)
        state = self.meta.load_compaction()
        assert state.horizon == self.horizon
        if summary.records_reused:
            event("compact: previous parts kept in place")
        if any(p.deletions for p in state.parts):
            event("compact: deletion vectors")
        if len(state.parts) > 1:
            event("compact: several parts")

    @rule(data=st.data(), allow=st.booleans())
    def truncate(self, data: st.DataObject, allow: bool) -> None:
        """Retention removes the oldest ledgers; past the horizon only when allowed."""
        live = sorted({r.id.ledger for r in self.plain()})
        last = max(self.entries, default=0)
        before = data.draw(st.sampled_from([*live, last + 1]), label="before_ledger")
        removed = [r for r in self.plain() if r.id.ledger < before]
        lost = [r for r in removed if self._above(r)]
        if lost and not allow:
            try:
                truncate(self.meta, before)
            except InvalidInputError:
                event("truncate: refused, it would lose records")
                return
            raise AssertionError("a truncation losing uncompacted records was not refused")
        truncate(self.meta, before, allow_uncompacted=allow)
        if removed:
            self.removed_through = max(self.removed_through, removed[-1].id.ledger)
            event(f"truncate: {'lost records above the horizon' if lost else 'only compacted records'}")
        assert self.meta.load_topic().removed_through == self.removed_through

    @rule(grace=st.sampled_from([0, 10 * MINUTE]))
    def gc(self, grace: int) -> None:
        collect_garbage(self.meta, now_ms=self.clock.ms, grace_ms=grace, orphan_grace_ms=ORPHAN_GRACE)

    @rule(data=st.data(), compacted=st.booleans(), on_gap=st.sampled_from(["error", "skip", "compacted"]))
    def read_from(self, data: st.DataObject, compacted: bool, on_gap: str) -> None:
        """A reader started at a position, and the splits from there, against the model."""
        ids = [r.id for r in self.records]
        candidates = {MIN_ID, *ids, *(i.successor() for i in ids), *(MessageId(lg, 0, 0) for lg in self.entries),
                      *(MessageId(lg, e, 0) for lg, e in self.entries.items())}
        if self.horizon is not None:
            candidates |= {self.horizon, self.horizon.successor()}
        gone = sorted(i for i in candidates if i.ledger <= self.removed_through)
        if gone and data.draw(st.booleans(), label="where retention removed"):
            candidates = set(gone)  # often: the removed range, where reads meet gaps
        p = data.draw(st.sampled_from(sorted(candidates)), label="position")
        want, gap = self._read_from(p, compacted, on_gap)
        event(f"read from an id: {'compacted' if compacted else 'plain'}, {'gap' if gap else 'no gap'}")
        got, err = drain(TopicReader(self.uri, read_compacted=compacted, start=p, on_gap=on_gap,  # type: ignore[arg-type]
                                     gap_listener=lambda g: None))
        assert rows(got) == [r.row() for r in want], f"read from {p}"
        assert (err is not None) == gap, (p, err)
        batches, err = batches_until_gap(TopicReader(self.uri, read_compacted=compacted, start=p,
                                                     on_gap=on_gap, gap_listener=lambda g: None))  # type: ignore[arg-type]
        assert batch_rows(batches) == [r.row() for r in want], f"batches from {p}"
        assert (err is not None) == gap, (p, err)
        # splits read what is left from ``p``: retention's gaps are the streaming source's to check
        if compacted:
            tail = self.tail_start(p)
            left = [r for r in self.compacted() if r.id >= (p if r.id in self.kept else tail)]
        else:
            left = [r for r in self.plain() if r.id >= p]
        self._check_splits(compacted, p, left)

    def _read_from(self, p: MessageId, compacted: bool, on_gap: str) -> tuple[list[Rec], bool]:
        """What a reader started at ``p`` gives, and whether it stops at a gap."""
        resume = MessageId(self.removed_through + 1, 0, 0)
        gone = self.removed_through >= 1 and p.ledger <= self.removed_through
        if compacted:
            held = [r for r in self.compacted() if r.id in self.kept and r.id >= p]
            tail = [r for r in self.compacted() if r.id not in self.kept and r.id >= self.tail_start(p)]
            if gone and max(self.tail_start(p), min(self.covered(), resume)) < resume and on_gap != "skip":
                return held, True
            return held + tail, False
        rest = [r for r in self.plain() if r.id >= p]
        if not gone:
            return rest, False
        if on_gap == "error":
            return [], True
        if on_gap == "skip":
            return rest, False
        held = [r for r in self.records if r.id in self.kept and r.id >= p]
        return held + (rest if self.covered() >= resume else []), self.covered() < resume

    def _check_splits(self, compacted: bool, start: MessageId, want: list[Rec]) -> None:
        meta = TopicMetadata.open(self.uri)
        splits = plan_splits(meta, compacted=compacted, start=start, max_records=2)
        got = [b for s in splits for b in read_split(meta, s)]
        assert batch_rows(got) == [r.row() for r in want], f"splits from {start}"

    # ------------------------------------------------------------- invariant

    @invariant()
    def every_consumer_agrees(self) -> None:
        plain, view, table = self.plain(), self.compacted(), self.table()
        got, err = drain(TopicReader(self.uri))
        assert err is None and rows(got) == [r.row() for r in plain], "plain read"
        reader = TopicReader(self.uri, read_compacted=True)
        assert reader.compaction.horizon == self.horizon
        got, err = drain(reader)
        assert err is None and rows(got) == [r.row() for r in view], "compacted read"
        batches, err = batches_until_gap(TopicReader(self.uri, read_compacted=True))
        assert err is None and batch_rows(batches) == [r.row() for r in view], "compacted batches"
        self._check_splits(True, MIN_ID, view)
        self._check_splits(False, MIN_ID, plain)
        meta = TopicMetadata.open(self.uri)
        latest = {r.key: r for r in view if r.key is not None}
        for key in KEYS[1:]:
            found, want = lookup(meta, key.encode()), latest.get(key.encode())
            assert (found.message.id if found.message else None) == (want.id if want else None), f"get {key}"
            assert found.value == (None if want is None or want.tombstone else want.value), f"get {key}"
        in_order = sorted(table.values(), key=lambda r: r.id)
        assert rows(list(table_messages(meta))) == [r.row() for r in in_order], "table"
        assert batch_rows(list(table_batches(meta, rows=2))) == [r.row() for r in in_order], "table batches"
        assert dict(TableView(self.uri)) == {k: r.value for k, r in table.items()}, "table view"
        report = verify_topic(meta)
        assert report.ok, report.human()
        assert report.records_checked == sum(1 for r in view if r.id in self.kept and r.key is not None)

    def teardown(self) -> None:
        store = self.meta.topic.store
        for info in list(store.list("")):
            store.delete(info.key)


ViewMachine.TestCase.settings = settings(
    max_examples=200 if LONG else 12,
    stateful_step_count=30 if LONG else 10,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],  # no explain: slow here
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
TestViewStateMachine = ViewMachine.TestCase
