"""The one function both engines use to decide which record of a key is the latest."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from compactor.rules import latest_of_each_key


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
