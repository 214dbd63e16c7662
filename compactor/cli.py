"""The ``compact`` command (also ``shale compact``) and ``shale gc``."""

from __future__ import annotations

import sys

try:  # a Ctrl-C while the command's modules load ends it as at any other time: one line, 130
    import argparse
    import contextlib
    import json
    import logging
    import time
    import urllib.parse
    from collections.abc import Callable, Sequence
    from typing import TYPE_CHECKING, Any, TextIO

    from shale.compactor import interrupts
    from shale.compactor.commandline import (
        COMPRESSION_HELP,
        METADATA_HELP,
        OneLineParser,
        add_topic_arguments,
        compression_arg,
        duration_arg,
        rate_arg,
        run_command,
        size_arg,
    )
    from shale.compactor.config import (
        DEFAULT_DELETE_RETENTION_MS,
        DEFAULT_GC_GRACE_MS,
        DEFAULT_MAX_MAP_BYTES,
        DEFAULT_ORPHAN_GRACE_MS,
        CompactionConfig,
    )
    from shale.compactor.engine import Engine, LocalEngine
    from shale.compactor.job import Compactor
    from shale.compactor.metrics import DEFAULT_JOB
    from shale.compactor.runlog import LOG_FORMATS, event, foreign_lines_as_json, logging_to
    from shale.compactor.settings import Setting, print_config, settings_of, source_name
    from shale.compactor.spark.options import DEFAULT_SPLIT_BYTES
    from shale.compactor.summary import RunStatus, RunSummary
    from shale.compactor.units import format_duration
    from shale.ledger.codecs import DEFAULT_COMPRESSION
    from shale.ledger.errors import EXIT_FAILURE, EXIT_USAGE, InvalidInputError, error_line, exit_code_of
    from shale.storage.base import mask_uri
except KeyboardInterrupt:
    if getattr(sys.modules.get("shale.compactor.interrupts"), "running_command", lambda: False)():
        raise  # imported by a running command (shale compact), which says it was interrupted
    sys.stderr.write("compact: interrupted\n")
    raise SystemExit(130) from None

if TYPE_CHECKING:
    from shale.compactor.progress import TopicProgress

__all__ = ["build_compact_parser", "main", "register_subcommands"]

COMPACT_HELP = """\
environment:
  every flag can be set by a variable instead: SHALE_ and the flag's name in capitals with
  underscores (--max-topics: SHALE_MAX_TOPICS, --all: SHALE_ALL); SHALE_TOPICS lists topic
  URIs; switches take 1/true/yes/on; SHALE_SPARK_CONF holds one KEY=VALUE per line. Flags
  win. --print-config shows what a run would use.

exit codes:
  0  compacted, nothing to do, or skipped (dirty ratio below --min-dirty-ratio)
  1  unexpected failure
  2  bad usage or input: bad flag, bad URI, missing topic
  3  lost the publish race: another compactor published first (nothing was published
     by this run and its output was removed); safe to run again
  4  corrupt data found: a ledger object failed its checks (the object and position
     are named) or a metadata document broke its schema or invariants (the document
     and field are named); nothing was published or deleted
130  interrupted (Ctrl-C): the run stopped within moments, removed what it wrote and
     published nothing (a second Ctrl-C stops at once, leaving it to gc)
With several topics, each is compacted and published on its own; the exit code is the
worst outcome (4, then 1, then 2, then 3).
"""

# worst first when several topics end differently
_SEVERITY = {0: 0, 3: 1, 2: 2, 1: 3, 4: 4}


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} must be between 0 and 1")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"{text!r} must be between 1 and 64")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _workers(text: str) -> int:
    return 0 if text.strip() == "0" else _count(text)


def _gateway(text: str) -> str:
    """A Pushgateway URL, checked now: one that cannot be parsed is a usage error, not a
    failed run after the work is done (and its password is never shown)."""
    try:
        u = urllib.parse.urlsplit(text.strip())
        u.port  # noqa: B018  (raises for a port out of range)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{mask_uri(text)!r} is not a URL: {e}") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise argparse.ArgumentTypeError(f"{mask_uri(text)!r} is not an http:// or https:// URL")
    return text.strip()


