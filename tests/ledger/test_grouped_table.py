"""Records partitioned by hash (``partition_keys``) and put group by group into the key
table (``KeyTable.add_grouped``): the table ends as ``add`` of the same records leaves it,
and as the reference model says, whatever the hashes: uniform, all in one group, at the
edges of groups, crafted to crowd the table (where the builder's sorting path takes over),
and with positions given or counted."""

from __future__ import annotations

import numpy as np
import pytest

from shale.compactor.keymap import KeyMapBuilder, Run
from shale.ledger import kernels
from tests.ledger.test_kernels import (
    I64,
    U64,
    assert_columns_equal,
    chunk_bounds,
    crafted_records,
    finished,
    latest_dict,
    needs_native,
    new_table,
    random_records,
    random_u64,
    sorted_columns,
)

pytestmark = pytest.mark.kernels  # (scripts/sanitize.sh runs these under ASan and UBSan)


def runs_of(hi: U64, lo: U64, rng: np.random.Generator, pos: I64 | None = None) -> list[Run]:
    """The records as runs of random lengths, positions counted (``first``) or given."""
    out: list[Run] = []
    for a, b in chunk_bounds(len(hi), rng):
        out.append((hi[a:b], lo[a:b], None, a) if pos is None else (hi[a:b], lo[a:b], pos[a:b], 0))
    return out


def grouped_parts(runs: list[Run], bits: int, part_bits: int, pieces: int = 2) -> list[kernels.KeyTable]:
    """One table a part, filled from ``pieces`` partitioned sources as pass one does."""
    cut = len(runs) // 2
    sources = [kernels.partition_keys(piece, bits) for piece in ([runs[:cut], runs[cut:]] if pieces == 2 else [runs])]
    tables = []
    for part in range(1 << part_bits):
        table = new_table(1_000)
        assert table.add_grouped([s for s in sources if s is not None], 64 - part_bits, part) is True
        tables.append(table)
    return tables


def joined(tables: list[kernels.KeyTable]) -> tuple[U64, U64, I64]:
    cols = [finished(t) for t in tables]
    return (np.concatenate([c[0] for c in cols]), np.concatenate([c[1] for c in cols]),
            np.concatenate([c[2] for c in cols]))


@needs_native
@pytest.mark.parametrize(("bits", "part_bits"), [(1, 0), (4, 1), (9, 2), (16, 3)])
def test_grouped_parts_equal_the_model_and_add(bits: int, part_bits: int) -> None:
    rng = np.random.default_rng(bits)
    hi, lo = random_records(rng, 6_000, 40_000)
    pos = (rng.permutation(len(hi)) * 5 + 3).astype(np.int64)  # not in record order
    for given in (None, pos):
        runs = runs_of(hi, lo, rng, given)
        want = sorted_columns(latest_dict(hi, lo, given))
        assert_columns_equal(joined(grouped_parts(runs, bits, part_bits)), want)
        plain = new_table()
        for h, lw, p, first in runs:
            plain.add(h, lw, p, first)
        assert_columns_equal(finished(plain), want)


@needs_native
def test_partition_keys_groups_by_the_top_bits_in_record_order() -> None:
    rng = np.random.default_rng(5)
    hi, lo = random_records(rng, 300, 3_000)
    got = kernels.partition_keys([(hi, lo, None, 10)], 5)
    assert got is not None
    records, ends = got
    rec = np.frombuffer(records, dtype=np.uint64).reshape(-1, 3)
    assert len(ends) == 32 and ends[-1] == len(hi)
    group = (hi >> np.uint64(59)).astype(np.int64)
    order = np.argsort(group, kind="stable")
    assert np.array_equal(rec[:, 0], hi[order]) and np.array_equal(rec[:, 1], lo[order])
    assert np.array_equal(rec[:, 2].astype(np.int64), order + 10)
    assert np.array_equal(ends, np.cumsum(np.bincount(group, minlength=32)))
    # a buffer handed back is written over when big enough (what lies past the records
    # stays), and left alone when not
    big, small = bytearray(b"\xff" * (len(records) + 48)), bytearray(16)
    again = kernels.partition_keys([(hi, lo, None, 10)], 5, big)
    assert again is not None and again[0] is big and bytes(big[:len(records)]) == bytes(records)
    assert np.array_equal(again[1], ends) and big[len(records):] == b"\xff" * 48
    other = kernels.partition_keys([(hi, lo, None, 10)], 5, small)
    assert other is not None and other[0] is not small and bytes(other[0]) == bytes(records) and small == bytearray(16)
    table = new_table()
    assert table.add_grouped([(big, again[1])]) is True
    assert_columns_equal(finished(table), sorted_columns(latest_dict(hi, lo, np.arange(10, 10 + len(hi)))))


