"""Compressed topics: compaction, produce and restore, per codec.

    .venv/bin/pip install duckdb pyarrow faker     # the bench's own needs
    .venv/bin/python bench/compression.py compact --records 20000000 --keys 2000000 --repeat 3
    .venv/bin/python bench/compression.py produce --records 1000000
    .venv/bin/python bench/compression.py restore --records 2000000 --keys 200000

``compact``: the records of ``bench/compare.py`` (64-byte values) as a topic produced with
zstd level 1, the same records as a topic stored uncompressed, and as a zstd Parquet file
(kept under bench/data/ and reused).  Then, ``--repeat`` times, interleaved, each run in a
process of its own: Shale's full compaction of the zstd topic (writing zstd), of the
uncompressed topic (writing uncompressed), DuckDB's ``arg_max ... GROUP BY`` over the zstd
Parquet file (to zstd Parquet), and an incremental run of the zstd topic after 1 % new
records.  Medians, then the ratios the issue sets goals for.

``produce``: records through ``TopicWriter.append`` with each codec (none, lz4, zstd 1,
zstd 3, and zstd 3 with a dictionary trained on other records of the same kind), two
kinds of records: Faker change capture of a users table (JSON rows) and random 64-byte
values; records/s, bytes stored (footers included), ratio; ``--batch-size`` records per
entry (small entries are where a dictionary helps).

``restore``: a topic of each codec, compacted with that codec, read back as a table
(``TableView``: the compacted view, decoded record by record) and as a compacted read
(``TopicReader``); records/s, medians of interleaved repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from compare import child_env, link_copy, peak_rss_mb, records, summarize  # noqa: E402

CODECS = ("none", "lz4", "zstd:1", "zstd:3")


# ------------------------------------------------------------------------------- data


def generate(topic: str, compression: str, n: int, keys: int, value_bytes: int, seed: int = 1, first: int = 0,
             parquet: str | None = None) -> None:
    from shale.producer import TopicWriter

    pw = None
    if parquet is not None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pa.schema([("key", pa.string()), ("seq", pa.int64()), ("value", pa.string())])
        pw = pq.ParquetWriter(parquet, schema, compression="zstd")
    with TopicWriter(topic, batch_size=100, max_ledger_records=500_000, compression=compression) as w:
        for ks, offs, vs in records(seed, n, keys, value_bytes, first):
            for k, v in zip(ks, vs, strict=True):
                w.append(k, v)
            if pw is not None:
                pw.write_table(pa.table({"key": ks, "seq": offs, "value": vs}, schema=schema))
    if pw is not None:
        pw.close()


def faker_rows(n: int, seed: int = 1) -> list[tuple[bytes, bytes]]:
    """bench/codecs.py's change-capture rows (loaded by path: ``codecs`` is also a
    standard module)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_codecs", ROOT / "bench" / "codecs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows: list[tuple[bytes, bytes]] = module.users(n, seed)
    return rows


# ------------------------------------------------------------------------ child runs


def run_shale(topic: str, compression: str) -> dict[str, Any]:
    from shale.compactor import CompactionConfig, Compactor
    from shale.ledger.codecs import parse_compression

    s = Compactor(topic, CompactionConfig(delete_retention_ms=0, collect_garbage=False,
                                          compression=parse_compression(compression))).run()
    return {"records": s.records_read, "written": s.records_written, "status": s.status,
            "bytes_written": s.bytes_written, "run_seconds": round(s.durations["total"], 3),
            "durations": {k: round(v, 2) for k, v in s.durations.items()}}


def run_duckdb(parquet: str, out: str) -> dict[str, Any]:
    import duckdb

    con = duckdb.connect()
    con.execute(f"COPY (SELECT key, max(seq) AS seq, arg_max(value, seq) AS value "
                f"FROM read_parquet('{parquet}') GROUP BY key) TO '{out}' (FORMAT parquet, COMPRESSION zstd)")
    return {"written": con.execute(f"SELECT count(*) FROM read_parquet('{out}')").fetchone()[0]}  # type: ignore[index]


def child(kind: str, args: list[str]) -> None:
    t = time.perf_counter()
    out = {"shale": run_shale, "duckdb": run_duckdb}[kind](*args)
    out.update(seconds=round(time.perf_counter() - t, 2), peak_rss_mb=round(peak_rss_mb()))
    print(json.dumps(out))


def spawn(kind: str, *args: str) -> dict[str, Any]:
    os.sync()
    t = time.perf_counter()
    res = subprocess.run([sys.executable, __file__, "child", kind, *args], capture_output=True, text=True,
                         check=True, env=child_env())
    out = dict(json.loads(res.stdout.strip().splitlines()[-1]))
    out.update(process_seconds=round(time.perf_counter() - t, 2))
    return out


# --------------------------------------------------------------------------- compact


