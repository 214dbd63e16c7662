"""Shale beside DuckDB, Polars and a plain Python dict compactor, on the same records.

    .venv/bin/pip install duckdb polars pyarrow      # the peers (not Shale's dependencies)
    .venv/bin/python bench/compare.py --records 20000000 --keys 2000000

Generates the data set once (kept under bench/data/ and reused): a Shale topic on a
local folder and the very same records as a Parquet file (key, seq, value).  Then,
each in its own process so that peak RSS is its own, ``--repeat`` times interleaved
(this machine's speed drifts by tens of percent from minute to minute, so medians of
interleaved runs are compared, never one run of each):

* Shale: a full compaction (on a hard-linked copy of the topic), then incremental ones
  after 1 % new records;
* DuckDB: ``arg_max_null(value, seq) ... GROUP BY key``, the deleted keys removed
  (``--query arg_max``: ``arg_max``, which skips null values) from Parquet back to Parquet;
* Polars: ``unique(subset="key", keep="last")`` from Parquet back to Parquet;
* dict: a two-pass compactor in plain Python over the same ledgers (pass one: a dict of
  key -> latest position; pass two: re-read and write the survivors to a new ledger).

Prints one JSON line per run, then the median and best of each figure, then the ratios.
Figures: ``seconds`` from the start of the run's imports to its end (interpreter start
excluded); ``process_seconds`` the whole process; ``cpu_seconds`` user + system time of
the process and its workers; ``run_seconds`` (Shale) the run as its own summary reports
it, imports excluded; peak RSS from ``VmHWM``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
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


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM starts afresh at exec; ru_maxrss would not)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def records(seed: int, n: int, keys: int, value_bytes: int, first: int = 0) -> Any:
    """The data set, in batches of (keys, offsets, values)."""
    rng = random.Random(seed)
    pad = "x" * max(0, value_bytes - 12)
    batch = 1_000_000
    for start in range(0, n, batch):
        stop = min(n, start + batch)
        ks = [f"key-{rng.randrange(keys):09d}" for _ in range(start, stop)]
        vs = [f"{first + i:012d}{pad}" for i in range(start, stop)]
        yield ks, list(range(first + start, first + stop)), vs


def generate(topic: str, parquet: str, seed: int, n: int, keys: int, value_bytes: int, first: int = 0,
             compression: str = "zstd:1", entry_records: int = 100) -> None:
    """The topic (entries of ``entry_records`` records, as a producer batching that many
    would write them) and the same records as one Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shale.producer import TopicWriter

    schema = pa.schema([("key", pa.string()), ("seq", pa.int64()), ("value", pa.string())])
    batches = records(seed, n, keys, value_bytes, first)
    with pq.ParquetWriter(parquet, schema) as pw:
        if compression.startswith("zstd-dict") and not first:
            # A topic of zstd-dict is first produced with zstd, until its dictionary is
            # trained on those records (``shale dictionary --train --use``); then with it.
            from shale.maintenance.dictionary import train_and_register
            from shale.metadata.topic import TopicMetadata

            ks, offs, vs = next(batches)
            table = pa.table({"key": ks, "seq": offs, "value": vs}, schema=schema)
            with TopicWriter(topic, batch_size=entry_records, max_ledger_records=500_000, compression="zstd") as w:
                w.append_batch(table)
            pw.write_table(table)
            level = int(compression.partition(":")[2] or 1)
            train_and_register(TopicMetadata.open(topic), size=16 << 10, level=level, use=True)
        with TopicWriter(topic, batch_size=entry_records, max_ledger_records=500_000, compression=compression) as w:
            for ks, offs, vs in batches:
                table = pa.table({"key": ks, "seq": offs, "value": vs}, schema=schema)
                w.append_batch(table)
                pw.write_table(table)


# ------------------------------------------------------------------ the runs (one process each)

def run_shale(topic: str, compression: str = "zstd:1") -> dict[str, Any]:
    from shale.compactor import CompactionConfig, Compactor
    from shale.ledger.codecs import parse_compression

    s = Compactor(topic, CompactionConfig(delete_retention_ms=0, collect_garbage=False,
                                          compression=parse_compression(compression))).run()
    return {"records": s.records_read, "written": s.records_written, "status": s.status,
            "run_seconds": round(s.durations["total"], 3),
            "durations": {k: round(v, 2) for k, v in s.durations.items()}, "map_mb": round(s.map_bytes / 1e6, 1)}


