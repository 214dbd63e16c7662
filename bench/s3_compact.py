"""Compaction on S3 (a local moto server over HTTP): pass two's read throughput with
one ranged read in flight and with several.

    .venv/bin/python bench/s3_compact.py --records 1000000 --keys 100000

Starts ``tests/moto_server.py --concurrent`` on an ephemeral port (answering after
``--latency-ms``, 20 ms by default, as object storage does), produces the topic
into a bucket, then compacts it from scratch once per ``--parallelism`` value and prints
one JSON line each: bytes read (footers while planning, entries in pass two), read MB/s over
those two phases, and the whole run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--value-bytes", type=int, default=64)
    p.add_argument("--parallelism", type=int, action="append", default=None)
    p.add_argument("--latency-ms", type=int, default=20,
                   help="delay moto adds before each answer, like object storage's time to first byte")
    a = p.parse_args()
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "moto_server.py"), "--concurrent",
                             f"--latency-ms={a.latency_ms}"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().split()[1])
        os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench",
                          AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
        import boto3

        boto3.client("s3").create_bucket(Bucket="bench")
        from shale.compactor import CompactionConfig, Compactor
        from shale.producer import TopicWriter
        from shale.storage import resolve

        uri = "s3://bench/topic"
        rng = random.Random(1)
        pad = "x" * max(0, a.value_bytes - 12)
        t = time.perf_counter()
        with TopicWriter(uri, batch_size=100, max_ledger_records=250_000) as w:
            for i in range(a.records):
                w.append(f"key-{rng.randrange(a.keys):09d}", f"{i:012d}{pad}")
        print(json.dumps({"run": "produce to moto", "records": a.records,
                          "seconds": round(time.perf_counter() - t, 1)}), flush=True)
        loc = resolve(uri)
        for n in a.parallelism or [1, 4]:
            for o in list(loc.store.list(loc.key("compacted"))):
                loc.store.delete(o.key)
            loc.store.delete(loc.key("_meta/compaction.json"))
            s = Compactor(uri, CompactionConfig(delete_retention_ms=0, collect_garbage=False,
                                                read_parallelism=n)).run()
            d = s.durations
            print(json.dumps({"run": f"compact, {n} read(s) in flight", "records": s.records_read,
                              "written": s.records_written, "seconds": round(d["total"], 2),
                              "pass_two_s": round(d["pass_two"], 2), "bytes_read_mb": round(s.bytes_read / 1e6, 1),
                              "read_mb_per_s": round(s.bytes_read / 1e6 / (d["pass_two"] + d["plan"]), 1),
                              "records_per_s": round(s.records_read / d["total"])}), flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
