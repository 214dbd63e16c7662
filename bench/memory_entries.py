"""Peak memory of compacting and reading topics of big entries, against the bounds.

    .venv/bin/python bench/memory_entries.py [--settings 64MiB,384MiB] [--topics one-entry,twelve]
                                             [--readers] [--codecs zstd,lz4,none]

Makes, under bench/data/memory-entries/, topics written with the public ``TopicWriter``:

* ``one-entry``: one entry of 4 records of 63 MiB (252 MiB decompressed, the most an
  entry may hold is 256 MiB; ``max_entry_bytes=256 MiB``), a few KB stored with zstd;
* ``twelve``: twelve records of 60 MB, each in an entry of its own.

Then, for each setting, copies each topic afresh and runs ``shale compact --max-memory
SETTING`` on the copy; when a run is refused for the bound (exit 2), the least bound the
refusal names is run as well.  ``--readers`` runs ``shale export`` (Parquet), ``shale
read`` (JSON lines), ``read --table`` and ``read --compacted`` on each topic at the
default ``--max-batch-bytes`` (16 MiB), once per codec of ``--codecs``.

Each command is a process of its own, started from a small measuring process (a child
forked from a big process counts its parent's pages in its own peak).  Printed per run:
the largest resident set of any one of its processes (``peak_rss_mib``: ``ru_maxrss``
from ``os.wait4``, exact) and the peak of the resident and proportional set sizes summed
over the command and every process it forked (``tree_rss_mib``, ``tree_pss_mib``: pages
the forked pass-two workers share with the run counted once by PSS, as a container's
accounting counts them), sampled every 5 ms from /proc (a short peak may be missed);
beside them the bound, the setting plus the fixed overhead docs/operations.md states for
a local folder (64 MiB).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MiB = 1 << 20
TOPICS = {
    # name: (records, bytes per record, records per entry)
    "one-entry": (4, 63 * MiB, 4),
    "twelve": (12, 60_000_000, 1),
}
READERS = {
    "export parquet": ["export", "{topic}", "{out}/x.parquet"],
    "read": ["read", "{topic}"],
    "read --table": ["read", "{topic}", "--table"],
    "read --compacted": ["read", "{topic}", "--compacted"],
}


def make_topic(path: Path, name: str, codec: str) -> None:
    """Topic ``name`` (see the module) stored with ``codec``; values of repeated text, a
    key each."""
    from shale.producer import TopicWriter

    if (path / "_meta").exists():
        return
    records, size, per_entry = TOPICS[name]
    value = (b"0123456789abcdef" * (size // 16 + 1))[:size - 16]
    # an entry is sealed once its records reach max_entry_bytes (or batch_size of them)
    entry = 256 * MiB if per_entry > 1 else 1 * MiB
    with TopicWriter(str(path), compression=codec, batch_size=per_entry, max_entry_bytes=entry,
                     max_ledger_bytes=1 << 40) as w:
        for i in range(records):
            w.append(f"key-{i:04d}", value)


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def _sizes(pid: int) -> tuple[int, int]:
    """Resident and proportional set size of ``pid`` (0, 0 once it is gone)."""
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
    except OSError:
        pass
    return rss, pss


#: Runs a command and prints its peak resident set size (kB) and exit code (see the module).
_MEASURE = ("import os, subprocess, sys; c = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, "
            "stderr=open(os.environ['BENCH_STDERR'], 'w')); _, s, u = os.wait4(c.pid, 0); "
            "print(u.ru_maxrss, os.waitstatus_to_exitcode(s))")


def run(argv: list[str], scratch: Path) -> dict[str, object]:
    """Run ``shale ARGV`` in a process of its own; its peaks (bytes), exit code and the
    first line of its standard error."""
    err = scratch / "stderr"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BENCH_STDERR": str(err)}
    t = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", _MEASURE, sys.executable, "-m", "shale.cli", *argv],
                             stdout=subprocess.PIPE, text=True, env=env)
    peaks = {"rss": 0, "pss": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            got = [_sizes(p) for p in _tree(child.pid)[1:]]  # (not the measuring process)
            peaks["rss"] = max(peaks["rss"], sum(r for r, _ in got))
            peaks["pss"] = max(peaks["pss"], sum(p for _, p in got))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = child.communicate()
    done.set()
    sampler.join()
    kb, code = map(int, out.split())
    first = err.read_text().strip().splitlines()[-1:] if err.exists() else []
    return {"peak_rss": kb * 1024, "tree_rss": peaks["rss"], "tree_pss": peaks["pss"], "exit": code,
            "seconds": time.perf_counter() - t, "stderr": first[0] if first else ""}


def _mib(n: object) -> int:
    return round(int(n) / MiB)  # type: ignore[call-overload]


def compact(data: Path, name: str, setting: str) -> list[dict[str, object]]:
    """``compact --max-memory SETTING`` on a fresh copy of topic ``name``, then at the
    least bound a refusal names; a row per run."""
    from shale.compactor.budget import LOCAL_OVERHEAD
    from shale.settings.units import parse_size

    rows = []
    for s in (setting, None):
        if s is None:
            m = re.search(r"at least (\d+MiB)", str(rows[-1]["stderr"])) if rows[-1]["exit"] == 2 else None
            if m is None:
                break
            s = m.group(1)
        topic = data / "run"
        shutil.rmtree(topic, ignore_errors=True)
        shutil.copytree(data / f"{name}-zstd", topic)
        got = run(["compact", str(topic), "--max-memory", s, "--json", "--min-dirty-ratio", "0"], data)
        if got["exit"] == 0:
            got["view"] = _view_ok(topic, name)
        shutil.rmtree(topic, ignore_errors=True)
        rows.append({"topic": name, "setting": s, "bound_mib": _mib(parse_size(s) + LOCAL_OVERHEAD), **got})
    return rows


def _view_ok(topic: Path, name: str) -> bool:
    """Whether the compacted view holds every record, by id and size (read from footers
    and one record's bytes at a time, in a process of its own)."""
    code = ("import sys; from shale.reader import TopicReader\n"
            "with TopicReader(sys.argv[1], read_compacted=True) as r:\n"
            "    print(';'.join(f'{m.key.decode()}={len(m.value)}' for m in r))")
    out = subprocess.run([sys.executable, "-c", code, str(topic)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True).stdout.strip()
    records, size, _ = TOPICS[name]
    return out == ";".join(f"key-{i:04d}={size - 16}" for i in range(records))


def readers(data: Path, name: str, codec: str) -> list[dict[str, object]]:
    rows = []
    out = data / "out"
    out.mkdir(exist_ok=True)
    for what, argv in READERS.items():
        got = run([a.format(topic=data / f"{name}-{codec}", out=out) for a in argv], data)
        for f in out.iterdir():
            f.unlink()
        rows.append({"topic": name, "codec": codec, "command": what, **got})
    return rows


def _print(row: dict[str, object]) -> None:
    for k in ("peak_rss", "tree_rss", "tree_pss"):
        row[f"{k}_mib"] = _mib(row.pop(k))
    row["seconds"] = round(float(row["seconds"]), 1)  # type: ignore[arg-type]
    print(json.dumps(row), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--settings", default="64MiB,384MiB")
    p.add_argument("--topics", default="one-entry,twelve")
    p.add_argument("--readers", action="store_true", help="also measure the readers")
    p.add_argument("--codecs", default="zstd", help="the readers' topics: zstd, lz4, none")
    p.add_argument("--no-compact", action="store_true", help="measure the readers only")
    p.add_argument("--data", default=str(ROOT / "bench" / "data" / "memory-entries"))
    p.add_argument("--make", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    data = Path(a.data)
    if a.make is not None:
        name, codec = a.make.rsplit("-", 1)
        make_topic(data / a.make, name, codec)
        return
    data.mkdir(parents=True, exist_ok=True)
    codecs = a.codecs.split(",") if a.readers else []
    for name in a.topics.split(","):
        for codec in sorted({"zstd", *codecs}):
            # made in a child: its pages would count in the peak of a run forked from here
            subprocess.run([sys.executable, __file__, "--make", f"{name}-{codec}", "--data", str(data)], check=True)
    for name in a.topics.split(","):
        if not a.no_compact:
            for setting in a.settings.split(","):
                for row in compact(data, name, setting):
                    _print(row)
        for codec in codecs:
            for row in readers(data, name, codec):
                _print(row)


if __name__ == "__main__":
    main()