def _spark_conf(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    if not key.startswith("spark."):
        raise argparse.ArgumentTypeError(f"{key!r} is not a Spark setting (they start with 'spark.')")
    return key, value


def add_compact_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("topics", nargs="*", metavar="TOPIC_URI",
                   help="topic folder(s): local path, file://, s3://bucket/prefix, memory://...")
    p.add_argument("--all", metavar="PREFIX_URI", dest="all_prefix", default=None,
                   help="compact every topic under this prefix (a topic is a folder holding _meta/topic.json)")
    p.add_argument("--max-topics", type=_positive, default=None, metavar="N",
                   help="compact at most N topics this run: overdue ones first, then the highest dirty ratio "
                   "(--all, --max-topics and --max-compaction-lag order the topics so; otherwise they run in the "
                   "order given)")
    p.add_argument("--parallel", type=_count, default=1, metavar="N",
                   help="compact N topics at a time (default 1); one topic's failure does not stop the others")
    p.add_argument("--max-compaction-lag", type=duration_arg, default=None, metavar="DURATION",
                   help="a topic whose oldest uncompacted record is older than this is compacted first, "
                   "whatever its dirty ratio (Kafka's max.compaction.lag.ms)")
    p.add_argument("--metadata", metavar="URI", default=None, help=METADATA_HELP)
    p.add_argument("--min-compaction-lag", type=duration_arg, default=0, metavar="DURATION",
                   help="records younger than this wait for a later run (default 0)")
    p.add_argument("--delete-retention", type=duration_arg, default=DEFAULT_DELETE_RETENTION_MS, metavar="DURATION",
                   help="keep tombstones this long after the first compaction that kept them "
                   f"(default {format_duration(DEFAULT_DELETE_RETENTION_MS)}; 0 drops them at once)")
    p.add_argument("--retain-null-key", action="store_true",
                   help="keep records without a key in place (default: drop them)")
    p.add_argument("--min-dirty-ratio", type=_ratio, default=0.0, metavar="R",
                   help="skip when bytes above the horizon / live bytes is below R (default 0)")
    p.add_argument("--dry-run", action="store_true",
                   help="plan and run pass one only; report what would be written; publish nothing")
    p.add_argument("--gc-grace", type=duration_arg, default=DEFAULT_GC_GRACE_MS, metavar="DURATION",
                   help="delete a retired compacted ledger only after this long "
                   f"(default {format_duration(DEFAULT_GC_GRACE_MS)})")
    p.add_argument("--orphan-grace", type=duration_arg, default=DEFAULT_ORPHAN_GRACE_MS, metavar="DURATION",
                   help="delete leftovers of crashed runs only after this long "
                   f"(default {format_duration(DEFAULT_ORPHAN_GRACE_MS)}, at least 15m)")
    p.add_argument("--no-gc", action="store_true", help="do not collect garbage after the run")
    p.add_argument("--max-part-bytes", type=size_arg, default=256 << 20, metavar="SIZE",
                   help="roll the compacted ledger into a new part at this size (default 256MiB)")
    p.add_argument("--read-parallelism", type=_count, default=4, metavar="N",
                   help="ranged reads pass two keeps in flight, 8 MiB each (default 4)")
    p.add_argument("--max-read-bytes-per-second", type=rate_arg, default=0, metavar="SIZE",
                   help="limit pass two's reads to SIZE per second, at least 64KiB (default 0: no limit; per task "
                   "with Spark)")
    p.add_argument("--max-write-bytes-per-second", type=rate_arg, default=0, metavar="SIZE",
                   help="limit pass two's writes to SIZE per second, at least 64KiB (default 0: no limit; per task "
                   "with Spark)")
    p.add_argument("--compression", type=compression_arg, default=DEFAULT_COMPRESSION, metavar="CODEC",
                   help="how the entries a run writes anew (survivors of partly kept entries, packed together) are "
                   f"compressed: {COMPRESSION_HELP}. Entries kept whole keep their stored bytes")
    p.add_argument("--workers", type=_workers, default=0, metavar="N",
                   help="CPU cores the local engine uses: threads building pass one's key map, processes copying "
                   "in pass two (default 0: every available CPU, at most 8; small runs use one)")
    p.add_argument("--max-map-bytes", type=size_arg, default=None, metavar="SIZE",
                   help="memory for pass one's key map, 24 bytes per key written since the last run (default 1GiB, "
                   "about 44 million keys); when the new keys need more, compact up to where they fit and let "
                   "the next run continue; with --engine spark, the most one reduce task holds (more reduce "
                   "partitions, nothing left for the next run)")
    p.add_argument("--json", action="store_true", help="print one JSON line per topic instead of a summary")
    o = p.add_argument_group("operations", "logs, metrics and configuration for scheduled runs")
    o.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                   help="text: errors and warnings as one line each (default); json: one JSON object per event "
                   "on standard error, for log collectors (no progress display)")
    o.add_argument("--pushgateway", metavar="URL", default=None, type=_gateway,
                   help="push each topic's run metrics to this Prometheus Pushgateway (e.g. http://pushgateway:9091); "
                   "a failed push is a warning and does not change the exit code")
    o.add_argument("--pushgateway-job", metavar="NAME", default=DEFAULT_JOB,
                   help=f"the job label of pushed metrics (default {DEFAULT_JOB})")
    o.add_argument("--print-config", action="store_true",
                   help="print the effective settings (flags, SHALE_* variables, defaults) as JSON with secrets "
                   "masked, and exit")
    s = p.add_argument_group("engine", "where the two passes run (planning and publishing always run here)")
    s.add_argument("--engine", choices=("local", "spark"), default="local",
                   help="local: in this process (default); spark: as Spark jobs (needs pip install 'shale[spark]')")
    s.add_argument("--spark-master", metavar="URL", default=None,
                   help="Spark master: local[N], spark://HOST:PORT, k8s://https://HOST, yarn (default: spark-submit's "
                   "master under spark-submit, else local[*])")
    s.add_argument("--spark-conf", metavar="KEY=VALUE", action="append", type=_spark_conf, default=[],
                   help="a Spark setting for the session Shale starts (repeatable)")
    s.add_argument("--spark-split-size", metavar="SIZE", type=size_arg, default=None,
                   help="entry bytes one Spark task handles at most (default 128MiB)")
    s.add_argument("--no-forward-credentials", action="store_true",
                   help="do not send the driver's AWS credential variables to executors with the tasks "
                   "(use when executors have their own identity)")


