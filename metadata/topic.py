"""A topic's metadata: where it lives and the two documents that describe it.

``topic.json`` holds the ordered ledger list (producers append with compare-and-swap);
``compaction.json`` holds the compaction state (compactors publish with
compare-and-swap).  They are separate documents so producers and compactors never
conflict with each other.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from shale.ledger.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidInputError,
    InvalidURIError,
    ShaleError,
    StorageError,
    TopicNotFoundError,
)
from shale.ledger.ids import MessageId
from shale.metadata.dictionaries import DictionaryCache
from shale.metadata.documents import DocumentStore, Versioned
from shale.metadata.layout import META_DIR
from shale.metadata.policy import POLICY_DOC, TopicPolicy
from shale.metadata.requirements import PublishRequirement, unmet
from shale.metadata.snapshots import AsOf, view_as_of
from shale.metadata.state import CompactionState, LedgerInfo, ProducerMark, TopicState
from shale.storage import Location, StorageOptions, require, resolve
from shale.storage.retry import ConflictPolicy

__all__ = ["TopicMetadata", "topic_locations"]

TOPIC_DOC = "topic.json"
COMPACTION_DOC = "compaction.json"


def topic_locations(topic_uri: str, metadata_uri: str | None = None,
                    options: StorageOptions | None = None) -> tuple[Location, Location]:
    """The topic's folder and its metadata folder, on stores opened with ``options`` (the
    environment's when ``None``).

    By default the metadata lives beside the data (``<topic>/_meta``).  With
    ``metadata_uri`` it lives under that folder, at a path derived from the topic URI,
    so one metadata store can serve many topics on many stores.
    """
    options = StorageOptions.from_environment() if options is None else options
    topic = resolve(topic_uri, options)
    if not topic.prefix:
        raise InvalidURIError(f"topic URI {topic_uri!r} names a bucket or root, not a topic folder")
    if metadata_uri is None:
        return topic, topic.child(META_DIR)
    return topic, _meta_location(topic, topic.prefix, metadata_uri, options)


def _meta_location(topic: Location, prefix: str, metadata_uri: str | None, options: StorageOptions) -> Location:
    """Where the metadata of the topic at ``prefix`` on ``topic``'s store lives."""
    if metadata_uri is None:
        return Location(topic.store, f"{prefix}/{META_DIR}" if prefix else META_DIR,
                        topic.store.url(f"{prefix}/{META_DIR}"))
    meta_root = resolve(metadata_uri, options)
    path = "/".join([topic.store.scheme, topic.store.authority or "local", prefix])
    return Location(meta_root.store, meta_root.key(path), f"{meta_root.uri.rstrip('/')}/{path}")


