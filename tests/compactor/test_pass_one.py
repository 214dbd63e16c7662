"""The one function both engines use to decide which record of a key is the latest."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.compactor.rules import latest_of_each_key


def naive(hi: list[int], lo: list[int]) -> set[int]:
    last: dict[tuple[int, int], int] = {}
    for i, key in enumerate(zip(hi, lo, strict=True)):
        last[key] = i
    return set(last.values())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=60))
def test_latest_of_each_key_matches_a_dict(pairs: list[tuple[int, int]]) -> None:
    # tiny hash ranges: high halves collide between different keys all the time
    hi = [p[0] for p in pairs]
    lo = [p[1] for p in pairs]
    got = latest_of_each_key(np.array(hi, dtype=np.uint64), np.array(lo, dtype=np.uint64))
    assert sorted(got.tolist()) == sorted(naive(hi, lo))
    assert len(got) == len(set(got.tolist()))


def test_keys_sharing_the_high_half_stay_apart() -> None:
    big = 2**64 - 1
    hi = np.array([7, 7, 7, 7, big, big], dtype=np.uint64)
    lo = np.array([1, 2, 1, 2, 5, 5], dtype=np.uint64)
    assert sorted(latest_of_each_key(hi, lo).tolist()) == [2, 3, 5]


def test_many_random_keys() -> None:
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 2**63, size=5_000, dtype=np.uint64)
    pick = rng.integers(0, len(keys), size=50_000)
    hi, lo = keys[pick], keys[pick] ^ np.uint64(12345)
    assert sorted(latest_of_each_key(hi, lo).tolist()) == sorted(naive(hi.tolist(), lo.tolist()))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=12), st.booleans()),
                max_size=8))
def test_key_map_builder_matches_a_dict(chunks: list[tuple[list[tuple[int, int]], bool]]) -> None:
    """Chunks merged at any moment, with high halves colliding all the time, give the
    latest position of every key, sorted for lookups."""
    from shale.compactor.keymap import KeyMapBuilder

    b = KeyMapBuilder(10**6)
    want: dict[tuple[int, int], int] = {}
    pos = 0
    for pairs, merge_now in chunks:
        hi = np.array([p[0] for p in pairs], dtype=np.uint64)
        lo = np.array([p[1] for p in pairs], dtype=np.uint64)
        sel = latest_of_each_key(hi, lo)  # a chunk: one record per key, sorted by hash
        for i, p in enumerate(pairs):
            want[p] = pos + i
        b.add(hi[sel], lo[sel], (pos + sel).astype(np.int64))
        pos += len(pairs)
        if merge_now:
            b.merge()
        assert b.upper_bound >= len(want)
    m = b.build()
    got = {(int(h), int(lo_)): int(p) for h, lo_, p in zip(m.hi, m.lo, m.pos, strict=True)}
    assert got == want and len(m) == len(want)
    assert list(zip(m.hi.tolist(), m.lo.tolist(), strict=True)) == sorted(want)
    probe_hi = np.array([h for h in range(4) for _ in range(4)], dtype=np.uint64)
    probe_lo = np.array([lo_ for _ in range(4) for lo_ in range(4)], dtype=np.uint64)
    found = m.contains(probe_hi, probe_lo)
    assert [bool(f) for f in found] == [(h, lo_) in want for h in range(4) for lo_ in range(4)]


def test_key_map_lookups_on_random_hashes() -> None:
    """The filter in front of the search never hides a key that is there."""
    from shale.compactor.keymap import KeyMapBuilder

    rng = np.random.default_rng(7)
    hi = rng.integers(0, 2**63, size=20_000, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    lo = rng.integers(0, 2**63, size=20_000, dtype=np.uint64)
    b = KeyMapBuilder(10**6)
    sel = latest_of_each_key(hi[:10_000], lo[:10_000])
    b.add(hi[sel], lo[sel], sel.astype(np.int64))
    m = b.build()
    assert m.filter_words.nbytes <= 2 * len(m)  # about one byte per key
    present = set(zip(hi[:10_000].tolist(), lo[:10_000].tolist(), strict=True))
    q_hi = np.concatenate([hi, hi[:5_000] ^ np.uint64(2)])  # absent: other high halves
    q_lo = np.concatenate([lo, lo[:5_000]])
    want = [(h, x) in present for h, x in zip(q_hi.tolist(), q_lo.tolist(), strict=True)]
    assert m.contains(q_hi, q_lo).tolist() == want
    assert sum(want) == 10_000


def test_keys_differing_only_in_the_bits_that_hold_the_index() -> None:
    """Packing the index into the low bits of the high hash must not merge keys that
    differ only there: the answer still matches a dict and comes in hash order."""
    rng = np.random.default_rng(3)
    base = rng.integers(0, 2**40, size=300, dtype=np.uint64) << np.uint64(24)
    keys_hi = np.concatenate([base, base + np.uint64(1), base + np.uint64(5)])  # same top 40 bits
    keys_lo = rng.integers(0, 2**63, size=len(keys_hi), dtype=np.uint64)
    pick = rng.integers(0, len(keys_hi), size=100_000)  # 17 index bits
    hi, lo = keys_hi[pick], keys_lo[pick]
    got = latest_of_each_key(hi, lo)
    assert sorted(got.tolist()) == sorted(naive(hi.tolist(), lo.tolist()))
    pairs = list(zip(hi[got].tolist(), lo[got].tolist(), strict=True))
    assert pairs == sorted(pairs)


def test_key_map_lookups_split_over_a_given_pool() -> None:
    """Many lookups are split over threads: those of the caller's pool when it gives one
    (started once for every part), with the same answers as one thread's."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from shale.compactor.keymap import _MIN_LOOKUPS_PER_THREAD, KeyMapBuilder

    rng = np.random.default_rng(11)
    n = 3 * _MIN_LOOKUPS_PER_THREAD
    hi = rng.integers(0, 2**63, size=n, dtype=np.uint64)
    lo = rng.integers(0, 2**63, size=n, dtype=np.uint64)
    b = KeyMapBuilder(10**7)
    b.add(hi[: n // 3], lo[: n // 3])
    m = b.build(for_lookups=True)
    alone = m.contains(hi, lo)
    assert int(alone.sum()) == n // 3 and bool(alone[: n // 3].all())
    seen: set[str] = set()
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="given",
                            initializer=lambda: seen.add(threading.current_thread().name)) as pool:
        assert m.contains(hi, lo, threads=3, pool=pool).tolist() == alone.tolist()
        assert m.contains(hi, lo, threads=3, pool=pool).tolist() == alone.tolist()
    from shale.ledger.kernels import KERNELS

    if KERNELS == "native":  # (without the C table, lookups are one NumPy search)
        assert seen and all(name.startswith("given") for name in seen)