#: DuckDB's queries.  ``arg_max`` skips null values, so a key whose latest record is a
#: tombstone would keep an older value; ``arg_max_null`` takes the latest record whatever
#: its value and the deleted keys are then removed: what Shale's compaction does.
DUCKDB_QUERIES = {
    "arg_max": "SELECT key, max(seq) AS seq, arg_max(value, seq) AS value FROM read_parquet('{src}') GROUP BY key",
    "arg_max_null": "SELECT * FROM (SELECT key, max(seq) AS seq, arg_max_null(value, seq) AS value "
                    "FROM read_parquet('{src}') GROUP BY key) WHERE value IS NOT NULL",
}


def run_duckdb(parquet: str, out: str, query: str = "arg_max_null") -> dict[str, Any]:
    import duckdb

    con = duckdb.connect()
    con.execute(f"COPY ({DUCKDB_QUERIES[query].format(src=parquet)}) TO '{out}' (FORMAT parquet)")
    return {"written": con.execute(f"SELECT count(*) FROM read_parquet('{out}')").fetchone()[0]}  # type: ignore[index]


def run_polars(parquet: str, out: str) -> dict[str, Any]:
    import polars as pl

    df = pl.read_parquet(parquet).unique(subset="key", keep="last", maintain_order=True)
    df.write_parquet(out)
    return {"written": df.height}


def run_dict(topic: str, out_dir: str) -> dict[str, Any]:
    """Two passes in plain Python: decode every record twice, a dict in between."""
    from shale.ledger.format import KIND_ORIGINAL
    from shale.ledger.reader import LedgerFile
    from shale.ledger.record import Record
    from shale.ledger.writer import LedgerWriter, encode_entry
    from shale.metadata.topic import TopicMetadata
    from shale.storage import resolve

    meta = TopicMetadata.open(topic)
    loc = meta.topic
    files = [LedgerFile.open(loc.store, loc.key(lg.object)) for lg in meta.load_topic().ledgers]
    latest: dict[bytes, int] = {}
    pos = 0
    for f in files:
        for m in f.messages():
            if m.key is not None:
                latest[m.key] = pos
            pos += 1
    os.makedirs(out_dir, exist_ok=True)
    out = resolve(out_dir)
    written = 0
    pos = 0
    with out.store.open_writer(out.key("compacted.ledger")) as up:
        w = LedgerWriter(up, kind=KIND_ORIGINAL, ledger_id=1, created_ms=0)
        batch: list[Record] = []
        for f in files:
            for m in f.messages():
                if m.key is not None and latest[m.key] == pos and m.value is not None:
                    batch.append(Record(m.key, m.value, m.properties))
                    if len(batch) == 100:
                        w.add_entry(encode_entry(batch))
                        written += len(batch)
                        batch = []
                pos += 1
        if batch:
            w.add_entry(encode_entry(batch))
            written += len(batch)
        w.finish()
    return {"written": written, "map_entries": len(latest)}


def child(kind: str, args: list[str]) -> None:
    t = time.perf_counter()
    fn = {"shale": run_shale, "duckdb": run_duckdb, "polars": run_polars, "dict": run_dict}[kind]
    out = fn(*args)
    out.update(seconds=round(time.perf_counter() - t, 2), peak_rss_mb=round(peak_rss_mb()))
    # Shale's pass-two workers are forked processes: the largest one's peak, most of it
    # pages shared copy-on-write with the parent (0 for the peers, which use threads).
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    if children:
        out.update(worker_peak_rss_mb=round(children))
    print(json.dumps(out))


def spawn(kind: str, *args: str) -> dict[str, Any]:
    # Write back what setting up left dirty (the generated data, a copied topic) first, or
    # the run's first fsync would pay for it.
    os.sync()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    res = subprocess.run([sys.executable, __file__, "--child", kind, *args], capture_output=True, text=True,
                         check=True, env=child_env())
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = dict(json.loads(res.stdout.strip().splitlines()[-1]))
    # the whole process, interpreter start-up included, and the CPU time it and its
    # workers used (a steadier figure than wall time on a shared machine)
    out.update(process_seconds=round(wall, 2),
               cpu_seconds=round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2))
    return out


