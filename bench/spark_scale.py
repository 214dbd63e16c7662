"""The Spark engine at scale: the driver's peak memory against topic size, and an
incremental run against a full one.

    .venv/bin/python bench/spark_scale.py                                  # 10 M, 50 M, 100 M records
    .venv/bin/python bench/spark_scale.py --sizes 1e6,3e6 --ledger-records 250000   # a quick check

Each topic (``bench/data/scale-<records>``, kept and reused while its records and the
settings in ``scale-<records>.json`` match) holds records of 16-byte keys (``key-`` and
12 digits, drawn uniformly from ``--keys``, default a fixed 2 M so the compacted output
is the same for every size and only the input grows) and 64-byte values (hex, about 2x
compressible), in ledgers of ``--ledger-records``: a bigger topic is more ledgers.  It is
written with ``TopicWriter.append_batch``, 1 M rows a call.

Each topic is compacted from scratch by ``compact --engine spark --spark-master
local-cluster[2,1,1024] --json --no-gc`` in a driver process of its own, which prints
its peak RSS (VmHWM; ``ru_maxrss`` too, which on Linux also holds the starting process's
RSS), its RSS right after Spark started (the baseline: imports, JVM and session) and at
each phase, the Spark driver JVM's peak, and the CPU time of the whole application (this
process, the JVM and every process under it: executors, Python daemons and workers) when
Spark had started (``cpu_start_s``) and from the topic's start to its end
(``cpu_run_s``).  ``driver_bytes_per_ledger`` is (peak - baseline) / ledgers.  Then the
smallest topic is copied, compacted in full, given 1 % more records (same key space) and
compacted again: the ratio of the two runs' times, without and with Spark's start-up.
One JSON line per run.  ``--pythonpath`` runs ``compact`` from another Shale tree (an
older commit), to compare engines.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BATCH = 1_000_000
MIB = 1024 * 1024


def _status_kib(pid: int | str = "self") -> dict[str, int]:
    """VmRSS and VmHWM of a process, in KiB (empty when it is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {k: int(v.split()[0]) for k, _, v in (ln.partition(":") for ln in lines) if k in ("VmRSS", "VmHWM")}


def _tree_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of this process and of every process under it, each
    with the children it has reaped (``/proc/<pid>/stat``), by kind: this ``driver``, the
    driver's ``jvm``, the ``executors`` (JVMs), the ``python_workers`` (executors' Python
    daemons and the workers they forked), ``other`` (the local engine's workers)."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                f = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(d.name)] = int(f[1])
            cpu[int(d.name)] = sum(int(x) for x in f[11:15]) / tick
    out = {"driver": 0.0, "jvm": 0.0, "executors": 0.0, "python_workers": 0.0, "other": 0.0}
    todo = [(os.getpid(), "driver")]
    while todo:
        pid, kind = todo.pop()
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            cmd = b""
        if pid != os.getpid():
            if b"CoarseGrainedExecutorBackend" in cmd:
                kind = "executors"
            elif b"java" in cmd.split(b"\0")[0]:
                kind = "jvm"
            elif b"daemon" in cmd or kind == "python_workers":
                kind = "python_workers" if kind in ("executors", "python_workers", "jvm") else "other"
            elif kind == "driver":
                kind = "other"
        out[kind] += cpu.get(pid, 0.0)
        todo.extend((c, kind) for c, p in parents.items() if p == pid)
    return out


def _tree_cpu_s() -> float:
    """CPU seconds of this process and every process under it (:func:`_tree_cpu`)."""
    return sum(_tree_cpu().values())


def driver(argv: list[str]) -> int:
    """The child: run ``compact`` (the console script's entry point) and print what its
    Python process (and the JVM it started) held, as one JSON line after the summary."""
    import logging

    from shale.cli.runlog import logger
    from shale.compactor import cli

    marks: dict[str, Any] = {}

    class Marks(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            name = getattr(record, "event", "")
            if name == "spark.start":
                from pyspark import SparkContext

                marks["baseline_kib"] = _status_kib()["VmRSS"]
                proc = getattr(SparkContext._gateway, "proc", None)
                marks["jvm_pid"] = proc.pid if proc is not None else None
                marks["cpu_at_start_s"] = _tree_cpu_s()
            elif name == "topic.start" and "cpu_at_topic_s" not in marks:
                marks["cpu_by_kind"] = _tree_cpu()
                marks["cpu_at_topic_s"] = sum(marks["cpu_by_kind"].values())
            elif name == "topic.done" and "cpu_at_done_s" not in marks:
                done = _tree_cpu()
                marks["cpu_at_done_s"] = sum(done.values())
                marks["cpu_run_by_kind"] = {k: round(v - marks["cpu_by_kind"].get(k, 0.0), 2) for k, v in done.items()}
            elif name == "topic.phase":
                phase = getattr(record, "fields", {}).get("phase", "")
                phase = " ".join(phase.split()[:2]).rstrip(":") if phase.startswith("pass") else phase
                marks.setdefault("rss_at_mib", {})[phase] = round(_status_kib()["VmRSS"] / 1024)

    logger.addHandler(Marks(logging.INFO))
    code = cli.main(argv)
    jvm = _status_kib(marks.pop("jvm_pid")) if marks.get("jvm_pid") else {}
    # ru_maxrss also counts the RSS of the process this one was started from (Linux keeps
    # the larger of the old and new images' peaks across exec): VmHWM is this image's own.
    marks.update(code=code, shale=str(Path(cli.__file__).resolve().parent.parent), peak_kib=_status_kib()["VmHWM"],
                 ru_maxrss_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, jvm_peak_kib=jvm.get("VmHWM"))
    print(json.dumps({"driver": marks}), flush=True)
    return code


def _keys(ids: Any) -> Any:
    """``key-%012d`` of each id as a pyarrow binary array, without a Python object per row."""
    import numpy as np
    import pyarrow as pa

    n = len(ids)
    buf = np.empty((n, 16), np.uint8)
    buf[:, :4] = np.frombuffer(b"key-", np.uint8)
    v = ids.astype(np.int64)
    for i in range(15, 3, -1):
        buf[:, i] = 48 + v % 10
        v //= 10
    offsets = np.arange(0, 16 * (n + 1), 16, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(buf)])


def append(uri: str, records: int, keys: int, ledger_records: int, seed: int) -> float:
    """Append ``records`` records to the topic in batches of 1 M rows; return the seconds."""
    import numpy as np
    import pyarrow as pa

    from shale.producer import TopicWriter

    rng = np.random.default_rng(seed)
    t = time.perf_counter()
    with TopicWriter(uri, max_ledger_records=ledger_records, max_ledger_bytes=1 << 40) as w:
        for done in range(0, records, BATCH):
            n = min(BATCH, records - done)
            raw = rng.integers(0, 256, size=n * 32, dtype=np.uint8).tobytes().hex().encode()
            values = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(
                np.arange(0, 64 * (n + 1), 64, dtype=np.int32)), pa.py_buffer(raw)])
            w.append_batch(pa.table({"key": _keys(rng.integers(0, keys, n)), "value": values}))
    return time.perf_counter() - t


