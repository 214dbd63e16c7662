"""``shale status``: a topic's ledgers and compaction state, as text or one JSON document.

Status reports what it can: a damaged ledger or compacted part does not stop it (it is the
topic that needs attention that an operator looks at); the damaged objects are listed,
and the dirty ratio is then estimated from the metadata alone, as ``compact --all``
orders topics.  ``shale verify --scrub`` is the check that fails on damage.  Damage is
an object a reader would refuse as corrupt, or one the topic names that is missing; an
object the store will not let Shale read is not damage, and status fails with that
permission error (exit 2), as it does when the store fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shale.ledger.errors import CORRUPTION, ObjectNotFoundError, ShaleError, error_line
from shale.ledger.reader import LedgerFile
from shale.maintenance.policies import policy_text
from shale.maintenance.subscriptions import slowest, subscription_statuses
from shale.maintenance.tags import utc_time, view_lines, view_rows
from shale.metadata.handle import Topic, opened
from shale.metadata.state import CompactionState
from shale.metadata.topic import TopicMetadata
from shale.metadata.view import Removed, TopicView
from shale.settings.units import count, format_duration

__all__ = ["status_text", "topic_status"]


def topic_status(topic_uri: Topic | str, metadata_uri: str | None = None) -> dict[str, Any]:
    """Ledger count, records, bytes, first/last ids, every ledger and compacted part, the
    compaction state, and the objects found damaged (each document read once)."""
    t = opened(topic_uri, metadata_uri)
    meta = t.meta
    topic, comp = t.state, t.compaction
    damaged: list[dict[str, str]] = []
    view = TopicView(topic, comp)
    try:
        # The dirty ratio a compaction run would see (no lag): from the footers.
        dirty, ratio = view.dirt_exact(meta)
    except ShaleError:
        damaged = _damaged(meta, view)
        if not damaged:
            raise  # not damage: the store or the metadata failed, and the error says so
        dirty, ratio = view.dirt_estimated()
    last_id = None
    if topic.ledgers and not any(d["object"] == topic.ledgers[-1].object for d in damaged):
        lg = topic.ledgers[-1]
        last_id = LedgerFile.open(meta.topic.store, meta.topic.key(lg.object), ledger_id=lg.id).last_id()
    return {
        "topic": meta.uri,
        "ledgers": len(topic.ledgers),
        "records": topic.records,
        "bytes": topic.bytes,
        "raw_bytes": sum(lg.uncompressed_bytes for lg in topic.ledgers),
        "first_id": str(topic.ledgers[0].first_id) if topic.ledgers else None,
        "last_id": str(last_id) if last_id else None,
        "created_ms": topic.created_ms,
        "metadata_version": topic.version,
        "ledger_list": [{"id": lg.id, "object": lg.object, "records": lg.records, "bytes": lg.bytes,
                         "raw_bytes": lg.uncompressed_bytes,
                         "first_publish_ms": lg.first_publish, "last_publish_ms": lg.last_publish}
                        for lg in topic.ledgers],
        "compaction": _compaction(comp, dirty, ratio),
        "policy": policy_text(t.policy),
        "damaged": damaged,
        **_subscriptions(t),
    }


def _compaction(comp: CompactionState, dirty: int, ratio: float) -> dict[str, Any]:
    """The compaction state as status shows it, with the dirt above its horizon."""
    return {
        "epoch": comp.epoch,
        "horizon": str(comp.horizon) if comp.horizon else None,
        "compacted_ledger": comp.compacted_ledger,
        "compacted_records": comp.records,
        "compacted_bytes": comp.bytes,
        "compacted_raw_bytes": sum(p.uncompressed_bytes for p in comp.parts),
        "keys": comp.keys,
        "tombstones": comp.tombstones,
        "dirty_bytes": dirty,
        "dirty_ratio": round(ratio, 6),
        # how the view decided its latest records (readers decide by the same)
        "order": comp.order.order,
        "key_ttl_ms": comp.order.key_ttl_ms,
        "keys_expired": int(comp.last_run.get("keys_expired", 0)),
        "last_compaction_ms": comp.compacted_ms or None,
        "retired_pending": sum(len(r.objects) for r in comp.retired),
        "parts": [{"object": p.object, "records": p.records, "live": p.live, "bytes": p.bytes,
                   "raw_bytes": p.uncompressed_bytes}
                  for p in comp.parts],
        "snapshots": view_rows(comp, published=False),  # (earlier views, oldest first)
        "tags": dict(sorted(comp.tags.items())),

    }


def _subscriptions(t: Topic) -> dict[str, Any]:
    """The topic's durable subscriptions with their lag and state, and the slowest active
    one (None: none is active)."""
    statuses = subscription_statuses(t)
    slow = slowest(statuses)
    return {"subscriptions": [s.to_json() for s in statuses],
            "slowest_subscription": None if slow is None else slow.to_json()}


def _damaged(meta: TopicMetadata, view: TopicView) -> list[dict[str, str]]:
    """Every object the compacted view reads whose footer cannot be read, with why (an
    error that is not the object's damage — permission denied, the store failing — is
    raised).  The view reads every compacted part and the ledgers from the one the horizon
    lies in (:meth:`~shale.metadata.view.TopicView.segments`: a run opens that one to find
    the record after the horizon), so a damaged one would stop the next run; a ledger
    wholly below the horizon is read by neither, and status does not read it either."""
    found = []
    for seg in view.segments():
        if isinstance(seg, Removed):
            continue
        try:
            seg.open(meta)
        except ShaleError as e:
            if not _is_damage(e):
                raise
            found.append({"object": seg.object, "error": error_line(e)})
    return found


def _is_damage(e: ShaleError) -> bool:
    """Whether ``e``, met reading an object the topic names, says the object is damaged
    (corrupt, or missing) rather than that it could not be read (access denied, the
    store failing)."""
    return isinstance(e, (*CORRUPTION, ObjectNotFoundError))


def _table(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.rjust(w) if c[:1].isdigit() else c.ljust(w)
                               for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _stored(stored: int, raw: int) -> str:
    """Bytes stored, and uncompressed with the ratio when compression saved any."""
    if raw <= stored or not stored:
        return count(stored, "byte")
    return f"{count(stored, 'byte')} stored ({raw:,} uncompressed, {raw / stored:.1f}x)"


def _subscriptions_text(doc: dict[str, Any]) -> list[str]:
    subs = doc.get("subscriptions") or []
    if not subs:
        return []
    slow = doc["slowest_subscription"]
    text = f"subscriptions {len(subs)}: " + (
        f"slowest {slow['name']} at {slow['position']}, {count(slow['lag_records'], 'record')} "
        f"({count(slow['lag_bytes'], 'byte')}) behind" if slow else "none active")
    expired = [s["name"] for s in subs if s["state"] == "expired"]
    if expired:
        text += f"; expired (holding nothing back): {', '.join(expired)}"
    return [text]


def status_text(doc: dict[str, Any]) -> str:
    """``doc`` (from :func:`topic_status`) for a person to read."""
    c = doc["compaction"]
    n = doc["ledgers"]
    lines = [f"topic     {doc['topic']}",
             f"ledgers   {count(n, 'ledger')}, {count(doc['records'], 'record')}, "
             f"{_stored(doc['bytes'], doc['raw_bytes'])}"
             + (f", ids {doc['first_id']} to {doc['last_id'] or '?'}" if n else "")]
    if n:
        rows: list[tuple[str, ...]] = [("id", "records", "bytes", "raw bytes", "first publish (UTC)",
                                        "last publish (UTC)")]
        rows += [(str(lg["id"]), f"{lg['records']:,}", f"{lg['bytes']:,}", f"{lg['raw_bytes']:,}",
                  utc_time(lg["first_publish_ms"]), utc_time(lg["last_publish_ms"])) for lg in doc["ledger_list"]]
        lines += _table(rows)
    if c["horizon"] is None:
        lines.append("horizon   none: never compacted")
    else:
        tagged = sorted(n for n, e in c["tags"].items() if e == c["epoch"])
        lines.append(f"horizon   {c['horizon']} (epoch {c['epoch']}, compacted {utc_time(c['last_compaction_ms'])} UTC"
                     f"{', tagged ' + ', '.join(tagged) if tagged else ''})")
        parts = c["parts"]
        lines.append(f"compacted {count(c['keys'], 'key')} ({count(c['tombstones'], 'tombstone')}), "
                     f"{count(c['compacted_records'], 'live record')}, "
                     f"{_stored(c['compacted_bytes'], c['compacted_raw_bytes'])} in {count(len(parts), 'part')}")
        if parts:
            rows = [("object", "records", "live", "bytes", "raw bytes")]
            rows += [(str(p["object"]), f"{p['records']:,}", f"{p['live']:,}", f"{p['bytes']:,}",
                      f"{p['raw_bytes']:,}") for p in parts]
            lines += _table(rows)
        ttl = (f"; keys expire {format_duration(c['key_ttl_ms'])} after their latest record "
               f"({count(c['keys_expired'], 'key')} expired by the last run)" if c["key_ttl_ms"] else "")
        lines.append(f"order     {c['order']}{ttl}")
    lines += view_lines(c["snapshots"])
    lines.append(f"dirty     {count(c['dirty_bytes'], 'byte')} above the horizon, dirty ratio {c['dirty_ratio']:.3f}")
    if c["retired_pending"]:
        lines.append(f"retired   {count(c['retired_pending'], 'object')} waiting for gc")
    policy = ", ".join(f"{k}={v}" for k, v in doc["policy"].items())
    lines.append(f"policy    {policy or 'none: every setting comes from the run'}")
    lines += _subscriptions_text(doc)
    for d in doc["damaged"]:
        lines.append(f"damaged   {d['object']}: {d['error']}")
    return "\n".join(lines)
