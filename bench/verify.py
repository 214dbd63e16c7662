"""Time ``shale verify`` on the compared benchmark's topic, and its fold beside the compactor's.

    .venv/bin/python bench/verify.py --records 20000000 --keys 2000000
    .venv/bin/python bench/verify.py --tree /tmp/older-checkout      # against another build

Builds (or reuses) the topic ``bench/compare.py`` generates (under bench/data/), compacts
it once, then runs ``shale verify`` in a process of its own ``--repeat`` times for each
source tree given (this checkout first, then every ``--tree``), interleaved, so that a
slow spell of the machine hits each alike: one JSON line per run (wall seconds of the
whole process, peak RSS), then the median of each.  Last, in this process, the two
folds on the topic's original records: ``shale verify``'s own
(:func:`shale.maintenance.verify_fold.latest_per_key`) and the compactor's
(:func:`shale.compactor.rules.latest_of_each_key`), medians of interleaved calls.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def topic(a: argparse.Namespace) -> Path:
    """The compared benchmark's topic, generated and compacted once."""
    from compare import generate  # bench/compare.py

    from shale.compactor import CompactionConfig, Compactor

    codec = a.compression.replace(":", "")
    base = Path(a.dir) / f"verify-{a.records}-{a.keys}-{a.value_bytes}{'' if codec == 'none' else '-' + codec}"
    uri = base / "topic"
    if not (base / "ready").exists():
        import shutil

        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        generate(str(uri), str(base / "records.parquet"), 1, a.records, a.keys, a.value_bytes,
                 compression=a.compression)
        Compactor(str(uri), CompactionConfig()).run()
        (base / "ready").write_text("")
    return uri


def verify_once(tree: Path, uri: Path) -> dict[str, Any]:
    """One ``shale verify`` in a process of its own: its wall time, CPU time and peak RSS."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "shale.cli", "verify", str(uri), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd="/")
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout.read(), proc.stderr.read()  # (a few lines: no pipe fills)
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own resource usage
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: verify exited {proc.returncode}: {err or out}")
    return {"tree": str(tree), "seconds": round(wall, 2), "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mb": round(usage.ru_maxrss / 1024), "ok": json.loads(out)["ok"]}


def folds(uri: Path, repeat: int) -> dict[str, Any]:
    """Both folds on the original records' hashes, interleaved; they must agree."""
    import numpy as np

    from shale.compactor.rules import latest_of_each_key
    from shale.ledger.reader import LedgerFile
    from shale.maintenance.verify_fold import latest_per_key
    from shale.metadata.topic import TopicMetadata

    meta = TopicMetadata.open(str(uri))
    loc = meta.topic
    his, los = [], []
    for lg in meta.load_topic().ledgers:
        foot = LedgerFile.open(loc.store, loc.key(lg.object)).footer
        his.append(np.array(foot.col("r_hash_hi")))
        los.append(np.array(foot.col("r_hash_lo")))
    hi, lo = np.concatenate(his), np.concatenate(los)
    times: dict[str, list[float]] = {"verify_fold": [], "compactor_fold": []}
    for _ in range(repeat):
        for name, fn in (("verify_fold", latest_per_key), ("compactor_fold", latest_of_each_key)):
            t = time.perf_counter()
            got = fn(hi, lo)
            times[name].append(time.perf_counter() - t)
            if name == "verify_fold":
                mine = got
            elif not np.array_equal(mine, got):
                raise SystemExit("the two folds disagree")
    return {"records": len(hi), **{k: round(statistics.median(v), 2) for k, v in times.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=20_000_000)
    p.add_argument("--keys", type=int, default=2_000_000)
    p.add_argument("--value-bytes", type=int, default=64)
    p.add_argument("--compression", default="zstd:1")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--tree", action="append", default=[], help="another source tree to time verify from")
    p.add_argument("--dir", default=str(ROOT / "bench" / "data"))
    a = p.parse_args()
    uri = topic(a)
    trees = [ROOT, *(Path(t).resolve() for t in a.tree)]
    runs: dict[str, list[dict[str, Any]]] = {str(t): [] for t in trees}
    verify_once(ROOT, uri)  # untimed: the topic into the page cache, compiled modules cached
    for _ in range(a.repeat):
        for tree in trees:
            r = verify_once(tree, uri)
            runs[str(tree)].append(r)
            print(json.dumps(r), flush=True)
    for tree, rs in runs.items():
        medians = {k: statistics.median(r[k] for r in rs) for k in ("seconds", "cpu_seconds", "peak_rss_mb")}
        print(json.dumps({"summary": tree, "runs": len(rs), **medians}), flush=True)
    print(json.dumps({"folds": folds(uri, a.repeat)}), flush=True)


if __name__ == "__main__":
    main()
