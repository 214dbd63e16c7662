"""The metadata documents' schemas and invariants, checked before anything acts on them.

A metadata document may have been edited by hand, damaged, or written by a hostile
writer of the same bucket.  Every document read is decoded against a strict schema
(msgspec: exact types, bounded integers, no unknown field) and then checked against the
invariants the rest of Shale relies on:

* ``topic.json``: ledger ids strictly increasing, above every id a truncation removed
  (``removed_last``, when present, in the last ledger removed);
  each object named as the producer names it (``ledgers/<id>-<nonce>.ledger``, the id
  its own), none twice; each idempotent producer's mark in a ledger the topic has had;
* ``compaction.json``: parts named as a compaction run names them, in id order and
  disjoint, none past the horizon; deletion vectors beside their parts; retired objects
  named as compacted objects (so never a registered ledger nor a metadata document),
  none of them still published; retained snapshots (earlier views) each held to the
  same rules as the published parts, older than the state, in epoch order; each tag
  a name that is neither an epoch nor a time, naming a retained epoch;
* ``subscriptions/<name>.json``: the name its file's, the position a message id.

A violation is an :class:`~shale.ledger.errors.InvalidMetadataError` (exit 4) naming the
document and the field; nothing is deleted or published on the strength of it.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal, TypeVar

import msgspec

from shale.ledger.codecs import MAX_DICTIONARY_BYTES
from shale.ledger.errors import InvalidInputError, InvalidMetadataError, mid_sentence
from shale.ledger.ids import MessageId
from shale.metadata.layout import (
    arrow_cache_name,
    is_compacted_object,
    is_dictionary_object,
    is_ledger_object,
    is_run_dir,
    ledger_id_of,
)

__all__ = ["MAX_TAGS", "PRODUCER_ID", "SUBSCRIPTION_NAME", "TAG_NAME", "CompactionDoc", "DictionaryDoc", "Envelope",
           "LedgerDoc", "MemberDoc", "PartDoc", "ProducerDoc", "RetiredDoc", "SnapshotDoc", "SubscriptionDoc",
           "TopicDoc", "check_compaction", "check_topic", "decode_envelope", "message_id", "schema_error", "validate"]

#: Ledger ids and epochs stay far below 2**63, so every reader (JSON tools included) and
#: every ``+ 1`` holds them exactly.
MAX_ID: Final = (1 << 62) - 1
_MAX_COUNT: Final = (1 << 62) - 1
_MAX_MS: Final = (1 << 62) - 1

Id = Annotated[int, msgspec.Meta(ge=1, le=MAX_ID)]
Count = Annotated[int, msgspec.Meta(ge=0, le=_MAX_COUNT)]
Millis = Annotated[int, msgspec.Meta(ge=0, le=_MAX_MS)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]


class Envelope(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``{"version", "updated_ms", "writer", "value"}`` around every document."""

    version: Annotated[int, msgspec.Meta(ge=1, le=_MAX_COUNT)]
    value: dict[str, Any]
    updated_ms: Millis = 0
    writer: str = ""


