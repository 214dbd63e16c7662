"""The compacted view as an Iceberg table: a full export, an incremental epoch, and the
two designs compared (a table written from the view, or compacted parts written as
Parquet that the table would reference directly).

    .venv/bin/pip install -e '.[iceberg]'
    .venv/bin/python bench/iceberg.py [--keys 2000000] [--changed 0.01] [--repeat 3]

The topic of bench/changes.py: ``--keys`` keys, each written once (64-byte values, zstd),
compacted (epoch 1, ``snapshot-retention`` 2); then ``--changed`` of the keys written
again (one in ten a delete) and compacted incrementally (epoch 2: the big part kept in
place with a deletion vector).  Kept under bench/data/ and reused.  Then, ``--repeat``
times, each in a process of its own after its imports (a fresh SQLite catalog and local
warehouse each time):

* ``parquet``: ``shale export --table`` of epoch 1 to one Parquet file
  (:func:`shale.export.export_topic`);
* ``iceberg full``: the table made and brought to epoch 1 (:func:`shale.iceberg.sync_table`);
* ``iceberg step``: that table brought on to epoch 2, an incremental commit: its time,
  and the bytes it wrote against the table's;
* ``to_arrow parts``: epoch 2's table as Arrow from the compacted parts
  (:func:`shale.reader.latest.table_batches`), what every Shale read does now;
* ``to_arrow parquet``: the same rows read back from Parquet (``pyarrow.parquet``), what a
  read would cost if the parts were Parquet files (design b);
* ``pass two``: the compaction of epoch 1 (its pass two copies raw bytes), against
  ``parquet`` above (decoding the survivors and encoding Parquet: what pass two would do
  if it wrote Parquet parts).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_CHILD = """
import json, resource, shutil, sys, tempfile, time
sys.path.insert(0, {root!r})
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
import pyarrow as pa, pyarrow.parquet as pq
from shale.metadata.topic import TopicMetadata
from shale.export import export_topic
from shale.iceberg import IcebergTarget, sync_table
from shale.reader.latest import table_batches
import pyiceberg.catalog.sql, pyiceberg.io.pyarrow, pyiceberg.table.update.snapshot
meta = TopicMetadata.open({topic!r})
work = tempfile.mkdtemp(dir={work!r})
out = {{}}
def timed(name, f):
    t, c = time.perf_counter(), cpu()
    r = f()
    out[name] = {{"s": time.perf_counter() - t, "cpu_s": cpu() - c}}
    return r
kind = {kind!r}
if kind == "parquet":
    r = timed("parquet", lambda: export_topic({topic!r}, work + "/t.parquet", table=True, as_of=1))
    out["parquet"]["bytes"] = r.bytes
    timed("to_arrow parquet", lambda: pq.read_table(work + "/t.parquet"))
    timed("to_arrow parts", lambda: pa.Table.from_batches(list(table_batches(meta, as_of=2))))
else:
    target = IcebergTarget("sqlite:///" + work + "/cat.db", "bench.t")
    full = timed("iceberg full", lambda: sync_table(meta, target, epoch=1, grace_ms=10**9))
    step = timed("iceberg step", lambda: sync_table(meta, target, grace_ms=10**9))
    out["iceberg full"].update(bytes=full.table_bytes, rows=full.rows)
    out["iceberg step"].update(bytes=step.bytes_written, table_bytes=step.table_bytes, added=step.added,
                               deleted=step.deleted)
shutil.rmtree(work)
print(json.dumps(out))
"""


def child(topic: Path, kind: str, work: str) -> dict[str, Any]:
    code = _CHILD.format(root=str(ROOT), topic=str(topic), kind=kind, work=work)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(out.stderr)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=2_000_000)
    p.add_argument("--changed", type=float, default=0.01)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    from bench.changes import build

    topic = ROOT / "bench" / "data" / f"changes-{a.keys}-{a.changed}"
    t = time.perf_counter()
    build(topic, a.keys, a.changed)
    print(f"topic ready in {time.perf_counter() - t:.1f}s; load {os.getloadavg()[0]:.2f}")
    from shale.metadata.topic import TopicMetadata

    runs = TopicMetadata.open(str(topic)).load_compaction().last_run
    print("epoch 2's run:", json.dumps({k: runs.get(k) for k in ("durations", "records_written")}))
    work = tempfile.mkdtemp(prefix="shale-bench-iceberg-")
    results: dict[str, list[dict[str, Any]]] = {}
    for i in range(a.repeat):
        for kind in (("parquet", "iceberg") if i % 2 == 0 else ("iceberg", "parquet")):
            for name, r in child(topic, kind, work).items():
                results.setdefault(name, []).append(r)
    for name, rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"{name:18s} " + "  ".join(f"{k} {v:,.3f}" if isinstance(v, float) else f"{k} {v:,}"
                                          for k, v in med.items()))
    full, step, parquet = (statistics.median(r["s"] for r in results[n])
                           for n in ("iceberg full", "iceberg step", "parquet"))
    print(f"iceberg full / parquet export: {full / parquet:.2f} (goal 1.2 or less); "
          f"step / full: {step / full:.3f} (goal 0.1 or less)")
    sb = statistics.median(r["bytes"] / r["table_bytes"] for r in results["iceberg step"])
    print(f"step bytes / table bytes: {sb:.4f}; load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
