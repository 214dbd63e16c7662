"""Every reader of "the latest value" decides it by the topic's order and hides expired
keys, against a dict model: the table (``read --table``, ``export --table``,
:func:`~shale.reader.latest.table_messages`), point lookups (``get``,
:func:`~shale.reader.lookup`), :class:`~shale.reader.TableView` (its mapping, its refreshes
and :meth:`~shale.reader.TableView.to_arrow`).

Before the first compaction the order comes from the topic's policy; once a compacted
view is published, from the view (it wins over the policy).  The records cover
out-of-order, equal and missing event times (a record without one counts as the publish
time of its entry, which can be later than its own), late tombstones, keyless records and
the key TTL at its boundary: a winner exactly TTL old is kept, one a millisecond older is
not.  The readers that take an explicit "now" are checked at that boundary; those that
read the clock (the commands) are checked a day away from any boundary.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from shale.compactor import CompactionConfig, Compactor
from shale.ledger.ordering import EVENT_TIME, OFFSET, TopicOrder
from shale.ledger.record import Record
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TableView, lookup
from shale.reader import latest as latest_module
from shale.reader.latest import plan_latest, table_messages
from tests.conftest import run_cli_here

DAY = 86_400_000
TTL = 7 * DAY
#: when the test starts: every publish time is before it, and the clock after it
T = int(time.time() * 1000)
#: the "now" the readers that take one are asked at (a day ahead: the key TTL's boundary
#: then lies a day away from the clock's, for the readers that read it)
N = T + DAY


@dataclass(frozen=True)
class Rec:
    key: str | None
    value: str | None  # None: a tombstone
    event: int | None
    publish: int


@dataclass(frozen=True)
class Round:
    """Records written by one writer, ``batch`` to an entry."""

    recs: tuple[Rec, ...]
    batch: int


def _at(start: int, items: list[tuple[str | None, str | None, int | None]]) -> tuple[Rec, ...]:
    return tuple(Rec(k, v, e, start + i * 1000) for i, (k, v, e) in enumerate(items))


#: older records: out of order, equal, missing event times, late and winning tombstones
ROUND_A = Round(_at(T - 8 * DAY, [
    ("ooo", "v1", T - DAY), ("ooo", "v0-late", T - 2 * DAY),
    ("eq", "first", T - DAY), ("eq", "second", T - DAY),
    ("tomb", "alive", T - DAY), ("tomb", None, T - 2 * DAY),
    ("del", "x", T - 2 * DAY), ("del", None, T - DAY),
    ("noev", "a", None), ("noev", "b", T - 9 * DAY),
    (None, "keyless", None), ("old", "o", T - 20 * DAY),
]), batch=2)
#: the key TTL's boundary at N, one record an entry (each its own publish time)
ROUND_EDGE = Round((
    Rec("edge-pub-old", "p1", None, N - TTL - 1),
    Rec("edge-pub-ok", "p2", None, N - TTL),
    Rec("edge-ev-old", "e1", N - TTL - 1, N - TTL),
    Rec("edge-ev-ok", "e2", N - TTL, N - TTL),
), batch=1)
#: newer records, with late ones for keys the earlier rounds decided
ROUND_B = Round(_at(T - 3 * DAY, [
    # one entry: the first record has no event time and counts as the entry's publish
    # time (its partner's, a second later), not its own, which is older than its partner's event time
    ("pub", "entry-time", None), ("pub", "own-time-would-lose", T - 3 * DAY + 500),
    ("ooo", "v2-late", T - DAY - DAY // 2), ("tomb", None, T - DAY - DAY // 2),
    ("del", "revived-late", T - DAY - DAY // 2), ("eq", "third", T - DAY),
    ("fresh", "f", None), (None, "keyless", T),
]), batch=2)
KEYS = sorted({r.key for rd in (ROUND_A, ROUND_EDGE, ROUND_B) for r in rd.recs if r.key} | {"never"})


def write(uri: str, *rounds: Round) -> None:
    for rd in rounds:
        # (entries of `batch` records: a multiple of it fills a ledger)
        with TopicWriter(uri, batch_size=rd.batch, max_ledger_records=4 * rd.batch) as w:
            for r in rd.recs:
                w.send(Record(r.key.encode() if r.key is not None else None,
                              r.value.encode() if r.value is not None else None, {}, r.publish, r.event))


def model(rounds: list[Round], order: TopicOrder, now: int) -> dict[str, str]:
    """The live keys after folding every record in id order."""
    best: dict[str, tuple[int, int, Rec]] = {}
    pos = 0
    for rd in rounds:
        for a in range(0, len(rd.recs), rd.batch):
            entry = rd.recs[a:a + rd.batch]
            published = max(r.publish for r in entry)  # the entry's publish time
            for r in entry:
                pos += 1
                if r.key is None:
                    continue
                t = published if r.event is None or not order.by_event_time else r.event
                held = best.get(r.key)
                if not order.by_event_time or held is None or (t, pos) >= held[:2]:
                    best[r.key] = (t, pos, r)
    return {k: r.value for k, (t, _, r) in best.items()
            if r.value is not None and not (order.key_ttl_ms and t < now - order.key_ttl_ms)}


def text(data: dict[bytes, bytes | None]) -> dict[str, str]:
    return {k.decode(): (v or b"").decode() for k, v in data.items()}


def exact_readers(uri: str, now: int, keys: list[str] = KEYS) -> dict[str, dict[str, str]]:
    """What each reader that takes "now" gives at ``now`` (``keys`` looked up)."""
    meta = TopicMetadata.open(uri)
    table = list(table_messages(meta, now_ms=now))
    assert [m.id for m in table] == sorted(m.id for m in table)  # in id order
    got = {"table": text({m.key or b"": m.value for m in table})}
    found = {k: lookup(meta, k.encode(), now_ms=now) for k in keys}
    got["lookup"] = {k: (f.value or b"").decode() for k, f in found.items() if f.value is not None}
    view = TableView(uri, clock=lambda: (now + 0.5) / 1000)
    got["TableView"] = text(dict(view))
    rows = view.to_arrow().to_pylist()
    got["TableView.to_arrow"] = text({r["key"]: r["value"] for r in rows})
    assert [(r["ledger"], r["entry"], r["batch"]) for r in rows] == sorted((m.id.ledger, m.id.entry, m.id.batch)
                                                                             for m in view.messages())
    return got


def clock_readers(uri: str, tmp: Path, keys: list[str] = KEYS) -> dict[str, dict[str, str]]:
    """What each command gives (each reads the clock)."""
    out = run_cli_here("read", uri, "--table")
    assert out.returncode == 0, out.stderr
    got = {"read --table": {(d := json.loads(line))["key"]: d["value"] for line in out.stdout.splitlines()}}
    target = tmp / "table.jsonl"
    out = run_cli_here("export", uri, str(target), "--table", "--overwrite")
    assert out.returncode == 0, out.stderr
    got["export --table"] = {(d := json.loads(line))["key"]: d["value"]
                             for line in target.read_text().splitlines()}
    gets = {}
    for k in keys:
        out = run_cli_here("get", uri, k)
        assert out.returncode in (0, 5), out.stderr
        if out.returncode == 0:
            gets[k] = json.loads(out.stdout)["value"]
    got["get"] = gets
    return got


def check(uri: str, tmp: Path, rounds: list[Round], order: TopicOrder, keys: list[str] = KEYS) -> None:
    want = model(rounds, order, N)
    got = exact_readers(uri, N, keys)
    assert got == dict.fromkeys(("table", "lookup", "TableView", "TableView.to_arrow"), want)
    # the clock is within a day of T: no key's winner is near the TTL's boundary there
    want = model(rounds, order, T)
    assert want == model(rounds, order, T + DAY - 1)
    assert clock_readers(uri, tmp, keys) == dict.fromkeys(("read --table", "export --table", "get"), want)


ORDERS = [TopicOrder(EVENT_TIME), TopicOrder(EVENT_TIME, TTL), TopicOrder(OFFSET, TTL), TopicOrder()]


@pytest.mark.parametrize("order", ORDERS, ids=lambda o: o.describe())
def test_before_the_first_compaction_readers_follow_the_policy(tmp_path: Path, order: TopicOrder) -> None:
    uri = str(tmp_path / "t")
    rounds = [ROUND_A, ROUND_EDGE, ROUND_B]
    write(uri, *rounds)
    for setting in (f"order={order.order}", f"key-ttl={order.key_ttl_ms}ms"):
        assert run_cli_here("config", uri, "--set", setting).returncode == 0
    check(uri, tmp_path, rounds, order)
    # the case is one where the order matters
    if order.by_event_time:
        assert model(rounds, order, N) != model(rounds, TopicOrder(OFFSET, order.key_ttl_ms), N)
    if order.key_ttl_ms:
        assert model(rounds, order, N) != model(rounds, TopicOrder(order.order), N)
        assert {"edge-pub-ok", "edge-ev-ok"} <= model(rounds, order, N).keys()


@pytest.mark.parametrize("order", ORDERS[:3], ids=lambda o: o.describe())
def test_a_compacted_view_and_the_tail_above_it(tmp_path: Path, order: TopicOrder) -> None:
    """The view compacted in the order, then late records above its horizon; then the
    next incremental run."""
    uri = str(tmp_path / "t")
    config = CompactionConfig(order=order.order, key_ttl_ms=order.key_ttl_ms)
    write(uri, ROUND_A, ROUND_EDGE)
    assert Compactor(uri, config).run().status == "compacted"
    state = TopicMetadata.open(uri).load_compaction()
    assert state.order == order
    write(uri, ROUND_B)
    rounds = [ROUND_A, ROUND_EDGE, ROUND_B]
    check(uri, tmp_path, rounds, order)
    assert Compactor(uri, config).run().status == "compacted"
    check(uri, tmp_path, rounds, order)


def test_the_published_views_order_wins_over_the_policy(tmp_path: Path) -> None:
    """A view compacted in offset order is read in offset order whatever the policy says
    since; a view whose state says event-time order is read so (its parts here written by
    a run that kept no event times: the readers decode them)."""
    uri = str(tmp_path / "t")
    below = Round(_at(T - 5 * DAY, [("k", "old", T - 2 * DAY), ("k", "new", T - DAY), ("j", "j1", None)]), batch=1)
    late = Round(_at(T - 4 * DAY, [("k", "late", T - 3 * DAY), ("j", "j-late", T - 6 * DAY)]), batch=1)
    write(uri, below)
    assert Compactor(uri, CompactionConfig(event_times=False)).run().status == "compacted"
    write(uri, late)
    meta = TopicMetadata.open(uri)
    meta.update_policy({"order": EVENT_TIME})
    check(uri, tmp_path, [below, late], TopicOrder(), ["k", "j"])
    assert model([below, late], TopicOrder(), N) == {"k": "late", "j": "j-late"}
    meta.update_compaction(lambda s: dataclasses.replace(s, order=TopicOrder(EVENT_TIME)))
    check(uri, tmp_path, [below, late], TopicOrder(EVENT_TIME), ["k", "j"])
    assert model([below, late], TopicOrder(EVENT_TIME), N) == {"k": "new", "j": "j1"}


def test_a_table_view_refreshes_in_the_topics_order(tmp_path: Path) -> None:
    """Late records and late tombstones read by a refresh change nothing and tell no
    listener; keys that expire between refreshes are dropped and told as deletions."""
    uri = str(tmp_path / "t")
    order = TopicOrder(EVENT_TIME, TTL)
    write(uri, ROUND_A, ROUND_EDGE)
    TopicMetadata.open(uri).update_policy({"order": EVENT_TIME, "key_ttl_ms": TTL})
    now = [N]
    view = TableView(uri, clock=lambda: (now[0] + 0.5) / 1000)
    assert view.order == order
    assert text(dict(view)) == model([ROUND_A, ROUND_EDGE], order, N)
    heard: list[tuple[str, str | None]] = []
    view.listen(lambda k, v: heard.append((k.decode(), None if v is None else v.decode())))
    write(uri, ROUND_B)
    assert view.refresh() == len(ROUND_B.recs)
    assert text(dict(view)) == model([ROUND_A, ROUND_EDGE, ROUND_B], order, N)
    # told of the winners only: none of the late records
    assert heard == [("pub", "entry-time"), ("eq", "third"), ("fresh", "f")]
    heard.clear()
    now[0] = N + 1  # the two keys whose winners are exactly TTL old at N expire
    assert view.refresh() == 0
    assert sorted(heard) == [("edge-ev-ok", None), ("edge-pub-ok", None)]
    assert text(dict(view)) == model([ROUND_A, ROUND_EDGE, ROUND_B], order, N + 1)
    assert text({r["key"]: r["value"] for r in view.to_arrow().to_pylist()}) == text(dict(view))


def test_random_rounds_with_compactions_between(tmp_path: Path) -> None:
    """Random keys, values, tombstones and event times (some missing, many late) in rounds,
    compacted in event-time order with a key TTL between some of them."""
    rnd = random.Random(34)
    uri = str(tmp_path / "t")
    order = TopicOrder(EVENT_TIME, TTL)
    config = CompactionConfig(order=EVENT_TIME, key_ttl_ms=TTL)
    rounds: list[Round] = []
    for n in range(4):
        recs = tuple(Rec(None if rnd.random() < 0.05 else f"k{rnd.randrange(12)}",
                         None if rnd.random() < 0.2 else f"v{n}-{i}",
                         None if rnd.random() < 0.2 else T - rnd.randrange(10 * DAY),
                         T - (9 - n) * DAY + i) for i in range(30))
        rounds.append(Round(recs, rnd.choice([1, 2, 3])))
        write(uri, rounds[-1])
        if n in (1, 2):
            assert Compactor(uri, config).run().status == "compacted"
        if n == 0:
            TopicMetadata.open(uri).update_policy({"order": EVENT_TIME, "key_ttl_ms": TTL})
        want = model(rounds, order, N)
        got = exact_readers(uri, N, [f"k{i}" for i in range(13)])
        assert got == dict.fromkeys(("table", "lookup", "TableView", "TableView.to_arrow"), want)


def test_offset_order_without_a_ttl_reads_no_times(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default decides as it always did: no record's time is looked at."""
    uri = str(tmp_path / "t")
    write(uri, ROUND_A, ROUND_B)

    def no_times(*args: object, **kwargs: object) -> None:
        raise AssertionError("times read under offset order without a TTL")

    monkeypatch.setattr(latest_module, "decoded_times", no_times)
    monkeypatch.setattr(TableView, "_apply", no_times)
    plan = plan_latest(TopicMetadata.open(uri))
    assert plan.order.is_default and plan.expired == 0
    want = model([ROUND_A, ROUND_B], TopicOrder(), N)
    assert text(dict(TableView(uri))) == want


def test_get_says_a_key_expired(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write(uri, ROUND_A)
    TopicMetadata.open(uri).update_policy({"order": EVENT_TIME, "key_ttl_ms": TTL})
    out = run_cli_here("get", uri, "old")
    assert out.returncode == 5 and "(expired)" in out.stderr, out.stderr
    assert run_cli_here("get", uri, "ooo").returncode == 0
    found = lookup(TopicMetadata.open(uri), b"old")
    assert found.expired and found.message is None and found.value is None


def test_to_arrow_does_not_import_pandas(tmp_path: Path) -> None:
    """Arrow out builds its arrays from buffers: ``pa.array`` would import pandas (a fifth
    of a second) in the decode thread."""
    import subprocess
    import sys

    uri = str(tmp_path / "t")
    with TopicWriter(uri) as w:
        for i in range(50):
            w.append(f"k{i % 7}", f"v{i}", event_time=T + i if i % 2 else None)
    code = ("import sys; from shale.reader import TopicReader; "
            f"t = TopicReader({uri!r}).to_arrow(); "
            "assert t.num_rows == 50 and t.column('tombstone').to_pylist() == [False] * 50; "
            "print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
