"""A real Spark standalone cluster, as users run one: a master and two workers, each a
process of its own started by ``infra/spark/standalone.sh`` from PySpark's launcher
classes, and the driver in yet another process, ``spark-submit infra/spark/compact_job.py``
exactly as docs/spark.md shows, compacting a topic on the moto S3 server.  The Spark
engine must publish what the local engine publishes for an identical topic, and the
tasks must have run in executors of the two workers.

The cluster starts without any AWS variable in its environment, so the executors reach
moto only through what the driver forwards with the tasks; the secret key must appear in
no log of the cluster.

About a minute on a 2-core machine (four JVMs and two Python workers start), so it runs
with ``SHALE_LONG_TESTS=1`` only.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shale.compactor import Compactor
from shale.producer import TopicWriter
from shale.reader.topic_reader import TopicReader
from tests.conftest import ROOT
from tests.needs import need_module

LONG = os.environ.get("SHALE_LONG_TESTS") == "1"
pytestmark = [pytest.mark.slow, pytest.mark.s3,
              pytest.mark.skipif(not LONG, reason="starts a Spark standalone cluster (about a minute): "
                                                  "SHALE_LONG_TESTS=1")]

SCRIPT = ROOT / "infra" / "spark" / "standalone.sh"
JOB = ROOT / "infra" / "spark" / "compact_job.py"
WORKERS = 2
RECORDS = 4_000
FIGURES = ("status", "horizon", "records_read", "records_written", "keys", "tombstones_kept",
           "tombstones_dropped", "keyless_kept", "keyless_dropped", "held_back_records")


@dataclass(frozen=True)
class Cluster:
    url: str
    folder: Path
    webui: str


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def script(*args: str, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=ROOT)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Master and workers started by the script with no AWS variable; always stopped."""
    need_module("pyspark")
    folder = tmp_path / "cluster"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and not k.startswith("PYSPARK_")}
    env["PYTHON"] = sys.executable
    try:
        t = time.perf_counter()
        p = script("start", "--workers", str(WORKERS), "--cores", "1", "--memory", "1g", "--dir", str(folder),
                   env=env)
        print(f"cluster started in {time.perf_counter() - t:.1f} s: {p.stderr.strip()}")
        assert p.returncode == 0, p.stderr
        url = p.stdout.strip()
        assert re.fullmatch(r"spark://127\.0\.0\.1:\d+", url), p.stdout
        status = script("status", "--dir", str(folder), env=env)
        assert status.returncode == 0, status.stdout + status.stderr
        assert status.stdout.count(": running, pid ") == 1 + WORKERS, status.stdout
        yield Cluster(url, folder, (folder / "webui-url").read_text().strip())
    finally:
        stop = script("stop", "--dir", str(folder), env=env, timeout=120)
        assert stop.returncode == 0, stop.stderr
        assert not list(folder.glob("*.pid"))
        assert script("status", "--dir", str(folder), env=env).returncode == 3


def produce(uri: str, seed: int) -> None:
    """Keys repeat (600 keys for 4,000 records), some tombstones and keyless records, four ledgers."""
    rnd = random.Random(seed)
    with TopicWriter(uri, max_ledger_records=1_000, batch_size=7) as w:
        for i in range(RECORDS):
            key = None if rnd.random() < 0.03 else f"key-{rnd.randrange(600)}"
            value = None if key is not None and rnd.random() < 0.08 else f"value-{i}-" + "x" * rnd.randrange(60)
            w.append(key, value, properties={"i": str(i)} if i % 5 == 0 else None)


def compacted(uri: str) -> list[tuple[str, Any, Any, Any]]:
    with TopicReader(uri, read_compacted=True) as r:
        return [(str(m.id), m.key, m.value, m.properties) for m in r.read()]


def master_state(webui: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{webui}/json/", timeout=10) as r:
        state: dict[str, Any] = json.load(r)
    return state


def test_spark_submit_to_a_standalone_cluster_compacts_as_the_local_engine(cluster: Cluster, s3_bucket: str) -> None:
    spark_uri, local_uri = f"s3://{s3_bucket}/topics/spark", f"s3://{s3_bucket}/topics/local"
    produce(spark_uri, seed=7)
    produce(local_uri, seed=7)
    state = master_state(cluster.webui)
    assert state["status"] == "ALIVE" and state["aliveworkers"] == WORKERS and state["cores"] == WORKERS

    # the driver, as docs/spark.md says; AWS_* point at moto (conftest's moto_endpoint)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    env.update(PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    assert env["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
    t = time.perf_counter()
    p = subprocess.run([str(spark_home() / "bin" / "spark-submit"), "--master", cluster.url,
                        "--conf", "spark.ui.enabled=false",
                        str(JOB), spark_uri, "--engine", "spark", "--json"],
                       capture_output=True, text=True, env=env, timeout=400, cwd=ROOT)
    print(f"spark-submit took {time.perf_counter() - t:.1f} s")
    tail = "\n".join(p.stderr.splitlines()[-40:])
    assert p.returncode == 0, f"spark-submit exited {p.returncode}:\n{p.stdout}\n{tail}"
    summary = next(json.loads(line) for line in p.stdout.splitlines() if line.startswith("{") and '"topic"' in line)
    print("durations:", summary["durations"])
    assert summary["status"] == "compacted", summary
    assert summary["engine"] == "spark" and summary["exit_code"] == 0
    assert summary["records_read"] == RECORDS and summary["ledgers_read"] == 4

    # the local engine on the identical topic publishes the same content
    local = Compactor(local_uri).run()
    assert local.status == "compacted" and local.engine == "local"
    assert {k: summary[k] for k in FIGURES} == {k: getattr(local, k) for k in FIGURES}
    view = compacted(spark_uri)
    assert view == compacted(local_uri)
    assert 0 < len(view) == summary["records_written"] < RECORDS
    assert len({key for _, key, _, _ in view}) == len(view)  # one record per key

    # the application ran on this cluster: the master knows it, with both workers' cores
    m = re.search(r"app-\d{14}-\d{4}", p.stderr)
    assert m, "no application id in spark-submit's log"
    app_id = m.group(0)
    apps = {a["id"]: a for a in master_state(cluster.webui)["completedapps"]}
    assert app_id in apps, sorted(apps)
    assert apps[app_id]["name"] == "shale-compact" and apps[app_id]["cores"] == WORKERS
    # ...and each worker process launched an executor for it, in its work folder
    tasks = 0
    for i in range(1, WORKERS + 1):
        executors = list((cluster.folder / f"worker-{i}" / app_id).glob("*/stderr"))
        assert len(executors) == 1, f"worker {i}: {executors}"
        log = executors[0].read_text()
        assert f"--app-id {app_id}" in log.replace('"', "")
        tasks += log.count("Starting Python task execution")
    assert tasks >= 2, "the executors ran no Python task"

    # the credentials reached the executors with the tasks, never through the cluster's logs
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    assert secret not in p.stdout + p.stderr
    for f in cluster.folder.rglob("*"):
        if f.is_file() and f.suffix != ".zip":
            assert secret not in f.read_text(errors="replace"), f
