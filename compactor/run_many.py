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
from dataclasses import field
from typing import Any, Final

from shale.compactor.config import CompactionConfig
from shale.compactor.engine import Engine, LocalEngine
from shale.compactor.job import Compactor
from shale.compactor.summary import RunStatus, RunSummary
from shale.compactor.topics import Backlog, assess, backlog, choose, refuse_a_file
from shale.ledger.errors import InvalidInputError, error_line
from shale.ledger.masking import mask_secrets
from shale.ledger.values import dataclass
from shale.metadata.handle import Topic
from shale.metadata.policy import TopicPolicy
from shale.metadata.topic import TopicMetadata
from shale.runtime import interrupts
from shale.settings import Settings, Source, resolve
from shale.settings.units import count

__all__ = ["AfterPublish", "EventListener", "RunEvent", "choose_topics", "compact_topic", "compact_topics"]


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
    #: with ``topic.done`` when asked for: what the topic has left above its horizon
    backlog: Backlog | None = field(default=None, compare=False)


#: Told every :class:`RunEvent`, from the thread the topic runs in.
EventListener = Callable[[RunEvent], None]
#: Called after each topic's run that did not fail (its retention applied) with the topic,
#: its policy, its settings and its summary, which it may add to: what ``compact`` does
#: after a publish beside compacting (the topic's Iceberg table: shale.iceberg.follow).
AfterPublish = Callable[[TopicMetadata, TopicPolicy, Settings, RunSummary], None]


def compact_topics(settings: Settings | Mapping[str, Any] | None = None, *, engine: Engine | None = None,
                   on_event: EventListener | None = None, backlog: bool = False,
                   after_publish: AfterPublish | None = None) -> list[RunSummary]:
    """Compact the topics ``settings`` name (``topics`` or ``all``), each under its own
    policy, and return their summaries in the order they ran.  ``settings``: ``compact``'s
    resolved settings (:func:`shale.settings.resolve`), or the values to resolve them
    from, by name (``{"all": "s3://b/topics", "max-topics": 50}``).  One engine compacts
    every topic (with Spark, one application); it is not closed here.  A prefix without
    topics (a deployment that has none yet) is no error: no summary, and a ``run.empty``
    event that says so.  Each topic is opened once (:class:`~shale.metadata.handle.Topic`):
    its documents read to choose it are what its run plans from (for the first
    :data:`HELD_TOPICS` topics in the order; those after read them again when they run).
    With ``backlog``, each ``topic.done`` event carries what the topic has left above its
    horizon after its run (:func:`~shale.compactor.topics.backlog`, from the same handle:
    nothing read again but a footer).  ``after_publish``: called after each topic's run
    that did not fail (:data:`AfterPublish`)."""
    with_backlog = backlog
    s = settings if isinstance(settings, Settings) else resolve("compact", settings or {})
    tell = on_event or _ignore
    engine = engine or LocalEngine()
    chosen = choose_topics(s)
    if not chosen:
        tell(RunEvent("run.empty", s.value("all")))
        return []
    tell(RunEvent("run.start", topics=len(chosen)))
    # An application's start-up (Spark's) is a phase of its own: in the first topic's summary
    first = {f"{engine.name}_start": _start(engine, tell)} if engine.starts_application else {}
    if not engine.starts_application:
        engine.ready()
    lock = threading.Lock()

    def one(item: tuple[Topic | str, bool]) -> RunSummary:
        summary = _run_one(item[0], item[1], s, engine, tell, after_publish)
        with lock:  # run-wide phases go into the first summary done, its total counting them
            if first:
                summary.durations = {**first, **summary.durations,
                                     "total": summary.durations.get("total", 0.0) + sum(first.values())}
                first.clear()
        after = _backlog(item[0]) if with_backlog else None
        tell(RunEvent("topic.done", summary.topic, summary=summary, backlog=after))
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
    tell(RunEvent(f"{engine.name}.starting"))
    started = time.perf_counter()
    engine.ready()  # (starts the application and its executors' Python workers)
    seconds = round(time.perf_counter() - started, 3)
    tell(RunEvent(f"{engine.name}.start", seconds=seconds))
    return seconds


def choose_topics(settings: Settings) -> list[tuple[Topic | str, bool]]:
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
    now_ms = int(time.time() * 1000)
    topics_ = [_opened(u, settings) for u in uris]
    if prefix is None and max_lag is None and max_topics is None:
        # the order given; a topic is still overdue by its own policy's lag (unless a flag set one)
        if settings.source("max-compaction-lag") is Source.FLAG:
            return [(t, False) for t in topics_]
        return _held([(t, assess(t, now_ms=now_ms).overdue) for t in topics_])
    chosen = choose(topics_, now_ms=now_ms, max_topics=max_topics)
    return _held([(c.topic or c.uri, c.overdue) for c in chosen])


