"""The ``shale`` PySpark data source on real PySpark (``local[2,2]``: two cores, a failed
task tried once more): reads record for record against the reader, a write then a read
equal, failed and retried tasks registering nothing twice, and a streaming query killed
and restarted from its checkpoint delivering every record exactly once to a file sink.
Every test given ``spark`` runs twice: in a classic session and as a Spark Connect client
of the same application (registered there as a client registers it)."""

from __future__ import annotations

import datetime
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shale.compactor import CompactionConfig, Compactor
from shale.ledger.errors import ConflictError
from shale.ledger.ids import MessageId
from shale.ledger.ordering import EVENT_TIME, TopicOrder
from shale.ledger.record import Message, Record
from shale.maintenance.tags import tag_view
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from shale.reader.latest import table_messages
from shale.reader.splits import plan_splits, read_split
from tests.conftest import ROOT, SPARK_APIS, local_spark, make_root, spark_session
from tests.needs import need_module

pytestmark = pytest.mark.slow
need_module("pyspark")
need_module("pyarrow")
T0 = 1_700_000_000_000


@pytest.fixture(scope="module", params=SPARK_APIS)
def spark(request: pytest.FixtureRequest, moto_endpoint: str) -> Iterator[Any]:
    """One Spark application for the module, started with no AWS variables in its
    environment (the processes Spark starts inherit it): they reach moto only through
    what ``register`` captured and forwards.  A classic session, then a Spark Connect
    client of the same application."""
    import shale.spark

    # (local[2,2], started anew for the classic session: this module registers the data source)
    session = spark_session(request.param, fresh=request.param == "classic")
    shale.spark.register(session)
    yield session