def build_compact_parser(prog: str = "compact") -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=prog, description="Compact keyed topics: keep the latest record of every key below a new "
        "horizon in a new compacted ledger, and publish it atomically.",
        epilog=COMPACT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_compact_arguments(p)
    return p


def _config(args: argparse.Namespace) -> CompactionConfig:
    return CompactionConfig(
        min_compaction_lag_ms=args.min_compaction_lag, delete_retention_ms=args.delete_retention,
        retain_null_key=args.retain_null_key, min_dirty_ratio=args.min_dirty_ratio, dry_run=args.dry_run,
        gc_grace_ms=args.gc_grace, orphan_grace_ms=args.orphan_grace, collect_garbage=not args.no_gc,
        max_part_bytes=args.max_part_bytes,
        max_map_bytes=DEFAULT_MAX_MAP_BYTES if args.max_map_bytes is None else args.max_map_bytes,
        read_parallelism=args.read_parallelism, max_read_bytes_per_s=args.max_read_bytes_per_second,
        max_write_bytes_per_s=args.max_write_bytes_per_second, workers=args.workers, compression=args.compression)


def _engine(args: argparse.Namespace) -> Engine:
    """The engine the flags ask for; Spark flags without ``--engine spark`` are a usage error."""
    spark_flags = [name for name, given in (("spark_master", args.spark_master is not None),
                                            ("spark_conf", bool(args.spark_conf)),
                                            ("spark_split_size", args.spark_split_size is not None),
                                            ("no_forward_credentials", args.no_forward_credentials)) if given]
    if args.engine == "local":
        if spark_flags:
            raise InvalidInputError(f"{source_name(args, spark_flags[0])} needs --engine spark")
        return LocalEngine()
    from shale.compactor.spark import SparkOptions, require_pyspark

    require_pyspark()
    from shale.compactor.spark.engine import SparkEngine

    options = SparkOptions(master=args.spark_master, conf=tuple(args.spark_conf),
                           split_bytes=DEFAULT_SPLIT_BYTES if args.spark_split_size is None else args.spark_split_size,
                           forward_credentials=not args.no_forward_credentials)
    return SparkEngine(options)


def _run_compact(args: argparse.Namespace, out: TextIO, err: TextIO | None = None) -> int:
    err = err or sys.stderr
    settings = _one_topic_list(args, settings_of(args))
    if args.print_config:
        out.write(json.dumps(print_config(settings), indent=2) + "\n")
        return 0
    config = _config(args)
    engine = _engine(args)
    # With Spark and JSON logs, the JVM's own lines on standard error are made JSON too.
    wrap = foreign_lines_as_json("spark") if engine.name == "spark" and args.log_format == "json" else None
    with wrap or contextlib.nullcontext():
        try:
            return _compact_topics(args, config, engine, out, err)
        finally:
            close = getattr(engine, "close", None)
            if close is not None:
                close()


