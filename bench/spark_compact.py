"""The Spark engine beside the local engine on one generated topic.

    .venv/bin/python bench/spark_compact.py --records 10000000 --keys 1000000

Generates the topic once (kept under bench/data/ and reused), then compacts it from
scratch with the local engine and with the Spark engine on each ``--master``, and runs
a plain PySpark DataFrame ``groupBy(key).max(offset)`` over as many rows for reference.
Prints one JSON line per run: wall time per phase, records/s, and records/s per core
for pass one.  Spark's start-up (JVM and session, about 5 s) is not counted; the first
run in the application and a second one are both shown.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shale.compactor import CompactionConfig, Compactor, RunSummary
from shale.compactor.engine import Engine, LocalEngine
from shale.compactor.spark import SparkOptions
from shale.compactor.spark.engine import SparkEngine
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter


def generate(uri: str, records: int, keys: int, value_bytes: int) -> None:
    rng = random.Random(1)
    pad = "x" * max(0, value_bytes - 12)
    t = time.perf_counter()
    with TopicWriter(uri, batch_size=100, max_ledger_records=500_000) as w:
        for i in range(records):
            w.append(f"key-{rng.randrange(keys):09d}", f"{i:012d}{pad}")
            if i and i % 1_000_000 == 0:
                print(json.dumps({"phase": "produce", "records": i, "seconds": round(time.perf_counter() - t)}),
                      file=sys.stderr, flush=True)


def reset(uri: str) -> None:
    """Forget every compaction, so each run starts from scratch on the same ledgers."""
    shutil.rmtree(Path(uri) / "compacted", ignore_errors=True)
    meta = Path(uri) / "_meta" / "compaction.json"
    if meta.exists():
        meta.unlink()


def cores(master: str) -> int:
    cluster = re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*\d+\]", master)
    if cluster:
        return int(cluster.group(1)) * int(cluster.group(2))
    m = re.fullmatch(r"local\[(\d+|\*)\]", master)
    if not m:
        return os.cpu_count() or 1
    return os.cpu_count() or 1 if m.group(1) == "*" else int(m.group(1))


def run(uri: str, engine: Engine, label: str, n_cores: int) -> dict[str, Any]:
    reset(uri)
    s: RunSummary = Compactor(uri, CompactionConfig(delete_retention_ms=0, collect_garbage=False),
                              engine=engine).run()
    if s.status != "compacted":
        raise SystemExit(f"{label}: {s.status}: {s.error or s.message}")
    d = s.durations
    p1, p2 = d["pass_one"], d["pass_two"]
    return {"run": label, "records": s.records_read, "keys": s.keys, "written": s.records_written,
            "parts": s.parts, "seconds": round(d["total"], 2), "pass_one_s": round(p1, 2),
            "pass_two_s": round(p2, 2), "records_per_s": round(s.records_read / d["total"]),
            "pass_one_records_per_s_per_core": round(s.records_read / p1 / n_cores),
            "records_per_s_per_core": round(s.records_read / d["total"] / n_cores)}


def dataframe_reference(engine: SparkEngine, records: int, keys: int, n_cores: int) -> dict[str, Any]:
    """A plain DataFrame groupBy(key).max(offset) over generated string keys, no I/O."""
    from pyspark.sql import functions as F

    spark = engine.session
    df = spark.range(records).select(
        F.concat(F.lit("key-"), F.lpad(F.pmod(F.xxhash64("id"), F.lit(keys)).cast("string"), 9, "0")).alias("key"),
        F.col("id").alias("offset"))
    t = time.perf_counter()
    df.groupBy("key").agg(F.max("offset")).write.format("noop").mode("overwrite").save()
    sec = time.perf_counter() - t
    return {"run": f"reference: DataFrame groupBy(key).max(offset) on {engine.options.effective_master}",
            "records": records, "seconds": round(sec, 2), "records_per_s_per_core": round(records / sec / n_cores)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=10_000_000)
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--value-bytes", type=int, default=64)
    p.add_argument("--master", action="append", default=None,
                   help="Spark masters (default local[1], local[2] and local-cluster[2,1,1024])")
    p.add_argument("--split-size", type=int, default=128 << 20, help="Spark split size in bytes")
    p.add_argument("--dir", default=str(Path(__file__).resolve().parent / "data"))
    a = p.parse_args()
    uri = os.path.join(a.dir, f"spark-topic-{a.records}-{a.keys}-{a.value_bytes}")
    if not (Path(uri) / "_meta" / "topic.json").exists() or TopicMetadata.open(uri).load_topic().records != a.records:
        shutil.rmtree(uri, ignore_errors=True)
        generate(uri, a.records, a.keys, a.value_bytes)
    print(json.dumps(run(uri, LocalEngine(), "local engine", 1)), flush=True)
    for master in a.master or ["local[1]", "local[2]", "local-cluster[2,1,1024]"]:
        n = cores(master)
        with SparkEngine(SparkOptions(master=master, split_bytes=a.split_size,
                                      conf=(("spark.ui.enabled", "false"),))) as engine:
            engine.session.sparkContext.parallelize(range(n), n).count()  # start the Python workers
            # The first run in a new application pays for imports in the workers and the
            # JVM's warm-up (a CronJob pays it every time); the second shows the steady state.
            print(json.dumps(run(uri, engine, f"spark engine on {master}, first run", n)), flush=True)
            print(json.dumps(run(uri, engine, f"spark engine on {master}, second run", n)), flush=True)
            print(json.dumps(dataframe_reference(engine, a.records, a.keys, n)), flush=True)


if __name__ == "__main__":
    main()