def functions(spark: Any) -> Any:
    """``pyspark.sql.functions`` for ``spark``'s kind of session (PySpark picks Spark
    Connect's own only when the process made its sessions through Spark Connect)."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        from pyspark.sql.connect import functions as connect_functions

        return connect_functions
    from pyspark.sql import functions as classic_functions

    return classic_functions


def partition_sizes(df: Any) -> list[int]:
    """The rows of each Spark partition of ``df`` that holds any, in order of size (no
    RDD: a Spark Connect client has none)."""
    return sorted(r["count"] for r in df.selectExpr("spark_partition_id() AS p").groupBy("p").count().collect())


def _produce(uri: str, seed: int, n: int, *, ledger: int = 400) -> None:
    import random

    rnd = random.Random(seed)
    with TopicWriter(uri, batch_size=37, max_ledger_records=ledger) as w:
        for i in range(n):
            key = None if rnd.random() < 0.05 else f"k{rnd.randrange(150)}".encode()
            value = None if rnd.random() < 0.08 else f"v{seed}-{i}".encode()
            props = {f"p{j}": "é" * j for j in range(rnd.randrange(3))}
            w.send(Record(key, value, props, T0 + i, rnd.choice([None, T0 - i])))


def _topic(uri: str) -> None:
    _produce(uri, 1, 1500)
    Compactor(uri, CompactionConfig(delete_retention_ms=3_600_000)).run()
    _produce(uri, 2, 700)


def _ts(ms: int | None) -> Any:
    return None if ms is None else datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).replace(tzinfo=None)


def _want(messages: list[Message]) -> list[tuple[Any, ...]]:
    return [(m.id.ledger, m.id.entry, m.id.batch, m.key, m.value, sorted(m.properties.items()), m.publish_time,
             m.event_time, m.is_tombstone) for m in messages]


def _got(rows: list[Any]) -> list[tuple[Any, ...]]:
    def ms(t: Any) -> int | None:
        return None if t is None else round(t.replace(tzinfo=datetime.UTC).timestamp() * 1000)

    out = [(r.ledger, r.entry, r.batch, None if r.key is None else bytes(r.key),
            None if r.value is None else bytes(r.value), sorted((r.properties or {}).items()), ms(r.publish_time),
            ms(r.event_time), r.tombstone) for r in rows]
    return sorted(out, key=lambda t: t[:3])


def test_read_equals_the_reader(spark: Any, disk_topic_uri: str) -> None:
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    uri = disk_topic_uri
    _topic(uri)
    df = spark.read.format("shale").option("compacted", "true").option("splitRecords", "250").load(uri)
    splits = plan_splits(TopicMetadata.open(uri), compacted=True, max_records=250)
    # one partition per split: the part, the tail's slices (those at or below the horizon empty)
    sizes = [sum(b.num_rows for b in read_split(TopicMetadata.open(uri), sp)) for sp in splits]
    assert partition_sizes(df) == sorted(n for n in sizes if n) and len(splits) >= 1 + 700 // 250
    assert _got(df.collect()) == _want(list(TopicReader(uri, read_compacted=True)))
    full = spark.read.format("shale").load(uri)
    assert _got(full.collect()) == _want(list(TopicReader(uri)))
    small = spark.read.format("shale").option("maxBatchBytes", "2KiB").load(uri)  # batches of a few records
    assert _got(small.collect()) == _want(list(TopicReader(uri)))
    text = spark.read.format("shale").option("utf8", "true").option("idText", "true").load(uri)
    assert text.schema["key"].dataType.typeName() == "string"
    first = text.orderBy("ledger", "entry", "batch").first()
    m = next(iter(TopicReader(uri)))
    assert (first.id, first.key) == (str(m.id), m.key.decode() if m.key else None)


def test_executors_read_compacted_parts_from_their_arrow_caches(spark: Any, tmp_path: Path) -> None:
    """A topic whose parts have Arrow caches: the splits of the view are read from them on
    the executors.  One cache holds a value its part does not (bound to the part, so
    used: what ``verify`` finds), which shows where the rows came from."""
    import pyarrow as pa

    from tests.reader.test_arrow_cache import _caches, _rewritten
    from tests.reader.test_arrow_cache import _topic as cached_topic

    spark.conf.set("spark.sql.session.timeZone", "UTC")
    uri = str(tmp_path / "t")
    cached_topic(uri)
    store = TopicMetadata.open(uri).topic.store
    key = _caches(uri)[-1]

    def marked(t: Any, m: dict[bytes, bytes]) -> tuple[Any, dict[bytes, bytes]]:
        values = t.column("value").to_pylist()
        values[0] = b"from the cache"
        return t.set_column(4, "value", pa.array(values, pa.large_binary())), m

    store.put(key, _rewritten(store.get(key), marked))
    df = spark.read.format("shale").option("compacted", "true").option("splitRecords", "100").load(uri)
    got = _got(df.collect())
    assert any(row[4] == b"from the cache" for row in got)
    want = TopicReader(uri, read_compacted=True).to_arrow().to_pylist()
    assert got == _got([_Row(r) for r in want])


class _Row:
    """A row of ``to_arrow``'s table as Spark's rows give it (attributes; properties a
    dict; times naive UTC)."""

    def __init__(self, r: dict[str, Any]) -> None:
        for k, v in r.items():
            setattr(self, k, dict(v) if k == "properties" else
                    v.replace(tzinfo=None) if isinstance(v, datetime.datetime) else v)


def test_the_table_option_reads_the_table_in_the_topics_order(spark: Any, tmp_path: Path) -> None:
    """``option("table", "true")``: the latest record of every live key as ``read --table``
    gives it, under the topic's order and key TTL: before the first compaction (the
    policy's), and over a view compacted in event-time order with late records above it."""
    import random

    spark.conf.set("spark.sql.session.timeZone", "UTC")
    uri, hour = str(tmp_path / "t"), 3_600_000
    now = int(time.time() * 1000)
    ttl = 240 * hour

    def produce(seed: int, n: int) -> None:
        rnd = random.Random(seed)
        with TopicWriter(uri, batch_size=3, max_ledger_records=30) as w:
            for i in range(n):
                key = None if rnd.random() < 0.05 else f"k{rnd.randrange(40)}".encode()
                value = None if rnd.random() < 0.15 else f"v{seed}-{i}".encode()
                # whole hours, none within an hour of the TTL's boundary: the clock may move on
                age = rnd.choice([*range(0, 239), *range(242, 480)])
                w.send(Record(key, value, {}, now - (5 - seed) * 24 * hour + i,
                              None if rnd.random() < 0.2 else now - age * hour))

    def table(**options: str) -> Any:
        reader = spark.read.format("shale").option("table", "true").option("splitRecords", "7")
        for k, v in options.items():
            reader = reader.option(k, v)
        return reader.load(uri)

    produce(1, 300)
    meta = TopicMetadata.open(uri)
    meta.update_policy({"order": EVENT_TIME, "key_ttl_ms": ttl})
    want = list(table_messages(meta))
    assert _want(want) != _want(list(table_messages(meta, order=TopicOrder())))  # the order matters here
    assert _got(table().collect()) == _want(want)
    Compactor(uri, CompactionConfig(order=EVENT_TIME, key_ttl_ms=ttl)).run()
    produce(2, 200)
    want = list(table_messages(meta))
    df = table()
    assert len(partition_sizes(df)) >= len(want) // 7 and max(partition_sizes(df)) <= 7
    assert _got(df.collect()) == _want(want)
    with pytest.raises(Exception, match="takes no start"):
        table(start="1:0:0").collect()


