"""The Bloom filter of new keys the Spark engine gives the tasks reading previous parts:
never a false negative (that would keep a superseded record), few false positives."""

from __future__ import annotations

import numpy as np
import pytest

from shale.compactor.keyfilter import MAX_BITS, MIN_BITS, KeyFilter


def keys(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False),
            rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False))


def test_every_added_key_may_be_there_and_few_others_are() -> None:
    hi, lo = keys(100_000, 1)
    f = KeyFilter.of(hi, lo, KeyFilter.size_for(len(hi)))
    assert f.may_contain(hi, lo).all()
    ohi, olo = keys(200_000, 2)
    rate = f.may_contain(ohi, olo).mean()
    assert 0 < rate < 0.02  # about 1 % at 10 bits and 7 probes per key


def test_a_union_holds_both_sets_and_an_empty_filter_holds_nothing() -> None:
    (ahi, alo), (bhi, blo) = keys(5_000, 3), keys(5_000, 4)
    size = KeyFilter.size_for(10_000)
    both = KeyFilter.of(ahi, alo, size).union(KeyFilter.of(bhi, blo, size))
    assert both.may_contain(ahi, alo).all() and both.may_contain(bhi, blo).all()
    empty = KeyFilter.of(ahi[:0], alo[:0], size)
    assert not empty.may_contain(ahi, alo).any()
    with pytest.raises(ValueError, match="cannot be combined"):
        both.union(KeyFilter.of(ahi, alo, size * 2))


def test_sizes_are_powers_of_two_within_bounds() -> None:
    assert KeyFilter.size_for(0) == MIN_BITS
    assert KeyFilter.size_for(100_000) == 1 << 20  # 1 M bits for 100 k keys at 10 bits each
    assert KeyFilter.size_for(10**10) == MAX_BITS
    with pytest.raises(ValueError, match="power of two"):
        KeyFilter.of(*keys(10, 5), 1000)


def test_keys_differing_only_in_one_half_are_told_apart() -> None:
    hi, lo = keys(50_000, 6)
    f = KeyFilter.of(hi, lo, KeyFilter.size_for(len(hi)))
    assert f.may_contain(hi, lo ^ np.uint64(1 << 40)).mean() < 0.02
    assert f.may_contain(hi ^ np.uint64(1 << 40), lo).mean() < 0.02
