"""The value types kept in the metadata store: a topic's ledger list and its compaction state.

They are frozen dataclasses with explicit JSON (de)serialisation so the documents stay
readable by people and by other tools.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field, replace
from typing import Any

from shale.ledger.ids import MessageId
from shale.ledger.ordering import TopicOrder
from shale.ledger.values import dataclass
from shale.metadata.schema import (
    CompactionDoc,
    LedgerDoc,
    PartDoc,
    RetiredDoc,
    SnapshotDoc,
    TopicDoc,
    check_compaction,
    check_topic,
    message_id,
    validate,
)

__all__ = [
    "CompactedPart",
    "CompactionState",
    "DictionaryInfo",
    "LedgerInfo",
    "ProducerMark",
    "RetiredSet",
    "Snapshot",
    "TopicState",
]


@dataclass(frozen=True, slots=True)
class LedgerInfo:
    """One sealed ledger of a topic.  ``object`` is relative to the topic's folder."""

    id: int
    object: str
    entries: int
    records: int
    bytes: int
    first_publish: int
    last_publish: int
    sealed_ms: int
    #: the object's size were its entries stored uncompressed (None: as ``bytes``; ledgers
    #: of format version 1 say nothing)
    raw_bytes: int | None = None

    @property
    def first_id(self) -> MessageId:
        return MessageId(self.id, 0, 0)

    @property
    def uncompressed_bytes(self) -> int:
        return self.bytes if self.raw_bytes is None else self.raw_bytes

    def to_json(self) -> dict[str, Any]:
        d = {"id": self.id, "object": self.object, "entries": self.entries, "records": self.records,
             "bytes": self.bytes, "first_publish": self.first_publish,
             "last_publish": self.last_publish, "sealed_ms": self.sealed_ms}
        if self.raw_bytes is not None:
            d["raw_bytes"] = self.raw_bytes
        return d

    @classmethod
    def from_doc(cls, d: LedgerDoc) -> LedgerInfo:
        return cls(d.id, d.object, d.entries, d.records, d.bytes, d.first_publish, d.last_publish, d.sealed_ms,
                   d.raw_bytes)


@dataclass(frozen=True, slots=True)
class DictionaryInfo:
    """A trained zstd dictionary of the topic: its id, its object (relative to the
    topic's folder), its size, when it was registered, and what binds the registration
    to the object's bytes."""

    id: int
    object: str
    bytes: int
    created_ms: int
    crc32c: int  # of the object's bytes, checked whenever it is read
    #: SHA-256 of the object's bytes (hex), checked whenever it is read; None in
    #: registrations made before dictionaries were bound to their content
    sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "object": self.object, "bytes": self.bytes,
                             "created_ms": self.created_ms, "crc32c": self.crc32c}
        if self.sha256 is not None:
            d["sha256"] = self.sha256
        return d


@dataclass(frozen=True, slots=True)
class ProducerMark:
    """What an idempotent producer registered last: ``next``, the number of the record
    after its last one (its records numbered from 0 in the order it was given them), in
    ledger ``ledger``, at ``at_ms`` (by the producer's clock).  Registered with the ledger,
    in the same compare-and-swap, so the two never disagree."""

    next: int
    ledger: int
    at_ms: int

    def live(self, now_ms: int, expiry_ms: int) -> bool:
        """Whether it is still kept at ``now_ms`` (a mark older than ``expiry_ms`` is forgotten)."""
        return now_ms - self.at_ms < expiry_ms

    def to_json(self) -> dict[str, int]:
        return {"next": self.next, "ledger": self.ledger, "at_ms": self.at_ms}


