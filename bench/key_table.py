"""Pass one's key table alone: what its inserts cost, and what putting them in by hash could save.

    .venv/bin/python bench/key_table.py [--records 20000000] [--keys 2000000] [--threads 2] [--repeat 5]

Fills :class:`~shale.ledger.kernels.KeyTable` the way a full run's pass one does: the
128-bit hashes of ``--records`` records over ``--keys`` keys, handed over in slices of
500,000 (a ledger's), each of ``--threads`` threads taking the records of one range of
hash values into its own table, sized for its keys.  Three orders of the same work,
interleaved ``--repeat`` times, each thread's CPU time summed over the threads:

* ``position``: the records in position order, as pass one puts them (each insert lands
  anywhere in a table of tens of megabytes);
* ``by_hash``: each thread's records put in order of the top 12 bits of their hash (a
  key's home slot grows with its hash, so each stretch of 1/4096 of the table is filled
  before the next): the most a key table partitioned by hash could gain, the partitioning
  itself not counted;
* ``grouped``: what pass one does now: each chunk of 4 M records partitioned by hash
  (:func:`~shale.ledger.kernels.partition_keys`, a piece of each chunk a thread), then
  each thread's table filled group by group (``KeyTable.add_grouped``), groups of about
  1 MiB of table: partitioning counted;
* ``in_cache``: as many records over 2,000 keys (a table of a few KiB): what the inserts
  cost when no slot is ever a cache miss, the floor of any ordering.

Prints one JSON line per run, then the medians in nanoseconds per record (CPU time of
every thread, over the records of the run), what putting records in by hash saves at
most, and what the grouped way saves with its partitioning counted.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shale.compactor.pass_one import _group_bits
from shale.ledger.kernels import new_key_table, partition_keys

SLICE = 500_000
CHUNK = 4_000_000
U64 = npt.NDArray[np.uint64]


def records(n: int, keys: int, seed: int) -> tuple[U64, U64]:
    rng = np.random.default_rng(seed)
    hi = rng.integers(0, 2**64 - 1, keys, dtype=np.uint64, endpoint=True)
    lo = rng.integers(0, 2**64 - 1, keys, dtype=np.uint64, endpoint=True)
    pick = rng.integers(0, keys, n)
    return hi[pick], lo[pick]


def by_hash(hi: U64, lo: U64, threads: int) -> list[tuple[U64, U64, npt.NDArray[np.int64]]]:
    """Each thread's records, ordered by the 12 hash bits after those that choose the thread."""
    bits = (threads - 1).bit_length()
    out = []
    for t in range(threads):
        mine = np.flatnonzero((hi >> np.uint64(64 - bits)) == t) if bits else np.arange(len(hi))
        order = np.argsort((hi[mine] << np.uint64(bits)) >> np.uint64(52), kind="stable")
        at = mine[order]
        out.append((hi[at], lo[at], at.astype(np.int64)))
    return out


def fill(kind: str, hi: U64, lo: U64, keys: int, threads: int,
         ordered: list[tuple[U64, U64, npt.NDArray[np.int64]]]) -> dict[str, Any]:
    bits = (threads - 1).bit_length()
    shift = 64 - bits if bits else 64
    expected = keys // threads + keys // threads // 16 + 1024

    def one(t: int) -> tuple[float, int]:
        table = new_key_table(expected)
        if table is None:
            raise SystemExit("the C kernels are not built")
        c = time.thread_time()
        if kind == "by_hash":
            h, lo_, pos = ordered[t]
            for a in range(0, len(h), SLICE):
                table.add(h[a:a + SLICE], lo_[a:a + SLICE], pos[a:a + SLICE], 0, shift, t)
        else:
            for a in range(0, len(hi), SLICE):
                table.add(hi[a:a + SLICE], lo[a:a + SLICE], None, a, shift, t)
        taken = len(table)
        return time.thread_time() - c, taken

    with ThreadPoolExecutor(max_workers=threads) as pool:
        got = grouped(hi, lo, expected, threads, pool) if kind == "grouped" else list(pool.map(one, range(threads)))
    cpu = sum(g[0] for g in got)
    return {"order": kind, "cpu_seconds": round(cpu, 3), "keys": sum(g[1] for g in got),
            "ns_per_record": round(cpu / len(hi) * 1e9, 2)}


def grouped(hi: U64, lo: U64, expected: int, threads: int, pool: ThreadPoolExecutor) -> list[tuple[float, int]]:
    """Pass one's way: chunks partitioned by hash, a piece a thread, then a table a part
    filled group by group; each thread's CPU time of both steps."""
    bits = (threads - 1).bit_length()
    gbits = bits + max(1, _group_bits(expected))  # (as pass one, but grouped at any size)
    tables = [new_key_table(expected) for _ in range(1 << bits)]
    spent: list[float] = []  # each step's CPU time, in whichever thread

    spare: list[bytearray | None] = [None] * threads

    def part(k: int, piece: tuple[int, int]) -> tuple[bytearray, npt.NDArray[np.int64]]:
        c = time.thread_time()
        a, b = piece
        got = partition_keys([(hi[a:b], lo[a:b], None, a)], gbits, spare[k])
        spent.append(time.thread_time() - c)
        assert got is not None
        return got

    def put(t: int, sources: list[tuple[bytearray, npt.NDArray[np.int64]]]) -> None:
        c = time.thread_time()
        table = tables[t]
        assert table is not None and table.add_grouped(sources, 64 - bits if bits else 64, t)
        spent.append(time.thread_time() - c)

    for c0 in range(0, len(hi), CHUNK):
        c1 = min(len(hi), c0 + CHUNK)
        cuts = [c0 + (c1 - c0) * k // threads for k in range(threads + 1)]
        sources = list(pool.map(part, range(threads), itertools.pairwise(cuts)))
        list(pool.map(lambda t, s=sources: put(t, s), range(len(tables))))
        spare = [records for records, _ in sources]
    return [(sum(spent), sum(len(t or []) for t in tables))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=20_000_000)
    p.add_argument("--keys", type=int, default=2_000_000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    hi, lo = records(a.records, a.keys, 1)
    ordered = by_hash(hi, lo, a.threads)
    few_hi, few_lo = records(a.records, 2_000, 2)
    runs: dict[str, list[float]] = {"position": [], "by_hash": [], "grouped": [], "in_cache": []}
    for _ in range(a.repeat):
        for kind in runs:
            r = (fill(kind, few_hi, few_lo, 2_000, a.threads, []) if kind == "in_cache"
                 else fill(kind, hi, lo, a.keys, a.threads, ordered))
            print(json.dumps(r), flush=True)
            runs[kind].append(r["ns_per_record"])
    med = {k: round(statistics.median(v), 2) for k, v in runs.items()}
    print(json.dumps({"median_ns_per_record": med,
                      "by_hash_saves_ns": round(med["position"] - med["by_hash"], 2),
                      "grouped_saves_ns": round(med["position"] - med["grouped"], 2),
                      "memory_share": round(1 - med["in_cache"] / med["position"], 2)}))


if __name__ == "__main__":
    main()