def ensure_topic(records: int, a: argparse.Namespace) -> tuple[str, dict[str, Any] | None]:
    """The topic of ``records`` records, generated unless a complete one with the same
    settings is there; also the generation's figures when it was generated."""
    from shale.metadata.topic import TopicMetadata

    uri = str(Path(a.dir) / f"scale-{records}")
    params = {"records": records, "keys": a.keys, "ledger_records": a.ledger_records, "value_bytes": 64}
    side = Path(uri + ".json")
    if (Path(uri) / "_meta" / "topic.json").exists() and side.exists() and json.loads(side.read_text()) == params \
            and TopicMetadata.open(uri).load_topic().records == records:
        return uri, None
    shutil.rmtree(uri, ignore_errors=True)
    side.unlink(missing_ok=True)
    seconds = append(uri, records, a.keys, a.ledger_records, seed=records)
    side.write_text(json.dumps(params))
    ledgers = len(TopicMetadata.open(uri).load_topic().ledgers)
    return uri, {"run": "generate", "records": records, "ledgers": ledgers, "seconds": round(seconds, 2),
                 "records_per_s": round(records / seconds)}


def reset(uri: str) -> None:
    """Forget every compaction, so the run starts from scratch on the same ledgers."""
    shutil.rmtree(Path(uri) / "compacted", ignore_errors=True)
    (Path(uri) / "_meta" / "compaction.json").unlink(missing_ok=True)


