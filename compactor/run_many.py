"""Many topics per run: what ``compact`` and ``compact --all`` do, callable from Python.

:func:`compact_topics` chooses the topics (the URIs given, or every topic under a prefix;
overdue ones first, then the filthiest, at most ``max-topics``: :mod:`shale.compactor.topics`),
compacts each under its own policy (:meth:`~shale.settings.Settings.with_policy`: a
run's flag > the topic's policy > a variable > the default), a few at a time in threads
(``parallel``), applies the policy's retention after each run, and tells the caller
what happens through events (:class:`RunEvent`: logs, progress, metrics are the
caller's).  One topic's failure never stops another's: it is its summary's ``error``.

>>> from shale.compactor import compact_topics
>>> summaries = compact_topics({"all": "s3://bucket/topics", "parallel": 4})   # doctest: +SKIP
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final

from shale.compactor.config import CompactionConfig
from shale.compactor.engine import Engine, LocalEngine
from shale.compactor.job import Compactor
from shale.compactor.summary import RunStatus, RunSummary
from shale.compactor.topics import assess, choose, refuse_a_file
from shale.ledger.errors import InvalidInputError, error_line
from shale.ledger.masking import mask_secrets
from shale.metadata.policy import TopicPolicy
from shale.metadata.topic import TopicMetadata
from shale.runtime import interrupts
from shale.settings import Settings, Source, resolve
from shale.settings.units import count

__all__ = ["EventListener", "RunEvent", "choose_topics", "compact_topic", "compact_topics"]


@dataclass(frozen=True, slots=True)
class RunEvent:
    """Something that happened during :func:`compact_topics`.

    ``kind`` is one of ``run.start`` (``topics``: how many will be compacted; ``run.empty``
    instead when ``all`` names a prefix that holds no topic),
    ``spark.start`` (``seconds`` the Spark application took to start), ``topic.start``
    (``overdue``), ``topic.phase`` (``phase``: planning, pass one over N records, pass
    two: keeping N records, publishing, retention) and ``topic.done`` (``summary``)."""

    kind: str
    topic: str = ""
    phase: str = ""
    overdue: bool = False
    topics: int = 0
    seconds: float = 0.0
    summary: RunSummary | None = field(default=None, compare=False)


#: Told every :class:`RunEvent`, from the thread the topic runs in.
EventListener = Callable[[RunEvent], None]


def compact_topics(settings: Settings | Mapping[str, Any] | None = None, *, engine: Engine | None = None,
                   on_event: EventListener | None = None) -> list[RunSummary]:
    """Compact the topics ``settings`` name (``topics`` or ``all``), each under its own
    policy, and return their summaries in the order they ran.  ``settings``: ``compact``'s
    resolved settings (:func:`shale.settings.resolve`), or the values to resolve them
    from, by name (``{"all": "s3://b/topics", "max-topics": 50}``).  One engine compacts
    every topic (with Spark, one application); it is not closed here.  A prefix without
    topics (a deployment that has none yet) is no error: no summary, and a ``run.empty``
    event that says so."""
    s = settings if isinstance(settings, Settings) else resolve("compact", settings or {})
    tell = on_event or _ignore
    engine = engine or LocalEngine()
    chosen = choose_topics(s)
    if not chosen:
        tell(RunEvent("run.empty", s.value("all")))
        return []
    tell(RunEvent("run.start", topics=len(chosen)))
    # Spark's start-up is a phase of its own: in the first topic's summary
    first = {"spark_start": _start(engine, tell)} if engine.name == "spark" else {}
    lock = threading.Lock()

    def one(item: tuple[str, bool]) -> RunSummary:
        summary = _run_one(item[0], item[1], s, engine, tell)
        with lock:  # run-wide phases go into the first summary done
            summary.durations = {**first, **summary.durations}
            first.clear()
        tell(RunEvent("topic.done", summary.topic, summary=summary))
        return summary

    parallel = s.value("parallel")
    if parallel <= 1 or len(chosen) <= 1:
        return [one(t) for t in chosen]
    pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="shale-topic")
    try:
        return list(pool.map(one, chosen))
    finally:  # interrupted: topics not begun never begin, the others stop at their next check
        pool.shutdown(wait=True, cancel_futures=True)


def _ignore(_: RunEvent) -> None:
    pass


def _start(engine: Engine, tell: EventListener) -> float:
    """Start the engine's application (Spark takes seconds): timed, and told."""
    tell(RunEvent("spark.starting"))
    started = time.perf_counter()
    engine.ready()  # type: ignore[attr-defined]  # (starts the application and its executors' Python workers)
    seconds = round(time.perf_counter() - started, 3)
    tell(RunEvent("spark.start", seconds=seconds))
    return seconds


