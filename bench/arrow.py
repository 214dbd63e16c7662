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

With ``--arrow-cache``, the topic's original ledgers are compacted in full again in a
scratch copy beside it (its ledgers hard-linked), ``--repeat`` times without and with the
Arrow cache (policy ``arrow-cache``), interleaved: pass two's time and the bytes written
(parts, caches) of each.  The last run, with caches, is the view the rest of the bench
reads, and the warm calls add the topic as given (its parts decoded, no cache) beside it;
each warm call is also timed with a touch of every page of the table's keys and values
(Shale's table from a cache is a view of the mapped file: what it costs to use it).

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
from typing import Any

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


def _touch(table: Any) -> int:
    """Read one byte of every page of the table's keys and values (page faults included)."""
    import numpy as np

    total = 0
    for name in ("key", "value"):
        for chunk in table[name].chunks:
            data = chunk.buffers()[2]
            if data is not None and data.size:
                total += int(np.frombuffer(data, dtype=np.uint8)[::4096].sum())
    return total


def _warm(call: Any) -> dict[str, float]:
    """One warm call's wall and CPU time, alone and with a touch of its keys and values."""
    t, c = time.perf_counter(), _cpu()
    got = call()
    w, u = time.perf_counter() - t, _cpu() - c
    _touch(got)
    return {"rows": got.num_rows, "warm_call_s": w, "warm_call_cpu_s": u,
            "warm_call_and_touch_s": time.perf_counter() - t, "warm_call_and_touch_cpu_s": _cpu() - c}


def _scratch(topic: Path) -> Path:
    """A copy of the topic's metadata and original ledgers (hard links), never compacted."""
    import shutil

    scratch = topic.parent / f"{topic.name}-arrow-cache"
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(topic, scratch, copy_function=os.link,
                    ignore=lambda d, names: [n for n in names if n in ("compacted", "compaction.json")
                                             or n.endswith(".parquet")])
    return scratch


def _compactions(scratch: Path, repeat: int) -> None:
    """Full compactions of ``scratch`` without and with the cache, interleaved; the last with."""
    import shutil

    from shale.compactor import CompactionConfig, Compactor
    from shale.metadata.topic import TopicMetadata

    got: dict[bool, dict[str, list[float]]] = {False: {}, True: {}}
    for _ in range(repeat):
        for cache in (False, True):
            (scratch / "_meta" / "compaction.json").unlink(missing_ok=True)
            shutil.rmtree(scratch / "compacted", ignore_errors=True)
            c, t = _cpu() + _children_cpu(), time.perf_counter()  # (pass two's workers are processes)
            s = Compactor(str(scratch), CompactionConfig(delete_retention_ms=0, arrow_cache=cache)).run()
            wall, cpu = time.perf_counter() - t, _cpu() + _children_cpu() - c
            assert s.status == "compacted", s.human()
            parts = TopicMetadata.open(str(scratch)).load_compaction().parts
            caches = sum((scratch / p.arrow_cache).stat().st_size for p in parts if p.arrow_cache)
            for k, v in {"run_s": wall, "run_cpu_s": cpu, "pass_two_s": s.durations["pass_two"],
                         "part_bytes": s.bytes_written, "cache_bytes": caches}.items():
                got[cache].setdefault(k, []).append(v)
    med = {cache: {k: statistics.median(v) for k, v in runs.items()} for cache, runs in got.items()}
    for cache in (False, True):
        print(json.dumps({"run": f"compact {'with' if cache else 'without'} the Arrow cache",
                          **{f"median_{k}": round(v, 3) for k, v in med[cache].items()},
                          "runs": {k: [round(x, 3) for x in v] for k, v in got[cache].items()}}))
    print(json.dumps({"cache adds to pass two (s)": round(med[True]["pass_two_s"] - med[False]["pass_two_s"], 3),
                      "cache bytes / part bytes": round(med[True]["cache_bytes"] / med[True]["part_bytes"], 2)}))


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _report(runs: dict[str, dict[str, list[float]]], rows: int, parquet: Path) -> None:
    """Each side's medians and runs, then Shale's figures over pyarrow's."""
    med = {who: {k: statistics.median(v) for k, v in got.items()} for who, got in runs.items()}
    names = {"shale": "shale to_arrow", "pyarrow": "pyarrow read_table(parquet)",
             "decoded": "shale to_arrow of the topic as given (parts decoded)"}
    for who, got in runs.items():
        print(json.dumps({"run": names[who],
                          "rows": rows, **{f"median_{k}": round(v, 3) for k, v in med[who].items()},
                          "rows_per_s_call": round(rows / med[who]["call_s"]) if "call_s" in med[who] else None,
                          "runs": {k: [round(x, 3) for x in v] for k, v in got.items()}}))
    print(json.dumps({f"shale / pyarrow {k}": round(med["shale"][k] / med["pyarrow"][k], 2) for k in med["shale"]}
                     | {"parquet_bytes": parquet.stat().st_size, "load_average": _load()}))
    if "decoded" in med:
        print(json.dumps({f"decoded / pyarrow {k}": round(med["decoded"][k] / med["pyarrow"][k], 2)
                          for k in med["decoded"]}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("topic")
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--raw-parquet", default=None, help="the topic's raw records as Parquet (key, seq, value)")
    p.add_argument("--arrow-cache", action="store_true", help="compact a copy without and with the Arrow cache, "
                   "then read that copy (and the topic, decoded, in the warm calls)")
    a = p.parse_args()
    import pyarrow.parquet as pq

    from shale.export import export_topic
    from shale.reader import TopicReader

    if a.raw_parquet:
        import duckdb

    print(json.dumps({"load_average": _load(), "cpus": len(os.sched_getaffinity(0))}))
    decoded = a.topic
    if a.arrow_cache:
        a.topic = str(_scratch(Path(a.topic)))
        _compactions(Path(a.topic), a.repeat)
    table = TopicReader(a.topic, read_compacted=True).to_arrow()  # (also warms the page cache)
    parquet = Path(a.topic) / "compacted-view.parquet"
    pq.write_table(table, parquet)
    rows = table.num_rows
    del table
    runs: dict[str, dict[str, list[float]]] = {"shale": {}, "pyarrow": {}, **({"decoded": {}} if a.arrow_cache else {})}

    def add(who: str, got: dict[str, float]) -> None:
        assert got.pop("rows", rows) == rows
        for k, v in got.items():
            runs[who].setdefault(k, []).append(v)

    for _ in range(a.repeat):  # whole processes, A B A B
        add("shale", _process(SHALE, a.topic))
        add("pyarrow", _process(PYARROW, str(parquet)))
    calls = [("shale", lambda: TopicReader(a.topic, read_compacted=True).to_arrow()),
             ("pyarrow", lambda: pq.read_table(parquet))]
    if a.arrow_cache:
        calls.append(("decoded", lambda: TopicReader(decoded, read_compacted=True).to_arrow()))
    for _ in range(a.repeat):  # the calls in this process, warm
        for who, call in calls:
            add(who, _warm(call))
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
