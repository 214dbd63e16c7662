"""Peak memory of reading and exporting against a topic's decompressed size.

    .venv/bin/python bench/memory_bytes.py [--sizes 0.5,1,2,4] [--commands all]

Makes one topic per size under bench/data/memory-bytes/: entries of 4 records of 63 MiB
of repeated printable text (JSON lines hold it as it is) compressed with zstd (252 MiB
per entry decompressed, inside the 256 MiB an entry may hold; a few KB stored), as many
entries as the size asks (8 for 2 GB), every record with a key of its own, so the table
holds every record.  Then runs each command
in a child process of its own and prints the child's peak resident set size (its
``ru_maxrss``, from ``os.wait4``) and time: ``shale export`` to Parquet, Arrow and JSON
lines, ``export --table``, ``read --table`` and ``read --compacted`` (output to
/dev/null).  ``--max-batch-bytes`` is passed to every command when given.

    .venv/bin/python bench/memory_bytes.py --sweep 4MiB,16MiB,64MiB,256MiB [--repeat 3]

The other side of the setting: time and peak memory of ``shale export`` (the compacted
view and the table, to Parquet) at each ``--max-batch-bytes``, interleaved, medians, on a
topic of records big enough for bytes rather than rows to cut batches (30,000 records of
32 KiB, 15,000 keys, zstd, compacted once, then 10 % more above the horizon).

    .venv/bin/python bench/memory_bytes.py --small 4000000

Many small records: a topic of N records (64-byte values, N / 10 keys, zstd, not
compacted: the table is folded from every record), and the time and peak memory of
``export --table`` (Parquet) and ``read --table``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RECORD_BYTES = 63 << 20
RECORDS_PER_ENTRY = 4
ENTRY_BYTES = RECORD_BYTES * RECORDS_PER_ENTRY

COMMANDS = {
    "export parquet": ["export", "{topic}", "{out}/x.parquet"],
    "export arrow": ["export", "{topic}", "{out}/x.arrow"],
    "export jsonl": ["export", "{topic}", "{out}/x.jsonl"],
    "export --table parquet": ["export", "{topic}", "{out}/t.parquet", "--table"],
    "export --table jsonl": ["export", "{topic}", "{out}/t.jsonl", "--table"],
    "read --table": ["read", "{topic}", "--table"],
    "read --compacted": ["read", "{topic}", "--compacted"],
}


def make_topic(path: Path, entries: int) -> None:
    """``entries`` entries of 4 records of 63 MiB of text, zstd; one key per record."""
    from shale.producer import TopicWriter

    if (path / "_meta").exists():
        return
    value = b"0123456789abcdef" * (RECORD_BYTES // 16)
    with TopicWriter(str(path), compression="zstd", batch_size=RECORDS_PER_ENTRY, max_entry_bytes=ENTRY_BYTES + 1,
                     max_ledger_bytes=1 << 40) as w:
        for i in range(entries * RECORDS_PER_ENTRY):
            w.append(f"key-{i}", value)


def stored_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


#: Runs a command and prints its peak resident set size (kB) and exit code.  A child
#: forked from a big process (this one, after it made a topic) counts that process's
#: pages as its own peak, even after it execs: the command is started from this small
#: process instead.
_MEASURE = ("import os, subprocess, sys; c = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL); "
            "_, s, u = os.wait4(c.pid, 0); print(u.ru_maxrss, os.waitstatus_to_exitcode(s))")


def run(argv: list[str], out: Path) -> tuple[int, float, int]:
    """Peak RSS (bytes), seconds and exit code of ``shale ARGV`` in a process of its own."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", _MEASURE, sys.executable, "-m", "shale.cli", *argv],
                       capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t
    kb, code = map(int, r.stdout.split())
    if code:
        sys.stderr.write(f"{' '.join(argv)}: exit {code}: {r.stderr}")
    for f in out.iterdir():
        f.unlink()
    return kb * 1024, seconds, code


