"""The C kernels' event table (``KeyTable(with_events=True)``, made by
:func:`~shale.ledger.kernels.new_event_key_table`) against a plain dict model: each key
keeps its record with the greatest ``(event time, position)``.

Out-of-order and equal event times (the later position wins), ``NO_EVENT_TIME`` and the
other extremes, chunks with explicit positions and with ``first``, one thread's share of
the hash range (``part_shift``), lookups of positions and event times, growth, crowding
by crafted keys, refused input, and empty input.  Every case has a record whose event
time is older than an earlier one's, so that "the last write wins" fails it.
scripts/sanitize.sh runs this file against a sanitized build.
"""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.ledger import kernels
from shale.ledger.format import NO_EVENT_TIME
from tests.ledger.test_kernels import (
    absent_queries,
    as_bools,
    chunk_bounds,
    crafted_records,
    random_records,
    random_u64,
    u64,
)
from tests.needs import c_extension, needs

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
Key = tuple[int, int]
Winners = dict[Key, tuple[int, int]]  # key -> (event, position) of its winner

I64_MAX = np.iinfo(np.int64).max

pytestmark = [pytest.mark.kernels, needs(c_extension(kernels._native, "ledger/_kernels.c"))]


def new_table(expected: int = 0) -> kernels.EventKeyTable:
    table = kernels.new_event_key_table(expected)
    assert table is not None
    return table


def model(hi: U64, lo: U64, event: I64, pos: I64 | None = None) -> Winners:
    """Each key's greatest ``(event, position)``, in plain Python."""
    positions = range(len(hi)) if pos is None else pos.tolist()
    out: Winners = {}
    for key, e, p in zip(zip(hi.tolist(), lo.tolist(), strict=True), event.tolist(), positions, strict=True):
        if key not in out or (e, p) > out[key]:
            out[key] = (e, p)
    return out


def finished(table: kernels.EventKeyTable, keep: bool = False) -> Winners:
    """The table's read-out as a model, after checking that it is sorted by hash."""
    hi, lo, pos, event = (np.frombuffer(b, dtype=d) for b, d in
                          zip(table.finish(keep=keep), (np.uint64, np.uint64, np.int64, np.int64), strict=True))
    keys = list(zip(hi.tolist(), lo.tolist(), strict=True))
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    return dict(zip(keys, zip(event.tolist(), pos.tolist(), strict=True), strict=True))


def looked_up(table: kernels.EventKeyTable, hi: U64, lo: U64) -> list[tuple[int, int]]:
    """``(event, position)`` the table holds for each key, ``(0, -1)`` where none."""
    pos, event = table.lookup(hi, lo)
    assert len(pos) == len(event) == 8 * len(hi)
    return list(zip(np.frombuffer(event, dtype=np.int64).tolist(), np.frombuffer(pos, dtype=np.int64).tolist(),
                    strict=True))


def expected_lookups(want: Winners, hi: U64, lo: U64) -> list[tuple[int, int]]:
    return [want.get(k, (0, -1)) for k in zip(hi.tolist(), lo.tolist(), strict=True)]


def late_events(rng: np.random.Generator, n: int) -> I64:
    """Rising event times, a tenth of them late (older than records before them), a few
    missing, some equal to the one before."""
    event = np.arange(n, dtype=np.int64) * 10 + 1_700_000_000_000
    late = rng.random(n) < 0.1
    event[late] -= rng.integers(1, 50_000, size=int(late.sum()))
    event[rng.random(n) < 0.02] = NO_EVENT_TIME
    same = np.flatnonzero(rng.random(n) < 0.05)
    event[same[same > 0]] = event[same[same > 0] - 1]
    return event


def assert_not_last_write(want: Winners, hi: U64, lo: U64, pos: I64) -> None:
    last = dict(zip(zip(hi.tolist(), lo.tolist(), strict=True), pos.tolist(), strict=True))
    assert {k: p for k, (_, p) in want.items()} != last


@pytest.mark.parametrize(("expected", "gaps"), [(0, False), (150_000, True)])
def test_event_table_in_chunks_against_the_model(expected: int, gaps: bool) -> None:
    rng = np.random.default_rng(60)
    hi, lo = random_records(rng, 60_000, 200_000)  # more keys than a table of expected=0 holds: it grows
    event = late_events(rng, len(hi))
    # positions with gaps, or index + 5 (some chunks then give only ``first``)
    pos = np.arange(len(hi), dtype=np.int64) * (3 if gaps else 1) + 5
    table = new_table(expected)
    assert table.with_events
    for i, (a, b) in enumerate(chunk_bounds(len(hi), rng)):
        if i % 2 and not gaps:
            assert table.add(hi[a:b], lo[a:b], None, 5 + a, event=event[a:b]) == b - a
        else:
            assert table.add(hi[a:b], lo[a:b], pos[a:b], event=event[a:b]) == b - a
    want = model(hi, lo, event, pos)
    assert_not_last_write(want, hi, lo, pos)
    assert len(table) == len(want)
    assert table.nbytes >= 32 * len(want)
    q_hi, q_lo = absent_queries(rng, hi, lo)
    assert looked_up(table, q_hi, q_lo) == expected_lookups(want, q_hi, q_lo)
    assert as_bools(table.contains(q_hi, q_lo)) == [k in want for k in zip(q_hi.tolist(), q_lo.tolist(), strict=True)]
    assert finished(table) == want
    assert len(table) == 0 and table.nbytes == 0


