"""``shale produce`` of JSON lines: wall and CPU time of the whole command, and of parsing alone.

    .venv/bin/python bench/produce_jsonl.py [--records 1000000] [--repeat 5] [--tree OTHER_CHECKOUT ...]

Writes ``scripts/sample_records.py``'s lines (values as JSON strings) and the same lines
with each value as a JSON object, then runs ``shale produce`` of each into a fresh local
topic, each run its own process, interleaved; with ``--tree``, the same with other
checkouts of Shale (e.g. an older one) for comparison.  CPU time (user + system of the
process) is the figure to compare on a shared machine: wall time follows the load.
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


_PARSE = """
import itertools, sys, time
from shale.jsonlines import parse_record_line
with open(sys.argv[1], "rb") as f:
    text = [raw.decode() for raw in itertools.islice(f, int(sys.argv[2]))]
t0 = time.process_time()
for line in text:
    parse_record_line(line, "bench")
print(len(text) / (time.process_time() - t0))
"""


def _parse_only(tree: Path, source: Path, lines: int = 300_000) -> float:
    """Lines per CPU second ``parse_record_line`` parses (the first ``lines``), in its own process."""
    out = subprocess.run([sys.executable, "-c", _PARSE, str(source), str(lines)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree, check=True)
    return float(out.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--tree", action="append", default=[], help="another checkout to compare (repeatable)")
    a = p.parse_args()
    trees = [ROOT, *(Path(t).resolve() for t in a.tree)]
    with tempfile.TemporaryDirectory(prefix="shale-bench-") as tmp:
        folder = Path(tmp)
        inputs = _inputs(folder, a.records)
        runs: dict[tuple[str, Path], list[tuple[float, float]]] = {}
        parse: dict[tuple[str, Path], list[float]] = {}
        for _ in range(a.repeat):
            for name, source in inputs.items():
                for tree in trees:
                    runs.setdefault((name, tree), []).append(_produce(tree, source, folder / "topic"))
                    parse.setdefault((name, tree), []).append(_parse_only(tree, source))
        for (name, tree), got in runs.items():
            wall = statistics.median(w for w, _ in got)
            cpu = statistics.median(c for _, c in got)
            print(f"{name:8} {tree}: produce wall {wall:.2f} s, CPU {cpu:.2f} s ({a.records / cpu / 1e3:,.0f} k "
                  f"records per CPU second); parsing alone {statistics.median(parse[name, tree]) / 1e3:,.0f} k lines/s")


if __name__ == "__main__":
    main()
