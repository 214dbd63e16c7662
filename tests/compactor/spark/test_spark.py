"""The Spark engine, on real PySpark in local mode, against a local folder and the moto
server: the same compacted content as the local engine and as the rules folded in plain
Python (:mod:`tests.compaction_model`), errors, cleanup, credentials.  Every test given
the ``engine`` runs twice: in a classic session and as a Spark Connect client of the same
application, which has no RDD API and no ``sparkContext`` (reaching for either fails)."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
import tokenize
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import pytest

from shale.compactor import CompactionConfig, Compactor, RunSummary, collect_garbage
from shale.compactor.plan import make_plan
from shale.compactor.spark import SparkOptions
from shale.compactor.spark.engine import SparkEngine
from shale.compactor.spark.session import package_zip as _package_zip
from shale.compactor.spark.tasks import SplitSpec, cut_slice, group_splits
from shale.ledger.codecs import Codec, parse_compression
from shale.ledger.errors import CorruptLedgerError, InvalidInputError, ShaleError
from shale.ledger.ids import MessageId
from shale.ledger.reader import LedgerFile
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader.topic_reader import TopicReader
from tests.compaction_model import CompactionModel, every_record
from tests.conftest import (
    AWS_VARS,
    LOCAL_SPARK_ENVIRONMENT,
    ROOT,
    SPARK_APIS,
    local_spark,
    make_root,
    need_spark_connect,
    run_cli,
    spark_session,
)
from tests.gates import Gate, start_held_compact

T = TypeVar("T")

pytestmark = pytest.mark.slow
HOUR = 3600.0


@pytest.fixture(scope="module", params=SPARK_APIS)
def engine(request: pytest.FixtureRequest) -> Iterator[SparkEngine]:
    """An engine in the tests' shared local Spark application, started with no AWS
    variables in its environment: executors reach moto only through what the engine
    forwards.  Through a classic session, then as a Spark Connect client."""
    eng = SparkEngine(SparkOptions(master="local[2]", split_bytes=1 << 16, split_records=300, reduce_partitions=3,
                                   conf=(("spark.ui.enabled", "false"),)), session=spark_session(request.param))
    yield eng
    eng.close()  # (leaves the shared application running)


def on_workers(session: Any, fn: Callable[[], list[str]], tasks: int = 2) -> list[list[str]]:
    """What ``fn`` returns in each of ``tasks`` tasks of the session's Python workers
    (through ``mapInArrow``, which classic sessions and Spark Connect clients both have)."""
    import pyarrow as pa

    def task(batches: Iterator[Any]) -> Iterator[Any]:
        for _ in batches:
            pass
        yield pa.record_batch({"out": pa.array([fn()], pa.list_(pa.string()))})

    return [list(r.out) for r in session.range(0, tasks, 1, tasks).mapInArrow(task, "out array<string>").collect()]


def test_starting_the_session_leaves_this_process_environment_alone(engine: SparkEngine) -> None:
    """What the Python workers need goes through Spark's own settings: they run this
    interpreter and ignore PySpark's warning about the pandas installed, and nothing was
    written into this process's environment."""
    before, after = LOCAL_SPARK_ENVIRONMENT["before"], LOCAL_SPARK_ENVIRONMENT["after"]
    changed = {k: (before.get(k), after.get(k)) for k in set(before) | set(after) if before.get(k) != after.get(k)}
    # (PySpark's SparkContext writes these two itself as it starts)
    assert {k: v for k, v in changed.items() if k not in ("SPARK_AUTH_SOCKET_TIMEOUT", "SPARK_BUFFER_SIZE")} == {}

    def worker() -> list[str]:
        import os
        import sys

        return [sys.executable, os.environ.get("PYTHONWARNINGS", "")]

    seen = on_workers(engine.session, worker)
    python = os.environ.get("PYSPARK_PYTHON", sys.executable)
    assert seen == [[python, seen[0][1]]] * 2
    assert "ignore:PySpark does not yet fully support pandas:FutureWarning" in seen[0][1].split(",")


def test_no_rdd_and_no_spark_context_through_spark_connect(engine: SparkEngine, tmp_path: Path) -> None:
    """The guard the Spark Connect runs stand on: a client of the application has no RDD
    API and no ``sparkContext``, so any code of the engine's reaching for them fails there;
    and the engine's and the data source's modules name none of them (nor broadcasts, nor
    ``addPyFile``), whichever session runs them."""
    from pyspark.errors import PySparkAttributeError, PySparkNotImplementedError

    if engine.session is spark_session("connect"):
        with pytest.raises(PySparkAttributeError):
            engine.session.sparkContext  # noqa: B018
        with pytest.raises(PySparkNotImplementedError):
            engine.session.range(1).rdd  # noqa: B018
    uri = str(tmp_path / "t")
    produce(uri, seed=2, n=600, t=1_700_000_000.0)
    assert Compactor(uri, clock=lambda: 1_700_000_000.0 + HOUR, engine=engine).run().status == "compacted"
    forbidden = {"sparkContext", "rdd", "RDD", "SparkContext", "broadcast", "Broadcast", "addPyFile", "parallelize",
                 "_jsc", "_jvm", "_sc"}
    for folder in (ROOT / "compactor" / "spark", ROOT / "shale" / "spark"):
        for py in folder.glob("*.py"):
            with py.open("rb") as f:  # names in the code, not in its strings and comments
                names = {t.string for t in tokenize.tokenize(f.readline) if t.type == tokenize.NAME}
            assert not names & forbidden, (py, names & forbidden)