@dataclass(frozen=True, slots=True)
class TopicState:
    """A topic's ordered ledger list.  Ledger ids strictly increase along the list.

    ``generation`` counts truncations (retention removing the oldest ledgers),
    ``removed_through`` is the highest ledger id ever removed, so ids are never reused
    even when every ledger is gone, ``removed_last`` the id of that ledger's last record
    (``None`` when the truncation could not read it, or in documents written before it
    was recorded: then whether the ledger held records past a given id is unknown), and
    ``truncated_ms`` is when the last truncation happened (readers may still be reading
    what it removed).
    """

    ledgers: tuple[LedgerInfo, ...]
    created_ms: int
    version: int = 0
    token: str = ""
    generation: int = 0
    removed_through: int = 0
    truncated_ms: int = 0
    #: the topic's trained dictionaries, oldest first (never removed)
    dictionaries: tuple[DictionaryInfo, ...] = ()
    removed_last: MessageId | None = None
    #: each idempotent producer's last registration, by its id
    producers: Mapping[str, ProducerMark] = field(default_factory=dict)

    @property
    def last_ledger_id(self) -> int:
        return max(self.ledgers[-1].id if self.ledgers else 0, self.removed_through)

    @property
    def next_id(self) -> MessageId:
        """The id the next ledger a producer registers starts at: no record is at or past
        it yet (a reader's ``latest``; no subscription may stand past it)."""
        return MessageId(self.last_ledger_id + 1, 0, 0)

    @property
    def records(self) -> int:
        return sum(lg.records for lg in self.ledgers)

    @property
    def bytes(self) -> int:
        return sum(lg.bytes for lg in self.ledgers)

    def ledger(self, ledger_id: int) -> LedgerInfo | None:
        for lg in self.ledgers:
            if lg.id == ledger_id:
                return lg
        return None

    def with_version(self, version: int, token: str) -> TopicState:
        return replace(self, version=version, token=token)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"format": 1, "created_ms": self.created_ms,
                             "ledgers": [lg.to_json() for lg in self.ledgers]}
        if self.generation:
            d["generation"] = self.generation
            d["removed_through"] = self.removed_through
            d["truncated_ms"] = self.truncated_ms
        if self.removed_last is not None:
            d["removed_last"] = str(self.removed_last)
        if self.dictionaries:
            d["dictionaries"] = [x.to_json() for x in self.dictionaries]
        if self.producers:
            d["producers"] = {name: mark.to_json() for name, mark in sorted(self.producers.items())}
        return d

    @classmethod
    def from_json(cls, d: Any, version: int, token: str, where: str = "topic.json") -> TopicState:
        """The ledger list of a ``topic.json`` value, checked against its schema and
        invariants (:class:`~shale.ledger.errors.InvalidMetadataError` naming ``where`` and the
        field otherwise)."""
        doc = validate(d, TopicDoc, where)
        check_topic(doc, where)
        return cls(tuple(LedgerInfo.from_doc(x) for x in doc.ledgers), doc.created_ms, version, token,
                   doc.generation, doc.removed_through, doc.truncated_ms,
                   tuple(DictionaryInfo(x.id, x.object, x.bytes, x.created_ms, x.crc32c, x.sha256)
                         for x in doc.dictionaries),
                   None if doc.removed_last is None else MessageId.parse(doc.removed_last),
                   {name: ProducerMark(p.next, p.ledger, p.at_ms) for name, p in doc.producers.items()})


@dataclass(frozen=True, slots=True)
class CompactedPart:
    """One object of a compacted ledger, relative to the topic's folder.

    ``ledger_id`` is the epoch of the run that wrote the object (a later run may keep it
    instead of copying it); ``deletions`` names the deletion vector listing its records
    that are no longer live, ``deleted`` of them; ``arrow_cache`` names its Arrow cache,
    beside it (:mod:`shale.ledger.arrow_cache`), when the run that wrote it made one.
    """

    object: str
    entries: int
    records: int
    bytes: int
    first_id: MessageId | None
    last_id: MessageId | None
    ledger_id: int | None = None
    deletions: str | None = None
    deleted: int = 0
    #: the object's size were its entries stored uncompressed (None: as ``bytes``)
    raw_bytes: int | None = None
    arrow_cache: str | None = None

    @property
    def live(self) -> int:
        return self.records - self.deleted

    @property
    def uncompressed_bytes(self) -> int:
        return self.bytes if self.raw_bytes is None else self.raw_bytes

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"object": self.object, "entries": self.entries, "records": self.records,
                             "bytes": self.bytes, "first_id": str(self.first_id) if self.first_id else None,
                             "last_id": str(self.last_id) if self.last_id else None}
        if self.ledger_id is not None:
            d["ledger_id"] = self.ledger_id
        if self.deletions is not None:
            d["deletions"] = self.deletions
            d["deleted"] = self.deleted
        if self.raw_bytes is not None:
            d["raw_bytes"] = self.raw_bytes
        if self.arrow_cache is not None:
            d["arrow_cache"] = self.arrow_cache
        return d

    @classmethod
    def from_json(cls, d: Any, where: str = "compacted part") -> CompactedPart:
        """One part as :meth:`to_json` wrote it, checked against the part schema."""
        doc = validate(d, PartDoc, where)
        return cls.from_doc(doc, message_id(doc.first_id, where, "first_id"), message_id(doc.last_id, where, "last_id"))

    @classmethod
    def from_doc(cls, d: PartDoc, first: MessageId | None, last: MessageId | None) -> CompactedPart:
        return cls(d.object, d.entries, d.records, d.bytes, first, last, d.ledger_id, d.deletions, d.deleted,
                   d.raw_bytes, d.arrow_cache)


