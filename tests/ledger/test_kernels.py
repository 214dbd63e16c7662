"""The hot loops of :mod:`ledger.kernels` (the C extension ``ledger/_kernels.c`` and its
NumPy / pure-Python fallbacks) give the same answers as plain references, and as each other.

Checked here:

* the C kernels were actually built (unless ``SHALE_KERNELS=numpy`` asks for the fallbacks);
* ``crc32c`` and ``crc32c_ranges`` against the ``crc32c`` package, at the lengths where the
  C code changes strategy, on unaligned views and with continuation values;
* ``gather_ranges`` (with and without a :class:`~ledger.kernels.Scratch`) against slicing;
* ``check_frames`` finds the first frame whose header or checksum is wrong;
* out-of-range ranges raise :class:`ValueError` on the native and the fallback path;
* ``latest_of_each_key`` / ``latest_by_sorting`` / ``latest_positions`` against a dict,
  including keys that collide in their high half and keys crafted to crowd the C table;
* the C ``KeyTable`` (chunks, positions, hash-range parts, lookups, finish, crowding);
* :class:`~compactor.keymap.KeyMapBuilder` and :meth:`~compactor.keymap.KeyMap.contains`
  with the C table against their NumPy paths;
* a whole compaction run in a subprocess with and without ``SHALE_KERNELS=numpy`` writes
  the same compacted view.

The fallback paths are reached in-process by setting the module globals that hold the
extension (``ledger.kernels._native`` / ``_native_crc``, ``compactor.keymap.new_key_table``).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import crc32c as crc32c_package
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.compactor import keymap as keymap_module
from shale.compactor.keymap import KeyMap, KeyMapBuilder
from shale.compactor.rules import latest_by_sorting, latest_of_each_key
from shale.ledger import kernels
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from tests.compactor.test_compaction import expected_view
from tests.conftest import run_cli
from tests.needs import BUILD_HOW, c_extension, missing, need_c_extension, needs

pytestmark = pytest.mark.kernels  # (scripts/sanitize.sh runs these under ASan and UBSan)

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
Key = tuple[int, int]

FORCED_FALLBACK = os.environ.get("SHALE_KERNELS", "").strip().lower() in ("numpy", "python")
NATIVE = kernels._native
needs_native = needs(c_extension(NATIVE, "ledger/_kernels.c"))

# Lengths around the C CRC's strategy changes: 8-byte words, 3 x 256-byte and 3 x 8 KiB blocks.
CRC_LENGTHS = [0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 255, 256, 257, 767, 768, 769, 1000, 8191, 8192, 8193,
               24575, 24576, 24577, 65535, 65536, 65537, 100_000, 3 * 24576 + 777]
CRC_VALUES = [0, 1, 0xFFFFFFFF, 0x80000000, 0xE3069283, 0x12345678]

CRAFTED_TOP = np.uint64(0xABCDEF1234) << np.uint64(24)  # keys sharing their top 40 bits


# ----------------------------------------------------------------------------------- helpers


@contextmanager
def fallback_kernels() -> Iterator[None]:
    """:mod:`ledger.kernels` as if the extension had not been built."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kernels, "_native", None)
        mp.setattr(kernels, "_native_crc", None)
        yield


@contextmanager
def numpy_keymap() -> Iterator[None]:
    """:mod:`compactor.keymap` without the C table (sorted runs, filter + binary search)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(keymap_module, "new_key_table", lambda expected=0: None)
        yield


@pytest.fixture(params=["native", "fallback"])
def kernel_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs a test once with the C kernels (skipped without them) and once with the fallbacks."""
    if request.param == "native":
        need_c_extension(NATIVE, "ledger/_kernels.c")
        yield "native"
    else:
        with fallback_kernels():
            yield "fallback"


def rng_bytes(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).bytes(n)


def u64(values: list[int] | npt.ArrayLike) -> U64:
    return np.asarray(values, dtype=np.uint64)


def random_u64(rng: np.random.Generator, n: int) -> U64:
    return rng.integers(0, 2**64 - 1, size=n, dtype=np.uint64, endpoint=True)


def random_records(rng: np.random.Generator, n_keys: int, n_records: int) -> tuple[U64, U64]:
    """``n_records`` records drawn from ``n_keys`` uniformly hashed keys."""
    k_hi, k_lo = random_u64(rng, n_keys), random_u64(rng, n_keys)
    pick = rng.integers(0, n_keys, size=n_records)
    return k_hi[pick], k_lo[pick]


def crafted_records(rng: np.random.Generator, n_keys: int, n_records: int) -> tuple[U64, U64]:
    """Records of keys that share their top 40 hash bits (they crowd the C table)."""
    k_hi = CRAFTED_TOP | np.arange(n_keys, dtype=np.uint64)
    k_lo = random_u64(rng, n_keys)
    pick = np.concatenate([rng.permutation(n_keys), rng.integers(0, n_keys, size=max(0, n_records - n_keys))])
    return k_hi[pick], k_lo[pick]


def latest_dict(hi: U64, lo: U64, pos: I64 | None = None) -> dict[Key, int]:
    """The reference: the greatest position (by default: the last index) of every key."""
    positions = range(len(hi)) if pos is None else pos.tolist()
    out: dict[Key, int] = {}
    for key, p in zip(zip(hi.tolist(), lo.tolist(), strict=True), positions, strict=True):
        if p >= out.get(key, -1):
            out[key] = p
    return out


def reference_latest(hi: U64, lo: U64) -> npt.NDArray[np.intp]:
    """Index of the last occurrence of every distinct ``(hi, lo)``, ordered by ``(hi, lo)``."""
    last = latest_dict(hi, lo)
    return np.array([last[k] for k in sorted(last)], dtype=np.intp)


def sorted_columns(latest: dict[Key, int]) -> tuple[U64, U64, I64]:
    keys = sorted(latest)
    return (u64([k[0] for k in keys]), u64([k[1] for k in keys]),
            np.array([latest[k] for k in keys], dtype=np.int64))


def columns(triple: tuple[bytearray, bytearray, bytearray]) -> tuple[U64, U64, I64]:
    """``(hi, lo, pos)`` arrays from the three buffers of ``KeyTable.finish``."""
    hi, lo, pos = triple
    return np.frombuffer(hi, dtype=np.uint64), np.frombuffer(lo, dtype=np.uint64), np.frombuffer(pos, dtype=np.int64)


def assert_columns_equal(got: tuple[U64, U64, I64], want: tuple[U64, U64, I64]) -> None:
    for g, w, name in zip(got, want, ("hi", "lo", "pos"), strict=True):
        assert np.array_equal(g, w), f"{name} differs"


def membership(latest: dict[Key, int], hi: U64, lo: U64) -> list[bool]:
    return [(h, x) in latest for h, x in zip(hi.tolist(), lo.tolist(), strict=True)]


def absent_queries(rng: np.random.Generator, hi: U64, lo: U64) -> tuple[U64, U64]:
    """Present keys, fresh random keys, and keys sharing only one half with a present one."""
    n = min(len(hi), 5_000)
    fresh_hi, fresh_lo = random_u64(rng, n), random_u64(rng, n)
    return (np.concatenate([hi, fresh_hi, hi[:n], hi[:n] ^ np.uint64(1), hi[:n] ^ np.uint64(1 << 63)]),
            np.concatenate([lo, fresh_lo, lo[:n] ^ np.uint64(1), lo[:n], lo[:n]]))


def as_bools(found: bytearray | npt.NDArray[np.bool_]) -> list[bool]:
    """A ``contains`` answer (C bytes of 0/1, or a NumPy bool array) as a list."""
    arr = np.frombuffer(found, dtype=np.uint8) if isinstance(found, bytearray) else np.asarray(found)
    result: list[bool] = arr.astype(bool).tolist()
    return result