def compact(uri: str, a: argparse.Namespace) -> dict[str, Any]:
    """One ``compact --engine spark`` in a driver process of its own: its summary and
    memory figures."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("PySpark is not installed: pip install 'shale[spark]'")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    # where local-cluster's executors start from (pyspark's launcher finds it too, when unset)
    env.setdefault("SPARK_HOME", next(iter(spec.submodule_search_locations)))
    if a.pythonpath:  # another Shale source tree for the driver and (by inheritance) the executors
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (a.pythonpath, env.get("PYTHONPATH"))))
    argv = [uri, "--engine", "spark", "--spark-master", a.master, "--json", "--no-gc",
            "--spark-conf", "spark.ui.enabled=false", *(a.compact_arg or [])]
    t = time.perf_counter()
    p = subprocess.run([sys.executable, __file__, "--driver", *argv], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    lines = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    summary = next((x for x in lines if "topic" in x), None)
    mem = next((x["driver"] for x in lines if "driver" in x), None)
    if p.returncode != 0 or summary is None or mem is None or summary.get("status") != "compacted":
        tail = "\n".join(p.stderr.strip().splitlines()[-25:])
        raise SystemExit(f"compact {' '.join(argv)} exited {p.returncode}:\n{p.stdout.strip()}\n{tail}")
    return {"summary": summary, "driver": mem, "wall": wall}


def figures(label: str, run: dict[str, Any]) -> dict[str, Any]:
    """One run's JSON line: volumes, the driver's memory, durations per phase."""
    s, m, d = run["summary"], run["driver"], run["summary"]["durations"]
    ledgers, records = s["ledgers_read"], s["records_read"]
    peak, base = m["peak_kib"] * 1024, m.get("baseline_kib", 0) * 1024
    return {
        "run": label, "records": records, "ledgers": ledgers, "keys": s["keys"], "written": s["records_written"],
        "reused": s["records_reused"], "driver_peak_mib": round(peak / MIB, 1),
        "driver_ru_maxrss_mib": round(m["ru_maxrss_kib"] / 1024, 1),
        "driver_baseline_mib": round(base / MIB, 1) if base else None,
        "driver_bytes_per_ledger": round((peak - base) / ledgers) if base and ledgers else None,
        "driver_bytes_per_record": round((peak - base) / records, 2) if base and records else None,
        "driver_rss_at_mib": m.get("rss_at_mib"),
        "jvm_driver_peak_mib": round(m["jvm_peak_kib"] / 1024, 1) if m.get("jvm_peak_kib") else None,
        "wall_s": round(run["wall"], 2), "spark_start_s": d.get("spark_start"), "plan_s": d.get("plan"),
        "pass_one_s": d.get("pass_one"), "pass_two_s": d.get("pass_two"), "publish_s": d.get("publish"),
        "run_s": d["total"], "records_per_s": round(records / d["total"]) if d["total"] else None,
        "cpu_start_s": round(m["cpu_at_start_s"], 2) if "cpu_at_start_s" in m else None,
        "cpu_run_s": round(m["cpu_at_done_s"] - m["cpu_at_topic_s"], 2) if "cpu_at_done_s" in m else None,
        "cpu_run_by_kind": m.get("cpu_run_by_kind"),
        "shale": m.get("shale")}


def _start(run: dict[str, Any]) -> float:
    d = run["summary"]["durations"]
    return float(d["total"] + d.get("spark_start", 0.0))


def incremental(uri: str, records: int, a: argparse.Namespace) -> None:
    """Copy the topic, compact it in full, append 1 % more records, compact again."""
    work = uri + "-incremental"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(uri, work, ignore=shutil.ignore_patterns("compacted", "compaction.json"))
    try:
        full = compact(work, a)
        print(json.dumps(figures("incremental: full run first", full)), flush=True)
        new = max(1, records // 100)
        append(work, new, a.keys, a.ledger_records, seed=records + 1)
        inc = compact(work, a)
        print(json.dumps(figures("incremental: after 1 % new records", inc)), flush=True)
        ft, it = full["summary"]["durations"]["total"], inc["summary"]["durations"]["total"]
        print(json.dumps({"run": "incremental ratio", "topic_records": records, "new_records": new,
                          "full_run_s": ft, "incremental_run_s": it, "ratio": round(it / ft, 3),
                          "full_with_spark_start_s": round(_start(full), 3),
                          "incremental_with_spark_start_s": round(_start(inc), 3),
                          "ratio_with_spark_start": round(_start(inc) / _start(full), 3),
                          "ratio_wall": round(inc["wall"] / full["wall"], 3)}), flush=True)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10e6,50e6,100e6", help="records per topic, comma-separated (%(default)s)")
    p.add_argument("--keys", type=lambda s: int(float(s)), default=2_000_000, help="key space (default 2e6)")
    p.add_argument("--ledger-records", type=lambda s: int(float(s)), default=1_000_000)
    p.add_argument("--master", default="local-cluster[2,1,1024]", help="Spark master (default %(default)s)")
    p.add_argument("--compact-arg", action="append", metavar="ARG",
                   help="one more argument for compact, e.g. --compact-arg=--spark-split-size=64MiB (repeatable)")
    p.add_argument("--pythonpath", metavar="DIR", help="run compact from this Shale source tree (e.g. a `git archive` "
                   "of an older commit, C kernels copied in) instead of the installed one")
    p.add_argument("--no-incremental", action="store_true", help="skip the incremental run")
    p.add_argument("--keep", action="store_true", help="keep the incremental run's copy of the topic")
    p.add_argument("--dir", default=str(ROOT / "bench" / "data"))
    a = p.parse_args()
    sizes = sorted({int(float(x)) for x in a.sizes.split(",") if x.strip()})
    Path(a.dir).mkdir(parents=True, exist_ok=True)
    for records in sizes:
        uri, generated = ensure_topic(records, a)
        if generated:
            print(json.dumps(generated), flush=True)
        reset(uri)
        print(json.dumps(figures("full", compact(uri, a))), flush=True)
        reset(uri)
    if not a.no_incremental and sizes:
        incremental(str(Path(a.dir) / f"scale-{sizes[0]}"), sizes[0], a)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--driver"]:
        sys.exit(driver(sys.argv[2:]))
    main()
