"""The Spark engine's two speed figures, measured in one Spark application, alternating:
a full run against the local engine per core, and an incremental run (+1 %) against a
full one; and the bytes of pass one's shuffle per record, from Spark's own metrics.

    .venv/bin/python bench/spark_alternate.py                          # 10 M records, 3 rounds
    .venv/bin/python bench/spark_alternate.py --records 1e6 --rounds 1  # a quick check
    .venv/bin/python bench/spark_alternate.py --connect                 # as a Spark Connect client
    .venv/bin/python bench/spark_alternate.py --shale /tmp/before       # another Shale tree's engine

The topic is ``bench/spark_scale.py``'s (``bench/data/scale-<records>``: 16-byte keys drawn
from 2 M, 64-byte values, ledgers of 1 M records; generated once and reused).  One Spark
application (``--master``, default ``local-cluster[2,1,1024]``) is started, its executors
warmed up, and then, for each round, in an order that turns every round: a **full** Spark
run (a copy of the topic, compacted from scratch), an **incremental** Spark run (a copy of
the topic compacted once and given 1 % more records, same key space; the copy made once,
its files hard-linked for each run, since runs only add files) and a **local** run (the
local engine on a copy of the topic, its threads on the machine's cores).  Spark's
start-up is outside every run.  With ``--connect`` the application serves Spark Connect
too and the engine is its client.

Each run prints a JSON line: the run's time (the summary's ``total``: plan, both passes,
publish) and, for Spark runs, what Spark's event log says its jobs moved through the
shuffle (``shuffle_bytes``, bytes written by pass one's map tasks, and per record read
and per candidate).  The last line: medians, and the two ratios, ``full_vs_local_per_core``
(Spark's full run over the local engine's, both over the same two cores) and
``incremental_vs_full``.
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
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import spark_scale  # (the topic)

ROUND = ("full", "incremental", "local")


def _link_copy(src: str, dst: str) -> None:
    """``dst``, a copy of ``src`` whose files are hard links (runs only add files)."""
    shutil.rmtree(dst, ignore_errors=True)
    subprocess.run(["cp", "-al", src, dst], check=True)


def _session(a: argparse.Namespace, events: Path) -> tuple[Any, Any]:
    """The application (classic), and the session the engine uses (a Spark Connect client
    of it with ``--connect``)."""
    from shale.compactor.spark import SparkOptions
    from shale.compactor.spark.engine import open_session

    conf = [("spark.ui.enabled", "false"), ("spark.eventLog.enabled", "true"),
            ("spark.eventLog.dir", f"file:{events}"), ("spark.eventLog.compress", "false")]
    if a.connect:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        conf += [("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin"),
                 ("spark.connect.grpc.binding.address", "127.0.0.1"), ("spark.connect.grpc.binding.port", str(port))]
    import pyspark

    # where local-cluster's executors start from
    os.environ.setdefault("SPARK_HOME", str(Path(pyspark.__file__ or "").parent))
    classic, _ = open_session(SparkOptions(master=a.master, conf=tuple(conf)))
    if not a.connect:
        return classic, classic
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    return classic, ConnectSession.builder.remote(f"sc://127.0.0.1:{port}").create()


class _Counting:
    """The engine, remembering the candidates its last pass one sent through the shuffle."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.candidates = engine, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def pass_one(self, *args: Any, **kw: Any) -> Any:
        out = self.engine.pass_one(*args, **kw)
        self.candidates = int(getattr(out, "candidates", 0))
        return out


def _run(uri: str, engine: Any, session: Any, tag: str) -> dict[str, Any]:
    from shale.compactor import Compactor

    if session is not None:
        session.addTag(tag)
    try:
        s = Compactor(uri, engine=engine).run()
    finally:
        if session is not None:
            session.removeTag(tag)
    if s.status != "compacted":
        raise SystemExit(f"{uri}: {s.status} {s.error or s.message}")
    d = s.durations
    return {"tag": tag, "run_s": d["total"], "pass_one_s": d.get("pass_one"), "pass_two_s": d.get("pass_two"),
            "records": s.records_read, "written": s.records_written, "reused": s.records_reused,
            "candidates": getattr(engine, "candidates", None), "load_before": round(os.getloadavg()[0], 2)}


def _tag(props: dict[str, str], prefix: str) -> str | None:
    """The first of a job's tags that is ``prefix...`` (a classic session prefixes the tags
    a thread adds with the session's and the thread's ids)."""
    for t in props.get("spark.job.tags", "").split(","):
        m = re.search(rf"(?:^|[-_])({prefix}[a-z-]+(?:-\d+)?)$", t)
        if m:
            return m.group(1)
    return None


def _phase(props: dict[str, str]) -> str:
    """Which of the engine's jobs: its tag (``shale-pass-one``...) or, for an engine that
    named its jobs by description, that."""
    shale = _tag(props, "shale-")
    if shale:
        return shale.removeprefix("shale-").replace("-", "_")
    words = props.get("spark.job.description", "").split(":")[0].split()
    return "_".join(words[1:3]) if words[:1] == ["shale"] else "other"


