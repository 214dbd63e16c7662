"""Engines run the two passes of a planned compaction; the run around them is shared.

Planning, the heartbeat, the publish and garbage collection happen in
:class:`~shale.compactor.job.Compactor` on one machine whatever the engine, so both engines
publish through the same compare-and-swap and are judged by the same rules.  The local
engine runs both passes in this process; the Spark engine
(:mod:`shale.compactor.spark`) runs them as Spark jobs.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Final, Protocol

from shale.compactor import workers as pass_two_workers
from shale.compactor.config import CompactionConfig
from shale.compactor.pass_one import Survivors, pass_one
from shale.compactor.pass_two import PassTwoResult, decide_work, write_parts, write_vectors
from shale.compactor.plan import Plan
from shale.ledger.errors import InvalidInputError
from shale.runtime.cpus import worker_count
from shale.settings import Settings
from shale.storage import Location

__all__ = ["SPARK_ONLY", "Engine", "LocalEngine", "SurvivorCounts", "engine_for"]


class SurvivorCounts(Protocol):
    """What pass one reports, whatever engine ran it.

    ``plan`` is the plan pass two must write and the run publishes: the one pass one was
    given, or a shorter one when pass one could not take all of it (``deferred_records``
    are then left above the new horizon for the next run).
    """

    @property
    def plan(self) -> Plan: ...
    @property
    def deferred_records(self) -> int: ...
    @property
    def records_read(self) -> int: ...
    @property
    def records_kept(self) -> int: ...
    @property
    def keys(self) -> int: ...
    @property
    def tombstones_kept(self) -> int: ...
    @property
    def tombstones_dropped(self) -> int: ...
    @property
    def tombstones_held(self) -> int: ...
    @property
    def keys_expired(self) -> int: ...
    @property
    def keyless_kept(self) -> int: ...
    @property
    def keyless_dropped(self) -> int: ...
    @property
    def footer_bytes(self) -> int: ...
    @property
    def map_keys(self) -> int: ...
    @property
    def map_bytes(self) -> int: ...


class Engine(Protocol):
    """Runs pass one and pass two of a plan, and says what it can do, so that its callers
    never tell engines apart by name."""

    name: str
    #: whether the plan should hold every footer (else the engine reads them where it
    #: runs, and the plan holds only what the metadata says of each object)
    plans_with_footers: bool
    #: whether a run's memory bound (``--max-memory``) holds with it: its passes run in this
    #: process, sized from the bound (a setting it would ignore is refused up front)
    bounds_memory: bool
    #: whether :meth:`ready` starts an application (seconds): a phase of the run of its own,
    #: told and timed, whose own output lines go with the run's logs
    starts_application: bool

    def ready(self) -> None:
        """Make the engine ready to run passes (start its application, warm its workers);
        called once, before the first topic."""

    def close(self) -> None:
        """Release what the engine holds (stop an application it started); called once the
        run is over."""

    def pass_one(self, plan: Plan, config: CompactionConfig, now_ms: int) -> SurvivorCounts:
        """Decide which records of ``plan`` survive; nothing is written."""

    def pass_two(self, plan: Plan, survivors: SurvivorCounts, config: CompactionConfig, *, topic: Location,
                 run_dir: str, epoch: int, now_ms: int, on_object: Callable[[str], None]) -> PassTwoResult:
        """Write the survivors as compacted parts under ``run_dir``; return them in id order.

        Every object written lies under ``run_dir``, so a failed run is cleaned up by
        removing that folder.
        """

    def release(self, survivors: SurvivorCounts) -> None:
        """Free what pass one holds (called once the run no longer needs it)."""


class LocalEngine:
    """Pass one in this process (NumPy over footers), pass two a raw byte copy in this
    process or, for big runs, in forked worker processes (:mod:`shale.compactor.workers`)."""

    name = "local"
    plans_with_footers = True
    bounds_memory = True
    starts_application = False

    def ready(self) -> None:
        pass  # (nothing to start)

    def close(self) -> None:
        pass  # (nothing held)

    def pass_one(self, plan: Plan, config: CompactionConfig, now_ms: int) -> Survivors:
        if (worker_count(config.workers) > 1
                and sum(s.raw_data_bytes() for s in plan.slices) >= pass_two_workers.MIN_PARALLEL_BYTES):
            pass_two_workers.import_ahead()  # pass two will likely fork workers: its imports meanwhile
        return pass_one(plan, config, now_ms)

    def pass_two(self, plan: Plan, survivors: SurvivorCounts, config: CompactionConfig, *, topic: Location,
                 run_dir: str, epoch: int, now_ms: int, on_object: Callable[[str], None]) -> PassTwoResult:
        if not isinstance(survivors, Survivors):
            raise TypeError("the local engine's pass two needs the local engine's pass one")
        work, vectors = decide_work(plan, survivors, config, run_dir=run_dir, on_object=on_object)
        processes = worker_count(config.workers)
        if (processes > 1 and topic.store.process_safe
                and sum(map(pass_two_workers.work_bytes, work)) >= pass_two_workers.MIN_PARALLEL_BYTES):
            write_vectors(topic, vectors)  # before forking: no thread may run across a fork
            return pass_two_workers.write_parts_in_workers(work, config, processes, topic=topic, run_dir=run_dir,
                                                           epoch=epoch, now_ms=now_ms, on_object=on_object)
        if not vectors:
            return write_parts(work, config, topic=topic, run_dir=run_dir, epoch=epoch, now_ms=now_ms,
                               on_object=on_object)
        # The deletion vectors are written while the copy runs (an incremental run's
        # writes are mostly these and the new survivors).  Whatever happens to the copy,
        # they are waited for, so that a failed run's clean-up finds everything it wrote.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="shale-deletions") as pool:
            vectors_written = pool.submit(write_vectors, topic, vectors)
            out = write_parts(work, config, topic=topic, run_dir=run_dir, epoch=epoch, now_ms=now_ms,
                              on_object=on_object)
        vectors_written.result()
        return out

    def release(self, survivors: SurvivorCounts) -> None:
        pass


#: The settings that only the Spark engine takes.
SPARK_ONLY: Final = ("spark-master", "spark-remote", "spark-conf", "spark-split-size", "no-forward-credentials")


def engine_for(settings: Settings) -> Engine:
    """The engine ``compact``'s resolved ``settings`` ask for (``engine``, and Spark's own
    settings), not started.  A setting the engine would ignore is bad usage, named as it
    was given: a Spark setting without ``--engine spark``, and ``--max-memory`` with an
    engine that does not bound memory (Spark sizes its executors itself)."""
    given = [settings[n] for n in SPARK_ONLY if settings.value(n) not in (None, [], False)]
    if settings.value("engine") == "local":
        if given:
            raise InvalidInputError(f"{given[0].given_as} needs --engine spark")
        return LocalEngine()
    from shale.compactor.spark import SparkOptions, require_pyspark
    from shale.compactor.spark.options import DEFAULT_SPLIT_BYTES

    require_pyspark()
    from shale.compactor.spark.engine import SparkEngine

    if settings.value("max-memory") is not None and not SparkEngine.bounds_memory:
        raise InvalidInputError(f"{settings['max-memory'].given_as} bounds the local engine's memory; --engine spark "
                                "would ignore it (Spark's executors are sized by spark.executor.memory): drop it, or "
                                "use --engine local")
    split = settings.value("spark-split-size")
    return SparkEngine(SparkOptions(master=settings.value("spark-master"), remote=settings.value("spark-remote"),
                                    conf=tuple(settings.value("spark-conf")),
                                    split_bytes=DEFAULT_SPLIT_BYTES if split is None else split,
                                    forward_credentials=not settings.value("no-forward-credentials")))
