"""The Spark engine (driver side): splits the plan, runs the jobs, gathers the parts.

The driver plans, heartbeats and publishes exactly as the local engine does
(:class:`~shale.compactor.job.Compactor`); only the two passes run on executors.  Executors
reach storage through Shale's own storage layer (boto3 for ``s3://``, fsspec for other
schemes), so no Hadoop S3 connector is involved, and they write only under the run's
folder, which the driver removes if the run fails.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import sys
import tempfile
import threading
import warnings
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, TypeVar

import numpy as np
import numpy.typing as npt
from pyspark import RDD, Broadcast, SparkContext, StorageLevel
from pyspark.sql import SparkSession

from shale.compactor.config import CompactionConfig
from shale.compactor.engine import SurvivorCounts
from shale.compactor.keyfilter import KeyFilter
from shale.compactor.keymap import EVENT_KEY_BYTES, KEY_BYTES
from shale.compactor.pass_two import PassTwoResult
from shale.compactor.plan import Plan
from shale.compactor.spark.newkeys import filter_task
from shale.compactor.spark.options import REDUCE_RECORDS_PER_PARTITION, SparkOptions, SparkUnavailableError
from shale.compactor.spark.splits import Reports, plan_writes, slice_specs, task_of_splits
from shale.compactor.spark.tasks import (
    ERROR_KEY,
    MAP_KEY,
    STATS_KEY,
    TaskContext,
    WriteContext,
    candidate_type,
    error_from_record,
    forget_opened,
    group_splits,
    map_task,
    reduce_partition,
    resplit,
    write_task,
)
from shale.ledger.errors import InvalidInputError, ShaleError
from shale.metadata.state import CompactedPart
from shale.storage import Location

__all__ = ["DAEMON_MODULE", "SparkEngine", "SparkJobError", "open_session", "warm_executors", "worker_settings"]

T = TypeVar("T")

#: A filter of new keys is built when the previous parts hold at least this many times
#: the new records: below that, most of the parts' records would be shuffled anyway.
KEY_FILTER_RATIO: Final = 4
#: An incremental run of at most this many new records has the driver build the filter
#: of their keys, reading their footers one at a time (a few MiB each), rather than a
#: Spark job of its own, whose fixed cost outweighs the work for so few.
DRIVER_FILTER_RECORDS: Final = 256 * 1024


class SparkJobError(ShaleError):
    """A Spark job failed for a reason other than a Shale error in a task (an executor
    lost, out of memory, a bad master URL ...)."""


@dataclass(slots=True, eq=False)
class SparkSurvivors:
    """Pass one's counts, the cached shuffle output pass two reads, and the splits pass
    two writes (cut by the map tasks, which read the footers)."""

    plan: Plan
    records_read: int
    keys: int
    tombstones_kept: int
    tombstones_dropped: int
    tombstones_held: int
    keyless_kept: int
    keyless_dropped: int
    footer_bytes: int
    kept_keyed: int
    map_keys: int  # the most keys one reduce task held
    map_bytes: int  # the most candidate bytes one reduce task held
    rdd: RDD[tuple[int, bytes]] | None
    context: Broadcast[TaskContext] | None
    writes: WriteContext | None
    keys_expired: int = 0

    @property
    def records_kept(self) -> int:
        return self.kept_keyed + self.keyless_kept

    @property
    def deferred_records(self) -> int:
        return 0  # more reduce partitions bound each task's memory: the whole plan is taken


def _package_zip() -> str:
    """The ``shale`` package as one zip, for ``SparkContext.addPyFile`` (its subpackages
    are links in a source tree, hence a walk that follows them)."""
    fd, path = tempfile.mkstemp(prefix="shale-code-", suffix=".zip")
    os.close(fd)
    root = Path(sys.modules["shale"].__file__ or "").parent
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for folder, dirs, files in os.walk(root, followlinks=True):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                p = Path(folder) / name
                if p.suffix in (".py", ".typed", ".properties"):
                    z.write(p, str(Path("shale") / p.relative_to(root)))
    return path


_PANDAS_WARNING = "PySpark does not yet fully support pandas"
_PANDAS_FILTER = f"ignore:{_PANDAS_WARNING}:FutureWarning"


#: The daemon that imports Shale's task modules before forking the Python workers.
DAEMON_MODULE: Final = "shale.spark.daemon"


def worker_settings(*, shale_installed: bool) -> tuple[tuple[str, str], ...]:
    """The Spark settings for executors' Python workers that the engine's own session
    takes (before the user's ``conf``, which may override them): reuse workers across
    tasks, and, when Shale is installed where the executors run (not shipped as a zip,
    which reaches only the workers), fork them from :mod:`shale.spark.daemon`, so that
    no task pays Shale's and NumPy's imports."""
    reuse = (("spark.python.worker.reuse", "true"),)
    return (*reuse, ("spark.python.daemon.module", DAEMON_MODULE)) if shale_installed else reuse


def open_session(options: SparkOptions) -> tuple[SparkSession, str | None]:
    """Start (or join) the Spark session the engine runs in; also return the code zip
    shipped to executors, if any (the caller deletes it when done).  This process's
    environment is left as it is: what Spark's processes need goes through Spark's settings."""
    builder = SparkSession.builder.appName(options.app_name)
    # PySpark warns, in the driver and in every Python worker, that it does not fully
    # support the pandas installed: Shale's tasks use no pandas, and a run's standard error
    # is one line per error.  Workers get the filter as an executor variable.
    warnings.filterwarnings("ignore", message=_PANDAS_WARNING, category=FutureWarning)
    given = os.environ.get("PYTHONWARNINGS", "")
    builder = builder.config("spark.executorEnv.PYTHONWARNINGS",
                             given if _PANDAS_FILTER in given else ",".join(filter(None, (given, _PANDAS_FILTER))))
    master = options.effective_master
    if master is not None:
        builder = builder.master(master)
    ship = options.ship_code if options.ship_code is not None else not options.is_local
    for k, v in worker_settings(shale_installed=not ship):
        builder = builder.config(k, v)
    if options.is_local:
        builder = builder.config("spark.ui.showConsoleProgress", "false")
        if not any(k == "spark.driver.extraJavaOptions" for k, _ in options.conf):
            log_conf = Path(__file__).with_name("log4j2.properties")
            builder = builder.config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log_conf}")
    for k, v in options.conf:
        builder = builder.config(k, v)
    creates = SparkContext._active_spark_context is None
    try:
        session = builder.getOrCreate()
    except Exception as e:
        where = master or "from spark-submit"
        raise SparkUnavailableError(f"cannot start Spark with master {where!r}: {_first_line(e)}") from None
    if options.is_local and creates and "PYSPARK_PYTHON" not in os.environ:
        # Python workers must run this interpreter, which has Shale and its dependencies;
        # PySpark takes theirs from PYSPARK_PYTHON alone (else `python3` on the path), as
        # the context starts, so the context it started is told.
        session.sparkContext.pythonExec = sys.executable
    shipped = None
    if ship:
        shipped = _package_zip()
        session.sparkContext.addPyFile(shipped)
    return session, shipped


_EXCEPTION_LINE = re.compile(r"^\s*((?:\w+\.)*\w*(?:Error|Exception|Exit)\b:?.*)$")


def _first_line(e: BaseException) -> str:
    """The line that says what went wrong: the innermost Python exception a task raised
    if there is one, else the first line."""
    lines = str(e).splitlines()
    found = [m.group(1) for m in map(_EXCEPTION_LINE.match, lines) if m and "Traceback" not in m.group(1)]
    python = [f for f in found if not f.startswith(("org.", "java.", "py4j.", "scala."))]
    if python:
        return python[0][:300]
    for line in lines:
        line = line.strip()
        if line:
            return line[:300]
    return type(e).__name__


def _spark_call(fn: Callable[[], T]) -> T:
    """Run a Spark action; a failed job becomes one :class:`SparkJobError` line."""
    try:
        return fn()
    except ShaleError:
        raise
    except Exception as e:
        raise SparkJobError(f"Spark job failed: {_first_line(e)}") from None


def _nothing(it: Iterable[int]) -> Iterator[int]:
    return iter(())


def warm_executors(sc: SparkContext) -> None:
    """Run one task per core of the application, doing nothing: each executor it reaches
    starts its Python daemon and a worker (with Shale's modules imported: unpickling this
    task's function imports the engine's module, and the daemon has them already) and
    loads the classes its first task needs, which every executor's first task otherwise
    pays in the middle of a run.  Executors that join later, or that this job's tasks
    miss (they go where a core is free), start theirs on their first task."""
    n = max(1, sc.defaultParallelism)
    sc.setJobDescription("shale: start the executors' Python workers")
    sc.parallelize(range(n), n).mapPartitions(_nothing).collect()


def _warm_quietly(sc: SparkContext) -> None:
    with contextlib.suppress(Exception):
        warm_executors(sc)


def _identity(k: int) -> int:
    return k


def _is_report(kv: tuple[int, bytes]) -> bool:
    return kv[0] in (STATS_KEY, ERROR_KEY, MAP_KEY)


def _is_kept(kv: tuple[int, bytes]) -> bool:
    return kv[0] not in (STATS_KEY, MAP_KEY)  # kept positions, and errors on their way


def _run_map(bc: Broadcast[TaskContext], it: Iterable[int]) -> Iterator[tuple[int, bytes]]:
    return map_task(bc.value, it)


def _run_filter(bc: Broadcast[TaskContext], size: int, it: Iterable[int]) -> Iterator[KeyFilter]:
    return filter_task(bc.value, size, it)


def _union(a: KeyFilter, b: KeyFilter) -> KeyFilter:
    return a.union(b)


def _run_reduce(bc: Broadcast[TaskContext], it: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, bytes]]:
    return reduce_partition(bc.value, it)


def _run_resplit(bc: Broadcast[WriteContext], item: tuple[int, bytes]) -> Iterator[tuple[int, bytes]]:
    return resplit(bc.value, item)


def _run_write(bc: Broadcast[WriteContext], run_dir: str, epoch: int, t: int,
               it: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, Any]]:
    return write_task(bc.value, run_dir, epoch, t, it)


def _task_partition(task_of: npt.NDArray[np.int64], j: int) -> int:
    return int(task_of[j]) if j >= 0 else 0  # an error record goes to the first task


def _release(rdd: RDD[Any] | None, *broadcasts: Broadcast[Any] | None) -> None:
    """Drop the cached shuffle output and destroy the broadcasts (whose pickles, on the
    driver's disk, hold the forwarded credentials).  Never raises: this runs while
    another error may be on its way out."""
    with contextlib.suppress(Exception):
        if rdd is not None:
            rdd.unpersist()
    for bc in broadcasts:
        with contextlib.suppress(Exception):
            if bc is not None:
                bc.destroy()


class SparkEngine:
    """Runs pass one and pass two as Spark jobs.

    >>> engine = SparkEngine(SparkOptions(master="local[2]"))     # doctest: +SKIP
    >>> Compactor("s3://bucket/topics/users", engine=engine).run()   # doctest: +SKIP

    Give it a ``session`` to run inside an existing Spark application; otherwise it
    starts one on first use and :meth:`close` stops it.
    """

    name = "spark"
    #: executors read the footers of their own splits; the driver holds summaries
    plans_with_footers = False
    #: Spark sizes its executors itself (spark.executor.memory): --max-memory is refused
    bounds_memory = False
    #: ready() starts the application (seconds): a phase of its own
    starts_application = True

    def __init__(self, options: SparkOptions | None = None, *, session: SparkSession | None = None) -> None:
        self.options = options or SparkOptions()
        self._session = session
        self._owns_session = False
        self._shipped: str | None = None
        self._warming: threading.Thread | None = None

    @property
    def session(self) -> SparkSession:
        if self._session is None:
            # Joining a session someone else started means leaving it running at close.
            self._owns_session = SparkSession.getActiveSession() is None
            self._session, self._shipped = open_session(self.options)
            if self._owns_session:
                # The executors start their Python workers while this process goes on
                # (planning the run, say): see ready().
                self._warming = threading.Thread(target=_warm_quietly, args=(self._session.sparkContext,),
                                                 name="shale-spark-warm-up", daemon=True)
                self._warming.start()
        return self._session

    def ready(self) -> None:
        """Start the application if need be, and wait until the executors that joined it
        have started their Python workers (with Shale imported), so that the first tasks
        of a run pay no start-up; never raises for a failed warm-up (the run's own tasks
        then say what is wrong)."""
        self.session  # noqa: B018
        if self._warming is not None:
            self._warming.join()
            self._warming = None

    def close(self) -> None:
        """Stop the Spark session if this engine started it."""
        self._warming = None
        if self._session is not None and self._owns_session:
            with contextlib.suppress(Exception):
                self._session.stop()
        self._session = None
        if self._shipped is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._shipped)
            self._shipped = None

    def __enter__(self) -> SparkEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_reachable(self, topic: Location) -> None:
        # Executors are other processes, perhaps on other machines: they must see the
        # same objects the driver does.
        if not topic.store.shared_between_processes:
            raise InvalidInputError(f"{topic.uri}: the Spark engine needs storage its executors can reach; "
                                    f"{topic.store.scheme}:// lives inside one process")

    def reduce_partitions(self, records: int, config: CompactionConfig) -> int:
        """Partitions of pass one's shuffle: at least Spark's default parallelism, and
        enough that no reduce task holds more than ``config.max_map_bytes`` of keys (as
        the local engine's key map counts them: 32 bytes a key under event-time order, else
        24) nor four million records."""
        if self.options.reduce_partitions:
            return self.options.reduce_partitions
        key_bytes = EVENT_KEY_BYTES if config.topic_order.by_event_time else KEY_BYTES
        per_task = max(1, min(REDUCE_RECORDS_PER_PARTITION, config.max_map_bytes // key_bytes))
        return max(self.session.sparkContext.defaultParallelism, math.ceil(records / per_task))

    def pass_one(self, plan: Plan, config: CompactionConfig, now_ms: int) -> SparkSurvivors:
        topic = plan.location
        self._check_reachable(topic)
        specs = slice_specs(plan)
        records = sum(s.records for s in plan.slices)
        reports = Reports(len(specs))
        rdd: RDD[tuple[int, bytes]] | None = None
        bc: Broadcast[TaskContext] | None = None
        writes: WriteContext | None = None
        if specs:
            sc = self.session.sparkContext
            tasks = group_splits(specs, self.options.split_bytes, self.options.split_records)
            shipped = topic if self.options.forward_credentials else \
                Location(topic.store.without_credentials(), topic.prefix, topic.uri)
            ctx = TaskContext(shipped,
                              tuple(specs), np.array([sp.base for sp in specs], dtype=np.int64), tuple(tasks),
                              len(plan.compacted), self.reduce_partitions(records, config), self.options.split_bytes,
                              self.options.split_records, now_ms, config, plan.dictionaries,
                              hold_from=plan.hold_from)
            try:
                ctx = self._with_new_keys(ctx, topic)
                bc = sc.broadcast(ctx)
                sc.setJobDescription(f"shale pass one: {topic.uri}")
                rdd = (sc.parallelize(range(len(tasks)), len(tasks))
                       .mapPartitions(functools.partial(_run_map, bc))
                       .partitionBy(ctx.reduce_partitions, _identity)
                       .mapPartitions(functools.partial(_run_reduce, bc))
                       .persist(StorageLevel.MEMORY_AND_DISK))
                raw = _spark_call(rdd.filter(_is_report).collect)
                errors = [v for key, v in raw if key == ERROR_KEY]
                if errors:
                    raise error_from_record(errors[0])
                reports = Reports.gather(len(specs), raw)
                del raw
                writes = plan_writes(ctx, plan, reports, config)
            except BaseException:
                _release(rdd, bc)
                raise
        retain = config.retain_null_key
        return SparkSurvivors(
            plan=plan, records_read=reports.records, keys=reports.keys - reports.tombstones - reports.expired,
            tombstones_kept=reports.tombstones - reports.dropped, tombstones_dropped=reports.dropped,
            tombstones_held=reports.held,
            keyless_kept=reports.keyless if retain else 0, keyless_dropped=0 if retain else reports.keyless,
            footer_bytes=reports.footer_bytes, kept_keyed=reports.kept, map_keys=reports.most_keys,
            map_bytes=reports.most_candidates * candidate_type(config.topic_order).itemsize, rdd=rdd, context=bc,
            writes=writes, keys_expired=reports.expired)

    def _with_new_keys(self, ctx: TaskContext, topic: Location) -> TaskContext:
        """``ctx`` with a Bloom filter of the new records' keys, when the previous parts
        outweigh the new records enough for their tasks to settle most of their own
        records (an incremental run); else ``ctx`` as it is."""
        previous = sum(sp.records for sp in ctx.slices[:ctx.compacted])
        new = sum(sp.records for sp in ctx.slices[ctx.compacted:])
        if not self.options.key_filter or not previous or new * KEY_FILTER_RATIO > previous:
            return ctx
        size = KeyFilter.size_for(new)
        todo = [t for t, (_, i1) in enumerate(ctx.tasks) if i1 > ctx.compacted]
        if not todo:
            return replace(ctx, new_keys=KeyFilter(np.zeros(size // 8, dtype=np.uint8)))
        if new <= DRIVER_FILTER_RECORDS:
            try:  # the same task, in this process, through the driver's own store
                return replace(ctx, new_keys=next(filter_task(replace(ctx, topic=topic), size, todo)))
            finally:
                forget_opened()
        sc = self.session.sparkContext
        sc.setJobDescription(f"shale pass one, new keys: {ctx.topic.uri}")
        bc = sc.broadcast(ctx)
        try:
            filters = sc.parallelize(todo, len(todo)).mapPartitions(functools.partial(_run_filter, bc, size))
            new_keys: KeyFilter = _spark_call(functools.partial(filters.treeReduce, _union))
        finally:
            _release(None, bc)
        return replace(ctx, new_keys=new_keys)

    def pass_two(self, plan: Plan, survivors: SurvivorCounts, config: CompactionConfig, *, topic: Location,
                 run_dir: str, epoch: int, now_ms: int, on_object: Callable[[str], None]) -> PassTwoResult:
        if not isinstance(survivors, SparkSurvivors):
            raise TypeError("the Spark engine's pass two needs the Spark engine's pass one")
        result = PassTwoResult()
        writes = survivors.writes
        if survivors.rdd is None or writes is None:
            return result
        sc = self.session.sparkContext
        sc.setJobDescription(f"shale pass two: {topic.uri}")
        wbc = sc.broadcast(writes)
        try:
            rdd = (survivors.rdd.filter(_is_kept)
                   .flatMap(functools.partial(_run_resplit, wbc))
                   .partitionBy(max(1, len(writes.tasks)), functools.partial(_task_partition, task_of_splits(writes)))
                   .mapPartitionsWithIndex(functools.partial(_run_write, wbc, run_dir, epoch)))
            written = sorted(_spark_call(rdd.collect), key=lambda kv: int(kv[0]))
        finally:
            _release(None, wbc)
        for key, d in written:
            if key == ERROR_KEY:
                raise error_from_record(d)
        for _, d in written:
            result.parts.extend(CompactedPart.from_json(p) for p in d["parts"])
            result.records_written += int(d["records_written"])
            result.records_reused += int(d["records_reused"])
            result.bytes_written += int(d["bytes_written"])
            result.bytes_read += int(d["bytes_read"])
        if result.records_written + result.records_reused != survivors.records_kept:
            # Never publish a ledger that lost records, whatever happened in between.
            raise SparkJobError(f"{topic.uri}: pass two wrote {result.records_written} records and kept "
                                f"{result.records_reused} in place where pass one kept {survivors.records_kept}; "
                                "nothing was published")
        return result

    def release(self, survivors: SurvivorCounts) -> None:
        if isinstance(survivors, SparkSurvivors):
            _release(survivors.rdd, survivors.context)
            survivors.rdd = survivors.context = survivors.writes = None