def new_table(expected: int = 0) -> kernels.KeyTable:
    table = kernels.new_key_table(expected)
    if table is None:
        need_c_extension(None, "ledger/_kernels.c (its KeyTable)")
    return table


# ------------------------------------------------------------------------------- the build


def test_the_c_kernels_are_in_use() -> None:
    if FORCED_FALLBACK:
        pytest.skip("SHALE_KERNELS=numpy forces the fallbacks")
    assert kernels.KERNELS == "native", (
        "the C kernels (ledger/_kernels.c) were not built, so every hot loop silently runs its slower "
        "NumPy fallback: a C compiler and the Python headers (python3-dev) are needed when installing")


# ----------------------------------------------------------------------------------- crc32c


def crc_functions() -> list[tuple[str, object]]:
    """``ledger.kernels.crc32c``, plus the extension's own (which ``kernels`` bypasses
    on CPUs without the CRC instruction)."""
    funcs: list[tuple[str, object]] = [("kernels", kernels.crc32c)]
    if NATIVE is not None:
        funcs.append(("_kernels", NATIVE.crc32c))
    return funcs


@pytest.mark.parametrize(("name", "crc"), crc_functions(), ids=[n for n, _ in crc_functions()])
def test_crc32c_matches_the_package_at_every_block_boundary(name: str, crc: object) -> None:
    data = rng_bytes(max(CRC_LENGTHS) + 16, seed=1)
    view = memoryview(data)
    for n in CRC_LENGTHS:
        for offset in (0, 1, 3, 7):  # unaligned starts shift where the word loop begins
            chunk = view[offset:offset + n]
            for value in CRC_VALUES:
                want = crc32c_package.crc32c(chunk, value)
                assert crc(chunk, value) == want, (name, n, offset, hex(value))  # type: ignore[operator]
        assert crc(data[:n]) == crc32c_package.crc32c(data[:n]), (name, n)  # type: ignore[operator]
        assert crc(bytearray(data[:n])) == crc32c_package.crc32c(data[:n]), (name, n)  # type: ignore[operator]


@pytest.mark.parametrize(("name", "crc"), crc_functions(), ids=[n for n, _ in crc_functions()])
def test_crc32c_continues_from_a_previous_value(name: str, crc: object) -> None:
    data = rng_bytes(200_000, seed=2)
    for cut in (0, 1, 8, 769, 24577, 100_000, 200_000):
        first = crc(data[:cut])  # type: ignore[operator]
        assert crc(data[cut:], first) == crc32c_package.crc32c(data), (name, cut)  # type: ignore[operator]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=3000), st.integers(0, 7), st.integers(0, 2**32 - 1))
def test_crc32c_matches_the_package_on_random_data(data: bytes, offset: int, value: int) -> None:
    chunk = memoryview(data)[min(offset, len(data)):]
    want = crc32c_package.crc32c(chunk, value)
    assert kernels.crc32c(chunk, value) == want
    if NATIVE is not None:
        assert NATIVE.crc32c(chunk, value) == want


