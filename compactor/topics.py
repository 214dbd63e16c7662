"""Many topics per run: which to compact first, the overdue then the filthiest (the topics
under a prefix are found by :func:`shale.maintenance.listing.discover_topics`).

Choosing needs only the two metadata
documents of each topic, never a footer: the dirty ratio is estimated from ledger sizes
(:meth:`~shale.metadata.view.TopicView.dirt_estimated`), and the age of the oldest
uncompacted record is the first publish time of the first ledger wholly above the horizon
(:meth:`~shale.metadata.view.TopicView.oldest_above_estimated`).  Kafka's
cleaner picks the log with the highest dirty ratio the same way; a topic whose oldest
uncompacted record is older than ``--max-compaction-lag`` goes first whatever its ratio
(Kafka's ``max.compaction.lag.ms``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shale.ledger.errors import error_line
from shale.maintenance.subscriptions import Lag, slowest, subscription_statuses
from shale.metadata.layout import refuse_a_file
from shale.metadata.topic import TopicMetadata
from shale.metadata.view import TopicView

__all__ = ["Backlog", "TopicChoice", "assess", "backlog", "choose", "refuse_a_file"]


@dataclass(frozen=True, slots=True)
class TopicChoice:
    """One candidate topic and why it is where it is in the order."""

    uri: str
    dirty_ratio: float
    oldest_uncompacted_ms: int | None  # first publish time above the horizon; None: nothing new
    overdue: bool  # older than --max-compaction-lag: compacted whatever its ratio
    error: str | None = None  # its metadata could not be read (it is still attempted, and fails clearly)


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
    view = TopicView(topic, state)
    _, ratio = view.dirt_estimated()
    oldest = view.oldest_above_estimated()
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
    view = TopicView(topic, state)
    slow = slowest(subscription_statuses(meta, topic=topic))
    return Backlog(view.dirt_estimated()[1], view.oldest_above_exact(meta), max_lag_ms,
                   Lag() if slow is None else slow.lag)
