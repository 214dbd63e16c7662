"""The Spark engine (driver side): splits the plan, runs the jobs, gathers the parts.

The driver plans, heartbeats and publishes exactly as the local engine does
(:class:`~compactor.job.Compactor`); only the two passes run on executors.  Executors
reach storage through Shale's own storage layer (boto3 for ``s3://``, fsspec for other
schemes), so no Hadoop S3 connector is involved, and they write only under the run's
folder, which the driver removes if the run fails.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from pyspark import RDD, Broadcast, StorageLevel
from pyspark.sql import SparkSession

from shale.compactor.config import CompactionConfig
from shale.compactor.engine import SurvivorCounts
from shale.compactor.pass_two import PassTwoResult
from shale.compactor.plan import Plan, Slice
from shale.compactor.spark.environment import ForwardedEnvironment
from shale.compactor.spark.options import REDUCE_RECORDS_PER_PARTITION, SparkOptions, SparkUnavailableError
from shale.compactor.spark.tasks import (
    ERROR_KEY,
    STATS_KEY,
    SplitSpec,
    TaskContext,
    error_from_record,
    map_task,
    reduce_partition,
    write_task,
)
from shale.ledger.errors import InvalidInputError, ShaleError
from shale.ledger.format import FLAG_HAS_KEY, KIND_COMPACTED, KIND_ORIGINAL
from shale.ledger.storage import Location
from shale.metadata.state import CompactedPart

__all__ = ["SparkEngine", "SparkJobError", "group_splits", "make_splits", "open_session"]

T = TypeVar("T")


class SparkJobError(ShaleError):
    """A Spark job failed for a reason other than a Shale error in a task (an executor
    lost, out of memory, a bad master URL ...)."""


@dataclass(slots=True, eq=False)
class SparkSurvivors:
    """Pass one's counts, and the cached shuffle output pass two reads."""

    plan: Plan
    records_read: int
    keys: int
    tombstones_kept: int
    tombstones_dropped: int
    keyless_kept: int
    keyless_dropped: int
    footer_bytes: int
    kept_keyed: int
    tasks: int
    task_of: npt.NDArray[np.int64]
    rdd: RDD[tuple[int, bytes]] | None
    context: Broadcast[TaskContext] | None

    @property
    def records_kept(self) -> int:
        return self.kept_keyed + self.keyless_kept

    @property
    def deferred_records(self) -> int:
        return 0  # the key map is spread over the reduce partitions: the whole plan is taken

    @property
    def map_keys(self) -> int:
        return 0  # no single map: it lives in the reduce tasks

    @property
    def map_bytes(self) -> int:
        return 0


def make_splits(plan: Plan, split_bytes: int, split_records: int) -> list[SplitSpec]:
    """Cut the plan's slices into splits of at most ``split_bytes`` of entries and
    ``split_records`` records (at least one entry each), at entry boundaries, so each
    entry is copied by exactly one task."""
    out: list[SplitSpec] = []
    base = 0
    for s in plan.slices:
        if s.records <= 0:
            continue
        out.extend(_split_slice(s, base, split_bytes, split_records, plan.location))
        base += s.records
    return out


def _split_slice(s: Slice, base: int, split_bytes: int, split_records: int,
                 topic: Location) -> Iterator[SplitSpec]:
    f = s.file
    foot = f.footer
    # boundary k: where entry k starts (k = n_entries: where the last one ends)
    rec_start = foot.e_rec_start.astype(np.int64)
    offs = foot.col("e_offset").astype(np.int64)
    at = np.append(offs, offs[-1] + int(foot.col("e_length")[-1])) if len(offs) else np.zeros(1, np.int64)
    kind = KIND_COMPACTED if s.compacted else KIND_ORIGINAL
    deletions = topic.key(s.part.deletions) if s.part is not None and s.part.deletions else None
    e = int(foot.entry_of(s.start))  # entry holding the first record
    e_end = int(np.searchsorted(rec_start, s.stop, side="left"))  # boundary at or after the last record
    a = s.start
    while a < s.stop:
        by_bytes = int(np.searchsorted(at, at[e] + split_bytes, side="right")) - 1
        by_records = int(np.searchsorted(rec_start, a + split_records, side="right")) - 1
        nxt = min(max(min(by_bytes, by_records), e + 1), e_end)
        b = min(int(rec_start[nxt]), s.stop)
        yield SplitSpec(f.key, f.ledger_id, kind, a, b, base + a - s.start, int(at[nxt] - at[e]), deletions)
        a, e = b, nxt