def _shuffle_bytes(events: Path) -> dict[str, dict[str, int]]:
    """Per bench tag and phase: the shuffle bytes and rows Spark's tasks wrote (from the
    event log; a stage counts for the job that ran it, not for later jobs that skip it)."""
    stage_job: dict[int, tuple[str | None, str]] = {}
    written: dict[int, list[int]] = {}
    for f in events.rglob("*"):
        if not f.is_file():
            continue
        for line in f.read_text().splitlines():
            if '"SparkListenerJobStart"' in line:
                e = json.loads(line)
                props = e.get("Properties", {})
                bench = _tag(props, "bench-")
                for st in e["Stage IDs"]:
                    stage_job.setdefault(st, (bench, _phase(props)))
            elif '"SparkListenerTaskEnd"' in line:
                e = json.loads(line)
                m = (e.get("Task Metrics") or {}).get("Shuffle Write Metrics") or {}
                acc = written.setdefault(e["Stage ID"], [0, 0])
                acc[0] += int(m.get("Shuffle Bytes Written", 0))
                acc[1] += int(m.get("Shuffle Records Written", 0))
    out: dict[str, dict[str, int]] = {}
    for st, (nbytes, rows) in written.items():
        bench, phase = stage_job.get(st, (None, "other"))
        if bench is None or not nbytes:
            continue
        d = out.setdefault(bench, {})
        d[f"{phase}_bytes"] = d.get(f"{phase}_bytes", 0) + nbytes
        d[f"{phase}_rows"] = d.get(f"{phase}_rows", 0) + rows
    return out


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=lambda s: int(float(s)), default=10_000_000)
    p.add_argument("--keys", type=lambda s: int(float(s)), default=2_000_000)
    p.add_argument("--ledger-records", type=lambda s: int(float(s)), default=1_000_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--master", default="local-cluster[2,1,1024]")
    p.add_argument("--connect", action="store_true", help="the engine as a Spark Connect client of the application")
    p.add_argument("--shale", metavar="DIR", help="import Shale from this tree (e.g. a `git archive` of an older "
                   "commit, C kernels copied in); its executors too")
    p.add_argument("--dir", default=str(spark_scale.ROOT / "bench" / "data"))
    return p.parse_args()


def _rounds(a: argparse.Namespace, uri: str, work: Path, session: Any, engine: Any) -> list[dict[str, Any]]:
    """Every round's runs, after the incremental runs' starting point is made: the topic
    compacted once, then given 1 % more records."""
    base = str(work / "incremental-base")
    _link_copy(uri, base)
    _run(base, engine, None, "bench-setup")
    spark_scale.append(base, max(1, a.records // 100), a.keys, a.ledger_records, seed=a.records + 1)
    runs: list[dict[str, Any]] = []
    for r in range(a.rounds):
        order = ROUND[r % 3:] + ROUND[:r % 3]
        for kind in (order if r % 2 == 0 else order[::-1]):
            copy = str(work / f"{kind}-{r}")
            _link_copy(base if kind == "incremental" else uri, copy)
            spark = kind != "local"
            out = _run(copy, engine if spark else None, session if spark else None, f"bench-{kind}-{r}")
            out["run"] = kind
            runs.append(out)
            shutil.rmtree(copy, ignore_errors=True)
    return runs


def _report(a: argparse.Namespace, runs: list[dict[str, Any]], events: Path) -> None:
    """A JSON line per run, with its shuffle bytes, then the summary line."""
    shuffle = _shuffle_bytes(events)
    for out in runs:
        out.update(shuffle.get(out["tag"], {}))
        if out.get("pass_one_bytes"):
            out["pass_one_bytes_per_record"] = round(out["pass_one_bytes"] / out["records"], 2)
            if out.get("candidates"):
                out["pass_one_bytes_per_candidate"] = round(out["pass_one_bytes"] / out["candidates"], 2)
        print(json.dumps(out), flush=True)
    median = {k: statistics.median(o["run_s"] for o in runs if o["run"] == k) for k in ROUND}
    per_record = [o["pass_one_bytes_per_record"] for o in runs if o["run"] == "full" and
                  "pass_one_bytes_per_record" in o]
    print(json.dumps({"run": "summary", "records": a.records, "master": a.master, "connect": a.connect,
                      "shale": a.shale or str(spark_scale.ROOT), "median_s": median,
                      "full_vs_local_per_core": round(median["full"] / median["local"], 2),
                      "incremental_vs_full": round(median["incremental"] / median["full"], 3),
                      "full_shuffle_bytes_per_record": statistics.median(per_record) if per_record else None}),
          flush=True)


def main() -> None:
    a = _args()
    if a.shale:
        sys.path.insert(0, a.shale)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (a.shale, os.environ.get("PYTHONPATH"))))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from shale.compactor.spark import SparkOptions
    from shale.compactor.spark.engine import SparkEngine

    Path(a.dir).mkdir(parents=True, exist_ok=True)
    uri, generated = spark_scale.ensure_topic(a.records, a)
    if generated:
        print(json.dumps(generated), flush=True)
    spark_scale.reset(uri)
    work = Path(tempfile.mkdtemp(prefix="spark-alternate-", dir=a.dir))
    events = work / "events"
    events.mkdir()
    classic, session = _session(a, events)
    try:
        import inspect

        from shale.compactor.spark.engine import warm_executors

        # (an older engine warmed a SparkContext up)
        warm_executors(classic.sparkContext if "sc" in inspect.signature(warm_executors).parameters else session)
        runs = _rounds(a, uri, work, session, _Counting(SparkEngine(SparkOptions(master=a.master), session=session)))
    finally:
        classic.stop()
    _report(a, runs, events)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