@dataclass(frozen=True, slots=True)
class RetiredSet:
    """Objects a publish replaced; deleted once ``retired_ms`` is older than the grace period."""

    objects: tuple[str, ...]
    retired_ms: int
    epoch: int

    def to_json(self) -> dict[str, Any]:
        return {"objects": list(self.objects), "retired_ms": self.retired_ms, "epoch": self.epoch}

    @classmethod
    def from_doc(cls, d: RetiredDoc) -> RetiredSet:
        return cls(tuple(d.objects), d.retired_ms, d.epoch)


def _part_objects(parts: tuple[CompactedPart, ...]) -> set[str]:
    """The objects ``parts`` name: each part, its deletion vector and its Arrow cache."""
    return {p.object for p in parts} | {o for p in parts for o in (p.deletions, p.arrow_cache) if o}


@dataclass(frozen=True, slots=True)
class Snapshot:
    """An earlier published view of the topic, still readable (``snapshot-retention``):
    what a compacted read of epoch ``epoch`` read — its ``parts`` (each less its deletion
    vector) up to ``horizon``, then the original ledgers above it — with the order and key
    TTL it was decided by.  ``replaced_ms`` is when a newer view replaced it (by the
    store's clock): what its age counts from."""

    epoch: int
    horizon: MessageId | None
    compacted_ledger: str | None
    parts: tuple[CompactedPart, ...]
    keys: int = 0
    tombstones: int = 0
    compacted_ms: int = 0
    replaced_ms: int = 0
    order: TopicOrder = field(default_factory=TopicOrder)
    last_run: dict[str, Any] = field(default_factory=dict)

    @property
    def records(self) -> int:
        """Live records of its compacted parts."""
        return sum(p.live for p in self.parts)

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.parts)

    def objects(self) -> set[str]:
        """Every object a read of it needs: its parts and their deletion vectors."""
        return _part_objects(self.parts)

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "horizon": str(self.horizon) if self.horizon else None,
                "compacted_ledger": self.compacted_ledger, "parts": [p.to_json() for p in self.parts],
                "keys": self.keys, "tombstones": self.tombstones, "compacted_ms": self.compacted_ms,
                "replaced_ms": self.replaced_ms, "last_run": self.last_run, **self.order.to_json()}

    @classmethod
    def from_doc(cls, d: SnapshotDoc, horizon: MessageId | None,
                 ids: list[tuple[MessageId | None, MessageId | None]]) -> Snapshot:
        parts = tuple(CompactedPart.from_doc(p, first, last) for p, (first, last) in zip(d.parts, ids, strict=True))
        return cls(d.epoch, horizon, d.compacted_ledger, parts, d.keys, d.tombstones, d.compacted_ms,
                   d.replaced_ms, TopicOrder(d.order, d.key_ttl_ms), dict(d.last_run))


