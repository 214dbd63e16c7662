"""Every subscription's lag and state under a prefix, read again and again by
``shale exporter`` (Kafka operators' lag exporters: Burrow, kafka-lag-exporter).

A reading lists the topics under the prefix (or takes the one topic the URI names), then
reads each topic's subscriptions with their lag, a few topics at a time
(:func:`~shale.maintenance.subscriptions.subscription_statuses`: the subscription
documents, the ledger list and the footer of the ledger each position lies inside).  One
topic whose metadata cannot be read is reported with its error and never stops the
others; a prefix that cannot be listed is the reading's own error.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from shale.ledger.errors import ShaleError, error_line
from shale.ledger.values import dataclass
from shale.maintenance.listing import discover_topics
from shale.maintenance.subscriptions import SubscriptionStatus, subscription_statuses
from shale.metadata.handle import Topic
from shale.metadata.layout import META_DIR
from shale.metadata.topic import TOPIC_DOC
from shale.storage import resolve

__all__ = ["LagReading", "TopicLag", "read_lag", "topics_under"]


@dataclass(frozen=True, slots=True)
class TopicLag:
    """One topic's subscriptions, or why they could not be read."""

    topic: str
    rows: tuple[SubscriptionStatus, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True)
class LagReading:
    """One reading of every topic: when it ended and how long it took (seconds), and the
    prefix's own error when it could not be listed (then no topic was read)."""

    topics: tuple[TopicLag, ...]
    ended_s: float
    duration_s: float
    error: str | None = None


def topics_under(uri: str) -> list[str]:
    """The topics ``uri`` names: itself when it is a topic, else every topic under it."""
    loc = resolve(uri)
    if loc.store.exists(loc.key(f"{META_DIR}/{TOPIC_DOC}")):
        return [loc.uri.rstrip("/")]
    return discover_topics(uri)


def _topic_lag(uri: str, now_ms: int) -> TopicLag:
    try:
        topic = Topic.open(uri)
        topic.state  # noqa: B018  (read whether or not it has subscriptions: a damaged topic is said)
        return TopicLag(uri, tuple(subscription_statuses(topic, now_ms=now_ms)))
    except (ShaleError, OSError) as e:
        return TopicLag(uri, error=error_line(e))


def read_lag(uri: str, *, reads: int = 8, clock: Callable[[], float] = time.time) -> LagReading:
    """Every subscription's lag and state under ``uri`` (a prefix or one topic), judged at
    ``clock`` (seconds) when the reading starts; ``reads`` topics at a time."""
    start = clock()
    now_ms = int(start * 1000)
    try:
        uris = topics_under(uri)
    except (ShaleError, OSError) as e:
        end = clock()
        return LagReading((), end, end - start, error_line(e))
    with ThreadPoolExecutor(max_workers=max(1, min(reads, len(uris))), thread_name_prefix="shale-lag") as pool:
        topics = tuple(pool.map(lambda u: _topic_lag(u, now_ms), uris))
    end = clock()
    return LagReading(topics, end, end - start)