def _plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _one_topic_list(args: argparse.Namespace, settings: list[Setting]) -> list[Setting]:
    """The topic list is one setting: topic URIs or ``--all`` on the command line make
    ``SHALE_TOPICS`` and ``SHALE_ALL`` both ignored."""
    by_dest = {s.dest: s for s in settings}
    if not any(by_dest[d].source == "flag" for d in ("topics", "all_prefix")):
        return settings
    out = []
    for s in settings:
        if s.dest in ("topics", "all_prefix") and s.source == "env":
            s = Setting(s.dest, s.flag, s.variable, [] if s.dest == "topics" else None, "default")
            setattr(args, s.dest, s.value)
        out.append(s)
    return out


def _chosen_topics(args: argparse.Namespace) -> list[tuple[str, bool]]:
    """The topics to compact, in order, each with whether it is overdue (compacted
    whatever its dirty ratio)."""
    from shale.compactor.topics import assess, choose, discover_topics

    if args.all_prefix is not None and args.topics:
        raise InvalidInputError("give topic URIs or --all PREFIX_URI, not both")
    if args.all_prefix is not None and args.metadata is not None:
        raise InvalidInputError("--all finds topics by their _meta folders, so it cannot be used with --metadata")
    uris = discover_topics(args.all_prefix) if args.all_prefix is not None else list(args.topics)
    if args.all_prefix is None and not uris:
        raise InvalidInputError("no topic given: name TOPIC_URI(s) or --all PREFIX_URI")
    # a topic's own max compaction lag (its policy) applies unless the run's flag set one
    policy_lag = next((x.source for x in settings_of(args) if x.dest == "max_compaction_lag"), "") != "flag"
    if args.all_prefix is None and args.max_compaction_lag is None and args.max_topics is None:
        # the order given; a topic is still overdue by its own policy's lag
        now_ms = int(time.time() * 1000)
        return [(u, assess(u, now_ms=now_ms, metadata_uri=args.metadata, policy_lag=True).overdue
                 if policy_lag else False) for u in uris]
    chosen = choose(uris, now_ms=int(time.time() * 1000), max_lag_ms=args.max_compaction_lag,
                    max_topics=args.max_topics, metadata_uri=args.metadata, policy_lag=policy_lag)
    return [(c.uri, c.overdue) for c in chosen]


def _compact_topics(args: argparse.Namespace, config: CompactionConfig, engine: Engine, out: TextIO,
                    err: TextIO) -> int:
    with logging_to(err, args.log_format, "compact"):
        topics = _chosen_topics(args)
        if not topics:
            # a typo in a scheduled run's prefix must not succeed quietly forever
            event(logging.ERROR, "run.done", f"no topics under {args.all_prefix} (a topic is a folder holding "
                  "_meta/topic.json): check the prefix", topics=0, exit_code=EXIT_USAGE)
            return EXIT_USAGE
        event(logging.INFO, "run.start", f"compacting {_plural(len(topics), 'topic')}", topics=len(topics),
              engine=engine.name, parallel=args.parallel)
        show_progress = args.log_format == "text" and err.isatty()
        # Spark's start-up is a phase of its own: in the first topic's summary
        first_phases = {"spark_start": _start_spark(engine, err, show_progress)} if engine.name == "spark" else {}
        if not show_progress:
            return _compact_each(args, config, engine, topics, out, None, first_phases)
        from shale.compactor.progress import TopicProgress

        with TopicProgress(err, len(topics)) as bar:
            return _compact_each(args, config, engine, topics, out, bar, first_phases)


def _start_spark(engine: Engine, err: TextIO, show_progress: bool) -> float:
    """Spark's start-up is a phase of its own (it takes seconds): timed, logged, and shown."""
    started = time.perf_counter()
    if show_progress:
        from rich.console import Console

        with Console(file=err).status("starting Spark"):
            engine.session  # type: ignore[attr-defined]  # noqa: B018  (starts the application)
    else:
        engine.session  # type: ignore[attr-defined]  # noqa: B018
    seconds = round(time.perf_counter() - started, 3)
    event(logging.INFO, "spark.start", f"Spark started in {seconds:.1f}s", seconds=seconds)
    return seconds