@pytest.fixture(params=["local"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the scenarios run: a local folder (tests/compactor/spark/test_spark_cluster.py runs them on
    S3, with executors in processes of their own)."""
    if request.param == "s3":
        request.applymarker(pytest.mark.s3)
    return make_root(str(request.param), request, tmp_path)


def produce(uri: str, seed: int, n: int, t: float, *, keys: int = 400, tomb: float = 0.1, keyless: float = 0.05,
            batch: int = 7, step: float = 0.0, compression: str = "zstd") -> None:
    """``n`` records from a seeded generator; record ``i`` is published at ``t + i * step``."""
    rnd = random.Random(seed)
    now = [t]
    with TopicWriter(uri, max_ledger_records=1_000, batch_size=batch, clock=lambda: now[0],
                     compression=compression) as w:
        for i in range(n):
            now[0] = t + i * step
            key = None if rnd.random() < keyless else f"key-{rnd.randrange(keys)}"
            value = None if key is not None and rnd.random() < tomb else f"value-{seed}-{i}-" + "x" * rnd.randrange(40)
            w.append(key, value, properties={"i": str(i)} if i % 5 == 0 else None)


def compacted(uri: str) -> list[tuple[str, Any, Any, Any]]:
    with TopicReader(uri, read_compacted=True) as r:
        return [(str(m.id), m.key, m.value, m.properties) for m in r.read()]


def check_model(model: CompactionModel, uri: str, s: RunSummary, cfg: CompactionConfig, t: float, *,
                horizon_given: bool = False) -> None:
    """Run ``model`` as ``s`` ran (at ``t``, with ``cfg``): the same horizon (or, with
    ``horizon_given``, the one ``s`` reached: a run cut short by its key map) and the
    same compacted view."""
    records = every_record(uri)
    given = MessageId.parse(s.horizon) if horizon_given and s.horizon else None
    horizon = model.run(records, now_ms=int(t * 1000), lag_ms=cfg.min_compaction_lag_ms,
                        retention_ms=cfg.delete_retention_ms, retain_null_key=cfg.retain_null_key, horizon=given)
    assert s.horizon == (str(horizon) if horizon is not None else None), (s.horizon, horizon)
    got, want = compacted(uri), model.rows(records)
    diff = next(((i, g, w) for i, (g, w) in enumerate(itertools.zip_longest(got, want)) if g != w), None)
    assert diff is None, (f"record {diff[0]} of the compacted view is {diff[1]}, the model's {diff[2]} "
                          f"({len(got)} records, the model's {len(want)})")


FIGURES = ("status", "horizon", "records_read", "records_written", "keys", "tombstones_kept",
           "tombstones_dropped", "tombstones_held", "keyless_kept", "keyless_dropped", "held_back_records")


def figures(s: RunSummary) -> dict[str, Any]:
    return {k: getattr(s, k) for k in FIGURES}


SCENARIOS = {
    "kafka-tombstones": dict(delete_retention_ms=int(2 * HOUR * 1000)),
    "pulsar-no-retention": dict(delete_retention_ms=0),
    "retain-null-key": dict(retain_null_key=True, delete_retention_ms=int(HOUR * 1000)),
    # records are published half a second apart, so the lag cuts inside a ledger
    "min-lag": dict(min_compaction_lag_ms=50 * 60 * 1000),
    # each round produced with another codec; the runs write lz4
    "mixed-codecs": dict(delete_retention_ms=0, compression=parse_compression("lz4")),
}
#: The codec each round produces with (mixed-codecs only; zstd otherwise, the default).
ROUND_CODECS = ("none", "lz4", "zstd:3")


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_spark_and_local_engines_publish_the_same_content(engine: SparkEngine, root: str, scenario: str) -> None:
    cfg = CompactionConfig(max_part_bytes=1 << 16, **SCENARIOS[scenario])  # type: ignore[arg-type]
    local_uri, spark_uri = f"{root}/local", f"{root}/spark"
    t = 1_700_000_000.0
    totals = {"tombstones_dropped": 0, "tombstones_kept": 0, "keyless_kept": 0, "held_back_records": 0}
    model = CompactionModel()
    for rnd in range(3):
        # every round: new records (some keys again), an hour later, then both engines
        for uri in (local_uri, spark_uri):
            produce(uri, seed=rnd, n=(2_500, 3_200, 300)[rnd], t=t, keys=2_000,
                    step=0.5 if scenario == "min-lag" else 0.0,
                    compression=ROUND_CODECS[rnd] if scenario == "mixed-codecs" else "zstd")
        t += HOUR
        a = Compactor(local_uri, cfg, clock=lambda t=t: t).run()
        b = Compactor(spark_uri, cfg, clock=lambda t=t: t, engine=engine).run()
        assert b.engine == "spark" and a.engine == "local"
        assert b.status in ("compacted", "nothing-to-do"), b.error or b.message
        assert figures(a) == figures(b)  # the status included
        assert compacted(local_uri) == compacted(spark_uri)
        # and both equal the rules folded in plain Python, so a mistake they share shows
        check_model(model, spark_uri, b, cfg, t)
        if b.status == "compacted" and not b.held_back_records:  # else the reader adds the newer originals
            assert b.records_written == len(compacted(spark_uri))
        for k in totals:
            totals[k] += getattr(b, k)
    state = TopicMetadata.open(spark_uri).load_compaction()
    # several splits per ledger were written as several parts, in id order
    assert len(state.parts) > 3
    assert all("/part-" in p.object for p in state.parts)
    ids = [p.first_id for p in state.parts]
    assert ids == sorted(ids)
    # each scenario exercised what it is named after
    if scenario == "kafka-tombstones":
        assert totals["tombstones_dropped"] > 0 and totals["tombstones_kept"] > 0
    if scenario == "pulsar-no-retention":
        assert totals["tombstones_dropped"] > 0 and totals["tombstones_kept"] == 0
    if scenario == "retain-null-key":
        assert totals["keyless_kept"] > 0
    if scenario == "min-lag":
        assert totals["held_back_records"] > 0
    # the parts hold compressed entries (the entries of 7 records are small: packed anew by the run)
    loc = TopicMetadata.open(spark_uri).topic
    codecs = {int(c) for p in state.parts
              for c in LedgerFile.open(loc.store, loc.key(p.object)).footer.codecs().tolist()}
    assert codecs == ({Codec.LZ4} if scenario == "mixed-codecs" else {Codec.ZSTD})


def test_spark_parts_keep_each_records_event_time_as_local_ones_do(engine: SparkEngine, tmp_path: Path) -> None:
    """When the run keeps event times, the footers of the parts Spark tasks write give
    each record's, as the local engine's do, from version 3 ledgers and from a version 2
    one (whose records are decoded)."""
    from tests import objects, tamper
    from tests.compactor.test_event_times import check_event_times
    from tests.compactor.test_event_times import produce as produce_with_events

    cfg = CompactionConfig(delete_retention_ms=0, max_part_bytes=1 << 16, event_times=True)
    local_uri, spark_uri = str(tmp_path / "local"), str(tmp_path / "spark")
    for uri in (local_uri, spark_uri):
        produce_with_events(uri, 5, 700)
        first = TopicMetadata.open(uri).load_topic().ledgers[0].object
        tamper.write_raw(uri, first, objects.to_version_2(tamper.read_raw(uri, first)))
    Compactor(local_uri, cfg).run()
    assert Compactor(spark_uri, cfg, engine=engine).run().engine == "spark"
    assert check_event_times(spark_uri) >= 1
    assert compacted(local_uri) == compacted(spark_uri)
    def events_of(uri: str) -> list[int]:
        meta = TopicMetadata.open(uri)
        out: list[int] = []
        for p in meta.load_compaction().parts:
            got = LedgerFile.open(meta.topic.store, meta.topic.key(p.object)).event_times()
            assert got is not None
            out += got.tolist()
        return out

    assert events_of(local_uri) == events_of(spark_uri) != []


def test_spark_parts_get_arrow_caches_as_local_ones_do(engine: SparkEngine, tmp_path: Path) -> None:
    """With the policy's ``arrow-cache``, every part Spark's tasks write gets its cache
    (written by the driver before the publish), and the view read from the caches is the
    local engine's."""
    from shale.ledger.arrow_cache import cache_counts
    from tests.reader.test_arrow import _produce

    cfg = CompactionConfig(delete_retention_ms=3_600_000, max_part_bytes=1 << 16, arrow_cache=True)
    local_uri, spark_uri = str(tmp_path / "local"), str(tmp_path / "spark")
    for uri in (local_uri, spark_uri):
        _produce(uri, 7, 600, "zstd")
    Compactor(local_uri, cfg).run()
    assert Compactor(spark_uri, cfg, engine=engine).run().engine == "spark"
    parts = TopicMetadata.open(spark_uri).load_compaction().parts
    assert parts and all(p.arrow_cache and (tmp_path / "spark" / p.arrow_cache).is_file() for p in parts)
    read, refused = cache_counts()
    view = TopicReader(spark_uri, read_compacted=True).to_arrow()
    assert cache_counts() == (read + len(parts), refused)
    assert view.equals(TopicReader(local_uri, read_compacted=True).to_arrow())


def test_spark_reads_and_writes_entries_compressed_with_the_topics_dictionary(engine: SparkEngine,
                                                                            tmp_path: Path) -> None:
    """Executors get the topic's dictionaries with the tasks: both engines publish the
    same view of a topic written with zstd-dict, and the Spark run packs with it too."""
    from shale.maintenance.dictionary import train_dictionary
    from shale.metadata.dictionaries import register_dictionary

    local_uri, spark_uri = str(tmp_path / "local"), str(tmp_path / "spark")
    t = 1_700_000_000.0
    for uri in (local_uri, spark_uri):
        produce(uri, seed=1, n=3_000, t=t, keys=500, batch=2)
        meta = TopicMetadata.open(uri)
        register_dictionary(meta, train_dictionary(meta, size=4096, rng=random.Random(3)).dictionary)
        produce(uri, seed=2, n=2_000, t=t, keys=500, batch=2, compression="zstd-dict")
    cfg = CompactionConfig(delete_retention_ms=0, compression=parse_compression("zstd-dict:3"))
    a = Compactor(local_uri, cfg, clock=lambda: t + HOUR).run()
    b = Compactor(spark_uri, cfg, clock=lambda: t + HOUR, engine=engine).run()
    assert figures(a) == figures(b) and b.status == "compacted", b.error
    assert compacted(local_uri) == compacted(spark_uri)
    loc = TopicMetadata.open(spark_uri).topic
    codecs = {int(c) for p in TopicMetadata.open(spark_uri).load_compaction().parts
              for c in LedgerFile.open(loc.store, loc.key(p.object)).footer.codecs().tolist()}
    assert codecs == {Codec.ZSTD_DICT}


def test_engines_take_over_from_each_other(engine: SparkEngine, tmp_path: Path) -> None:
    """Local, then Spark, then local again on one topic equals local all along."""
    one, mixed = str(tmp_path / "one"), str(tmp_path / "mixed")
    # the local engine keeps parts in place with deletion vectors; Spark reads those
    cfg = CompactionConfig(delete_retention_ms=int(HOUR * 1000), reuse_min_bytes=0, reuse_min_live=0.3)
    t = 1_700_000_000.0
    model = CompactionModel()
    for rnd, eng in enumerate([None, engine, None, engine]):
        for uri in (one, mixed):
            produce(uri, seed=10 + rnd, n=1_500, t=t, keys=5_000)
        t += HOUR
        r = Compactor(one, cfg, clock=lambda t=t: t).run()
        s = Compactor(mixed, cfg, clock=lambda t=t: t, engine=eng).run()
        assert s.status == "compacted"
        assert compacted(one) == compacted(mixed)
        check_model(model, mixed, s, cfg, t)
        same = ("records_read", "keys", "tombstones_kept", "tombstones_dropped", "keyless_dropped")
        assert [getattr(s, k) for k in same] == [getattr(r, k) for k in same]
        assert s.records_written + s.records_reused == r.records_written + r.records_reused
        if eng is None and rnd:
            assert s.records_reused > 0  # Spark's parts were kept, with deletion vectors
            assert any(p.deletions for p in TopicMetadata.open(mixed).load_compaction().parts)


@pytest.mark.parametrize(("split_bytes", "split_records"), [(1 << 16, 300), (1 << 16, 10**9), (1 << 30, 10**9)])
def test_splits_tile_the_plan_at_entry_boundaries(tmp_path: Path, split_bytes: int, split_records: int) -> None:
    uri = str(tmp_path / "t")
    produce(uri, seed=3, n=5_000, t=1_700_000_000.0, batch=13)
    plan = make_plan(TopicMetadata.open(uri), now_ms=1_800_000_000_000, min_compaction_lag_ms=0)
    splits = [SplitSpec(s.file.key, s.file.ledger_id, 0, a, b, 0, n)
              for s in plan.slices for a, b, n in cut_slice(s.file, s.start, s.stop, split_bytes, split_records)]
    assert sum(s.records for s in splits) == sum(s.records for s in plan.slices) == 5_000
    for i, sp in enumerate(splits):
        foot = next(s.file for s in plan.slices if s.file.key == sp.key).footer
        starts = [int(x) for x in foot.e_rec_start]
        assert sp.start in starts and sp.stop in starts  # whole entries only
        e0, e1 = starts.index(sp.start), starts.index(sp.stop)
        ends = [int(o) + int(n) for o, n in zip(foot.col("e_offset"), foot.col("e_length"), strict=True)]
        assert sp.bytes == ends[e1 - 1] - int(foot.col("e_offset")[e0])
        within = sp.bytes <= split_bytes and sp.records <= split_records
        assert within or e1 - e0 == 1  # over a limit only when one entry alone is
        nxt = splits[i + 1] if i + 1 < len(splits) else None
        if nxt is not None and nxt.key == sp.key:
            assert nxt.start == sp.stop  # they tile the ledger
            # maximal: one more entry would break a limit
            grown_bytes = ends[e1] - int(foot.col("e_offset")[e0])
            assert grown_bytes > split_bytes or starts[e1 + 1] - sp.start > split_records
    if split_bytes >= 1 << 30:
        assert len(splits) == len(plan.slices)  # one split per ledger when nothing limits
    if split_records < 1_000:
        assert len(splits) > len(plan.slices)  # ledgers of 1,000 records are cut
    groups = group_splits(splits, split_bytes, split_records)
    assert [j for g in groups for j in range(*g)] == list(range(len(splits)))
    for j0, j1 in groups:
        size = sum(s.bytes for s in splits[j0:j1])
        assert j1 - j0 == 1 or (size <= split_bytes and sum(s.records for s in splits[j0:j1]) <= split_records)
    if split_bytes >= 1 << 30:
        assert len(groups) == 1  # small ledgers share a task


def test_corrupt_entry_found_by_spark_publishes_nothing_and_leaves_nothing(engine: SparkEngine,
                                                                           tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    produce(uri, seed=4, n=3_000, t=1_700_000_000.0, keys=5_000, tomb=0.0, keyless=0.0)
    meta = TopicMetadata.open(uri)
    lg = meta.load_topic().ledgers[1]
    path = Path(uri) / lg.object
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF  # inside an entry frame: pass one (footers only) cannot see it
    path.write_bytes(bytes(data))
    before = meta.load_compaction()
    with pytest.raises(CorruptLedgerError, match=lg.object.split("/")[-1]):
        Compactor(uri, clock=lambda: 1_700_000_000.0 + HOUR, engine=engine).run()
    assert meta.load_compaction() == before
    # other splits may have written parts before the error reached the driver; all are gone
    assert not [p for p in (Path(uri) / "compacted").rglob("*") if p.is_file()]


def test_spark_engine_refuses_a_memory_topic(engine: SparkEngine) -> None:
    uri = "memory://spark-test/topics/t"
    produce(uri, seed=5, n=10, t=1_700_000_000.0)
    with pytest.raises(InvalidInputError, match="memory://"):
        Compactor(uri, clock=lambda: 1_700_000_000.0 + HOUR, engine=engine).run()


@pytest.mark.s3
def test_executors_reach_s3_through_the_shipped_store_and_keep_their_environment(
        engine: SparkEngine, s3_bucket: str) -> None:
    """The Spark workers were started without AWS variables: the tasks reach moto through
    the topic's store, pickled with the driver's storage options, and nothing is written
    to their environment.  Without forwarded credentials they have none of their own."""
    uri = f"s3://{s3_bucket}/topics/t"
    produce(uri, seed=31, n=600, t=1_700_000_000.0)
    summary = Compactor(uri, clock=lambda: 1_700_000_000.0 + HOUR, engine=engine).run()
    assert summary.status == "compacted" and len(compacted(uri)) == summary.records_written > 0, summary.error

    def environment() -> list[str]:
        import os

        return sorted(k for k in os.environ if k in AWS_VARS)

    assert on_workers(engine.session, environment) == [[], []]
    loc = TopicMetadata.open(uri).topic

    def read() -> list[str]:
        return [loc.store.get(loc.key("_meta", "topic.json"))[:1].decode()]

    assert on_workers(engine.session, read) == [["{"], ["{"]]

    produce(uri, seed=32, n=50, t=1_700_000_000.0 + 60)
    on_their_own = SparkEngine(replace(engine.options, forward_credentials=False), session=engine.session)
    with pytest.raises(ShaleError, match="no AWS credentials"):
        Compactor(uri, clock=lambda: 1_700_000_000.0 + 2 * HOUR, engine=on_their_own).run()
    assert TopicMetadata.open(uri).load_compaction().epoch == 1


def test_shipped_code_zip_holds_every_module(tmp_path: Path) -> None:
    path = _package_zip()
    try:
        names = set(zipfile.ZipFile(path).namelist())
        for pkg in ("ledger", "metadata", "compactor", "reader"):
            for py in (ROOT / pkg).rglob("*.py"):
                assert f"shale/{py.relative_to(ROOT)}" in names
        assert "shale/__init__.py" in names and "shale/compactor/spark/log4j2.properties" in names
        # importable from the zip alone, ahead of the source tree
        out = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                              "import shale.compactor.spark.tasks as t; print(t.__file__)", path],
                             capture_output=True, text=True, cwd=tmp_path, check=True)
        assert out.stdout.strip().startswith(path)
        # the zip holds no compiled code: the C kernels come from the installed copy
        out = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                              "import shale, shale.ledger.kernels as k, shale.ledger.encoder as e; "
                              "print(shale.__file__, k.KERNELS, e._native is not None)", path],
                             capture_output=True, text=True, cwd=tmp_path, check=True)
        where, kernels, encoder = out.stdout.split()
        assert where.startswith(path)
        from shale.ledger.kernels import KERNELS
        assert (kernels, encoder) == (KERNELS, str(KERNELS == "native"))
    finally:
        os.unlink(path)