#: The topics of a run whose documents, read to choose them, are held until they run; a
#: topic further down the order reads them again when it runs, so that a run over
#: thousands of topics does not hold thousands of ledger lists.
HELD_TOPICS: Final = 128


def _held(chosen: list[tuple[Topic | str, bool]]) -> list[tuple[Topic | str, bool]]:
    for t, _ in chosen[HELD_TOPICS:]:
        if isinstance(t, Topic):
            t.forget()
    return chosen


def _opened(uri: str, settings: Settings) -> Topic | str:
    """``uri``'s handle for this run (its metadata where ``metadata`` says), or ``uri``
    itself when it cannot be opened: its run opens it again, and fails on its own."""
    try:
        return Topic.open(uri, settings.value("metadata"), settings=settings)
    except Exception:
        return uri


def _run_one(topic: Topic | str, overdue: bool, settings: Settings, engine: Engine,
             tell: EventListener, after_publish: AfterPublish | None = None) -> RunSummary:
    """One topic's run; whatever it raises becomes its summary's error."""
    shown = topic.uri if isinstance(topic, Topic) else _shown(topic)
    start = time.perf_counter()
    tell(RunEvent("topic.start", shown, overdue=overdue))
    try:
        if interrupts.interrupted():  # a topic not begun when the run was interrupted is not begun
            raise KeyboardInterrupt
        return compact_topic(topic, settings, overdue=overdue, engine=engine,
                             progress=lambda phase: tell(RunEvent("topic.phase", shown, phase=phase)),
                             after_publish=after_publish)
    except Exception as e:  # one topic's failure, of any kind, never stops another's run
        summary = RunSummary(shown, engine=engine.name, error=mask_secrets(error_line(e)), failure=e)
        summary.durations["total"] = time.perf_counter() - start
        return summary.finish(RunStatus.ERROR)


def compact_topic(topic: Topic | str, settings: Settings, *, overdue: bool = False, engine: Engine | None = None,
                  progress: Callable[[str], None] | None = None,
                  after_publish: AfterPublish | None = None) -> RunSummary:
    """One topic's run under its own policy (a run's flag wins over it; an ``overdue``
    topic is compacted whatever its dirty ratio), then the policy's retention, whatever
    the run found to do (compacted, nothing to do, skipped, or lost its race to another
    compactor), applied only to ledgers the horizon covers that no subscription or
    snapshot holds (:func:`~shale.maintenance.retention.policy_retention`), then
    ``after_publish``.  ``topic``: its handle (the documents it holds are what the run
    plans from), or its URI."""
    t = topic if isinstance(topic, Topic) else Topic.open(topic, settings.value("metadata"), settings=settings)
    if t.settings is None:
        t.settings = settings
    refuse_a_file(t.meta.topic)
    own = t.effective()
    if overdue:
        own = own.replace("min-dirty-ratio", 0.0)
    summary = Compactor(t, CompactionConfig.from_settings(own), progress=progress, engine=engine).run()
    note = _retention(t, summary, progress)
    if note:
        summary.message = f"{summary.message}; {note}" if summary.message else note
    if after_publish is not None and summary.ok:
        after_publish(t.meta, t.policy, own, summary)
    return summary


#: The outcomes after which the policy's retention applies (a dry run changes nothing; a
#: failed run leaves the topic to whoever looks at its error).
_RETAINING: Final = (RunStatus.COMPACTED, RunStatus.NOTHING_TO_DO, RunStatus.SKIPPED, RunStatus.CONFLICT)


def _retention(t: Topic, summary: RunSummary, progress: Callable[[str], None] | None) -> str:
    """The policy's retention after the run, in words for its summary ("" when the policy
    sets none, or it found nothing to remove and nothing held back), cut from the documents
    the run left in its handle."""
    from shale.maintenance.retention import policy_retention

    if summary.status not in _RETAINING or (t.policy.get("retention_ms") is None
                                            and t.policy.get("retention_bytes") is None):
        return ""
    if progress is not None:
        progress("retention")
    done = policy_retention(t)
    summary.retention_removed = len(done.removed)
    notes = [f"retention removed {count(len(done.removed), 'ledger')} below the horizon"] if done.removed else []
    if done.cut is not None and done.cut.held_by:
        notes.append(f"retention: {done.cut.human()}")
    return "; ".join(notes)


def _backlog(topic: Topic | str) -> Backlog | None:
    """What ``topic`` has left above its horizon after its run (None: it cannot be read)."""
    try:
        return backlog(topic)
    except Exception:  # the topic cannot be read (its error, if any, is the run's)
        return None


def _shown(uri: str) -> str:
    """A topic as summaries name it: its canonical URI, as a run names it, or the URI as
    given (credentials masked) when it does not resolve."""
    from shale.storage import resolve as resolve_uri

    try:
        return resolve_uri(uri).uri
    except Exception:
        return mask_secrets(uri)