def _compact_each(args: argparse.Namespace, config: CompactionConfig, engine: Engine,
                  topics: list[tuple[str, bool]], out: TextIO, bar: TopicProgress | None,
                  first_phases: dict[str, float]) -> int:
    # One engine for all topics: with Spark, one application compacts them all, and each
    # topic is still planned and published on its own.
    import dataclasses
    import threading
    from concurrent.futures import ThreadPoolExecutor

    sources = {s.dest: s.source for s in settings_of(args)}
    lock = threading.Lock()  # whole lines, one topic at a time
    unfinished = [len(topics)]  # once every topic's outcome is known, an interrupt changes nothing
    # summary lines bound for the terminal the progress display is on go above it
    print_above = bar is not None and out.isatty()

    def one(item: tuple[str, bool]) -> int:
        uri, overdue = item
        shown_uri = _shown(uri)
        start = time.perf_counter()
        # an overdue topic is compacted whatever its dirty ratio
        cfg = dataclasses.replace(config, min_dirty_ratio=0.0) if overdue else config
        own = {**sources, "min_dirty_ratio": "flag"} if overdue else sources  # and whatever its policy says
        shown = bar.start(shown_uri) if bar is not None else None

        def progress(phase: str) -> None:
            event(logging.INFO, "topic.phase", f"{shown_uri}: {phase}", topic=shown_uri, phase=phase)
            if shown is not None:
                shown(phase)

        event(logging.INFO, "topic.start", f"{shown_uri}: start", topic=shown_uri, overdue=overdue)
        try:
            if interrupts.interrupted():  # a topic not begun when the run was interrupted is not begun
                raise KeyboardInterrupt
            summary = _compact_one(uri, cfg, own, args, engine, progress)
        except Exception as e:  # one topic's failure, of any kind, never stops another's run
            summary = RunSummary(shown_uri, engine=engine.name, error=mask_uri(error_line(e)),
                                 exit_code=exit_code_of(e))
            summary.durations["total"] = time.perf_counter() - start
            summary.finish(RunStatus.ERROR)
        finally:
            if bar is not None:
                bar.finish(shown_uri)
        with lock:  # run-wide phases (Spark's start-up) go into the first summary written
            summary.durations = {**first_phases, **summary.durations}
            first_phases.clear()
            unfinished[0] -= 1
            if not unfinished[0]:
                interrupts.outcome_decided()
        _log_outcome(shown_uri, summary)
        with lock:
            line = json.dumps(summary.to_json(), separators=(",", ":")) if args.json else (
                None if summary.status is RunStatus.ERROR else summary.human())
            if line is not None:
                if print_above and bar is not None:
                    bar.print(line)
                else:
                    out.write(line + "\n")
                    out.flush()
        if args.pushgateway:
            _push(args, summary)
        return summary.exit_code

    if args.parallel > 1 and len(topics) > 1:
        pool = ThreadPoolExecutor(max_workers=args.parallel, thread_name_prefix="shale-topic")
        try:
            codes = list(pool.map(one, topics))
        finally:  # interrupted: topics not begun never begin, the others stop at their next check
            pool.shutdown(wait=True, cancel_futures=True)
    else:
        codes = [one(t) for t in topics]
    worst = _worst(codes)
    event(logging.INFO, "run.done", f"{_plural(len(topics), 'topic')}, exit code {worst}", topics=len(topics),
          exit_code=worst, failed=sum(1 for c in codes if c != 0))
    return worst


def _compact_one(uri: str, config: CompactionConfig, sources: dict[str, str], args: argparse.Namespace,
                 engine: Engine, progress: Callable[[str], None]) -> RunSummary:
    """One topic's run under its own policy (a run's flag wins over it), then the policy's
    retention, applied only to ledgers the new horizon covers."""
    from shale.compactor.policies import apply_policy
    from shale.compactor.retention import retention_cut, truncate
    from shale.metadata.topic import TopicMetadata

    meta = TopicMetadata.open(uri, args.metadata)
    policy = meta.load_policy()
    summary = Compactor(uri, apply_policy(config, policy, sources), metadata_uri=args.metadata,
                        progress=progress, engine=engine).run()
    rule = policy.values
    if summary.status is not RunStatus.COMPACTED or (rule.retention_ms is None and rule.retention_bytes is None):
        return summary
    removed = 0
    for older_than, keep in ((rule.retention_ms, None), (None, rule.retention_bytes)):
        if older_than is None and keep is None:
            continue
        topic = meta.load_topic()
        cut = retention_cut(meta, older_than_ms=older_than, keep_bytes=keep)
        if topic.ledgers and cut > topic.ledgers[0].id:
            removed += len(truncate(meta, cut).removed)
    if removed:
        progress("retention")
        note = f"retention removed {_plural(removed, 'ledger')} below the horizon"
        summary.message = f"{summary.message}; {note}" if summary.message else note
    return summary