def _frame(spark: Any, n: int, *, fail_at: int | None = None, big_at: int | None = None) -> Any:
    F = functions(spark)
    df = spark.range(n, numPartitions=4).select(
        F.concat(F.lit("k"), (F.col("id") % 97).cast("string")).alias("key"),
        F.concat(F.lit("v"), F.col("id").cast("string")).alias("value"),
        F.create_map(F.lit("n"), F.col("id").cast("string")).alias("properties"),
        F.timestamp_millis(F.lit(T0) + F.col("id")).alias("event_time"), F.col("id"))
    if big_at is not None:
        df = df.withColumn("value", F.when(F.col("id") == big_at, F.repeat(F.lit("x"), 5000))
                           .otherwise(F.col("value")))
    if fail_at is not None:
        def once(it: Iterator[Any]) -> Iterator[Any]:
            from pyspark import TaskContext

            for batch in it:
                ids = batch.column("id").to_pylist()
                if fail_at in ids and TaskContext.get().attemptNumber() == 0:
                    raise RuntimeError("first attempt of this task fails")
                yield batch
        df = df.mapInArrow(once, df.schema)
    return df.drop("id")


def test_as_of_reads_the_topic_as_it_was_and_changes_between_points(spark: Any, tmp_path: Path) -> None:
    """``option("asOf", ...)``: the topic as it was at a point (an epoch, an id, a time),
    as ``TopicReader(as_of=...)`` reads it, and its table; ``fromSnapshot``: a snapshot and
    everything since; ``changesFrom``/``changesTo``: the changes between two points as
    :mod:`shale.reader.changes` gives them; bad or unknown points are refused."""
    from shale.reader.changes import changes

    spark.conf.set("spark.sql.session.timeZone", "UTC")
    uri = str(tmp_path / "t")
    config = CompactionConfig(delete_retention_ms=3_600_000, snapshot_retention=2)
    _produce(uri, 1, 600, ledger=200)
    Compactor(uri, config).run()
    _produce(uri, 2, 300, ledger=200)
    Compactor(uri, config).run()
    meta = TopicMetadata.open(uri)
    assert meta.load_compaction().retained_epochs == (1, 2)
    middle = str(list(TopicReader(uri))[700].id)
    for point in ("1", "2", middle, "2030-01-01T00:00:00Z"):
        df = spark.read.format("shale").option("asOf", point).option("splitRecords", "150").load(uri)
        assert _got(df.collect()) == _want(list(TopicReader(uri, as_of=point))), point  # type: ignore[arg-type]
        table = spark.read.format("shale").option("asOf", point).option("table", "true").load(uri)
        assert _got(table.collect()) == _want(list(table_messages(meta, as_of=point))), point  # type: ignore[arg-type]
    snap = spark.read.format("shale").option("fromSnapshot", "1").load(uri)
    assert _got(snap.collect()) == _want(list(TopicReader(uri, from_snapshot=1)))
    # (epoch 1's view holds the second round's records as written; epoch 2's compacted them)
    assert _got(snap.collect()) != _want(list(TopicReader(uri, read_compacted=True)))
    # a tag reads as its epoch
    tag_view(meta, "first", 1)
    tagged = spark.read.format("shale").option("asOf", "first").option("splitRecords", "150").load(uri)
    as_of_1 = spark.read.format("shale").option("asOf", "1").option("splitRecords", "150").load(uri)
    assert _got(tagged.collect()) == _got(as_of_1.collect())
    for since, until in (("1", "2"), ("1", None), (middle, "2"), ("first", "2")):
        reader = spark.read.format("shale").option("changesFrom", since).option("splitRecords", "50")
        rows = (reader if until is None else reader.option("changesTo", until)).load(uri).collect()
        want = [(c.op, c.key, None if c.message is None else c.message.value) for c in changes(meta, since, until)]
        got = [(r.op, bytes(r.key), None if r.value is None else bytes(r.value)) for r in rows]
        assert sorted(got) == sorted(want) and want, (since, until)
    with pytest.raises(Exception, match="option asOf: 'too soon' is not an epoch"):
        spark.read.format("shale").option("asOf", "too soon").load(uri).collect()
    with pytest.raises(Exception, match="no compacted view is tagged 'soon'"):
        spark.read.format("shale").option("asOf", "soon").load(uri).collect()
    with pytest.raises(Exception, match="epoch 5 is not retained"):
        spark.read.format("shale").option("asOf", "5").load(uri).collect()
    with pytest.raises(Exception, match="give one of the options asOf, fromSnapshot and changesFrom"):
        spark.read.format("shale").option("asOf", "1").option("changesFrom", "1").load(uri).collect()


