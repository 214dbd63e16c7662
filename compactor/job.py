"""One compaction run: plan → pass one → pass two → publish → garbage collection.

The new compacted ledger is written under a fresh run folder that no state refers to,
so readers cannot see it until the single compare-and-swap that publishes
``(horizon, compacted ledger, epoch)``.  A run that loses that race deletes its own
output and reports ``conflict``.  While writing, a heartbeat object in the run folder
keeps garbage collection from mistaking the run for a crashed one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Final

from shale.compactor.budget import bounded
from shale.compactor.config import MIN_ORPHAN_GRACE_MS, CompactionConfig
from shale.compactor.engine import Engine, LocalEngine, SurvivorCounts
from shale.compactor.hold import subscription_hold, tombstones_drop, with_hold
from shale.compactor.pass_two import PassTwoResult
from shale.compactor.plan import Plan, make_plan, open_slice
from shale.compactor.summary import RunStatus, RunSummary
from shale.ledger.errors import (
    ConflictError,
    InvalidInputError,
    ObjectNotFoundError,
    ShaleError,
    StateUnknownError,
    TransientStorageError,
)
from shale.ledger.format import FLAG_HAS_KEY
from shale.ledger.ordering import decoded_times
from shale.maintenance.gc import collect_garbage
from shale.maintenance.snapshots import succeed
from shale.metadata.dictionaries import resolve_compression
from shale.metadata.handle import Topic
from shale.metadata.layout import COMPACTED_DIR, HEARTBEAT_NAME
from shale.metadata.requirements import AssertEpoch, AssertTopicGeneration, RequirementFailedError
from shale.metadata.state import CompactionState
from shale.metadata.topic import TopicMetadata
from shale.runtime import interrupts
from shale.settings.units import count
from shale.storage import StorageOptions

__all__ = ["Compactor"]

HEARTBEAT_INTERVAL_S: Final = 30.0
#: A run whose heartbeat could not be refreshed for this long publishes nothing.
HEARTBEAT_MAX_GAP_S: Final = MIN_ORPHAN_GRACE_MS / 1000 / 3


class _Heartbeat:
    """Rewrites ``<run>/_run.json`` every few seconds while the run writes its output."""

    def __init__(self, meta: TopicMetadata, run_dir: str, info: dict[str, object]) -> None:
        self.meta, self.key = meta, meta.topic.key(f"{run_dir}/{HEARTBEAT_NAME}")
        self.info = info
        self.last_ok = 0.0
        self.went_stale = False  # sticky: a gap that was too long once cannot be undone
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="shale-heartbeat", daemon=True)

    def beat(self) -> None:
        body = json.dumps({**self.info, "heartbeat_ms": int(time.time() * 1000)}).encode()
        # Not synced: garbage collection reads only its age, and a crash that could lose
        # it ends the run anyway.
        self.meta.topic.store.put(self.key, body, durable=False)
        self.last_ok = time.monotonic()

    def _loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_INTERVAL_S):
            if time.monotonic() - self.last_ok >= HEARTBEAT_MAX_GAP_S:
                self.went_stale = True
            try:
                self.beat()
            except ShaleError:
                pass  # judged at publish time through last_ok and went_stale

    def start(self) -> None:
        self.beat()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def healthy(self) -> bool:
        return not self.went_stale and time.monotonic() - self.last_ok < HEARTBEAT_MAX_GAP_S


def _note_plan(summary: RunSummary, plan: Plan) -> None:
    prev = plan.previous
    summary.previous_horizon = str(prev.horizon) if prev.horizon else None
    summary.horizon = str(plan.horizon) if plan.horizon else None
    summary.epoch = prev.epoch
    summary.compacted_ledger = prev.compacted_ledger
    summary.dirty_ratio = plan.dirty_ratio
    summary.held_back_records = plan.held_back_records
    summary.ledgers_read = plan.ledgers_read
    summary.keys = prev.keys
    summary.tombstones_kept = prev.tombstones


def _note_survivors(summary: RunSummary, survivors: SurvivorCounts) -> None:
    summary.deferred_records = survivors.deferred_records
    summary.map_keys = survivors.map_keys
    summary.map_bytes = survivors.map_bytes
    summary.records_read = survivors.records_read
    summary.bytes_read = survivors.footer_bytes
    summary.keys = survivors.keys
    summary.tombstones_kept = survivors.tombstones_kept
    summary.tombstones_dropped = survivors.tombstones_dropped
    summary.tombstones_held = survivors.tombstones_held
    summary.keyless_dropped = survivors.keyless_dropped
    summary.keyless_kept = survivors.keyless_kept
    summary.keys_expired = survivors.keys_expired


def _replaced_bytes(plan: Plan, out: PassTwoResult) -> int:
    """Stored bytes of what the run's parts replace in the compacted view: each ledger's
    share up to the new horizon (in proportion to its records) and every previous part
    not kept in place."""
    kept = {p.object for p in out.parts}
    parts = sum(s.part.bytes for s in plan.compacted if s.part is not None and s.part.object not in kept)
    return parts + sum(s.object.bytes * s.records // max(s.object.records, 1) for s in plan.new)


def _check_order(uri: str, plan: Plan, config: CompactionConfig) -> None:
    """Refuse to compact a view in another order than it was compacted in, unless the run
    rewrites it: records the view dropped under its order cannot be weighed again."""
    was, now = plan.previous.order.order, config.order
    if plan.previous.horizon is None or was == now or config.rewrite:
        return
    ledgers = plan.topic.ledgers
    size = sum(lg.bytes for lg in ledgers)
    raise InvalidInputError(
        f"{uri}: the compacted view is in {was} order; compacting it in {now} order needs --rewrite, which reads "
        f"all {count(len(ledgers), 'ledger')} still kept ({size / 1e6:,.1f} MB) and the compacted view, and writes the "
        f"view again (records retention already removed count only as the view kept them)")


class Compactor:
    """Compacts one topic (on stores opened with ``storage_options``, read from the
    environment when not given).

    >>> summary = Compactor("/data/topics/users").run()      # doctest: +SKIP
    >>> summary.status, summary.horizon                       # doctest: +SKIP
    ('compacted', '12:99:0')
    """

    def __init__(self, topic: str | TopicMetadata | Topic, config: CompactionConfig | None = None, *,
                 metadata_uri: str | None = None, clock: Callable[[], float] | None = None,
                 progress: Callable[[str], None] | None = None, engine: Engine | None = None,
                 storage_options: StorageOptions | None = None) -> None:
        """``topic``: its URI (its metadata under ``metadata_uri``, by default in the
        topic's own ``_meta`` folder, reached with ``storage_options``, by default from the
        environment), its metadata already opened, or its handle (:class:`~shale.metadata.handle.Topic`:
        the first run plans from the documents it holds, read once for the whole run)."""
        self.topic = (topic if isinstance(topic, Topic)
                      else Topic(topic) if isinstance(topic, TopicMetadata)
                      else Topic.open(topic, metadata_uri, storage_options))
        self.meta = self.topic.meta
        self._runs = 0
        self.config = config or CompactionConfig()
        self.engine: Engine = engine or LocalEngine()
        self.clock = clock
        self._offset_ms: int | None = None
        self.progress = progress or (lambda _msg: None)

    def _now_ms(self) -> int:
        """Now, by this machine's clock (or ``clock``): what the minimum compaction lag and
        tombstone retention compare with the times producers and earlier runs stamped."""
        return int((self.clock or time.time)() * 1000)

    def _store_now_ms(self) -> int:
        """Now, by the store's clock: this machine's clock corrected by the store's, which
        is measured once per run.  Retirement stamps and garbage collection compare with
        ages the store stamped, so a skewed local clock cannot make anything look old
        (``clock``, when given, is used as it is)."""
        if self.clock is not None:
            return int(self.clock() * 1000)
        if self._offset_ms is None:
            before = time.time()
            store_now = self.meta.now_ms()
            self._offset_ms = store_now - int((before + time.time()) * 500)
        return int(time.time() * 1000) + self._offset_ms

    def run(self) -> RunSummary:
        """Run once; conflicts and skips are reported in the summary, errors are raised."""
        summary = RunSummary(self.meta.uri, engine=self.engine.name)
        t0 = time.perf_counter()
        timings = summary.durations

        def phase(name: str, start: float) -> float:
            now = time.perf_counter()
            timings[name] = now - start
            return now

        now_ms = self._now_ms()
        plan = self._plan(now_ms)
        t = phase("plan", t0)
        _note_plan(summary, plan)
        _check_order(self.meta.uri, plan, self.config)
        # a rewrite, or a change of key TTL, is a run even with nothing new to read
        changed = self.config.rewrite or (plan.previous.horizon is not None
                                          and plan.previous.order != self.config.topic_order)

        def done(status: RunStatus, message: str = "", *, gc: bool = True) -> RunSummary:
            if gc:
                self._gc(summary)
            summary.durations["total"] = time.perf_counter() - t0
            return summary.finish(status, message)

        if plan.new_records == 0 and not changed and not tombstones_drop(self.meta, plan, self.config, now_ms) \
                and not self._keys_expire(plan, now_ms):
            why = "no records above the horizon"
            if plan.held_back_records:
                why += f" old enough to compact ({plan.held_back_records} held back by the minimum lag)"
            return done(RunStatus.NOTHING_TO_DO, why)
        # A run that stopped short because its key map was full is continued whatever
        # the ratio: the rest of its backlog is owed, not optional.
        owed = bool(plan.previous.last_run.get("deferred_records"))
        if plan.new_records and not owed and not changed and plan.dirty_ratio < self.config.min_dirty_ratio:
            return done(RunStatus.SKIPPED,
                        f"dirty ratio {plan.dirty_ratio:.3f} is below {self.config.min_dirty_ratio:.3f}")
        self.config = bounded(self.config, plan) if self.engine.bounds_memory else self.config  # to --max-memory
        self.progress(f"pass one over {sum(s.records for s in plan.slices):,} records")
        try:
            survivors = self.engine.pass_one(plan, self.config, now_ms)
        except ObjectNotFoundError:
            # An engine that re-reads footers (Spark) can meet the same race as pass two.
            if self.topic.read_compaction().version == plan.previous.version:
                raise
            summary.horizon = summary.previous_horizon
            return done(RunStatus.CONFLICT, "another compactor replaced the compacted ledger this run was reading",
                        gc=False)
        try:
            return self._write_and_publish(plan, survivors, summary, now_ms, t, phase, done)
        finally:
            self.engine.release(survivors)

    def _plan(self, now_ms: int) -> Plan:
        """This run's plan, from the documents the topic's handle holds (a later run of this
        compactor reads the topic as it is then), with the tombstones subscriptions hold."""
        if self._runs:
            self.topic.forget()
        self._runs += 1
        self.progress("planning")
        # zstd-dict writes with the topic's newest dictionary: given to the config here, so
        # that worker processes and Spark tasks get it with the config
        self.config = dataclasses.replace(self.config, compression=resolve_compression(self.meta,
                                                                                       self.config.compression))
        plan = make_plan(self.meta, now_ms=now_ms, min_compaction_lag_ms=self.config.min_compaction_lag_ms,
                         footers=self.engine.plans_with_footers, rewrite=self.config.rewrite,
                         topic=self.topic.state, previous=self.topic.compaction)
        self.topic.keep(plan.topic)
        return with_hold(self.meta, plan, subscription_hold(self.topic, self.config, now_ms))  # held tombstones

    def _write_and_publish(self, plan: Plan, survivors: SurvivorCounts, summary: RunSummary, now_ms: int,
                           t: float, phase: Callable[[str, float], float],
                           done: Callable[..., RunSummary]) -> RunSummary:
        plan = survivors.plan  # shorter than asked when the key map filled up
        prev = plan.previous
        t = phase("pass_one", t)
        _note_survivors(summary, survivors)
        summary.horizon = str(plan.horizon) if plan.horizon else None
        summary.ledgers_read = plan.ledgers_read
        if self.config.dry_run:
            summary.records_written, summary.epoch = survivors.records_kept, prev.epoch + 1
            return done(RunStatus.DRY_RUN, "nothing written or published", gc=False)

        epoch = prev.epoch + 1
        run_id, run_dir, heartbeat = self._new_run(epoch, summary.horizon, now_ms)
        written: list[str] = [f"{run_dir}/{HEARTBEAT_NAME}"]
        remove_output = True  # until the publish outcome says otherwise
        try:
            heartbeat.start()
            # the records the run keeps, written anew or kept in place: as its summary counts them
            self.progress(f"pass two: keeping {survivors.records_kept:,} records")
            try:
                out = self.engine.pass_two(plan, survivors, self.config, topic=self.meta.topic, run_dir=run_dir,
                                           epoch=epoch, now_ms=now_ms, on_object=written.append)
            except ObjectNotFoundError:
                if self.topic.read_compaction().version == prev.version:
                    raise
                # Another compactor published and its garbage collection removed the
                # compacted ledger this run was reading: the same race, lost earlier.
                summary.horizon = summary.previous_horizon
                return done(RunStatus.CONFLICT, "another compactor replaced the compacted ledger this run was reading; "
                            "this run's output was removed", gc=False)
            self._write_caches(out, run_dir, written)
            t = phase("pass_two", t)
            self._note_output(summary, out, survivors)
            summary.bytes_replaced = _replaced_bytes(plan, out)
            heartbeat.stop()
            if not heartbeat.healthy():
                summary.horizon = summary.previous_horizon
                return done(RunStatus.CONFLICT, "the run's heartbeat went stale, so garbage collection may have taken "
                            "its output; nothing was published", gc=False)
            self.progress("publishing")
            new_state = self._new_state(plan, survivors, out, run_id, epoch, summary, now_ms)
            remove_output = False  # from here a failure may have published: never remove on a guess
            with interrupts.deferring():  # an interrupt lets the swap finish: its outcome is then known
                lost = self._publish(new_state, prev, run_id)
            t = phase("publish", t)
            if lost:
                remove_output = True
                summary.horizon = summary.previous_horizon
                return done(RunStatus.CONFLICT, lost, gc=False)
            summary.epoch = epoch
            summary.compacted_ledger = run_id
        finally:
            heartbeat.stop()
            if remove_output:
                self._remove(run_dir, written)
        return self._after_publish(summary, run_dir, t, phase, done)

    def _write_caches(self, out: PassTwoResult, run_dir: str, written: list[str]) -> None:
        """The Arrow caches of the parts pass two wrote, when the policy asks for them."""
        if self.config.arrow_cache:
            from shale.compactor.arrow_caches import write_arrow_caches

            self.progress("pass two: writing the parts' Arrow caches")
            write_arrow_caches(self.meta, out, run_dir, written.append)

    def _after_publish(self, summary: RunSummary, run_dir: str, t: float, phase: Callable[[str, float], float],
                       done: Callable[..., RunSummary]) -> RunSummary:
        """A published run: its heartbeat removed, then garbage collection (unless an
        interrupt came: the epoch is published, collecting is left to the next run)."""
        with contextlib.suppress(ShaleError):  # published: a leftover is collected as unreferenced
            self.meta.topic.store.delete(self.meta.topic.key(f"{run_dir}/{HEARTBEAT_NAME}"))
        interrupts.check(f"{self.meta.uri}: published epoch {summary.epoch} (horizon {summary.horizon}) before it "
                         "stopped; garbage collection is left to the next run")
        self._gc(summary)
        phase("gc", t)
        more = (f"the key map was full: {summary.deferred_records:,} newer records are left for the next run"
                if summary.deferred_records else "")
        return done(RunStatus.COMPACTED, more, gc=False)

    def _new_run(self, epoch: int, horizon: str | None, now_ms: int) -> tuple[str, str, _Heartbeat]:
        """A new run's id, its folder (nothing refers to it until the publish) and the
        heartbeat that keeps garbage collection from taking it while it writes."""
        run_id = f"{epoch:012d}-{uuid.uuid4().hex[:12]}"
        run_dir = f"{COMPACTED_DIR}/{run_id}"
        info = {"run": run_id, "epoch": epoch, "horizon": horizon, "started_ms": now_ms}
        return run_id, run_dir, _Heartbeat(self.meta, run_dir, info)

    def _note_output(self, summary: RunSummary, out: PassTwoResult, survivors: SurvivorCounts) -> None:
        """What pass two wrote, in the summary; a count that differs from pass one's is
        an error (never publish a ledger that lost, or gained, records)."""
        summary.bytes_read += out.bytes_read
        summary.entry_bytes_read = out.bytes_read
        summary.records_written = out.records_written
        summary.records_reused = out.records_reused
        if out.records_written + out.records_reused != survivors.records_kept:
            raise ShaleError(f"{self.meta.uri}: pass two wrote {out.records_written} records and kept "
                             f"{out.records_reused} in place where pass one kept {survivors.records_kept}; "
                             "nothing was published")
        summary.bytes_written = out.bytes_written
        summary.parts = len(out.parts)

    def _publish(self, new_state: CompactionState, prev: CompactionState, run_id: str) -> str:
        """One compare-and-swap from ``prev`` to ``new_state``: "" when it landed, why it
        lost when another writer swapped first (the caller removes its output)."""
        requirements = (AssertEpoch(prev.epoch), AssertTopicGeneration(new_state.topic_generation))
        try:
            self.topic.keep(self.meta.publish_compaction(new_state, prev, requirements))
        except RequirementFailedError as e:
            return f"{e}; this run's output was removed and the next run plans again"
        except ConflictError as e:
            return f"the compaction state changed while this run wrote ({e}); this run's output was removed"
        except (StateUnknownError, TransientStorageError):
            # The publish may have landed.  Only the state can tell; without an answer
            # nothing is deleted (leftovers are garbage collection's job).
            if self.topic.read_compaction().compacted_ledger != run_id:
                raise
        return ""

    def _new_state(self, plan: Plan, survivors: SurvivorCounts, out: PassTwoResult, run_id: str, epoch: int,
                   summary: RunSummary, decided_ms: int) -> CompactionState:
        # Retirement is stamped at publish time: the grace period of readers of the old
        # ledger starts when they can first see the new one, not when this run began.
        # By the store's clock, as garbage collection judges it.
        retired_ms = self._store_now_ms()
        now_ms = self._now_ms()
        prev = plan.previous
        last_run = {k: v for k, v in summary.to_json().items()
                    if k in ("records_read", "records_written", "records_reused", "deferred_records",
                             "bytes_read", "bytes_written",
                             "tombstones_dropped", "keyless_dropped", "keys_expired", "dirty_ratio")}
        last_run["config"] = self.config.to_json()
        if self.config.key_ttl_ms:
            last_run["decided_ms"] = decided_ms  # the "now" keys were aged at (verify ages them alike)
        new = CompactionState(
            epoch=epoch, horizon=plan.horizon, compacted_ledger=run_id, parts=tuple(out.parts),
            keys=survivors.keys, tombstones=survivors.tombstones_kept,
            compacted_ms=now_ms, last_run=last_run,
            topic_generation=max(prev.topic_generation, plan.topic.generation), order=self.config.topic_order)
        # The previous view becomes a snapshot if the retention keeps it; what no view kept
        # names any more (parts copied or emptied, deletion vectors replaced) is retired.
        return succeed(prev, new, retired_ms=retired_ms, keep=self.config.snapshot_retention,
                       keep_age_ms=self.config.snapshot_retention_age_ms)

    def _remove(self, run_dir: str, written: list[str]) -> None:
        # Everything a run writes lies under its own folder, whoever wrote it (Spark
        # executors included), so the folder's listing is the complete list.
        store, topic = self.meta.topic.store, self.meta.topic
        try:
            listed = [topic.relative(o.key) for o in store.list(topic.key(run_dir) + "/")]
        except ShaleError:
            listed = []
        try:
            for info in list(store.unfinished_writes(topic.key(run_dir) + "/")):
                store.discard_write(info)  # a task killed mid-write (the run is over)
        except ShaleError:
            pass  # left for garbage collection
        for obj in dict.fromkeys([*written, *listed]):
            try:
                self.meta.topic.store.delete(self.meta.topic.key(obj))
            except ShaleError:
                pass  # left for garbage collection as an orphan
        try:
            store.remove_empty_folder(topic.key(run_dir))  # (a local folder would stay behind, empty)
        except ShaleError:
            pass

    def _keys_expire(self, plan: Plan, now_ms: int) -> bool:
        """Whether a run without new records would still drop keys past the key TTL."""
        if not self.config.key_ttl_ms:
            return False
        order = self.config.topic_order
        for s in plan.compacted:
            s = open_slice(self.meta, s)
            keyed = (s.file.footer.col("r_flags") & FLAG_HAS_KEY) != 0
            if s.gone is not None:
                keyed &= ~s.gone
            if order.expired(decoded_times(s.file, order), now_ms)[keyed].any():
                return True
        return False

    def _gc(self, summary: RunSummary) -> None:
        if not self.config.collect_garbage or self.config.dry_run:
            return
        # now, not the run's start: what this run retired is judged from when it was retired
        report = collect_garbage(self.topic, now_ms=self._store_now_ms(), grace_ms=self.config.gc_grace_ms,
                                 orphan_grace_ms=self.config.orphan_grace_ms)
        summary.retired_deleted = len(report.retired_deleted)
        summary.orphans_deleted = len(report.orphans_deleted)


