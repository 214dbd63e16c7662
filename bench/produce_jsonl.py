"""``shale produce`` of JSON lines beside its peers: wall and CPU time of whole processes.

    .venv/bin/python bench/produce_jsonl.py [--records 2000000] [--repeat 5] [--tree OTHER_CHECKOUT ...]

Writes ``scripts/sample_records.py``'s lines (values as JSON strings) and the same lines
with each value as a JSON object, then runs, on each, each its own process, interleaved:
``shale produce`` into a fresh local topic; pyarrow's ``pyarrow.json.read_json`` and
``pyarrow.parquet.write_table`` (its defaults); DuckDB's ``COPY (SELECT * FROM
read_json(...)) TO ... (FORMAT parquet)`` (when ``duckdb`` is installed); the peers take the first input only (the
second mixes objects and strings in one field, which their column types cannot hold).  With
``--tree``, ``shale produce`` of other checkouts of Shale too (e.g. an older one).  Medians
of wall and CPU time (user + system, every thread); on a shared machine wall time follows
the load.  The ratio is the peer's time over Shale's (1 or more: Shale is as fast or faster).

Then, for each checkout, one more run of the first input in a process that counts the CPU
time of each of its threads (the main thread; the scan and compression threads): on two
cores the wall time is at least the main thread's CPU and at least half the process's, so
the larger of the two says which one a quiet machine would wait for.
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
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _inputs(folder: Path, records: int) -> dict[str, Path]:
    lines = folder / "strings.jsonl"
    with lines.open("w") as out:
        subprocess.run([sys.executable, str(ROOT / "scripts" / "sample_records.py"), "--records", str(records),
                        "--keys", str(max(records // 10, 1))], stdout=out, check=True)
    objects = folder / "objects.jsonl"
    with lines.open() as src, objects.open("w") as out:
        for line in src:
            doc = json.loads(line)
            if isinstance(doc.get("value"), str) and doc["value"].startswith("{"):
                doc["value"] = json.loads(doc["value"])
            out.write(json.dumps(doc) + "\n")
    return {"strings": lines, "objects": objects}


def _produce(tree: Path, source: Path, topic: Path) -> tuple[float, float]:
    shutil.rmtree(topic, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "shale.cli", "produce", str(topic), "--input", str(source)],
                   env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree, stdout=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


_PYARROW = """
import sys
import pyarrow.json, pyarrow.parquet
pyarrow.parquet.write_table(pyarrow.json.read_json(sys.argv[1]), sys.argv[2])
"""

_DUCKDB = """
import sys
import duckdb
duckdb.sql("SET enable_progress_bar = false")
duckdb.sql(f"COPY (SELECT * FROM read_json('{sys.argv[1]}', format='newline_delimited')) TO '{sys.argv[2]}' "
           "(FORMAT parquet)")
"""


_THREADS = """
import collections, sys, threading, time
cpu = collections.Counter()
run = threading.Thread.run
def counted(self):
    try:
        run(self)
    finally:
        cpu[self.name.rstrip("0123456789_").rstrip("-_")] += time.thread_time()
threading.Thread.run = counted
from shale.cli import main
try:
    main(["produce", sys.argv[2], "--input", sys.argv[1]])
except SystemExit:
    pass
print(time.thread_time(), time.process_time(), dict(cpu))
"""


def _threads(tree: Path, source: Path, topic: Path) -> str:
    """Each thread's CPU time in one run of ``shale produce`` of ``tree``."""
    shutil.rmtree(topic, ignore_errors=True)
    out = subprocess.run([sys.executable, "-c", _THREADS, str(source), str(topic)], cwd=tree, check=True,
                         env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True).stdout
    main, total, others = out.strip().splitlines()[-1].split(" ", 2)
    threads = ", ".join(f"{k} {v:.2f}" for k, v in sorted(eval(others).items()))  # (a dict this script printed)
    return (f"main thread {float(main):.2f} s, {threads or 'no other thread'}; process {float(total):.2f} s: "
            f"on two cores at least {max(float(main), float(total) / 2):.2f} s")


def _peer(script: str, source: Path, out: Path) -> tuple[float, float]:
    """Wall and CPU time of ``script`` (a peer's read of ``source`` written to ``out``), its own process."""
    out.unlink(missing_ok=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", script, str(source), str(out)], check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=2_000_000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--tree", action="append", default=[], help="another checkout to compare (repeatable)")
    a = p.parse_args()
    trees = [ROOT, *(Path(t).resolve() for t in a.tree)]
    peers = {"pyarrow": _PYARROW, **({"duckdb": _DUCKDB} if _has("duckdb") else {})}
    print(f"{a.records:,} lines, {a.repeat} runs each, interleaved; load before: {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="shale-bench-") as tmp:
        folder = Path(tmp)
        inputs = _inputs(folder, a.records)
        runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for _ in range(a.repeat):
            for name, source in inputs.items():
                for tree in trees:
                    runs.setdefault((name, f"shale {tree}"), []).append(_produce(tree, source, folder / "topic"))
                for peer, script in peers.items() if name == "strings" else ():  # (mixed types stop them)
                    runs.setdefault((name, peer), []).append(_peer(script, source, folder / "out.parquet"))
        print(f"load after: {os.getloadavg()[0]:.1f}")
        for name in inputs:
            shale_wall = shale_cpu = 0.0
            for (input_name, who), got in runs.items():
                if input_name != name:
                    continue
                wall = statistics.median(w for w, _ in got)
                cpu = statistics.median(c for _, c in got)
                if who == f"shale {ROOT}":
                    shale_wall, shale_cpu = wall, cpu
                    ratio = ""
                else:
                    ratio = f"; ratio {wall / shale_wall:.2f} wall, {cpu / shale_cpu:.2f} CPU"
                print(f"{name:8} {who}: wall {wall:.2f} s, CPU {cpu:.2f} s ({a.records / wall / 1e3:,.0f} k "
                      f"records/s){ratio}")
        for tree in trees:
            print(f"threads, strings, shale {tree}: {_threads(tree, inputs['strings'], folder / 'topic')}")


if __name__ == "__main__":
    main()
