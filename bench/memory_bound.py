"""Peak memory of ``compact --max-memory`` runs that clean a big backlog in parts.

    .venv/bin/python bench/memory_bound.py [--keys 20000000] [--settings 64MiB,256MiB] [--runs 8]

Makes a topic of ``--keys`` records, every one with a key of its own (64-byte values,
zstd) under bench/data/memory-bound/, then for each setting copies it and runs
``shale compact --max-memory SETTING`` on the copy ``--runs`` times: the new keys do not
fit in one run, so each run compacts up to where they fit and the next continues
(partial cleaning), and every run reads the compacted records of the runs before again.

Each run is a child process of its own.  Printed per run: its peak resident set size
(``ru_maxrss`` from ``os.wait4``: the largest of the run's processes, exact), and the
peaks of its anonymous and file-backed resident memory (``RssAnon``, ``RssFile`` of
``/proc/PID/status``, summed over the run's processes, sampled every 5 ms by this
process, so a short peak may be missed), the records it compacted and its time.
``--max-map-bytes`` instead of ``--max-memory``: ``--flag max-map-bytes``.
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


def _rss(pid: int) -> tuple[int, int]:
    """Anonymous and file-backed resident bytes of ``pid`` (0, 0 once it is gone)."""
    anon = file = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    anon = int(line.split()[1]) * 1024
                elif line.startswith("RssFile:"):
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
    peaks = {"anon": 0, "file": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            got = [_rss(p) for p in _tree(child.pid)]
            peaks["anon"] = max(peaks["anon"], sum(a for a, _ in got))
            peaks["file"] = max(peaks["file"], sum(f for _, f in got))
            time.sleep(0.005)

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
    return {"peak_rss": usage.ru_maxrss * 1024, "anon": peaks["anon"], "file": peaks["file"], "seconds": seconds,
            "exit": code, "records_kept": summary.get("records_written", 0),
            "deferred": summary.get("deferred_records", 0), "status": summary.get("status", "")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=20_000_000)
    p.add_argument("--settings", default="64MiB,128MiB,256MiB")
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--flag", default="max-memory", help="the setting to pass: max-memory or max-map-bytes")
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
    MB = 1 << 20
    for setting in a.settings.split(","):
        topic = data / "run"
        shutil.rmtree(topic, ignore_errors=True)
        shutil.copytree(source, topic)
        for i in range(a.runs):
            got = run(["compact", str(topic), f"--{a.flag}", setting, "--json", "--min-dirty-ratio", "0"])
            print(json.dumps({"setting": setting, "run": i + 1, "peak_rss_mib": round(got["peak_rss"] / MB),
                              "anon_mib": round(got["anon"] / MB), "file_mib": round(got["file"] / MB),
                              "records_kept": got["records_kept"], "deferred": got["deferred"],
                              "status": got["status"], "seconds": round(got["seconds"], 1), "exit": got["exit"]}),
                  flush=True)
        shutil.rmtree(topic, ignore_errors=True)


if __name__ == "__main__":
    main()
