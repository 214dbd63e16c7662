"""Event-time order's building blocks against a plain dict model: the record with the
greatest event time wins for its key, the later index (position) breaking ties.

* :func:`~shale.compactor.rules.latest_by_event_time` on random, late, equal, missing
  (``NO_EVENT_TIME``) and extreme event times, keys sharing their high hash halves, with
  and without the C kernels;
* :class:`~shale.compactor.event_map.EventKeyMapBuilder` over many ``add`` calls, where a
  later chunk holds older events, with the C event table and without it (sorted runs,
  merges forced); crafted keys crowding the table mid-way; threads building shares of the
  hash range; its capacity at 32 bytes a key;
* :meth:`~shale.compactor.keymap.KeyMap.events_of` lookups, through the C table and not.

Every case has a late record, so that "the last write wins" fails it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.compactor import event_map as event_map_module
from shale.compactor import keymap as keymap_module
from shale.compactor.event_map import EventKeyMapBuilder, event_map_capacity
from shale.compactor.keymap import EVENT_KEY_BYTES, KEY_BYTES, KeyMap
from shale.compactor.rules import latest_by_event_time, latest_of_each_key
from shale.ledger import kernels
from shale.ledger import latest as rules_module
from shale.ledger.format import NO_EVENT_TIME
from tests.needs import need_c_extension

pytestmark = pytest.mark.kernels  # (scripts/sanitize.sh runs these under ASan and UBSan)

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
Key = tuple[int, int]

I64_MAX = np.iinfo(np.int64).max


def u64(values: list[int]) -> U64:
    return np.array(values, dtype=np.uint64)


def model(hi: U64, lo: U64, event: I64, pos: I64 | None = None) -> dict[Key, tuple[int, int]]:
    """Each key's winner as ``(event, position)``: the greatest, in plain Python."""
    positions = range(len(hi)) if pos is None else pos.tolist()
    out: dict[Key, tuple[int, int]] = {}
    for key, e, p in zip(zip(hi.tolist(), lo.tolist(), strict=True), event.tolist(), positions, strict=True):
        if (e, p) >= out.get(key, (NO_EVENT_TIME - 1, -1)):
            out[key] = (e, p)
    return out


def last_write(hi: U64, lo: U64) -> dict[Key, int]:
    return {k: i for i, k in enumerate(zip(hi.tolist(), lo.tolist(), strict=True))}


def check_latest(hi: U64, lo: U64, event: I64) -> None:
    got = latest_by_event_time(hi, lo, event)
    want = model(hi, lo, event)
    assert got.dtype == np.intp
    # in the hash order of latest_of_each_key
    assert hi[got].tolist() == hi[latest_of_each_key(hi, lo)].tolist()
    assert lo[got].tolist() == lo[latest_of_each_key(hi, lo)].tolist()
    assert {(int(hi[i]), int(lo[i])): int(i) for i in got} == {k: p for k, (_, p) in want.items()}


