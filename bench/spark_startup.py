"""The Spark engine's fixed costs: a full and an incremental run on ``local-cluster``, with
and without the executors' daemon that imports Shale before the first task, beside the
local engine on the same topic.

    .venv/bin/python bench/spark_startup.py                       # 10 M records, twice each
    .venv/bin/python bench/spark_startup.py --records 1e6 --repeat 1   # a quick check

The topic is ``bench/spark_scale.py``'s (``bench/data/scale-<records>``: 16-byte keys
drawn from 2 M, 64-byte values, ledgers of 1 M records; generated once and reused).  Each
run is ``compact --json --no-gc`` in a process of its own (a CronJob's run: Spark's
application starts, runs once and stops).  Beside each run's time, its CPU time from the
topic's start to its end (``cpu_run_s``: the driver, its JVM, the executors, their Python
daemons and workers; ``cpu_start_s``, Spark's start-up) and the machine's load average
before it, since on a shared machine the times are noisy and the CPU time much less so.

* **full**: a copy of the topic compacted from scratch, by the Spark engine with the
  daemon (``shale.spark.daemon``, the default), without it (``--spark-conf
  spark.python.daemon.module=pyspark.daemon``: PySpark's own), and by the local engine;
  interleaved, ``--repeat`` rounds, in reverse order every other round.
* **incremental**: the last full Spark run's output given 1 % more records (same key
  space), saved once and restored before each run, compacted with and without the daemon.

The last line sums up (medians): the incremental run's time over the full run's (without
Spark's start-up, which ``spark_start_s`` shows, and with it), and the full run's records
per second per core, Spark's (``local-cluster``'s cores) against the local engine's (the
machine's cores, which its threads use), as a ratio: how many times the local engine's
per-core rate is Spark's; and the same ratio in records per CPU second.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import spark_scale  # (the topic, the driver process, the summary's figures)

#: compact's arguments for PySpark's own daemon, which imports nothing of the tasks'
PLAIN_DAEMON = ("--spark-conf", "spark.python.daemon.module=pyspark.daemon")


def cores(master: str) -> int:
    m = re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*\d+\]", master)
    if m:
        return int(m.group(1)) * int(m.group(2))
    m = re.fullmatch(r"local\[(\d+)\]", master)
    return int(m.group(1)) if m else os.cpu_count() or 1


def spark_run(uri: str, label: str, a: argparse.Namespace, variant: str) -> dict[str, Any]:
    """One ``compact --engine spark`` process: the summary's figures, CPU time and load."""
    args = argparse.Namespace(**vars(a))
    args.compact_arg = list(a.compact_arg or []) + (list(PLAIN_DAEMON) if variant == "no daemon" else [])
    args.pythonpath = a.baseline if variant == "baseline" else None
    load = os.getloadavg()[0]
    run = spark_scale.compact(uri, args)
    out = spark_scale.figures(f"{label}, spark, {variant}", run)
    out.update(variant=variant, load_before=round(load, 2),
               records_per_s_per_core=round(out["records"] / out["run_s"] / cores(a.master)),
               records_per_cpu_s=round(out["records"] / out["cpu_run_s"]))
    return out


def local_run(uri: str, a: argparse.Namespace) -> dict[str, Any]:
    """One ``compact`` with the local engine, in a process of its own."""
    spark_scale.reset(uri)
    load = os.getloadavg()[0]
    t = time.perf_counter()
    p = subprocess.run([sys.executable, spark_scale.__file__, "--driver", uri, "--json", "--no-gc"],
                       capture_output=True, text=True)
    wall = time.perf_counter() - t
    lines = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    summary = next((x for x in lines if "topic" in x), None)
    marks = next((x["driver"] for x in lines if "driver" in x), {})
    if p.returncode != 0 or summary is None or summary.get("status") != "compacted":
        raise SystemExit(f"compact {uri} exited {p.returncode}:\n{p.stdout}\n{p.stderr[-2000:]}")
    d = summary["durations"]
    n, cpu = os.cpu_count() or 1, marks["cpu_at_done_s"] - marks["cpu_at_topic_s"]
    records = summary["records_read"]
    return {"run": "full, local engine", "records": records, "written": summary["records_written"],
            "wall_s": round(wall, 2), "plan_s": d.get("plan"), "pass_one_s": d.get("pass_one"),
            "pass_two_s": d.get("pass_two"), "run_s": d["total"], "cpu_run_s": round(cpu, 2),
            "load_before": round(load, 2), "records_per_s_per_core": round(records / d["total"] / n),
            "records_per_cpu_s": round(records / cpu)}


