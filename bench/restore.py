"""Restoring state: ``shale read`` (the table, the compacted view, a full replay),
``TopicReader`` and ``TableView``, beside DuckDB on the same records.

    .venv/bin/python bench/restore.py --repeat 5 [--baseline DIR] [--replay-limit N]

The records of ``bench/compare.py`` (20 M records of 2 M keys, 64-byte values, zstd level
1; made there, and reused) as a topic compacted once (a hard-linked copy, under
``bench/data/restore-*``) and as the Parquet file of the raw records.  Each run is a
process of its own, its output (JSON lines) to ``/dev/null``; the runs of every kind are
interleaved, ``--repeat`` rounds, and medians compared:

* ``read --table`` (text and ``--value-format json``) against DuckDB building the same
  table from the raw records and printing it as JSON lines
  (``COPY (SELECT ... arg_max_null ...) TO '/dev/stdout' (FORMAT json)``);
* ``read --compacted`` (the view: the same rows, from the compacted parts);
* ``read`` of every record (the full replay; ``--replay-limit`` reads only the first N)
  against DuckDB printing every raw record as a JSON line;
* ``TopicReader(T, read_compacted=True)`` in Python: the messages (``read()``) and the
  batches (``read_batches()``), records a second;
* ``TableView(T)``: build time, keys a second, peak and resident memory against the
  view's bytes once decompressed, the time of a ``get`` (median of 20,000), and
  ``to_arrow()`` of the same view.

``--baseline DIR`` also runs the Shale commands from another source tree (an older
commit with its C kernels built in place), as ``before``.  Figures: wall time of the
whole process, CPU time (user + system of the process and its threads), records a
second by wall time; the load average before and after each round is printed (the
machine is shared: compare CPU times when it is loaded).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.compare import child_env, link_copy  # noqa: E402

DUCKDB_TABLE = ("COPY (SELECT * FROM (SELECT key, max(seq) AS seq, arg_max_null(value, seq) AS value "
                "FROM read_parquet('{src}') GROUP BY key) WHERE value IS NOT NULL) TO '/dev/stdout' (FORMAT json)")
DUCKDB_ALL = "COPY (SELECT * FROM read_parquet('{src}')) TO '/dev/stdout' (FORMAT json)"

_API = """
import json, resource, sys, time
sys.path.insert(0, {tree!r})
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
def hwm():
    return {{l.split(":")[0]: int(l.split()[1]) * 1024 for l in open("/proc/self/status")
            if l.startswith(("VmHWM", "VmRSS"))}}
import pyarrow
from shale.reader import TableView, TopicReader
base = hwm()
t, c = time.perf_counter(), cpu()
"""
_MESSAGES = _API + """n = len(TopicReader({topic!r}, read_compacted=True).read())
print(json.dumps({{"rows": n, "call_s": time.perf_counter() - t, "call_cpu_s": cpu() - c}}))"""
_BATCHES = _API + """n = sum(len(b) for b in TopicReader({topic!r}, read_compacted=True).read_batches())
print(json.dumps({{"rows": n, "call_s": time.perf_counter() - t, "call_cpu_s": cpu() - c}}))"""
_TABLE_VIEW = _API + """view = TableView({topic!r})
built, built_cpu, after = time.perf_counter() - t, cpu() - c, hwm()
import random, statistics
keys = [f"key-{{random.randrange({keys}):09d}}".encode() for _ in range(20000)]
times = []
for k in keys:
    s = time.perf_counter(); view.get(k); times.append(time.perf_counter() - s)