def child_env() -> dict[str, str]:
    """The runs' environment: compiled modules are cached (under bench/data/pycache) even
    where the environment turns that off, as in any installed deployment, so that no run
    pays for compiling Shale's or a peer's modules.  ``warm_up`` fills the cache."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(ROOT / "bench" / "data" / "pycache")
    return env


def warm_up(peers: list[str]) -> None:
    """Import what each run imports once, untimed, to fill the compiled-module cache
    (the first full run, untimed too, then reads the topic into the page cache)."""
    mods = ["shale.compactor", *(p for p in peers if p in ("duckdb", "polars")), *(["pyarrow"] if peers else [])]
    subprocess.run([sys.executable, "-c", "import " + ", ".join(mods)], check=True, env=child_env())


def link_copy(src: Path, dst: Path) -> None:
    """A copy of a topic folder made of hard links: objects are never changed in place
    (every write makes a new file), so runs on the copy leave ``src`` as it was, and no
    gigabytes are rewritten between runs."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, copy_function=os.link)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and best of each figure over repeated runs."""
    out: dict[str, Any] = {"runs": len(runs)}
    for k in ("seconds", "process_seconds", "cpu_seconds", "run_seconds", "peak_rss_mb", "worker_peak_rss_mb"):
        vals = [r[k] for r in runs if k in r]
        if vals:
            out[k] = round(statistics.median(vals), 2)
            out[f"{k}_min"] = round(min(vals), 2)
    return out


# ------------------------------------------------------------------ driver

def main() -> None:
    a = arguments()
    if a.child:
        child(a.child[0], a.child[1:])
        return
    base, topic, parquet = data_set(a)
    if a.generate_only:
        return
    peers = [x for x in ("duckdb", "polars", "dict") if x not in a.skip]
    runs, pairs = interleaved_runs(a, base, topic, parquet, peers)
    report(runs, pairs, peers)


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=20_000_000)
    p.add_argument("--keys", type=int, default=2_000_000)
    p.add_argument("--value-bytes", type=int, default=64)
    p.add_argument("--increment", type=float, default=0.01)
    p.add_argument("--compression", default="zstd:1",
                   help="how the topic is produced and compacted (default zstd:1, Shale's own default; "
                        "zstd-dict[:LEVEL]: a dictionary trained on the first million records)")
    p.add_argument("--entry-records", type=int, default=100,
                   help="records an entry of the topic holds (a producer's batch; default 100)")
    p.add_argument("--query", default="arg_max_null", choices=sorted(DUCKDB_QUERIES),
                   help="DuckDB's query (default arg_max_null: deleted keys removed, like for like)")
    p.add_argument("--repeat", type=int, default=3, help="runs of each, interleaved; medians are compared")
    p.add_argument("--generate-only", action="store_true", help="make the data set, run nothing")
    p.add_argument("--skip", action="append", default=[], choices=["duckdb", "polars", "dict"])
    p.add_argument("--dir", default=str(ROOT / "bench" / "data"))
    p.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return p.parse_args()


def data_set(a: argparse.Namespace) -> tuple[Path, Path, str]:
    """The data set's folder, its topic (uncompacted, as generated) and its Parquet file;
    generated on first use only."""
    codec = a.compression.replace(":", "").replace("-", "")
    name = f"compare-{a.records}-{a.keys}-{a.value_bytes}{'' if codec == 'none' else '-' + codec}"
    base = Path(a.dir) / (name if a.entry_records == 100 else f"{name}-e{a.entry_records}")
    topic, parquet = base / "topic", str(base / "records.parquet")
    if not (base / "ready").exists():
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        t = time.perf_counter()
        generate(str(topic), parquet, 1, a.records, a.keys, a.value_bytes, compression=a.compression,
                 entry_records=a.entry_records)
        (base / "ready").write_text("")
        print(json.dumps({"run": "generate", "seconds": round(time.perf_counter() - t, 1)}), flush=True)
    # every full run starts from the uncompacted topic as generated
    shutil.rmtree(topic / "compacted", ignore_errors=True)
    (topic / "_meta" / "compaction.json").unlink(missing_ok=True)
    return base, topic, parquet


