"""The Spark engine in event-time order and with a key TTL, on real PySpark in local
mode: the same compacted view and the same summary counts as the local engine, and both
as the dict model of :mod:`tests.compactor.test_event_order` (aged by hand), over
incremental rounds, previous parts settled through the filter of new keys, the TTL's
boundary, late records and tombstones, and a ``--rewrite`` into event order from the
command line."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shale.compactor import CompactionConfig, Compactor, RunSummary
from shale.compactor.spark import SparkOptions
from shale.compactor.spark.engine import SparkEngine
from shale.metadata.topic import TopicMetadata
from tests.compactor.spark.test_spark import compacted, figures
from tests.compactor.test_event_order import BASE, Rec, _random_records, entry_times, write
from tests.conftest import SPARK_APIS, run_cli_here, spark_session

pytestmark = pytest.mark.slow
RETAIN = 10**12  # tombstones stay: a late record older than a delete keeps losing to it


@pytest.fixture(scope="module", params=SPARK_APIS)
def engine(request: pytest.FixtureRequest) -> Iterator[SparkEngine]:
    """In a classic session, then as a Spark Connect client of the same application."""
    eng = SparkEngine(SparkOptions(master="local[2]", split_bytes=1 << 16, split_records=40, reduce_partitions=3,
                                   conf=(("spark.ui.enabled", "false"),)), session=spark_session(request.param))
    yield eng
    eng.close()  # (leaves the shared application running)


def aged(recs: list[Rec], times: list[int], *, order: str, cutoff: int) -> dict[bytes, bytes]:
    """:func:`model` with a key TTL: the live keys whose winner's time is not before ``cutoff``
    (its event time under event order, else its entry's publish time)."""
    best: dict[bytes, tuple[int, Rec]] = {}
    for r, t in zip(recs, times, strict=True):
        cur = best.get(r.key)
        if order == "offset" or cur is None or t >= cur[0]:
            best[r.key] = (t, r)
    if order == "offset":  # aged by publish time (these records are written one to an entry)
        best = {k: (r.publish, r) for k, (_, r) in best.items()}
    return {k: r.value for k, (t, r) in best.items() if r.value is not None and t >= cutoff}


def as_dict(uri: str) -> dict[bytes, bytes]:
    """The live keys of the compacted view (one record a key once compacted)."""
    return {k: v for _, k, v, _ in compacted(uri) if k is not None and v is not None}


def both(local_uri: str, spark_uri: str, engine: SparkEngine, now_ms: int, **kw: Any) -> RunSummary:
    """One run of each engine with the same settings at ``now_ms``: the same compacted
    view (ids, keys, values) and the same counts; the Spark run's summary."""
    cfg = CompactionConfig(**kw)
    a = Compactor(local_uri, cfg, clock=lambda: now_ms / 1000).run()
    b = Compactor(spark_uri, cfg, clock=lambda: now_ms / 1000, engine=engine).run()
    assert a.ok and b.ok, (a.human(), b.human())
    assert (a.engine, b.engine) == ("local", "spark")
    # (the engines cut parts differently, so which they keep in place and which they copy may differ)
    counts = [{**figures(s), "records_written": s.records_written + s.records_reused, "keys_expired": s.keys_expired}
              for s in (a, b)]
    assert counts[0] == counts[1]
    assert compacted(local_uri) == compacted(spark_uri)
    assert TopicMetadata.open(spark_uri).load_compaction().order == cfg.topic_order
    return b


@pytest.mark.parametrize("order", ["event-time", "offset"])
def test_random_rounds_match_the_local_engine_and_the_model(engine: SparkEngine, tmp_path: Path,
                                                            order: str) -> None:
    """A first round over many keys, then small ones: the previous parts outweigh the new
    records, so their tasks settle the keys surely not new themselves (aging them too),
    and only the rest crosses the shuffle with its time.  The TTL's cutoff moves up a
    little every round, from the oldest time on (a winner exactly at the cutoff stays)."""
    rng = random.Random(11 if order == "event-time" else 12)
    uris = str(tmp_path / "local"), str(tmp_path / "spark")
    ttl = 10**6
    every: list[Rec] = []
    times: list[int] = []
    expired = 0
    settled = []  # rounds whose busiest reduce task saw fewer keys than the view holds (parts settled)
    for rnd in range(4):
        recs = _random_records(rng, 400 if rnd == 0 else rng.randrange(5, 30), 150, len(every))
        for uri in uris:
            write(uri, recs)
        every += recs
        times += entry_times(recs, 1)
        # (event times spread over 50 s, publish times over the 6.5 s the records were written in)
        cutoff = BASE + (6_000 if order == "event-time" else 1_000) * rnd
        b = both(*uris, engine, cutoff + ttl, order=order, key_ttl_ms=ttl, delete_retention_ms=RETAIN,
                    reuse_min_bytes=0 if rnd % 2 else 1 << 40)
        assert as_dict(uris[1]) == aged(every, times, order=order, cutoff=cutoff), f"round {rnd}"
        expired += b.keys_expired
        if rnd and b.map_keys * 4 < b.keys + b.tombstones_kept:
            settled.append(rnd)
    assert expired > 0 and settled
    assert b.tombstones_kept > 0


def test_late_records_equal_and_missing_times_and_the_ttl_boundary(engine: SparkEngine, tmp_path: Path) -> None:
    uris = str(tmp_path / "local"), str(tmp_path / "spark")
    ttl = 1_000
    first = [Rec(b"a", b"new", BASE + 10, BASE + 500), Rec(b"a", b"late", BASE + 20, BASE + 300),
             Rec(b"b", b"one", BASE + 30, BASE + 200), Rec(b"b", b"two", BASE + 40, BASE + 200),  # tie: later wins
             Rec(b"c", b"v", BASE + 50, BASE + 900), Rec(b"c", None, BASE + 60, BASE + 800),  # late delete loses
             Rec(b"d", b"v", BASE + 70, BASE + 150), Rec(b"d", None, BASE + 80, BASE + 180),  # newer delete wins
             Rec(b"f", b"at", BASE + 90, BASE + 120),  # exactly at the cutoff: stays
             Rec(b"g", b"past", BASE + 100, BASE + 119),  # a millisecond older: expires
             Rec(b"h", None, BASE + 110, BASE + 119)]  # an expired delete goes as a dropped tombstone
    # one entry of three: the untimed record counts as the entry's publish time (BASE + 400)
    untimed = [Rec(b"e", b"timed", BASE + 200, BASE + 350), Rec(b"e", b"untimed", BASE + 300, None),
               Rec(b"z", b"x", BASE + 400, BASE + 700)]
    for uri in uris:
        write(uri, first)
        write(uri, untimed, batch=3)
    b = both(*uris, engine, BASE + 120 + ttl, order="event-time", key_ttl_ms=ttl, delete_retention_ms=RETAIN)
    assert as_dict(uris[1]) == {b"a": b"new", b"b": b"two", b"c": b"v", b"e": b"untimed", b"f": b"at",
                                b"z": b"x"}
    assert (b.keys, b.keys_expired, b.tombstones_kept, b.tombstones_dropped) == (6, 1, 1, 1)
    # later: late records lose to the compacted view's winners, a tie goes to the newer
    # record, a late value loses to a kept delete, a timed record older than the untimed
    # one's entry loses to it
    late = [Rec(b"a", b"late-2", BASE + 500, BASE + 499), Rec(b"c", None, BASE + 510, BASE + 899),
            Rec(b"b", b"three", BASE + 520, BASE + 200), Rec(b"d", b"late", BASE + 530, BASE + 170),
            Rec(b"e", b"older", BASE + 540, BASE + 399), Rec(b"f", b"newer", BASE + 550, BASE + 130)]
    for uri in uris:
        write(uri, late)
    # f's first record is past the moved cutoff now, its newer one is not
    b = both(*uris, engine, BASE + 125 + ttl, order="event-time", key_ttl_ms=ttl, delete_retention_ms=RETAIN)
    assert as_dict(uris[1]) == {b"a": b"new", b"b": b"three", b"c": b"v", b"e": b"untimed", b"f": b"newer",
                                b"z": b"x"}
    every = first + untimed + late
    times = entry_times(first, 1) + entry_times(untimed, 3) + entry_times(late, 1)
    assert as_dict(uris[1]) == aged(every, times, order="event-time", cutoff=BASE + 125)
    # and with nothing new, the keys whose time passes the TTL go in both engines (a's
    # winner is exactly at the cutoff: it stays)
    b = both(*uris, engine, BASE + 500 + ttl, order="event-time", key_ttl_ms=ttl, delete_retention_ms=RETAIN)
    assert as_dict(uris[1]) == {b"a": b"new", b"c": b"v", b"z": b"x"}
    assert (b.keys_expired, b.tombstones_dropped, b.tombstones_kept) == (3, 1, 0)


def test_cli_rewrites_a_view_into_event_time_order_with_a_key_ttl(engine: SparkEngine, tmp_path: Path) -> None:
    """``shale compact --engine spark --order event-time --key-ttl 1h``: refused on a view
    compacted in offset order, done with ``--rewrite`` (whose previous parts keep no event
    times: their records are decoded), and the same as the local engine's rewrite."""
    now = int(time.time() * 1000)
    hour = 3_600_000
    recs = [Rec(b"a", b"new", now - 40 * 60_000, now - 10 * 60_000), Rec(b"a", b"late", now - 30 * 60_000,
                                                                          now - 20 * 60_000),
            Rec(b"b", b"old-event", now - 20 * 60_000, now - 3 * hour),  # published lately, its event is old
            Rec(b"c", b"untimed", now - 15 * 60_000, None), Rec(b"d", b"x", now - 5 * hour, now - 5 * hour)]
    uris = str(tmp_path / "local"), str(tmp_path / "spark")
    for uri in uris:
        write(uri, recs)
        assert Compactor(uri).run().ok
        assert as_dict(uri) == {b"a": b"late", b"b": b"old-event", b"c": b"untimed", b"d": b"x"}
    flags = ("--engine", "spark", "--order", "event-time", "--key-ttl", "1h", "--json")
    res = run_cli_here("compact", *flags, uris[1])
    assert res.returncode == 2 and "--rewrite" in res.stderr, res.stderr
    res = run_cli_here("compact", *flags, "--rewrite", uris[1])
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout.splitlines()[-1])
    assert (summary["engine"], summary["status"], summary["keys_expired"]) == ("spark", "compacted", 2), summary
    a = Compactor(uris[0], CompactionConfig(order="event-time", key_ttl_ms=hour, rewrite=True)).run()
    assert a.ok and a.keys_expired == 2
    assert compacted(uris[0]) == compacted(uris[1])
    assert as_dict(uris[1]) == {b"a": b"new", b"c": b"untimed"}
    assert TopicMetadata.open(uris[1]).load_compaction().order.key_ttl_ms == hour
    assert engine.session.range(3).count() == 3  # the command left the shared application running
