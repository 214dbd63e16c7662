"""Durable subscriptions against compaction, retention and garbage collection: the
guarantee that no active subscriber misses a delete, checked with a subscriber that
pauses across the delete retention and against the rules folded in plain Python
(:mod:`tests.compaction_model`); expiry, the ``max-tombstone-hold`` bound, and retention
that keeps what an active subscription has yet to read."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from shale.compactor import CompactionConfig, Compactor, collect_garbage
from shale.compactor.hold import subscription_hold
from shale.compactor.run_many import compact_topic
from shale.ledger.ids import MIN_ID, MessageId
from shale.ledger.record import Message
from shale.maintenance.retention import UnreadRecordsError, retention_cut, truncate
from shale.maintenance.status import status_text, topic_status
from shale.maintenance.subscriptions import subscription_statuses
from shale.maintenance.verify import verify_topic
from shale.metadata.subscriptions import Subscriptions
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from shale.settings import resolve
from tests.compaction_model import CompactionModel, every_record, row
from tests.compactor.test_compaction import Clock

HOUR = 3_600_000
DAY = 24 * HOUR
Items = list[tuple[str, str | None]]


def produce(uri: str, clock: Clock, truth: dict[bytes, bytes], items: Items, *, per_ledger: int = 4) -> None:
    """Append ``items`` (a None value deletes the key) at the clock's time, and fold them
    into ``truth``, the state every key should end in."""
    with TopicWriter(uri, batch_size=2, max_ledger_records=per_ledger, clock=clock) as w:
        for key, value in items:
            w.append(key, value)
            fold(truth, key.encode(), None if value is None else value.encode())


def fold(state: dict[bytes, bytes], key: bytes | None, value: bytes | None) -> None:
    if key is None:
        return
    if value:
        state[key] = value
    else:
        state.pop(key, None)


def consume(state: dict[bytes, bytes], messages: list[Message]) -> None:
    """What a consumer that keeps a table does with the messages it reads."""
    for m in messages:
        fold(state, m.key, m.value)


def view(uri: str) -> list[tuple[str, object, object, object]]:
    return [row(m) for m in TopicReader(uri, read_compacted=True).read()]


def ms(clock: Clock) -> int:
    return int(clock() * 1000)


#: keys deleted (some set again, some deleted twice), others updated, over three rounds
ROUNDS: list[Items] = [[("k1", None), ("k2", None), ("k3", "again")],
                       [("k3", None), ("k4", "v4b"), ("k5", None)],
                       [("k5", "back"), ("k6", None), ("k7", None)]]
CONFIG = CompactionConfig(delete_retention_ms=HOUR, collect_garbage=False)


def pause_across_retention(uri: str, *, subscribed: bool) -> tuple[dict[bytes, bytes], dict[bytes, bytes], Clock,
                                                                    MessageId, CompactionModel]:
    """A consumer reads the compacted view, folds it into its table and pauses; keys are
    deleted and updated over three rounds, each compacted two hours later (the delete
    retention is one hour), checked against the model.  ``subscribed``: the consumer's
    position is its subscription's; else it is kept by hand, as a Kafka consumer's
    would be after its group expired.  Returns the consumer's table, the truth, the
    clock, its position and the model."""
    clock, truth, mine = Clock(time.time()), {}, {}
    produce(uri, clock, truth, [(f"k{i}", f"v{i}") for i in range(10)])
    with TopicReader(uri, read_compacted=True, subscription="app" if subscribed else None) as r:
        consume(mine, r.read())
        at = r.commit() if subscribed else r.position
    model = CompactionModel()
    for items in ROUNDS:
        produce(uri, clock, truth, items)
        clock.advance(2 * HOUR / 1000)
        s = Compactor(uri, CONFIG, clock=clock).run()
        assert s.status == "compacted", s.error or s.message
        records = every_record(uri)
        model.run(records, now_ms=ms(clock), retention_ms=HOUR, hold=at if subscribed else None,
                  max_hold_ms=CONFIG.max_tombstone_hold_ms)
        assert view(uri) == model.rows(records)
    return mine, truth, clock, at, model


def test_a_paused_subscriber_sees_every_delete_across_delete_retention(disk_topic_uri: str) -> None:
    uri = disk_topic_uri
    mine, truth, clock, at, _ = pause_across_retention(uri, subscribed=True)
    meta = TopicMetadata.open(uri)
    # every delete the subscriber has yet to read is still in the view, hours past its retention
    tombstones = {m.key for m in TopicReader(uri, read_compacted=True).read() if m.is_tombstone}
    assert tombstones == {b"k1", b"k2", b"k3", b"k6", b"k7"}
    assert verify_topic(meta).ok  # a held tombstone is no mismatch
    # nothing new: no run republishes the view for the held tombstones
    assert Compactor(uri, CONFIG, clock=clock).run().status == "nothing-to-do"
    # garbage collection takes what the runs retired; retention keeps what the subscriber has yet to read
    gc = collect_garbage(meta, now_ms=ms(clock), grace_ms=0, orphan_grace_ms=CONFIG.orphan_grace_ms)
    assert gc.retired_deleted
    horizon = meta.load_compaction().horizon
    assert horizon is not None
    with pytest.raises(UnreadRecordsError, match=r"subscription 'app' has yet to read.*--allow-unread"):
        truncate(meta, horizon.ledger)
    # (by the run's clock, hours ahead of the store's, whose Date has whole seconds only)
    assert retention_cut(meta, older_than_ms=0, now_ms=ms(clock)) == at.ledger  # stops at its first unread ledger
    # the subscriber comes back: its table is the truth, every delete included
    with TopicReader(uri, read_compacted=True, subscription="app") as r:
        consume(mine, r.read())
        r.commit()
    assert mine == truth
    # read past them, the tombstones go by their retention alone: with the next run, with nothing new to read
    s = Compactor(uri, CONFIG, clock=clock).run()
    assert (s.status, s.tombstones_dropped, s.tombstones_kept) == ("compacted", 3, 2), s  # k6, k7: kept 0 h
    clock.advance(HOUR / 1000)
    s = Compactor(uri, CONFIG, clock=clock).run()
    assert (s.status, s.tombstones_dropped, s.tombstones_kept) == ("compacted", 2, 0), s
    assert truncate(meta, horizon.ledger).removed


def test_without_a_subscription_a_paused_consumer_misses_deletes(tmp_path: Path) -> None:
    """What the subscription closes: the same consumer, its position kept by hand, comes
    back to a view whose tombstones went past their retention (Kafka's hole)."""
    uri = str(tmp_path / "t")
    mine, truth, _, at, _ = pause_across_retention(uri, subscribed=False)
    with TopicReader(uri, read_compacted=True, start=at) as r:
        consume(mine, r.read())
    assert set(mine) - set(truth) == {b"k1", b"k2", b"k3"}  # deleted over an hour before: it never learnt


def test_a_plain_subscriber_keeps_the_ledgers_it_has_yet_to_read_from_retention(tmp_path: Path) -> None:
    """Retention as a policy, applied by compact after each publish, removes only the
    ledgers the subscription has read; the subscriber comes back without a gap."""
    uri = str(tmp_path / "t")
    clock, truth, mine = Clock(time.time() - 10 * HOUR / 1000), {}, {}
    produce(uri, clock, truth, [(f"k{i % 9}", None if i % 7 == 3 else f"v{i}") for i in range(24)])
    with TopicReader(uri, subscription="plain") as r:
        consume(mine, r.read(limit=10))  # into the third ledger of four records each
        assert r.commit() == MessageId(3, 0, 2)  # past the 10th record, 3:0:1
    meta = TopicMetadata.open(uri)
    meta.update_policy({"retention_ms": HOUR, "delete_retention_ms": 0})
    settings = resolve("compact", {"topics": [uri]})
    produce(uri, clock, truth, [("k1", "newer")])
    s = compact_topic(uri, settings)
    assert s.status == "compacted" and "retention removed 2 ledgers" in s.message, s.message
    assert meta.load_topic().ledgers[0].id == 3
    with TopicReader(uri, subscription="plain") as r:  # no gap: on_gap is error
        consume(mine, r.read())
        r.commit()
    assert mine == truth
    produce(uri, clock, truth, [("k2", "newest")])
    s = compact_topic(uri, settings)
    assert "retention removed 5 ledgers" in s.message, s.message  # all it read, up to the horizon


def test_an_expired_subscription_holds_nothing_back_and_says_so(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    clock, truth = Clock(time.time()), {}
    produce(uri, clock, truth, [("a", "1"), ("b", "2"), ("a", None), ("c", "3")])
    meta = TopicMetadata.open(uri)
    subs = Subscriptions(meta)
    subs.create("idle", MIN_ID, now_ms=ms(clock) - 8 * DAY)  # last committed eight days ago
    subs.create("late", MIN_ID, now_ms=ms(clock) - 2 * DAY)
    doc = topic_status(uri)
    assert [(s["name"], s["state"], s["lag_records"]) for s in doc["subscriptions"]] == [
        ("idle", "expired", 4), ("late", "active", 4)]
    assert doc["slowest_subscription"]["name"] == "late"
    assert "expired (holding nothing back): idle" in status_text(doc)
    # with the default expiry (7 days) only "late" holds the tombstone; with 1 day none does
    config = CompactionConfig(delete_retention_ms=0)
    assert Compactor(uri, config, clock=clock).run().tombstones_kept == 1
    s = Compactor(uri, CompactionConfig(delete_retention_ms=0, subscription_expiry_ms=DAY), clock=clock).run()
    assert (s.status, s.tombstones_dropped, s.tombstones_kept) == ("compacted", 1, 0)
    # the topic's policy sets the expiry compact applies, and retention judges by it too
    meta.update_policy({"subscription_expiry_ms": DAY})
    assert CompactionConfig.from_settings(resolve("compact", {}).with_policy(meta.load_policy().to_json())
                                          ).subscription_expiry_ms == DAY
    assert truncate(meta, 2, allow_uncompacted=True).removed  # no active subscription has yet to read it


def test_max_tombstone_hold_bounds_a_subscriber_that_never_moves(tmp_path: Path) -> None:
    """A subscriber that keeps committing the same position (alive, but stuck) holds a
    tombstone only until it has been kept max-tombstone-hold."""
    uri = str(tmp_path / "t")
    clock, truth = Clock(time.time()), {}
    produce(uri, clock, truth, [("a", "1"), ("b", "2"), ("a", None), ("c", "3"), ("b", None)])
    subs = Subscriptions(TopicMetadata.open(uri), clock=clock)  # (commits stamped days ahead, by the test's clock)
    stuck = subs.create("stuck", MIN_ID, now_ms=ms(clock))
    config = CompactionConfig(delete_retention_ms=HOUR, max_tombstone_hold_ms=2 * DAY)
    model = CompactionModel()

    def day(days: float, status: str) -> None:
        nonlocal stuck
        clock.advance(days * DAY / 1000)
        stuck = subs.commit(stuck, MIN_ID, now_ms=ms(clock))  # still active, still at the start
        s = Compactor(uri, config, clock=clock).run()
        assert s.status == status, s
        if status == "compacted":
            model.run(every_record(uri), now_ms=ms(clock), retention_ms=HOUR, hold=MIN_ID, max_hold_ms=2 * DAY)
        assert view(uri) == model.rows(every_record(uri))

    day(0, "compacted")  # first kept now
    day(1, "nothing-to-do")  # past the retention, held
    day(0.5, "nothing-to-do")
    day(0.5, "compacted")  # kept two days: dropped whatever the subscription
    assert not any(m.is_tombstone for m in TopicReader(uri, read_compacted=True).read())
    # max-tombstone-hold 0: subscriptions hold no tombstone back
    produce(uri, clock, truth, [("c", None)])
    s = Compactor(uri, CompactionConfig(delete_retention_ms=0, max_tombstone_hold_ms=0), clock=clock).run()
    assert (s.tombstones_dropped, s.tombstones_kept) == (1, 0)


def test_the_summary_counts_the_tombstones_held_for_subscriptions(tmp_path: Path) -> None:
    """The run's summary says how many of the tombstones it kept are past their delete
    retention, kept only for a subscription that has yet to read them."""
    uris = {name: str(tmp_path / name) for name in ("subscribed", "alone")}
    clock = Clock(time.time())
    config = CompactionConfig(delete_retention_ms=HOUR, collect_garbage=False)
    for name, uri in uris.items():
        produce(uri, clock, {}, [("a", "1"), ("b", "2"), ("c", "3"), ("a", None), ("b", None)])
        if name == "subscribed":
            Subscriptions(TopicMetadata.open(uri), clock=clock).create("slow", MIN_ID, now_ms=ms(clock))
        first = Compactor(uri, config, clock=clock).run()
        assert (first.tombstones_kept, first.tombstones_held) == (2, 0)  # within their retention
    clock.advance(2 * HOUR / 1000)
    runs = {}
    for name, uri in uris.items():
        produce(uri, clock, {}, [("c", None), ("d", "4")])
        runs[name] = Compactor(uri, config, clock=clock).run()
    held = runs["subscribed"]
    assert (held.tombstones_kept, held.tombstones_held, held.tombstones_dropped) == (3, 2, 0)
    assert "tombstones kept 3 (2 held for subscriptions) dropped 0" in held.human()
    assert held.to_json()["tombstones_held"] == 2
    alone = runs["alone"]
    assert (alone.tombstones_kept, alone.tombstones_held, alone.tombstones_dropped) == (1, 0, 2)
    assert "held for subscriptions" not in alone.human()


def test_a_subscription_inside_a_compacted_part_holds_only_the_tombstones_after_it(tmp_path: Path) -> None:
    """The hold starts at the subscription's position, found in a compacted part's footer
    when it falls inside one: the tombstones before it go with their retention."""
    uri = str(tmp_path / "t")
    clock, truth = Clock(time.time()), {}
    items: Items = [(f"k{i}", f"v{i}") for i in range(8)] + [(f"k{i}", None) for i in range(8)]
    produce(uri, clock, truth, items, per_ledger=100)  # one ledger, entries of two records
    config = CompactionConfig(delete_retention_ms=HOUR)
    assert Compactor(uri, config, clock=clock).run().tombstones_kept == 8
    Subscriptions(TopicMetadata.open(uri)).create("mid", MessageId(1, 5, 1))  # the 12th record: k3's tombstone
    clock.advance(2 * HOUR / 1000)
    s = Compactor(uri, config, clock=clock).run()
    assert (s.tombstones_dropped, s.tombstones_kept) == (3, 5)
    assert [m.key for m in TopicReader(uri, read_compacted=True).read()] == [f"k{i}".encode() for i in range(3, 8)]


def test_a_run_with_nothing_new_leaves_retained_keyless_records_alone(tmp_path: Path) -> None:
    """Keyless records without a value (kept with retain-null-key) are no tombstones: a
    run with nothing new has nothing to drop, with or without subscriptions."""
    uri = str(tmp_path / "t")
    with TopicWriter(uri) as w:
        w.append(None, None)
        w.append("a", "1")
    Subscriptions(TopicMetadata.open(uri)).create("app")
    config = CompactionConfig(delete_retention_ms=0, retain_null_key=True)
    assert Compactor(uri, config).run().keyless_kept == 1
    assert Compactor(uri, config).run().status == "nothing-to-do"


def test_the_hold_starts_at_the_least_position_of_the_active_subscriptions(tmp_path: Path) -> None:
    """Two active subscriptions at different positions, and an expired one at the start:
    the tombstones from the slower active one's position on are held past their
    retention, those before it go with it."""
    uri = str(tmp_path / "t")
    clock, truth = Clock(time.time()), {}
    items: Items = [(f"k{i}", f"v{i}") for i in range(8)] + [(f"k{i}", None) for i in range(8)]
    produce(uri, clock, truth, items, per_ledger=100)  # one ledger, entries of two records
    config = CompactionConfig(delete_retention_ms=HOUR)
    assert Compactor(uri, config, clock=clock).run().tombstones_kept == 8
    meta = TopicMetadata.open(uri)
    subs = Subscriptions(meta)
    subs.create("fast", MessageId(1, 7, 0), now_ms=ms(clock))  # the 15th record: k6's tombstone
    subs.create("slow", MessageId(1, 5, 1), now_ms=ms(clock))  # the 12th: k3's tombstone
    subs.create("gone", MIN_ID, now_ms=ms(clock) - 8 * DAY)  # expired: holds nothing
    assert subscription_hold(meta, config, ms(clock)) == MessageId(1, 5, 1)
    clock.advance(2 * HOUR / 1000)
    s = Compactor(uri, config, clock=clock).run()
    assert (s.tombstones_dropped, s.tombstones_kept) == (3, 5)
    assert [m.key for m in TopicReader(uri, read_compacted=True).read()] == [f"k{i}".encode() for i in range(3, 8)]


@pytest.mark.parametrize("since_commit", [DAY - 1, DAY])
def test_a_subscription_expires_once_exactly_the_expiry_has_passed_since_its_commit(tmp_path: Path,
                                                                                   since_commit: int) -> None:
    """``subscription-expiry`` 1 day: a subscription that last committed a day ago to the
    millisecond holds nothing back and is shown expired; a millisecond less, it is active
    and holds its tombstone (what the docs say: one that has not committed for this long
    holds nothing back)."""
    uri = str(tmp_path / "t")
    clock, truth = Clock(time.time()), {}
    produce(uri, clock, truth, [("a", "1"), ("b", "2"), ("a", None), ("c", "3")])
    meta = TopicMetadata.open(uri)
    meta.update_policy({"subscription_expiry_ms": DAY})
    now = ms(clock)  # the time the compactor takes from the clock, to the millisecond
    Subscriptions(meta).create("edge", MIN_ID, now_ms=now - since_commit)
    active = since_commit < DAY
    config = CompactionConfig(delete_retention_ms=0, subscription_expiry_ms=DAY)
    assert subscription_hold(meta, config, now) == (MIN_ID if active else None)
    assert [(st.subscription.name, st.active) for st in subscription_statuses(meta, now_ms=now)] == [("edge", active)]
    s = Compactor(uri, config, clock=clock).run()
    assert (s.status, s.tombstones_kept, s.tombstones_dropped) == ("compacted", int(active), int(not active)), s