def _log_outcome(shown_uri: str, summary: RunSummary) -> None:
    if summary.status is RunStatus.ERROR:
        event(logging.ERROR, "topic.error", str(summary.error), topic=shown_uri, exit_code=summary.exit_code)
    else:
        event(logging.INFO, "topic.done", f"{shown_uri}: {summary.status}", topic=shown_uri, status=summary.status,
              exit_code=summary.exit_code, summary=summary.to_json())


def _worst(codes: list[int]) -> int:
    """The exit code of several topics' runs: the worst outcome (4, then 1, 2, 3)."""
    worst = 0
    for code in codes:
        if _SEVERITY.get(code, 3) > _SEVERITY.get(worst, 3):
            worst = code
    return worst


def _shown(uri: str) -> str:
    """A topic as summaries name it: its canonical URI, as a run names it, or the URI as
    given (credentials masked) when it does not resolve."""
    from shale.storage import resolve

    try:
        return resolve(uri).uri
    except Exception:
        return mask_uri(uri)


def _push(args: argparse.Namespace, summary: RunSummary) -> None:
    """Push the topic's metrics; a failure is a warning, never a different exit code (the
    run's outcome stands, and the missing push shows as a stale push_time_seconds)."""
    from shale.compactor.metrics import push_summary
    from shale.compactor.settings import mask_secrets
    from shale.compactor.topics import assess

    after = None
    if summary.status in (RunStatus.COMPACTED, RunStatus.NOTHING_TO_DO, RunStatus.SKIPPED):
        choice = assess(summary.topic, now_ms=int(time.time() * 1000), metadata_uri=args.metadata)
        after = None if choice.error else choice.dirty_ratio
    try:
        push_summary(args.pushgateway, summary, now_s=time.time(), dirty_ratio_after=after,
                     job=args.pushgateway_job)
    except Exception as e:  # any failure to reach the gateway
        event(logging.WARNING, "metrics.error",
              mask_uri(f"could not push metrics of {summary.topic} to {mask_secrets(args.pushgateway)}: "
                       f"{getattr(e, 'reason', None) or error_line(e)}"), topic=summary.topic)
    else:
        event(logging.INFO, "metrics.pushed", f"{summary.topic}: metrics pushed", topic=summary.topic)


def _run_gc(args: argparse.Namespace, out: TextIO) -> int:
    from shale.compactor.gc import collect_garbage
    from shale.metadata.topic import TopicMetadata

    meta = TopicMetadata.open(args.topic, args.metadata)
    meta.load_topic()  # a missing topic is an error, not an empty collection
    report = collect_garbage(meta, grace_ms=args.grace,  # ages by the store's clock
                             orphan_grace_ms=args.orphan_grace, dry_run=args.dry_run)
    out.write((json.dumps(report.to_json(), separators=(",", ":")) if args.json else report.human()) + "\n")
    return 0


def _run_truncate(args: argparse.Namespace, out: TextIO) -> int:
    from shale.compactor.retention import retention_cut, truncate
    from shale.metadata.topic import TopicMetadata

    meta = TopicMetadata.open(args.topic, args.metadata)
    meta.load_topic()  # a missing topic is an error
    before = args.before_ledger
    if before is None:  # a rule: as many of the oldest ledgers as it lets go
        before = retention_cut(meta, older_than_ms=args.older_than, keep_bytes=args.keep_bytes,
                               allow_uncompacted=args.allow_uncompacted)
    done = truncate(meta, before, allow_uncompacted=args.allow_uncompacted, dry_run=args.dry_run)
    out.write((json.dumps(done.to_json(), separators=(",", ":")) if args.json else done.human()) + "\n")
    return 0


def _run_config(args: argparse.Namespace, out: TextIO) -> int:
    from shale.compactor.policies import check_workable, parse_assignments, policy_text
    from shale.metadata.topic import TopicMetadata

    meta = TopicMetadata.open(args.topic, args.metadata)
    changes, removed = parse_assignments(args.set, args.unset)
    meta.load_topic()  # a missing topic is an error, and nothing is written for it
    check_workable(meta, changes)
    policy = meta.update_policy(changes, removed) if changes or removed else meta.load_policy()
    shown = policy_text(policy)
    if args.json:
        out.write(json.dumps({"topic": meta.uri, "policy": shown, "version": policy.version},
                             separators=(",", ":")) + "\n")
    elif not shown:
        out.write(f"{meta.uri}: no policy: every setting comes from the run (flag, SHALE_* variable, default)\n")
    else:
        width = max(map(len, shown))
        out.write("".join(f"{k.ljust(width)}  {v}\n" for k, v in shown.items()))
    return 0