@pytest.mark.s3
@pytest.mark.parametrize("spark", [("--spark-master", "local[2]"), ("--spark-remote", "local[2]")],
                         ids=["classic", "connect"])
def test_cli_compacts_several_topics_in_one_application_without_leaking_credentials(
        tmp_path: Path, s3_bucket: str, spark: tuple[str, str]) -> None:
    """Two topics in one application (classic, or a Spark Connect server started by the
    command, whose clients send their plans, closures and all, over gRPC): both compacted
    as the local engine does, the secret key nowhere in the output, the logs or Spark's
    event log, and the executors' Python workers started before the first run's first job."""
    if spark[0] == "--spark-remote":
        need_spark_connect()
    secret = "Sup3rSecretValue-" + os.urandom(6).hex()
    local_uri = str(tmp_path / "local-topic")
    s3_uri = f"s3://{s3_bucket}/topics/t"
    refs = [str(tmp_path / "ref-local"), str(tmp_path / "ref-s3")]
    for uri in (local_uri, s3_uri, *refs):
        produce(uri, seed=6, n=3_000, t=time.time() - HOUR)
    for ref in refs:
        Compactor(ref, CompactionConfig(delete_retention_ms=0)).run()
    events = tmp_path / "events"
    events.mkdir()
    res = run_cli(local_uri, s3_uri, "--engine", "spark", *spark, "--json",
                  "--delete-retention", "0", "--spark-split-size", "64KiB",
                  "--spark-conf", "spark.eventLog.enabled=true", "--spark-conf", f"spark.eventLog.dir=file:{events}",
                  "--spark-conf", "spark.eventLog.compress=false",
                  "--spark-conf", "spark.ui.enabled=false",
                  script="compact", env={"AWS_SECRET_ACCESS_KEY": secret})
    assert res.returncode == 0, res.stderr
    *lines, run = [json.loads(x) for x in res.stdout.splitlines()]
    assert [x["topic"] for x in lines] == [local_uri, s3_uri]
    assert (run["topics"], run["compacted"], run["failed"], run["exit_code"]) == (2, 2, 0, 0), run
    assert all(x["status"] == "compacted" and x["engine"] == "spark" for x in lines)
    assert compacted(local_uri) == compacted(refs[0])
    assert compacted(s3_uri) == compacted(refs[1])
    logged = res.stdout + res.stderr + "".join(p.read_text(errors="replace") for p in events.rglob("*")
                                              if p.is_file())
    assert "SparkListenerApplicationStart" in logged  # the event log was written and read
    assert secret not in logged
    # The application's first job started the executors' Python workers, and ended before
    # the first topic's first job began: no task of a run pays their start-up.
    jobs = [json.loads(x) for p in events.rglob("*") if p.is_file()
            for x in p.read_text().splitlines() if '"SparkListenerJob' in x]
    starts = sorted((j["Submission Time"], j["Job ID"], j["Properties"].get("spark.job.tags", ""))
                    for j in jobs if j["Event"] == "SparkListenerJobStart")
    ends = {j["Job ID"]: j for j in jobs if j["Event"] == "SparkListenerJobEnd"}
    assert "shale-warm-up" in starts[0][2] and "shale-pass-one" in starts[1][2], starts
    assert ends[starts[0][1]]["Job Result"]["Result"] == "JobSucceeded"
    assert ends[starts[0][1]]["Completion Time"] <= starts[1][0]