def random_ranges(rng: np.random.Generator, size: int, n: int) -> tuple[I64, I64]:
    """``n`` ranges inside ``size`` bytes: random, empty, whole-buffer and at the edges."""
    a = rng.integers(0, size + 1, size=n)
    b = rng.integers(0, size + 1, size=n)
    starts, ends = np.minimum(a, b), np.maximum(a, b)
    starts[::7] = ends[::7]  # empty ranges
    extra_s = [0, 0, size, size, 0, size // 2]
    extra_e = [0, size, size, size, 1 if size else 0, size // 2]
    return (np.concatenate([starts, extra_s]).astype(np.int64), np.concatenate([ends, extra_e]).astype(np.int64))


def test_crc32c_ranges_match_the_package_per_range(kernel_path: str) -> None:
    rng = np.random.default_rng(3)
    data = rng_bytes(150_000, seed=3)
    for buf in (data, bytearray(data), memoryview(data)[5:], memoryview(data)[:0]):
        starts, ends = random_ranges(rng, len(buf), 200)
        got = kernels.crc32c_ranges(buf, starts, ends)
        view = memoryview(buf)
        want = [crc32c_package.crc32c(view[s:e]) for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]
        assert got.dtype == np.uint32 and got.tolist() == want
        if kernel_path == "native":  # the extension's own, used only with the CPU's CRC instruction
            assert NATIVE is not None
            assert np.frombuffer(NATIVE.crc32c_ranges(buf, starts, ends), dtype="<u4").tolist() == want
    # frame-like ranges of every CRC length, back to back, and an empty list
    lengths = np.array(CRC_LENGTHS, dtype=np.int64)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    buf = rng_bytes(int(ends[-1]) + 3, seed=4)
    unaligned = memoryview(buf)[3:]
    assert kernels.crc32c_ranges(unaligned, starts, ends).tolist() == [
        crc32c_package.crc32c(unaligned[s:e]) for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]
    assert kernels.crc32c_ranges(buf, [], []).tolist() == []
    assert kernels.crc32c_ranges(buf, [5, 0], [9, 4]).tolist() == [crc32c_package.crc32c(buf[5:9]),
                                                                   crc32c_package.crc32c(buf[0:4])]


# ---------------------------------------------------------------------------- gather_ranges


def joined(buf: bytes | memoryview, starts: I64, ends: I64) -> bytes:
    view = memoryview(buf)
    return b"".join(view[s:e] for s, e in zip(starts.tolist(), ends.tolist(), strict=True))


@pytest.mark.parametrize("with_scratch", [False, True])
def test_gather_ranges_joins_the_slices(kernel_path: str, with_scratch: bool) -> None:
    rng = np.random.default_rng(5)
    data = rng_bytes(100_000, seed=5)
    for buf in (data, bytearray(data), memoryview(data)[3:]):
        starts, ends = random_ranges(rng, len(buf), 300)
        scratch = kernels.Scratch() if with_scratch else None
        out = kernels.gather_ranges(buf, starts, ends, scratch)
        assert isinstance(out, memoryview) and not out.readonly
        assert bytes(out) == joined(buf, starts, ends)
        if len(out):
            out[0] = out[0] ^ 0xFF  # writable in place
            out[-1:] = b"!"
    empty = kernels.gather_ranges(data, [], [], kernels.Scratch() if with_scratch else None)
    assert bytes(empty) == b"" and not empty.readonly


def test_a_reused_scratch_gives_the_right_bytes_every_time(kernel_path: str) -> None:
    rng = np.random.default_rng(6)
    data = rng_bytes(300_000, seed=6)
    scratch = kernels.Scratch()
    # a request, a smaller one, a much larger one, one just larger than that, a tiny one
    for total_at_most in (5_000, 100, 120_000, 250_000, 3, 290_000):
        starts = np.sort(rng.integers(0, len(data) - total_at_most, size=20))
        lengths = rng.integers(0, total_at_most // 20 + 1, size=20)
        ends = starts + lengths
        out = kernels.gather_ranges(data, starts, ends, scratch)
        assert len(out) == int(lengths.sum())
        assert bytes(out) == joined(data, starts, ends), total_at_most
        assert not out.readonly


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=500), st.lists(st.tuples(st.integers(0, 500), st.integers(0, 500)), max_size=30),
       st.booleans())
def test_gather_ranges_native_and_fallback_agree(data: bytes, pairs: list[tuple[int, int]], scratch: bool) -> None:
    starts = np.array([min(a, b, len(data)) for a, b in pairs], dtype=np.int64)
    ends = np.array([min(max(a, b), len(data)) for a, b in pairs], dtype=np.int64)
    want = joined(data, starts, ends)
    got = bytes(kernels.gather_ranges(data, starts, ends, kernels.Scratch() if scratch else None))
    assert got == want
    crcs = kernels.crc32c_ranges(data, starts, ends).tolist()
    with fallback_kernels():
        assert bytes(kernels.gather_ranges(data, starts, ends, kernels.Scratch() if scratch else None)) == want
        assert kernels.crc32c_ranges(data, starts, ends).tolist() == crcs


# ----------------------------------------------------------------------------- check_frames


def frames(rng: np.random.Generator, sizes: list[int]) -> tuple[bytearray, I64, I64, I64]:
    """Frames (12-byte header: payload length, CRC32C of the payload, record count; then the
    payload) at unaligned offsets with gaps between them, and their footer columns."""
    buf = bytearray(rng.bytes(3))
    offsets, lengths, counts = [], [], []
    for i, size in enumerate(sizes):
        payload = rng.bytes(size)
        offsets.append(len(buf))
        lengths.append(12 + size)
        counts.append(i % 5 + 1)
        buf += struct.pack("<III", size, crc32c_package.crc32c(payload), counts[-1]) + payload
        buf += rng.bytes(i % 3)
    o, n, c = (np.array(x, dtype=np.int64) for x in (offsets, lengths, counts))
    return buf, o, n, c


def check_frames_everywhere(buf: bytes | bytearray, o: I64, n: I64, c: I64) -> int:
    got = kernels.check_frames(buf, o, n, c)
    if kernels._native_crc is not None:
        assert kernels._native_crc.check_frames(buf, o, n, c) == got
    return got


def test_check_frames_finds_the_first_bad_frame(kernel_path: str) -> None:
    rng = np.random.default_rng(9)
    sizes = [0, 1, 7, 8, 9, 255, 256, 767, 768, 769, 5000, 24577, 3, 0, 100]
    buf, o, n, c = frames(rng, sizes)
    assert check_frames_everywhere(buf, o, n, c) == -1
    assert check_frames_everywhere(memoryview(bytes(buf)), o, n, c) == -1
    assert check_frames_everywhere(buf, o[:0], n[:0], c[:0]) == -1
    for k in (0, 4, len(sizes) - 1):
        wrong_count = c.copy()
        wrong_count[k] += 1
        assert check_frames_everywhere(buf, o, n, wrong_count) == k, "record count"
        bad = bytearray(buf)
        struct.pack_into("<I", bad, int(o[k]), sizes[k] + 1)  # header's payload length
        assert check_frames_everywhere(bad, o, n, c) == k, "payload length"
        bad = bytearray(buf)
        bad[int(o[k]) + 4] ^= 0x01  # header's checksum
        assert check_frames_everywhere(bad, o, n, c) == k, "checksum field"
        if sizes[k]:
            bad = bytearray(buf)
            bad[int(o[k] + n[k]) - 1] ^= 0x80  # last payload byte
            assert check_frames_everywhere(bad, o, n, c) == k, "payload"
    bad = bytearray(buf)
    bad[int(o[9]) + 12] ^= 0xFF
    bad[int(o[5]) + 12] ^= 0xFF
    assert check_frames_everywhere(bad, o, n, c) == 5  # the first of two


@pytest.mark.parametrize("case", ["frame past the buffer", "negative offset", "shorter than its header",
                                  "counts of another length"])
def test_check_frames_refuses_impossible_frames(kernel_path: str, case: str) -> None:
    buf, o, n, c = frames(np.random.default_rng(10), [10, 20, 30])
    if case == "frame past the buffer":
        n[2] += 1 + len(buf) - int(o[2] + n[2])
    elif case == "negative offset":
        o[0] = -1
    elif case == "shorter than its header":
        n[1] = 11
    else:
        c = c[:2]
    with pytest.raises(ValueError):
        kernels.check_frames(buf, o, n, c)


# ------------------------------------------------------------------------ ranges out of bounds

BAD_RANGES = {
    "start below zero": ([-1], [2]),
    "end before start": ([5], [4]),
    "end past the buffer": ([0], [101]),
    "start and end past the buffer": ([101], [101]),
    "bad range among good ones": ([0, 10, 50, 99], [10, 20, 101, 100]),
    "end before start among good ones": ([0, 30, 20], [10, 40, 10]),
    "end far past the buffer": ([0], [1 << 62]),  # a corrupt footer: must not be allocated for
    "starts and ends of different lengths": ([0, 1], [1]),
}


@pytest.mark.parametrize("case", list(BAD_RANGES))
@pytest.mark.parametrize("func", ["crc32c_ranges", "gather_ranges", "gather_ranges+scratch"])
def test_ranges_outside_the_buffer_raise_value_error(kernel_path: str, func: str, case: str) -> None:
    buf = rng_bytes(100, seed=7)
    starts, ends = (np.array(x, dtype=np.int64) for x in BAD_RANGES[case])
    with pytest.raises(ValueError):
        if func == "crc32c_ranges":
            kernels.crc32c_ranges(buf, starts, ends)
        else:
            kernels.gather_ranges(buf, starts, ends, kernels.Scratch() if func.endswith("scratch") else None)
    if kernel_path == "native" and func == "crc32c_ranges":  # the extension's own check
        assert NATIVE is not None
        with pytest.raises(ValueError):
            NATIVE.crc32c_ranges(buf, starts, ends)


@needs_native
def test_native_gather_into_a_too_small_buffer_raises() -> None:
    assert NATIVE is not None
    buf = rng_bytes(100, seed=8)
    s, e = np.array([0, 50], dtype=np.int64), np.array([10, 60], dtype=np.int64)
    assert bytes(NATIVE.gather_ranges(buf, s, e)) == buf[0:10] + buf[50:60]
    out = bytearray(25)
    assert NATIVE.gather_ranges(buf, s, e, out) == 20 and bytes(out[:20]) == buf[0:10] + buf[50:60]
    with pytest.raises(ValueError):
        NATIVE.gather_ranges(buf, s, e, bytearray(19))
    with pytest.raises(ValueError):  # starts and ends must be 8-byte integers
        NATIVE.crc32c_ranges(buf, s.astype(np.int32), e.astype(np.int32))


# ----------------------------------------------------------------------- latest of each key


def check_latest(hi: U64, lo: U64, *, expect_native: bool | None = None) -> None:
    """Every implementation gives the reference answer; ``expect_native``: whether the C
    table must answer (True), must give up (False), or either."""
    want = reference_latest(hi, lo)
    for name, got in (("latest_of_each_key", latest_of_each_key(hi, lo)),
                      ("latest_by_sorting", latest_by_sorting(hi, lo))):
        assert got.dtype.kind == "i", name
        assert np.array_equal(got, want), name
    native = kernels.latest_positions(hi, lo)
    if native is not None:
        assert np.array_equal(native, want), "latest_positions"
    if NATIVE is not None and expect_native is not None:
        assert (native is not None) == expect_native, (
            f"latest_positions returned {'an answer' if native is not None else 'None'}: expected the C table to "
            f"{'answer' if expect_native else 'give up on crowding keys'}")
    with fallback_kernels():
        assert kernels.latest_positions(hi, lo) is None
        assert np.array_equal(latest_of_each_key(hi, lo), want), "latest_of_each_key without the C kernels"


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=80))
def test_latest_with_colliding_tiny_hashes(pairs: list[tuple[int, int]]) -> None:
    check_latest(u64([p[0] for p in pairs]), u64([p[1] for p in pairs]))


SPECIAL_HI = [0, 1, 2, 3, 2**63 - 1, 2**63, 2**63 + 1, 2**64 - 2, 2**64 - 1, 1 << 40, (1 << 40) + 1,
              int(CRAFTED_TOP), int(CRAFTED_TOP) + 1, int(CRAFTED_TOP) + (1 << 23)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.sampled_from(SPECIAL_HI), st.integers(0, 2**64 - 1)),
                          st.sampled_from([0, 1, 2**64 - 1])), max_size=300))
