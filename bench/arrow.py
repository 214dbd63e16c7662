"""A compacted view as Arrow: Shale's reader against pyarrow reading the same rows from
Parquet.

    .venv/bin/pip install pyarrow
    .venv/bin/python bench/arrow.py TOPIC [--repeat 5]

TOPIC is a compacted topic (``bench/compression.py compact`` leaves one under
bench/data/, 2 M keys).  With ``--raw-parquet`` (the same topic's raw records as Parquet,
which that bench leaves beside it) it also times ``shale export --compacted`` to Parquet
against DuckDB's ``COPY (SELECT arg_max(...) GROUP BY key) TO 'x.parquet'`` over the raw
records: Shale's compaction already did the work DuckDB does here.

The compacted view is written once to a Parquet file (pyarrow's defaults: snappy) beside
it; then, interleaved, ``--repeat`` times each: the view read
with ``TopicReader(read_compacted=True).to_arrow()``, and the Parquet file read with
``pyarrow.parquet.read_table``.  Medians, rows per second, and the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("topic")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--raw-parquet", default=None, help="the topic's raw records as Parquet (key, seq, value)")
    a = p.parse_args()
    import pyarrow.parquet as pq

    from shale.export import export_topic
    from shale.reader import TopicReader

    if a.raw_parquet:
        import duckdb

    table = TopicReader(a.topic, read_compacted=True).to_arrow()  # (also warms the page cache)
    parquet = Path(a.topic) / "compacted-view.parquet"
    pq.write_table(table, parquet)
    times: dict[str, list[float]] = {"shale to_arrow": [], "pyarrow read_table(parquet)": []}
    for _ in range(a.repeat):
        t = time.perf_counter()
        n = TopicReader(a.topic, read_compacted=True).to_arrow().num_rows
        times["shale to_arrow"].append(time.perf_counter() - t)
        t = time.perf_counter()
        m = pq.read_table(parquet).num_rows
        times["pyarrow read_table(parquet)"].append(time.perf_counter() - t)
        assert n == m == table.num_rows
        if a.raw_parquet:
            times.update({k: times.get(k, []) for k in ("shale export --compacted", "duckdb COPY arg_max")})
            out = Path(a.topic).parent / "export-bench.parquet"
            t = time.perf_counter()
            export_topic(a.topic, str(out), compacted=True)
            times["shale export --compacted"].append(time.perf_counter() - t)
            t = time.perf_counter()
            duckdb.connect().execute(f"COPY (SELECT key, max(seq) AS seq, arg_max(value, seq) AS value FROM "
                                     f"read_parquet('{a.raw_parquet}') GROUP BY key) TO '{out}' (FORMAT parquet, "
                                     "COMPRESSION zstd)")
            times["duckdb COPY arg_max"].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(json.dumps({"run": k, "rows": table.num_rows, "median_s": round(med[k], 3),
                          "rows_per_s": round(table.num_rows / med[k]), "runs": [round(x, 3) for x in v]}))
    ratios = {"shale / parquet": round(med["shale to_arrow"] / med["pyarrow read_table(parquet)"], 2),
              "parquet_bytes": parquet.stat().st_size}
    if a.raw_parquet:
        ratios["duckdb / shale export"] = round(med["duckdb COPY arg_max"] / med["shale export --compacted"], 2)
    print(json.dumps(ratios))


if __name__ == "__main__":
    main()
