"""Event-time order and key expiry in compaction (local engine), against a dict model.

The model folds every record ever written in id order: under event-time order a record
replaces its key's current one when its time (event time, or the publish time of its
entry when it has none) is at least as great; a tombstone takes part like any record.
Key expiry is checked at its boundary by hand.  Tombstones are dropped at once (delete
retention 0) unless a test says otherwise.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from shale.compactor import CompactionConfig, Compactor
from shale.ledger.errors import InvalidInputError
from shale.ledger.ordering import TopicOrder
from shale.ledger.record import Record
from shale.maintenance.verify import verify_topic
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader

BASE = 1_700_000_000_000


@dataclass(frozen=True)
class Rec:
    key: bytes
    value: bytes | None  # None: a tombstone
    publish: int
    event: int | None


def write(uri: str, recs: list[Rec], *, batch: int = 1) -> None:
    """Each record with its own publish time; ``batch`` records an entry (an entry's
    publish time is then its last record's, and a record without an event time counts
    as that)."""
    with TopicWriter(uri, batch_size=batch, max_ledger_records=7) as w:
        for r in recs:
            w.send(Record(r.key, r.value, {}, r.publish, r.event))


def entry_times(recs: list[Rec], batch: int) -> list[int]:
    """The time each record counts as under event order, given its entry's publish time."""
    out: list[int] = []
    for i in range(0, len(recs), batch):
        group = recs[i:i + batch]
        published = max(r.publish for r in group)
        out += [r.event if r.event is not None else published for r in group]
    return out


def model(recs: list[Rec], times: list[int], *, order: str) -> dict[bytes, bytes]:
    """The live keys after folding ``recs`` (each with its time, ``times``) in id order."""
    best: dict[bytes, tuple[int, Rec]] = {}
    for r, t in zip(recs, times, strict=True):
        cur = best.get(r.key)
        if order == "offset" or cur is None or t >= cur[0]:
            best[r.key] = (t, r)
    return {k: r.value for k, (_, r) in best.items() if r.value is not None}


def compacted(uri: str) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    with TopicReader(uri, read_compacted=True) as r:
        for m in r.read():
            if m.key is None:
                continue
            if m.value:
                out[m.key] = m.value
            else:
                out.pop(m.key, None)
    return out


def run(uri: str, now_ms: int = BASE + 10**9, **kw: object) -> object:
    """One run at ``now_ms``; ``shale verify`` then agrees with what it published."""
    config = CompactionConfig(delete_retention_ms=kw.pop("delete_retention_ms", 0), **kw)  # type: ignore[arg-type]
    summary = Compactor(uri, config, clock=lambda: now_ms / 1000).run()
    assert summary.ok, summary.human()
    report = verify_topic(TopicMetadata.open(uri))
    assert report.ok, report.human()
    return summary


def _random_records(rng: random.Random, n: int, keys: int, start: int, *, missing: float = 0.2,
                    tombstones: float = 0.1) -> list[Rec]:
    out = []
    for i in range(n):
        k = f"k{rng.randrange(keys)}".encode()
        value = None if rng.random() < tombstones else f"v{start + i}".encode()
        event = None if rng.random() < missing else BASE + rng.randrange(0, 5_000) * 10
        out.append(Rec(k, value, BASE + (start + i) * 10, event))
    return out