@pytest.fixture(params=["native", "numpy"])
def paths(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Once with the C kernels (when in use), once with the NumPy fallbacks (and late
    records found in small blocks)."""
    if request.param == "numpy":
        monkeypatch.setattr(rules_module, "_LATE_BLOCK", 7)
        monkeypatch.setattr(rules_module, "new_key_table", lambda expected=0: None)
        monkeypatch.setattr(rules_module, "latest_positions", lambda hi, lo: None)
    else:
        need_c_extension(kernels._native, "ledger/_kernels.c")
    return str(request.param)


def nearly_sorted(rng: np.random.Generator, n: int, late_share: float) -> I64:
    event = np.arange(n, dtype=np.int64) * 5 + 1_700_000_000_000
    late = rng.random(n) < late_share
    event[late] -= rng.integers(1, 5_000, size=int(late.sum()))
    return event


@pytest.mark.parametrize("late_share", [0.0, 0.05, 0.5, 1.0])
def test_latest_by_event_time_on_random_records(paths: str, late_share: float) -> None:
    rng = np.random.default_rng(40)
    n_keys, n = 3_000, 30_000
    k_hi, k_lo = rng.integers(0, 2**64, size=(2, n_keys), dtype=np.uint64)
    pick = rng.integers(0, n_keys, size=n)
    hi, lo = k_hi[pick], k_lo[pick]
    event = nearly_sorted(rng, n, late_share) if late_share < 1 else rng.integers(-10**6, 10**6, size=n)
    event[rng.random(n) < 0.02] = NO_EVENT_TIME
    check_latest(hi, lo, event)
    if late_share:
        assert model(hi, lo, event).keys() == last_write(hi, lo).keys()
        assert {k: p for k, (_, p) in model(hi, lo, event).items()} != last_write(hi, lo)


def test_latest_by_event_time_edges(paths: str) -> None:
    empty = np.empty(0, dtype=np.uint64)
    assert latest_by_event_time(empty, empty, np.empty(0, dtype=np.int64)).tolist() == []
    hi, lo = u64([1, 2, 1, 2, 1]), u64([5, 5, 5, 5, 5])
    assert latest_by_event_time(hi, lo, np.full(5, 7, dtype=np.int64)).tolist() == [4, 3]  # ties: later wins
    extremes = np.array([I64_MAX, NO_EVENT_TIME, NO_EVENT_TIME, I64_MAX - 1, NO_EVENT_TIME], dtype=np.int64)
    assert latest_by_event_time(hi, lo, extremes).tolist() == [0, 3]
    missing = np.array([NO_EVENT_TIME, 0, NO_EVENT_TIME, NO_EVENT_TIME, NO_EVENT_TIME], dtype=np.int64)
    assert latest_by_event_time(hi, lo, missing).tolist() == [4, 1]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3),
                          st.sampled_from([NO_EVENT_TIME, -1, 0, 1, 2, I64_MAX])), max_size=40))
def test_latest_by_event_time_on_keys_sharing_high_halves(records: list[tuple[int, int, int]]) -> None:
    # tiny hashes: many keys share their high half, and the top bits of every key are 0
    hi = u64([(r[0] << 62) if r[0] & 1 else r[0] for r in records])
    lo = u64([r[1] for r in records])
    event = np.array([r[2] for r in records], dtype=np.int64)
    for crowded in (False, True):
        with pytest.MonkeyPatch.context() as mp:
            if crowded:
                mp.setattr(rules_module, "latest_positions", lambda hi, lo: None)
                mp.setattr(rules_module, "_LATE_BLOCK", 3)
            check_latest(hi, lo, event)


def test_latest_by_event_time_with_crafted_keys_crowding_the_table() -> None:
    rng = np.random.default_rng(41)
    n_keys = 20_000
    k_hi = (np.uint64(0xABCDEF1234) << np.uint64(24)) | np.arange(n_keys, dtype=np.uint64)
    k_lo = rng.integers(0, 2**64, size=n_keys, dtype=np.uint64)
    pick = rng.integers(0, n_keys, size=60_000)
    check_latest(k_hi[pick], k_lo[pick], nearly_sorted(rng, 60_000, 0.1))


# ------------------------------------------------------------------ the key map with event times

Chunk = tuple[U64, U64, I64, I64 | None, int]
Columns = tuple[U64, U64, I64, I64]


def chunks_of(rng: np.random.Generator, n_keys: int, sizes: list[int]) -> list[Chunk]:
    """Chunks in position order (every position after those of earlier chunks, some with
    gaps); each later chunk's events reach back before the earlier ones'."""
    k_hi, k_lo = rng.integers(0, 2**64, size=(2, n_keys), dtype=np.uint64)
    out: list[Chunk] = []
    at = 0
    for i, size in enumerate(sizes):
        pick = rng.integers(0, n_keys, size=size)
        event = rng.integers(0, 1_000, size=size) + 200 * i  # overlapping ranges: late ledgers
        event[rng.random(size) < 0.05] = NO_EVENT_TIME
        event[rng.random(size) < 0.05] = 500  # equal events across chunks
        if i % 2:
            out.append((k_hi[pick], k_lo[pick], event, None, at))
            at += size
        else:
            out.append((k_hi[pick], k_lo[pick], event, at + np.arange(size, dtype=np.int64) * 3, 0))
            at += 3 * size
    return out


def chunk_model(chunks: list[Chunk]) -> dict[Key, tuple[int, int]]:
    if not chunks:
        return {}
    hi = np.concatenate([c[0] for c in chunks])
    lo = np.concatenate([c[1] for c in chunks])
    event = np.concatenate([c[2] for c in chunks])
    pos = np.concatenate([c[3] if c[3] is not None else np.arange(c[4], c[4] + len(c[0]), dtype=np.int64)
                          for c in chunks])
    return model(hi, lo, event, pos)


@pytest.fixture(params=["table", "numpy"])
def map_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Once with the C event table (when the kernels are in use), once merging sorted
    runs in NumPy (and looking keys up without the C table)."""
    if request.param == "numpy":
        numpy_maps(monkeypatch)
    else:
        need_c_extension(kernels._native, "ledger/_kernels.c")
    return str(request.param)


def numpy_maps(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(event_map_module, "new_event_key_table", lambda expected=0: None)
    mp.setattr(keymap_module, "new_key_table", lambda expected=0: None)


def built(chunks: list[Chunk], capacity: int = 10**7, part_shift: int = 64, part: int = 0,
          table: bool | None = None) -> KeyMap:
    """The map of the chunks; ``table``: whether the builder must have used the C table."""
    builder = EventKeyMapBuilder(capacity)
    for hi, lo, event, pos, first in chunks:
        builder.add(hi, lo, event, pos, first=first, part_shift=part_shift, part=part)
    if table is not None:
        assert (builder._table is not None) == table, "not the path meant"
    return builder.build()


def map_model(m: KeyMap) -> dict[Key, tuple[int, int]]:
    assert m.event is not None
    keys = list(zip(m.hi.tolist(), m.lo.tolist(), strict=True))
    assert keys == sorted(keys)
    return dict(zip(keys, zip(m.event.tolist(), m.pos.tolist(), strict=True), strict=True))


@pytest.mark.parametrize("min_merge", [1, 64, 1 << 22])
def test_event_map_keeps_each_keys_greatest_event_across_merges(min_merge: int, map_path: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(event_map_module, "_MIN_MERGE", min_merge)
    merges = []
    real_merge = EventKeyMapBuilder.merge
    monkeypatch.setattr(EventKeyMapBuilder, "merge", lambda self: (merges.append(self._pending), real_merge(self)))
    rng = np.random.default_rng(42)
    chunks = chunks_of(rng, 2_000, [3_000, 500, 1, 0, 4_000, 2_500, 700, 3_000])
    m = built(chunks, table=map_path == "table")
    want = chunk_model(chunks)
    assert map_model(m) == want
    if min_merge < 1 << 22 and map_path == "numpy":
        assert len(merges) > 2, "merges were meant to happen between add calls"
    # the last write would have kept other records
    last: dict[Key, int] = {}
    for hi, lo, _, pos, first in chunks:
        p = pos.tolist() if pos is not None else range(first, first + len(hi))
        last.update(zip(zip(hi.tolist(), lo.tolist(), strict=True), p, strict=True))
    assert {k: p for k, (_, p) in want.items()} != last
    assert m.nbytes == EVENT_KEY_BYTES * len(m)
    for part in (0, 1):  # one thread's share of the hash range
        share = {k: w for k, w in want.items() if k[0] >> 63 == part}
        assert 0 < len(share) < len(want)
        assert map_model(built(chunks, part_shift=63, part=part, table=map_path == "table")) == share


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(-2, 2)), max_size=10),
                max_size=8), st.integers(1, 8))
