"""``shale topics PREFIX``: every topic under a prefix, one row each (Kafka's
``kafka-topics --describe``, Pulsar's ``pulsar-admin topics list``).

A row needs only the topic's metadata documents, never a footer, so listing thousands of
topics costs one listing of the prefix and two small reads per topic (read a few at a
time).  The dirty ratio is the estimate ``compact --all`` orders topics by.  A topic whose
metadata cannot be read is still listed, with the error, and never stops the others.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from shale.ledger.errors import InvalidURIError, error_line
from shale.ledger.values import dataclass
from shale.maintenance.policies import policy_text
from shale.maintenance.subscriptions import SubscriptionStatus, slowest, subscription_statuses
from shale.metadata.handle import Topic
from shale.metadata.layout import META_DIR, refuse_a_file
from shale.metadata.topic import TOPIC_DOC
from shale.metadata.view import TopicView
from shale.settings.units import format_time
from shale.storage import resolve

__all__ = ["TopicRow", "describe_topic", "discover_topics", "list_topics", "rows_text"]


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
class TopicRow:
    """One topic as ``shale topics`` shows it."""

    uri: str
    ledgers: int = 0
    records: int = 0
    bytes: int = 0
    horizon: str | None = None
    epoch: int = 0
    dirty_ratio: float = 0.0
    last_compaction_ms: int | None = None
    policy: dict[str, str] | None = None
    error: str | None = None
    #: the slowest active subscription (estimated from the metadata), if any is active
    slowest: SubscriptionStatus | None = None

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.uri, "ledgers": self.ledgers, "records": self.records, "bytes": self.bytes,
                "horizon": self.horizon, "epoch": self.epoch, "dirty_ratio": round(self.dirty_ratio, 6),
                "last_compaction_ms": self.last_compaction_ms, "policy": self.policy or {}, "error": self.error,
                "slowest_subscription": None if self.slowest is None else self.slowest.to_json()}


def describe_topic(uri: str) -> TopicRow:
    """``uri``'s row, from its metadata documents; the error in the row if they cannot be read."""
    try:
        t = Topic.open(uri)
        topic, state, policy = t.state, t.compaction, t.policy
        slow = slowest(subscription_statuses(t, footers=False))
    except Exception as e:  # listed with its error; never stops the others
        return TopicRow(uri, error=error_line(e))
    _, ratio = TopicView(topic, state).dirt_estimated()
    return TopicRow(uri, len(topic.ledgers), topic.records, topic.bytes,
                    str(state.horizon) if state.horizon else None, state.epoch, ratio,
                    state.compacted_ms or None, policy_text(policy), slowest=slow)


def list_topics(prefix_uri: str, *, reads: int = 8) -> list[TopicRow]:
    """A row for every topic under ``prefix_uri``, sorted by URI."""
    uris = discover_topics(prefix_uri)
    with ThreadPoolExecutor(max_workers=max(1, min(reads, len(uris))), thread_name_prefix="shale-list") as pool:
        return list(pool.map(describe_topic, uris))


def _when(ms: int | None) -> str:
    if not ms:
        return "never"
    return format_time(ms, style="minutes")


def rows_text(rows: list[TopicRow]) -> str:
    """A table, one topic a line."""
    subs = any(r.slowest is not None for r in rows)  # the column only where a subscription is active
    head = ("TOPIC", "LEDGERS", "RECORDS", "BYTES", "HORIZON", "DIRTY", "LAST COMPACTION (UTC)")
    table: list[tuple[str, ...]] = [(*head, *(["SUBSCRIPTION LAG"] if subs else []), "POLICY")]
    for r in rows:
        if r.error is not None:
            table.append((r.uri, "-", "-", "-", "-", "-", "-", *(["-"] if subs else []), f"error: {r.error}"))
            continue
        policy = ",".join(f"{k}={v}" for k, v in sorted((r.policy or {}).items())) or "-"
        lag = [] if not subs else ["-" if r.slowest is None else f"{r.slowest.lag.records:,}"]
        table.append((r.uri, f"{r.ledgers:,}", f"{r.records:,}", f"{r.bytes:,}", r.horizon or "-",
                      f"{r.dirty_ratio:.3f}", _when(r.last_compaction_ms), *lag, policy))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    right = {1, 2, 3, 5, 7} if subs else {1, 2, 3, 5}
    return "\n".join("  ".join(c.rjust(w) if i in right else c.ljust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()
                     for row in table)