def test_cli_spark_json_logs_are_json_down_to_the_jvms_own_lines(tmp_path: Path) -> None:
    """With --log-format json every line on standard error is a JSON object: Shale's events
    pass as they are, and the JVM's own warnings (written past Python, straight to the file
    descriptor) are wrapped; Spark's start-up is an event of its own, with its duration."""
    uri = str(tmp_path / "t")
    produce(uri, seed=9, n=2_000, t=time.time() - HOUR)
    # (one run, which prints its summary as JSON too: a Spark application per run is what this costs)
    res = run_cli(uri, "--engine", "spark", "--spark-master", "local[1]", "--spark-conf", "spark.ui.enabled=false",
                  "--log-format", "json", "--json", script="compact")
    assert res.returncode == 0, res.stderr
    docs = [json.loads(line) for line in res.stderr.splitlines()]  # every line parses
    assert all(isinstance(d, dict) for d in docs)
    events = [d["event"] for d in docs]
    assert events.index("run.start") < events.index("spark.start") < events.index("topic.start")
    start = next(d for d in docs if d["event"] == "spark.start")
    assert start["seconds"] > 0
    # and a phase of the run's summary
    durations = json.loads(res.stdout)["durations"]
    assert durations["spark_start"] > 0, res.stdout
    # the run's total counts Spark's start with the topic's own run
    assert durations["total"] >= durations["spark_start"], durations
    # lines of the JVM's own, if it wrote any, are kept as messages
    assert all(d["message"] for d in docs if d["event"] == "spark.output")