class LedgerDoc(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    id: Id
    object: Name
    entries: Annotated[int, msgspec.Meta(ge=1, le=_MAX_COUNT)]
    records: Annotated[int, msgspec.Meta(ge=1, le=_MAX_COUNT)]
    bytes: Annotated[int, msgspec.Meta(ge=1, le=_MAX_COUNT)]
    first_publish: Millis
    last_publish: Millis
    sealed_ms: Millis
    raw_bytes: Annotated[int, msgspec.Meta(ge=1, le=_MAX_COUNT)] | None = None


class DictionaryDoc(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    id: Annotated[int, msgspec.Meta(ge=1, le=(1 << 32) - 1)]
    object: Name
    bytes: Annotated[int, msgspec.Meta(ge=8, le=MAX_DICTIONARY_BYTES)]
    created_ms: Millis
    crc32c: Annotated[int, msgspec.Meta(ge=0, le=(1 << 32) - 1)]
    #: SHA-256 of the object's bytes, lowercase hex (absent in older registrations)
    sha256: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")] | None = None


#: A producer id (``shale produce --producer-id``): what a file name and a date make.
PRODUCER_ID: Final = r"^[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,199}$"


class ProducerDoc(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    #: the number of the record after the last one this producer registered (records
    #: numbered from 0 in the order it was given them)
    next: Count
    #: the ledger that registered it, and when (by the producer's clock)
    ledger: Id
    at_ms: Millis


class TopicDoc(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: Literal[1]
    created_ms: Millis
    ledgers: list[LedgerDoc]
    generation: Count = 0
    removed_through: Annotated[int, msgspec.Meta(ge=0, le=MAX_ID)] = 0
    truncated_ms: Millis = 0
    dictionaries: list[DictionaryDoc] = []
    #: the id of the last record of ledger ``removed_through`` (absent when unknown)
    removed_last: str | None = None
    #: what each idempotent producer registered last, by its id
    producers: dict[Annotated[str, msgspec.Meta(pattern=PRODUCER_ID)], ProducerDoc] = {}


class PartDoc(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    object: Name
    entries: Count
    records: Count
    bytes: Count
    first_id: str | None
    last_id: str | None
    ledger_id: Id | None = None
    deletions: Name | None = None
    deleted: Count = 0
    raw_bytes: Count | None = None
    arrow_cache: Name | None = None


class RetiredDoc(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    objects: list[Name]
    retired_ms: Millis
    epoch: Annotated[int, msgspec.Meta(ge=0, le=MAX_ID)]


class SnapshotDoc(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An earlier published view, kept readable (``snapshot-retention``)."""

    epoch: Id
    horizon: str | None
    compacted_ledger: Name | None
    parts: list[PartDoc]
    keys: Count = 0
    tombstones: Count = 0
    compacted_ms: Millis = 0
    #: when a newer view replaced it, by the store's clock (what its age counts from)
    replaced_ms: Millis = 0
    last_run: dict[str, Any] = {}
    order: Literal["offset", "event-time"] = "offset"
    key_ttl_ms: Millis = 0


#: A tag's name (``shale snapshots T --tag NAME``): as a subscription's, but starting with a
#: letter, so that it is never an epoch (digits) nor a time (ISO 8601 starts with the year)
#: and ``--as-of NAME`` means one thing.
TAG_NAME: Final = r"^[A-Za-z][A-Za-z0-9._-]{0,199}$"
#: The most tags a topic holds (each keeps a view, its objects and the ledgers above it).
MAX_TAGS: Final = 1000

TagName = Annotated[str, msgspec.Meta(pattern=TAG_NAME)]


class CompactionDoc(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: Literal[1]
    epoch: Annotated[int, msgspec.Meta(ge=0, le=MAX_ID)]
    horizon: str | None
    compacted_ledger: Name | None
    parts: list[PartDoc]
    retired: list[RetiredDoc]
    keys: Count = 0
    tombstones: Count = 0
    compacted_ms: Millis = 0
    last_run: dict[str, Any] = {}
    topic_generation: Count = 0
    #: how the view was decided (shale.ledger.ordering): left out for offset order, no TTL
    order: Literal["offset", "event-time"] = "offset"
    key_ttl_ms: Millis = 0
    #: earlier views still readable, oldest first (left out when there are none)
    snapshots: list[SnapshotDoc] = []
    #: names of retained views: tag -> epoch (left out when there are none)
    tags: Annotated[dict[TagName, Id], msgspec.Meta(max_length=MAX_TAGS)] = {}


#: A subscription's name: what its document is named by (``subscriptions/<name>.json``),
#: never hidden (a leading dot) and never a path.
SUBSCRIPTION_NAME: Final = r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}$"


class MemberDoc(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The reader holding a subscription, as it last said so (its heartbeat)."""

    #: who it is: host, process and a nonce (``host:pid:nonce``)
    id: Annotated[str, msgspec.Meta(min_length=1, max_length=300)]
    heartbeat_ms: Millis
    #: how long after its heartbeat it counts as gone (three of its heartbeat intervals)
    timeout_ms: Annotated[int, msgspec.Meta(ge=1, le=_MAX_MS)]


class SubscriptionDoc(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``subscriptions/<name>.json``: a durable subscription's committed position."""

    format: Literal[1]
    name: Annotated[str, msgspec.Meta(pattern=SUBSCRIPTION_NAME)]
    #: the id of the next record to read (as Kafka commits the next offset)
    position: Annotated[str, msgspec.Meta(max_length=64)]
    committed_ms: Millis
    created_ms: Millis
    #: the reader holding it (left out when none does)
    member: MemberDoc | None = None


# msgspec works out how to decode a Struct type the first time one is decoded, without a
# lock: threads decoding one kind for the first time at once (Subscriptions.list reads
# the documents in a pool) crashed the process with a segmentation fault.  So every kind
# is worked out here, once, by the thread that imports the module.
for _kind in (Envelope, LedgerDoc, DictionaryDoc, ProducerDoc, TopicDoc, PartDoc, RetiredDoc, SnapshotDoc,
              CompactionDoc, MemberDoc, SubscriptionDoc):
    msgspec.json.Decoder(_kind)
del _kind

T = TypeVar("T")


def schema_error(where: str, e: msgspec.ValidationError) -> InvalidMetadataError:
    """msgspec's ``e`` about the document ``where`` as one of our messages: ``field F: why``."""
    text = str(e)
    why, _, at = text.partition(" - at `$")
    if not at:  # a mapping's key: "... - at `key` in `$.tags`"
        why, _, at = text.partition(" - at `key` in `$")
        at = f"{at.rstrip('`')} (a key)" if at else ""
    field = at.rstrip("`").lstrip(".")
    why = mid_sentence(why)
    return InvalidMetadataError(f"{where}: {f'field {field}: ' if field else ''}{why}")


def decode_envelope(data: bytes, where: str) -> Envelope:
    """The document around a value; :class:`InvalidMetadataError` for anything else."""
    try:
        return msgspec.json.decode(data, type=Envelope)
    except msgspec.ValidationError as e:
        raise schema_error(where, e) from None
    except msgspec.DecodeError as e:
        raise InvalidMetadataError(f"{where}: not a metadata document: {mid_sentence(str(e))}") from None
    except RecursionError:
        raise InvalidMetadataError(f"{where}: not a metadata document: nested too deeply") from None


def validate(value: Any, kind: type[T], where: str) -> T:
    """``value`` (decoded JSON) as a ``kind`` document, type-checked field by field."""
    try:
        return msgspec.convert(value, kind, strict=True)
    except msgspec.ValidationError as e:
        raise schema_error(where, e) from None
    except RecursionError:
        raise InvalidMetadataError(f"{where}: nested too deeply") from None


def message_id(text: str | None, where: str, field: str) -> MessageId | None:
    """The message id ``text`` in field ``field`` of ``where`` (``None`` stays ``None``)."""
    if text is None:
        return None
    try:
        return MessageId.parse(text)
    except InvalidInputError:
        raise InvalidMetadataError(f"{where}: field {field}: {text!r} is not a message id LEDGER:ENTRY:BATCH") from None


def check_topic(doc: TopicDoc, where: str) -> None:
    """The ledger list's invariants (see the module's docstring)."""
    last = doc.removed_through
    removed_last = message_id(doc.removed_last, where, "removed_last")
    if removed_last is not None and removed_last.ledger != doc.removed_through:
        raise InvalidMetadataError(f"{where}: field removed_last: {doc.removed_last!r} is not in ledger "
                                   f"{doc.removed_through} (removed_through)")
    seen: set[str] = set()
    for i, lg in enumerate(doc.ledgers):
        field = f"ledgers[{i}]"
        # (before the order: one ledger listed twice is named as such)
        if lg.object in seen:
            raise InvalidMetadataError(f"{where}: field {field}.object: {lg.object!r} is registered twice")
        seen.add(lg.object)
        if lg.id <= last:
            raise InvalidMetadataError(
                f"{where}: field {field}.id: ledger ids must rise strictly (and lie above removed_through "
                f"{doc.removed_through}): {lg.id} follows {last}")
        last = lg.id
        if not is_ledger_object(lg.object) or ledger_id_of(lg.object) != lg.id:
            raise InvalidMetadataError(
                f"{where}: field {field}.object: {lg.object!r} is not the name of ledger {lg.id} "
                f"(ledgers/{lg.id:020d}-<nonce>.ledger)")
        if lg.records < lg.entries:
            raise InvalidMetadataError(f"{where}: field {field}.records: fewer records than entries")
        if lg.first_publish > lg.last_publish:
            raise InvalidMetadataError(f"{where}: field {field}.first_publish: after last_publish")
    for name, p in doc.producers.items():
        if p.ledger > last:
            raise InvalidMetadataError(f"{where}: field producers[{name!r}].ledger: {p.ledger} is after the last "
                                       f"ledger the topic has had ({last})")
    ids: set[int] = set()
    for i, d in enumerate(doc.dictionaries):
        if not is_dictionary_object(d.object, d.id):
            raise InvalidMetadataError(f"{where}: field dictionaries[{i}].object: {d.object!r} is not the name of "
                                       f"dictionary {d.id} (dictionaries/{d.id:010d}-<nonce>.zdict)")
        if d.id in ids:
            raise InvalidMetadataError(f"{where}: field dictionaries[{i}].id: dictionary {d.id} is registered twice")
        ids.add(d.id)


_PartIds = list[tuple[MessageId | None, MessageId | None]]
#: a retained snapshot's horizon and its parts' first and last ids
_SnapshotIds = list[tuple[MessageId | None, _PartIds]]


def check_compaction(doc: CompactionDoc, where: str) -> tuple[MessageId | None, _PartIds, _SnapshotIds]:
    """The compaction state's invariants; returns the parsed horizon, each part's first
    and last ids, and the same of each retained snapshot."""
    horizon = _check_view(doc.horizon, doc.compacted_ledger, doc.parts, where, "")
    if horizon is not None and doc.epoch == 0:
        raise InvalidMetadataError(f"{where}: field epoch: 0 although a horizon is published")
    ids, published = _check_parts(doc.parts, horizon, doc.epoch, where, "")
    snapshots, retained = _check_snapshots(doc, where)
    _check_retired(doc, published, retained, where)
    _check_tags(doc, where)
    return horizon, ids, snapshots


def _check_tags(doc: CompactionDoc, where: str) -> None:
    """Each tag names a retained view: a snapshot's epoch, or the published one."""
    retained = {s.epoch for s in doc.snapshots} | ({doc.epoch} if doc.epoch else set())
    for name, epoch in doc.tags.items():
        if epoch not in retained:
            kept = ", ".join(map(str, sorted(retained))) or "none"
            raise InvalidMetadataError(f"{where}: field tags.{name}: epoch {epoch} is not a retained view "
                                       f"(retained: {kept})")


def _check_view(horizon_text: str | None, run: str | None, parts: list[PartDoc], where: str,
                at: str) -> MessageId | None:
    """A view's horizon (parsed) and run name (``at``: the field prefix of a snapshot)."""
    horizon = message_id(horizon_text, where, f"{at}horizon")
    if run is not None and not is_run_dir(f"compacted/{run}"):
        raise InvalidMetadataError(f"{where}: field {at}compacted_ledger: {run!r} is not a run name")
    if horizon is None and parts:
        raise InvalidMetadataError(f"{where}: field {at}horizon: missing although parts are published")
    return horizon


def _check_snapshots(doc: CompactionDoc, where: str) -> tuple[_SnapshotIds, set[str]]:
    """Retained snapshots: each a view held to the published view's rules, older than the
    state, in rising epoch order; their ids, and every object they name."""
    out: _SnapshotIds = []
    retained: set[str] = set()
    previous = 0
    for i, snap in enumerate(doc.snapshots):
        at = f"snapshots[{i}]."
        if snap.epoch >= doc.epoch or snap.epoch <= previous:
            raise InvalidMetadataError(
                f"{where}: field {at}epoch: {snap.epoch} must be before the state's epoch {doc.epoch} and after "
                f"the snapshot before it ({previous})")
        previous = snap.epoch
        horizon = _check_view(snap.horizon, snap.compacted_ledger, snap.parts, where, at)
        ids, named = _check_parts(snap.parts, horizon, snap.epoch, where, at)
        out.append((horizon, ids))
        retained |= named
    return out, retained


def _check_parts(parts: list[PartDoc], horizon: MessageId | None, epoch: int, where: str,
                 at: str) -> tuple[_PartIds, set[str]]:
    """Each part's own invariants, their order, and no object published twice; each
    part's first and last ids, and every object the parts publish (``at``: the field
    prefix of a snapshot's parts)."""
    ids: _PartIds = []
    published: set[str] = set()
    previous: MessageId | None = None
    for i, p in enumerate(parts):
        field = f"{at}parts[{i}]"
        first = message_id(p.first_id, where, f"{field}.first_id")
        last = message_id(p.last_id, where, f"{field}.last_id")
        ids.append((first, last))
        _check_part(p, field, first, last, horizon, epoch, where)
        if first is not None and previous is not None and first <= previous:
            raise InvalidMetadataError(
                f"{where}: field {field}.first_id: parts must be in id order and disjoint: {first} is not after "
                f"{previous}")
        previous = last if last is not None else previous
        for name in (p.object, p.deletions, p.arrow_cache):
            if name is not None and name in published:
                raise InvalidMetadataError(f"{where}: field {field}: {name!r} is published twice")
            if name is not None:
                published.add(name)
    return ids, published


def _check_retired(doc: CompactionDoc, published: set[str], retained: set[str], where: str) -> None:
    """Retired sets: no later than the state, only compaction objects, none still
    published nor named by a retained snapshot."""
    for i, r in enumerate(doc.retired):
        if r.epoch > doc.epoch:
            raise InvalidMetadataError(f"{where}: field retired[{i}].epoch: {r.epoch} is after the state's epoch")
        for j, name in enumerate(r.objects):
            field = f"retired[{i}].objects[{j}]"
            if not is_compacted_object(name):
                raise InvalidMetadataError(
                    f"{where}: field {field}: {name!r} is not an object a compaction writes (only those are retired)")
            if name in published:
                raise InvalidMetadataError(f"{where}: field {field}: {name!r} is retired but still published")
            if name in retained:
                raise InvalidMetadataError(f"{where}: field {field}: {name!r} is retired but a retained snapshot "
                                           "names it")


def _check_part(p: PartDoc, field: str, first: MessageId | None, last: MessageId | None,
                horizon: MessageId | None, epoch: int, where: str) -> None:
    if not is_compacted_object(p.object) or not p.object.endswith(".ledger"):
        raise InvalidMetadataError(f"{where}: field {field}.object: {p.object!r} is not a compacted part's name")
    if p.deletions is not None and (not is_compacted_object(p.deletions) or not p.deletions.endswith(".bin")):
        raise InvalidMetadataError(f"{where}: field {field}.deletions: {p.deletions!r} is not a deletion vector's name")
    if p.arrow_cache is not None and p.arrow_cache != arrow_cache_name(p.object):
        raise InvalidMetadataError(f"{where}: field {field}.arrow_cache: {p.arrow_cache!r} is not the Arrow cache of "
                                   f"{p.object!r}")
    if p.deleted > p.records or (p.deletions is None) != (p.deleted == 0):
        raise InvalidMetadataError(f"{where}: field {field}.deleted: {p.deleted} of {p.records} records")
    if p.records < p.entries or (p.records > 0) != (first is not None and last is not None):
        raise InvalidMetadataError(f"{where}: field {field}: records, entries and ids disagree")
    if first is not None and last is not None:
        if last < first:
            raise InvalidMetadataError(f"{where}: field {field}.last_id: {last} is before first_id {first}")
        if horizon is None or last > horizon:
            raise InvalidMetadataError(f"{where}: field {field}.last_id: {last} is past the horizon {horizon}")
    if p.ledger_id is not None and p.ledger_id > epoch:
        raise InvalidMetadataError(f"{where}: field {field}.ledger_id: {p.ledger_id} is after the epoch {epoch}")
