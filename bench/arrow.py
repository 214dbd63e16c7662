"""A compacted view as Arrow: Shale's reader against pyarrow reading the same rows from
Parquet, as whole processes and as the call alone.

    .venv/bin/pip install pyarrow
    .venv/bin/python bench/arrow.py TOPIC [--repeat 7]

TOPIC is a compacted topic (``bench/compression.py compact`` leaves one under
bench/data/, 2 M keys).  The compacted view is written once to a Parquet file (pyarrow's
defaults: snappy) beside it.  Then, interleaved, ``--repeat`` times each (A B A B):

* a whole process, ``python -c`` with its imports:
  ``TopicReader(TOPIC, read_compacted=True).to_arrow()`` against
  ``pyarrow.parquet.read_table(FILE)``; each process also times its call alone (the
  first in that process: nothing warmed but the page cache);
* in this process, the two calls again and again (memory pools warm), as an
  application that reads repeatedly sees them.

Wall time and CPU time (user + system; a process's own, from ``getrusage``) for each,
medians, and the ratios Shale / pyarrow (below 1: Shale faster).  The machine's load
average is printed first and last: on a shared machine compare CPU times.

With ``--raw-parquet`` (the same topic's raw records as Parquet, which that bench leaves
beside it) it also times ``shale export --compacted`` to Parquet against DuckDB's ``COPY
(SELECT arg_max(...) GROUP BY key) TO 'x.parquet'`` over the raw records: Shale's
compaction already did the work DuckDB does here.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Each child prints {"rows", "call_s", "call_cpu_s"}: its call timed alone, after its imports.
_CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
{imports}
t, c = time.perf_counter(), cpu()
table = {call}
print(json.dumps({{"rows": table.num_rows, "call_s": time.perf_counter() - t, "call_cpu_s": cpu() - c}}))
"""
# (pyarrow imported before the call, as by an application that uses the table it gets)
SHALE = ("import pyarrow\nfrom shale.reader import TopicReader",
         "TopicReader({path!r}, read_compacted=True).to_arrow()")
PYARROW = ("import pyarrow.parquet as pq", "pq.read_table({path!r})")


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _process(kind: tuple[str, str], path: str) -> dict[str, float]:
    """One whole process: its wall and CPU time, and its call's."""
    code = _CHILD.format(root=str(ROOT), imports=kind[0], call=kind[1].format(path=path))
    c, t = _children_cpu(), time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    wall, cpu = time.perf_counter() - t, _children_cpu() - c
    got = json.loads(out)
    return {"rows": got["rows"], "process_s": wall, "process_cpu_s": cpu, "call_s": got["call_s"],
            "call_cpu_s": got["call_cpu_s"]}


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _report(runs: dict[str, dict[str, list[float]]], rows: int, parquet: Path) -> None:
    """Each side's medians and runs, then Shale's figures over pyarrow's."""
    med = {who: {k: statistics.median(v) for k, v in got.items()} for who, got in runs.items()}
    for who, got in runs.items():
        print(json.dumps({"run": "shale to_arrow" if who == "shale" else "pyarrow read_table(parquet)",
                          "rows": rows, **{f"median_{k}": round(v, 3) for k, v in med[who].items()},
                          "rows_per_s_call": round(rows / med[who]["call_s"]),
                          "runs": {k: [round(x, 3) for x in v] for k, v in got.items()}}))
    print(json.dumps({f"shale / pyarrow {k}": round(med["shale"][k] / med["pyarrow"][k], 2) for k in med["shale"]}
                     | {"parquet_bytes": parquet.stat().st_size, "load_average": _load()}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("topic")
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--raw-parquet", default=None, help="the topic's raw records as Parquet (key, seq, value)")
    a = p.parse_args()
    import pyarrow.parquet as pq

    from shale.export import export_topic
    from shale.reader import TopicReader

    if a.raw_parquet:
        import duckdb

    print(json.dumps({"load_average": _load(), "cpus": len(os.sched_getaffinity(0))}))
    table = TopicReader(a.topic, read_compacted=True).to_arrow()  # (also warms the page cache)
    parquet = Path(a.topic) / "compacted-view.parquet"
    pq.write_table(table, parquet)
    rows = table.num_rows
    del table
    runs: dict[str, dict[str, list[float]]] = {"shale": {}, "pyarrow": {}}

    def add(who: str, got: dict[str, float]) -> None:
        assert got.pop("rows", rows) == rows
        for k, v in got.items():
            runs[who].setdefault(k, []).append(v)

    for _ in range(a.repeat):  # whole processes, A B A B
        add("shale", _process(SHALE, a.topic))
        add("pyarrow", _process(PYARROW, str(parquet)))
    for _ in range(a.repeat):  # the calls in this process, warm
        t, c = time.perf_counter(), _cpu()
        n = TopicReader(a.topic, read_compacted=True).to_arrow().num_rows
        add("shale", {"rows": n, "warm_call_s": time.perf_counter() - t, "warm_call_cpu_s": _cpu() - c})
        t, c = time.perf_counter(), _cpu()
        n = pq.read_table(parquet).num_rows
        add("pyarrow", {"rows": n, "warm_call_s": time.perf_counter() - t, "warm_call_cpu_s": _cpu() - c})
    _report(runs, rows, parquet)
    if a.raw_parquet:
        times: dict[str, list[float]] = {"shale export --compacted": [], "duckdb COPY arg_max": []}
        out = Path(a.topic).parent / "export-bench.parquet"
        for _ in range(a.repeat):
            t = time.perf_counter()
            export_topic(a.topic, str(out), compacted=True)
            times["shale export --compacted"].append(time.perf_counter() - t)
            t = time.perf_counter()
            duckdb.connect().execute(f"COPY (SELECT key, max(seq) AS seq, arg_max(value, seq) AS value FROM "
                                     f"read_parquet('{a.raw_parquet}') GROUP BY key) TO '{out}' (FORMAT parquet, "
                                     "COMPRESSION zstd)")
            times["duckdb COPY arg_max"].append(time.perf_counter() - t)
        m = {k: statistics.median(v) for k, v in times.items()}
        for k, v in times.items():
            print(json.dumps({"run": k, "median_s": round(m[k], 3), "runs": [round(x, 3) for x in v]}))
        print(json.dumps({"duckdb / shale export": round(m["duckdb COPY arg_max"] / m["shale export --compacted"], 2)}))


if __name__ == "__main__":
    main()