def _run_topics(args: argparse.Namespace, out: TextIO) -> int:
    from shale.compactor.listing import list_topics, rows_text

    rows = list_topics(args.prefix)
    if not rows:
        raise InvalidInputError(f"no topics under {args.prefix} (a topic is a folder holding _meta/topic.json)")
    if args.json:
        out.write("".join(json.dumps(r.to_json(), separators=(",", ":")) + "\n" for r in rows))
    else:
        out.write(rows_text(rows) + "\n")
    return 0


def _run_verify(args: argparse.Namespace, out: TextIO) -> int:
    from shale.compactor.verify import EXIT_MISMATCH, verify_topic
    from shale.ledger.errors import EXIT_CORRUPT
    from shale.metadata.topic import TopicMetadata

    meta = TopicMetadata.open(args.topic, args.metadata)
    meta.load_topic()  # a missing topic is an error, not an empty view
    if args.scrub:
        scrubbed = _scrub(meta, args)
        out.write((json.dumps(scrubbed.to_json(), separators=(",", ":")) if args.json else scrubbed.human()) + "\n")
        if not scrubbed.ok:
            return EXIT_CORRUPT
    report = verify_topic(meta)
    out.write((json.dumps(report.to_json(), separators=(",", ":")) if args.json else report.human()) + "\n")
    return 0 if report.ok else EXIT_MISMATCH


def _scrub(meta: Any, args: argparse.Namespace) -> Any:
    """The scrub, with a progress bar on a terminal."""
    from shale.compactor.scrub import scrub_topic

    if not sys.stderr.isatty():
        return scrub_topic(meta, max_bytes_per_s=args.max_read_bytes_per_second)
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    with Progress("scrub", BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                  console=Console(file=sys.stderr), transient=True) as bar:
        task = bar.add_task("scrub", total=None)
        return scrub_topic(meta, max_bytes_per_s=args.max_read_bytes_per_second,
                           progress=lambda done, total: bar.update(task, completed=done, total=total))


_GC_HELP = """\
exit codes:
  0  collected (or, with --dry-run, listed) what was past its grace
  1  unexpected failure (storage unreachable after retries)
  2  bad usage or input: bad flag or variable, bad URI, missing topic
  3  the compaction state kept changing (other writers); safe to run again
  4  a metadata document breaks its schema or invariants (nothing is deleted)
"""

_TRUNCATE_HELP = """\
exit codes:
  0  removed (or, with --dry-run, listed) the ledgers below ID
  2  bad usage or input: missing topic, ID out of range, or ledgers above the horizon
     without --allow-uncompacted (nothing is removed)
  3  the topic kept changing (other writers); safe to run again
  4  a ledger footer or metadata document is corrupt
"""