def _copy(src: str, dst: str) -> None:
    """``src`` as ``dst``: objects hard-linked (never rewritten in place), metadata copied."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, copy_function=os.link, ignore=shutil.ignore_patterns("_meta"))
    shutil.copytree(Path(src) / "_meta", Path(dst) / "_meta")


def _order(variants: list[str], round_: int) -> list[str]:
    """The variants in order in even rounds, reversed in odd ones (A B, B A): whatever a
    run leaves the next one (page cache, the machine's other work) falls on each in turn."""
    return variants if round_ % 2 == 0 else variants[::-1]


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def summarise(fulls: dict[str, list[dict[str, Any]]], incs: dict[str, list[dict[str, Any]]],
              a: argparse.Namespace, new: int) -> dict[str, Any]:
    """The last line: medians of each variant's runs, and the ratios."""
    summary: dict[str, Any] = {"run": "summary (medians)", "records": a.records, "new_records": new,
                               "master": a.master, "load_after": round(os.getloadavg()[0], 2)}
    local_rate = _median(fulls["local"], "records_per_s_per_core")
    summary["local_run_s"] = _median(fulls["local"], "run_s")
    summary["local_cpu_run_s"] = _median(fulls["local"], "cpu_run_s")
    summary["local_records_per_s_per_core"] = round(local_rate)
    local_cpu_rate = _median(fulls["local"], "records_per_cpu_s")
    for v in incs:
        f_run, i_run = _median(fulls[v], "run_s"), _median(incs[v], "run_s")
        f_start, i_start = _median(fulls[v], "spark_start_s"), _median(incs[v], "spark_start_s")
        rate = _median(fulls[v], "records_per_s_per_core")
        summary[v] = {"full_run_s": round(f_run, 2), "incremental_run_s": round(i_run, 2),
                      "spark_start_s": [round(f_start, 2), round(i_start, 2)],
                      "incremental_over_full": round(i_run / f_run, 3),
                      "incremental_over_full_with_spark_start": round((i_start + i_run) / (f_start + f_run), 3),
                      "cpu_run_s": [_median(fulls[v], "cpu_run_s"), _median(incs[v], "cpu_run_s")],
                      "full_records_per_s_per_core": round(rate),
                      "local_per_core_over_spark_per_core": round(local_rate / rate, 2),
                      "local_over_spark_per_cpu_second": round(local_cpu_rate / _median(fulls[v], "records_per_cpu_s"),
                                                               2)}
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=lambda s: int(float(s)), default=10_000_000)
    p.add_argument("--keys", type=lambda s: int(float(s)), default=2_000_000, help="key space (default 2e6)")
    p.add_argument("--ledger-records", type=lambda s: int(float(s)), default=1_000_000)
    p.add_argument("--master", default="local-cluster[2,1,1024]", help="Spark master (default %(default)s)")
    p.add_argument("--repeat", type=int, default=2, help="rounds of each run, interleaved (default %(default)s)")
    p.add_argument("--baseline", metavar="DIR", help="also run compact from this Shale source tree (an older "
                   "commit, C kernels copied in), as the variant 'baseline'")
    p.add_argument("--compact-arg", action="append", metavar="ARG", help="one more argument for compact (repeatable)")
    p.add_argument("--dir", default=str(spark_scale.ROOT / "bench" / "data"))
    a = p.parse_args()
    Path(a.dir).mkdir(parents=True, exist_ok=True)
    topic, generated = spark_scale.ensure_topic(a.records, a)
    if generated:
        print(json.dumps(generated), flush=True)
    variants = ["daemon", "no daemon", *(["baseline"] if a.baseline else [])]
    full, inc, saved = f"{topic}-startup", f"{topic}-startup-incremental", f"{topic}-startup-saved"
    _copy(topic, full)
    try:
        fulls: dict[str, list[dict[str, Any]]] = {v: [] for v in [*variants, "local"]}
        for r in range(a.repeat):
            for v in _order(list(fulls), r):
                if v == "local":
                    res = local_run(full, a)
                else:
                    spark_scale.reset(full)
                    res = spark_run(full, "full", a, v)
                fulls[v].append(res)
                print(json.dumps({"round": r, **res}), flush=True)
        # the incremental runs' start: a full Spark run's output and 1 % more records
        spark_scale.reset(full)
        spark_run(full, "full, for the incremental runs", a, "daemon")
        new = max(1, a.records // 100)
        spark_scale.append(full, new, a.keys, a.ledger_records, seed=a.records + 1)
        _copy(full, saved)
        incs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        for r in range(a.repeat):
            for v in _order(variants, r):
                _copy(saved, inc)
                res = spark_run(inc, f"incremental (+{new} records)", a, v)
                incs[v].append(res)
                print(json.dumps({"round": r, **res}), flush=True)
        print(json.dumps(summarise(fulls, incs, a, new)), flush=True)
    finally:
        for d in (full, inc, saved):
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