def test_out_of_order_event_times_latest_event_wins(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    recs = [Rec(b"a", b"new", BASE + 10, BASE + 500), Rec(b"a", b"late", BASE + 20, BASE + 100),
            Rec(b"b", b"one", BASE + 30, BASE + 200), Rec(b"b", b"two", BASE + 40, BASE + 200),  # tie: later wins
            Rec(b"c", b"v", BASE + 50, BASE + 900), Rec(b"c", None, BASE + 60, BASE + 800),  # late delete loses
            Rec(b"d", b"v", BASE + 70, BASE + 100), Rec(b"d", None, BASE + 80, BASE + 150)]  # newer delete wins
    write(uri, recs)
    run(uri, order="event-time")
    assert compacted(uri) == {b"a": b"new", b"b": b"two", b"c": b"v"}
    assert compacted(uri) == model(recs, entry_times(recs, 1), order="event-time")
    state = TopicMetadata.open(uri).load_compaction()
    assert state.order.order == "event-time"


def test_offset_order_unchanged_by_event_times(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    recs = [Rec(b"a", b"new", BASE + 10, BASE + 500), Rec(b"a", b"late", BASE + 20, BASE + 100)]
    write(uri, recs)
    run(uri)
    assert compacted(uri) == {b"a": b"late"}
    assert TopicMetadata.open(uri).load_compaction().order.order == "offset"


def test_missing_event_time_counts_as_its_entry_publish_time(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    # one entry of three: its publish time is its last record's (BASE + 300)
    recs = [Rec(b"a", b"timed", BASE + 100, BASE + 250), Rec(b"a", b"untimed", BASE + 200, None),
            Rec(b"b", b"x", BASE + 300, BASE + 400)]
    write(uri, recs, batch=3)
    # later: a timed record older than that entry's publish time loses to the untimed one
    more = [Rec(b"a", b"older", BASE + 400, BASE + 299), Rec(b"b", b"untimed-later", BASE + 500, None)]
    write(uri, more)
    run(uri, order="event-time")
    assert compacted(uri) == {b"a": b"untimed", b"b": b"untimed-later"}
    assert compacted(uri) == model(recs + more, entry_times(recs, 3) + entry_times(more, 1), order="event-time")


@pytest.mark.parametrize("seed", range(4))
def test_many_incremental_rounds_match_the_model(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    uri = str(tmp_path / "t")
    every: list[Rec] = []
    times: list[int] = []
    for rnd in range(5):
        recs = _random_records(rng, rng.randrange(5, 60), 12, len(every))
        batch = rng.choice([1, 3])
        write(uri, recs, batch=batch)
        every += recs
        times += entry_times(recs, batch)
        # tombstones stay (delete retention): a late record older than a delete loses to it
        run(uri, order="event-time", reuse_min_bytes=0 if rnd % 2 else 1 << 40, delete_retention_ms=10**12)
        assert compacted(uri) == model(every, times, order="event-time"), f"round {rnd}"


def test_a_delete_protects_only_while_it_is_kept(tmp_path: Path) -> None:
    """As in Kafka, a delete is remembered for the delete retention: a record older than
    it that arrives after the tombstone was dropped brings the key back (documented)."""
    uri = str(tmp_path / "t")
    write(uri, [Rec(b"a", b"v", BASE + 10, BASE + 100), Rec(b"a", None, BASE + 20, BASE + 200)])
    run(uri, order="event-time", delete_retention_ms=10**12)
    write(uri, [Rec(b"a", b"late", BASE + 30, BASE + 150)])
    run(uri, order="event-time", delete_retention_ms=10**12)
    assert compacted(uri) == {}
    run(uri, order="event-time", delete_retention_ms=0)  # the tombstone goes
    write(uri, [Rec(b"a", b"later-still", BASE + 40, BASE + 150)])
    run(uri, order="event-time", delete_retention_ms=0)
    assert compacted(uri) == {b"a": b"later-still"}
    report = verify_topic(TopicMetadata.open(uri))
    assert report.ok and report.resurrected == 1, report.human()


def test_a_late_delete_older_than_a_dropped_one_is_no_mismatch(tmp_path: Path) -> None:
    """The same gap with a delete arriving late: older than a delete already dropped, it is
    kept as the key's record (its own retention runs).  The key is deleted either way, so
    ``shale verify`` finds nothing wrong (it counted the kept delete as stale)."""
    uri = str(tmp_path / "t")
    write(uri, [Rec(b"a", b"v", BASE + 10, BASE + 100), Rec(b"a", None, BASE + 20, BASE + 200)])
    run(uri, order="event-time", delete_retention_ms=0)  # the tombstone goes at once
    write(uri, [Rec(b"a", None, BASE + 30, BASE + 150), Rec(b"b", b"w", BASE + 40, None)])
    run(uri, order="event-time", delete_retention_ms=10**12)  # (run verifies, and fails on a mismatch)
    with TopicReader(uri, read_compacted=True) as r:
        assert [(m.key, m.value) for m in r.read()] == [(b"a", None), (b"b", b"w")]
    report = verify_topic(TopicMetadata.open(uri))
    assert report.ok and report.stale == 0 and report.resurrected == 0, report.human()


def test_partial_cleaning_under_a_small_map(tmp_path: Path) -> None:
    rng = random.Random(7)
    uri = str(tmp_path / "t")
    recs = _random_records(rng, 300, 120, 0)
    write(uri, recs)
    runs = 0
    while True:
        s = run(uri, order="event-time", max_map_bytes=32 * 40, delete_retention_ms=10**12)
        runs += 1
        if not s.deferred_records:  # type: ignore[attr-defined]
            break
        assert s.map_bytes <= 32 * 40  # type: ignore[attr-defined]
    assert runs > 1
    assert compacted(uri) == model(recs, entry_times(recs, 1), order="event-time")


@pytest.mark.parametrize("order", ["offset", "event-time"])
def test_key_ttl_at_the_boundary(tmp_path: Path, order: str) -> None:
    uri = str(tmp_path / "t")
    now = BASE + 1_000_000
    ttl = 1000
    # a's winner is exactly now - ttl: kept; b's is a millisecond older: expired
    recs = [Rec(b"a", b"va", now - ttl, now - ttl), Rec(b"b", b"vb", now - ttl - 1, now - ttl - 1),
            Rec(b"c", b"vc", now - 5, now - 5)]
    write(uri, recs)
    s = run(uri, now_ms=now, order=order, key_ttl_ms=ttl)
    assert compacted(uri) == {b"a": b"va", b"c": b"vc"}
    assert s.keys_expired == 1  # type: ignore[attr-defined]
    assert s.keys == 2  # type: ignore[attr-defined]
    # later, with nothing new: a and c expire too, and the run is not "nothing to do"
    s = run(uri, now_ms=now + 10_000, order=order, key_ttl_ms=ttl)
    assert compacted(uri) == {}
    assert s.keys_expired == 2  # type: ignore[attr-defined]
    # the plain log keeps every record
    with TopicReader(uri) as r:
        assert len(r.read()) == 3


def test_key_ttl_measured_by_event_time_under_event_order(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    now = BASE + 1_000_000
    # published just now, but its event is old: expired under event order only
    recs = [Rec(b"a", b"old-event", now - 10, now - 50_000), Rec(b"b", b"fresh", now - 10, now - 10)]
    write(uri, recs)
    run(uri, now_ms=now, order="event-time", key_ttl_ms=10_000)
    assert compacted(uri) == {b"b": b"fresh"}
    # an expired key's older record cannot come back: it is older still
    write(uri, [Rec(b"a", b"even-older", now, now - 60_000)])
    run(uri, now_ms=now + 1, order="event-time", key_ttl_ms=10_000)
    assert compacted(uri) == {b"b": b"fresh"}


def test_changing_the_order_needs_a_rewrite(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    recs = [Rec(b"a", b"new", BASE + 10, BASE + 500), Rec(b"a", b"late", BASE + 20, BASE + 100),
            Rec(b"b", b"x", BASE + 30, None)]
    write(uri, recs)
    run(uri)
    assert compacted(uri) == {b"a": b"late", b"b": b"x"}
    with pytest.raises(InvalidInputError, match="--rewrite"):
        Compactor(uri, CompactionConfig(order="event-time")).run()
    assert compacted(uri) == {b"a": b"late", b"b": b"x"}  # nothing changed
    s = run(uri, order="event-time", rewrite=True)
    assert compacted(uri) == {b"a": b"new", b"b": b"x"}
    assert TopicMetadata.open(uri).load_compaction().order.order == "event-time"
    assert s.records_read >= 3  # type: ignore[attr-defined]
    # and back
    run(uri, order="offset", rewrite=True)
    assert compacted(uri) == {b"a": b"late", b"b": b"x"}


def test_late_record_loses_across_runs(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write(uri, [Rec(b"a", b"current", BASE + 10, BASE + 1000)])
    run(uri, order="event-time")
    write(uri, [Rec(b"a", b"late", BASE + 20, BASE + 999), Rec(b"a", None, BASE + 30, BASE + 998)])
    run(uri, order="event-time")
    assert compacted(uri) == {b"a": b"current"}
    for _ in range(2):  # and on any run after
        write(uri, [Rec(b"z", b"other", BASE + 40, BASE + 1)])
        run(uri, order="event-time")
        assert compacted(uri)[b"a"] == b"current"
    write(uri, [Rec(b"a", b"newer", BASE + 50, BASE + 1001)])
    run(uri, order="event-time")
    assert compacted(uri)[b"a"] == b"newer"


def test_verify_recomputes_in_the_views_order(tmp_path: Path) -> None:
    """A view that says it is in event-time order but holds the last-written records is
    found stale (and the same view said to be in offset order is not)."""
    uri = str(tmp_path / "t")
    write(uri, [Rec(b"a", b"new", BASE + 10, BASE + 500), Rec(b"a", b"late", BASE + 20, BASE + 100)])
    run(uri)
    meta = TopicMetadata.open(uri)
    state = meta.load_compaction()
    meta.publish_compaction(dataclasses.replace(state, order=TopicOrder("event-time")), state)
    report = verify_topic(meta)
    assert not report.ok and report.stale == 1, report.human()


def test_verify_expects_expired_keys_gone(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    now = BASE + 1_000_000
    write(uri, [Rec(b"a", b"old", now - 5000, None), Rec(b"b", b"fresh", now - 10, None)])
    run(uri, now_ms=now, key_ttl_ms=1000)
    meta = TopicMetadata.open(uri)
    state = meta.load_compaction()
    # the same view, but said to have no TTL: a is missing from it
    meta.publish_compaction(dataclasses.replace(state, order=TopicOrder()), state)
    report = verify_topic(meta)
    assert not report.ok and report.missing == 1, report.human()
