"""The Spark engine (driver side): splits the plan, runs the jobs, gathers the parts.

The driver plans, heartbeats and publishes exactly as the local engine does
(:class:`~shale.compactor.job.Compactor`); only the two passes run on executors, as
DataFrame plans of Arrow-native Python functions (:mod:`~shale.compactor.spark.frames`),
so the same code runs in a classic session and as a Spark Connect client.  Executors
reach storage through Shale's own storage layer (boto3 for ``s3://``, fsspec for other
schemes), so no Hadoop S3 connector is involved, and they write only under the run's
folder, which the driver removes if the run fails.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Final

import numpy as np

from shale.compactor.config import CompactionConfig
from shale.compactor.engine import SurvivorCounts
from shale.compactor.keyfilter import KeyFilter
from shale.compactor.keymap import EVENT_KEY_BYTES, KEY_BYTES
from shale.compactor.pass_two import PassTwoResult
from shale.compactor.plan import Plan
from shale.compactor.spark import frames
from shale.compactor.spark.newkeys import filter_task
from shale.compactor.spark.options import REDUCE_RECORDS_PER_PARTITION, SparkJobError, SparkOptions
from shale.compactor.spark.session import (
    DAEMON_MODULE,
    active_session,
    open_session,
    spark_call,
    stop_session,
    tagged,
    worker_settings,
)
from shale.compactor.spark.shuffle import Kind
from shale.compactor.spark.splits import Reports, plan_writes, slice_specs
from shale.compactor.spark.tasks import TaskContext, candidate_bytes, error_from_record, forget_opened, group_splits
from shale.compactor.spark.writes import WriteContext
from shale.ledger.errors import InvalidInputError
from shale.ledger.values import dataclass
from shale.metadata.state import CompactedPart
from shale.storage import Location

__all__ = ["DAEMON_MODULE", "SparkEngine", "SparkJobError", "open_session", "warm_executors", "worker_settings"]

#: A filter of new keys is built when the previous parts hold at least this many times
#: the new records: below that, most of the parts' records would be shuffled anyway.
KEY_FILTER_RATIO: Final = 4
#: An incremental run of at most this many new records has the driver build the filter
#: of their keys, reading their footers one at a time (a few MiB each), rather than a
#: Spark job of its own, whose fixed cost outweighs the work for so few.
DRIVER_FILTER_RECORDS: Final = 256 * 1024

#: The tags of the engine's Spark jobs (``spark.job.tags``).
TAG_WARM_UP: Final = "shale-warm-up"
TAG_NEW_KEYS: Final = "shale-new-keys"
TAG_PASS_ONE: Final = "shale-pass-one"
TAG_PASS_TWO: Final = "shale-pass-two"


@dataclass(slots=True, eq=False)
class SparkSurvivors:
    """Pass one's counts, its cached output pass two reads, and the splits pass two
    writes (cut by the map tasks, which read the footers)."""

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
    frame: Any  # pass one's cached output (a DataFrame), or None
    writes: WriteContext | None
    keys_expired: int = 0
    candidates: int = 0  # sent through pass one's shuffle

    @property
    def records_kept(self) -> int:
        return self.kept_keyed + self.keyless_kept

    @property
    def deferred_records(self) -> int:
        return 0  # more reduce partitions bound each task's memory: the whole plan is taken


def warm_executors(session: Any) -> int:
    """Run one task per core of the application, doing nothing: each executor it reaches
    starts its Python daemon and a worker (with Shale's modules imported: unpickling this
    task's function imports the engine's modules, and the daemon has them already) and
    loads the classes its first task needs, which every executor's first task otherwise
    pays in the middle of a run.  Executors that join later, or that this job's tasks
    miss (they go where a core is free), start theirs on their first task.  Returns the
    number of tasks: Spark's default parallelism."""
    with tagged(session, TAG_WARM_UP):
        return spark_call(lambda: frames.count_tasks(session))


def _release(frame: Any) -> None:
    """Drop pass one's cached output.  Never raises: this runs while another error may be
    on its way out."""
    with contextlib.suppress(Exception):
        if frame is not None:
            frame.unpersist()