@dataclass(frozen=True, slots=True)
class CompactionState:
    """What compacted readers follow: positions ``<= horizon`` come from ``parts``.

    ``epoch`` grows by one with every published compaction; ``version`` is the metadata
    document's version (it also grows when garbage collection prunes ``retired``).
    """

    epoch: int = 0
    horizon: MessageId | None = None
    compacted_ledger: str | None = None
    parts: tuple[CompactedPart, ...] = ()
    retired: tuple[RetiredSet, ...] = ()
    keys: int = 0
    tombstones: int = 0
    compacted_ms: int = 0
    last_run: dict[str, Any] = field(default_factory=dict)
    version: int = 0
    token: str = ""
    topic_generation: int = 0  # the topic's truncation count this state was last checked against
    #: the order and key TTL the view was compacted with (readers decide "latest" by it)
    order: TopicOrder = field(default_factory=TopicOrder)
    #: earlier published views still readable, oldest first (``snapshot-retention``)
    snapshots: tuple[Snapshot, ...] = ()
    #: names of retained views, tag -> epoch: a tagged view is kept whatever the retention
    tags: dict[str, int] = field(default_factory=dict)

    @property
    def records(self) -> int:
        """Live records of the compacted ledger."""
        return sum(p.live for p in self.parts)

    def part_ledger_id(self, part: CompactedPart) -> int:
        """The ledger id in the part's header (parts written before ids were recorded
        belong to this state's epoch)."""
        return self.epoch if part.ledger_id is None else part.ledger_id

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.parts)

    def retained_objects(self) -> set[str]:
        """Every object a read of the published view needs: its parts and their deletion
        vectors, and those of every retained snapshot."""
        refs = _part_objects(self.parts)
        for snap in self.snapshots:
            refs |= snap.objects()
        return refs

    def referenced_objects(self) -> set[str]:
        """Every object this state still needs (published, retained in a snapshot, or
        awaiting deletion)."""
        refs = self.retained_objects()
        for r in self.retired:
            refs.update(r.objects)
        return refs

    @property
    def retained_epochs(self) -> tuple[int, ...]:
        """The epochs a read may be made as of, oldest first: each retained snapshot's,
        then the published view's (none before the first compaction)."""
        return (*(s.epoch for s in self.snapshots), *((self.epoch,) if self.epoch else ()))

    def tags_of(self, epoch: int) -> tuple[str, ...]:
        """The tags naming epoch ``epoch``, sorted."""
        return tuple(sorted(name for name, e in self.tags.items() if e == epoch))

    def as_snapshot(self, replaced_ms: int) -> Snapshot:
        """The published view as a snapshot, replaced at ``replaced_ms``."""
        return Snapshot(self.epoch, self.horizon, self.compacted_ledger, self.parts, self.keys, self.tombstones,
                        self.compacted_ms, replaced_ms, self.order, dict(self.last_run))

    def at_epoch(self, epoch: int) -> CompactionState | None:
        """The state as a reader of epoch ``epoch`` saw it (this one for the published
        epoch, else a retained snapshot's view, at this document's version); None when
        that epoch is not retained."""
        if epoch == self.epoch:
            return self
        snap = next((s for s in self.snapshots if s.epoch == epoch), None)
        if snap is None:
            return None
        # Parts written before ids were recorded belong to the epoch that wrote them.
        parts = tuple(p if p.ledger_id is not None else replace(p, ledger_id=snap.epoch) for p in snap.parts)
        return CompactionState(snap.epoch, snap.horizon, snap.compacted_ledger, parts, (), snap.keys, snap.tombstones,
                               snap.compacted_ms, dict(snap.last_run), self.version, self.token,
                               self.topic_generation, snap.order)

    def with_version(self, version: int, token: str) -> CompactionState:
        return replace(self, version=version, token=token)

    def to_json(self) -> dict[str, Any]:
        d = {"format": 1, "epoch": self.epoch,
             "horizon": str(self.horizon) if self.horizon else None,
             "compacted_ledger": self.compacted_ledger,
             "parts": [p.to_json() for p in self.parts],
             "retired": [r.to_json() for r in self.retired],
             "keys": self.keys, "tombstones": self.tombstones, "compacted_ms": self.compacted_ms,
             "last_run": self.last_run, "topic_generation": self.topic_generation,
             **self.order.to_json()}
        if self.snapshots:  # (left out when none: documents as before snapshots were kept)
            d["snapshots"] = [s.to_json() for s in self.snapshots]
        if self.tags:  # (likewise: documents as before tags existed)
            d["tags"] = dict(sorted(self.tags.items()))
        return d

    @classmethod
    def from_json(cls, d: Any, version: int, token: str, where: str = "compaction.json") -> CompactionState:
        """The state of a ``compaction.json`` value, checked against its schema and
        invariants (:class:`~shale.ledger.errors.InvalidMetadataError` naming ``where`` and the
        field otherwise)."""
        doc = validate(d, CompactionDoc, where)
        horizon, ids, snapshot_ids = check_compaction(doc, where)
        parts = tuple(CompactedPart.from_doc(p, first, last) for p, (first, last) in zip(doc.parts, ids, strict=True))
        snapshots = tuple(Snapshot.from_doc(s, h, i) for s, (h, i) in zip(doc.snapshots, snapshot_ids, strict=True))
        return cls(doc.epoch, horizon, doc.compacted_ledger, parts, tuple(RetiredSet.from_doc(r) for r in doc.retired),
                   doc.keys, doc.tombstones, doc.compacted_ms, dict(doc.last_run), version, token,
                   doc.topic_generation, TopicOrder(doc.order, doc.key_ttl_ms), snapshots, dict(doc.tags))