def test_write_then_read_round_trip(spark: Any, disk_topic_uri: str) -> None:
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    uri = disk_topic_uri
    with TopicWriter(uri) as w:
        w.append(b"before", b"1")
    # a task fails on its first attempt: its retry registers its ledgers once
    _frame(spark, 5000, fail_at=3000).write.format("shale").mode("append").option("batchSize", "100").save(uri)
    got = list(TopicReader(uri))
    assert len(got) == 5001 and got[0].key == b"before"
    rows = sorted((m.key, m.value, dict(m.properties), m.event_time) for m in got[1:])
    want = sorted((f"k{i % 97}".encode(), f"v{i}".encode(), {"n": str(i)}, T0 + i) for i in range(5000))
    assert rows == want
    ids = [lg.id for lg in TopicMetadata.open(uri).load_topic().ledgers]
    assert ids == sorted(set(ids)) and len(ids) == 5  # one ledger per task, after the producer's
    # read back through Spark, then compact: a compaction sees the written ledgers like any other
    back = spark.read.format("shale").option("utf8", "true").load(uri).where("key != 'before'")
    assert back.count() == 5000
    Compactor(uri, CompactionConfig()).run()
    assert len(list(TopicReader(uri, read_compacted=True))) == 98
    with TopicWriter(uri) as w:  # a producer goes on after the job's ids
        w.append(b"after", b"2")
    assert list(TopicReader(uri))[-1].id.ledger == ids[-1] + 1


def _idle(spark: Any) -> None:
    """Until no task of the application is running (tasks of a failed job may run on a
    while after the job's failure was reported)."""
    # (the application's own status, through the classic session a Spark Connect client has none of)
    tracker = local_spark().sparkContext._jsc.sc().statusTracker()
    deadline = time.monotonic() + 120
    while any(e.numRunningTasks() for e in tracker.getExecutorInfos()):
        assert time.monotonic() < deadline, "tasks still running after 120 s"
        time.sleep(0.05)