def make_sweep_topic(path: Path) -> None:
    """30,000 records of 32 KiB (8 KiB random, the rest zeros: about 1 GB decompressed)
    of 15,000 keys, zstd, compacted, then 3,000 more above the horizon."""
    from shale.compactor import Compactor
    from shale.producer import TopicWriter

    if (path / "_meta").exists():
        return
    import numpy as np

    rnd = np.random.default_rng(1)

    def produce(n: int) -> None:
        keys = rnd.integers(0, 15_000, n)
        with TopicWriter(str(path), compression="zstd") as w:
            for k in keys.tolist():
                w.append(f"key-{k:06d}", rnd.bytes(8 << 10) + bytes(24 << 10))

    produce(30_000)
    Compactor(str(path)).run()
    produce(3_000)


def small(data: Path, n: int) -> None:
    """``export --table`` and ``read --table`` of ``n`` small records (see the module)."""
    import numpy as np

    from shale.producer import TopicWriter

    topic = data / f"small-{n}"
    if not (topic / "_meta").exists():
        rnd = np.random.default_rng(1)
        keys = rnd.integers(0, max(1, n // 10), n)
        with TopicWriter(str(topic), compression="zstd") as w:
            for s in range(0, n, 500_000):
                part = keys[s:s + 500_000].tolist()
                w.append_batch({"key": [f"key-{k:09d}".encode() for k in part],
                                "value": [rnd.bytes(32) + bytes(32) for _ in part]})
    out = data / "out"
    for name, argv in (("export --table parquet", ["export", str(topic), str(out / "t.parquet"), "--table"]),
                       ("read --table", ["read", str(topic), "--table"])):
        rss, seconds, code = run(argv, out)
        print(json.dumps({"command": name, "records": n, "peak_rss_mb": round(rss / 1e6),
                          "seconds": round(seconds, 2), "exit": code}), flush=True)


def sweep(data: Path, sizes: list[str], repeat: int) -> None:
    import statistics

    topic = data / "sweep"
    make_sweep_topic(topic)
    out = data / "out"
    runs: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for _ in range(repeat):
        for size in sizes:
            for what in ("--compacted", "--table"):
                rss, seconds, code = run(["export", str(topic), str(out / "x.parquet"), what,
                                          "--max-batch-bytes", size], out)
                assert code == 0
                runs.setdefault((size, what), []).append((rss, seconds))
    for (size, what), got in runs.items():
        print(json.dumps({"max_batch_bytes": size, "export": what,
                          "median_s": round(statistics.median(s for _, s in got), 2),
                          "peak_rss_mb": round(max(r for r, _ in got) / 1e6)}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="0.5,1,2,4", help="decompressed sizes in GB (2**30 bytes), comma-separated")
    p.add_argument("--commands", default="all", help=f"comma-separated, of: {', '.join(COMMANDS)}")
    p.add_argument("--max-batch-bytes", default=None, help="passed to every command")
    p.add_argument("--data", default=str(ROOT / "bench" / "data" / "memory-bytes"))
    p.add_argument("--sweep", default=None, help="comma-separated sizes: time export at each (see above)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--small", type=int, default=None, metavar="N", help="the table of N small records (see above)")
    a = p.parse_args()
    names = list(COMMANDS) if a.commands == "all" else [c.strip() for c in a.commands.split(",")]
    data = Path(a.data)
    out = data / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if a.sweep:
        sweep(data, a.sweep.split(","), a.repeat)
        return
    if a.small:
        small(data, a.small)
        return
    for size in (float(s) for s in a.sizes.split(",")):
        entries = max(1, round(size * (1 << 30) / ENTRY_BYTES))
        topic = data / f"topic-{entries}-entries"
        make_topic(topic, entries)
        for name in names:
            argv = [x.format(topic=topic, out=out) for x in COMMANDS[name]]
            if a.max_batch_bytes:
                argv += ["--max-batch-bytes", a.max_batch_bytes]
            rss, seconds, code = run(argv, out)
            print(json.dumps({"command": name, "entries": entries,
                              "decompressed_gb": round(entries * ENTRY_BYTES / (1 << 30), 2),
                              "stored_kb": round(stored_bytes(topic) / 1000), "peak_rss_mb": round(rss / 1e6),
                              "seconds": round(seconds, 1), "exit": code}), flush=True)


if __name__ == "__main__":
    main()
