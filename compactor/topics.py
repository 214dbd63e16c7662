"""Many topics per run: find the topics under a prefix and pick the filthiest first.

A topic is a folder holding ``_meta/topic.json``.  Choosing needs only the two metadata
documents of each topic, never a footer: the dirty ratio is estimated from ledger sizes
(bytes of the ledgers above the compaction horizon over those plus the live compacted
bytes, the horizon's own ledger counted whole), and the age of the oldest uncompacted
record is the first publish time of the first ledger above the horizon.  Kafka's
cleaner picks the log with the highest dirty ratio the same way; a topic whose oldest
uncompacted record is older than ``--max-compaction-lag`` goes first whatever its ratio
(Kafka's ``max.compaction.lag.ms``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shale.compactor.plan import dirty_ratio
from shale.ledger.errors import InvalidURIError, error_line
from shale.ledger.format import KIND_ORIGINAL
from shale.ledger.reader import LedgerFile
from shale.maintenance.subscriptions import Lag, slowest, subscription_statuses
from shale.metadata.layout import META_DIR, refuse_a_file
from shale.metadata.state import CompactionState, TopicState
from shale.metadata.topic import TOPIC_DOC, TopicMetadata
from shale.storage import resolve

__all__ = ["Backlog", "TopicChoice", "assess", "backlog", "choose", "discover_topics", "estimate_dirt",
           "refuse_a_file"]


def discover_topics(prefix_uri: str) -> list[str]:
    """URIs of every topic under ``prefix_uri``, sorted (the listing reads every object
    name under the prefix once)."""
    loc = resolve(prefix_uri)
    refuse_a_file(loc)
    marker = f"/{META_DIR}/{TOPIC_DOC}"
    found = set()
    for info in loc.store.list(f"{loc.prefix}/" if loc.prefix else ""):
        rel = loc.relative(info.key)
        if rel.endswith(marker) and rel != marker.lstrip("/"):
            found.add(rel[: -len(marker)])
        elif rel == marker.lstrip("/"):
            raise InvalidURIError(f"{prefix_uri} is a topic itself, not a prefix of topics")
    return [f"{loc.uri.rstrip('/')}/{t}" for t in sorted(found)]


@dataclass(frozen=True, slots=True)
class TopicChoice:
    """One candidate topic and why it is where it is in the order."""

    uri: str
    dirty_ratio: float
    oldest_uncompacted_ms: int | None  # first publish time above the horizon; None: nothing new
    overdue: bool  # older than --max-compaction-lag: compacted whatever its ratio
    error: str | None = None  # its metadata could not be read (it is still attempted, and fails clearly)


def estimate_dirt(topic: TopicState, state: CompactionState) -> tuple[int, float]:
    """Bytes above the horizon and the dirty ratio, from the metadata alone (the horizon's
    own ledger counted whole)."""
    h = state.horizon
    dirty = sum(lg.bytes for lg in topic.ledgers if h is None or lg.id > h.ledger)
    compacted = sum(p.bytes * (p.live / p.records) for p in state.parts if p.records)
    return dirty, dirty_ratio(dirty, compacted)


def assess(uri: str, *, now_ms: int, max_lag_ms: int | None = None, metadata_uri: str | None = None,
           policy_lag: bool = False) -> TopicChoice:
    """One topic's dirty ratio and age, from its metadata documents; with ``policy_lag``
    the topic's own max compaction lag, if its policy sets one, replaces ``max_lag_ms``."""
    try:
        meta = TopicMetadata.open(uri, metadata_uri)
        topic, state = meta.load_topic(), meta.load_compaction()
        if policy_lag and (own := meta.load_policy().get("max_compaction_lag_ms")) is not None:
            max_lag_ms = own
    except Exception as e:  # still attempted, and fails clearly on its own (never stops the others)
        return TopicChoice(uri, 1.0, None, True, error_line(e))
    h = state.horizon
    above = [lg for lg in topic.ledgers if h is None or lg.id > h.ledger]
    _, ratio = estimate_dirt(topic, state)
    oldest = min((lg.first_publish for lg in above), default=None)
    overdue = max_lag_ms is not None and oldest is not None and now_ms - oldest >= max_lag_ms
    return TopicChoice(uri, ratio, oldest, overdue)


def choose(uris: list[str], *, now_ms: int, max_lag_ms: int | None = None, max_topics: int | None = None,
           metadata_uri: str | None = None, policy_lag: bool = False) -> list[TopicChoice]:
    """``uris`` in the order to compact them: overdue topics first (oldest first), then
    the rest by dirty ratio, highest first; at most ``max_topics``."""
    choices = [assess(u, now_ms=now_ms, max_lag_ms=max_lag_ms, metadata_uri=metadata_uri, policy_lag=policy_lag)
               for u in uris]
    choices.sort(key=lambda c: (not c.overdue, c.oldest_uncompacted_ms if c.overdue else 0, -c.dirty_ratio, c.uri))
    return choices[:max_topics] if max_topics is not None else choices


@dataclass(frozen=True, slots=True)
class Backlog:
    """What a topic has left above its horizon (what its metrics show after a run)."""

    dirty_ratio: float  # estimated from ledger sizes, as :func:`assess`
    oldest_ms: int | None  # publish time of the oldest record above the horizon; None: nothing is
    max_lag_ms: int | None  # the max compaction lag in force for the topic; None: none is set
    #: what the slowest active subscription has yet to read (nothing when none is active)
    subscription_lag: Lag = field(default_factory=Lag)


def backlog(uri: str, *, max_lag_ms: int | None = None, metadata_uri: str | None = None,
            policy_lag: bool = False) -> Backlog:
    """``uri``'s backlog; with ``policy_lag`` the topic's own max compaction lag, if its
    policy sets one, replaces ``max_lag_ms``.  Unlike :func:`assess` the age is exact:
    when the horizon lies inside a ledger, that ledger's footer says when the entry after
    the horizon was published (one read); so is the slowest subscription's lag.  Raises
    what reading the topic raises."""
    meta = TopicMetadata.open(uri, metadata_uri)
    topic, state = meta.load_topic(), meta.load_compaction()
    if policy_lag and (own := meta.load_policy().get("max_compaction_lag_ms")) is not None:
        max_lag_ms = own
    h = state.horizon
    times = [lg.first_publish for lg in topic.ledgers if h is None or lg.id > h.ledger]
    at = next((lg for lg in topic.ledgers if h is not None and lg.id == h.ledger and h.entry + 1 < lg.entries), None)
    if at is not None and h is not None:
        f = LedgerFile.open(meta.topic.store, meta.topic.key(at.object), ledger_id=at.id, kind=KIND_ORIGINAL,
                            dictionaries=meta.dictionaries)
        times.append(int(f.footer.col("e_publish")[h.entry + 1:].min()))
    slow = slowest(subscription_statuses(meta, topic=topic))
    return Backlog(estimate_dirt(topic, state)[1], min(times, default=None), max_lag_ms,
                   Lag() if slow is None else slow.lag)