def test_a_failed_write_registers_nothing(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "topic")
    with TopicWriter(uri) as w:
        w.append(b"before", b"1")
    before = TopicMetadata.open(uri).load_topic()
    with pytest.raises(Exception, match=r"partition \d+, column 'value', row \d+: 5,000 bytes .* maximum of 4,096"):
        _frame(spark, 400, big_at=350).write.format("shale").mode("append").option("maxRecordBytes", "4096") \
            .save(uri)
    _idle(spark)  # the failed job's other tasks may still be running: they clean up after themselves
    after = TopicMetadata.open(uri).load_topic()
    assert after.ledgers == before.ledgers
    assert sorted(p.name for p in (tmp_path / "topic" / "ledgers").iterdir()) == [
        Path(lg.object).name for lg in before.ledgers]
    with pytest.raises(Exception, match="no column 'key'"):
        spark.range(3).selectExpr("cast(id as string) as k", "'v' as value").write.format("shale") \
            .mode("append").save(uri)
    with pytest.raises(Exception, match="append-only"):
        spark.range(3).selectExpr("cast(id as string) as key", "'v' as value").write.format("shale") \
            .mode("overwrite").save(uri)
    assert TopicMetadata.open(uri).load_topic().ledgers == before.ledgers


# ------------------------------------------------------- tasks that outlive their write
# The driver's side (commit, abort) and a task's side (write) of the data source, called
# as Spark calls them, with a task held on an event until the driver has finished: the
# race a loaded machine runs now and then, every time.


def _writer(uri: str) -> Any:
    from pyspark.sql.types import StringType, StructField, StructType

    from shale.spark.source import ShaleWriter
    from shale.storage import StorageOptions

    schema = StructType([StructField("key", StringType()), StructField("value", StringType())])
    return ShaleWriter({"path": uri, "maxLedgerRecords": "10"}, schema, StorageOptions.from_environment())


def _batch(first: int, n: int) -> Any:
    import pyarrow as pa

    return pa.record_batch({"key": [f"k{i}" for i in range(first, first + n)],
                            "value": [f"v{i}" for i in range(first, first + n)]})


class _Task(threading.Thread):
    """One task attempt: ``writer.write`` over ``batches``, its input held before batch
    ``pause`` (``waiting`` set) until ``go`` is."""

    def __init__(self, writer: Any, batches: list[Any], pause: int | None) -> None:
        super().__init__(daemon=True)
        self.writer, self.batches, self.pause = writer, batches, pause
        self.waiting, self.go = threading.Event(), threading.Event()
        self.message: Any = None
        self.error: BaseException | None = None

    def _input(self) -> Iterator[Any]:
        for i, b in enumerate(self.batches):
            if i == self.pause:
                self.waiting.set()
                assert self.go.wait(120)
            yield b

    def run(self) -> None:
        try:
            self.message = self.writer.write(self._input())
        except BaseException as e:  # (handed to the test)
            self.error = e

    def finish(self) -> None:
        self.go.set()
        self.join(120)
        assert not self.is_alive()


def _unregistered(uri: str) -> list[str]:
    """Ledger objects of the topic that it does not register."""
    meta = TopicMetadata.open(uri)
    loc = meta.topic
    registered = {lg.object for lg in meta.load_topic().ledgers}
    return sorted(n for info in loc.store.list(loc.key("ledgers"))
                  if (n := loc.relative(info.key)) not in registered)


def _late(t: _Task) -> None:
    """The task found the write finished when it uploaded, and said so."""
    assert isinstance(t.error, ConflictError), t.error
    assert "was committed or aborted before this task finished" in str(t.error), t.error