def cmd_compact(a: argparse.Namespace) -> None:
    base = Path(a.dir) / f"compression-{a.records}-{a.keys}-{a.value_bytes}"
    zstd_topic, plain_topic, parquet = base / "zstd", base / "none", str(base / "records-zstd.parquet")
    if not (base / "ready").exists():
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        t = time.perf_counter()
        generate(str(zstd_topic), "zstd:1", a.records, a.keys, a.value_bytes, parquet=parquet)
        generate(str(plain_topic), "none", a.records, a.keys, a.value_bytes)
        (base / "ready").write_text("")
        print(json.dumps({"run": "generate", "seconds": round(time.perf_counter() - t, 1)}), flush=True)
    for topic in (zstd_topic, plain_topic):
        shutil.rmtree(topic / "compacted", ignore_errors=True)
        (topic / "_meta" / "compaction.json").unlink(missing_ok=True)
    sizes = {name: sum(p.stat().st_size for p in (t / "ledgers").iterdir()) for name, t in
             (("zstd", zstd_topic), ("none", plain_topic))}
    print(json.dumps({"ledger_bytes": sizes, "parquet_bytes": Path(parquet).stat().st_size}), flush=True)
    subprocess.run([sys.executable, "-c", "import shale.compactor, duckdb, pyarrow"], check=True, env=child_env())
    for topic in (zstd_topic, plain_topic):  # untimed: every timed run finds its topic in the page cache
        link_copy(topic, base / "warm")
        spawn("shale", str(base / "warm"), "zstd:1" if topic == zstd_topic else "none")
    runs: dict[str, list[dict[str, Any]]] = {}
    inc = int(a.records * a.increment)
    template = base / "incremental-template"
    pairs: list[float] = []

    def show(name: str, r: dict[str, Any]) -> None:
        runs.setdefault(name, []).append(r)
        print(json.dumps({"run": name, **r, "records_per_s": round(a.records / r["seconds"])}), flush=True)

    for i in range(a.repeat):
        link_copy(zstd_topic, base / "work-zstd")
        full = spawn("shale", str(base / "work-zstd"), "zstd:1")
        show("shale zstd full", full)
        link_copy(plain_topic, base / "work-none")
        show("shale uncompressed full", spawn("shale", str(base / "work-none"), "none"))
        shutil.rmtree(base / "out.parquet", ignore_errors=True)
        show("duckdb zstd parquet", spawn("duckdb", parquet, str(base / "out.parquet")))
        if i == 0:
            link_copy(base / "work-zstd", template)
            generate(str(template), "zstd:1", inc, a.keys, a.value_bytes, seed=2, first=a.records)
        link_copy(template, base / "incremental")
        r = spawn("shale", str(base / "incremental"), "zstd:1")
        runs.setdefault("shale zstd incremental", []).append(r)
        pairs.append(r["run_seconds"] / full["run_seconds"])
        print(json.dumps({"run": "shale zstd incremental", "new_records": inc, **r,
                          "run_over_full_run": round(pairs[-1], 3)}), flush=True)
    summary = {name: summarize(rs) for name, rs in runs.items()}
    for name, sm in summary.items():
        print(json.dumps({"summary": name, **sm}), flush=True)
    z, n, d = (summary[k]["seconds"] for k in ("shale zstd full", "shale uncompressed full", "duckdb zstd parquet"))
    zr, nr = summary["shale zstd full"]["run_seconds"], summary["shale uncompressed full"]["run_seconds"]
    print(json.dumps({
        "duckdb / shale zstd (goal >= 1.5)": round(d / z, 2),
        "shale zstd / shale uncompressed (goal <= 1.5)": round(z / n, 2), "by run time": round(zr / nr, 2),
        "incremental / full, pairs (goal <= 0.1)": [round(x, 3) for x in pairs],
        "incremental / full, median": round(statistics.median(pairs), 3),
    }), flush=True)


# --------------------------------------------------------------------------- produce


def _trained(kind: str, rows: list[tuple[bytes, bytes]], where: Path, batch: int) -> Any:
    """A dictionary trained on a topic of ``rows`` (as ``shale dictionary --train`` does)."""
    from shale.maintenance.dictionary import train_dictionary
    from shale.metadata.topic import TopicMetadata
    from shale.producer import TopicWriter

    uri = str(where / f"{kind}-dictionary-source")
    shutil.rmtree(uri, ignore_errors=True)
    with TopicWriter(uri, batch_size=batch) as w:
        for k, v in rows:
            w.append(k, v)
    return train_dictionary(TopicMetadata.open(uri)).dictionary


