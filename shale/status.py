"""``shale status``: one JSON document describing a topic and its compaction state."""

from __future__ import annotations

import time
from typing import Any

from shale.compactor.plan import make_plan
from shale.metadata.topic import TopicMetadata

__all__ = ["topic_status"]


def topic_status(topic_uri: str, metadata_uri: str | None = None) -> dict[str, Any]:
    """Ledger count, records, bytes, first/last ids, and the compaction state."""
    meta = TopicMetadata.open(topic_uri, metadata_uri)
    # The dirty ratio is the one a compaction run would see (its own plan, no lag).
    plan = make_plan(meta, now_ms=int(time.time() * 1000), min_compaction_lag_ms=0)
    topic, comp = plan.topic, plan.previous
    ledgers = topic.ledgers
    last_id = None
    if ledgers:
        from shale.ledger.reader import LedgerFile

        f = LedgerFile.open(meta.topic.store, meta.topic.key(ledgers[-1].object), ledger_id=ledgers[-1].id)
        last_id = f.last_id()
    return {
        "topic": meta.uri,
        "ledgers": len(ledgers),
        "records": topic.records,
        "bytes": topic.bytes,
        "first_id": str(ledgers[0].first_id) if ledgers else None,
        "last_id": str(last_id) if last_id else None,
        "created_ms": topic.created_ms,
        "metadata_version": topic.version,
        "compaction": {
            "epoch": comp.epoch,
            "horizon": str(comp.horizon) if comp.horizon else None,
            "compacted_ledger": comp.compacted_ledger,
            "compacted_records": comp.records,
            "compacted_bytes": comp.bytes,
            "keys": comp.keys,
            "tombstones": comp.tombstones,
            "dirty_bytes": plan.dirty_bytes,
            "dirty_ratio": round(plan.dirty_ratio, 6),
            "last_compaction_ms": comp.compacted_ms or None,
            "retired_pending": sum(len(r.objects) for r in comp.retired),
        },
    }
