"""The Spark engine on ``local-cluster[2,1,1024]``: two executor JVMs in processes of
their own (with their own Python workers), against the moto server (and, for the first
test, against SeaweedFS too: its requests signed and checked).  Nothing reaches the
executors but what the engine ships: the AWS variables are removed before Spark starts.
Results are checked against the local engine and the rules folded in plain Python
(:mod:`tests.compaction_model`).  Each executor forks its Python workers from Shale's
daemon, which imported the tasks' modules before any task ran.  One run has an executor
killed in the middle of its tasks: its writes are held in a proxy until both executors are running a task, so the
kill always lands on a running task."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shale.compactor import CompactionConfig, Compactor, collect_garbage
from shale.compactor.spark import SparkOptions
from shale.compactor.spark.engine import SparkEngine
from shale.metadata.topic import TopicMetadata
from tests.compaction_model import CompactionModel
from tests.compactor.spark.test_spark import HOUR, check_model, compacted, figures, produce
from tests.conftest import make_root, stop_local_spark, without_aws_environment
from tests.flaky_proxy import FlakyProxy
from tests.gates import GUARD_S

pytestmark = [pytest.mark.slow, pytest.mark.s3]

MASTER = "local-cluster[2,1,1024]"


@pytest.fixture(scope="module")
def cluster(moto_endpoint: str) -> Iterator[SparkEngine]:
    stop_local_spark()  # (a running application would be joined, whatever its master)
    eng = SparkEngine(SparkOptions(master=MASTER, split_bytes=1 << 16, split_records=2_000,
                                   conf=(("spark.ui.enabled", "false"),
                                         ("spark.executor.memory", "512m"))))
    with without_aws_environment():
        eng.ready()  # both executors up, their Python workers started
    yield eng
    eng.close()


def _ancestors(pid: int) -> Iterator[int]:
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        yield pid


def executor_pids() -> list[int]:
    """This test process's executor JVMs (other Spark applications on the machine aside)."""
    me, out = os.getpid(), []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if b"CoarseGrainedExecutorBackend" in cmd and me in _ancestors(int(d.name)):
            out.append(int(d.name))
    return sorted(out)


