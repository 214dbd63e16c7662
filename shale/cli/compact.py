"""``compact`` (also ``shale compact``): :func:`~shale.compactor.run_many.compact_topics` with an
operator's view of it: one summary line (or JSON line) per topic on standard output,
events as log lines or JSON on standard error, a progress display on a terminal,
metrics pushed to a Pushgateway; with several topics (or ``--all``) a last line counting
how they ended, and an exit code that says whether some failed while others completed
(:func:`~shale.cli.errors.run_exit_code`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from shale.cli.app import Streams
from shale.cli.errors import EXIT_CONFLICT, EXIT_OK, exit_code_of, run_exit_code
from shale.cli.runlog import event, foreign_lines_as_json, logging_to
from shale.compactor.engine import Engine, engine_for
from shale.compactor.run_many import RunEvent, compact_topics
from shale.compactor.summary import FleetSummary, RunStatus, RunSummary
from shale.ledger.errors import error_line
from shale.ledger.masking import mask_secrets
from shale.runtime import interrupts
from shale.settings.units import count

if TYPE_CHECKING:
    from shale.cli.metrics import AfterRun
    from shale.cli.progress import TopicProgress
    from shale.compactor.topics import Backlog
    from shale.metadata.policy import TopicPolicy
    from shale.metadata.topic import TopicMetadata
    from shale.settings import Settings

__all__ = ["run_compact", "summary_exit_code"]

def run_compact(args: argparse.Namespace, io: Streams) -> int:
    if args.print_config:
        from shale.compactor.effective import effective_config

        io.out.write(json.dumps(effective_config(args.settings), indent=2) + "\n")
        return EXIT_OK
    engine = engine_for(args.settings)
    # With an application's engine (Spark) and JSON logs, its own lines on standard error are made JSON too.
    wrap = foreign_lines_as_json(engine.name) if engine.starts_application and args.log_format == "json" else None
    with wrap or contextlib.nullcontext():
        try:
            return _compact(args, engine, io)
        finally:
            engine.close()


def _compact(args: argparse.Namespace, engine: Engine, io: Streams) -> int:
    with logging_to(io.err, args.log_format, "compact"):
        view = _RunView(args, engine, io)
        try:
            summaries = compact_topics(args.settings, engine=engine, on_event=view.tell,
                                       backlog=bool(args.pushgateway), after_publish=_after_publish)
        finally:
            view.close()
        codes = {s.topic: summary_exit_code(s) for s in summaries}
        code = run_exit_code(list(codes.values()))
        fleet = FleetSummary.of(summaries)
        event(logging.INFO, "run.done", f"{count(len(codes), 'topic')}, exit code {code}", topics=len(codes),
              exit_code=code, **{k: v for k, v in fleet.to_json(codes).items() if k != "topics"})
        if args.all is not None or len(summaries) > 1:  # (one topic's line says it all)
            view.print_line(json.dumps({**fleet.to_json(codes), "exit_code": code}, separators=(",", ":"))
                            if args.json else f"compact: {fleet.human(codes)}; exit code {code}")
        return code


def _after_publish(meta: TopicMetadata, policy: TopicPolicy, settings: Settings, summary: RunSummary) -> None:
    """The topic's Iceberg table, when its policy names one (shale.iceberg.follow: imported
    only for such a topic)."""
    if policy.get("iceberg_catalog") is None and policy.get("iceberg_table") is None:
        return
    from shale.iceberg.follow import after_publish

    after_publish(meta, policy, settings, summary)


def summary_exit_code(summary: RunSummary) -> int:
    """What one topic's run exits with: 0 for every outcome but a lost race (3) or an
    error; a run that compacted but could not bring the topic's Iceberg table up to date
    exits as that error would (1 transient, 2 usage or access, 3 a lost race)."""
    if summary.status is RunStatus.ERROR:
        return exit_code_of(summary.failure) if summary.failure is not None else 1
    if summary.status is RunStatus.CONFLICT:
        return EXIT_CONFLICT
    return exit_code_of(summary.iceberg_failure) if summary.iceberg_failure is not None else EXIT_OK


def summary_json(summary: RunSummary) -> dict[str, Any]:
    """A topic's summary as ``--json`` prints it, with its exit code."""
    return {**summary.to_json(), "exit_code": summary_exit_code(summary)}