def test_latest_with_keys_sharing_high_bits(pairs: list[tuple[int, int]]) -> None:
    check_latest(u64([p[0] for p in pairs]), u64([p[1] for p in pairs]))


def test_latest_on_many_random_records() -> None:
    hi, lo = random_records(np.random.default_rng(10), 20_000, 200_000)
    check_latest(hi, lo, expect_native=True)


def test_latest_with_every_key_sharing_the_high_half() -> None:
    rng = np.random.default_rng(11)
    k_hi = np.repeat(random_u64(rng, 50), 200)  # 50 high halves, 200 keys each
    k_lo = random_u64(rng, len(k_hi))
    pick = rng.integers(0, len(k_hi), size=60_000)
    check_latest(k_hi[pick], k_lo[pick])
    check_latest(np.full(5_000, 12345, dtype=np.uint64), rng.integers(0, 1000, size=5_000, dtype=np.uint64))


def test_latest_after_a_long_run_of_sorted_distinct_keys() -> None:
    """A finished map (distinct keys, sorted) followed by new records: this used to crowd
    the table's first slots."""
    rng = np.random.default_rng(12)
    map_hi = np.sort(random_u64(rng, 150_000))
    map_lo = random_u64(rng, len(map_hi))
    new_hi, new_lo = random_records(rng, 30_000, 100_000)
    again = rng.integers(0, len(map_hi), size=50_000)  # some map keys written again
    hi = np.concatenate([map_hi, new_hi, map_hi[again]])
    lo = np.concatenate([map_lo, new_lo, map_lo[again]])
    check_latest(hi, lo, expect_native=True)
    check_latest(map_hi, map_lo, expect_native=True)
    check_latest(map_hi[::-1].copy(), map_lo[::-1].copy(), expect_native=True)


def test_latest_with_keys_crafted_to_share_their_top_bits() -> None:
    rng = np.random.default_rng(13)
    hi, lo = crafted_records(rng, 20_000, 60_000)
    check_latest(hi, lo, expect_native=False)
    # mixed with ordinary keys, before and after
    u_hi, u_lo = random_records(rng, 5_000, 20_000)
    check_latest(np.concatenate([u_hi, hi, u_hi]), np.concatenate([u_lo, lo, u_lo]))


def test_latest_of_nothing_and_of_one() -> None:
    empty = np.empty(0, dtype=np.uint64)
    check_latest(empty, empty)
    check_latest(u64([2**64 - 1]), u64([0]))


# -------------------------------------------------------------------------------- KeyTable


def chunk_bounds(n: int, rng: np.random.Generator, pieces: int = 7) -> list[tuple[int, int]]:
    cuts = np.unique(np.concatenate([[0, n], rng.integers(0, n + 1, size=pieces)])).tolist()
    return list(itertools.pairwise(cuts))


def finished(table: kernels.KeyTable, keep: bool = False) -> tuple[U64, U64, I64]:
    return columns(table.finish(keep=keep))


@needs_native
@pytest.mark.parametrize("expected", [0, 50_000])
def test_key_table_in_chunks_with_first(expected: int) -> None:
    rng = np.random.default_rng(20)
    hi, lo = random_records(rng, 20_000, 80_000)
    table = new_table(expected)
    base = 1_000
    for a, b in chunk_bounds(len(hi), rng):
        assert table.add(hi[a:b], lo[a:b], None, base + a) == b - a
    want = latest_dict(hi, lo, np.arange(base, base + len(hi), dtype=np.int64))
    assert len(table) == len(want)
    assert table.nbytes > 0
    assert_columns_equal(finished(table), sorted_columns(want))
    assert len(table) == 0 and table.nbytes == 0


@needs_native
def test_key_table_keeps_the_greatest_explicit_position() -> None:
    rng = np.random.default_rng(21)
    hi, lo = random_records(rng, 5_000, 30_000)
    pos = rng.permutation(len(hi)).astype(np.int64) * 3 + 7  # not in record order
    table = new_table()
    for a, b in chunk_bounds(len(hi), rng):
        assert table.add(hi[a:b], lo[a:b], pos[a:b]) == b - a
    want = latest_dict(hi, lo, pos)
    assert len(table) == len(want)
    assert_columns_equal(finished(table), sorted_columns(want))


@needs_native
def test_key_table_parts_together_equal_one_table() -> None:
    rng = np.random.default_rng(22)
    hi, lo = random_records(rng, 10_000, 40_000)
    whole, parts = new_table(), [new_table(), new_table()]
    for a, b in chunk_bounds(len(hi), rng):
        whole.add(hi[a:b], lo[a:b], first=a)
        for part, table in enumerate(parts):
            assert table.add(hi[a:b], lo[a:b], first=a, part_shift=63, part=part) == b - a
    want = latest_dict(hi, lo)
    assert len(parts[0]) + len(parts[1]) == len(whole) == len(want)
    assert len(parts[0]) == sum(1 for h, _ in want if h < 2**63)
    q_hi, q_lo = absent_queries(rng, hi, lo)
    in_parts = np.frombuffer(parts[0].contains(q_hi, q_lo), dtype=np.uint8) | \
        np.frombuffer(parts[1].contains(q_hi, q_lo), dtype=np.uint8)
    assert as_bools(in_parts.astype(bool)) == as_bools(whole.contains(q_hi, q_lo)) == membership(want, q_hi, q_lo)
    split = [finished(t) for t in parts]
    joined_parts = tuple(np.concatenate([split[0][i], split[1][i]]) for i in range(3))
    assert_columns_equal(joined_parts, finished(whole))  # type: ignore[arg-type]
    assert_columns_equal(joined_parts, sorted_columns(want))  # type: ignore[arg-type]


@needs_native
@pytest.mark.parametrize("expected", [0, 1, 30_000])
def test_key_table_lookups_and_finish_keep(expected: int) -> None:
    rng = np.random.default_rng(23)
    hi, lo = random_records(rng, 15_000, 40_000)
    shared_hi = np.repeat(hi[:100], 3)  # keys sharing a high half with others
    shared_lo = random_u64(rng, len(shared_hi))
    hi, lo = np.concatenate([hi, shared_hi]), np.concatenate([lo, shared_lo])
    table = new_table(expected)
    empty = np.empty(0, dtype=np.uint64)
    assert as_bools(table.contains(hi[:10], lo[:10])) == [False] * 10  # nothing added yet
    assert table.contains(empty, empty) == bytearray()
    table.add(hi, lo)
    want = latest_dict(hi, lo)
    q_hi, q_lo = absent_queries(rng, hi, lo)
    assert as_bools(table.contains(q_hi, q_lo)) == membership(want, q_hi, q_lo)
    kept = finished(table, keep=True)
    assert_columns_equal(kept, sorted_columns(want))
    assert len(table) == len(want)
    assert as_bools(table.contains(q_hi, q_lo)) == membership(want, q_hi, q_lo)
    assert_columns_equal(finished(table, keep=True), kept)  # keep twice: the same
    assert_columns_equal(finished(table), kept)
    assert len(table) == 0
    assert not any(as_bools(table.contains(q_hi, q_lo)))
    assert all(len(c) == 0 for c in finished(table))
    # an emptied table takes records again, with any part_shift
    assert table.add(hi[:1000], lo[:1000], part_shift=63, part=1) == 1000
    assert len(table) == len({k for k in zip(hi[:1000].tolist(), lo[:1000].tolist(), strict=True) if k[0] >= 2**63})