def test_executors_fork_workers_with_shale_already_imported(cluster: SparkEngine) -> None:
    import pyarrow as pa

    def probe(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """This worker's process and parent, and what the daemon it was forked from had
        imported (and where), looked at before the task imports anything (a function
        made here travels by value: unpickling it imports no test module)."""
        import os
        import sys

        import pyarrow as pa

        for _ in batches:
            pass
        daemon = sys.modules.get("shale.spark.daemon")
        yield pa.record_batch({"worker": [os.getpid()], "parent": [os.getppid()],
                               "preloaded_in": [getattr(daemon, "PRELOADED_IN", 0)],
                               "preloaded": [list(getattr(daemon, "PRELOADED", ()))],
                               "loaded": ["shale.compactor.spark.tasks" in sys.modules]})

    # Two barrier tasks run at once, so one on each executor (one core each).
    schema = "worker long, parent long, preloaded_in long, preloaded array<string>, loaded boolean"
    probes = cluster.session.range(0, 2, 1, 2).mapInArrow(probe, schema, barrier=True).collect()
    executors = executor_pids()
    assert len(probes) == 2 and len(executors) == 2
    daemons = set()
    for worker, parent, preloaded_in, preloaded, loaded in probes:
        # the modules were imported by the daemon the worker was forked from, not by the worker
        assert preloaded_in == parent != worker, probes
        assert {"numpy", "shale.compactor.spark.tasks", "shale.compactor.spark.newkeys", "boto3"} <= set(preloaded)
        assert loaded
        daemons.add(parent)
    # one daemon per executor process, each started by its executor's JVM
    assert {next(_ancestors(d)) for d in daemons} == set(executors)


@pytest.fixture(params=["s3", pytest.param("seaweedfs", marks=pytest.mark.seaweedfs)])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh folder on moto or on SeaweedFS (the environment pointed there for the
    test: what the driver resolves is what it ships to the executors)."""
    return make_root(str(request.param), request, tmp_path)


def test_executors_in_processes_of_their_own_publish_what_the_local_engine_does(
        cluster: SparkEngine, root: str) -> None:
    assert len(executor_pids()) == 2
    cfg = CompactionConfig(max_part_bytes=1 << 16, reuse_min_bytes=1 << 10, retain_null_key=True,
                           delete_retention_ms=int(HOUR * 1000))
    uris = {name: f"{root}/{name}" for name in ("local", "spark")}
    t = 1_700_000_000.0
    model = CompactionModel()
    for rnd, n in enumerate((5_000, 100, 1_500)):
        for uri in uris.values():
            produce(uri, seed=20 + rnd, n=n, t=t, keys=3_000)
        t += HOUR
        a = Compactor(uris["local"], cfg, clock=lambda t=t: t).run()
        b = Compactor(uris["spark"], cfg, clock=lambda t=t: t, engine=cluster).run()
        assert b.status == "compacted", b.error or b.message
        assert figures(a) == figures(b)
        assert (a.records_reused, a.records_written) == (b.records_reused, b.records_written)
        assert compacted(uris["local"]) == compacted(uris["spark"])
        check_model(model, uris["spark"], b, cfg, t)
        if rnd == 1:
            assert b.records_reused > 0  # parts kept in place, by executors' deletion vectors
    assert b.keyless_kept > 0 and b.tombstones_kept > 0


def test_a_partially_cleaned_topic_is_continued_as_the_local_engine_does(cluster: SparkEngine,
                                                                         s3_bucket: str) -> None:
    uris = {name: f"s3://{s3_bucket}/partial-{name}" for name in ("local", "spark")}
    t = 1_700_000_000.0 + HOUR
    partial = CompactionConfig(max_map_bytes=24 * 1_000)
    for uri in uris.values():
        produce(uri, seed=12, n=6_000, t=1_700_000_000.0, keys=3_000)
        first = Compactor(uri, partial, clock=lambda: t).run()
        assert first.deferred_records > 0  # a partial run: the rest is owed
    model = CompactionModel()
    check_model(model, uris["spark"], first, partial, t, horizon_given=True)
    a = Compactor(uris["local"], clock=lambda: t).run()
    b = Compactor(uris["spark"], clock=lambda: t, engine=cluster).run()
    assert b.status == "compacted", b.error or b.message
    assert figures(a) == figures(b) and b.deferred_records == 0
    assert compacted(uris["local"]) == compacted(uris["spark"])
    check_model(model, uris["spark"], b, CompactionConfig(), t)


def is_part_write(method: str, path: str) -> bool:
    """A request that writes (or starts writing) a compacted part."""
    return method in ("PUT", "POST") and "/compacted/" in path and "/part-" in path


def test_an_executor_killed_mid_task_is_retried_and_the_run_publishes_once(cluster: SparkEngine, s3_bucket: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    ref, uri = f"s3://{s3_bucket}/ref", f"s3://{s3_bucket}/t"
    for u in (ref, uri):
        produce(u, seed=30, n=12_000, t=1_700_000_000.0, keys=10_000, tomb=0.0)
    clock = lambda: 1_700_000_000.0 + HOUR  # noqa: E731
    Compactor(ref, clock=clock).run()
    meta = TopicMetadata.open(uri)
    before = meta.load_compaction()
    # The run reaches the store through a proxy that holds every write of a part.  Each
    # executor has one core, so once parts of two tasks are held, both executors are in
    # the middle of a task: the kill lands on one whatever the machine's speed.  The
    # held writes are then answered with a reset (the killed task's never reaches the
    # store); the surviving task retries its write, and the killed one is run again.
    killed: list[int] = []
    # (the application's own status: a test's look, through the classic session)
    tracker = cluster.session.sparkContext.statusTracker()
    jobs_before = set(tracker.getJobIdsForGroup())
    with FlakyProxy(os.environ["AWS_ENDPOINT_URL"], {}, hold=is_part_write) as proxy:

        def kill_one_executor() -> None:
            deadline = time.monotonic() + 240
            while len({p.split("?")[0] for p in proxy.held}) < 2:  # two tasks' parts
                if time.monotonic() > deadline:
                    proxy.release()
                    return
                time.sleep(0.02)  # how often to look, not how long anything takes
            pids = executor_pids()
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                killed.append(pids[0])
            proxy.release()

        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)  # what the engine forwards to the executors
        killer = threading.Thread(target=kill_one_executor)
        killer.start()
        try:
            s = Compactor(uri, clock=clock, engine=cluster).run()
        finally:
            proxy.release()
            killer.join()
        monkeypatch.undo()
    assert killed, "parts of two tasks were never held at once"
    assert s.status == "compacted", s.error or s.message
    # the kill landed while tasks ran: some failed (executor lost) or a stage was re-attempted
    stages = [tracker.getStageInfo(st) for j in set(tracker.getJobIdsForGroup()) - jobs_before
              for st in (tracker.getJobInfo(j).stageIds if tracker.getJobInfo(j) else [])]
    assert any(st and (st.numFailedTasks > 0 or st.currentAttemptId > 0) for st in stages), stages
    after = meta.load_compaction()
    assert after.epoch == before.epoch + 1  # published once
    assert compacted(uri) == compacted(ref)  # nothing lost, nothing twice
    # what the killed attempt left (an unfinished upload, a part written twice) is
    # garbage collection's, once past the orphan grace: then only what is published stays
    collect_garbage(meta, now_ms=int((time.time() + 2 * HOUR) * 1000), grace_ms=0,
                    orphan_grace_ms=CompactionConfig().orphan_grace_ms)
    published = {p.object for p in after.parts} | {p.deletions for p in after.parts if p.deletions}
    left = {meta.topic.relative(o.key) for o in meta.topic.store.list(meta.topic.key("compacted") + "/")}
    assert left == published
    assert not list(meta.topic.store.unfinished_writes(meta.topic.key("compacted") + "/"))
    # Spark replaced the executor: the cluster still has two (the guard is reached only when
    # it never does; a loaded machine may take a while to start a JVM)
    deadline = time.monotonic() + GUARD_S
    while len(executor_pids()) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)  # how often to look, not how long anything takes
    assert len(executor_pids()) == 2 and killed[0] not in executor_pids()