class SparkEngine:
    """Runs pass one and pass two as Spark jobs.

    >>> engine = SparkEngine(SparkOptions(master="local[2]"))     # doctest: +SKIP
    >>> Compactor("s3://bucket/topics/users", engine=engine).run()   # doctest: +SKIP

    Give it a ``session`` (classic, or a Spark Connect client) to run inside an existing
    Spark application; otherwise it starts one on first use and :meth:`close` stops it.
    """

    name = "spark"
    #: executors read the footers of their own splits; the driver holds summaries
    plans_with_footers = False
    #: Spark sizes its executors itself (spark.executor.memory): --max-memory is refused
    bounds_memory = False
    #: ready() starts the application (seconds): a phase of its own
    starts_application = True

    def __init__(self, options: SparkOptions | None = None, *, session: Any = None) -> None:
        self.options = options or SparkOptions()
        self._session = session
        self._owns_session = False
        self._shipped: str | None = None
        self._warming: threading.Thread | None = None
        self._parallelism: int | None = None
        #: the tags of the Spark jobs this engine ran, in order
        self.jobs: list[str] = []

    @property
    def session(self) -> Any:
        if self._session is None:
            # Joining a session someone else started means leaving it running at close.
            self._owns_session = active_session() is None
            self._session, self._shipped = open_session(self.options)
            if self._owns_session:
                # The executors start their Python workers while this process goes on
                # (planning the run, say): see ready().
                self._warming = threading.Thread(target=self._warm_quietly, name="shale-spark-warm-up", daemon=True)
                self._warming.start()
        return self._session

    def _warm_quietly(self) -> None:
        with contextlib.suppress(Exception):
            self._parallelism = warm_executors(self._session)

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
            stop_session(self._session)
        self._session = None
        if self._shipped is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._shipped)
            self._shipped = None

    def __enter__(self) -> SparkEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, tag: str, fn: Callable[[], Any]) -> Any:
        """Run a Spark action under ``tag``."""
        self.jobs.append(tag)
        with tagged(self.session, tag):
            return spark_call(fn)

    def _check_reachable(self, topic: Location) -> None:
        # Executors are other processes, perhaps on other machines: they must see the
        # same objects the driver does.
        if not topic.store.shared_between_processes:
            raise InvalidInputError(f"{topic.uri}: the Spark engine needs storage its executors can reach; "
                                    f"{topic.store.scheme}:// lives inside one process")

    def parallelism(self) -> int:
        """Spark's default parallelism (the application's cores), learned from the warm-up
        or, in a session joined without one, from a job of one task per core."""
        self.ready()
        if self._parallelism is None:
            self._parallelism = int(self._run(TAG_WARM_UP, lambda: frames.count_tasks(self.session)))
        return self._parallelism

    def reduce_partitions(self, records: int, config: CompactionConfig) -> int:
        """Partitions of pass one's shuffle: at least Spark's default parallelism, and
        enough that no reduce task holds more than ``config.max_map_bytes`` of keys (as
        the local engine's key map counts them: 32 bytes a key under event-time order, else
        24) nor four million records."""
        if self.options.reduce_partitions:
            return self.options.reduce_partitions
        key_bytes = EVENT_KEY_BYTES if config.topic_order.by_event_time else KEY_BYTES
        per_task = max(1, min(REDUCE_RECORDS_PER_PARTITION, config.max_map_bytes // key_bytes))
        return max(self.parallelism(), math.ceil(records / per_task))

    def pass_one(self, plan: Plan, config: CompactionConfig, now_ms: int) -> SparkSurvivors:
        topic = plan.location
        self._check_reachable(topic)
        specs = slice_specs(plan)
        reports = Reports(len(specs))
        frame: Any = None
        writes: WriteContext | None = None
        if specs:
            tasks = group_splits(specs, self.options.split_bytes, self.options.split_records)
            shipped = topic if self.options.forward_credentials else \
                Location(topic.store.without_credentials(), topic.prefix, topic.uri)
            ctx = TaskContext(shipped,
                              tuple(specs), np.array([sp.base for sp in specs], dtype=np.int64), tuple(tasks),
                              len(plan.compacted), self.reduce_partitions(sum(s.records for s in plan.slices), config),
                              self.options.split_bytes, self.options.split_records, now_ms, config, plan.dictionaries,
                              hold_from=plan.hold_from)
            try:
                ctx = self._with_new_keys(ctx, topic)
                frame = frames.pass_one(self.session, ctx)
                rows = self._run(TAG_PASS_ONE, lambda: frames.collect_rows(
                    frame.filter(f"kind != {Kind.KEPT.value}")))
                errors = [data for kind, _, data in rows if kind == Kind.ERROR]
                if errors:
                    raise error_from_record(errors[0])
                reports = Reports.gather(len(specs), ((kind, data) for kind, _, data in rows))
                del rows
                writes = plan_writes(ctx, plan, reports, config)
            except BaseException:
                _release(frame)
                raise
        retain = config.retain_null_key
        return SparkSurvivors(
            plan=plan, records_read=reports.records, keys=reports.keys - reports.tombstones - reports.expired,
            tombstones_kept=reports.tombstones - reports.dropped, tombstones_dropped=reports.dropped,
            tombstones_held=reports.held,
            keyless_kept=reports.keyless if retain else 0, keyless_dropped=0 if retain else reports.keyless,
            footer_bytes=reports.footer_bytes, kept_keyed=reports.kept, map_keys=reports.most_keys,
            map_bytes=reports.most_candidates * candidate_bytes(config.topic_order), frame=frame,
            writes=writes, keys_expired=reports.expired, candidates=reports.candidates)

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
        new_keys = self._run(TAG_NEW_KEYS, lambda: frames.filter_of_new_keys(self.session, ctx, size, todo))
        return replace(ctx, new_keys=new_keys)

    def pass_two(self, plan: Plan, survivors: SurvivorCounts, config: CompactionConfig, *, topic: Location,
                 run_dir: str, epoch: int, now_ms: int, on_object: Callable[[str], None]) -> PassTwoResult:
        if not isinstance(survivors, SparkSurvivors):
            raise TypeError("the Spark engine's pass two needs the Spark engine's pass one")
        result = PassTwoResult()
        writes = survivors.writes
        if survivors.frame is None or writes is None:
            return result
        frame = frames.pass_two(self.session, survivors.frame, writes, run_dir, epoch)
        written = sorted(self._run(TAG_PASS_TWO, lambda: frames.collect_rows(frame)), key=lambda row: row[1])
        for kind, _, data in written:
            if kind == Kind.ERROR:
                raise error_from_record(data)
        for _, _, data in written:
            d = json.loads(data)
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
            _release(survivors.frame)
            survivors.frame = survivors.writes = None
