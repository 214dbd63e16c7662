"""Every check of the metadata documents' schemas and invariants, one hostile document
each.

Each case starts from a valid ``topic.json``, ``compaction.json`` or ``policy.json`` and
breaks exactly one invariant; loading it must be refused with an
:class:`InvalidMetadataError` (exit 4) whose one line names the document, the field and
the check's own reason, so that a case passes only while the check it is written for is
there (another check refusing the document for another reason does not count).  The
documents go through ``shale status`` (in this process, for all of them; as a real
process for some) and through :class:`TopicMetadata`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shale.cli import main as shale_main
from shale.cli.errors import EXIT_CORRUPT, exit_code_of
from shale.ledger.errors import InvalidInputError, InvalidMetadataError
from shale.ledger.ids import MessageId
from shale.metadata.schema import LedgerDoc, validate
from shale.metadata.state import CompactedPart, LedgerInfo
from shale.metadata.topic import TopicMetadata
from tests.conftest import run_cli

NONCE = "0123456789ab"
RUN1, RUN2, RUN3 = (f"{e:012d}-{NONCE}" for e in (1, 2, 3))


def ledger(i: int, **fields: Any) -> dict[str, Any]:
    return {"id": i, "object": f"ledgers/{i:020d}-{NONCE}.ledger", "entries": 2, "records": 5, "bytes": 100,
            "first_publish": 10, "last_publish": 20, "sealed_ms": 30, "raw_bytes": 200, **fields}


def dictionary(i: int, nonce: str = NONCE) -> dict[str, Any]:
    return {"id": i, "object": f"dictionaries/{i:010d}-{nonce}.zdict", "bytes": 100, "created_ms": 1, "crc32c": 7}


TOPIC: dict[str, Any] = {"format": 1, "created_ms": 1, "ledgers": [ledger(3), ledger(4), ledger(6)],
                         "generation": 1, "removed_through": 2, "truncated_ms": 5,
                         "dictionaries": [dictionary(1), dictionary(2)],
                         "producers": {"in.jsonl@1": {"next": 5, "ledger": 4, "at_ms": 7}}}
PART0 = {"object": f"compacted/{RUN2}/part-00000.ledger", "entries": 1, "records": 3, "bytes": 100,
         "first_id": "3:0:0", "last_id": "4:1:2", "ledger_id": 2, "deletions": f"compacted/{RUN3}/deletions-00000.bin",
         "deleted": 1, "raw_bytes": 150}
PART1 = {"object": f"compacted/{RUN3}/part-00000.ledger", "entries": 1, "records": 2, "bytes": 100,
         "first_id": "6:0:0", "last_id": "6:1:4"}
RETIRED = {"objects": [f"compacted/{RUN1}/part-00000.ledger", f"compacted/{RUN2}/deletions-00000.bin"],
           "retired_ms": 5, "epoch": 2}
COMPACTION: dict[str, Any] = {"format": 1, "epoch": 3, "horizon": "6:1:4", "compacted_ledger": RUN3,
                              "parts": [PART0, PART1], "retired": [RETIRED], "keys": 4, "tombstones": 0,
                              "compacted_ms": 9, "last_run": {"anything": [1, {"x": None}]}, "topic_generation": 1}
SNAPSHOT_PART = {"object": PART0["object"], "entries": 1, "records": 3, "bytes": 100, "first_id": "3:0:0",
                 "last_id": "4:1:2", "ledger_id": 2}


def snapshot(**fields: Any) -> dict[str, Any]:
    """A valid retained snapshot (epoch 2, its part the one epoch 3 keeps in place), ``fields`` changed."""
    return {"epoch": 2, "horizon": "4:1:2", "compacted_ledger": RUN2, "parts": [dict(SNAPSHOT_PART)], "keys": 3,
            "tombstones": 0, "compacted_ms": 7, "replaced_ms": 9, "last_run": {}, **fields}


def with_snapshot(**fields: Any) -> Change:
    return at("snapshots", value=[snapshot(**fields)])


def snapshot_part(**fields: Any) -> Change:
    return with_snapshot(parts=[{**SNAPSHOT_PART, **fields}])


POLICY: dict[str, Any] = {"delete_retention_ms": 1000, "min_dirty_ratio": 0.5, "compression": "zstd:3",
                          "retain_null_key": True}

Change = Callable[[dict[str, Any]], object]


def at(*path: str | int, value: Any) -> Change:
    """Set the field at ``path`` (inside the document's value) to ``value``."""
    def change(d: dict[str, Any]) -> None:
        node = d
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value  # type: ignore[index]
    return change


def drop(*path: str | int) -> Change:
    def change(d: dict[str, Any]) -> None:
        node = d
        for k in path[:-1]:
            node = node[k]
        del node[path[-1]]  # type: ignore[arg-type]
    return change


def both(*changes: Change) -> Change:
    def change(d: dict[str, Any]) -> None:
        for c in changes:
            c(d)
    return change


def swap_parts(d: dict[str, Any]) -> None:
    d["parts"].reverse()


# (case, document, change, field, reason): every explicit check in metadata/schema.py,
# and in metadata/policy.py, in the order they are made.
CHECKS: list[tuple[str, str, Change, str, str]] = [
    # ---- topic.json: check_topic
    ("ledger-twice", "topic.json", at("ledgers", 2, value=ledger(4)), "ledgers[2].object", "is registered twice"),
    ("ids-fall", "topic.json", at("ledgers", 1, value=ledger(7)), "ledgers[2].id", "must rise strictly"),
    ("id-not-above-removed-through", "topic.json", at("removed_through", value=3), "ledgers[0].id",
     "above removed_through 3"),
    ("removed-last-in-another-ledger", "topic.json", at("removed_last", value="3:0:0"), "field removed_last",
     "is not in ledger 2"),
    ("removed-last-not-an-id", "topic.json", at("removed_last", value="2:0"), "field removed_last",
     "is not a message id"),
    ("object-not-a-ledger-name", "topic.json", at("ledgers", 1, "object", value="ledgers/4.ledger"),
     "ledgers[1].object", "is not the name of ledger 4"),
    ("object-of-another-ledger", "topic.json", at("ledgers", 1, "object", value=ledger(6)["object"]),
     "ledgers[1].object", "is not the name of ledger 4"),
    ("object-outside-ledgers", "topic.json", at("ledgers", 1, "object", value=f"compacted/{RUN3}/part-00000.ledger"),
     "ledgers[1].object", "is not the name of ledger 4"),
    ("fewer-records-than-entries", "topic.json", at("ledgers", 1, "records", value=1), "ledgers[1].records",
     "fewer records than entries"),
    ("first-publish-after-last", "topic.json", at("ledgers", 2, "first_publish", value=21),
     "ledgers[2].first_publish", "after last_publish"),
    ("producer-mark-past-the-last-ledger", "topic.json", at("producers", "in.jsonl@1", "ledger", value=7),
     "producers['in.jsonl@1'].ledger", "7 is after the last ledger the topic has had (6)"),
    ("dictionary-object-not-its-name", "topic.json", at("dictionaries", 1, "object", value="dictionaries/2.zdict"),
     "dictionaries[1].object", "is not the name of dictionary 2"),
    ("dictionary-object-of-another-id", "topic.json",
     at("dictionaries", 1, "object", value=dictionary(1)["object"]), "dictionaries[1].object",
     "is not the name of dictionary 2"),
    ("dictionary-twice", "topic.json", at("dictionaries", 1, value=dictionary(1, "ba9876543210")),
     "dictionaries[1].id", "dictionary 1 is registered twice"),
    # ---- compaction.json: check_compaction
    ("horizon-not-an-id", "compaction.json", at("horizon", value="6:1"), "field horizon", "is not a message id"),
    ("run-name", "compaction.json", at("compacted_ledger", value="../../x"), "compacted_ledger", "is not a run name"),
    ("parts-without-horizon", "compaction.json", at("horizon", value=None), "field horizon",
     "missing although parts are published"),
    ("horizon-at-epoch-0", "compaction.json",
     both(at("epoch", value=0), at("parts", value=[]), at("retired", value=[])), "field epoch",
     "0 although a horizon is published"),
    ("first-id-not-an-id", "compaction.json", at("parts", 1, "first_id", value="six"), "parts[1].first_id",
     "is not a message id"),
    ("last-id-not-an-id", "compaction.json", at("parts", 1, "last_id", value="6:1:4:0"), "parts[1].last_id",
     "is not a message id"),
    ("parts-out-of-order", "compaction.json", swap_parts, "parts[1].first_id", "must be in id order and disjoint"),
    ("parts-overlap", "compaction.json", at("parts", 1, "first_id", value="4:1:2"), "parts[1].first_id",
     "must be in id order and disjoint"),
    ("part-object-twice", "compaction.json", at("parts", 1, "object", value=PART0["object"]), "parts[1]",
     "is published twice"),
    ("deletion-vector-twice", "compaction.json",
     both(at("parts", 1, "deletions", value=PART0["deletions"]), at("parts", 1, "deleted", value=1)), "parts[1]",
     "is published twice"),
    # ---- compaction.json: _check_snapshots (each one a view, held to the published view's rules)
    ("snapshot-not-before-the-state", "compaction.json", with_snapshot(epoch=3), "snapshots[0].epoch",
     "3 must be before the state's epoch 3"),
    ("snapshots-out-of-order", "compaction.json", at("snapshots", value=[snapshot(), snapshot(epoch=1)]),
     "snapshots[1].epoch", "after the snapshot before it (2)"),
    ("snapshot-horizon-not-an-id", "compaction.json", with_snapshot(horizon="4:1"), "snapshots[0].horizon",
     "is not a message id"),
    ("snapshot-run-name", "compaction.json", with_snapshot(compacted_ledger="../../x"),
     "snapshots[0].compacted_ledger", "is not a run name"),
    ("snapshot-parts-without-horizon", "compaction.json", with_snapshot(horizon=None), "snapshots[0].horizon",
     "missing although parts are published"),
    ("snapshot-part-a-ledger", "compaction.json", snapshot_part(object=ledger(3)["object"]),
     "snapshots[0].parts[0].object", "is not a compacted part's name"),
    ("snapshot-part-a-document", "compaction.json", snapshot_part(object="_meta/topic.json"),
     "snapshots[0].parts[0].object", "is not a compacted part's name"),
    ("snapshot-vector-a-document", "compaction.json", snapshot_part(deletions="_meta/compaction.json", deleted=1),
     "snapshots[0].parts[0].deletions", "is not a deletion vector's name"),
    ("snapshot-part-past-its-horizon", "compaction.json", with_snapshot(horizon="4:1:1"),
     "snapshots[0].parts[0].last_id", "4:1:2 is past the horizon 4:1:1"),
    ("snapshot-part-written-after-its-epoch", "compaction.json", snapshot_part(ledger_id=3),
     "snapshots[0].parts[0].ledger_id", "3 is after the epoch 2"),
    ("snapshot-part-twice", "compaction.json", with_snapshot(parts=[SNAPSHOT_PART, SNAPSHOT_PART]),
     "snapshots[0].parts[1]", "must be in id order and disjoint"),
    ("retired-epoch-after-the-state", "compaction.json", at("retired", 0, "epoch", value=4), "retired[0].epoch",
     "4 is after the state's epoch"),
    ("retired-a-ledger", "compaction.json", at("retired", 0, "objects", 1, value=ledger(3)["object"]),
     "retired[0].objects[1]", "is not an object a compaction writes"),
    ("retired-a-document", "compaction.json", at("retired", 0, "objects", 0, value="_meta/topic.json"),
     "retired[0].objects[0]", "is not an object a compaction writes"),
    ("retired-part-still-published", "compaction.json", at("retired", 0, "objects", 0, value=PART1["object"]),
     "retired[0].objects[0]", "is retired but still published"),
    ("retired-vector-still-published", "compaction.json",
     at("retired", 0, "objects", 1, value=PART0["deletions"]), "retired[0].objects[1]",
     "is retired but still published"),
    ("retired-but-a-snapshot-reads-it", "compaction.json",
     with_snapshot(parts=[{**SNAPSHOT_PART, "object": RETIRED["objects"][0]}]), "retired[0].objects[0]",
     "is retired but a retained snapshot names it"),
    # ---- compaction.json: _check_tags
    ("tag-of-an-epoch-not-retained", "compaction.json", at("tags", value={"v1": 2}), "tags.v1",
     "epoch 2 is not a retained view (retained: 3)"),
    ("tag-of-a-dropped-snapshot", "compaction.json", both(with_snapshot(), at("tags", value={"a": 3, "b": 1})),
     "tags.b", "epoch 1 is not a retained view (retained: 2, 3)"),
    ("tag-before-any-compaction", "compaction.json",
     both(at("epoch", value=0), at("horizon", value=None), at("parts", value=[]), at("retired", value=[]),
          at("compacted_ledger", value=None), at("tags", value={"v": 1})), "tags.v",
     "epoch 1 is not a retained view (retained: none)"),
    # ---- compaction.json: _check_part
    ("part-object-not-a-part", "compaction.json", at("parts", 1, "object", value=f"compacted/{RUN3}/_run.json"),
     "parts[1].object", "is not a compacted part's name"),
    ("part-object-a-ledger", "compaction.json", at("parts", 1, "object", value=ledger(6)["object"]),
     "parts[1].object", "is not a compacted part's name"),
    ("deletions-not-a-vector", "compaction.json", at("parts", 0, "deletions", value=PART1["object"]),
     "parts[0].deletions", "is not a deletion vector's name"),
    ("deletions-outside-a-run", "compaction.json", at("parts", 0, "deletions", value="_meta/deletions-00000.bin"),
     "parts[0].deletions", "is not a deletion vector's name"),
    ("more-deleted-than-records", "compaction.json", at("parts", 0, "deleted", value=4), "parts[0].deleted",
     "4 of 3 records"),
    ("deleted-without-a-vector", "compaction.json", at("parts", 1, "deleted", value=1), "parts[1].deleted",
     "1 of 2 records"),
    ("a-vector-deleting-nothing", "compaction.json", drop("parts", 0, "deleted"), "parts[0].deleted",
     "0 of 3 records"),
    ("fewer-records-than-entries", "compaction.json", at("parts", 1, "entries", value=3), "field parts[1]:",
     "records, entries and ids disagree"),
    ("records-without-ids", "compaction.json", both(at("parts", 1, "first_id", value=None),
                                                    at("parts", 1, "last_id", value=None)),
     "field parts[1]:", "records, entries and ids disagree"),
    ("ids-without-records", "compaction.json", both(at("parts", 1, "records", value=0),
                                                    at("parts", 1, "entries", value=0)),
     "field parts[1]:", "records, entries and ids disagree"),
    ("last-id-before-first", "compaction.json", at("parts", 1, "last_id", value="6:0:0"),
     "parts[1].last_id", "is before first_id 6:1:0"),
    ("last-id-past-the-horizon", "compaction.json", at("horizon", value="6:1:3"), "parts[1].last_id",
     "6:1:4 is past the horizon 6:1:3"),
    ("part-written-after-the-epoch", "compaction.json", at("parts", 0, "ledger_id", value=4), "parts[0].ledger_id",
     "4 is after the epoch 3"),
    # ---- policy.json: TopicPolicy.from_json
    ("compression-unknown", "policy.json", at("compression", value="brotli"), "field compression", "brotli"),
]
# (the one above needs first_id after last_id: set it)
CHECKS[[c[0] for c in CHECKS].index("last-id-before-first")] = (
    "last-id-before-first", "compaction.json",
    both(at("parts", 1, "first_id", value="6:1:0"), at("parts", 1, "last_id", value="6:0:0")),
    "parts[1].last_id", "6:0:0 is before first_id 6:1:0")

# The schemas' own bounds and types (msgspec), one field of each kind.
SCHEMA: list[tuple[str, str, Change, str, str]] = [
    ("ledger-id-0", "topic.json", at("ledgers", 0, "id", value=0), "ledgers[0].id", ">= 1"),
    ("ledger-id-2**62", "topic.json", at("ledgers", 2, "id", value=2**62), "ledgers[2].id", "<= 4611686018427387903"),
    ("ledger-id-text", "topic.json", at("ledgers", 0, "id", value="3"), "ledgers[0].id", "expected `int`"),
    ("ledger-id-float", "topic.json", at("ledgers", 0, "id", value=3.0), "ledgers[0].id", "expected `int`"),
    ("ledger-entries-0", "topic.json", at("ledgers", 0, "entries", value=0), "ledgers[0].entries", ">= 1"),
    ("ledger-records-0", "topic.json", at("ledgers", 0, "records", value=0), "ledgers[0].records", ">= 1"),
    ("ledger-bytes-0", "topic.json", at("ledgers", 0, "bytes", value=0), "ledgers[0].bytes", ">= 1"),
    ("ledger-raw-bytes-0", "topic.json", at("ledgers", 0, "raw_bytes", value=0), "ledgers[0].raw_bytes", ">= 1"),
    ("ledger-publish-negative", "topic.json", at("ledgers", 0, "first_publish", value=-1),
     "ledgers[0].first_publish", ">= 0"),
    ("ledger-sealed-2**62", "topic.json", at("ledgers", 0, "sealed_ms", value=2**62), "ledgers[0].sealed_ms",
     "<= 4611686018427387903"),
    ("ledger-object-empty", "topic.json", at("ledgers", 0, "object", value=""), "ledgers[0].object",
     "length >= 1"),
    ("ledger-object-long", "topic.json", at("ledgers", 0, "object", value="l" * 1025), "ledgers[0].object",
     "length <= 1024"),
    ("ledger-missing-field", "topic.json", drop("ledgers", 0, "sealed_ms"), "ledgers[0]", "sealed_ms"),
    ("ledger-unknown-field", "topic.json", at("ledgers", 0, "extra", value=1), "ledgers[0]", "unknown field"),
    ("format-2", "topic.json", at("format", value=2), "field format", "invalid enum value 2"),
    ("generation-negative", "topic.json", at("generation", value=-1), "field generation", ">= 0"),
    ("removed-through-2**62", "topic.json", at("removed_through", value=2**62), "field removed_through",
     "<= 4611686018427387903"),
    ("unknown-field", "topic.json", at("surprise", value=1), "surprise", "unknown field"),
    ("producer-id-with-a-space", "topic.json", at("producers", value={"a b": {"next": 1, "ledger": 3, "at_ms": 1}}),
     "field producers (a key)", "expected `str` matching regex"),
    ("producer-next-negative", "topic.json", at("producers", "in.jsonl@1", "next", value=-1),
     "producers[...].next", ">= 0"),
    ("dictionary-id-0", "topic.json", at("dictionaries", 0, "id", value=0), "dictionaries[0].id", ">= 1"),
    ("dictionary-crc-negative", "topic.json", at("dictionaries", 0, "crc32c", value=-1), "dictionaries[0].crc32c",
     ">= 0"),
    ("dictionary-unknown-field", "topic.json", at("dictionaries", 0, "extra", value=1), "dictionaries[0]",
     "unknown field `extra`"),
    ("removed-through-negative", "topic.json", at("removed_through", value=-1), "field removed_through", ">= 0"),
    ("dictionary-id-2**32", "topic.json", at("dictionaries", 1, "id", value=2**32), "dictionaries[1].id",
     "<= 4294967295"),
    ("dictionary-bytes-7", "topic.json", at("dictionaries", 1, "bytes", value=7), "dictionaries[1].bytes", ">= 8"),
    ("dictionary-bytes-over-the-limit", "topic.json", at("dictionaries", 1, "bytes", value=(1 << 20) + 1),
     "dictionaries[1].bytes", "<= 1048576"),
    ("dictionary-crc-2**32", "topic.json", at("dictionaries", 1, "crc32c", value=2**32), "dictionaries[1].crc32c",
     "<= 4294967295"),
    ("epoch-2**62", "compaction.json", at("epoch", value=2**62), "field epoch", "<= 4611686018427387903"),
    ("epoch-negative", "compaction.json", at("epoch", value=-1), "field epoch", ">= 0"),
    ("format-2", "compaction.json", at("format", value=2), "field format", "invalid enum value 2"),
    ("unknown-field", "compaction.json", at("surprise", value=1), "surprise", "unknown field"),
    ("part-records-2**62", "compaction.json", at("parts", 0, "records", value=2**62), "parts[0].records",
     "<= 4611686018427387903"),
    ("retired-epoch-2**62", "compaction.json", at("retired", 0, "epoch", value=2**62), "retired[0].epoch",
     "<= 4611686018427387903"),
    ("retired-epoch-negative", "compaction.json", at("retired", 0, "epoch", value=-1), "retired[0].epoch", ">= 0"),
    ("retired-unknown-field", "compaction.json", at("retired", 0, "extra", value=1), "retired[0]",
     "unknown field `extra`"),
    ("part-records-negative", "compaction.json", at("parts", 0, "records", value=-1), "parts[0].records", ">= 0"),
    ("part-ledger-id-0", "compaction.json", at("parts", 0, "ledger_id", value=0), "parts[0].ledger_id", ">= 1"),
    ("part-unknown-field", "compaction.json", at("parts", 0, "extra", value=1), "parts[0]", "unknown field"),
    ("retired-objects-text", "compaction.json", at("retired", 0, "objects", value="x"), "retired[0].objects",
     "expected `array`"),
    ("retired-ms-negative", "compaction.json", at("retired", 0, "retired_ms", value=-1), "retired[0].retired_ms",
     ">= 0"),
    ("last-run-not-an-object", "compaction.json", at("last_run", value=[]), "field last_run", "expected `object`"),
    ("snapshot-epoch-0", "compaction.json", with_snapshot(epoch=0), "snapshots[0].epoch", ">= 1"),
    ("tag-an-epoch", "compaction.json", at("tags", value={"12": 3}), "tags (a key)", "matching regex"),
    ("tag-a-time", "compaction.json", at("tags", value={"2024-05-01": 3}), "tags (a key)", "matching regex"),
    ("tag-a-path", "compaction.json", at("tags", value={"a/../b": 3}), "tags (a key)", "matching regex"),
    ("tag-hidden", "compaction.json", at("tags", value={".v": 3}), "tags (a key)", "matching regex"),
    ("tag-too-long", "compaction.json", at("tags", value={"v" * 201: 3}), "tags (a key)", "matching regex"),
    ("tag-epoch-0", "compaction.json", at("tags", value={"v": 0}), "tags[...]", ">= 1"),
    ("tag-epoch-text", "compaction.json", at("tags", value={"v": "3"}), "tags[...]", "expected `int`, got `str`"),
    ("tags-a-list", "compaction.json", at("tags", value=["v"]), "field tags", "expected `object`, got `array`"),
    ("tags-too-many", "compaction.json", at("tags", value={f"v{i}": 3 for i in range(1001)}), "field tags",
     "length <= 1000"),
    ("snapshot-unknown-field", "compaction.json", with_snapshot(extra=1), "snapshots[0]", "unknown field `extra`"),
    ("snapshot-order-unknown", "compaction.json", with_snapshot(order="random"), "snapshots[0].order",
     "invalid enum value 'random'"),
    ("policy-ratio-2", "policy.json", at("min_dirty_ratio", value=2.0), "min_dirty_ratio", "<= 1.0"),
    ("policy-retention-negative", "policy.json", at("retention_ms", value=-1), "retention_ms", ">= 0"),
    ("policy-lag-2**62", "policy.json", at("min_compaction_lag_ms", value=2**62), "min_compaction_lag_ms",
     "<= 4611686018427387903"),
    ("policy-bytes-negative", "policy.json", at("retention_bytes", value=-1), "retention_bytes", ">= 0"),
    ("policy-ratio-negative", "policy.json", at("min_dirty_ratio", value=-0.5), "min_dirty_ratio", ">= 0.0"),
    ("policy-millis-text", "policy.json", at("delete_retention_ms", value="1000"), "delete_retention_ms",
     "got `str`"),
    ("policy-compression-long", "policy.json", at("compression", value="z" * 17), "compression", "length <= 16"),
    ("policy-flag-text", "policy.json", at("retain_null_key", value="yes"), "retain_null_key",
     "`bool | null`, got `str`"),
    ("policy-unknown-field", "policy.json", at("surprise", value=1), "surprise", "unknown field"),
]

VALID = {"topic.json": TOPIC, "compaction.json": COMPACTION, "policy.json": POLICY}


def write_topic(root: Path, document: str | None = None, change: Change | None = None, *,
                envelope: Callable[[dict[str, Any]], object] | None = None) -> str:
    """A topic folder holding the three valid documents, ``document`` changed by ``change``
    (its value) or ``envelope`` (the whole document; text it returns is written as is)."""
    meta = root / "t" / "_meta"
    meta.mkdir(parents=True)
    for name, value in VALID.items():
        body: dict[str, Any] = {"version": 3, "updated_ms": 1, "writer": "w", "value": copy.deepcopy(value)}
        data: object = None
        if name == document and change is not None:
            change(body["value"])
        if name == document and envelope is not None:
            data = envelope(body)
        (meta / name).write_text(data if isinstance(data, str) else json.dumps(body))
    return str(root / "t")


def load(uri: str, document: str) -> None:
    meta = TopicMetadata.open(uri)
    {"topic.json": meta.load_topic, "compaction.json": meta.load_compaction, "policy.json": meta.load_policy}[
        document]()


def test_the_valid_documents_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The documents every case starts from are valid: only the change is refused."""
    uri = write_topic(tmp_path)
    meta = TopicMetadata.open(uri)
    assert [lg.id for lg in meta.load_topic().ledgers] == [3, 4, 6]
    assert len(meta.load_compaction().parts) == 2
    # and with a retained snapshot: read as its epoch's view
    change = with_snapshot()
    uri = write_topic(tmp_path / "snapshot", "compaction.json", change)
    state = TopicMetadata.open(uri).load_compaction()
    assert state.retained_epochs == (2, 3) and state.at_epoch(2).parts[0].object == PART0["object"]  # type: ignore[union-attr]
    assert shale_main(["status", uri, "--json"]) == 0, capsys.readouterr().err
    assert meta.load_policy().values.min_dirty_ratio == 0.5
    assert shale_main(["status", uri, "--json"]) == 0, capsys.readouterr().err
    capsys.readouterr()


def _refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], uri: str, document: str,
             *needles: str) -> None:
    with pytest.raises(InvalidMetadataError) as e:
        load(uri, document)
    assert exit_code_of(e.value) == EXIT_CORRUPT
    for n in (f"{uri}/_meta/{document}", *needles):
        assert n in str(e.value), (n, str(e.value))
    # the command line: exit 4, one line naming the document, the field and why
    assert shale_main(["status", uri]) == EXIT_CORRUPT
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    for n in (f"{uri}/_meta/{document}", *needles):
        assert n in err, (n, err)
    assert "Traceback" not in err and "Error" not in err.split(":")[0], err


@pytest.mark.parametrize("case, document, change, field, reason", [
    pytest.param(*c, id=f"{c[1].split('.')[0]}-{c[0]}") for c in CHECKS])
def test_each_invariant_refuses_its_hostile_document(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str,
                                                     document: str, change: Change, field: str, reason: str) -> None:
    _refused(tmp_path, capsys, write_topic(tmp_path, document, change), document, field, reason)


@pytest.mark.parametrize("case, document, change, field, reason", [
    pytest.param(*c, id=f"{c[1].split('.')[0]}-{c[0]}") for c in SCHEMA])
def test_each_schema_bound_refuses_its_hostile_document(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str,
                                                        document: str, change: Change, field: str,
                                                        reason: str) -> None:
    _refused(tmp_path, capsys, write_topic(tmp_path, document, change), document, field, reason)


ENVELOPES: list[tuple[str, Callable[[dict[str, Any]], object], tuple[str, ...]]] = [
    ("not-json", lambda d: '{"version": 3, "value": {', ("not a metadata document", "truncated")),
    ("not-an-object", lambda d: "[1, 2]", ("expected `object`, got `array`",)),
    ("nested-too-deeply", lambda d: '{"version": 3, "value": {"x": ' + "[" * 100_000 + "]" * 100_000 + "}}",
     ("not a metadata document", "nested too deeply")),
    ("version-0", lambda d: d.update(version=0), ("field version", ">= 1")),
    ("version-2**62", lambda d: d.update(version=2**62), ("field version", "<= 4611686018427387903")),
    ("updated-ms-negative", lambda d: d.update(updated_ms=-1), ("field updated_ms", ">= 0")),
    ("no-value", lambda d: d.pop("value"), ("missing required field `value`",)),
    ("value-not-an-object", lambda d: d.update(value=[1]), ("field value", "expected `object`")),
    ("unknown-field", lambda d: d.update(extra=1), ("unknown field `extra`",)),
]


@pytest.mark.parametrize("document", ["topic.json", "compaction.json", "policy.json"])
@pytest.mark.parametrize("case, envelope, needles", [pytest.param(*e, id=e[0]) for e in ENVELOPES])
def test_each_envelope_check_refuses_its_hostile_document(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          document: str, case: str,
                                                          envelope: Callable[[dict[str, Any]], object],
                                                          needles: tuple[str, ...]) -> None:
    _refused(tmp_path, capsys, write_topic(tmp_path, document, envelope=envelope), document, *needles)


def test_a_document_too_deep_to_check_is_refused_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checking a document that runs out of stack is the document's fault: refused as
    nested too deeply, never a ``RecursionError``.  (Documents read from a store are
    refused before that, when they are decoded; here the check itself runs out.)"""
    from shale.metadata import schema

    def too_deep(*args: Any, **kwargs: Any) -> Any:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(schema.msgspec, "convert", too_deep)
    with pytest.raises(InvalidMetadataError, match=r"^X: nested too deeply$"):
        schema.validate(TOPIC, schema.TopicDoc, "X")


def test_a_ledger_that_would_break_the_order_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """``append_ledger`` (what producers register with) refuses an id that is not after
    the last one, rather than write a document every later load would refuse."""
    uri = write_topic(tmp_path)
    meta = TopicMetadata.open(uri)
    state = meta.load_topic()
    before = (Path(uri) / "_meta" / "topic.json").read_bytes()
    for lid in (6, 5):
        info = LedgerInfo.from_doc(validate(ledger(lid), LedgerDoc, "x"))
        with pytest.raises(InvalidInputError, match=f"ledger id {lid} must be greater than the last one, 6"):
            meta.append_ledger(info, state)
    assert (Path(uri) / "_meta" / "topic.json").read_bytes() == before
    meta.load_topic()


def test_a_part_a_task_reports_is_checked_like_a_document() -> None:
    """Compacted parts reported by the Spark engine's tasks go through the part schema."""
    assert CompactedPart.from_json(PART1).last_id == MessageId(6, 1, 4)
    with pytest.raises(InvalidMetadataError, match="compacted part: field records: expected `int` >= 0"):
        CompactedPart.from_json({**PART1, "records": -1})
    with pytest.raises(InvalidMetadataError, match="compacted part: field last_id: '6:1' is not a message id"):
        CompactedPart.from_json({**PART1, "last_id": "6:1"})


@pytest.mark.parametrize("case", ["ids-fall", "retired-part-still-published", "more-deleted-than-records",
                                  "compression-unknown"])
def test_as_a_process_of_its_own(tmp_path: Path, case: str) -> None:
    """The same refusals from real ``shale`` processes: every command that reads the
    document exits 4 with one line, and changes nothing."""
    _, document, change, field, reason = next(c for c in CHECKS if c[0] == case)
    uri = write_topic(tmp_path, document, change)
    before = {p: p.read_bytes() for p in Path(uri).rglob("*") if p.is_file()}
    commands = [("status", uri), ("compact", uri)]
    if document != "policy.json":  # (which gc and verify do not read)
        commands += [("verify", uri), ("gc", uri, "--grace", "0")]
    for args in commands:
        p = run_cli(*args[1:], script="compact") if args[0] == "compact" else run_cli(*args)
        assert p.returncode == EXIT_CORRUPT, (args, p.stdout, p.stderr)
        line = p.stderr.strip()
        assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, (args, p.stderr)
        for n in (f"{uri}/_meta/{document}", field, reason):
            assert n in line, (args, n, line)
    assert {p: p.read_bytes() for p in Path(uri).rglob("*") if p.is_file()} == before