def test_cli_spark_corrupt_input_is_one_line_exit_4(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    produce(uri, seed=7, n=3_000, t=time.time() - HOUR, keys=5_000, tomb=0.0, keyless=0.0)
    lg = TopicMetadata.open(uri).load_topic().ledgers[1]
    path = Path(uri) / lg.object
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF  # in an entry: found by a pass-two task, not by the driver
    path.write_bytes(bytes(data))
    res = run_cli(uri, "--engine", "spark", "--spark-master", "local[1]", "--spark-conf", "spark.ui.enabled=false",
                  script="compact")
    assert res.returncode == 4
    errors = [x for x in res.stderr.splitlines() if not x.startswith("WARNING: Using incubator modules")]
    assert len(errors) == 1 and lg.object.split("/")[-1] in errors[0], res.stderr


def test_cli_without_pyspark_says_how_to_install_it(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['pyspark'] = None\n"
            "from shale.compactor.cli import main\n"
            "sys.exit(main(sys.argv[1:]))")
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path / "t"), "--engine", "spark"],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "pip install 'shale[spark]'" in res.stderr


def test_killed_spark_run_publishes_nothing_and_gc_removes_its_leftovers(tmp_path: Path) -> None:
    """A Spark run killed once its first part is written: still writing, or held just
    before it publishes (:mod:`tests.gates`; the gate is never opened), so the kill
    always lands before the publish, however fast the run or loaded the machine."""
    uri = str(tmp_path / "t")
    produce(uri, seed=8, n=40_000, t=time.time() - HOUR, keys=30_000)
    meta = TopicMetadata.open(uri)
    before = meta.load_compaction()
    gate = Gate(tmp_path / "gate")
    proc = start_held_compact(gate, uri, "--engine", "spark", "--spark-master", "local[1]",
                              "--spark-split-size", "64KiB", "--spark-conf", "spark.ui.enabled=false",
                              output=subprocess.DEVNULL, new_session=True)
    compacted_dir = Path(uri) / "compacted"
    deadline = time.monotonic() + 240
    try:
        while not (compacted_dir.exists() and any(compacted_dir.rglob("part-*.ledger"))):
            assert proc.poll() is None, "the run ended before it wrote a part"
            assert time.monotonic() < deadline, "no part after 240 s"
            time.sleep(0.005)  # how often to look, not how long anything takes
        assert proc.poll() is None  # (it cannot publish: the gate stays closed)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver, its JVM and the Python workers
        proc.wait()
    print(f"\nkilled {'at the gate, before its publish' if gate.reached(proc) else 'while its tasks wrote'}")
    leftovers = [p for p in compacted_dir.rglob("*") if p.is_file()]
    assert leftovers
    assert meta.load_compaction() == before  # nothing published
    assert len(compacted(uri)) == 40_000  # readers still see every original record
    # too young to be an orphan now; past the orphan grace, gc removes every leftover
    assert not collect_garbage(meta, now_ms=int(time.time() * 1000), grace_ms=0,
                               orphan_grace_ms=CompactionConfig().orphan_grace_ms).orphans_deleted
    report = collect_garbage(meta, now_ms=int((time.time() + 2 * HOUR) * 1000), grace_ms=0,
                             orphan_grace_ms=CompactionConfig().orphan_grace_ms)
    assert report.orphans_deleted
    assert not [p for p in compacted_dir.rglob("*") if p.is_file()]
    summary = Compactor(uri).run()
    assert summary.status == "compacted" and len(compacted(uri)) == summary.records_written > 0