@needs_native
def test_key_table_lookup_filter_answers_like_the_table() -> None:
    """``prepare_lookups`` (and ``finish(keep=True)``) add a filter of the low hash's low
    bits that answers most misses: keys that pass it but are absent (same low bits,
    another high half) still answer no, and an ``add`` after it drops the filter, so keys
    added later are found."""
    rng = np.random.default_rng(41)
    hi, lo = random_records(rng, 3_000, 6_000)
    table = new_table(len(hi))
    table.add(hi, lo)
    want = latest_dict(hi, lo)
    q_hi, q_lo = absent_queries(rng, hi, lo)
    # absent keys that pass the filter: a present key's low half with another high half
    q_hi = np.concatenate([q_hi, random_u64(rng, 2_000)])
    q_lo = np.concatenate([q_lo, lo[:2_000]])
    before = as_bools(table.contains(q_hi, q_lo))
    assert before == membership(want, q_hi, q_lo)
    bytes_without = table.nbytes
    table.prepare_lookups()
    assert table.nbytes > bytes_without  # the filter is there (16 to 32 bits a key)
    assert table.nbytes - bytes_without <= len(want) * 4 + 512
    assert as_bools(table.contains(q_hi, q_lo)) == before
    # new keys after the filter was built: found (a stale filter would hide them)
    more_hi, more_lo = random_u64(rng, 5_000), random_u64(rng, 5_000)
    assert table.add(more_hi, more_lo, first=len(hi)) == 5_000
    assert table.nbytes == bytes_without or len(table) > len(want)
    all_hi, all_lo = np.concatenate([hi, more_hi]), np.concatenate([lo, more_lo])
    want_all = latest_dict(all_hi, all_lo)
    assert all(as_bools(table.contains(more_hi, more_lo)))
    assert as_bools(table.contains(q_hi, q_lo)) == membership(want_all, q_hi, q_lo)
    table.prepare_lookups()
    assert all(as_bools(table.contains(all_hi, all_lo)))
    assert as_bools(table.contains(q_hi, q_lo)) == membership(want_all, q_hi, q_lo)
    assert_columns_equal(finished(table, keep=True), sorted_columns(want_all))
    assert all(as_bools(table.contains(all_hi, all_lo)))


@needs_native
def test_key_table_lookup_filter_on_an_empty_table() -> None:
    table = new_table()
    table.prepare_lookups()  # nothing added: no filter, no error
    q = u64([1, 2, 3])
    assert as_bools(table.contains(q, q)) == [False] * 3
    table.add(q, q)
    table.prepare_lookups()
    assert as_bools(table.contains(q, q)) == [True] * 3
    assert as_bools(table.contains(q + np.uint64(1 << 40), q)) == [False] * 3


@needs_native
def test_key_table_refuses_mismatched_input() -> None:
    hi = u64([1, 2, 3])
    lo = u64([4, 5, 6])
    table = new_table()
    table.add(hi, lo)
    with pytest.raises(ValueError):
        table.add(hi, lo, part_shift=63)  # another part_shift on the same table
    with pytest.raises(ValueError):
        table.add(hi[:2], lo)
    with pytest.raises(ValueError):
        table.add(hi, lo[:2])
    with pytest.raises(ValueError):
        table.add(hi, lo, np.arange(2, dtype=np.int64))
    with pytest.raises(ValueError):
        table.add(hi.astype(np.uint32), lo.astype(np.uint32))
    with pytest.raises(ValueError):
        table.contains(hi, lo[:1])
    for shift in (0, 65):
        with pytest.raises(ValueError):
            table.add(hi, lo, part_shift=shift)
    assert len(table) == 3
    other = new_table()
    other.add(hi, lo, part_shift=63, part=0)
    with pytest.raises(ValueError):
        other.add(hi, lo)


@needs_native
def test_key_table_gives_up_on_crowding_keys() -> None:
    rng = np.random.default_rng(24)
    hi, lo = crafted_records(rng, 20_000, 20_000)
    table = new_table()
    taken = table.add(hi, lo)
    assert 0 < taken < len(hi)
    assert len(table) == taken  # every crafted key is distinct: the taken prefix is in
    assert all(as_bools(table.contains(hi[:taken], lo[:taken])))
    assert_columns_equal(finished(table), sorted_columns(latest_dict(hi[:taken], lo[:taken])))


# ------------------------------------------------------------------ KeyMapBuilder and KeyMap

Chunk = tuple[U64, U64, I64 | None, int]


def random_chunks(rng: np.random.Generator, hi: U64, lo: U64, explicit_every: int = 2) -> list[Chunk]:
    """Consecutive chunks of the records, some with explicit positions, some with ``first``."""
    chunks: list[Chunk] = []
    for i, (a, b) in enumerate(chunk_bounds(len(hi), rng)):
        if i % explicit_every == 0:
            chunks.append((hi[a:b], lo[a:b], np.arange(a, b, dtype=np.int64), 0))
        else:
            chunks.append((hi[a:b], lo[a:b], None, a))
    return chunks


def build_map(chunks: list[Chunk], *, native: bool, capacity: int = 10**7, for_lookups: bool = False,
              part_shift: int = 64, part: int = 0) -> KeyMap:
    def build() -> KeyMap:
        builder = KeyMapBuilder(capacity)
        for hi, lo, pos, first in chunks:
            builder.add(hi, lo, pos, first=first, part_shift=part_shift, part=part)
        return builder.build(for_lookups=for_lookups)

    if native:
        return build()
    with numpy_keymap():
        return build()


def map_columns(m: KeyMap) -> tuple[U64, U64, I64]:
    return m.hi, m.lo, m.pos


@needs_native
def test_builder_with_and_without_the_table_gives_the_same_map() -> None:
    rng = np.random.default_rng(30)
    hi, lo = random_records(rng, 30_000, 120_000)
    chunks = random_chunks(rng, hi, lo)
    want = sorted_columns(latest_dict(hi, lo))
    native, fallback = build_map(chunks, native=True), build_map(chunks, native=False)
    assert_columns_equal(map_columns(native), want)
    assert_columns_equal(map_columns(fallback), want)
    for part in (0, 1):  # one thread's share of the hash range, as pass one's threads build it
        keep = (hi >> np.uint64(63)) == part
        part_want = sorted_columns({k: p for k, p in latest_dict(hi, lo).items() if (k[0] >> 63) == part})
        assert np.count_nonzero(keep) > 0
        for native_path in (True, False):
            got = build_map(chunks, native=native_path, part_shift=63, part=part)
            assert_columns_equal(map_columns(got), part_want)


def chunks_latest(chunks: list[Chunk]) -> dict[Key, int]:
    """The reference map of a sequence of builder chunks."""
    latest: dict[Key, int] = {}
    for hi, lo, pos, first in chunks:
        positions = pos if pos is not None else np.arange(first, first + len(hi), dtype=np.int64)
        latest.update(latest_dict(hi, lo, positions))  # later chunks hold later positions
    return latest


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=12), max_size=8),
       st.booleans())
def test_builder_paths_agree_on_tiny_colliding_hashes(chunk_pairs: list[list[tuple[int, int]]],
                                                      explicit: bool) -> None:
    chunks: list[Chunk] = []
    at = 0
    for pairs in chunk_pairs:
        hi, lo = u64([p[0] for p in pairs]), u64([p[1] for p in pairs])
        if explicit:  # positions with gaps
            chunks.append((hi, lo, np.arange(at, at + len(pairs), dtype=np.int64) * 2, 0))
        else:
            chunks.append((hi, lo, None, at))
        at += len(pairs)
    latest = chunks_latest(chunks)
    probe_hi = u64([h for h in range(5) for _ in range(5)])
    probe_lo = u64([x for _ in range(5) for x in range(5)])
    for native in (True, False):
        m = build_map(chunks, native=native, for_lookups=True)
        assert_columns_equal(map_columns(m), sorted_columns(latest))
        assert as_bools(m.contains(probe_hi, probe_lo)) == membership(latest, probe_hi, probe_lo)