def choose_topics(settings: Settings) -> list[tuple[str, bool]]:
    """The topics to compact, in order, each with whether it is overdue (compacted
    whatever its dirty ratio): as given, unless ``all``, ``max-topics`` or
    ``max-compaction-lag`` asks for the overdue and the filthiest first."""
    topics, prefix, metadata = settings.value("topics"), settings.value("all"), settings.value("metadata")
    if prefix is not None and metadata is not None:
        raise InvalidInputError("--all finds topics by their _meta folders, so it cannot be used with --metadata")
    if prefix is not None:
        from shale.maintenance.listing import discover_topics  # (only --all lists a prefix)

        uris = discover_topics(prefix)
    else:
        uris = list(topics)
    if prefix is None and not uris:
        raise InvalidInputError("no topic given: name TOPIC_URI(s) or --all PREFIX_URI")
    max_lag, max_topics = settings.value("max-compaction-lag"), settings.value("max-topics")
    # a topic's own max compaction lag (its policy) applies unless the run's flag set one
    policy_lag = settings.source("max-compaction-lag") is not Source.FLAG
    now_ms = int(time.time() * 1000)
    if prefix is None and max_lag is None and max_topics is None:
        # the order given; a topic is still overdue by its own policy's lag
        return [(u, policy_lag and assess(u, now_ms=now_ms, metadata_uri=metadata, policy_lag=True).overdue)
                for u in uris]
    chosen = choose(uris, now_ms=now_ms, max_lag_ms=max_lag, max_topics=max_topics, metadata_uri=metadata,
                    policy_lag=policy_lag)
    return [(c.uri, c.overdue) for c in chosen]


def _run_one(uri: str, overdue: bool, settings: Settings, engine: Engine, tell: EventListener) -> RunSummary:
    """One topic's run; whatever it raises becomes its summary's error."""
    shown = _shown(uri)
    start = time.perf_counter()
    tell(RunEvent("topic.start", shown, overdue=overdue))
    try:
        if interrupts.interrupted():  # a topic not begun when the run was interrupted is not begun
            raise KeyboardInterrupt
        return compact_topic(uri, settings, overdue=overdue, engine=engine,
                             progress=lambda phase: tell(RunEvent("topic.phase", shown, phase=phase)))
    except Exception as e:  # one topic's failure, of any kind, never stops another's run
        summary = RunSummary(shown, engine=engine.name, error=mask_secrets(error_line(e)), failure=e)
        summary.durations["total"] = time.perf_counter() - start
        return summary.finish(RunStatus.ERROR)


def compact_topic(uri: str, settings: Settings, *, overdue: bool = False, engine: Engine | None = None,
                  progress: Callable[[str], None] | None = None) -> RunSummary:
    """One topic's run under its own policy (a run's flag wins over it; an ``overdue``
    topic is compacted whatever its dirty ratio), then the policy's retention, whatever
    the run found to do (compacted, nothing to do, skipped, or lost its race to another
    compactor), applied only to ledgers the horizon covers that no subscription or
    snapshot holds (:func:`~shale.maintenance.retention.policy_retention`)."""
    meta = TopicMetadata.open(uri, settings.value("metadata"))
    refuse_a_file(meta.topic)
    policy = meta.load_policy()
    own = settings.with_policy(policy.to_json())
    if overdue:
        own = own.replace("min-dirty-ratio", 0.0)
    summary = Compactor(meta, CompactionConfig.from_settings(own), progress=progress, engine=engine).run()
    note = _retention(meta, policy, summary, progress)
    if note:
        summary.message = f"{summary.message}; {note}" if summary.message else note
    return summary


#: The outcomes after which the policy's retention applies (a dry run changes nothing; a
#: failed run leaves the topic to whoever looks at its error).
_RETAINING: Final = (RunStatus.COMPACTED, RunStatus.NOTHING_TO_DO, RunStatus.SKIPPED, RunStatus.CONFLICT)


def _retention(meta: TopicMetadata, policy: TopicPolicy, summary: RunSummary,
               progress: Callable[[str], None] | None) -> str:
    """The policy's retention after the run, in words for its summary ("" when the policy
    sets none, or it found nothing to remove and nothing held back)."""
    from shale.maintenance.retention import policy_retention

    if summary.status not in _RETAINING or (policy.get("retention_ms") is None
                                            and policy.get("retention_bytes") is None):
        return ""
    if progress is not None:
        progress("retention")
    done = policy_retention(meta)
    summary.retention_removed = len(done.removed)
    notes = [f"retention removed {count(len(done.removed), 'ledger')} below the horizon"] if done.removed else []
    if done.cut is not None and done.cut.held_by:
        notes.append(f"retention: {done.cut.human()}")
    return "; ".join(notes)


def _shown(uri: str) -> str:
    """A topic as summaries name it: its canonical URI, as a run names it, or the URI as
    given (credentials masked) when it does not resolve."""
    from shale.storage import resolve as resolve_uri

    try:
        return resolve_uri(uri).uri
    except Exception:
        return mask_secrets(uri)