def spark_jobs() -> list[Any]:
    """The shared application's jobs so far, from Spark's own status store (Spark Connect
    clients' jobs among them)."""
    jobs = local_spark().sparkContext._jsc.sc().statusStore().jobsList(None)
    return [jobs.apply(i) for i in range(jobs.size())]


def shuffle_bytes_written(jobs: list[Any], tag: str) -> int:
    """The bytes Spark's tasks wrote to the shuffle in the stages of those of ``jobs``
    tagged ``tag`` (a classic session's and Spark Connect's tags end with it)."""
    store = local_spark().sparkContext._jsc.sc().statusStore()
    stages: set[int] = set()
    for job in jobs:
        if any(t.endswith(tag) for t in str(job.jobTags().mkString(",")).split(",")):
            stages.update(int(x) for x in str(job.stageIds().mkString(",")).split(",") if x)
    return sum(int(store.lastStageAttempt(s).shuffleWriteBytes()) for s in stages)


def test_pass_one_moves_at_most_16_bytes_a_record_through_the_shuffle(engine: SparkEngine, tmp_path: Path) -> None:
    """Spark's own shuffle metrics of pass one, on a topic shaped as bench/spark_scale.py's
    (keys drawn from a fifth as many as records; four in five records are their slice's
    latest of their key): candidates go as a 16-byte hash and a few compressed bytes, at
    most 16 bytes a record read in offset order (the pickled rows before were 26)."""
    uri = str(tmp_path / "t")
    rnd = random.Random(61)
    with TopicWriter(uri, max_ledger_records=2_000) as w:
        for i in range(20_000):
            w.append(f"key-{rnd.randrange(4_000)}", f"value-{i}")
    before = {j.jobId() for j in spark_jobs()}
    summary = Compactor(uri, engine=engine).run()
    assert summary.status == "compacted" and summary.records_read == 20_000, summary.error
    written = shuffle_bytes_written([j for j in spark_jobs() if j.jobId() not in before], "shale-pass-one")
    # (at least the 16-byte key hashes of the 15,700 or so candidates: the metric is pass one's)
    assert 16 * 15_000 < written <= 16 * 20_000, written


def test_reduce_partitions_and_splits_do_not_change_the_result(engine: SparkEngine, tmp_path: Path) -> None:
    ref = str(tmp_path / "ref")
    produce(ref, seed=9, n=4_000, t=1_700_000_000.0)
    Compactor(ref, clock=lambda: 1_700_000_000.0 + HOUR).run()
    expected = compacted(ref)
    for parts, split in ((1, 1 << 16), (7, 1 << 20)):
        other = SparkEngine(SparkOptions(master="local[2]", reduce_partitions=parts, split_bytes=split),
                            session=engine.session)
        u = str(tmp_path / f"t{parts}")
        produce(u, seed=9, n=4_000, t=1_700_000_000.0)
        s = Compactor(u, clock=lambda: 1_700_000_000.0 + HOUR, engine=other).run()
        assert s.status == "compacted"
        assert compacted(u) == expected