def cmd_produce(a: argparse.Namespace) -> None:
    from shale.metadata.dictionaries import register_dictionary
    from shale.metadata.topic import TopicMetadata
    from shale.producer import TopicWriter

    kinds = {"users": faker_rows(a.records), "random64": [
        (k.encode(), os.urandom(32).hex().encode()) for ks, _, _ in records(1, a.records, a.records // 10, 64)
        for k in ks]}
    base = Path(a.dir) / "produce"
    # trained on other records than the ones produced (another seed), as a topic's would be
    dictionaries = {"users": _trained("users", faker_rows(100_000, seed=2), base, a.batch_size),
                    "random64": _trained("random64", [(k, os.urandom(32).hex().encode()) for k, _ in
                                                      kinds["random64"][:100_000]], base, a.batch_size)}
    results: dict[tuple[str, str], list[float]] = {}
    stored: dict[tuple[str, str], tuple[int, int]] = {}
    for _ in range(a.repeat):
        for kind, rows in kinds.items():
            for codec in (*CODECS, "zstd-dict:3"):  # interleaved
                uri = str(base / f"{kind}-{codec.replace(':', '')}")
                shutil.rmtree(uri, ignore_errors=True)
                if codec.startswith("zstd-dict"):
                    meta = TopicMetadata.open(uri)
                    meta.create_topic()
                    register_dictionary(meta, dictionaries[kind])
                t = time.perf_counter()
                with TopicWriter(uri, compression=codec, batch_size=a.batch_size) as w:
                    for k, v in rows:
                        w.append(k, v)
                results.setdefault((kind, codec), []).append(time.perf_counter() - t)
                ledgers = TopicMetadata.open(uri).load_topic().ledgers
                stored[(kind, codec)] = (sum(lg.bytes for lg in ledgers), sum(lg.uncompressed_bytes for lg in ledgers))
    for (kind, codec), times in results.items():
        s, raw = stored[(kind, codec)]
        med = statistics.median(times)
        print(json.dumps({"produce": kind, "batch_size": a.batch_size, "codec": codec,
                          "records_per_s": round(a.records / med), "raw_MB_per_s": round(raw / med / 1e6, 1),
                          "bytes": s, "raw_bytes": raw, "ratio": round(raw / s, 2),
                          "seconds": [round(x, 2) for x in times]}), flush=True)


# --------------------------------------------------------------------------- restore


def cmd_restore(a: argparse.Namespace) -> None:
    from shale.compactor import CompactionConfig, Compactor
    from shale.ledger.codecs import parse_compression
    from shale.reader import TableView, TopicReader

    base = Path(a.dir) / f"restore-{a.records}-{a.keys}"
    for codec in CODECS:
        topic = base / codec.replace(":", "")
        if not (topic / "ready").exists():
            shutil.rmtree(topic, ignore_errors=True)
            generate(str(topic), codec, a.records, a.keys, 64)
            Compactor(str(topic), CompactionConfig(delete_retention_ms=0,
                                                   compression=parse_compression(codec))).run()
            (topic / "ready").write_text("")
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(a.repeat):
        for codec in CODECS:
            topic = str(base / codec.replace(":", ""))
            t = time.perf_counter()
            n = len(TableView(topic))
            times.setdefault(("table view", codec), []).append(time.perf_counter() - t)
            t = time.perf_counter()
            m = sum(1 for _ in TopicReader(topic, read_compacted=True))
            times.setdefault(("compacted read", codec), []).append(time.perf_counter() - t)
            assert n == m or n <= m
    for (what, codec), ts in times.items():
        topic = str(base / codec.replace(":", ""))
        from shale.metadata.topic import TopicMetadata

        parts = TopicMetadata.open(topic).load_compaction().parts
        med = statistics.median(ts)
        print(json.dumps({"restore": what, "codec": codec, "records": sum(p.live for p in parts),
                          "records_per_s": round(sum(p.live for p in parts) / med), "seconds": round(med, 3),
                          "compacted_bytes": sum(p.bytes for p in parts)}), flush=True)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "child":
        child(sys.argv[2], sys.argv[3:])
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compact")
    c.add_argument("--records", type=int, default=20_000_000)
    c.add_argument("--keys", type=int, default=2_000_000)
    c.add_argument("--value-bytes", type=int, default=64)
    c.add_argument("--increment", type=float, default=0.01)
    c.add_argument("--repeat", type=int, default=3)
    pr = sub.add_parser("produce")
    pr.add_argument("--records", type=int, default=1_000_000)
    pr.add_argument("--repeat", type=int, default=3)
    pr.add_argument("--batch-size", type=int, default=100, help="records per entry (the producer's default: 100)")
    r = sub.add_parser("restore")
    r.add_argument("--records", type=int, default=2_000_000)
    r.add_argument("--keys", type=int, default=200_000)
    r.add_argument("--repeat", type=int, default=3)
    for x in (c, pr, r):
        x.add_argument("--dir", default=str(ROOT / "bench" / "data"))
    a = p.parse_args()
    {"compact": cmd_compact, "produce": cmd_produce, "restore": cmd_restore}[a.cmd](a)


if __name__ == "__main__":
    main()
