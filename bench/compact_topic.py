"""Time a first compaction and an incremental one on a generated topic.

    .venv/bin/python bench/compact_topic.py --records 1000000 --keys 100000

Prints one JSON line per phase: records/s, wall time, peak RSS.  The topic is written
under bench/data/ (or --dir) and reused when it already matches the parameters.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shale.compactor import CompactionConfig, Compactor
from shale.producer import TopicWriter
from shale.reader import TopicReader


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def generate(uri: str, records: int, keys: int, value_bytes: int, seed: int, **writer: int) -> float:
    rng = random.Random(seed)
    pad = "x" * max(0, value_bytes - 12)
    t = time.perf_counter()
    with TopicWriter(uri, **writer) as w:
        for i in range(records):
            w.append(f"key-{rng.randrange(keys):09d}", f"{i:012d}{pad}")
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--value-bytes", type=int, default=64)
    p.add_argument("--increment", type=float, default=0.01, help="share of new records for the incremental run")
    p.add_argument("--dir", default=str(Path(__file__).resolve().parent / "data"))
    p.add_argument("--uri", default=None, help="topic URI (default: a folder under --dir)")
    a = p.parse_args()
    uri = a.uri or os.path.join(a.dir, f"topic-{a.records}-{a.keys}-{a.value_bytes}")
    if a.uri is None and os.path.exists(uri):
        shutil.rmtree(uri)
    gen = generate(uri, a.records, a.keys, a.value_bytes, 1, batch_size=100, max_ledger_records=500_000)
    print(json.dumps({"phase": "produce", "records": a.records, "seconds": round(gen, 2),
                      "records_per_s": round(a.records / gen)}), flush=True)

    cfg = CompactionConfig(delete_retention_ms=0)
    s = Compactor(uri, cfg).run()
    total = s.durations["total"]
    print(json.dumps({"phase": "first compaction", "records": s.records_read, "seconds": round(total, 3),
                      "records_per_s": round(s.records_read / total), "keys": s.keys,
                      "written": s.records_written, "durations": {k: round(v, 3) for k, v in s.durations.items()},
                      "peak_rss_mb": round(rss_mb())}), flush=True)

    new = int(a.records * a.increment)
    generate(uri, new, a.keys, a.value_bytes, 2, batch_size=100)
    s2 = Compactor(uri, cfg).run()
    t2 = s2.durations["total"]
    print(json.dumps({"phase": "incremental compaction", "new_records": new, "records_read": s2.records_read,
                      "seconds": round(t2, 3), "ratio_to_first": round(t2 / total, 3),
                      "durations": {k: round(v, 3) for k, v in s2.durations.items()},
                      "peak_rss_mb": round(rss_mb())}), flush=True)

    t = time.perf_counter()
    n = sum(1 for _ in TopicReader(uri, read_compacted=True))
    tr = time.perf_counter() - t
    t = time.perf_counter()
    m = sum(1 for _ in TopicReader(uri))
    tf = time.perf_counter() - t
    print(json.dumps({"phase": "restore", "compacted_read_records": n, "compacted_read_s": round(tr, 3),
                      "full_replay_records": m, "full_replay_s": round(tf, 3),
                      "speedup": round(tf / tr, 1)}), flush=True)


if __name__ == "__main__":
    main()