def test_runs_under_spark_submit_with_its_master(tmp_path: Path) -> None:
    """``spark-submit infra/spark/compact_job.py`` joins the application spark-submit
    made: its --master applies, and the result equals the local engine's."""
    import pyspark

    uri, ref = str(tmp_path / "t"), str(tmp_path / "ref")
    for u in (uri, ref):
        produce(u, seed=11, n=2_000, t=time.time() - HOUR)
    Compactor(ref).run()
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    events = tmp_path / "events"
    events.mkdir()
    res = subprocess.run([str(submit), "--master", "local[1]", "--conf", "spark.ui.enabled=false",
                          "--conf", "spark.eventLog.enabled=true", "--conf", f"spark.eventLog.dir=file:{events}",
                          "--conf", "spark.eventLog.compress=false",
                          str(ROOT / "infra" / "spark" / "compact_job.py"), uri, "--engine", "spark", "--json"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300,
                         env={**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable})
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads(res.stdout.splitlines()[-1])
    assert summary["status"] == "compacted" and summary["engine"] == "spark"
    assert compacted(uri) == compacted(ref)
    log = "".join(p.read_text() for p in events.rglob("*") if p.is_file())
    assert '"spark.master":"local[1]"' in log.replace(" ", "")


EDGE_TOPICS = {
    # few keys, many reduce partitions: most reduce tasks receive nothing
    "two-keys": dict(keys=2, tomb=0.0, keyless=0.0),
    # every latest record a tombstone that expires at once: nothing survives
    "all-tombstones": dict(keys=50, tomb=1.0, keyless=0.0),
    # no keys at all, kept in place
    "all-keyless": dict(keys=50, tomb=0.0, keyless=1.0),
}


@pytest.mark.parametrize("topic", sorted(EDGE_TOPICS))
def test_edge_topics_match_the_local_engine(engine: SparkEngine, tmp_path: Path, topic: str) -> None:
    cfg = CompactionConfig(delete_retention_ms=0, retain_null_key=True)
    wide = SparkEngine(SparkOptions(reduce_partitions=16, split_bytes=1 << 16, split_records=300),
                       session=engine.session)
    ref, uri = str(tmp_path / "ref"), str(tmp_path / "t")
    for u in (ref, uri):
        produce(u, seed=12, n=1_500, t=1_700_000_000.0, **EDGE_TOPICS[topic])  # type: ignore[arg-type]
    a = Compactor(ref, cfg, clock=lambda: 1_700_000_000.0 + HOUR).run()
    b = Compactor(uri, cfg, clock=lambda: 1_700_000_000.0 + HOUR, engine=wide).run()
    assert b.status == "compacted", b.error
    assert figures(a) == figures(b)
    assert compacted(ref) == compacted(uri)
    expected = {"two-keys": 2, "all-tombstones": 0, "all-keyless": 1_500}[topic]
    assert b.records_written == expected


def test_dry_run_reports_what_the_local_engine_reports(engine: SparkEngine, tmp_path: Path) -> None:
    ref, uri = str(tmp_path / "ref"), str(tmp_path / "t")
    for u in (ref, uri):
        produce(u, seed=13, n=2_000, t=1_700_000_000.0)
    cfg = CompactionConfig(dry_run=True)
    a = Compactor(ref, cfg, clock=lambda: 1_700_000_000.0 + HOUR).run()
    b = Compactor(uri, cfg, clock=lambda: 1_700_000_000.0 + HOUR, engine=engine).run()
    assert b.status == "dry-run" and figures(a) == figures(b) and b.records_written > 0
    assert not (Path(uri) / "compacted").exists()
    assert TopicMetadata.open(uri).load_compaction().epoch == 0


def test_a_failed_spark_job_is_one_line_naming_the_python_error() -> None:
    from shale.compactor.spark.session import first_line as _first_line

    text = ("An error occurred while calling o123.collectAndServe.\n"
            ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 failed\n"
            "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
            '  File "/x/worker.py", line 1, in main\n'
            "MemoryError: cannot allocate 8 GiB\n"
            "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner.scala:1)\n")
    assert _first_line(RuntimeError(text)) == "MemoryError: cannot allocate 8 GiB"
    assert _first_line(RuntimeError("plain failure\nmore")) == "plain failure"


def test_spark_keeps_mostly_live_parts_in_place_as_the_local_engine_does(engine: SparkEngine, tmp_path: Path) -> None:
    cfg = CompactionConfig(max_part_bytes=1 << 16, reuse_min_bytes=1 << 10, delete_retention_ms=0)
    uris = {name: str(tmp_path / name) for name in ("local", "spark")}
    t = 1_700_000_000.0
    for rnd, n in enumerate((6_000, 60)):  # then about 1 % new records, some keys again
        for uri in uris.values():
            produce(uri, seed=rnd, n=n, t=t, keys=3_000)
        t += HOUR
        a = Compactor(uris["local"], cfg, clock=lambda t=t: t).run()
        b = Compactor(uris["spark"], cfg, clock=lambda t=t: t, engine=engine).run()
        assert figures(a) == figures(b)
        assert (a.records_reused, a.records_written) == (b.records_reused, b.records_written)
        assert compacted(uris["local"]) == compacted(uris["spark"])
    assert b.records_reused > 10 * b.records_written > 0  # most records stayed where they were
    state = TopicMetadata.open(uris["spark"]).load_compaction()
    kept = [p for p in state.parts if p.ledger_id == state.epoch - 1]
    assert kept and any(p.deletions for p in kept)  # kept in place, records superseded since removed
    assert all(p.deletions.startswith(f"compacted/{state.compacted_ledger}/deletions-") for p in kept if p.deletions)
    # a third run on top of the vectors, then verify reads every part and vector back
    produce(uris["spark"], seed=7, n=60, t=t, keys=3_000)
    c = Compactor(uris["spark"], cfg, clock=lambda: t + HOUR, engine=engine).run()
    assert c.status == "compacted" and c.records_reused > 0
    res = run_cli("verify", uris["spark"])
    assert res.returncode == 0, res.stdout + res.stderr


def test_max_map_bytes_bounds_each_reduce_task_and_takes_the_whole_backlog(engine: SparkEngine,
                                                                           tmp_path: Path) -> None:
    ref, uri = str(tmp_path / "ref"), str(tmp_path / "t")
    for u in (ref, uri):
        produce(u, seed=11, n=6_000, t=1_700_000_000.0, keys=4_000, tomb=0.0)
    Compactor(ref, clock=lambda: 1_700_000_000.0 + HOUR).run()
    bounded = SparkEngine(SparkOptions(master="local[2]"), session=engine.session)
    limit = 24 * 500  # 500 keys per reduce task, as the local key map counts them
    s = Compactor(uri, CompactionConfig(max_map_bytes=limit), clock=lambda: 1_700_000_000.0 + HOUR,
                  engine=bounded).run()
    assert s.status == "compacted" and s.deferred_records == 0
    assert compacted(uri) == compacted(ref)
    assert 0 < s.map_keys < 2 * 500  # the busiest of ~12 reduce tasks: bounded near the budget
    assert bounded.reduce_partitions(6_000, CompactionConfig(max_map_bytes=limit)) == 12


def test_incremental_runs_settle_previous_parts_through_a_filter_of_new_keys(
        engine: SparkEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Parts' records whose key is surely not new are decided by their own tasks: the same
    content as the local engine and as shuffling everything, with tombstones of the
    previous parts expiring, keyless records retained and parts kept in place; the filter
    of the new keys built by the driver (few new records: no Spark job of its own) or by
    a Spark job (``job``, the driver's limit set to none)."""
    from dataclasses import replace

    import shale.compactor.spark.engine as spark_engine

    uris = {name: str(tmp_path / name) for name in ("local", "filter", "job", "shuffle")}
    engines = {"local": None, "filter": SparkEngine(engine.options, session=engine.session),
               "job": SparkEngine(engine.options, session=engine.session),
               "shuffle": SparkEngine(replace(engine.options, key_filter=False), session=engine.session)}
    cfg = CompactionConfig(delete_retention_ms=int(HOUR * 1000), retain_null_key=True, reuse_min_bytes=1 << 10,
                           max_part_bytes=1 << 16)
    t = 1_700_000_000.0
    for rnd, n in enumerate((6_000, 150, 120)):
        for uri in uris.values():
            produce(uri, seed=40 + rnd, n=n, t=t, keys=3_000)
        t += 1.5 * HOUR  # the tombstones the previous run kept expire in this one
        runs, jobs = {}, {}
        for name, uri in uris.items():
            with monkeypatch.context() as m:
                if name == "job":
                    m.setattr(spark_engine, "DRIVER_FILTER_RECORDS", 0)
                eng = engines[name]
                before = len(eng.jobs) if eng else 0
                runs[name] = Compactor(uri, cfg, clock=lambda t=t: t, engine=eng).run()
                jobs[name] = eng.jobs[before:] if eng else []
        assert all(r.status == "compacted" for r in runs.values()), runs
        assert figures(runs["filter"]) == figures(runs["local"]) == figures(runs["shuffle"]) == figures(runs["job"])
        assert ({(r.records_reused, r.records_written) for r in runs.values()}
                == {(runs["local"].records_reused, runs["local"].records_written)})
        assert compacted(uris["filter"]) == compacted(uris["local"]) == compacted(uris["shuffle"]) \
            == compacted(uris["job"])
        if rnd:
            assert runs["filter"].tombstones_dropped > 0
            # the busiest reduce task saw the new keys and a few false positives, not the parts
            assert runs["filter"].map_keys * 4 < runs["shuffle"].map_keys
            assert runs["job"].map_keys == runs["filter"].map_keys
            # the filter took a Spark job only when the driver was not to build it
            assert jobs["filter"] == ["shale-pass-one", "shale-pass-two"], jobs["filter"]
            assert jobs["job"] == ["shale-new-keys", "shale-pass-one", "shale-pass-two"], jobs["job"]
    assert runs["filter"].records_reused > 0
    assert run_cli("verify", uris["filter"]).returncode == 0


def test_the_driver_reads_at_most_two_footers(engine: SparkEngine, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    uri = str(tmp_path / "t")
    produce(uri, seed=13, n=8_000, t=1_700_000_000.0)  # 8 ledgers
    Compactor(uri, clock=lambda: 1_700_000_000.0 + HOUR, engine=engine).run()
    produce(uri, seed=14, n=5_000, t=1_700_000_000.0 + HOUR, step=0.5)  # young records cut the last ledger
    opened: list[str] = []
    real = LedgerFile.open.__func__  # type: ignore[attr-defined]

    def counting(cls: type[LedgerFile], store: Any, key: str, **kw: Any) -> LedgerFile:
        opened.append(key)
        return real(cls, store, key, **kw)  # type: ignore[no-any-return]

    monkeypatch.setattr(LedgerFile, "open", classmethod(counting))  # the driver's process only
    s = Compactor(uri, CompactionConfig(min_compaction_lag_ms=30 * 60 * 1000),
                  clock=lambda: 1_700_000_000.0 + 2 * HOUR, engine=engine).run()
    assert s.status == "compacted" and s.held_back_records > 0 and s.ledgers_read >= 3
    assert len(set(opened)) <= 2, opened  # the horizon's ledger and the last one, not the parts or the rest


def test_spark_refuses_an_object_the_metadata_miscounts(engine: SparkEngine, tmp_path: Path) -> None:
    from tests.tamper import edit, snapshot

    uri = str(tmp_path / "t")
    produce(uri, seed=15, n=3_000, t=1_700_000_000.0)

    def lie(doc: dict[str, Any]) -> None:
        doc["value"]["ledgers"][1]["records"] += 5

    edit(uri, "topic.json", lie)
    before = snapshot(uri)
    with pytest.raises(CorruptLedgerError, match=r"ledgers/0+2-.*holds 1000 records where the metadata says 1005"):
        Compactor(uri, clock=lambda: 1_700_000_000.0 + HOUR, engine=engine).run()
    assert snapshot(uri) == before  # nothing published, nothing left