def register_subcommands(sub: Any) -> None:
    """Add ``compact``, ``gc``, ``truncate`` and ``verify`` to the ``shale`` command."""
    p = sub.add_parser("compact", help="compact topics (same as the compact command)",
                       description="Compact keyed topics and publish the result atomically.",
                       epilog=COMPACT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_compact_arguments(p)
    p.set_defaults(func=_run_compact)

    g = sub.add_parser("gc", help="delete retired compacted ledgers and leftovers past their grace period",
                       description="Delete retired compacted ledgers older than --grace and orphaned objects "
                       "(crashed or beaten runs, unregistered ledgers) older than --orphan-grace. "
                       "Never deletes anything a published state refers to.",
                       epilog=_GC_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_topic_arguments(g)
    # --gc-grace, as compact names it (--grace is its former name, still accepted)
    g.add_argument("--gc-grace", "--grace", type=duration_arg, default=DEFAULT_GC_GRACE_MS, metavar="DURATION",
                   dest="grace", help=f"retired compacted ledgers (default {format_duration(DEFAULT_GC_GRACE_MS)})")
    g.add_argument("--orphan-grace", type=duration_arg, default=DEFAULT_ORPHAN_GRACE_MS, metavar="DURATION",
                   help=f"unreferenced leftovers (default {format_duration(DEFAULT_ORPHAN_GRACE_MS)}, "
                   "at least 15m)")
    g.add_argument("--dry-run", action="store_true", help="list what would be deleted, delete nothing")
    g.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    g.set_defaults(func=_run_gc)

    t = sub.add_parser("truncate", help="retention: remove the oldest ledgers from a topic",
                       description="Remove every ledger with an id below --before-ledger from the topic (retention "
                       "by hand). By default only ledgers wholly at or below the compaction horizon go: the "
                       "compacted view keeps the latest record of every key, so nothing a compacted reader sees "
                       "is lost. A compaction that read them while they were removed publishes nothing and exits "
                       "3; their objects are deleted by gc once the orphan grace has passed.",
                       epilog=_TRUNCATE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_topic_arguments(t)
    rule = t.add_mutually_exclusive_group(required=True)
    rule.add_argument("--before-ledger", type=int, metavar="ID",
                      help="remove the ledgers whose id is below ID (at most the last ledger's id + 1)")
    rule.add_argument("--older-than", type=duration_arg, metavar="DURATION",
                      help="remove the oldest ledgers whose last record is older than this (Kafka's retention.ms)")
    rule.add_argument("--keep-bytes", type=size_arg, metavar="SIZE",
                      help="remove the oldest ledgers until at most SIZE of ledgers is left (retention.bytes)")
    t.add_argument("--allow-uncompacted", action="store_true",
                   help="also remove ledgers with records above the horizon, which no compaction has kept: those "
                   "records are lost (the report says how many)")
    t.add_argument("--dry-run", action="store_true", help="say what would be removed; remove nothing")
    t.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    t.set_defaults(func=_run_truncate)

    _register_config_and_topics(sub)
    from shale.compactor.dictionary import register_dictionary_command

    register_dictionary_command(sub)

    v = sub.add_parser("verify", help="recompute the compacted view from the original ledgers and compare",
                       description="Recompute the latest record of every key up to the published horizon from "
                       "the original ledgers that still exist (footers only), compare it with the published "
                       "compacted view, and verify every compacted frame's checksum.",
                       epilog="exit codes: 0 the view matches (and, with --scrub, every object is whole); 5 "
                       "missing, extra or stale keys (listed); 4 an object is corrupt (with --scrub: every damaged "
                       "one is listed); 2 bad usage or missing topic",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_topic_arguments(v)
    v.add_argument("--json", action="store_true", help="print the report as one JSON line")
    v.add_argument("--scrub", action="store_true",
                   help="first read every frame of every ledger and compacted part, superseded ones included, "
                   "and check it (exit 4 naming every damaged object)")
    v.add_argument("--max-read-bytes-per-second", type=rate_arg, default=0, metavar="SIZE",
                   help="with --scrub: read at most SIZE per second, at least 64KiB (default 0: no limit)")
    v.set_defaults(func=_run_verify)


def _register_config_and_topics(sub: Any) -> None:
    from shale.compactor.policies import POLICY_KEYS

    keys = "\n".join(f"  {k.name:<19} {k.help}" for k in POLICY_KEYS.values())
    c = sub.add_parser("config", help="show or change a topic's policy (its own compaction and retention settings)",
                       description="Show a topic's policy, or change it with --set and --unset (one "
                       "compare-and-swap). compact applies each topic's policy; a run's flag wins over it, and it "
                       "wins over SHALE_* variables and the defaults.",
                       epilog=f"settings:\n{keys}\n\nexit codes: 0 shown or changed; 2 bad setting or missing "
                       "topic (nothing changed); 3 the policy kept changing (other writers)",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_topic_arguments(c)
    c.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="set a policy setting, e.g. delete-retention=7d (repeatable)")
    c.add_argument("--unset", action="append", default=[], metavar="NAME",
                   help="remove a policy setting: the run's own value applies again (repeatable)")
    c.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    c.set_defaults(func=_run_config)

    t = sub.add_parser("topics", help="list every topic under a prefix",
                       description="List every topic under a prefix: ledgers, records, bytes, horizon, dirty "
                       "ratio (estimated from the metadata, as compact --all orders topics), last compaction and "
                       "policy. A topic whose metadata cannot be read is listed with its error.",
                       epilog="exit codes: 0 listed; 2 bad URI or no topic under the prefix",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("prefix", metavar="PREFIX_URI", help="a folder holding topics: a local path, s3://bucket/prefix")
    t.add_argument("--json", action="store_true", help="print one JSON line per topic instead of a table")
    t.set_defaults(func=_run_topics)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``compact`` console script."""
    def parser() -> argparse.ArgumentParser:
        p = build_compact_parser()
        p.set_defaults(func=_run_compact)
        return p

    code = run_command(argv, parser, prog="compact")
    return code if code in range(256) else EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
