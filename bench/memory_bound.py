"""Peak memory of ``compact --max-memory`` runs that clean a big backlog in parts.

    .venv/bin/python bench/memory_bound.py [--keys 20000000] [--settings 64MiB,256MiB,1GiB] [--runs 8] [--compare]

Makes a topic of ``--keys`` records, every one with a key of its own (64-byte values,
zstd) under bench/data/memory-bound/, then for each setting copies it and runs
``shale compact --max-memory SETTING`` on the copy ``--runs`` times: the new keys do not
fit in one run, so each run compacts up to where they fit and the next continues
(partial cleaning), and every run reads the compacted records of the runs before again.

Each run is a child process of its own.  Printed per run: its peak resident set size
(``peak_rss_mib``: ``ru_maxrss`` from ``os.wait4``, the largest of the run's processes,
exact), the peak of its proportional set size summed over the run's processes (``pss_mib``:
pages the forked pass-two workers share with the run counted once, as a container's
memory accounting counts them) and the peaks of its anonymous and file-backed parts
(``Pss_Anon``, ``Pss_File`` of ``/proc/PID/smaps_rollup``), sampled every 10 ms by this
process (a short peak may be missed), the records it wrote and its time.
Beside each peak: the bound, the setting plus the fixed overhead docs/operations.md
states for a local folder.  ``--compare`` also runs the same scenario with
``--max-map-bytes SETTING`` (which bounds the key map alone), as before ``--max-memory``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BATCH = 1_000_000


def make_topic(path: Path, keys: int) -> None:
    """``keys`` records of 64-byte values, one key each, zstd."""
    import numpy as np

    from shale.producer import TopicWriter

    if (path / "_meta").exists():
        return
    rnd = np.random.default_rng(1)
    with TopicWriter(str(path), compression="zstd") as w:
        for start in range(0, keys, BATCH):
            n = min(BATCH, keys - start)
            blob = rnd.bytes(32 * n)
            w.append_batch({"key": [b"key-%010d" % i for i in range(start, start + n)],
                            "value": [blob[32 * j:32 * j + 32] + bytes(32) for j in range(n)]})


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


def _pss(pid: int) -> tuple[int, int]:
    """Anonymous and file-backed proportional set size of ``pid`` (pages shared with its
    forked workers counted once over them all; 0, 0 once it is gone)."""
    anon = file = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss_Anon:"):
                    anon = int(line.split()[1]) * 1024
                elif line.startswith("Pss_File:"):
                    file = int(line.split()[1]) * 1024
    except OSError:
        pass
    return anon, file


def run(argv: list[str]) -> dict[str, float]:
    """Run ``shale ARGV`` in a child; its peaks (bytes), seconds and exit code."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "shale.cli", *argv], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    peaks = {"anon": 0, "file": 0, "total": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            got = [_pss(p) for p in _tree(child.pid)]
            anon, file = sum(a for a, _ in got), sum(f for _, f in got)
            peaks["anon"], peaks["file"] = max(peaks["anon"], anon), max(peaks["file"], file)
            peaks["total"] = max(peaks["total"], anon + file)
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(child.pid, 0)
    done.set()
    sampler.join()
    seconds = time.perf_counter() - t
    out = child.stdout.read().decode() if child.stdout else ""
    err = child.stderr.read().decode() if child.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    if code:
        sys.stderr.write(f"{' '.join(argv)}: exit {code}: {err}")
    summary = json.loads(out.splitlines()[-1]) if out.strip() else {}
    return {"peak_rss": usage.ru_maxrss * 1024, "anon": peaks["anon"], "file": peaks["file"],
            "total": peaks["total"], "seconds": seconds,
            "exit": code, "records_kept": summary.get("records_written", 0),
            "deferred": summary.get("deferred_records", 0), "status": summary.get("status", "")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=20_000_000)
    p.add_argument("--settings", default="64MiB,128MiB,256MiB")
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--flag", default="max-memory", help="the setting to pass: max-memory or max-map-bytes")
    p.add_argument("--compare", action="store_true", help="also run each setting as --max-map-bytes")
    p.add_argument("--data", default=str(ROOT / "bench" / "data" / "memory-bound"))
    p.add_argument("--make", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    data = Path(a.data)
    if a.make is not None:
        make_topic(data / f"topic-{a.make}", a.make)
        return
    source = data / f"topic-{a.keys}"
    t = time.perf_counter()
    # made in a child: a run forked from this process would count its pages as its own peak
    subprocess.run([sys.executable, __file__, "--make", str(a.keys), "--data", str(data)], check=True)
    print(json.dumps({"made": str(source), "seconds": round(time.perf_counter() - t, 1)}), flush=True)
    from shale.compactor.budget import LOCAL_OVERHEAD
    from shale.settings.units import parse_size

    MB = 1 << 20
    flags = [a.flag, "max-map-bytes"] if a.compare else [a.flag]
    for setting in a.settings.split(","):
        for flag in flags:
            topic = data / "run"
            shutil.rmtree(topic, ignore_errors=True)
            shutil.copytree(source, topic)
            bound = parse_size(setting) + LOCAL_OVERHEAD
            for i in range(a.runs):
                got = run(["compact", str(topic), f"--{flag}", setting, "--json", "--min-dirty-ratio", "0"])
                print(json.dumps({"flag": flag, "setting": setting, "run": i + 1,
                                  "peak_rss_mib": round(got["peak_rss"] / MB),
                                  "bound_mib": round(bound / MB) if flag == "max-memory" else None,
                                  "pss_mib": round(got["total"] / MB), "pss_anon_mib": round(got["anon"] / MB),
                                  "pss_file_mib": round(got["file"] / MB),
                                  "records_written": got["records_kept"], "deferred": got["deferred"],
                                  "status": got["status"], "seconds": round(got["seconds"], 1), "exit": got["exit"]}),
                      flush=True)
            shutil.rmtree(topic, ignore_errors=True)

if __name__ == "__main__":
    main()