def fits_answers(existing: tuple[U64, U64], query: tuple[U64, U64], capacity: int, native: bool) -> tuple[bool, Key]:
    """``fits(query)`` after adding ``existing``, and the finished map after adding the query too."""
    def run() -> tuple[bool, Key]:
        builder = KeyMapBuilder(capacity)
        builder.add(*existing)
        fits = builder.fits(*query)
        builder.add(*query, first=len(existing[0]))
        m = builder.build()
        return fits, (len(m), int(m.pos.sum()))

    if native:
        return run()
    with numpy_keymap():
        return run()


@pytest.mark.parametrize("native", [pytest.param(True, marks=needs_native), False], ids=["table", "numpy"])
def test_builder_fits_exactly_at_the_capacity_boundary(native: bool) -> None:
    rng = np.random.default_rng(31)
    e_hi, e_lo = random_records(rng, 2_000, 6_000)
    existing_keys = len(latest_dict(e_hi, e_lo))
    n_hi, n_lo = random_u64(rng, 300), random_u64(rng, 300)  # 300 new keys
    again = rng.integers(0, len(e_hi), size=2_000)
    mixed = rng.permutation(np.concatenate([np.arange(2_000), 2_000 + np.tile(np.arange(300), 3)]))
    q_hi = np.concatenate([e_hi[again], n_hi])[mixed]
    q_lo = np.concatenate([e_lo[again], n_lo])[mixed]
    total = existing_keys + 300
    assert len(latest_dict(np.concatenate([e_hi, q_hi]), np.concatenate([e_lo, q_lo]))) == total
    for capacity in (total - 1, total, total + 1, existing_keys, total + len(q_hi)):
        fits, _ = fits_answers((e_hi, e_lo), (q_hi, q_lo), capacity, native)
        assert fits == (total <= capacity), capacity
    # and both paths build the same map
    if NATIVE is not None:
        assert fits_answers((e_hi, e_lo), (q_hi, q_lo), total, True) == \
            fits_answers((e_hi, e_lo), (q_hi, q_lo), total, False)


@needs_native
@pytest.mark.parametrize("for_lookups", [False, True])
def test_builder_survives_a_table_crowded_mid_way(for_lookups: bool) -> None:
    rng = np.random.default_rng(32)
    u_hi, u_lo = random_records(rng, 5_000, 15_000)
    c_hi, c_lo = crafted_records(rng, 20_000, 30_000)
    v_hi, v_lo = random_records(rng, 5_000, 10_000)
    hi = np.concatenate([u_hi, c_hi, v_hi, c_hi[:5_000], u_hi[:3_000]])
    lo = np.concatenate([u_lo, c_lo, v_lo, c_lo[:5_000], u_lo[:3_000]])
    bounds = [(0, 15_000), (15_000, 45_000), (45_000, 55_000), (55_000, 60_000), (60_000, 63_000)]
    chunks: list[Chunk] = [(hi[a:b], lo[a:b], None, a) if i % 2 else
                           (hi[a:b], lo[a:b], np.arange(a, b, dtype=np.int64), 0) for i, (a, b) in enumerate(bounds)]
    want_map = latest_dict(hi, lo)
    want = sorted_columns(want_map)
    native = build_map(chunks, native=True, for_lookups=for_lookups)
    assert_columns_equal(map_columns(native), want)
    assert_columns_equal(map_columns(build_map(chunks, native=False, for_lookups=for_lookups)), want)
    q_hi, q_lo = absent_queries(rng, hi, lo)
    assert as_bools(native.contains(q_hi, q_lo)) == membership(want_map, q_hi, q_lo)
    # fits() after the table gave up still counts exactly
    builder = KeyMapBuilder(len(want_map))
    for c_hi_, c_lo_, pos, first in chunks[:-1]:
        builder.add(c_hi_, c_lo_, pos, first=first)
    assert builder._table is None, "the crafted keys should have crowded the C table"
    assert builder.fits(hi[60_000:], lo[60_000:])  # keys already in: nothing new
    assert not builder.fits(random_u64(rng, 1), random_u64(rng, 1))


def lookups(hi: U64, lo: U64, pos: I64, q_hi: U64, q_lo: U64, *, native: bool) -> list[bool]:
    def run() -> list[bool]:
        m = KeyMap.sorted(hi, lo, pos)
        got = m.contains(q_hi, q_lo)
        assert got.dtype == np.bool_ and len(got) == len(q_hi)
        if NATIVE is not None:
            assert (m._lookup["table"] is not None) == native, "the lookup path was not the one meant"
        return as_bools(got)

    if native:
        return run()
    with numpy_keymap():
        return run()


@needs_native
@pytest.mark.parametrize("keys", ["random", "shared high halves", "crafted"])
def test_key_map_contains_agrees_with_and_without_the_table(keys: str) -> None:
    rng = np.random.default_rng(40)
    if keys == "random":
        hi, lo = random_records(rng, 40_000, 40_000)
    elif keys == "shared high halves":
        hi = np.repeat(random_u64(rng, 2_000), 10)
        lo = random_u64(rng, len(hi))
    else:
        hi, lo = crafted_records(rng, 20_000, 20_000)
    latest = latest_dict(hi, lo)
    m_hi, m_lo, m_pos = sorted_columns(latest)
    q_hi, q_lo = absent_queries(rng, hi, lo)
    q_hi = np.concatenate([q_hi, m_hi + np.uint64(1), m_hi - np.uint64(1), u64([0, 2**64 - 1])])
    q_lo = np.concatenate([q_lo, m_lo, m_lo, u64([0, 2**64 - 1])])
    want = membership(latest, q_hi, q_lo)
    if keys == "crafted":  # the table is crowded: the map searches instead, either way
        assert lookups(m_hi, m_lo, m_pos, q_hi, q_lo, native=False) == want
        m = KeyMap.sorted(m_hi, m_lo, m_pos)
        assert as_bools(m.contains(q_hi, q_lo)) == want
        assert m._lookup["table"] is None
        return
    assert lookups(m_hi, m_lo, m_pos, q_hi, q_lo, native=True) == want
    assert lookups(m_hi, m_lo, m_pos, q_hi, q_lo, native=False) == want


@pytest.mark.parametrize("native", [pytest.param(True, marks=needs_native), False], ids=["table", "numpy"])
def test_build_for_lookups_gives_a_map_that_answers(native: bool) -> None:
    rng = np.random.default_rng(41)
    hi, lo = random_records(rng, 20_000, 60_000)
    hi[:300] = hi[300:600]  # some keys share a high half
    chunks = random_chunks(rng, hi, lo)
    m = build_map(chunks, native=native, for_lookups=True)
    latest = latest_dict(hi, lo)
    assert_columns_equal(map_columns(m), sorted_columns(latest))
    assert m.shared_high
    if native:
        assert m._lookup.get("table") is not None  # the builder's table, kept for lookups
    q_hi, q_lo = absent_queries(rng, hi, lo)
    assert as_bools(m.contains(q_hi, q_lo)) == membership(latest, q_hi, q_lo)
    empty = np.empty(0, dtype=np.uint64)
    assert len(m.contains(empty, empty)) == 0


# ------------------------------------------------------------------------------ end to end

E2E_CLOCK = 1_700_000_000.0


def produce(uri: str, start: int, n: int, keys: int) -> None:
    """Deterministic records: repeated keys, tombstones, keyless records, values of many sizes."""
    with TopicWriter(uri, batch_size=7, max_ledger_records=600, clock=lambda: E2E_CLOCK) as w:
        for i in range(start, start + n):
            key = None if i % 53 == 0 else f"key-{(i * 7919) % keys}"
            value = None if i % 41 == 0 else f"v{i}-" + "x" * ((i * 31) % 300)
            w.append(key, value)