def test_event_map_against_the_model_on_tiny_hashes(chunk_records: list[list[tuple[int, int, int]]],
                                                     min_merge: int) -> None:
    chunks: list[Chunk] = []
    at = 0
    for recs in chunk_records:
        hi = u64([((r[0] & 1) << 63) | (r[0] >> 1) for r in recs])  # keys share high halves
        lo = u64([r[1] for r in recs])
        event = np.array([NO_EVENT_TIME if r[2] == -2 else r[2] for r in recs], dtype=np.int64)
        chunks.append((hi, lo, event, None, at))
        at += len(recs)
    want = chunk_model(chunks)
    probe_hi = u64([((h & 1) << 63) | (h >> 1) for h in range(4) for _ in range(3)])
    probe_lo = u64([x for _ in range(4) for x in range(3)])
    for path in ("table", "numpy") if kernels._native is not None else ("numpy",):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(event_map_module, "_MIN_MERGE", min_merge)
            if path == "numpy":
                numpy_maps(mp)
            m = built(chunks, table=path == "table")
            assert map_model(m) == want
            found, events = m.events_of(probe_hi, probe_lo)
        for k, (f, e) in zip(zip(probe_hi.tolist(), probe_lo.tolist(), strict=True),
                             zip(found.tolist(), events.tolist(), strict=True), strict=True):
            assert f == (k in want)
            assert e == (want[k][0] if k in want else 0)