def group_splits(splits: list[SplitSpec], split_bytes: int, split_records: int) -> list[tuple[int, int]]:
    """Consecutive splits ``[j0, j1)`` that one task handles together: small ledgers
    share a task up to the same limits as a split."""
    groups: list[tuple[int, int]] = []
    j0, size, recs = 0, 0, 0
    for j, sp in enumerate(splits):
        if j > j0 and (size + sp.bytes > split_bytes or recs + sp.records > split_records):
            groups.append((j0, j))
            j0, size, recs = j, 0, 0
        size += sp.bytes
        recs += sp.records
    if splits:
        groups.append((j0, len(splits)))
    return groups


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


def open_session(options: SparkOptions) -> tuple[SparkSession, str | None]:
    """Start (or join) the Spark session the engine runs in; also return the code zip
    shipped to executors, if any (the caller deletes it when done)."""
    builder = SparkSession.builder.appName(options.app_name)
    # PySpark warns, in the driver and in every Python worker, that it does not fully
    # support the pandas installed: Shale's tasks use no pandas, and a run's standard error
    # is one line per error.  (Workers inherit the filter through the environment.)
    warnings.filterwarnings("ignore", message=_PANDAS_WARNING, category=FutureWarning)
    if _PANDAS_FILTER not in os.environ.get("PYTHONWARNINGS", ""):
        os.environ["PYTHONWARNINGS"] = ",".join(filter(None, (os.environ.get("PYTHONWARNINGS"), _PANDAS_FILTER)))
    master = options.effective_master
    if master is not None:
        builder = builder.master(master)
    if options.is_local:
        # Python workers must run this interpreter, which has Shale and its dependencies.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = builder.config("spark.ui.showConsoleProgress", "false")
        if not any(k == "spark.driver.extraJavaOptions" for k, _ in options.conf):
            log_conf = Path(__file__).with_name("log4j2.properties")
            builder = builder.config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log_conf}")
    for k, v in options.conf:
        builder = builder.config(k, v)
    try:
        session = builder.getOrCreate()
    except Exception as e:
        where = master or "from spark-submit"
        raise SparkUnavailableError(f"cannot start Spark with master {where!r}: {_first_line(e)}") from None
    shipped = None
    if options.ship_code if options.ship_code is not None else not options.is_local:
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


def _identity(k: int) -> int:
    return k


def _is_report(kv: tuple[int, bytes]) -> bool:
    return kv[0] in (STATS_KEY, ERROR_KEY)


def _is_not_stats(kv: tuple[int, bytes]) -> bool:
    return kv[0] != STATS_KEY


def _run_map(bc: Broadcast[TaskContext], it: Iterable[int]) -> Iterator[tuple[int, bytes]]:
    return map_task(bc.value, it)


def _run_reduce(bc: Broadcast[TaskContext], it: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, bytes]]:
    return reduce_partition(bc.value, it)


def _run_write(bc: Broadcast[TaskContext], run_dir: str, epoch: int, t: int,
               it: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, Any]]:
    return write_task(bc.value, run_dir, epoch, t, it)


def _task_partition(task_of: npt.NDArray[np.int64], j: int) -> int:
    return int(task_of[j]) if j >= 0 else 0  # an error record goes to the first task