def compact(uri: str, kernels_env: str, *args: str) -> dict[str, object]:
    res = run_cli(uri, "--json", *args, script="compact", env={"SHALE_KERNELS": kernels_env}, timeout=120)
    assert res.returncode == 0, res.stderr
    report: dict[str, object] = json.loads(res.stdout.strip().splitlines()[-1])
    return report


def kernels_in_subprocess(kernels_env: str) -> str:
    res = subprocess.run([sys.executable, "-c", "from shale.ledger import kernels; print(kernels.KERNELS)"],
                         capture_output=True, text=True, env={**os.environ, "SHALE_KERNELS": kernels_env},
                         timeout=60, check=True)
    return res.stdout.strip()


def test_compaction_is_the_same_with_and_without_the_c_kernels(tmp_path: Path) -> None:
    assert kernels_in_subprocess("numpy") == "numpy"
    if kernels_in_subprocess("") != "native":
        missing(f"the C extension built from ledger/_kernels.c is not built: nothing to compare ({BUILD_HOW})")
    native_uri, numpy_uri = str(tmp_path / "native" / "topic"), str(tmp_path / "numpy" / "topic")
    produce(native_uri, 0, 4_000, keys=1_500)
    shutil.copytree(native_uri, numpy_uri)
    reports: dict[str, list[dict[str, object]]] = {"native": [], "numpy": []}
    for uri, env, name in ((native_uri, "", "native"), (numpy_uri, "numpy", "numpy")):
        # a key map too small for the run (partial compaction), then the rest, then new records
        reports[name].append(compact(uri, env, "--max-map-bytes", "24KiB"))
        reports[name].append(compact(uri, env))
    for uri in (native_uri, numpy_uri):
        produce(uri, 4_000, 2_500, keys=2_000)
    for uri, env, name in ((native_uri, "", "native"), (numpy_uri, "numpy", "numpy")):
        reports[name].append(compact(uri, env, "--max-map-bytes", "24KiB"))
        reports[name].append(compact(uri, env, "--delete-retention", "0"))
    counted = ("status", "horizon", "records_read", "records_written", "keys", "tombstones_kept", "tombstones_dropped",
               "keyless_dropped", "deferred_records", "map_keys")
    for a, b in zip(reports["native"], reports["numpy"], strict=True):
        assert {k: a.get(k) for k in counted} == {k: b.get(k) for k in counted}
    assert reports["native"][0]["deferred_records"] and reports["native"][2]["deferred_records"], \
        "the key map should have been too small for the first run of each batch"

    views = {}
    for uri, name in ((native_uri, "native"), (numpy_uri, "numpy")):
        views[name] = [(m.id, m.key, m.value) for m in TopicReader(uri, read_compacted=True).read()]
    assert len(views["native"]) == len(views["numpy"]) > 0
    for i, (a, b) in enumerate(zip(views["native"], views["numpy"], strict=True)):
        assert a == b, f"record {i} differs"
    everything = TopicReader(native_uri).read()
    horizon = TopicMetadata.open(native_uri).load_compaction().horizon
    model = expected_view(everything, horizon, keep_tombstones=False)
    assert views["native"] == [(m.id, m.key, m.value) for m in model]


# ------------------------------------------------------------------------------ tiling check


def tiled_footer(rng: np.random.Generator, entries: int) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32],
                                                                   I64, npt.NDArray[np.uint32]]:
    """Columns of a footer whose records tile their entries: (offsets, sizes, entry
    starts, frame lengths)."""
    counts = rng.integers(1, 6, size=entries)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    sizes = rng.integers(0, 300, size=int(starts[-1])).astype(np.uint32)
    offsets = np.zeros(len(sizes), dtype=np.uint32)
    lengths = np.zeros(entries, dtype=np.uint32)
    for j in range(entries):
        a, b = int(starts[j]), int(starts[j + 1])
        offsets[a:b] = np.concatenate([[0], np.cumsum(sizes[a:b])[:-1]])
        lengths[j] = 12 + int(sizes[a:b].sum())
    return offsets, sizes, starts, lengths


def test_tiling_error_accepts_a_sound_footer(kernel_path: str) -> None:
    rng = np.random.default_rng(5)
    for entries in (0, 1, 2, 50, 3_000):
        assert kernels.tiling_error(*tiled_footer(rng, entries)) == 0


@pytest.mark.parametrize("case, code", [
    ("first_not_zero", 1), ("gap", 1), ("overlap", 1), ("wraps", 1), ("short_entry", 2), ("long_entry", 2),
    ("starts_backwards", 3), ("starts_past_the_end", 3), ("negative_start", 3),
])
def test_tiling_error_names_what_is_wrong(kernel_path: str, case: str, code: int) -> None:
    rng = np.random.default_rng(6)
    off, size, starts, lengths = tiled_footer(rng, 40)
    size[size == 0] = 1  # every record holds bytes, so a shift shows
    for j in range(40):
        a, b = int(starts[j]), int(starts[j + 1])
        off[a:b] = np.concatenate([[0], np.cumsum(size[a:b])[:-1]])
        lengths[j] = 12 + int(size[a:b].sum())
    multi = int(np.flatnonzero(np.diff(starts) >= 2)[0])  # an entry of two records or more
    a = int(starts[multi])
    if case == "first_not_zero":
        off[a] = 1
    elif case == "gap":
        off[a + 1] += 1
    elif case == "overlap":
        off[a + 1] -= 1
    elif case == "wraps":
        # the second record's offset is where a huge first one would end, mod 2**32
        size[a] = np.uint32(2**32 - 1)
        off[a + 1] = np.uint32(2**32 - 1)
    elif case == "short_entry":
        lengths[multi] -= 1
    elif case == "long_entry":
        lengths[multi] += 1
    elif case == "starts_backwards":
        starts[multi + 1] = starts[multi]
    elif case == "starts_past_the_end":
        starts[-1] = len(off) + 1
    else:
        starts[0] = -1
    assert kernels.tiling_error(off, size, starts, lengths) == code


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 200), st.sampled_from(["off", "size", "len"]),
       st.integers(0, 2**32 - 1))
def test_tiling_error_native_and_fallback_agree(seed: int, entries: int, column: str, value: int) -> None:
    rng = np.random.default_rng(seed)
    cols = list(tiled_footer(rng, entries))
    target = {"off": 0, "size": 1, "len": 3}[column]
    if len(cols[target]):
        cols[target][int(rng.integers(0, len(cols[target])))] = np.uint32(value)
    with fallback_kernels():
        want = kernels.tiling_error(*cols)
    if NATIVE is not None:
        assert kernels.tiling_error(*cols) == want


@needs_native
def test_native_tiling_error_refuses_other_buffers() -> None:
    off, size, starts, lengths = tiled_footer(np.random.default_rng(7), 5)
    with pytest.raises(ValueError, match="uint32"):
        NATIVE.tiling_error(off.astype(np.uint64), size, starts, lengths)
    with pytest.raises(ValueError, match="one longer"):
        NATIVE.tiling_error(off, size, starts[:-1], lengths)
    # unaligned views of the columns (footers are views of an object's bytes) are read as they are
    raw = bytearray(1) + off.tobytes()
    unaligned = np.frombuffer(memoryview(raw)[1:], dtype=np.uint32)
    assert NATIVE.tiling_error(unaligned, size, starts, lengths) == 0


# --------------------------------------------------------------------------- early writeback


def test_start_writeback_is_a_hint(tmp_path: Path) -> None:
    path = tmp_path / "f"
    with open(path, "wb") as f:
        f.write(b"x" * (1 << 16))
        f.flush()
        started = kernels.start_writeback(f.fileno(), 0, 1 << 16)
        assert started is (NATIVE is not None and sys.platform == "linux")
    assert path.read_bytes() == b"x" * (1 << 16)  # the data is untouched
    r, w = os.pipe()
    try:
        assert kernels.start_writeback(w, 0, 10) is False  # not a file: refused, not raised
    finally:
        os.close(r)
        os.close(w)
    if NATIVE is not None:
        with pytest.raises(ValueError, match="negative"):
            NATIVE.start_writeback(0, -1, 10)