class _RunView:
    """What an operator sees of a run, fed its events (from the topics' threads)."""

    def __init__(self, args: argparse.Namespace, engine: Engine, io: Streams) -> None:
        self.args, self.engine, self.io = args, engine, io
        from shale.cli.progress import on_terminal

        self.show_progress = args.log_format == "text" and on_terminal(io.err)
        self.bar: TopicProgress | None = None
        self.phases: dict[str, Any] = {}
        self.lock = threading.Lock()  # whole lines, one topic at a time
        self.total = self.done = 0
        self.starting: Any = None  # Spark's start-up, on a terminal

    def tell(self, e: RunEvent) -> None:
        if e.kind == "run.empty":
            event(logging.WARNING, "run.empty", f"no topics under {e.topic} yet (a topic is a folder holding "
                  "_meta/topic.json): nothing to compact", topics=0)
        elif e.kind == "run.start":
            self.total = e.topics
            event(logging.INFO, "run.start", f"compacting {count(e.topics, 'topic')}", topics=e.topics,
                  engine=self.engine.name, parallel=self.args.parallel)
        elif e.kind == "spark.starting" and self.show_progress:
            from shale.cli.progress import waiting

            self.starting = waiting("starting Spark", self.io.err)
        elif e.kind == "spark.start":
            self._stop_spinner()
            event(logging.INFO, "spark.start", f"Spark started in {e.seconds:.1f}s", seconds=e.seconds)
        elif e.kind == "topic.start":
            self._topic_start(e)
        elif e.kind == "topic.phase":
            event(logging.INFO, "topic.phase", f"{e.topic}: {e.phase}", topic=e.topic, phase=e.phase)
            show = self.phases.get(e.topic)
            if show is not None:
                show(e.phase)
        elif e.kind == "topic.done" and e.summary is not None:
            self._topic_done(e.summary, e.backlog)

    def _topic_start(self, e: RunEvent) -> None:
        if self.show_progress and self.bar is None:
            from shale.cli.progress import TopicProgress

            with self.lock:
                if self.bar is None:
                    self.bar = TopicProgress(self.io.err, self.total).__enter__()
        if self.bar is not None:
            self.phases[e.topic] = self.bar.start(e.topic)
        event(logging.INFO, "topic.start", f"{e.topic}: start", topic=e.topic, overdue=e.overdue)

    def _topic_done(self, summary: RunSummary, backlog: Backlog | None) -> None:
        if self.bar is not None:
            self.bar.finish(summary.topic)
        code = summary_exit_code(summary)
        with self.lock:
            self.done += 1
            if self.done == self.total:  # every topic's outcome is known: an interrupt changes nothing now
                interrupts.outcome_decided()
        if summary.status is RunStatus.ERROR:
            event(logging.ERROR, "topic.error", str(summary.error), topic=summary.topic, exit_code=code)
        else:
            event(logging.INFO, "topic.done", f"{summary.topic}: {summary.status}", topic=summary.topic,
                  status=summary.status, exit_code=code, summary=summary_json(summary))
        line = json.dumps(summary_json(summary), separators=(",", ":")) if self.args.json else (
            None if summary.status is RunStatus.ERROR else summary.human())
        if line is not None:
            self.print_line(line)
        if self.args.pushgateway:
            _push(self.args, summary, code, backlog)

    def print_line(self, line: str) -> None:
        """A line on standard output, whole (topics end in threads of their own); above
        the progress display when it is on the terminal the line is bound for."""
        with self.lock:
            if self.bar is not None and self.bar.on_terminal(self.io.out):
                self.bar.print(line)
            else:
                self.io.out.write(line + "\n")
                self.io.out.flush()

    def _stop_spinner(self) -> None:
        if self.starting is not None:
            self.starting.stop()
            self.starting = None

    def close(self) -> None:
        self._stop_spinner()
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


def _push(args: argparse.Namespace, summary: RunSummary, code: int, backlog: Backlog | None) -> None:
    """Push the topic's metrics; a failure is a warning, never a different exit code (the
    run's outcome stands, and the missing push shows as a stale push_time_seconds)."""
    from shale.cli.metrics import push_summary

    try:
        now_s = time.time()
        push_summary(args.pushgateway, summary, exit_code=code, now_s=now_s, after=_after_run(args, backlog, now_s),
                     job=args.pushgateway_job)
    except Exception as e:  # any failure to reach the gateway
        event(logging.WARNING, "metrics.error",
              mask_secrets(f"could not push metrics of {summary.topic} to {mask_secrets(args.pushgateway)}: "
                           f"{getattr(e, 'reason', None) or error_line(e)}"), topic=summary.topic)
    else:
        event(logging.INFO, "metrics.pushed", f"{summary.topic}: metrics pushed", topic=summary.topic)


def _after_run(args: argparse.Namespace, backlog: Backlog | None, now_s: float) -> AfterRun:
    """What the topic's backlog says after its run (the library's, from the topic's
    handle): its dirty ratio, the age of its oldest record above the horizon, and the max
    compaction lag in force (the run's flag, else the topic's policy, as the run chose
    topics by)."""
    from shale.cli.metrics import AfterRun

    if backlog is None:  # the topic cannot be read (its error, if any, is the run's): those gauges stay
        return AfterRun(max_lag_s=(args.settings.value("max-compaction-lag") or 0) / 1000)
    b = backlog
    delay = 0.0 if b.oldest_ms is None else max(0.0, now_s - b.oldest_ms / 1000)
    return AfterRun(b.dirty_ratio, delay, (b.max_lag_ms or 0) / 1000, b.subscription_lag.records,
                    b.subscription_lag.bytes)