def test_event_table_with_first_and_equal_events() -> None:
    # one key written five times: the event times go up, back, and repeat
    hi, lo = u64([7] * 5 + [9]), u64([1] * 5 + [2])
    table = new_table()
    assert table.add(hi[:3], lo[:3], None, 100, event=np.array([50, 40, 50], dtype=np.int64)) == 3
    assert finished(table, keep=True) == {(7, 1): (50, 102)}  # equal event: the later position wins
    assert table.add(hi[3:], lo[3:], None, 103, event=np.array([49, 50, 0], dtype=np.int64)) == 3
    assert finished(table, keep=True) == {(7, 1): (50, 104), (9, 2): (0, 105)}
    assert table.add(u64([7]), u64([1]), np.array([99], dtype=np.int64), event=np.array([50], dtype=np.int64)) == 1
    assert finished(table) == {(7, 1): (50, 104), (9, 2): (0, 105)}  # a smaller position at the same event loses


@pytest.mark.parametrize("events", [
    [I64_MAX, NO_EVENT_TIME, NO_EVENT_TIME, I64_MAX - 1, NO_EVENT_TIME],
    [NO_EVENT_TIME, 0, NO_EVENT_TIME, NO_EVENT_TIME, NO_EVENT_TIME],
    [-1, NO_EVENT_TIME + 1, -2, NO_EVENT_TIME, -1],
    [NO_EVENT_TIME] * 5,
])
def test_event_table_on_extreme_event_times(events: list[int]) -> None:
    hi, lo = u64([1, 2, 1, 2, 1]), u64([5, 5, 5, 5, 5])
    event = np.array(events, dtype=np.int64)
    table = new_table()
    assert table.add(hi, lo, event=event) == 5
    want = model(hi, lo, event)
    assert looked_up(table, hi, lo) == expected_lookups(want, hi, lo)
    assert finished(table) == want


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3),
                                   st.sampled_from([NO_EVENT_TIME, -1, 0, 1, 2, I64_MAX])), max_size=12),
                max_size=6))
def test_event_table_on_tiny_colliding_hashes(chunk_records: list[list[tuple[int, int, int]]]) -> None:
    # keys share their high halves, and all sit at the table's first home slot
    table = new_table()
    all_hi, all_lo, all_event = [], [], []
    at = 0
    for recs in chunk_records:
        hi = u64([r[0] << 62 if r[0] & 1 else r[0] for r in recs])
        lo = u64([r[1] for r in recs])
        event = np.array([r[2] for r in recs], dtype=np.int64)
        assert table.add(hi, lo, None, at, event=event) == len(recs)
        all_hi.append(hi)
        all_lo.append(lo)
        all_event.append(event)
        at += len(recs)
    hi = np.concatenate([u64([]), *all_hi])
    lo = np.concatenate([u64([]), *all_lo])
    want = model(hi, lo, np.concatenate([np.zeros(0, dtype=np.int64), *all_event]))
    probe_hi = u64([h << 62 if h & 1 else h for h in range(4) for _ in range(4)])
    probe_lo = u64([x for _ in range(4) for x in range(4)])
    assert looked_up(table, probe_hi, probe_lo) == expected_lookups(want, probe_hi, probe_lo)
    assert finished(table) == want


@pytest.mark.parametrize("part_shift", [63, 62])
def test_event_table_parts_in_threads_together_equal_one_table(part_shift: int) -> None:
    rng = np.random.default_rng(61)
    hi, lo = random_records(rng, 20_000, 80_000)
    event = late_events(rng, len(hi))
    bounds = chunk_bounds(len(hi), rng)
    parts = 1 << (64 - part_shift)

    def build(part: int) -> Winners:
        table = new_table()
        for a, b in bounds:
            assert table.add(hi[a:b], lo[a:b], None, a, part_shift, part, event=event[a:b]) == b - a
        return finished(table)

    with ThreadPoolExecutor(max_workers=parts) as pool:  # adds run without the interpreter lock
        shares = list(pool.map(build, range(parts)))
    want = model(hi, lo, event)
    for part, share in enumerate(shares):
        assert share == {k: w for k, w in want.items() if k[0] >> part_shift == part}
        assert share
    # in hash order, one after the other: the whole map
    assert list(itertools.chain.from_iterable(shares)) == sorted(want)


