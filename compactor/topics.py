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

from collections.abc import Sequence
from dataclasses import field

from shale.ledger.errors import error_line
from shale.ledger.values import dataclass
from shale.maintenance.subscriptions import Lag, slowest, subscription_statuses
from shale.metadata.handle import Topic, opened
from shale.metadata.layout import refuse_a_file

__all__ = ["Backlog", "TopicChoice", "assess", "backlog", "choose", "refuse_a_file"]


@dataclass(frozen=True, slots=True)
class TopicChoice:
    """One candidate topic and why it is where it is in the order."""

    uri: str
    dirty_ratio: float
    oldest_uncompacted_ms: int | None  # first publish time above the horizon; None: nothing new
    overdue: bool  # older than --max-compaction-lag: compacted whatever its ratio
    error: str | None = None  # its metadata could not be read (it is still attempted, and fails clearly)
    #: the topic, opened: its documents as read to choose it (what its run starts from)
    topic: Topic | None = field(default=None, compare=False)


def _max_lag(topic: Topic, max_lag_ms: int | None, policy_lag: bool) -> int | None:
    """The max compaction lag in force for ``topic``: with a run's settings, by the one
    precedence rule; else ``max_lag_ms``, which with ``policy_lag`` the topic's own policy
    replaces when it sets one."""
    if topic.settings is not None and "max-compaction-lag" in topic.settings:
        lag: int | None = topic.value("max-compaction-lag")
        return lag
    if policy_lag and (own := topic.policy.get("max_compaction_lag_ms")) is not None:
        return int(own)
    return max_lag_ms


def assess(topic: Topic | str, *, now_ms: int, max_lag_ms: int | None = None, metadata_uri: str | None = None,
           policy_lag: bool = False) -> TopicChoice:
    """One topic's dirty ratio and age, from its metadata documents (read once, through the
    handle the choice keeps); the max compaction lag by :func:`_max_lag`."""
    try:
        t = opened(topic, metadata_uri)
        view = t.view()
        max_lag_ms = _max_lag(t, max_lag_ms, policy_lag)
    except Exception as e:  # still attempted, and fails clearly on its own (never stops the others)
        uri = topic.uri if isinstance(topic, Topic) else topic
        return TopicChoice(uri, 1.0, None, True, error_line(e), topic if isinstance(topic, Topic) else None)
    _, ratio = view.dirt_estimated()
    oldest = view.oldest_above_estimated()
    overdue = max_lag_ms is not None and oldest is not None and now_ms - oldest >= max_lag_ms
    return TopicChoice(t.uri, ratio, oldest, overdue, topic=t)


def choose(topics: Sequence[Topic | str], *, now_ms: int, max_lag_ms: int | None = None,
           max_topics: int | None = None, metadata_uri: str | None = None,
           policy_lag: bool = False) -> list[TopicChoice]:
    """``topics`` in the order to compact them: overdue topics first (oldest first), then
    the rest by dirty ratio, highest first; at most ``max_topics``."""
    choices = [assess(t, now_ms=now_ms, max_lag_ms=max_lag_ms, metadata_uri=metadata_uri, policy_lag=policy_lag)
               for t in topics]
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


def backlog(topic: Topic | str, *, max_lag_ms: int | None = None, metadata_uri: str | None = None,
            policy_lag: bool = False) -> Backlog:
    """The topic's backlog, from the documents its handle holds (after a run: as the run
    left them, nothing read again); the max compaction lag by :func:`_max_lag`.  Unlike
    :func:`assess` the age is exact (:meth:`~shale.metadata.view.TopicView.oldest_above_exact`:
    one footer read when the horizon lies inside a ledger); so is the slowest subscription's
    lag.  Raises what reading the topic raises."""
    t = opened(topic, metadata_uri)
    view = t.view()
    slow = slowest(subscription_statuses(t))
    return Backlog(view.dirt_estimated()[1], view.oldest_above_exact(t.meta), _max_lag(t, max_lag_ms, policy_lag),
                   Lag() if slow is None else slow.lag)
