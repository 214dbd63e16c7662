"""Change reads between two consecutive epochs against reading the whole table.

    .venv/bin/pip install pyarrow
    .venv/bin/python bench/changes.py [--keys 2000000] [--changed 0.01] [--repeat 5]

A topic of ``--keys`` keys, each written once (64-byte values, zstd), is compacted (epoch
1, ``snapshot-retention`` 2); then ``--changed`` of the keys are written again (one in ten
of those as a delete) and an incremental run publishes epoch 2, keeping the big parts in
place with deletion vectors (kept under bench/data/ and reused).  Then, ``--repeat``
times, interleaved, each in a process of its own after its imports:

* ``changes``: :func:`shale.reader.changes.change_batches` from epoch 1 to epoch 2, as one
  Arrow table;
* ``table``: the whole table of epoch 2 as Arrow
  (:func:`shale.reader.latest.table_batches`), what a reload without change reads does;
* the same two as whole commands writing JSON lines to /dev/null: ``shale changes --from
  1 --to 2`` against ``shale read --table --as-of 2``.

Medians of wall and CPU time and the ratio changes / table (the goal: 0.2 or less).
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

_CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
import pyarrow as pa
from shale.metadata.topic import TopicMetadata
from shale.reader.changes import change_batches, plan_changes
from shale.reader.latest import table_batches
meta = TopicMetadata.open({topic!r})
t, c = time.perf_counter(), cpu()
if {kind!r} == "changes":
    rows = pa.Table.from_batches(list(change_batches(meta, 1, 2))).num_rows
else:
    rows = pa.Table.from_batches(list(table_batches(meta, as_of=2))).num_rows
print(json.dumps({{"rows": rows, "s": time.perf_counter() - t, "cpu_s": cpu() - c}}))
"""


def build(topic: Path, keys: int, changed: float) -> None:
    import numpy as np
    import pyarrow as pa

    from shale.compactor import CompactionConfig, Compactor
    from shale.metadata.topic import TopicMetadata
    from shale.producer import TopicWriter

    if (topic / "_meta" / "compaction.json").exists() and TopicMetadata.open(str(topic)).load_compaction().epoch == 2:
        return
    shutil.rmtree(topic, ignore_errors=True)
    rnd = np.random.default_rng(1)
    config = CompactionConfig(snapshot_retention=2, delete_retention_ms=0)
    with TopicWriter(str(topic), compression="zstd:1", batch_size=100) as w:
        for a in range(0, keys, 200_000):
            n = min(200_000, keys - a)
            w.append_batch(pa.table({"key": [f"user-{i:09d}" for i in range(a, a + n)],
                                     "value": [rnd.bytes(32).hex() for _ in range(n)]}))
    Compactor(str(topic), config).run()
    picked = np.sort(rnd.choice(keys, int(keys * changed), replace=False))
    with TopicWriter(str(topic), compression="zstd:1", batch_size=100) as w:
        w.append_batch(pa.table({"key": [f"user-{i:09d}" for i in picked],
                                 "value": [None if j % 10 == 0 else rnd.bytes(32).hex()
                                           for j in range(len(picked))]}))
    s = Compactor(str(topic), config).run()
    assert s.epoch == 2, s


def child(topic: Path, kind: str) -> dict[str, Any]:
    code = _CHILD.format(root=str(ROOT), topic=str(topic), kind=kind)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def command(topic: Path, args: list[str]) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    with open(os.devnull, "w") as null:
        subprocess.run([sys.executable, "-m", "shale.cli", *args], stdout=null, check=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"s": time.perf_counter() - t,
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=2_000_000)
    p.add_argument("--changed", type=float, default=0.01)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    topic = ROOT / "bench" / "data" / f"changes-{a.keys}-{a.changed}"
    build(topic, a.keys, a.changed)
    from shale.metadata.topic import TopicMetadata
    from shale.reader.changes import plan_changes

    plan = plan_changes(TopicMetadata.open(str(topic)), 1, 2)
    ups, dels = (sum(len(c.records) for c in chosen) for chosen in (plan.upserts, plan.deletes))
    print(f"load {os.getloadavg()[0]:.2f}; plan: {plan.how}, {ups:,} upserts, {dels:,} deletes")
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in ("changes", "table", "cli changes", "cli table")}
    child(topic, "changes"), child(topic, "table")  # warm: the page cache and compiled modules
    for i in range(a.repeat):
        order = ("changes", "table") if i % 2 == 0 else ("table", "changes")
        for kind in order:
            runs[kind].append(child(topic, kind))
        cli = {"cli changes": ["changes", str(topic), "--from", "1", "--to", "2"],
               "cli table": ["read", str(topic), "--table", "--as-of", "2"]}
        for kind in (order if i % 2 == 0 else order[::-1]):
            name = f"cli {kind}"
            runs[name].append(command(topic, cli[name]))
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("s", "cpu_s")} for k, v in runs.items()}
    for k, v in med.items():
        print(f"{k:12s} wall {v['s']:.3f} s  cpu {v['cpu_s']:.3f} s")
    for a_, b_ in (("changes", "table"), ("cli changes", "cli table")):
        print(f"{a_} / {b_}: wall {med[a_]['s'] / med[b_]['s']:.3f}, cpu {med[a_]['cpu_s'] / med[b_]['cpu_s']:.3f}")
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