def interleaved_runs(a: argparse.Namespace, base: Path, topic: Path, parquet: str,
                     peers: list[str]) -> tuple[dict[str, list[dict[str, Any]]], list[float]]:
    """Each run's figures by name, and each incremental run's time over the full run's just before it."""
    work = base / "full"
    runs: dict[str, list[dict[str, Any]]] = {}

    def show(name: str, r: dict[str, Any]) -> None:
        runs.setdefault(name, []).append(r)
        print(json.dumps({"run": name, **r, "records_per_s": round(a.records / r["seconds"])}), flush=True)

    warm_up(peers)
    # One untimed full run first: every timed run then finds the topic in the page cache,
    # as the peers find their Parquet file after their first run.
    link_copy(topic, work)
    spawn("shale", str(work), a.compression)
    inc = int(a.records * a.increment)
    template = base / "incremental-template"
    pairs: list[float] = []
    for i in range(a.repeat):  # interleaved, so that a slow spell of the machine hits everyone
        link_copy(topic, work)
        full = spawn("shale", str(work), a.compression)
        show("shale full", full)
        for peer in peers:
            if peer == "dict" and "dict" in runs:
                continue  # minutes per run: once is enough
            out = str(base / f"out-{peer}")
            shutil.rmtree(out, ignore_errors=True)
            show(peer, spawn(peer, str(topic) if peer == "dict" else parquet,
                             out + ("" if peer == "dict" else ".parquet"), *([a.query] if peer == "duckdb" else [])))
        if i == 0:
            # 1 % new records on top of the first full run's compacted topic; every
            # incremental run starts from a fresh link copy of that state
            link_copy(work, template)
            generate(str(template), str(base / "increment.parquet"), 2, inc, a.keys, a.value_bytes, first=a.records,
                     compression=a.compression, entry_records=a.entry_records)
        # right after a full run, so that the machine's drift hits both alike
        link_copy(template, base / "incremental")
        r = spawn("shale", str(base / "incremental"), a.compression)
        runs.setdefault("shale incremental", []).append(r)
        pairs.append(r["run_seconds"] / full["run_seconds"])
        print(json.dumps({"run": "shale incremental", "new_records": inc, **r,
                          "run_over_full_run": round(pairs[-1], 3)}), flush=True)
    return runs, pairs


def report(runs: dict[str, list[dict[str, Any]]], pairs: list[float], peers: list[str]) -> None:
    """Median and best of each figure per run, then the peers' and the incremental runs' ratios."""
    summary = {name: summarize(rs) for name, rs in runs.items()}
    for name, rs in runs.items():  # where Shale's run spends its time: each phase's median
        phases = sorted({k for r in rs for k in r.get("durations", {})})
        if phases:
            summary[name]["durations"] = {k: round(statistics.median(r["durations"].get(k, 0) for r in rs), 2)
                                          for k in phases}
    for name, sm in summary.items():
        print(json.dumps({"summary": name, **sm}), flush=True)
    full, incr = summary["shale full"], summary["shale incremental"]
    print(json.dumps({
        "ratios": "peer median time / shale full median time (imports included, interpreter start not)",
        **{k: round(v["seconds"] / full["seconds"], 2) for k, v in summary.items() if k in peers},
        "cpu": {k: round(v["cpu_seconds"] / full["cpu_seconds"], 2) for k, v in summary.items() if k in peers},
    }), flush=True)
    print(json.dumps({
        "incremental / full": "median times (pairs: each incremental run over the full run just before it)",
        "run": round(incr["run_seconds"] / full["run_seconds"], 3),
        "run_pairs": [round(x, 3) for x in pairs], "run_pairs_median": round(statistics.median(pairs), 3),
        "with_imports": round(incr["seconds"] / full["seconds"], 3),
        "whole_process": round(incr["process_seconds"] / full["process_seconds"], 3),
    }), flush=True)


if __name__ == "__main__":
    main()
