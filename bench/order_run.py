"""Whole compaction runs in offset order against event-time order (and with a key TTL).

    .venv/bin/python bench/order_run.py [--records 20000000 --keys 2000000 --pairs 3]

Writes a topic of ``--records`` records over ``--keys`` uniformly drawn keys, every record
with an event time in record order but for ~5 % up to ten minutes late (zstd, entries of
1,000 records), under bench/data/.  Then times, in interleaved rounds, a first (full)
compaction in each order, the compaction state removed between runs; then, on a second
topic of a tenth of the size, an incremental run over 1 % new records in each order.
Prints medians (wall, and CPU of the process and its workers: compare those on a shared
machine), the ratio to offset order, the key map's bytes per key, the last run's phases
and peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shale.compactor import CompactionConfig, Compactor
from shale.producer import TopicWriter

BASE_MS = 1_700_000_000_000


def generate(path: Path, records: int, keys: int, seed: int, first: int = 0) -> None:
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    chunk = 1_000_000
    with TopicWriter(str(path), batch_size=1000, max_ledger_records=1_000_000) as w:
        for a in range(first, first + records, chunk):
            n = min(chunk, first + records - a)
            pick = rng.integers(0, keys, size=n)
            event = BASE_MS + (a + np.arange(n, dtype=np.int64)) * 3
            late = rng.random(n) < 0.05
            event[late] -= rng.integers(1, 600_000, size=int(late.sum()))
            table = pa.table({"key": pa.array([f"key-{k:09d}" for k in pick.tolist()]),
                              "value": pa.array([f"{a + i:012d}" + "x" * 52 for i in range(n)]),
                              "event_time": pa.array(event)})
            w.append_batch(table, event_time="event_time")


def reset(path: Path) -> None:
    """Forget every compaction of the topic (the bench's own topic only)."""
    (path / "_meta" / "compaction.json").unlink(missing_ok=True)
    shutil.rmtree(path / "compacted", ignore_errors=True)


def _cpu() -> float:
    """CPU time of this process and its children (pass two's workers), user + system."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def run(path: Path, order: str, ttl_ms: int = 0) -> tuple[float, dict[str, object]]:
    """One run: its wall time, and its figures (CPU time and the run's phases among them)."""
    cfg = CompactionConfig(delete_retention_ms=0, order=order, key_ttl_ms=ttl_ms)
    start, cpu = time.perf_counter(), _cpu()
    s = Compactor(str(path), cfg).run()
    took = time.perf_counter() - start
    assert s.status == "compacted", s.human()
    return took, {"cpu_s": round(_cpu() - cpu, 3), "keys": s.keys, "map_keys": s.map_keys,
                  "map_bytes": s.map_bytes, "keys_expired": s.keys_expired,
                  "phases_s": {k: round(v, 3) for k, v in s.durations.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=20_000_000)
    p.add_argument("--keys", type=int, default=2_000_000)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--dir", default=str(Path(__file__).resolve().parent / "data"))
    a = p.parse_args()
    big = Path(a.dir) / f"order-{a.records}-{a.keys}"
    if not (big / "_meta").exists():
        generate(big, a.records, a.keys, 1)
    # a TTL that expires the keys whose newest event is in the first 70 % of the topic
    ttl = int(a.records * 3 * 0.7)
    now_ms = int(time.time() * 1000)
    cases = {"offset": ("offset", 0), "event-time": ("event-time", 0),
             "event-time + key TTL": ("event-time", now_ms - BASE_MS - ttl)}
    full: dict[str, list[float]] = {c: [] for c in cases}
    cpu: dict[str, list[float]] = {c: [] for c in cases}
    info: dict[str, dict[str, object]] = {}
    for _ in range(a.pairs):
        for name, (order, t) in cases.items():
            reset(big)
            took, info[name] = run(big, order, t)
            full[name].append(took)
            cpu[name].append(float(info[name]["cpu_s"]))  # type: ignore[arg-type]
    base, base_cpu = statistics.median(full["offset"]), statistics.median(cpu["offset"])
    print(f"full run, {a.records:,} records / {a.keys:,} keys, median of {a.pairs} (wall; CPU):")
    for name, ts in full.items():
        m, c = statistics.median(ts), statistics.median(cpu[name])
        d = info[name]
        per_key = int(d["map_bytes"]) / max(1, int(d["map_keys"]))  # type: ignore[call-overload]
        print(f"  {name:22s} {m:7.2f} s  {base / m:5.2f}x offset order's speed; CPU {c:6.2f} s  {base_cpu / c:5.2f}x  "
              f"map {per_key:.0f} bytes a key  {json.dumps(d)}")

    small = Path(a.dir) / f"order-incr-{a.records // 10}-{a.keys // 10}"
    incr: dict[str, list[float]] = {"offset": [], "event-time": []}
    for rnd in range(a.pairs):
        for order in incr:
            topic = small.with_name(f"{small.name}-{order}-{rnd}")
            shutil.rmtree(topic, ignore_errors=True)
            generate(topic, a.records // 10, a.keys // 10, 2)
            run(topic, order)
            generate(topic, a.records // 1000, a.keys // 10, 3, first=a.records // 10)
            took, _ = run(topic, order)
            incr[order].append(took)
            shutil.rmtree(topic, ignore_errors=True)
    base = statistics.median(incr["offset"])
    print(f"incremental run, {a.records // 10:,} records + 1 %, median of {a.pairs}:")
    for name, ts in incr.items():
        m = statistics.median(ts)
        print(f"  {name:22s} {m:7.3f} s  {base / m:5.2f}x offset order's speed")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