def built_by_parts(runs: list[Run], bits: int, part_bits: int) -> tuple[U64, U64, I64]:
    """The map pass one builds: a builder a part, fed the partitioned runs in two chunks."""
    builders = [KeyMapBuilder(10**6, expected=1_000) for _ in range(1 << part_bits)]
    half = len(runs) // 2
    for chunk in (runs[:half], runs[half:]):
        sources = [s for s in (kernels.partition_keys(chunk[:2], bits), kernels.partition_keys(chunk[2:], bits))
                   if s is not None]
        for part, b in enumerate(builders):
            b.add_grouped(sources, chunk, 64 - part_bits, part)
    cols = [b.finish() for b in builders]
    return (np.concatenate([c[0] for c in cols]), np.concatenate([c[1] for c in cols]),
            np.concatenate([c[2] for c in cols]))


@needs_native
def test_every_key_in_one_group_and_keys_at_group_edges() -> None:
    """Keys at the first and last hash of every group and across each edge go where add
    puts them; keys that all share one group (and so their top hash bits) crowd a table as
    they do under add, and the builders' map is still the model's."""
    rng = np.random.default_rng(6)
    bits = 6
    starts = np.arange(1 << bits, dtype=np.uint64) << np.uint64(64 - bits)
    edges = np.concatenate([starts, starts - np.uint64(1), starts + np.uint64(1), starts | np.uint64((1 << 58) - 1)])
    k_lo = random_u64(rng, len(edges))
    pick = rng.integers(0, len(edges), size=5_000)
    hi, lo = edges[pick], k_lo[pick]
    runs = runs_of(hi, lo, rng)
    want = sorted_columns(latest_dict(hi, lo))
    for part_bits in (0, 1, 2):
        assert_columns_equal(joined(grouped_parts(runs, bits, part_bits)), want)
        assert_columns_equal(built_by_parts(runs, bits, part_bits), want)
    one_hi = np.uint64(7 << 58) | (random_u64(rng, 4_000) >> np.uint64(6))
    one_lo = random_u64(rng, 4_000)
    pick = rng.integers(0, 4_000, size=12_000)
    hi, lo = one_hi[pick], one_lo[pick]
    runs = runs_of(hi, lo, rng)
    one = kernels.partition_keys(runs, bits)
    assert one is not None and np.count_nonzero(np.diff(one[1], prepend=0)) == 1
    for part_bits in (0, 1, 2):
        assert_columns_equal(built_by_parts(runs, bits, part_bits), sorted_columns(latest_dict(hi, lo)))


@needs_native
def test_crowding_keys_hand_over_to_the_sorting_path() -> None:
    """Keys crafted to share their top bits crowd a part's table: add_grouped says so, and
    the builder then sorts every record of those runs, some already in the table: its map
    is still the model's."""
    rng = np.random.default_rng(7)
    hi, lo = crafted_records(rng, 30_000, 60_000)
    runs = runs_of(hi, lo, rng)
    sources = [s for s in (kernels.partition_keys(runs, 8),) if s is not None]
    table = new_table(10)
    assert table.add_grouped(sources) is False
    builder = KeyMapBuilder(10**6, expected=10)
    half = len(runs) // 2
    for chunk in (runs[:half], runs[half:]):  # the second chunk goes the sorting path from the start
        builder.add_grouped([s for s in (kernels.partition_keys(chunk, 8),) if s is not None], chunk)
    got = builder.build()
    assert_columns_equal((got.hi, got.lo, got.pos), sorted_columns(latest_dict(hi, lo)))


@needs_native
def test_grouped_input_is_checked() -> None:
    hi = np.array([1, 2 << 60, 3 << 62], dtype=np.uint64)
    lo = np.array([5, 6, 7], dtype=np.uint64)
    with pytest.raises(ValueError, match="position 1 is negative"):
        kernels.partition_keys([(hi, lo, np.array([0, -1, 2], dtype=np.int64), 0)], 2)
    with pytest.raises(ValueError, match="bits"):
        kernels.partition_keys([(hi, lo, None, 0)], 17)
    with pytest.raises(TypeError, match="tuple"):
        kernels.partition_keys([[hi, lo, None, 0]], 2)  # type: ignore[list-item]
    got = kernels.partition_keys([(hi, lo, None, 0)], 2)
    assert got is not None
    records, ends = got
    table = new_table()
    with pytest.raises(ValueError, match="split the table's part"):
        table.add_grouped([(records, ends)], 61, 0)  # 2 bits of groups cannot split 3 bits of part
    with pytest.raises(ValueError, match="partition_keys"):
        table.add_grouped([(records, ends), (records, np.zeros(8, dtype=np.int64))])
    with pytest.raises(ValueError, match="partition_keys"):
        table.add_grouped([(records, np.array([0, 1, 9, 3], dtype=np.int64))])
    foreign = bytearray(records)
    np.frombuffer(foreign, dtype=np.uint64)[0] = np.uint64(3 << 62)  # a record outside group 0
    with pytest.raises(ValueError, match="outside"):
        table.add_grouped([(foreign, ends)], 63, 0)
    negative = bytearray(records)
    np.frombuffer(negative, dtype=np.int64)[2] = -5
    with pytest.raises(ValueError, match="negative"):
        new_table().add_grouped([(negative, ends)])
    with pytest.raises(ValueError, match="event"):
        kernels._native.KeyTable(0, with_events=True).add_grouped([(records, ends)])
    assert table.add_grouped([]) is True and table.add_grouped([(records, ends)]) is True and len(table) == 3
