"""A Hypothesis state machine that checks the compacted view of one topic against a plain model.

Producing (one or two writers, batches, rolling ledgers, back-dated publish times),
advancing a fake clock, compacting with per-run configurations, collecting garbage
and reading (full, compacted, seeking, table view, a reader left open across
compactions and garbage collection) are interleaved at random on one in-memory topic.
Every read is compared with a model kept in plain Python lists and dicts:

* the full (non-compacted) read is every sealed record, in order, with ids that
  strictly increase and never change;
* the compacted read is, for the records at or below the published horizon, what the
  compaction rules leave (latest record of every key, tombstones kept for
  ``delete_retention_ms`` after the first compaction that kept them, keyless records
  only with ``retain_null_key``), followed by every record above the horizon once;
* a compacted read started at any id is the suffix of that read from that id;
* the table view is the latest non-tombstone value of every key;
* the incremental result equals a from-scratch compaction of a copy of the records.

Each machine picks a topic order (offset, or event-time: the record with the greatest
event time wins, one without counting as its entry's publish time) and a key TTL (winners
older than ``now - TTL`` go, by event time under event-time order, else by publish time),
kept for all its runs.

Run long by hand with ``SHALE_LONG_TESTS=1`` (500 examples of up to 50 steps).
"""

from __future__ import annotations

import datetime
import itertools
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from shale.compactor import CompactionConfig, Compactor, collect_garbage
from shale.ledger.codecs import Dictionary, parse_compression
from shale.ledger.errors import InvalidInputError, ObjectNotFoundError, SnapshotNotFoundError
from shale.ledger.ids import MIN_ID, MessageId
from shale.ledger.record import Message, Record, encode_record
from shale.metadata.dictionaries import register_dictionary
from shale.metadata.state import CompactionState
from shale.metadata.subscriptions import Subscriptions
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TableView, TopicReader

LONG = os.environ.get("SHALE_LONG_TESTS") == "1"

SECOND = 1_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
DAY = 24 * HOUR
ORPHAN_GRACE = 15 * MINUTE
KEYS = (None, "a", "b", "c", "d", "e", "f")
RETENTIONS = (0, HOUR, 24 * HOUR)
ORDERS = ("offset", "event-time")
TTLS = (0, 0, 2 * HOUR, 26 * HOUR)
LAGS = (0, 30 * MINUTE)


#: Each produce and each compaction picks one (mixing codecs in a ledger and across runs).
CODECS = ["none", "lz4", "zstd", "zstd:3", "zstd-dict"]


def _trained_dictionary() -> Dictionary:
    """A dictionary trained on records shaped like the ones the machine produces."""
    import random

    import zstandard

    rnd = random.Random(7)
    samples = [encode_record(Record(f"k{rnd.randrange(8)}".encode(), bytes([rnd.randrange(256)]) * rnd.randrange(9),
                                    {"p": "x"} if rnd.random() < 0.5 else {}, 1_700_000_000_000 + i))
               for i in range(3000)]
    d = zstandard.train_dictionary(2048, samples, dict_id=424242)
    return Dictionary(d.dict_id(), d.as_bytes())


_DICTIONARY = _trained_dictionary()


class FakeClock:
    """Whole seconds only, so ``int(clock() * 1000)`` is exact."""

    def __init__(self, start_s: int) -> None:
        self.s = start_s

    def __call__(self) -> float:
        return float(self.s)

    @property
    def ms(self) -> int:
        return self.s * 1000


@dataclass
class Rec:
    """A produced record as the model knows it (``id`` is learned from the first read)."""

    key: bytes | None
    value: bytes | None
    properties: dict[str, str]
    publish_time: int
    event_time: int | None
    id: MessageId | None = None

    @property
    def tombstone(self) -> bool:
        return self.key is not None and not self.value

    def content(self) -> tuple[Any, ...]:
        return (self.key, self.value, dict(self.properties), self.publish_time, self.event_time)


def content(m: Message) -> tuple[Any, ...]:
    return (m.key, m.value, dict(m.properties), m.publish_time, m.event_time)


def show(items: list[Any]) -> list[str]:
    out = []
    for x in items:
        out.append(f"{x.id} {x.key!r}={x.value!r}")
    return out


@dataclass
class WriterSlot:
    writer: TopicWriter
    pending: list[Rec] = field(default_factory=list)
    sealed_seen: int = 0
    batch_size: int = 1
    max_ledger_records: int = 1


# now and then a big value, so reads and compaction go through several chunks and parts roll
big_value = st.tuples(st.integers(1, 255), st.sampled_from([5_000, 40_000])).map(lambda t: bytes([t[0]]) * t[1])

record_strategy = st.tuples(
    st.sampled_from(KEYS),
    st.one_of(st.none(), st.just(b""), st.binary(min_size=1, max_size=6), st.binary(min_size=1, max_size=6),
              st.binary(min_size=1, max_size=6), big_value),
    st.one_of(st.just({}), st.dictionaries(st.sampled_from(["p", "q"]), st.sampled_from(["x", "", "yy"]),
                                           max_size=2)),
    # an event time: none, anywhere, or within hours of the clock (the second figure: seconds before it)
    st.one_of(st.none(), st.integers(-2**40, 2**40).map(lambda x: ("abs", x)),
              st.integers(-3600, 30 * 3600).map(lambda x: ("rel", x)),
              st.integers(-3600, 30 * 3600).map(lambda x: ("rel", x))),
    # None: append() at the clock's time; an int: send() back-dated by that many seconds
    st.one_of(st.none(), st.none(), st.none(), st.integers(0, 4 * 3600)),
)


class ShaleModelMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store_name = f"sm-{uuid.uuid4().hex[:16]}"
        self.uri = f"memory://{self.store_name}/topic"
        self.clock = FakeClock(int(time.time()))
        self.meta = TopicMetadata.open(self.uri)
        self.meta.create_topic()
        register_dictionary(self.meta, _DICTIONARY)  # for zstd-dict
        self.slots: list[WriterSlot | None] = [None, None]
        self.visible: list[Rec] = []  # sealed records, in id order
        self.sealed_ranges: list[tuple[int, int, Any]] = []  # (first index, stop index, SealedLedger)
        # compaction model
        self.horizon: MessageId | None = None
        self.kept: list[MessageId] = []
        self.first_kept: dict[MessageId, int] = {}
        self.epoch = 0
        self.history: dict[int, tuple[MessageId | None, tuple[MessageId, ...]]] = {0: (None, ())}
        self.retentions_used: set[int] = set()
        self.retains_used: set[bool] = set()
        self.fixed_config = True
        self.retention = 0
        self.retain_null_key = False
        self.order = "offset"
        self.ttl = 0
        self.lingering: TopicReader | None = None
        self.table_view: TableView | None = None

    # ------------------------------------------------------------------ helpers

    def _exists(self, obj: str) -> bool:
        try:
            self.meta.topic.store.stat(self.meta.topic.key(obj))
        except ObjectNotFoundError:
            return False
        return True

    def _collect_sealed(self, slot_no: int) -> None:
        """Move the records of ledgers the writer sealed since last time into ``visible``."""
        slot = self.slots[slot_no]
        assert slot is not None
        ledgers = slot.writer.result.ledgers
        for lg in ledgers[slot.sealed_seen:]:
            assert 1 <= lg.records <= slot.max_ledger_records, lg
            assert lg.records <= len(slot.pending), (lg, len(slot.pending))
            if slot.sealed_seen and self.sealed_ranges[-1][2] not in ledgers:
                event("produce: a writer registered after another one did (relabel)")
            first = len(self.visible)
            self.visible.extend(slot.pending[:lg.records])
            del slot.pending[:lg.records]
            self.sealed_ranges.append((first, len(self.visible), lg))
        slot.sealed_seen = len(ledgers)
        self._check_full()

    def _check_full(self) -> None:
        """Guarantee 1: the full read is every sealed record in order; ids never change."""
        msgs = TopicReader(self.uri, read_compacted=False).read()
        assert len(msgs) == len(self.visible), (len(msgs), len(self.visible))
        prev: MessageId | None = None
        for m, r in zip(msgs, self.visible, strict=True):
            if r.id is None:
                r.id = m.id
            assert m.id == r.id, f"id of a record changed: {r.id} -> {m.id}"
            assert content(m) == r.content(), (m, r)
            assert prev is None or m.id > prev, f"ids not increasing: {prev} then {m.id}"
            prev = m.id
        for first, stop, lg in self.sealed_ranges:
            assert self.visible[first].id == lg.first_id, (lg, self.visible[first].id)
            assert self.visible[stop - 1].id == lg.last_id, (lg, self.visible[stop - 1].id)
            assert {r.id.ledger for r in self.visible[first:stop]} == {lg.id}  # type: ignore[union-attr]

    def _expected(self, horizon: MessageId | None, kept: tuple[MessageId, ...] | list[MessageId],
                  start: MessageId = MIN_ID) -> list[Rec]:
        """The compacted read a state with ``horizon`` and compacted ids ``kept`` should give."""
        keep = set(kept)
        out = []
        for r in self.visible:
            assert r.id is not None
            if r.id < start:
                continue
            if horizon is None or r.id > horizon or r.id in keep:
                out.append(r)
        return out

    def _compare(self, got: list[Message], want: list[Rec], what: str) -> None:
        assert [m.id for m in got] == [r.id for r in want], (
            f"{what}: ids differ\n got  {show(got)}\n want {show(want)}\n horizon {self.horizon} "
            f"kept {[str(i) for i in self.kept]}")
        for m, r in zip(got, want, strict=True):
            assert content(m) == r.content(), (what, m, r)

    def _compare_moved(self, got: list[Message], old: list[Rec], pos: MessageId, limit: int | None) -> None:
        """``got`` is a prefix of the old view's records from ``pos``, then the newest view's
        records after the last of them (or from ``pos``), ``limit`` in all."""
        n = 0
        while n < len(got) and n < len(old) and got[n].id == old[n].id:
            n += 1
        self._compare(got[:n], old[:n], f"lingering reader from {pos}, before its view was collected")
        start = got[n - 1].id.successor() if n else pos
        new = self._expected(self.horizon, self.kept, start)
        left = None if limit is None else limit - n
        self._compare(got[n:], new[:left] if left is not None else new,
                      f"lingering reader from {start} (moved to epoch {self.epoch}, its view collected)")

    def _entries_after(self, after: MessageId | None) -> list[tuple[int, MessageId]]:
        """``(entry publish time, last record id)`` of every entry with records above ``after``."""
        entries: dict[tuple[int, int], tuple[int, MessageId]] = {}
        for r in self.visible:
            assert r.id is not None
            k = (r.id.ledger, r.id.entry)
            pub, last = entries.get(k, (0, r.id))
            entries[k] = (max(pub, r.publish_time), max(last, r.id))
        return [v for k, v in sorted(entries.items()) if after is None or v[1] > after]

    def _horizon_bound(self, cutoff: int) -> tuple[MessageId | None, bool]:
        """The furthest horizon a run with this cutoff may publish, and whether it is exact.

        It is the last record before the first entry (above the current horizon) that is
        younger than the cutoff.  When entry publish times never decrease along the
        topic, the compactor must reach exactly that far.
        """
        bound = self.horizon
        for pub, last in self._entries_after(self.horizon):
            if pub > cutoff:
                break
            bound = last
        pubs = [pub for pub, _ in self._entries_after(None)]
        monotonic = all(a <= b for a, b in itertools.pairwise(pubs))
        return bound, monotonic

    def _times(self) -> dict[MessageId, tuple[int, int]]:
        """Each record's ``(time under event order, publish time)``: its event time, or its
        entry's publish time (the latest of the entry's records), and that publish time."""
        entry_pub: dict[tuple[int, int], int] = {}
        for r in self.visible:
            assert r.id is not None
            k = (r.id.ledger, r.id.entry)
            entry_pub[k] = max(entry_pub.get(k, r.publish_time), r.publish_time)
        out = {}
        for r in self.visible:
            assert r.id is not None
            pub = entry_pub[(r.id.ledger, r.id.entry)]
            out[r.id] = (pub if r.event_time is None else r.event_time, pub)
        return out

    def _age(self, t: tuple[int, int]) -> int:
        """The time a winner is aged by: the one that orders, else the publish time."""
        return t[0] if self.order == "event-time" else t[1]

    def _would_age(self, now: int) -> bool:
        """Whether a run at ``now`` would drop a kept key past the TTL."""
        if not self.ttl:
            return False
        times = self._times()
        by_id = {r.id: r for r in self.visible}
        return any(by_id[i].key is not None and self._age(times[i]) < now - self.ttl for i in self.kept)

    def _would_expire(self, retention: int, now: int) -> bool:
        by_id = {r.id: r for r in self.visible}
        tombs = [i for i in self.kept if by_id[i].tombstone]
        return any(not self._held(i, fk, now) and (retention == 0 or now - fk >= retention)
                   for i in tombs for fk in [self.first_kept.get(i, now)])

    def _apply_compaction(self, horizon: MessageId, now: int, retention: int, retain: bool) -> dict[str, int]:
        """The model of one run: previous survivors plus the new records up to ``horizon``."""
        prev_h = self.horizon
        keep = set(self.kept)
        cands = [r for r in self.visible
                 if r.id in keep or (r.id <= horizon and (prev_h is None or r.id > prev_h))]  # type: ignore[operator]
        times = self._times()
        latest: dict[bytes, MessageId] = {}
        for r in cands:
            if r.key is not None:
                cur = latest.get(r.key)
                # event order: the greatest time wins, the later record on a tie
                if self.order == "offset" or cur is None or times[r.id][0] >= times[cur][0]:  # type: ignore[index]
                    latest[r.key] = r.id  # type: ignore[assignment]
        new_kept: list[MessageId] = []
        new_first: dict[MessageId, int] = {}
        stats = {"keys": 0, "tombstones_kept": 0, "tombstones_dropped": 0, "keyless": 0,
                 "records_read": len(cands), "keys_expired": 0}
        for r in cands:
            assert r.id is not None
            if r.key is None:
                stats["keyless"] += 1
                if retain:
                    new_kept.append(r.id)
                continue
            if latest[r.key] != r.id:
                continue
            if self.ttl and self._age(times[r.id]) < now - self.ttl:
                stats["tombstones_dropped" if r.tombstone else "keys_expired"] += 1
                continue
            if r.tombstone:
                fk = self.first_kept.get(r.id, now)
                if (retention == 0 or now - fk >= retention) and not self._held(r.id, fk, now, note=True):
                    self._tombstone_went(r.id, fk, now)
                    stats["tombstones_dropped"] += 1
                    continue
                stats["tombstones_kept"] += 1
                new_first[r.id] = fk
            else:
                stats["keys"] += 1
            new_kept.append(r.id)
        self.horizon, self.kept, self.first_kept = horizon, new_kept, new_first
        return stats

    def _check_state_objects(self, state: CompactionState) -> None:
        for obj in state.referenced_objects():
            assert self._exists(obj), f"published state refers to a missing object {obj}"

    # -------------------------------------------------------------------- rules

    @initialize(fixed=st.booleans(), retention=st.sampled_from(RETENTIONS), retain=st.booleans(),
                order=st.sampled_from(ORDERS), ttl=st.sampled_from(TTLS))
    def choose_config(self, fixed: bool, retention: int, retain: bool, order: str, ttl: int) -> None:
        """Either one retention / null-key setting for every run, or a new one per run; one
        order and key TTL for every run."""
        self.fixed_config, self.retention, self.retain_null_key = fixed, retention, retain
        self.order, self.ttl = order, ttl
        # readers take the order from the policy until the first compaction records it
        self.meta.update_policy({"order": order, "key_ttl_ms": ttl}, [])

    @rule(slot_no=st.sampled_from([0, 0, 0, 1]), batch_size=st.integers(1, 6),
          max_ledger_records=st.integers(1, 12), max_ledger_bytes=st.sampled_from([64 << 20, 64 << 20, 30_000]),
          records=st.lists(record_strategy, min_size=1, max_size=15),
          backdate=st.sampled_from([False, False, False, True]), flush=st.sampled_from([True, True, False]),
          codec=st.sampled_from(CODECS))
    def produce(self, slot_no: int, batch_size: int, max_ledger_records: int, max_ledger_bytes: int,
                records: list[tuple[Any, ...]], backdate: bool, flush: bool, codec: str) -> None:
        """Append a batch; with ``backdate`` some records are sent with an older publish time.
        Each batch is compressed with a codec of its own (one ledger may mix them)."""
        slot = self.slots[slot_no]
        if slot is None:
            w = TopicWriter(self.uri, batch_size=batch_size, max_ledger_records=max_ledger_records,
                            max_ledger_bytes=max_ledger_bytes, clock=self.clock, compression=codec)
            slot = self.slots[slot_no] = WriterSlot(w, batch_size=batch_size, max_ledger_records=max_ledger_records)
        slot.writer.compression = codec
        for key, value, props, when, back_s in records:
            k = key.encode() if key is not None else None
            event_time = None if when is None else when[1] if when[0] == "abs" else self.clock.ms - when[1] * SECOND
            if back_s is None or not backdate:
                slot.pending.append(Rec(k, value, dict(props), self.clock.ms, event_time))
                slot.writer.append(key, value, props, event_time)
            else:
                pub = self.clock.ms - back_s * SECOND
                slot.pending.append(Rec(k, value, dict(props), pub, event_time))
                slot.writer.send(Record(k, value, dict(props), pub, event_time))
        if flush:
            slot.writer.flush()
        self._collect_sealed(slot_no)
        if flush:
            assert not slot.pending, "flush left records unsealed"

    @rule(slot_no=st.sampled_from([0, 1]), close=st.booleans())
    def flush_writer(self, slot_no: int, close: bool) -> None:
        slot = self.slots[slot_no]
        if slot is None:
            return
        if close:
            slot.writer.close()
        else:
            slot.writer.flush()
        self._collect_sealed(slot_no)
        assert not slot.pending
        if close:
            self.slots[slot_no] = None

    @rule(seconds=st.one_of(st.integers(0, 3 * 3600),
                            st.sampled_from([0, 1, 1799, 1800, 1801, 3599, 3600, 3601, 3 * 3600]),
                            st.sampled_from([24 * 3600 - 1, 24 * 3600, 24 * 3600 + 1, 30 * 3600])))
    def advance_clock(self, seconds: int) -> None:
        """Mostly 0..3 hours; sometimes about a day, so the 24-hour retention comes into play."""
        self.clock.s += seconds

    @precondition(lambda self: bool(self.first_kept))
    @rule(data=st.data(), delta=st.sampled_from([-1, 0, 0, 1]))
    def advance_to_tombstone_expiry(self, data: st.DataObject, delta: int) -> None:
        """Move the clock to just before, at or just after the moment a kept tombstone expires."""
        first = data.draw(st.sampled_from(sorted(self.first_kept.values())), label="first kept")
        retention = self.retention if self.fixed_config else data.draw(st.sampled_from(RETENTIONS[1:]))
        target_s = (first + retention) // SECOND + delta
        if target_s > self.clock.s:
            event("clock: to a tombstone's expiry")
            self.clock.s = target_s

    @rule(lag=st.sampled_from(LAGS), retention=st.sampled_from(RETENTIONS), retain=st.booleans(),
          collect=st.booleans(), gc_grace=st.sampled_from([0, 5 * MINUTE, 2 * HOUR]),
          small_parts=st.booleans(), small_map=st.booleans(), codec=st.sampled_from(CODECS))
    def compact(self, lag: int, retention: int, retain: bool, collect: bool, gc_grace: int,
                small_parts: bool, small_map: bool, codec: str) -> None:
        self._compact(lag, retention, retain, collect, gc_grace, small_parts, small_map, codec)

    @rule(lag=st.sampled_from(LAGS), retention=st.sampled_from(RETENTIONS), retain=st.booleans())
    def dry_run(self, lag: int, retention: int, retain: bool) -> None:
        """A dry run publishes and writes nothing, and reports what a real run would keep."""
        if self.fixed_config:
            retention, retain = self.retention, self.retain_null_key
        store, loc = self.meta.topic.store, self.meta.topic
        objects = [(o.key, o.token) for o in store.list(loc.prefix)]
        before = self.meta.load_compaction()
        config = CompactionConfig(min_compaction_lag_ms=lag, delete_retention_ms=retention, retain_null_key=retain,
                                  orphan_grace_ms=ORPHAN_GRACE, dry_run=True, order=self.order, key_ttl_ms=self.ttl,
                                  **self._subscription_config())
        summary = Compactor(self.uri, config, clock=self.clock).run()
        assert summary.status in ("dry-run", "nothing-to-do"), summary
        after = self.meta.load_compaction()
        assert (after.version, after.epoch, after.horizon) == (before.version, before.epoch, before.horizon)
        assert [(o.key, o.token) for o in store.list(loc.prefix)] == objects, "a dry run changed objects"
        if summary.status == "dry-run":
            h = MessageId.parse(summary.horizon) if summary.horizon else None
            assert h is not None
            saved = (self.horizon, self.kept, self.first_kept)
            self._apply_compaction(h, self.clock.ms, retention, retain)
            would_keep = len(self.kept)
            self.horizon, self.kept, self.first_kept = saved
            assert summary.records_written == would_keep, (summary, would_keep)

    @rule(lag=st.sampled_from(LAGS), retention=st.sampled_from(RETENTIONS), retain=st.booleans(),
          seconds=st.integers(0, 3 * 3600))
    def compact_then_collect(self, lag: int, retention: int, retain: bool, seconds: int) -> None:
        """A run that leaves its retired ledger for a separate collection (grace 0) later."""
        self._compact(lag, retention, retain, False, 0, False, False)
        self.clock.s += seconds
        self.gc(0)

    def _compact(self, lag: int, retention: int, retain: bool, collect: bool, gc_grace: int,
                 small_parts: bool, small_map: bool, codec: str = "zstd") -> None:
        if self.fixed_config:
            retention, retain = self.retention, self.retain_null_key
        now = self.clock.ms
        prev = self.meta.load_compaction()
        assert prev.epoch == self.epoch and prev.horizon == self.horizon
        bound, exact = self._horizon_bound(now - lag)
        would_expire = self._would_expire(retention, now) or self._would_age(now)
        config = CompactionConfig(order=self.order, key_ttl_ms=self.ttl, snapshot_retention=self.snap_keep,
                                  min_compaction_lag_ms=lag, delete_retention_ms=retention,
                                  retain_null_key=retain, gc_grace_ms=gc_grace,
                                  orphan_grace_ms=ORPHAN_GRACE, collect_garbage=collect,
                                  max_part_bytes=1 << 16 if small_parts else 256 << 20,
                                  chunk_bytes=1 << 12 if small_parts else 8 << 20,
                                  # keep previous parts in place with deletion vectors
                                  reuse_min_bytes=0 if small_parts else 16 << 20,
                                  # 3 keys, so a run often stops short (partial cleaning)
                                  max_map_bytes=3 * (24 if self.order == "offset" else 32) if small_map else 1 << 30,
                                  # survivors packed into small compressed entries
                                  compression=parse_compression(codec),
                                  entry_bytes=1 << 10 if small_parts else 64 << 10, **self._subscription_config())
        summary = Compactor(self.uri, config, clock=self.clock).run()
        state = self.meta.load_compaction()
        assert summary.status in ("compacted", "nothing-to-do"), summary
        event(f"compact: {summary.status}{' (tombstones expire)' if would_expire else ''}"
              f"{'' if exact else ' (publish times not monotonic)'}")
        if summary.status == "nothing-to-do":
            assert state.epoch == self.epoch and state.horizon == self.horizon
            if exact:
                assert bound == self.horizon, f"records up to {bound} were old enough but nothing was done"
            assert not would_expire, "expired tombstones were left in the compacted ledger"
        else:
            h = state.horizon
            assert h is not None
            assert state.epoch == self.epoch + 1
            assert summary.horizon == str(h) and summary.epoch == state.epoch
            assert h in {r.id for r in self.visible}, f"horizon {h} is not a record"
            assert self.horizon is None or h >= self.horizon, (h, self.horizon)
            assert bound is not None and h <= bound, f"horizon {h} passes a record younger than the lag ({bound})"
            if summary.deferred_records:
                event("compact: partial, the key map was full")
                assert small_map and h < bound, summary
                assert summary.deferred_records == sum(1 for r in self.visible if h < r.id <= bound)
            elif exact:
                assert h == bound, (h, bound)
            self.retentions_used.add(retention)
            self.retains_used.add(retain)
            stats = self._apply_compaction(h, now, retention, retain)
            if stats["tombstones_dropped"]:
                event("compact: tombstones dropped")
            if stats["tombstones_kept"]:
                event("compact: tombstones kept")
            if h != bound:
                event("compact: horizon short of the bound")
            self.epoch = state.epoch
            self._snap_follow()  # (a rule may compact more than once in a step)
            self.history[self.epoch] = (h, tuple(self.kept))
            assert summary.records_written + summary.records_reused == len(self.kept) == state.records, \
                (summary, self.kept)
            if summary.records_reused:
                event("compact: previous parts kept in place")
            if any(p.deletions for p in state.parts):
                event("compact: deletion vectors")
            assert summary.parts == len(state.parts)
            if len(state.parts) > 1:
                event("compact: several parts")
            ends: list[MessageId] = []
            for part in state.parts:
                assert part.records > 0 and part.first_id is not None and part.last_id is not None
                assert part.first_id <= part.last_id
                ends += [part.first_id, part.last_id]
            assert ends == sorted(ends) and len(set(ends[1::2])) == len(ends[1::2]), state.parts
            if not any(p.deletions for p in state.parts):  # else a part may start or end with a deleted record
                assert not ends or (ends[0] == self.kept[0] and ends[-1] == self.kept[-1])
            assert summary.records_read == stats["records_read"]
            assert summary.keys == stats["keys"] == state.keys
            assert summary.tombstones_kept == stats["tombstones_kept"] == state.tombstones
            assert summary.tombstones_dropped == stats["tombstones_dropped"]
            assert summary.keys_expired == stats["keys_expired"]
            if stats["keys_expired"]:
                event("compact: keys expired")
            assert summary.keyless_kept == (stats["keyless"] if retain else 0)
            assert summary.keyless_dropped == (0 if retain else stats["keyless"])
        assert summary.orphans_deleted == 0
        # retired compacted ledgers: the replaced one joins the list; collection removes the due ones only
        retired = [(r.objects, r.retired_ms) for r in prev.retired]
        if summary.status == "compacted":
            # what the previous state's views named and the new one's do not (parts kept in place
            # stay, and so does what a retained snapshot reads)
            still, views = state.retained_objects(), [*(v.parts for v in prev.snapshots), prev.parts]
            gone = [p.object for parts in views for p in parts if p.object not in still]
            gone += [p.deletions for parts in views for p in parts if p.deletions and p.deletions not in still]
            if gone:
                retired.append((tuple(dict.fromkeys(gone)), now))
        if collect:
            retired = [(objs, ms) for objs, ms in retired if now - ms < gc_grace]
        assert [(r.objects, r.retired_ms) for r in state.retired] == retired, (state.retired, retired)
        self._check_state_objects(state)

    @rule(grace=st.sampled_from([0, 0, 10 * MINUTE, 5 * HOUR]))
    def collect(self, grace: int) -> None:
        self.gc(grace)

    def gc(self, grace: int) -> None:
        now = self.clock.ms
        before = self.meta.load_compaction()
        report = collect_garbage(self.meta, now_ms=now, grace_ms=grace, orphan_grace_ms=ORPHAN_GRACE)
        after = self.meta.load_compaction()
        assert (after.epoch, after.horizon, after.parts) == (before.epoch, before.horizon, before.parts)
        due = [r for r in before.retired if now - r.retired_ms >= grace]
        assert sorted(report.retired_deleted) == sorted(o for r in due for o in r.objects)
        assert after.retired == tuple(r for r in before.retired if r not in due)
        assert report.orphans_deleted == [], report.orphans_deleted
        event(f"gc: deleted {'some' if report.retired_deleted else 'none'}")
        for obj in report.retired_deleted:
            assert not self._exists(obj)
        self._check_state_objects(after)

    @rule(data=st.data(), chunk_bytes=st.sampled_from([1, 4096, 8 << 20]))
    def seek(self, data: st.DataObject, chunk_bytes: int) -> None:
        """Guarantee 3: a read started at any id is the suffix of the read from earliest."""
        ids = [r.id for r in self.visible if r.id is not None]
        if ids:
            base = data.draw(st.sampled_from(ids), label="base")
            how = data.draw(st.sampled_from(["exact", "successor", "next-entry", "next-ledger", "zero",
                                              "past-end"]), label="how")
            pos = {"exact": base, "successor": base.successor(),
                   "next-entry": MessageId(base.ledger, base.entry + 1, 0),
                   "next-ledger": MessageId(base.ledger + 1, 0, 0), "zero": MIN_ID,
                   "past-end": MessageId(ids[-1].ledger, ids[-1].entry + 1, 0)}[how]
        else:
            pos = data.draw(st.sampled_from([MIN_ID, MessageId(1, 0, 0), MessageId(3, 2, 1)]), label="pos")
        got = TopicReader(self.uri, read_compacted=True, start=pos, chunk_bytes=chunk_bytes).read()
        self._compare(got, self._expected(self.horizon, self.kept, pos), f"compacted read from {pos}")
        got = TopicReader(self.uri, read_compacted=False, start=pos, chunk_bytes=chunk_bytes).read()
        self._compare(got, [r for r in self.visible if r.id >= pos], f"full read from {pos}")  # type: ignore[operator]

    @precondition(lambda self: self.lingering is None)
    @rule(k=st.integers(0, 12))
    def open_lingering_reader(self, k: int) -> None:
        """Open a compacted reader and read a little; it continues later, across compactions and gc."""
        r = TopicReader(self.uri, read_compacted=True)
        assert r.compaction.epoch == self.epoch
        got = r.read(limit=k)
        self._compare(got, self._expected(self.horizon, self.kept)[:k], "lingering reader's first read")
        self.lingering = r

    @precondition(lambda self: self.lingering is not None)
    @rule(even_if_current=st.booleans(), limit=st.one_of(st.none(), st.none(), st.integers(1, 8)))
    def continue_lingering_reader(self, even_if_current: bool, limit: int | None) -> None:
        r = self.lingering
        assert r is not None
        pos, state = r.position, r.compaction
        if state.epoch == self.epoch and not even_if_current:
            return  # mostly let it fall behind first
        horizon, kept = self.history[state.epoch]
        assert horizon == state.horizon
        needed = [p for p in state.parts
                  if state.horizon is not None and pos <= state.horizon and p.last_id is not None
                  and p.last_id >= pos]
        missing = [p for p in needed if not self._exists(p.object)]
        event(f"lingering reader: {'collected' if missing else 'kept'}"
              f"{' mid-compacted' if needed else ''}, {self.epoch - state.epoch} epochs behind")
        got = r.read(limit)
        old = self._expected(horizon, kept, pos)
        if r.compaction.epoch == state.epoch:
            # still on its view: every object it needed was there, or it had what it still
            # needed of them in hand (the rest of a part it had read, records a deletion
            # vector removes): it finishes that view
            self._compare(got, old[:limit] if limit is not None else old,
                          f"lingering reader from {pos} (epoch {state.epoch}, "
                          f"{'collected' if missing else 'still there'})")
        else:
            # its view was collected under it: what it read of its view, then the newest
            # view from there on, with no gap and no record twice
            assert missing, f"a reader left epoch {state.epoch} while its objects were still there"
            assert len(missing) == len(needed)
            assert r.compaction.epoch == self.epoch
            self._compare_moved(got, old, pos, limit)
        if limit is None:
            r.close()
            self.lingering = None

    @precondition(lambda self: self.lingering is None)
    @rule(k=st.integers(0, 6), records=st.lists(record_strategy, min_size=0, max_size=6),
          lag=st.sampled_from(LAGS), retention=st.sampled_from(RETENTIONS), retain=st.booleans(),
          grace=st.sampled_from([0, 0, 10 * MINUTE]))
    def read_across_compaction_and_gc(self, k: int, records: list[tuple[Any, ...]], lag: int, retention: int,
                                      retain: bool, grace: int) -> None:
        """A reader in the middle of the compacted ledger while it is replaced and collected."""
        self.open_lingering_reader(k)
        if records:
            self.produce(0, 3, 12, 64 << 20, records, False, True, "zstd")
        self._compact(lag, retention, retain, False, 0, False, False)
        self.gc(grace)
        self.continue_lingering_reader(True, None)

    @precondition(lambda self: self.horizon is not None and self.order == "offset" and not self.ttl)
    @rule(retention=st.sampled_from(RETENTIONS))
    def from_scratch(self, retention: int) -> None:
        """Guarantee 5: the incremental result equals a fresh compaction of a copy of the records
        (in offset order without a TTL: under event order a record written after its key's
        delete was dropped comes back, which a fresh compaction of every record would not do,
        and the copy's entries, with other publish times, age otherwise)."""
        assert self.horizon is not None
        below = [r for r in self.visible if r.id <= self.horizon]  # type: ignore[operator]
        if self.retentions_used == {0}:
            retention = 0
        retain = self.retains_used == {True}
        copy_uri = f"memory://{self.store_name}/copy-{uuid.uuid4().hex[:8]}"
        with TopicWriter(copy_uri, batch_size=4, max_ledger_records=9, clock=self.clock) as w:
            for r in below:
                w.send(Record(r.key, r.value, r.properties, r.publish_time, r.event_time))
        summary = Compactor(copy_uri, CompactionConfig(delete_retention_ms=retention, retain_null_key=retain,
                                                       orphan_grace_ms=ORPHAN_GRACE, key_ttl_ms=self.ttl),
                            clock=self.clock).run()
        assert summary.status == ("compacted" if below else "nothing-to-do"), summary
        fresh = [content(m) for m in TopicReader(copy_uri, read_compacted=True).read()]
        ours = [content(m) for m in TopicReader(self.uri, read_compacted=True).read()
                if m.id <= self.horizon]
        if len(self.retains_used) > 1:
            # keyless records depend on the history of the setting: compare keyed ones only
            fresh = [c for c in fresh if c[0] is not None]
            ours = [c for c in ours if c[0] is not None]
        if retention or self.retentions_used != {0} or self.ever_subscribed:
            # tombstones depend on when they were first kept (checked against the model)
            fresh = [c for c in fresh if c[0] is None or c[1]]
            ours = [c for c in ours if c[0] is None or c[1]]
        assert ours == fresh, f"incremental {ours}\n from scratch {fresh}"

    # ------------------------------------------------------- durable subscriptions
    # A subscription holds the tombstones at or after its position past their retention
    # while it is active (committed within the expiry), until they were kept max_hold; a
    # consumer that reads as one and folds what it reads into a table ends with the table
    # of the whole topic: it never misses a delete (checked in offset order without a TTL,
    # where that table is the fold of every record).

    @dataclass
    class Sub:
        """A subscription as the model knows it."""

        position: MessageId = MIN_ID
        committed_ms: int = 0  # as its document says (stamped by the committer's clock)
        table: dict[bytes, bytes] = field(default_factory=dict)  # what its consumer folded from its reads
        intact: bool = True  # read from the start, and never expired nor outlasted while a delete it needed went

    @initialize(expiry=st.sampled_from([2 * DAY, 7 * DAY]), max_hold=st.sampled_from([0, 6 * HOUR, 30 * DAY]))
    def choose_subscription_policy(self, expiry: int, max_hold: int) -> None:
        """How long a subscription stays active without committing, and how long a held
        tombstone may stay (0: subscriptions hold nothing back), for every run."""
        self.sub_expiry, self.max_hold = expiry, max_hold
        self.subs: dict[str, ShaleModelMachine.Sub] = {}
        self.ever_subscribed = False

    def _subscription_config(self) -> dict[str, Any]:
        return {"subscription_expiry_ms": self.sub_expiry, "max_tombstone_hold_ms": self.max_hold}

    def _active(self, s: ShaleModelMachine.Sub, now: int) -> bool:
        return now - s.committed_ms < self.sub_expiry

    def _held(self, tomb: MessageId, first_kept: int, now: int, note: bool = False) -> bool:
        """Whether a run at ``now`` keeps this tombstone past its retention for a subscription."""
        floor = min((s.position for s in self.subs.values() if self._active(s, now)), default=None)
        held = bool(self.max_hold) and floor is not None and tomb >= floor and now - first_kept < self.max_hold
        if note and held:
            event("compact: a tombstone held past its retention for a subscription")
        return held

    def _tombstone_went(self, tomb: MessageId, first_kept: int, now: int) -> None:
        """A tombstone went past its retention: never one an active subscription had yet to
        read, unless it was kept max_hold; such a subscription no longer has the guarantee."""
        for name, s in self.subs.items():
            if s.position <= tomb:
                excused = not self._active(s, now) or not self.max_hold or now - first_kept >= self.max_hold
                assert excused, f"subscription {name} at {s.position} was active and had yet to read {tomb}"
                s.intact = False

    def _committed(self, name: str) -> int:
        return Subscriptions(self.meta).get(name).committed_ms

    @rule(name=st.sampled_from(["app", "ops"]), limit=st.one_of(st.none(), st.integers(0, 8)),
          compacted=st.booleans())
    def read_as_subscription(self, name: str, limit: int | None, compacted: bool) -> None:
        """A consumer reads on from where its subscription last committed (from the start
        when new), plain or compacted, folds what it reads and commits."""
        s = self.subs.setdefault(name, self.Sub())
        with TopicReader(self.uri, subscription=name, read_compacted=compacted) as r:
            got = r.read(limit)
            committed = r.commit()
        want = (self._expected(self.horizon, self.kept, s.position) if compacted
                else [x for x in self.visible if x.id >= s.position])  # type: ignore[operator]
        self._compare(got, want[:limit] if limit is not None else want, f"subscription {name} from {s.position}")
        # the position committed is past the last record read, and not past the next one
        assert not got or committed > got[-1].id, (committed, got[-1].id)
        assert len(got) == len(want) or committed <= want[len(got)].id, (committed, want[len(got)])  # type: ignore[operator]
        s.position, s.committed_ms = committed, self._committed(name)
        for m in got:
            if m.key is not None:
                if m.value:
                    s.table[m.key] = m.value
                else:
                    s.table.pop(m.key, None)
        self.ever_subscribed = True
        event(f"subscription: read{' to the end' if limit is None else ''}{' (compacted)' if compacted else ''}")
        if limit is None and s.intact and self.order == "offset" and not self.ttl:
            event("subscription: the guarantee checked")
            assert s.table == self._table_of(self.visible, self.clock.ms), "a subscriber missed a delete or a value"

    @rule(name=st.sampled_from(["app", "ops"]), compacted=st.booleans(),
          records=st.lists(record_strategy, max_size=5), deletes=st.sets(st.sampled_from(KEYS[1:]), min_size=1),
          retention=st.sampled_from(RETENTIONS), seconds=st.sampled_from([HOUR // SECOND + 1, DAY // SECOND + 1]))
    def pause_across_deletes(self, name: str, compacted: bool, records: list[tuple[Any, ...]], deletes: set[str],
                             retention: int, seconds: int) -> None:
        """A subscriber reads to the end and pauses; keys are deleted, compacted, and
        compacted again past the delete retention; the subscriber reads on."""
        self.read_as_subscription(name, None, compacted)
        deleting = [(key, None, {}, None, None) for key in sorted(deletes)]
        self.produce(0, 2, 5, 64 << 20, [*records, *deleting], False, True, "zstd")
        self._compact(0, retention, False, False, 0, False, False)
        self.clock.s += seconds
        self._compact(0, retention, False, False, 0, False, False)
        self.read_as_subscription(name, None, compacted)

    @precondition(lambda self: bool(self.subs))
    @rule(data=st.data(), to=st.sampled_from(["earliest", "latest", "same"]))
    def reset_subscription(self, data: st.DataObject, to: str) -> None:
        """An operator moves a subscription (``same``: where it is, which counts as a
        commit, as a consumer alive but stuck would do, at the machine's clock)."""
        name = data.draw(st.sampled_from(sorted(self.subs)), label="subscription")
        s = self.subs[name]
        subs = Subscriptions(self.meta, clock=self.clock)  # (an operator whose clock is the run's)
        if to == "same":
            s.committed_ms = subs.commit(subs.get(name), s.position, now_ms=self.clock.ms).committed_ms
            return
        position = MIN_ID if to == "earliest" else MessageId(self.meta.load_topic().last_ledger_id + 1, 0, 0)
        _, after = subs.reset(name, position, now_ms=self.clock.ms)
        assert after.position == position
        s.position, s.committed_ms = position, after.committed_ms
        # from the start, its consumer rebuilds its table; past the end, it skipped records
        s.table, s.intact = ({}, True) if to == "earliest" else (s.table, False)

    @precondition(lambda self: bool(self.subs))
    @rule(data=st.data())
    def delete_subscription(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.subs)), label="subscription")
        Subscriptions(self.meta).delete(name)
        del self.subs[name]

    @precondition(lambda self: bool(self.subs))
    @rule(data=st.data(), delta=st.sampled_from([-1, 0, 1]))
    def advance_to_subscription_expiry(self, data: st.DataObject, delta: int) -> None:
        """Move the clock to just before, at or just after a subscription expires."""
        s = self.subs[data.draw(st.sampled_from(sorted(self.subs)), label="subscription")]
        target_s = (s.committed_ms + self.sub_expiry) // SECOND + delta
        if target_s > self.clock.s:
            event("clock: to a subscription's expiry")
            self.clock.s = target_s

    # ------------------------------------------------- snapshots, reads as of them, rollback
    # The machine keeps the newest ``snap_keep`` views readable (1: none but the published
    # one).  The model follows which epochs are retained, each epoch's tombstone ages (to
    # roll back to) and when each was published; every retained snapshot reads as the
    # model's view of its epoch after every step, every garbage collection included.

    @initialize(keep=st.sampled_from([1, 2, 3, 3]))
    def choose_snapshot_retention(self, keep: int) -> None:
        self.snap_keep = keep
        self.snap_retained: list[int] = []  # retained snapshots' epochs, oldest first
        self.snap_first_kept: dict[int, dict[MessageId, int]] = {0: {}}
        self.snap_published: dict[int, int] = {}
        self.snap_seen = 0  # the last epoch the model followed
        self.snap_rolled_back: set[int] = set()  # epochs a rollback published

    def _snap_follow(self) -> CompactionState:
        """The state; the model follows an epoch a compaction published since the last step."""
        state = self.meta.load_compaction()
        if self.epoch != self.snap_seen:
            assert self.epoch == self.snap_seen + 1 and state.epoch == self.epoch
            if self.snap_seen in self.snap_rolled_back:
                event("compact: built on a view rolled back to")
            self._snap_published(self.snap_seen, state)
        return state

    def _snap_published(self, replaced: int, state: CompactionState) -> None:
        """The model after epoch ``self.epoch`` replaced epoch ``replaced``."""
        self.snap_first_kept[self.epoch] = dict(self.first_kept)
        self.snap_published[self.epoch] = state.compacted_ms
        kept = [*self.snap_retained, *([replaced] if replaced else [])]
        self.snap_retained = kept[len(kept) - (self.snap_keep - 1):] if self.snap_keep > 1 else []
        self.snap_seen = self.epoch

    @precondition(lambda self: self.epoch > 0)
    @rule(data=st.data(), table=st.booleans())
    def read_from_snapshot(self, data: st.DataObject, table: bool) -> None:
        """A read from a retained epoch's snapshot is that epoch's view, then every record
        above its horizon; one no view answers is refused, listing those retained."""
        self._snap_follow()
        retained = [*self.snap_retained, self.epoch]
        epoch = data.draw(st.sampled_from([*retained, max(1, retained[0] - 1), self.epoch + 1]), label="epoch")
        if epoch not in retained:
            event("read from a snapshot: not retained")
            with pytest.raises(SnapshotNotFoundError, match="retained: epoch"):
                TopicReader(self.uri, from_snapshot=epoch)
            return
        event(f"read from {'the published view' if epoch == self.epoch else 'a snapshot'}")
        want = self._expected(*self.history[epoch])
        with TopicReader(self.uri, from_snapshot=epoch) as r:
            self._compare(r.read(), want, f"read from snapshot {epoch}")
        if table:
            got = dict(TableView(self.uri, from_snapshot=epoch, clock=self.clock))
            assert got == self._table_of(want, self.clock.ms), (got, self._table_of(want, self.clock.ms))

    def _draw_point(self, data: st.DataObject, label: str) -> int | datetime.datetime:
        """A retained epoch, or a time: one a view was published at (or just after), or
        one a record was published at."""
        retained = [*self.snap_retained, self.epoch]
        kind = data.draw(st.sampled_from(["epoch", "published", "record"]), label=f"{label} kind")
        if kind == "epoch":
            return int(data.draw(st.sampled_from(retained), label=label))
        if kind == "published" or not self.visible:
            at = self.snap_published[data.draw(st.sampled_from(retained), label=label)]
        else:
            at = data.draw(st.sampled_from(self.visible), label=label).publish_time
        at += data.draw(st.sampled_from([-1, 0, 999]), label=f"{label} ms after")
        return datetime.datetime.fromtimestamp(at / 1000, datetime.UTC)

    def _as_of(self, point: int | datetime.datetime) -> tuple[list[Rec], int]:
        """What a read as of ``point`` gives (records, as the model keeps them) and the
        "now" its table counts a key TTL from: an epoch's view through its horizon; at a
        time, the newest retained view published by then, then the records above its
        horizon up to the first one (in id order) published later."""
        if isinstance(point, int):
            horizon, kept = self.history[point]
            return [r for r in self._expected(horizon, kept) if horizon is not None
                    and r.id <= horizon], self.snap_published[point]  # type: ignore[operator]
        at = int(point.timestamp() * 1000)
        cut = next((r.id for r in self.visible if r.publish_time > at), None)
        bases = [e for e in (*self.snap_retained, self.epoch) if self.snap_published[e] <= at
                 and (cut is None or self.history[e][0] is None or self.history[e][0] < cut)]
        horizon, kept = self.history[bases[-1]] if bases else (None, ())
        return [r for r in self._expected(horizon, kept) if cut is None or r.id < cut], at  # type: ignore[operator]

    @precondition(lambda self: self.epoch > 0)
    @rule(data=st.data(), table=st.booleans())
    def read_as_of(self, data: st.DataObject, table: bool) -> None:
        """A read as of a retained epoch is its view through its horizon; as of a time,
        every record published by then: nothing written later, whatever was published or
        compacted since.  An epoch not retained is refused."""
        self._snap_follow()
        point = self._draw_point(data, "point")
        if data.draw(st.booleans(), label="an epoch not retained"):
            missing = data.draw(st.sampled_from([self.epoch + 1, *([self.snap_retained[0] - 1] if self.snap_retained
                                                                   and self.snap_retained[0] > 1 else [])]))
            with pytest.raises(SnapshotNotFoundError, match="is not retained"):
                TopicReader(self.uri, as_of=missing)
        event(f"read as of: {'an epoch' if isinstance(point, int) else 'a time'}")
        want, now = self._as_of(point)
        with TopicReader(self.uri, as_of=point) as r:
            self._compare(r.read(), want, f"read as of {point}")
        if table:
            got = dict(TableView(self.uri, as_of=point))
            assert got == self._table_of(want, now), (point, got, self._table_of(want, now))

    @precondition(lambda self: self.epoch > 0)
    @rule(data=st.data())
    def changes_between(self, data: st.DataObject) -> None:
        """The changes between two points are the difference of the two tables: a key
        with another record is an upsert of it, a key gone is a delete."""
        from shale.reader.changes import changes

        self._snap_follow()
        a, b = self._draw_point(data, "from"), self._draw_point(data, "to")
        event(f"changes: {type(a).__name__} to {type(b).__name__}")
        old, new = (self._table_recs(*self._as_of(p)) for p in (a, b))
        got = list(changes(self.meta, a, b))
        ups = {c.key: c.message.id for c in got if c.op == "upsert" and c.message is not None}
        assert ups == {k: r.id for k, r in new.items() if k not in old or old[k].id != r.id}, (a, b)
        assert {c.key for c in got if c.op == "delete"} == set(old) - set(new), (a, b)
        assert len(got) == len(ups) + len(set(old) - set(new))

    @precondition(lambda self: bool(self.snap_retained))
    @rule(data=st.data(), seconds=st.sampled_from([0, 1, 3600]))
    def roll_back(self, data: st.DataObject, seconds: int) -> None:
        """Publish a retained snapshot's view again; the model goes back to that epoch's view
        (and its tombstones' ages), and later runs build on it."""
        from shale.maintenance.snapshots import rollback

        self._snap_follow()
        self.clock.s += seconds
        to = data.draw(st.sampled_from([*self.snap_retained, self.epoch]), label="to epoch")
        if to == self.epoch:
            with pytest.raises(InvalidInputError, match="is the published view already"):
                rollback(self.meta, to, keep=self.snap_keep, clock=self.clock, store_now_ms=self.clock.ms)
            return
        event("rollback")
        done = rollback(self.meta, to, keep=self.snap_keep, clock=self.clock, store_now_ms=self.clock.ms)
        replaced, (horizon, kept) = self.epoch, self.history[to]
        assert (done.from_epoch, done.epoch, done.horizon) == (replaced, replaced + 1, horizon)
        self.horizon, self.kept, self.first_kept = horizon, list(kept), dict(self.snap_first_kept[to])
        self.epoch = replaced + 1
        self.history[self.epoch] = (horizon, tuple(kept))
        self.snap_rolled_back.add(self.epoch)
        state = self.meta.load_compaction()
        self._snap_published(replaced, state)
        assert state.retained_epochs == (*self.snap_retained, self.epoch)
        self._check_state_objects(state)

    @invariant()
    def retained_snapshots_read_as_the_model(self) -> None:
        """Every retained snapshot reads as the model's view of its epoch (so garbage
        collection never deleted what one reads), and exactly those the retention keeps
        are retained."""
        if not hasattr(self, "snap_keep"):
            return  # (before the initialize rules)
        state = self._snap_follow()
        assert state.retained_epochs == ((*self.snap_retained, self.epoch) if self.epoch else ())
        if self.snap_retained:
            event(f"snapshots retained: {len(self.snap_retained)}")
        for epoch in self.snap_retained:
            with TopicReader(self.uri, from_snapshot=epoch) as r:
                self._compare(r.read(), self._expected(*self.history[epoch]), f"snapshot of epoch {epoch}")
            with TopicReader(self.uri, as_of=epoch) as r:
                self._compare(r.read(), self._as_of(epoch)[0], f"as of epoch {epoch}")

    # --------------------------------------------------------------- invariants

    @invariant()
    def compacted_read_matches_model(self) -> None:
        """Guarantees 1, 2 and 4 after every step."""
        self._check_full()
        reader = TopicReader(self.uri, read_compacted=True)
        assert reader.compaction.horizon == self.horizon and reader.compaction.epoch == self.epoch
        self._compare(reader.read(), self._expected(self.horizon, self.kept), "compacted read")
        # a table view decides by the topic's order and hides expired keys (at its clock's now)
        now = self.clock.ms
        view = TableView(self.uri, clock=self.clock)
        table = self._table_of(self._expected(self.horizon, self.kept), now)
        assert dict(view) == table, (dict(view), table)
        if self.order != "offset":
            return  # (a view kept across compactions remembers deletes a fresh one no longer sees)
        assert table == self._table_of(self.visible, now)
        # a table view kept across steps catches up on refresh
        if self.table_view is None:
            self.table_view = view
        else:
            self.table_view.refresh()
            assert dict(self.table_view) == table, (dict(self.table_view), table)

    def _table_of(self, records: list[Rec], now: int) -> dict[bytes, bytes]:
        """The latest value of every key among ``records`` (in id order) by the topic's
        order, less tombstones and keys past the TTL at ``now``."""
        return {k: r.value for k, r in self._table_recs(records, now).items()}  # type: ignore[misc]

    def _table_recs(self, records: list[Rec], now: int) -> dict[bytes, Rec]:
        """:meth:`_table_of`, each key's record."""
        times = self._times()
        best: dict[bytes, Rec] = {}
        for r in records:
            if r.key is None:
                continue
            cur = best.get(r.key)
            if self.order == "offset" or cur is None or times[r.id][0] >= times[cur.id][0]:  # type: ignore[index]
                best[r.key] = r
        return {k: r for k, r in best.items()
                if not r.tombstone and not (self.ttl and self._age(times[r.id]) < now - self.ttl)}  # type: ignore[index]

    def teardown(self) -> None:
        if self.lingering is not None:
            self.lingering.close()
        store = self.meta.topic.store
        for info in list(store.list("")):
            store.delete(info.key)


ShaleModelMachine.TestCase.settings = settings(
    max_examples=500 if LONG else 40,
    stateful_step_count=50 if LONG else 25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
TestModelStateMachine = ShaleModelMachine.TestCase