def test_local_writes_start_writeback_as_they_go_and_still_sync(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import shale.storage._local as local

    kicks: list[tuple[int, int]] = []
    syncs: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(local, "start_writeback", lambda fd, off, n: kicks.append((off, n)) or True)
    monkeypatch.setattr(os, "fsync", lambda fd: (syncs.append(fd), real_fsync(fd))[1])
    store = local.LocalStore()
    key = str(tmp_path / "obj").lstrip("/")
    chunk = b"y" * (768 << 10)
    with store.open_writer(key) as w:
        for _ in range(4):
            w.write(chunk)
    assert kicks == [(0, 2 * len(chunk)), (2 * len(chunk), 2 * len(chunk))]  # every MiB or so, in order
    assert len(syncs) == 1  # the close still syncs
    assert store.get(key) == chunk * 4
    kicks.clear()
    store.put(key, chunk * 2, durable=False)
    assert kicks == []  # nothing to hurry when nothing is synced


# ------------------------------------------------------------------------- copy planning


def reference_copy(keep: npt.NDArray[np.bool_], starts: I64, sel: I64, offsets: npt.NDArray[np.uint32],
                   sizes: npt.NDArray[np.uint32], payloads: bytes, frame_at: I64) -> tuple[list[int], bytes,
                                                                                            list[int], list[int]]:
    """The kept records of ``sel`` one by one: (records, joined output bytes without the
    rebuilt headers' contents, new offsets, batch places), the way pass two means them."""
    recs: list[int] = []
    out = bytearray()
    new_off: list[int] = []
    places: list[int] = []
    for e in sel.tolist():
        a, b = int(starts[e]), int(starts[e + 1])
        mine = [r for r in range(a, b) if keep[r]]
        frame = payloads[int(frame_at[e]):int(frame_at[e + 1])]
        if len(mine) == b - a:
            out += frame
            new_off += [int(offsets[r]) for r in mine]
        else:
            out += frame[:12]  # the old header, rewritten by the caller
            at = 0
            for r in mine:
                out += frame[12 + int(offsets[r]):12 + int(offsets[r]) + int(sizes[r])]
                new_off.append(at)
                at += int(sizes[r])
        recs += mine
        places += [r - a for r in mine]
    return recs, bytes(out), new_off, places


def planned_ledger(rng: np.random.Generator, entries: int) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32],
                                                                   I64, npt.NDArray[np.uint32], bytes, I64]:
    """A ledger's columns and its frames' bytes back to back (random contents)."""
    off, size, starts, lengths = tiled_footer(rng, entries)
    frame_at = np.concatenate([[0], np.cumsum(lengths.astype(np.int64))])
    data = rng.integers(0, 256, size=int(frame_at[-1]), dtype=np.uint8).tobytes()
    return off, size, starts, lengths, data, frame_at


@pytest.mark.parametrize("share", [0.0, 0.3, 0.9, 1.0])
def test_copy_plan_keeps_exactly_the_kept_bytes(kernel_path: str, share: float) -> None:
    rng = np.random.default_rng(int(share * 10) + 3)
    off, size, starts, lengths, data, frame_at = planned_ledger(rng, 400)
    keep = rng.random(len(off)) < share
    counts = np.add.reduceat(keep, starts[:-1]) if len(off) else np.zeros(0)
    sel = np.flatnonzero(counts > 0).astype(np.int64)
    base = int(frame_at[sel[0]]) if len(sel) else 0  # the buffer read starts at the first entry of sel
    plan = kernels.copy_plan(keep, starts, sel, frame_at[sel] - base, lengths[sel].astype(np.int64), off, size)
    recs, joined, new_off, places = reference_copy(keep, starts, sel, off, size, data, frame_at)
    assert plan.rec.tolist() == recs
    assert plan.new_off.tolist() == new_off
    assert plan.in_entry.tolist() == places
    assert plan.kept.tolist() == [int(keep[starts[e]:starts[e + 1]].sum()) for e in sel]
    assert plan.whole.tolist() == [bool(keep[starts[e]:starts[e + 1]].all()) for e in sel]
    assert int(plan.lengths.sum()) == len(joined)
    assert kernels.gather_ranges(data[base:], plan.starts, plan.ends).tobytes() == joined
    if 0 < share < 1:
        assert len(plan.starts) < len(sel) + len(recs)  # adjacent kept records make one range


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 60), st.floats(0, 1))
def test_copy_plan_native_and_fallback_agree(seed: int, entries: int, share: float) -> None:
    rng = np.random.default_rng(seed)
    off, size, starts, lengths, _data, frame_at = planned_ledger(rng, entries)
    keep = rng.random(len(off)) < share
    # any rising choice of entries, kept records or not
    sel = np.flatnonzero(rng.random(entries) < 0.7).astype(np.int64)
    args = (keep, starts, sel, frame_at[sel] + 5, lengths[sel].astype(np.int64), off, size)
    with fallback_kernels():
        want = kernels.copy_plan(*args)
    if NATIVE is not None:
        got = kernels.copy_plan(*args)
        for name, g, w in zip(want._fields, got, want, strict=True):
            assert g.dtype == w.dtype, name
            assert g.tolist() == w.tolist(), name


@pytest.mark.parametrize("case, message", [
    ("entry_outside", "not an entry of the ledger"), ("negative_entry", "not an entry of the ledger"),
    ("records_outside", "outside the ledger"), ("short_sizes", "one length"), ("short_offsets", "one length"),
])
def test_copy_plan_refuses_impossible_input(kernel_path: str, case: str, message: str) -> None:
    off, size, starts, lengths, _data, frame_at = planned_ledger(np.random.default_rng(8), 10)
    keep = np.ones(len(off), dtype=bool)
    sel = np.arange(10, dtype=np.int64)
    if case == "entry_outside":
        sel[-1] = 10
    elif case == "negative_entry":
        sel[0] = -1
    elif case == "records_outside":
        starts = starts.copy()
        starts[-1] = len(off) + 1
    elif case == "short_sizes":
        size = size[:-1]
    else:
        off = off[:-1]
    with pytest.raises(ValueError, match=message):
        kernels.copy_plan(keep, starts, sel, frame_at[:-1], lengths.astype(np.int64), off, size)


@needs_native
def test_native_copy_plan_refuses_other_buffers() -> None:
    off, size, starts, lengths, _data, frame_at = planned_ledger(np.random.default_rng(9), 4)
    keep = np.ones(len(off), dtype=np.uint8)
    sel = np.arange(4, dtype=np.int64)
    with pytest.raises(ValueError, match="uint32"):
        NATIVE.copy_plan(keep, starts, sel, frame_at[:-1], lengths.astype(np.int64), off.astype(np.int64), size)
    with pytest.raises(ValueError, match="1-byte"):
        NATIVE.copy_plan(keep.astype(np.int64), starts, sel, frame_at[:-1], lengths.astype(np.int64), off, size)


@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.int64, np.float64])
def test_copy_plan_reads_any_keep_as_kept_when_not_zero(kernel_path: str, dtype: type) -> None:
    off, size, starts, lengths, _data, frame_at = planned_ledger(np.random.default_rng(10), 6)
    flags = np.random.default_rng(11).random(len(off)) < 0.5
    keep = flags.astype(dtype)
    if dtype is np.int64:
        keep = keep * 256  # not a byte: 256 is kept, as any non-zero
    sel = np.arange(6, dtype=np.int64)
    plan = kernels.copy_plan(keep, starts, sel, frame_at[:-1], lengths.astype(np.int64), off, size)
    assert plan.rec.tolist() == np.flatnonzero(flags).tolist()
