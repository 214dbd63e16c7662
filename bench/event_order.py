"""Event-time order against offset order: deciding the latest record of each key, and the
key map's speed and bytes per key.

    .venv/bin/python bench/event_order.py [--pairs 5] [--only map]

On 20 M records of 2 M uniformly hashed keys and on 2 M records of 200 k keys, with event
times in record order except ~5 % that arrive up to ten minutes late, times
:func:`~shale.compactor.rules.latest_of_each_key` (offset order),
:func:`~shale.compactor.rules.latest_by_event_time` and the plain stable sort by event
time it falls back to; then builds the key map of the 20 M records in both modes (with
the C tables in one thread and in two by hash-range share, and the event map's NumPy
fallback), and looks 2 M keys (half of them in the map) up in each finished map.
Medians of interleaved runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shale.compactor import event_map as event_map_module
from shale.compactor.event_map import EventKeyMapBuilder
from shale.compactor.keymap import KeyMap, KeyMapBuilder
from shale.ledger.kernels import KERNELS
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


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """Wall and CPU seconds (of every thread of the process) of one call."""
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - start, time.process_time() - cpu


def interleaved(cases: dict[str, Callable[[], object]], pairs: int) -> dict[str, tuple[float, float]]:
    """Median wall and CPU seconds of each case, the cases run in turn ``pairs`` times."""
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    for _ in range(pairs):
        for name, fn in cases.items():
            runs[name].append(timed(fn))
    return {name: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t)) for name, t in runs.items()}


def report(got: dict[str, tuple[float, float]], base_of: Callable[[str], str]) -> None:
    for name, (wall, cpu) in got.items():
        base_wall, base_cpu = got[base_of(name)]
        print(f"  {name:38s} {wall * 1000:8.0f} ms wall {base_wall / wall:5.2f}x, {cpu * 1000:8.0f} ms CPU "
              f"{base_cpu / cpu:5.2f}x offset order's speed")


def rules_bench(n: int, keys: int, pairs: int) -> None:
    hi, lo, event = records(n, keys, 0.05)
    want = _latest_by_event_sort(hi, lo, event)
    assert np.array_equal(latest_by_event_time(hi, lo, event), want)
    got = interleaved({
        "offset order (latest_of_each_key)": lambda: latest_of_each_key(hi, lo),
        "event time (latest_by_event_time)": lambda: latest_by_event_time(hi, lo, event),
        "event time (stable sort only)": lambda: _latest_by_event_sort(hi, lo, event),
    }, pairs)
    print(f"{n:,} records, {keys:,} keys, 5 % late, median of {pairs}:")
    report(got, lambda name: "offset order (latest_of_each_key)")


def map_bench(n: int, keys: int, pairs: int) -> None:
    hi, lo, event = records(n, keys, 0.05)
    chunk = 1 << 20  # ledgers of ~1 M records
    table_bytes: dict[str, int] = {}

    # room for the keys from the start, as pass one makes (from its estimate of them)
    def offset_map(part_shift: int = 64, part: int = 0, expected: int = keys) -> KeyMap:
        b = KeyMapBuilder(10**9, expected=expected)
        for a in range(0, n, chunk):
            b.add(hi[a:a + chunk], lo[a:a + chunk], first=a, part_shift=part_shift, part=part)
        if b._table is not None:
            table_bytes["offset"] = b._table.nbytes
        return KeyMap.sorted(*b.finish())

    def event_map(part_shift: int = 64, part: int = 0, expected: int = keys) -> KeyMap:
        b = EventKeyMapBuilder(10**9, expected=expected)
        for a in range(0, n, chunk):
            b.add(hi[a:a + chunk], lo[a:a + chunk], event[a:a + chunk], first=a, part_shift=part_shift, part=part)
        if b._table is not None:
            table_bytes["event"] = b._table.nbytes
        hi_, lo_, pos_, event_ = b.finish()
        return KeyMap.sorted(hi_, lo_, pos_, event_)

    def numpy_event_map() -> KeyMap:
        real = event_map_module.new_event_key_table
        event_map_module.new_event_key_table = lambda expected=0: None  # type: ignore[assignment]
        try:
            return event_map()
        finally:
            event_map_module.new_event_key_table = real

    def in_threads(build: Callable[[int, int, int], KeyMap]) -> Callable[[], KeyMap]:
        def run() -> KeyMap:  # as pass one does: two threads, one half of the hash range each
            with ThreadPoolExecutor(max_workers=2) as pool:
                halves = list(pool.map(lambda part: build(63, part, keys // 2), range(2)))
            cols = [np.concatenate([getattr(h, c) for h in halves]) for c in ("hi", "lo", "pos")]
            ev = [h.event for h in halves]
            return KeyMap.sorted(*cols, np.concatenate(ev) if ev[0] is not None else None)  # type: ignore[arg-type]
        return run

    o, e, f = offset_map(), event_map(), numpy_event_map()
    assert np.array_equal(o.hi, e.hi) and np.array_equal(e.pos, f.pos) and np.array_equal(e.event, f.event)  # type: ignore[arg-type]
    building = {mode: table_bytes.get(mode, 0) / len(o) for mode in ("offset", "event")}
    print(f"key map of {n:,} records, {keys:,} keys ({KERNELS} kernels): finished map offset order "
          f"{o.nbytes / len(o):.0f} bytes/key, event time {e.nbytes / len(e):.0f} bytes/key; the C table while "
          f"building: offset {building['offset']:.0f}, event {building['event']:.0f} bytes/key")
    got = interleaved({
        "offset order (KeyMapBuilder)": offset_map,
        "event time (EventKeyMapBuilder)": event_map,
        "event time, NumPy fallback": numpy_event_map,
        "offset order, 2 threads": in_threads(offset_map),
        "event time, 2 threads": in_threads(event_map),
    }, pairs)
    report(got, lambda name: "offset order, 2 threads" if "threads" in name else "offset order (KeyMapBuilder)")
    lookup_bench(o, e, keys, pairs)


def lookup_bench(o: KeyMap, e: KeyMap, keys: int, pairs: int) -> None:
    """Lookups as an incremental run makes them: the previous part's keys, half of them
    written again (``o``, ``e``: the offset and event maps of the same records)."""
    rng = np.random.default_rng(8)
    q_hi, q_lo = rng.integers(0, 2**64, size=(2, keys), dtype=np.uint64)
    half = rng.permutation(len(o))[: keys // 2]
    q_hi[: keys // 2], q_lo[: keys // 2] = o.hi[half], o.lo[half]

    def contains() -> object:
        m = KeyMap.sorted(o.hi, o.lo, o.pos)
        return m.contains(q_hi, q_lo)

    def events_of() -> object:
        m = KeyMap.sorted(e.hi, e.lo, e.pos, e.event)
        return m.events_of(q_hi, q_lo)

    got = interleaved({"offset order (contains)": contains, "event time (events_of)": events_of}, pairs)
    print(f"lookups of {keys:,} keys, half in the map (the lookup table built first):")
    report(got, lambda name: "offset order (contains)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=5, help="interleaved runs of each case (median taken)")
    ap.add_argument("--only", choices=["rules", "map"], help="only the deciding of winners, or only the key map")
    args = ap.parse_args()
    if args.only != "map":
        rules_bench(20_000_000, 2_000_000, args.pairs)
        rules_bench(2_000_000, 200_000, args.pairs)
    if args.only != "rules":
        map_bench(20_000_000, 2_000_000, args.pairs)


if __name__ == "__main__":
    main()
