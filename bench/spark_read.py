"""Spark reading a compacted view: ``spark.read.format("shale")`` against
``spark.read.parquet`` of the same rows, on ``local[2]``.

    .venv/bin/python bench/spark_read.py [--keys 10000000] [--repeat 3]

Builds (once, under bench/data/spark-read/) a topic of ``--keys`` distinct keys with
64-byte values through ``append_batch``, compacts it, and exports its compacted view to
Parquet with ``shale export`` (zstd).  Then, interleaved, ``--repeat`` times each, every
row of both is materialised by Spark (``write.format("noop")``: every column read, nothing
written).  Medians and records per second.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def build(topic: Path, parquet: Path, keys: int) -> None:
    import numpy as np
    import pyarrow as pa

    from shale.compactor import CompactionConfig, Compactor
    from shale.export import export_topic
    from shale.producer import TopicWriter

    rng = np.random.default_rng(11)
    with TopicWriter(str(topic)) as w:
        step = 1_000_000
        for lo in range(0, keys, step):
            n = min(step, keys - lo)
            names = np.char.add("user-", np.char.zfill(np.arange(lo, lo + n).astype(str), 9))
            hexed = np.frombuffer(rng.integers(0, 256, size=(n, 32), dtype=np.uint8).tobytes().hex().encode(), "S64")
            w.append_batch(pa.table({"key": pa.array(names.astype(object), pa.string()),
                                     "value": pa.array(hexed, pa.binary())}))
    Compactor(str(topic), CompactionConfig()).run()
    export_topic(str(topic), str(parquet), compacted=True, fmt="parquet", compression="zstd")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=10_000_000)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    base = ROOT / "bench" / "data" / f"spark-read-{a.keys}"
    topic, parquet = base / "topic", base / "view.parquet"
    if not parquet.exists():
        base.mkdir(parents=True, exist_ok=True)
        build(topic, parquet, a.keys)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import shale.spark
    from shale.compactor.spark import SparkOptions
    from shale.compactor.spark.engine import open_session

    spark, _ = open_session(SparkOptions(master="local[2]", conf=(("spark.ui.enabled", "false"),
                                                                  ("spark.driver.memory", "4g"))))
    shale.spark.register(spark)
    runs = {
        "spark.read.format('shale') compacted": lambda: spark.read.format("shale").option("compacted", "true")
        .load(str(topic)),
        "spark.read.parquet": lambda: spark.read.parquet(str(parquet)),
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(a.repeat):
        for name, df in runs.items():
            t = time.perf_counter()
            df().write.format("noop").mode("overwrite").save()
            times[name].append(time.perf_counter() - t)
    rows = spark.read.parquet(str(parquet)).count()
    out = {k: {"median_s": round(statistics.median(v), 2), "records_per_s": round(rows / statistics.median(v))}
           for k, v in times.items()}
    print(json.dumps({"rows": rows, "repeat": a.repeat, **out}, indent=2))
    spark.stop()


if __name__ == "__main__":
    main()