def test_event_table_lookups_after_finish_keep_and_prepare_lookups() -> None:
    rng = np.random.default_rng(62)
    hi, lo = random_records(rng, 8_000, 30_000)
    hi[:200] = hi[200:400]  # keys sharing a high half
    event = late_events(rng, len(hi))
    table = new_table()
    empty = np.empty(0, dtype=np.uint64)
    assert looked_up(table, hi[:5], lo[:5]) == [(0, -1)] * 5  # nothing added yet
    assert table.lookup(empty, empty) == (bytearray(), bytearray())
    table.add(hi, lo, event=event)
    want = model(hi, lo, event)
    q_hi, q_lo = absent_queries(rng, hi, lo)
    q_hi = np.concatenate([q_hi, random_u64(rng, 2_000)])  # a present low half under another high half
    q_lo = np.concatenate([q_lo, lo[:2_000]])
    answers = expected_lookups(want, q_hi, q_lo)
    assert looked_up(table, q_hi, q_lo) == answers
    table.prepare_lookups()  # the lookup filter
    assert looked_up(table, q_hi, q_lo) == answers
    assert finished(table, keep=True) == want
    assert looked_up(table, q_hi, q_lo) == answers
    with ThreadPoolExecutor(max_workers=2) as pool:  # lookups side by side
        halves = list(pool.map(lambda s: looked_up(table, q_hi[s], q_lo[s]),
                               [slice(0, len(q_hi) // 2), slice(len(q_hi) // 2, None)]))
    assert halves[0] + halves[1] == answers
    # an add after the filter was built: the new winners are found
    more_event = np.full(len(hi), NO_EVENT_TIME, dtype=np.int64)
    more_event[:1000] = I64_MAX
    assert table.add(hi, lo, None, len(hi), event=more_event) == len(hi)
    want_all = model(np.concatenate([hi, hi]), np.concatenate([lo, lo]), np.concatenate([event, more_event]))
    assert looked_up(table, q_hi, q_lo) == expected_lookups(want_all, q_hi, q_lo)
    assert finished(table) == want_all
    assert looked_up(table, q_hi, q_lo) == [(0, -1)] * len(q_hi)


def test_plain_table_lookup_gives_positions_only() -> None:
    table = kernels.new_key_table()
    assert table is not None
    hi, lo = u64([3, 4, 3]), u64([1, 1, 1])
    table.add(hi, lo, np.array([10, 11, 12], dtype=np.int64))
    pos, event = table.lookup(u64([3, 4, 5]), u64([1, 1, 1]))
    assert np.frombuffer(pos, dtype=np.int64).tolist() == [12, 11, -1] and event is None
    assert not table.with_events


def test_event_table_gives_up_on_crowding_keys() -> None:
    rng = np.random.default_rng(63)
    hi, lo = crafted_records(rng, 20_000, 20_000)
    event = late_events(rng, len(hi))
    table = new_table()
    taken = table.add(hi, lo, event=event)
    assert 0 < taken < len(hi)
    want = model(hi[:taken], lo[:taken], event[:taken])
    assert len(table) == len(want)
    assert looked_up(table, hi[:taken], lo[:taken]) == expected_lookups(want, hi[:taken], lo[:taken])
    assert finished(table) == want


def test_event_table_refuses_mismatched_input() -> None:
    hi, lo, event = u64([1, 2, 3]), u64([4, 5, 6]), np.array([7, 8, 9], dtype=np.int64)
    table = new_table()
    with pytest.raises(ValueError, match="event="):
        table.add(hi, lo)  # type: ignore[call-arg]
    for bad in (event[:2], event.astype(np.uint64), event.astype(np.float64), event.astype(np.int32)):
        with pytest.raises(ValueError):
            table.add(hi, lo, event=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        table.add(hi, lo, np.arange(2, dtype=np.int64), event=event)
    with pytest.raises(ValueError, match="negative"):
        table.add(hi, lo, np.array([0, -1, 2], dtype=np.int64), event=event)
    with pytest.raises(ValueError):
        table.lookup(hi, lo[:2])
    plain = kernels.new_key_table()
    assert plain is not None
    with pytest.raises(ValueError, match="no event times"):
        plain.add(hi, lo, event=event)  # type: ignore[call-arg]
    assert table.add(hi, lo, event=event) == 3
    assert finished(table) == model(hi, lo, event)


def test_event_table_of_nothing() -> None:
    table = new_table(0)
    empty, none = np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.int64)
    assert table.add(empty, empty, event=none) == 0
    assert len(table) == 0 and table.nbytes == 0
    table.prepare_lookups()
    assert finished(table, keep=True) == {}
    assert finished(table) == {}
    assert looked_up(table, u64([1]), u64([1])) == [(0, -1)]