@pytest.mark.parametrize("kind", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_tasks_that_outlive_an_aborted_write_leave_nothing(kind: str, request: pytest.FixtureRequest,
                                                           tmp_path: Path) -> None:
    uri = f"{make_root(kind, request, tmp_path)}/t"
    with TopicWriter(uri) as w:
        w.append(b"before", b"1")
    before = TopicMetadata.open(uri).load_topic()
    writer = _writer(uri)
    # one task has staged a ledger and is still reading its input; another has staged nothing yet
    staging = _Task(writer, [_batch(0, 10), _batch(10, 3)], pause=1)
    starting = _Task(writer, [_batch(100, 4)], pause=0)
    for t in (staging, starting):
        t.start()
        assert t.waiting.wait(120)
    assert len(_unregistered(uri)) == 1
    writer.abort([None, None])  # the job failed elsewhere: the driver heard from neither
    assert _unregistered(uri) == []  # what a task staged before the abort: gone with it
    for t in (staging, starting):
        t.finish()
        _late(t)
    assert _unregistered(uri) == []  # ... and what they staged after it
    assert TopicMetadata.open(uri).load_topic().ledgers == before.ledgers
    assert [m.key for m in TopicReader(uri)] == [b"before"]


@pytest.mark.parametrize("kind", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_an_attempt_that_outlives_a_committed_write_leaves_nothing(kind: str, request: pytest.FixtureRequest,
                                                                  tmp_path: Path) -> None:
    uri = f"{make_root(kind, request, tmp_path)}/t"
    writer = _writer(uri)
    # two attempts of one task (a speculative copy): the first staged a ledger and waits
    slow = _Task(writer, [_batch(0, 10), _batch(10, 15)], pause=1)
    slow.start()
    assert slow.waiting.wait(120)
    fast = _Task(writer, [_batch(0, 10), _batch(10, 15)], pause=None)
    fast.start()
    fast.join(120)
    assert fast.error is None and len(fast.message.staged) == 3
    writer.commit([fast.message])  # Spark commits the attempt that finished first
    assert _unregistered(uri) == []
    slow.finish()
    _late(slow)
    assert _unregistered(uri) == []
    got = [(m.key, m.value) for m in TopicReader(uri)]
    assert got == [(f"k{i}".encode(), f"v{i}".encode()) for i in range(25)]  # once, from the committed attempt
    assert [lg.object for lg in TopicMetadata.open(uri).load_topic().ledgers] == [
        s.info["object"] for s in fast.message.staged]


_STREAM_JOB = """
import os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
from shale.compactor.spark import SparkOptions
from shale.ledger.errors import ConflictError
from shale.compactor.spark.engine import open_session
import shale.spark
uri, out, ck = sys.argv[1:4]
spark, _ = open_session(SparkOptions(master="local[2]", conf=(("spark.ui.enabled", "false"),)))
shale.spark.register(spark)
stream = (spark.readStream.format("shale").option("compacted", "true").option("maxRecordsPerTrigger", "300")
          .load(uri).writeStream.format("parquet").option("path", out).option("checkpointLocation", ck))
stream.trigger(processingTime="100 milliseconds").start().awaitTermination()  # until killed
"""


def _committed_end(ck: Path) -> str | None:
    """Where the last committed micro-batch of a checkpoint ends (its offset's ``next``)."""
    import json

    done = sorted(int(p.name) for p in (ck / "commits").glob("[0-9]*"))
    if not done:
        return None
    last_line = (ck / "offsets" / str(done[-1])).read_text().strip().splitlines()[-1]
    return str(json.loads(last_line)["next"])


def _topic_end(uri: str) -> str:
    """The offset a micro-batch that read the whole topic ends at."""
    topic = TopicMetadata.open(uri).load_topic()
    return str(MessageId(topic.ledgers[-1].id, topic.ledgers[-1].entries, 0))


def _start_job(script: Path, uri: str, out: str, ck: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    with log.open("wb") as err:
        return subprocess.Popen([sys.executable, str(script), uri, out, ck], env=env, cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)


def _wait(proc: subprocess.Popen[bytes], log: Path, reached: Callable[[], bool], what: str) -> None:
    """Until ``reached()``, failing if the job ends first."""
    deadline = time.monotonic() + 240
    while not reached():
        assert proc.poll() is None, f"the streaming job ended before {what}: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} after 240 s"
        time.sleep(0.01)  # how often to look, not how long anything takes


def test_a_killed_stream_restarts_exactly_once(spark: Any, tmp_path: Path) -> None:
    """The stream reads what the topic holds (the compacted view, then three batches of
    the tail) and waits for more; one more ledger arrives, and the job is killed as soon
    as it has logged the batch that reads it — in the middle of that batch, or just after
    it committed: either way it has read part of the topic, not all.  Restarted from its
    checkpoint (in this process's Spark application: nothing of the killed one is left but
    its checkpoint and output), it delivers every record once."""
    uri, out, ck = str(tmp_path / "topic"), str(tmp_path / "out"), str(tmp_path / "ck")
    _produce(uri, 1, 1500, ledger=200)
    Compactor(uri, CompactionConfig(delete_retention_ms=3_600_000)).run()
    _produce(uri, 2, 1200, ledger=200)  # six ledgers: three batches of two (maxRecordsPerTrigger 300)
    script = tmp_path / "job.py"
    script.write_text(_STREAM_JOB)
    log = tmp_path / "job.log"
    proc = _start_job(script, uri, out, ck, log)
    commits, offsets = Path(ck) / "commits", Path(ck) / "offsets"
    try:
        end = _topic_end(uri)
        _wait(proc, log, lambda: _committed_end(Path(ck)) == end, "everything read")
        first = len(list(commits.glob("[0-9]*")))
        assert first == 4  # the view, then three of the tail: it now waits, with nothing to read
        _produce(uri, 4, 300, ledger=300)  # one ledger: one batch
        _wait(proc, log, lambda: (offsets / str(first)).exists(), "a batch for the new ledger")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    done = len(list(commits.glob("[0-9]*")))
    assert done in (first, first + 1)  # that batch uncommitted or committed, no other one
    print(f"\nkilled {'in the middle of' if done == first else 'just after'} batch {first}")
    _produce(uri, 3, 600, ledger=200)  # more arrives while it is down
    end = _topic_end(uri)
    # restarted from the checkpoint, with the job's options, as a catch-up: availableNow re-runs
    # the batch left uncommitted, then reads on to the end of the topic in batches, and stops
    query = (spark.readStream.format("shale").option("compacted", "true").option("maxRecordsPerTrigger", "300")
             .load(uri).writeStream.format("parquet").option("path", out).option("checkpointLocation", ck)
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(240), "not everything read after 240 s"
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    assert _committed_end(Path(ck)) == end
    # the 600 records that arrived while it was down, three ledgers of 200: two batches of at most 300 and a bit
    assert len(list(commits.glob("[0-9]*"))) == first + 1 + 2
    rows = spark.read.parquet(out).select("ledger", "entry", "batch", "value").collect()
    got = sorted((r.ledger, r.entry, r.batch, None if r.value is None else bytes(r.value)) for r in rows)
    want = sorted((m.id.ledger, m.id.entry, m.id.batch, m.value) for m in TopicReader(uri, read_compacted=True))
    assert got == want  # every record of the compacted view and the tail, each once


def test_available_now_reads_to_the_end_the_query_started_with_in_batches(tmp_path: Path) -> None:
    """Under ``trigger(availableNow=True)`` the source fixes its end when the query starts
    (the end of the last ledger registered then), hands it out in batches of
    ``maxRecordsPerTrigger``, and never offers what was registered later."""
    from shale.spark.source import ReadOptions
    from shale.spark.stream import ShaleStreamReader

    uri = str(tmp_path / "t")
    _produce(uri, 1, 1000, ledger=200)  # five ledgers
    options = {"path": uri, "maxRecordsPerTrigger": "300"}
    reader = ShaleStreamReader(ReadOptions.of(options), options)
    reader.prepareForTriggerAvailableNow()
    _produce(uri, 2, 400, ledger=200)  # two more, after the query started
    ends, start = [], reader.initialOffset()
    while (end := reader.latestOffset(start, reader.getDefaultReadLimit())) != start:
        ends.append(MessageId.parse(end["next"]))
        start = end
    five = TopicMetadata.open(uri).load_topic().ledgers[:5]
    assert ends == [MessageId(five[i].id, five[i].entries, 0) for i in (1, 3, 4)]  # two ledgers, two, the last


def test_spark_writes_refuse_an_event_time_no_reader_holds(spark: Any, tmp_path: Path) -> None:
    """An event time outside what every reader holds is refused in the Spark write path
    too, naming the partition, column and row; nothing of the failed write is registered."""
    from shale.ledger.record import EVENT_TIME_MAX_MS, EVENT_TIME_MIN_MS

    rng = f"{EVENT_TIME_MIN_MS} to {EVENT_TIME_MAX_MS} ms"
    topic = str(tmp_path / "t")
    with TopicWriter(topic) as w:
        w.append("before", "1")
    before = TopicMetadata.open(topic).load_topic().ledgers
    frame = spark.range(50, numPartitions=1).selectExpr(
        "cast(id as string) as key", "'v' as value",
        f"case when id = 40 then {EVENT_TIME_MAX_MS + 1} else id end as event_time")
    with pytest.raises(Exception, match=rf"partition 0, column 'event_time', row 40: event time .*{rng}"):
        frame.write.format("shale").mode("append").save(topic)
    ok = spark.range(2, numPartitions=1).selectExpr(
        "cast(id as string) as key", "'v' as value",
        f"case when id = 0 then {EVENT_TIME_MIN_MS} else {EVENT_TIME_MAX_MS} end as event_time")
    ok.write.format("shale").mode("append").save(topic)
    assert TopicMetadata.open(topic).load_topic().ledgers[:1] == before
    assert [m.event_time for m in TopicReader(topic)] == [None, EVENT_TIME_MIN_MS, EVENT_TIME_MAX_MS]
    ledgers = sorted(p.name for p in (tmp_path / "t" / "ledgers").iterdir())
    assert len(ledgers) == 2


def _doc_examples() -> dict[str, str]:
    """The Python examples of docs/spark.md, by the first line of each."""
    text = (ROOT / "docs" / "spark.md").read_text()
    return {block.splitlines()[0]: block for block in re.findall(r"```python\n(.*?)```", text, re.S)}


def test_the_docs_examples_run(spark: Any, tmp_path: Path) -> None:
    """docs/spark.md's examples of registering, writing and reading, run as they are
    written on a topic of this test's (in place of s3://bucket/topics/users)."""
    F = functions(spark)
    examples = _doc_examples()
    uri = str(tmp_path / "users")
    when = datetime.datetime(2024, 5, 1, tzinfo=datetime.UTC)
    changes = spark.createDataFrame(
        [("u1", "Ann", {"source": "web"}, when), ("u2", "Bob", {"source": "app"}, when),
         ("u3", "Cy", {"source": "web"}, when), ("u1", "Ann B.", {"source": "app"}, when)],
        "key string, value string, properties map<string,string>, event_time timestamp")
    scope: dict[str, Any] = {"spark": spark, "changes": changes, "F": F}
    for first in ("import shale.spark", "(changes.select(", "from pyspark.sql import functions as F"):
        if first.startswith("from"):
            Compactor(uri).run()  # (so that the compacted view holds each key's latest record once)
        [block] = [b for line, b in examples.items() if line.startswith(first)]
        assert "s3://bucket/topics/users" in block or first == "import shale.spark"
        # (a process with a classic session too takes pyspark.sql.functions' classic columns:
        # a Spark Connect client's gets the functions of its kind, as a client alone would)
        block = block.replace("from pyspark.sql import functions as F\n", "")
        exec(compile(block.replace("s3://bucket/topics/users", uri), "docs/spark.md", "exec"), scope)
    by_source = {r["source"]: r["count"] for r in scope["users"].where("NOT tombstone")
                 .groupBy(F.col("properties")["source"].alias("source")).count().collect()}
    assert by_source == {"web": 1, "app": 2}  # u1's latest record came from the app
