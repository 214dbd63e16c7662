"""Event-time order against offset order: deciding the latest record of each key, and the
key map's bytes per key.

    .venv/bin/python bench/event_order.py [--pairs 5]

On 20 M records of 2 M uniformly hashed keys and on 2 M records of 200 k keys, with event
times in record order except ~5 % that arrive up to ten minutes late, times
:func:`~shale.compactor.rules.latest_of_each_key` (offset order),
:func:`~shale.compactor.rules.latest_by_event_time` and the plain stable sort by event
time it falls back to; then builds the key map of the 20 M records in both modes.
Medians of interleaved runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shale.compactor.event_map import EventKeyMapBuilder
from shale.compactor.keymap import KeyMapBuilder
from shale.ledger.latest import _latest_by_event_sort, latest_by_event_time, latest_of_each_key

Arrays = tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], npt.NDArray[np.int64]]


def records(n: int, keys: int, late_share: float, seed: int = 7) -> Arrays:
    rng = np.random.default_rng(seed)
    k_hi, k_lo = rng.integers(0, 2**64, size=(2, keys), dtype=np.uint64)
    pick = rng.integers(0, keys, size=n)
    event = np.arange(n, dtype=np.int64) * 3 + 1_700_000_000_000  # ~3 ms apart
    late = rng.random(n) < late_share
    event[late] -= rng.integers(1, 600_000, size=int(late.sum()))
    return k_hi[pick], k_lo[pick], event


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(cases: dict[str, Callable[[], object]], pairs: int) -> dict[str, float]:
    runs: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(pairs):
        for name, fn in cases.items():
            runs[name].append(timed(fn))
    return {name: statistics.median(t) for name, t in runs.items()}


def rules_bench(n: int, keys: int, pairs: int) -> None:
    hi, lo, event = records(n, keys, 0.05)
    want = _latest_by_event_sort(hi, lo, event)
    assert np.array_equal(latest_by_event_time(hi, lo, event), want)
    got = interleaved({
        "offset order (latest_of_each_key)": lambda: latest_of_each_key(hi, lo),
        "event time (latest_by_event_time)": lambda: latest_by_event_time(hi, lo, event),
        "event time (stable sort only)": lambda: _latest_by_event_sort(hi, lo, event),
    }, pairs)
    base = got["offset order (latest_of_each_key)"]
    print(f"{n:,} records, {keys:,} keys, 5 % late, median of {pairs}:")
    for name, t in got.items():
        print(f"  {name:38s} {t * 1000:8.0f} ms  {base / t:5.2f}x offset order's speed")


def map_bench(n: int, keys: int, pairs: int) -> None:
    hi, lo, event = records(n, keys, 0.05)
    chunk = 1 << 20  # ledgers of ~1 M records

    def offset_map() -> int:
        b = KeyMapBuilder(10**9)
        for a in range(0, n, chunk):
            b.add(hi[a:a + chunk], lo[a:a + chunk], first=a)
        m = b.build()
        return m.nbytes // len(m)

    def event_map() -> int:
        b = EventKeyMapBuilder(10**9)
        for a in range(0, n, chunk):
            b.add(hi[a:a + chunk], lo[a:a + chunk], event[a:a + chunk], first=a)
        m = b.build()
        return m.nbytes // len(m)

    print(f"key map of {n:,} records, {keys:,} keys: offset order {offset_map()} bytes/key, "
          f"event time {event_map()} bytes/key")
    got = interleaved({"offset order (KeyMapBuilder)": offset_map, "event time (EventKeyMapBuilder)": event_map},
                      pairs)
    base = got["offset order (KeyMapBuilder)"]
    for name, t in got.items():
        print(f"  {name:38s} {t * 1000:8.0f} ms  {base / t:5.2f}x offset order's speed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=5, help="interleaved runs of each case (median taken)")
    args = ap.parse_args()
    rules_bench(20_000_000, 2_000_000, args.pairs)
    rules_bench(2_000_000, 200_000, args.pairs)
    map_bench(20_000_000, 2_000_000, args.pairs)


if __name__ == "__main__":
    main()