def test_event_map_capacity_counts_32_bytes_a_key(map_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(event_map_module, "_MIN_MERGE", 16)
    rng = np.random.default_rng(43)
    chunks = chunks_of(rng, 300, [400, 400, 400])
    keys = len(chunk_model(chunks))
    max_map_bytes = keys * EVENT_KEY_BYTES
    assert event_map_capacity(max_map_bytes) == keys
    assert event_map_capacity(max_map_bytes - 1) == keys - 1
    assert event_map_capacity(max_map_bytes) < max_map_bytes // KEY_BYTES
    for capacity, fits in ((keys, True), (keys - 1, False)):
        builder = EventKeyMapBuilder(capacity)
        for hi, lo, event, pos, first in chunks[:-1]:
            builder.add(hi, lo, event, pos, first=first)
        last = chunks[-1]
        assert builder.fits(last[0], last[1]) == fits
    builder.add(last[0], last[1], last[2], last[3], first=last[4])
    m = builder.build()
    assert len(m) == keys and m.nbytes == max_map_bytes
    assert map_model(m) == chunk_model(chunks)
    # offset order's map is unchanged: 24 bytes a key, no event column
    plain = KeyMap.sorted(m.hi, m.lo, m.pos)
    assert plain.event is None and plain.nbytes == KEY_BYTES * keys


def test_events_of_answers_for_present_and_absent_keys(map_path: str) -> None:
    hi = u64([1, 1, 1, 5, 9])  # three keys share a high half
    lo = u64([2, 4, 6, 0, 1])
    m = KeyMap.sorted(hi, lo, np.arange(5, dtype=np.int64), np.array([10, NO_EVENT_TIME, 30, 40, 50]))
    found, events = m.events_of(u64([1, 1, 1, 1, 9, 9, 0, 10]), u64([6, 4, 3, 2, 1, 2, 0, 0]))
    assert found.tolist() == [True, True, False, True, True, False, False, False]
    assert events.tolist() == [30, NO_EVENT_TIME, 0, 10, 50, 0, 0, 0]
    with pytest.raises(ValueError, match="no event times"):
        KeyMap.sorted(hi, lo, np.arange(5, dtype=np.int64)).events_of(hi, lo)
    # built from ledgers where a later one holds older events: the map answers the winners'
    builder = EventKeyMapBuilder(100)
    builder.add(u64([1, 1, 5]), u64([2, 6, 0]), np.array([30, 20, NO_EVENT_TIME]))
    builder.add(u64([1, 5, 1]), u64([2, 0, 6]), np.array([10, NO_EVENT_TIME, 20]), first=3)
    m = builder.build()
    found, events = m.events_of(u64([1, 1, 5, 5]), u64([2, 6, 0, 1]))
    assert found.tolist() == [True, True, True, False]
    assert events.tolist() == [30, 20, NO_EVENT_TIME, 0]
    assert m._lookup["indexed"] == (map_path == "table")  # looked up in the C table, or searched


def test_events_of_on_many_keys_and_crafted_ones(map_path: str) -> None:
    rng = np.random.default_rng(44)
    random_keys = rng.integers(0, 2**64, size=(2, 30_000), dtype=np.uint64)
    crafted_hi = (np.uint64(0xABCDEF1234) << np.uint64(24)) | np.arange(20_000, dtype=np.uint64)
    crafted = (crafted_hi, rng.integers(0, 2**64, size=20_000, dtype=np.uint64))
    for k_hi, k_lo in (random_keys, crafted):
        order = np.lexsort((k_lo, k_hi))
        hi, lo = k_hi[order], k_lo[order]
        event = rng.integers(-5, 5, size=len(hi))
        event[::7] = NO_EVENT_TIME
        m = KeyMap.sorted(hi, lo, rng.permutation(len(hi)).astype(np.int64) * 2, event)
        q_hi = np.concatenate([hi, hi ^ np.uint64(1), rng.integers(0, 2**64, size=5_000, dtype=np.uint64)])
        q_lo = np.concatenate([lo, lo, lo[:5_000]])
        found, events = m.events_of(q_hi, q_lo)
        n = len(hi)
        assert found.tolist() == [True] * n + [False] * (len(q_hi) - n)
        assert events.tolist() == event.tolist() + [0] * (len(q_hi) - n)
        # a crafted map crowds the table: it is searched either way
        assert m._lookup["indexed"] == (map_path == "table" and k_hi is not crafted_hi)


def test_event_map_survives_a_table_crowded_mid_way() -> None:
    need_c_extension(kernels._native, "ledger/_kernels.c")
    rng = np.random.default_rng(45)
    chunks = chunks_of(rng, 3_000, [4_000, 2_000])
    crafted_hi = (np.uint64(0xABCDEF1234) << np.uint64(24)) | np.arange(20_000, dtype=np.uint64)
    crafted_lo = rng.integers(0, 2**64, size=20_000, dtype=np.uint64)
    pick = np.concatenate([rng.permutation(20_000), rng.integers(0, 20_000, size=10_000)])
    at = chunks[1][4] + len(chunks[1][0])  # after the second chunk, of ``first`` positions
    crowd: Chunk = (crafted_hi[pick], crafted_lo[pick], rng.integers(0, 3_000, size=len(pick)), None, at)
    at += len(pick)
    # records of the first keys with older events than before, then fresh keys
    older = chunks[0][2][:2_000]
    older = np.where(older == NO_EVENT_TIME, older, older - 300)
    later = chunks_of(rng, 3_000, [3_000])[0]
    again: Chunk = (np.concatenate([chunks[0][0][:2_000], later[0]]), np.concatenate([chunks[0][1][:2_000], later[1]]),
                    np.concatenate([older, later[2]]), None, at)
    all_chunks = [*chunks, crowd, again]
    want = chunk_model(all_chunks)
    assert any(want[k][1] < at for k in zip(chunks[0][0][:2_000].tolist(), chunks[0][1][:2_000].tolist(),
                                            strict=True)), "the late records were meant to lose"
    builder = EventKeyMapBuilder(10**7)
    for hi, lo, event, pos, first in all_chunks[:3]:
        builder.add(hi, lo, event, pos, first=first)
    assert builder._table is None, "the crafted keys should have crowded the C table"
    keys_so_far = len(chunk_model(all_chunks[:3]))
    last = all_chunks[3]
    new_keys = len(want) - keys_so_far
    assert new_keys > 0
    for capacity, fits in ((len(want), True), (len(want) - 1, False)):
        builder.capacity = capacity
        assert builder.fits(last[0], last[1]) == fits
    builder.add(last[0], last[1], last[2], last[3], first=last[4])
    assert map_model(builder.build()) == want


def test_event_map_built_by_threads_in_shares_of_the_hash_range(map_path: str) -> None:
    rng = np.random.default_rng(46)
    chunks = chunks_of(rng, 5_000, [6_000, 3_000, 6_000, 1_000])
    shift, parts = 62, 4

    def build(part: int) -> Columns:
        builder = EventKeyMapBuilder(10**7, expected=2_000)
        for hi, lo, event, pos, first in chunks:
            builder.add(hi, lo, event, pos, first=first, part_shift=shift, part=part)
        return builder.finish()

    with ThreadPoolExecutor(max_workers=parts) as pool:
        shares = list(pool.map(build, range(parts)))
    m = KeyMap.sorted(*(np.concatenate(cols) for cols in zip(*shares, strict=True)))
    assert map_model(m) == chunk_model(chunks)
    assert all(len(share[0]) for share in shares)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.tuples(st.integers(0, 5), st.integers(0, 3)), st.integers(-2, 2), max_size=8),
       st.dictionaries(st.tuples(st.integers(0, 5), st.integers(0, 3)), st.integers(-2, 2), max_size=8))
