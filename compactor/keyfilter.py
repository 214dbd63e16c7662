"""A Bloom filter of key hashes: "this key may have a newer record" or "surely not".

The Spark engine builds one over the keys of a run's new records and hands it to the
tasks that read the previous compacted parts.  A part's record whose key the filter
surely does not hold has no newer record, so the task decides its fate itself (kept,
unless it is an expired tombstone) and nothing of it crosses the shuffle; only the few
records whose key may be new (new ones, and false positives) go through the exact
decision with the new records.  A false positive costs a little shuffle, never a wrong
answer.

Keys are Shale's 128-bit key hashes, already uniform, so the probes come from them by
double hashing (probe ``j`` is ``lo + j * hi`` modulo the size, each half first folded
onto its low 32 bits), not from hashing again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

import numpy as np
import numpy.typing as npt

from shale.ledger.values import dataclass

__all__ = ["KeyFilter"]

#: Bits per expected key and probes per key: a false-positive rate near 1 %.
BITS_PER_KEY: Final = 10
PROBES: Final = 7
#: Filter sizes in bits, powers of two: the largest is 8 MiB packed (a task unpacks
#: none of it; building one holds a byte per bit, 64 MiB, for a moment).
MIN_BITS: Final = 1 << 16
MAX_BITS: Final = 1 << 26

U64 = npt.NDArray[np.uint64]


@dataclass(frozen=True, slots=True, eq=False)
class KeyFilter:
    """A Bloom filter over 128-bit key hashes, packed little-endian: bit ``i`` is bit
    ``i % 8`` of byte ``i // 8``."""

    bits: npt.NDArray[np.uint8]

    @staticmethod
    def size_for(keys: int) -> int:
        """Bits of a filter for about ``keys`` keys (more keys than the largest filter
        holds well only raise its false-positive rate)."""
        want = max(MIN_BITS, keys * BITS_PER_KEY)
        return min(MAX_BITS, 1 << (want - 1).bit_length())

    @classmethod
    def of(cls, hi: U64, lo: U64, size: int) -> KeyFilter:
        """The filter of these keys, ``size`` bits (a power of two)."""
        if size & (size - 1) or size < 8:
            raise ValueError(f"a key filter's size must be a power of two of at least 8 bits, not {size}")
        flags = np.zeros(size, dtype=bool)
        for idx in _probes(hi, lo, size):
            flags[idx] = True
        return cls(np.packbits(flags, bitorder="little"))

    @property
    def size(self) -> int:
        return len(self.bits) * 8

    def union(self, other: KeyFilter) -> KeyFilter:
        """The filter of both filters' keys (same size)."""
        if other.size != self.size:
            raise ValueError(f"key filters of {self.size} and {other.size} bits cannot be combined")
        return KeyFilter(self.bits | other.bits)

    def may_contain(self, hi: U64, lo: U64) -> npt.NDArray[np.bool_]:
        """False where the key was surely not added; True where it may have been."""
        out = np.ones(len(hi), dtype=bool)
        for idx in _probes(hi, lo, self.size):
            out &= ((self.bits[idx >> np.uint64(3)] >> (idx & np.uint64(7)).astype(np.uint8)) & 1).astype(bool)
        return out


def _probes(hi: U64, lo: U64, size: int) -> Iterator[U64]:
    """The bit of each key for each probe, one probe at a time (each is an array as long
    as the keys)."""
    mask, half = np.uint64(size - 1), np.uint64(32)
    # Each half folded onto its low bits, so every bit of the key counts.
    hi = np.asarray(hi, dtype=np.uint64)
    lo = np.asarray(lo, dtype=np.uint64)
    step = (hi ^ (hi >> half)) | np.uint64(1)  # odd: one key's probes never repeat
    idx = lo ^ (lo >> half)
    for _ in range(PROBES):
        yield idx & mask
        idx += step  # wraps modulo 2**64, which a power-of-two size divides