class TopicMetadata:
    """Reads and writes one topic's metadata documents."""

    def __init__(self, topic: Location, meta: Location, metadata_uri: str | None = None,
                 options: StorageOptions | None = None) -> None:
        self.topic = topic
        self.meta = meta
        self.metadata_uri = metadata_uri
        #: what the stores were opened with (what opens the metadata folder of a topic nested in this one)
        self.options = StorageOptions.from_environment() if options is None else options
        require(meta, "supports_conditional_writes", "a topic's metadata",
                hint="keep the metadata on s3:// or a local folder (--metadata)")
        self.docs = DocumentStore(meta)
        #: the topic's trained zstd dictionaries, by id, read once each
        self.dictionaries = DictionaryCache(self)

    @classmethod
    def open(cls, topic_uri: str, metadata_uri: str | None = None,
             options: StorageOptions | None = None) -> TopicMetadata:
        """The metadata of the topic at ``topic_uri`` (kept under ``metadata_uri`` when
        given), on stores opened with ``options`` (the environment's when ``None``)."""
        options = StorageOptions.from_environment() if options is None else options
        return cls(*topic_locations(topic_uri, metadata_uri, options), metadata_uri, options)

    def now_ms(self) -> int:
        """The time by the clock of the store holding the topic's objects: every age
        garbage collection judges is judged by it, so stamps that it compares (a
        truncation's, a retirement's) are taken by it too."""
        return self.topic.store.now_ms(self.topic.prefix)

    @property
    def uri(self) -> str:
        return self.topic.uri

    # ---------------------------------------------------------------- topic document

    def _topic(self, doc: Versioned) -> TopicState:
        return TopicState.from_json(doc.value, doc.version, doc.token, self.docs.url(TOPIC_DOC))

    def _existing_topic(self, doc: Versioned | None) -> TopicState:
        if doc is None:
            raise TopicNotFoundError(f"no topic at {self.topic.uri} ({self.docs.url(TOPIC_DOC)} is missing)")
        return self._topic(doc)

    def load_topic(self) -> TopicState:
        """The ledger list; :class:`TopicNotFoundError` if there is no topic here."""
        return self._existing_topic(self.docs.read(TOPIC_DOC))

    def update_topic(self, change: Callable[[TopicState], TopicState | None], *, current: TopicState | None = None,
                     attempts: int = 20, what: str = "",
                     on_unknown: Callable[[StorageError], None] | None = None) -> TopicState:
        """Change the ledger list with :meth:`DocumentStore.update <shale.metadata.documents.DocumentStore.update>`:
        ``change`` is applied to the list as read (again after each conflict, up to
        ``attempts`` times) and what it returns swapped in; :class:`TopicNotFoundError`
        if there is no topic here."""
        return self.docs.update(TOPIC_DOC, change, load=self._existing_topic, current=current,
                                policy=ConflictPolicy(attempts), what=f"{self.uri}: {what or 'the ledger list'}",
                                on_unknown=on_unknown)

    def exists(self) -> bool:
        return self.docs.read(TOPIC_DOC) is not None

    def create_topic(self) -> TopicState:
        """Create an empty topic, or return the existing one (creation is idempotent)."""
        doc = self.docs.read(TOPIC_DOC)
        if doc is not None:
            return self._topic(doc)
        nested = self.nesting()
        if nested:
            raise InvalidURIError(f"cannot create a topic at {self.topic.uri}: {nested}")
        state = TopicState((), int(time.time() * 1000))
        try:
            v = self.docs.create(TOPIC_DOC, state.to_json())
        except AlreadyExistsError:
            return self.load_topic()
        return TopicState(state.ledgers, state.created_ms, v.version, v.token)

    def nesting(self) -> str:
        """Why a topic here would nest with another ("" when it would not): a topic inside
        another's folder, or around one, mixes their objects, and the outer topic's
        garbage collection must never have to tell them apart."""
        parts = self.topic.prefix.split("/")
        for i in range(len(parts) - 1, 0, -1):
            outer = _meta_location(self.topic, "/".join(parts[:i]), self.metadata_uri, self.options)
            if outer.store.exists(outer.key(TOPIC_DOC)):
                return f"it would lie inside the topic {self.topic.store.url('/'.join(parts[:i]))}"
        own = self.meta.key(TOPIC_DOC)
        inner_marker = f"/{TOPIC_DOC}" if self.metadata_uri is not None else f"/{META_DIR}/{TOPIC_DOC}"
        under = self.meta if self.metadata_uri is not None else self.topic
        for info in under.store.list(f"{under.prefix}/"):
            if info.key != own and info.key.endswith(inner_marker):
                inner = info.key[:-len(inner_marker)]
                return f"the topic {under.store.url(inner)} lies inside it"
        return ""

    @staticmethod
    def appended(expected: TopicState, info: LedgerInfo, producer: tuple[str, ProducerMark] | None = None,
                 producer_expiry_ms: int | None = None) -> TopicState:
        """``expected`` with a sealed ledger registered after its ledgers (refused,
        before anything is written, unless its id is after every id the topic has had),
        and, from an idempotent producer, its mark (``(id, mark)``), in the same document:
        the marks older than ``producer_expiry_ms`` by the new one's time are dropped."""
        if info.id <= expected.last_ledger_id:
            raise InvalidInputError(
                f"ledger id {info.id} must be greater than the last one, {expected.last_ledger_id}")
        if producer is None:
            return replace(expected, ledgers=(*expected.ledgers, info))
        name, mark = producer
        kept = {k: m for k, m in expected.producers.items()
                if producer_expiry_ms is None or m.live(mark.at_ms, producer_expiry_ms)}
        return replace(expected, ledgers=(*expected.ledgers, info), producers={**kept, name: mark})

    def append_ledger(self, info: LedgerInfo, expected: TopicState) -> TopicState:
        """Register a sealed ledger after those of ``expected``; :class:`ConflictError` if the
        list changed since ``expected`` was read."""
        return self.replace_topic(self.appended(expected, info), expected)

    def replace_topic(self, new: TopicState, expected: TopicState) -> TopicState:
        """Write ``new`` in place of ``expected``; :class:`ConflictError` if the document
        changed since ``expected`` was read."""
        v = self.docs.replace(TOPIC_DOC, new.to_json(), expected.version, token=expected.token or None)
        return replace(new, version=v.version, token=v.token)

    def truncate(self, before_ledger: int, attempts: int = 20) -> tuple[TopicState, list[LedgerInfo]]:
        """Retention: remove the ledgers with ids below ``before_ledger`` from the topic.

        Two compare-and-swaps: the ledger list (the truncation count grows by one), then
        the compaction state, stamped with the new count so that any compaction planned
        before the truncation loses its publish race and plans again (Kafka's generation
        check).  The objects stay until garbage collection finds them unregistered past
        the orphan grace.  Returns the new topic state and the ledgers removed.
        """
        now_ms = self.now_ms()
        removed: list[LedgerInfo] = []
        known: dict[int, MessageId | None] = {}

        def last_id(lg: LedgerInfo) -> MessageId | None:
            if lg.id not in known:
                known[lg.id] = self._last_record(lg)
            return known[lg.id]

        def truncated(current: TopicState) -> TopicState | None:
            removed[:] = [lg for lg in current.ledgers if lg.id < before_ledger]
            if not removed:
                # An earlier truncation may have stopped between its two writes: finish it.
                self._stamp_generation(current.generation, attempts)
                return None
            return replace(current, ledgers=tuple(lg for lg in current.ledgers if lg.id >= before_ledger),
                           version=0, token="", generation=current.generation + 1,
                           removed_through=max(current.removed_through, removed[-1].id),
                           truncated_ms=max(now_ms, current.truncated_ms), removed_last=last_id(removed[-1]))

        try:
            # a producer registering a ledger meanwhile is a conflict: read again
            new = self.update_topic(truncated, attempts=attempts, what="truncation")
            if removed:
                self._stamp_generation(new.generation, attempts)
            return new, list(removed)
        except ConflictError as e:
            raise ConflictError(f"{self.uri}: the topic kept changing; truncation gave up after {attempts} attempts "
                                f"({e})") from e

    def _last_record(self, lg: LedgerInfo) -> MessageId | None:
        """The id of ``lg``'s last record, from its footer; ``None`` when it cannot be read
        (a damaged or missing ledger still goes: whether it held records past an id is
        then unknown, which readers and rollbacks take as "it did")."""
        from shale.ledger.reader import LedgerFile

        try:
            f = LedgerFile.open(self.topic.store, self.topic.key(lg.object), ledger_id=lg.id)
            return f.record_id(f.n_records - 1)
        except (ShaleError, OSError):
            return None

    def _stamp_generation(self, generation: int, attempts: int) -> None:
        if generation == 0:
            return

        def stamped(state: CompactionState) -> CompactionState | None:
            return None if state.topic_generation >= generation else replace(state, topic_generation=generation)

        try:
            self.update_compaction(stamped, attempts=attempts, what="stamping the truncation")
        except ConflictError as e:
            raise ConflictError(f"{self.uri}: could not stamp the compaction state after the truncation ({e})") from e

    # ----------------------------------------------------------- compaction document

    def _policy(self, doc: Versioned | None) -> TopicPolicy:
        if doc is None:
            return TopicPolicy()
        return TopicPolicy.from_json(doc.value, doc.version, doc.token, self.docs.url(POLICY_DOC))

    def load_policy(self) -> TopicPolicy:
        """The topic's policy (empty, at version 0, if it has none)."""
        return self._policy(self.docs.read(POLICY_DOC))

    def update_policy(self, changes: Mapping[str, Any], removed: Iterable[str] = (),
                      attempts: int = 20) -> TopicPolicy:
        """Set the policy fields ``changes`` and remove those ``removed``, with one
        compare-and-swap on the current policy (read again on a conflict)."""
        drop = set(removed)

        def changed(current: TopicPolicy) -> TopicPolicy:
            value = {k: v for k, v in {**current.to_json(), **changes}.items() if k not in drop}
            return TopicPolicy.from_json(value, current.version + 1, "", self.docs.url(POLICY_DOC))

        return self.docs.update(POLICY_DOC, changed, load=self._policy, policy=ConflictPolicy(attempts),
                                what=f"{self.uri}: changing the policy")

    def _compaction(self, doc: Versioned | None) -> CompactionState:
        if doc is None:
            return CompactionState()
        return CompactionState.from_json(doc.value, doc.version, doc.token, self.docs.url(COMPACTION_DOC))

    def load_compaction(self) -> CompactionState:
        """The published compaction state (an empty state at version 0 if none yet)."""
        return self._compaction(self.docs.read(COMPACTION_DOC))

    def load_compaction_as_of(self, as_of: AsOf) -> CompactionState:
        """The compacted view of the retained snapshot ``as_of`` names (an epoch or a
        time: :func:`~shale.metadata.snapshots.view_as_of`), as a state to read;
        :class:`~shale.ledger.errors.SnapshotNotFoundError` when none is retained."""
        return view_as_of(self.load_compaction(), as_of, self.docs.url(COMPACTION_DOC))

    def update_compaction(self, change: Callable[[CompactionState], CompactionState | None], *,
                          current: CompactionState | None = None, attempts: int = 20,
                          what: str = "") -> CompactionState:
        """Change the compaction state with :meth:`DocumentStore.update
        <shale.metadata.documents.DocumentStore.update>` (a compaction publishes with
        :meth:`publish_compaction` instead: it must not retry, but plan again)."""
        return self.docs.update(COMPACTION_DOC, change, load=self._compaction, current=current,
                                policy=ConflictPolicy(attempts),
                                what=f"{self.uri}: {what or 'the compaction state'}", on_unknown=None)

    def publish_compaction(self, new: CompactionState, expected: CompactionState,
                           requirements: tuple[PublishRequirement, ...] = ()) -> CompactionState:
        """One compare-and-swap from ``expected`` to ``new``.

        ``requirements`` are checked against ``expected`` before anything is written, and
        against the state found when the swap loses: :class:`~shale.metadata.requirements.RequirementFailedError` names
        the first one that failed; a plain :class:`ConflictError` means the state changed
        while every requirement still holds."""
        where = self.docs.url(COMPACTION_DOC)
        if (failed := unmet(requirements, expected, where)) is not None:
            raise failed
        try:
            if expected.version == 0:
                v = self.docs.create(COMPACTION_DOC, new.to_json())
            else:
                v = self.docs.replace(COMPACTION_DOC, new.to_json(), expected.version,
                                      token=expected.token or None)
        except ConflictError as e:
            if requirements and (failed := unmet(requirements, self.load_compaction(), where)) is not None:
                raise failed from e
            raise
        return new.with_version(v.version, v.token)