def test_merging_two_maps_keeps_the_greater_event(old: dict[Key, int], new: dict[Key, int]) -> None:
    # one key per high half in ``old`` (the searching merge), any keys in ``new``
    old = {k: e for k, e in old.items() if k[1] == min(x[1] for x in old if x[0] == k[0])}

    def columns(d: dict[Key, int], base: int) -> tuple[U64, U64, I64, I64]:
        keys = sorted(d)
        return (u64([k[0] for k in keys]), u64([k[1] for k in keys]),
                np.arange(base, base + len(keys), dtype=np.int64), np.array([d[k] for k in keys], dtype=np.int64))

    o, n = columns(old, 0), columns(new, 100)
    want = {k: (e, p) for k, e, p in zip(zip(o[0].tolist(), o[1].tolist(), strict=True), o[3].tolist(),
                                          o[2].tolist(), strict=True)}
    for k, e, p in zip(zip(n[0].tolist(), n[1].tolist(), strict=True), n[3].tolist(), n[2].tolist(), strict=True):
        if (e, p) > want.get(k, (NO_EVENT_TIME, -1)):
            want[k] = (e, p)
    for merge in (event_map_module._merge_sorted, event_map_module._merge_by_sorting):
        hi, lo, pos, event = merge(o, n)
        keys = list(zip(hi.tolist(), lo.tolist(), strict=True))
        assert keys == sorted(want)
        assert dict(zip(keys, zip(event.tolist(), pos.tolist(), strict=True), strict=True)) == want


def test_event_map_of_nothing(map_path: str) -> None:
    builder = EventKeyMapBuilder(10)
    empty = np.empty(0, dtype=np.uint64)
    assert builder.fits(empty, empty)
    builder.add(empty, empty, np.empty(0, dtype=np.int64), first=5)
    assert builder.upper_bound == 0
    m = builder.build()
    assert len(m) == 0 and m.event is not None and m.nbytes == 0
    found, events = m.events_of(u64([1, 2]), u64([3, 4]))
    assert found.tolist() == [False, False] and events.tolist() == [0, 0]