t2 = time.perf_counter(); rows = view.to_arrow().num_rows; arrow_s = time.perf_counter() - t2
print(json.dumps({{"rows": len(view), "call_s": built, "call_cpu_s": built_cpu, "to_arrow_s": arrow_s,
                  "get_us": statistics.median(times) * 1e6, "get_p99_us": sorted(times)[19800] * 1e6,
                  "peak_rss_delta_mb": (after["VmHWM"] - base["VmRSS"]) / 1e6,
                  "rss_delta_mb": (after["VmRSS"] - base["VmRSS"]) / 1e6}}))"""


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _run(argv: list[str], rows: int | None = None) -> dict[str, Any]:
    """One process: its wall and CPU time (and what it printed, when it prints figures)."""
    env = child_env()
    c, t = _children_cpu(), time.perf_counter()
    with open(os.devnull, "wb") as sink:
        out = subprocess.run(argv, stdout=subprocess.PIPE if rows is None else sink, stderr=subprocess.PIPE,
                             env=env, check=True).stdout
    got: dict[str, Any] = {"process_s": time.perf_counter() - t, "process_cpu_s": _children_cpu() - c}
    if rows is None:
        got.update(json.loads(out.decode().strip().splitlines()[-1]))
    else:
        got["rows"] = rows
    return got


def _shale(tree: Path, *args: str) -> list[str]:
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(tree)!r}); from shale.cli import main; "
            f"sys.exit(main())", *args]


def _duckdb(query: str) -> list[str]:
    return [sys.executable, "-c", f"import duckdb; duckdb.connect().execute({query!r})"]


def _runs(a: argparse.Namespace, topic: Path, parquet: Path, table_rows: int) -> dict[str, tuple[list[str], Any]]:
    """Each run by name: its command, and the rows it prints (None: it says itself)."""
    trees = {"": ROOT, **({"before: ": Path(a.baseline)} if a.baseline else {})}
    replay = ["--limit", str(a.replay_limit)] if a.replay_limit else []
    replay_rows = min(a.replay_limit or a.records, a.records)
    runs: dict[str, tuple[list[str], Any]] = {}
    for prefix, tree in trees.items():
        runs[f"{prefix}shale read --table"] = (_shale(tree, "read", str(topic), "--table"), table_rows)
        runs[f"{prefix}shale read --table --value-format json"] = (
            _shale(tree, "read", str(topic), "--table", "--value-format", "json"), table_rows)
        runs[f"{prefix}shale read --compacted"] = (_shale(tree, "read", str(topic), "--compacted"), table_rows)
        if "replay" not in a.skip:
            runs[f"{prefix}shale read (replay)"] = (_shale(tree, "read", str(topic), *replay), replay_rows)
        if "api" not in a.skip:
            runs[f"{prefix}TopicReader.read()"] = (
                [sys.executable, "-c", _MESSAGES.format(tree=str(tree), topic=str(topic))], None)
            runs[f"{prefix}TableView"] = (
                [sys.executable, "-c", _TABLE_VIEW.format(tree=str(tree), topic=str(topic), keys=a.keys)], None)
    if "api" not in a.skip:
        runs["TopicReader.read_batches()"] = (
            [sys.executable, "-c", _BATCHES.format(tree=str(ROOT), topic=str(topic))], None)
    runs["duckdb table to JSON lines"] = (_duckdb(DUCKDB_TABLE.format(src=parquet)), table_rows)
    if "replay" not in a.skip:
        runs["duckdb every record to JSON lines"] = (_duckdb(DUCKDB_ALL.format(src=parquet)), a.records)
    return runs


def _data(a: argparse.Namespace) -> tuple[Path, Path, int]:
    """The compacted topic, the raw records' Parquet file and the table's rows."""
    base = ROOT / "bench" / "data" / f"compare-{a.records}-{a.keys}-64-zstd1"
    if not (base / "ready").exists():
        subprocess.run([sys.executable, str(ROOT / "bench" / "compare.py"), "--records", str(a.records), "--keys",
                        str(a.keys), "--generate-only"], check=True)
    work = ROOT / "bench" / "data" / f"restore-{a.records}-{a.keys}"
    topic = work / "topic"
    if not (work / "ready").exists():
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        link_copy(base / "topic", topic)
        shutil.rmtree(topic / "compacted", ignore_errors=True)
        (topic / "_meta" / "compaction.json").unlink(missing_ok=True)
        from shale.compactor import CompactionConfig, Compactor

        Compactor(str(topic), CompactionConfig(delete_retention_ms=0, collect_garbage=False)).run()
        (work / "ready").write_text("")
    from shale.metadata.topic import TopicMetadata
    from shale.reader.latest import plan_latest

    return topic, base / "records.parquet", plan_latest(TopicMetadata.open(str(topic))).rows


def _view_bytes(topic: Path) -> int:
    """The compacted view's entries, decompressed."""
    from shale.metadata.topic import TopicMetadata
    from shale.metadata.view import TopicView

    meta = TopicMetadata.open(str(topic))
    return sum(int(s.open(meta).footer.raw_lengths().sum()) for s in TopicView.load(meta).parts())


def _report(runs: dict[str, list[dict[str, Any]]], view_bytes: int) -> None:
    med: dict[str, dict[str, float]] = {}
    for name, got in runs.items():
        med[name] = {k: statistics.median(r[k] for r in got) for k in got[0] if isinstance(got[0][k], (int, float))}
        m = med[name]
        line = {"run": name, "rows": m["rows"], **{k: round(v, 3) for k, v in m.items() if k != "rows"},
                "rows_per_s": round(m["rows"] / m.get("call_s", m["process_s"])),
                "runs_process_s": [round(r["process_s"], 2) for r in got]}
        if name.endswith("TableView"):
            line["peak_over_view_bytes"] = round(m["peak_rss_delta_mb"] * 1e6 / view_bytes, 2)
            line["rss_over_view_bytes"] = round(m["rss_delta_mb"] * 1e6 / view_bytes, 2)
        print(json.dumps(line))
    ratios = {}
    for prefix in ("", "before: "):
        for shale, peer in ((f"{prefix}shale read --table", "duckdb table to JSON lines"),
                            (f"{prefix}shale read --table --value-format json", "duckdb table to JSON lines")):
            if shale in med and peer in med:
                for k in ("process_s", "process_cpu_s"):
                    ratios[f"{peer} / {shale}, {k}"] = round(med[peer][k] / med[shale][k], 2)
    print(json.dumps({"ratios (above 1: Shale faster)": ratios, "view_bytes": view_bytes, "load": _load()}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=20_000_000)
    p.add_argument("--keys", type=int, default=2_000_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--baseline", metavar="DIR", help="also run the Shale commands from this source tree, as before")
    p.add_argument("--replay-limit", type=int, default=None, help="the replay reads only the first N records")
    p.add_argument("--skip", action="append", default=[], choices=["replay", "api"])
    p.add_argument("--only", action="append", default=[], help="run only the runs whose name holds this")
    a = p.parse_args()
    topic, parquet, table_rows = _data(a)
    view_bytes = _view_bytes(topic)
    runs = _runs(a, topic, parquet, table_rows)
    if a.only:
        runs = {k: v for k, v in runs.items() if any(o in k for o in a.only)}
    subprocess.run(_shale(ROOT, "read", str(topic), "--table", "--limit", "1"), stdout=subprocess.DEVNULL,
                   env=child_env(), check=True)  # (compiled modules cached, the topic in the page cache)
    got: dict[str, list[dict[str, Any]]] = {k: [] for k in runs}
    for i in range(a.repeat):
        print(json.dumps({"round": i + 1, "load_before": _load()}), flush=True)
        for name, (argv, rows) in (runs.items() if i % 2 == 0 else reversed(runs.items())):
            r = _run(argv, rows=rows)
            got[name].append(r)
            print(json.dumps({"run": name, **{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}}),
                  flush=True)
    _report(got, view_bytes)


if __name__ == "__main__":
    main()