def _release(rdd: RDD[Any] | None, bc: Broadcast[TaskContext] | None) -> None:
    """Drop the cached shuffle output and destroy the broadcast (whose pickle, on the
    driver's disk, holds the forwarded credentials).  Never raises: this runs while
    another error may be on its way out."""
    with contextlib.suppress(Exception):
        if rdd is not None:
            rdd.unpersist()
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

    def __init__(self, options: SparkOptions | None = None, *, session: SparkSession | None = None) -> None:
        self.options = options or SparkOptions()
        self._session = session
        self._owns_session = False
        self._shipped: str | None = None

    @property
    def session(self) -> SparkSession:
        if self._session is None:
            # Joining a session someone else started means leaving it running at close.
            self._owns_session = SparkSession.getActiveSession() is None
            self._session, self._shipped = open_session(self.options)
        return self._session

    def close(self) -> None:
        """Stop the Spark session if this engine started it."""
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

    def pass_one(self, plan: Plan, config: CompactionConfig, now_ms: int) -> SparkSurvivors:
        topic = plan.location
        self._check_reachable(topic)
        splits = make_splits(plan, self.options.split_bytes, self.options.split_records)
        tasks = group_splits(splits, self.options.split_bytes, self.options.split_records)
        task_of = np.zeros(len(splits), dtype=np.int64)
        for t, (j0, j1) in enumerate(tasks):
            task_of[j0:j1] = t
        # records a deletion vector removed count as neither read nor keyless, as locally
        records = sum(s.records - (int(s.gone.sum()) if s.gone is not None else 0) for s in plan.slices)
        keyless = 0
        for s in plan.slices:
            no_key = (s.file.footer.col("r_flags")[s.start:s.stop] & FLAG_HAS_KEY) == 0
            keyless += int(np.count_nonzero(no_key if s.gone is None else no_key & ~s.gone))
        footer_bytes = sum(s.file.footer_bytes for s in plan.slices)
        counts = {"keys": 0, "tombstones": 0, "dropped": 0, "kept": 0}
        rdd: RDD[tuple[int, bytes]] | None = None
        bc: Broadcast[TaskContext] | None = None
        if splits:
            sc = self.session.sparkContext
            parts = self.options.reduce_partitions or max(
                sc.defaultParallelism, math.ceil((records - keyless) / REDUCE_RECORDS_PER_PARTITION))
            ctx = TaskContext(topic.uri, ForwardedEnvironment.capture(credentials=self.options.forward_credentials),
                              tuple(splits), np.array([sp.base for sp in splits], dtype=np.int64), tuple(tasks),
                              task_of, parts, now_ms, config, plan.dictionaries)
            bc = sc.broadcast(ctx)
            try:
                sc.setJobDescription(f"shale pass one: {topic.uri}")
                rdd = (sc.parallelize(range(len(tasks)), len(tasks))
                       .mapPartitions(functools.partial(_run_map, bc))
                       .partitionBy(parts, _identity)
                       .mapPartitions(functools.partial(_run_reduce, bc))
                       .persist(StorageLevel.MEMORY_AND_DISK))
                reports = _spark_call(rdd.filter(_is_report).collect)
                errors = [raw for key, raw in reports if key == ERROR_KEY]
                if errors:
                    raise error_from_record(errors[0])
            except BaseException:
                _release(rdd, bc)
                raise
            for _key, raw in reports:
                for k, v in json.loads(raw).items():
                    counts[k] += int(v)
        retain = config.retain_null_key
        return SparkSurvivors(
            plan=plan, records_read=records, keys=counts["keys"] - counts["tombstones"],
            tombstones_kept=counts["tombstones"] - counts["dropped"], tombstones_dropped=counts["dropped"],
            keyless_kept=keyless if retain else 0, keyless_dropped=0 if retain else keyless,
            footer_bytes=footer_bytes, kept_keyed=counts["kept"], tasks=len(tasks), task_of=task_of, rdd=rdd,
            context=bc)

    def pass_two(self, plan: Plan, survivors: SurvivorCounts, config: CompactionConfig, *, topic: Location,
                 run_dir: str, epoch: int, now_ms: int, on_object: Callable[[str], None]) -> PassTwoResult:
        if not isinstance(survivors, SparkSurvivors):
            raise TypeError("the Spark engine's pass two needs the Spark engine's pass one")
        result = PassTwoResult()
        if survivors.rdd is None or survivors.context is None:
            return result
        sc = self.session.sparkContext
        sc.setJobDescription(f"shale pass two: {topic.uri}")
        rdd = (survivors.rdd.filter(_is_not_stats)
               .partitionBy(survivors.tasks, functools.partial(_task_partition, survivors.task_of))
               .mapPartitionsWithIndex(functools.partial(_run_write, survivors.context, run_dir, epoch)))
        written = sorted(_spark_call(rdd.collect), key=lambda kv: int(kv[0]))
        for key, d in written:
            if key == ERROR_KEY:
                raise error_from_record(d)
        for _, d in written:
            result.parts.extend(CompactedPart.from_json(p) for p in d["parts"])
            result.records_written += int(d["records_written"])
            result.bytes_written += int(d["bytes_written"])
            result.bytes_read += int(d["bytes_read"])
        if result.records_written != survivors.records_kept:
            # Never publish a ledger that lost records, whatever happened in between.
            raise SparkJobError(f"{topic.uri}: pass two wrote {result.records_written} records where pass one "
                                f"kept {survivors.records_kept}; nothing was published")
        return result

    def release(self, survivors: SurvivorCounts) -> None:
        if isinstance(survivors, SparkSurvivors):
            _release(survivors.rdd, survivors.context)
            survivors.rdd = survivors.context = None
