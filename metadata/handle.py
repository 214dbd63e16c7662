"""A topic opened once: :class:`Topic`.

A run reads a topic's documents once each — the ledger list, the compaction state, the
policy, the durable subscriptions — through one handle that every step of the run is
given: choosing the topics of ``compact --all``, the run itself, the tombstones
subscriptions hold back, retention after the publish, the backlog its metrics report,
``shale status``, ``shale produce`` and ``shale rollback``.  What a step writes (a
publish, a truncation) the handle keeps, newer versions replacing older ones; a step that
must see the store as it is now (garbage collection after its listing, a conflict being
told apart from a lost race) reads again, through :meth:`Topic.read_topic` and
:meth:`Topic.read_compaction`, and the handle keeps that too.

The handle also holds the run's settings (:class:`~shale.settings.Settings`), so that a
setting's effective value for the topic follows the one precedence rule in one place
(:meth:`Topic.value`):

    a run's flag > the topic's policy > a ``SHALE_*`` variable > the default
"""

from __future__ import annotations

from typing import Any

from shale.metadata.policy import TopicPolicy
from shale.metadata.state import CompactionState, TopicState
from shale.metadata.subscriptions import Subscription, Subscriptions
from shale.metadata.topic import TopicMetadata
from shale.metadata.view import TopicView
from shale.settings import SETTINGS, Settings, Source
from shale.storage import StorageOptions

__all__ = ["Topic", "opened"]


class Topic:
    """One topic, opened once: its metadata (:attr:`meta`), its documents as first read
    (or as last written or read again), and the settings of the run it is opened for."""

    def __init__(self, meta: TopicMetadata, settings: Settings | None = None) -> None:
        self.meta = meta
        #: the run's settings, before the topic's policy (None: the policy, then the defaults)
        self.settings = settings
        self._state: TopicState | None = None
        self._compaction: CompactionState | None = None
        self._policy: TopicPolicy | None = None
        self._subscriptions: tuple[Subscription, ...] | None = None

    @classmethod
    def open(cls, uri: str, metadata_uri: str | None = None, options: StorageOptions | None = None, *,
             settings: Settings | None = None) -> Topic:
        """The topic at ``uri`` (its metadata under ``metadata_uri`` when given), on stores
        opened with ``options`` (the environment's when None); nothing is read yet."""
        return cls(TopicMetadata.open(uri, metadata_uri, options), settings)

    @property
    def uri(self) -> str:
        return self.meta.uri

    # ------------------------------------------------------------------ documents

    @property
    def state(self) -> TopicState:
        """The ledger list, read on first use (:class:`~shale.ledger.errors.TopicNotFoundError`
        if there is no topic here)."""
        if self._state is None:
            self._state = self.meta.load_topic()
        return self._state

    @property
    def compaction(self) -> CompactionState:
        """The published compaction state, read on first use."""
        if self._compaction is None:
            self._compaction = self.meta.load_compaction()
        return self._compaction

    @property
    def policy(self) -> TopicPolicy:
        """The topic's policy, read on first use."""
        if self._policy is None:
            self._policy = self.meta.load_policy()
        return self._policy

    @property
    def subscriptions(self) -> tuple[Subscription, ...]:
        """The topic's durable subscriptions, listed on first use."""
        if self._subscriptions is None:
            self._subscriptions = tuple(Subscriptions(self.meta).list())
        return self._subscriptions

    def read_topic(self) -> TopicState:
        """The ledger list as it is now (read again), kept."""
        self.keep(self.meta.load_topic())
        return self.state

    def read_compaction(self) -> CompactionState:
        """The compaction state as it is now (read again), kept."""
        self.keep(self.meta.load_compaction())
        return self.compaction

    def forget(self) -> None:
        """Hold nothing: each document is read again on its next use."""
        self._state = self._compaction = self._policy = None
        self._subscriptions = None

    def keep(self, doc: TopicState | CompactionState | TopicPolicy) -> None:
        """Keep ``doc``, written or read elsewhere, unless the handle holds a newer version."""
        if isinstance(doc, TopicState):
            if self._state is None or doc.version >= self._state.version:
                self._state = doc
        elif isinstance(doc, CompactionState):
            if self._compaction is None or doc.version >= self._compaction.version:
                self._compaction = doc
        elif self._policy is None or doc.version >= self._policy.version:
            self._policy = doc

    def view(self, *, compacted: bool = True) -> TopicView:
        """The topic's view from the documents the handle holds."""
        return TopicView(self.state, self.compaction if compacted else None)

    # ------------------------------------------------------------------- settings

    def effective(self) -> Settings:
        """The run's settings with the topic's policy applied (the policy is read unless
        every setting it may hold came from a flag)."""
        if self.settings is None:
            raise ValueError("this topic was opened without a run's settings")
        if all(v.source is Source.FLAG or not v.setting.policy for v in self.settings.values()):
            return self.settings
        return self.settings.with_policy(self.policy.to_json())

    def value(self, name: str) -> Any:
        """The setting ``name``'s value for this topic: a run's flag > the topic's policy >
        a ``SHALE_*`` variable > the default.  The policy is read only when it could
        decide (not for a flag given, nor for a setting no policy holds)."""
        s = SETTINGS[name]
        given = self.settings[name] if self.settings is not None and name in self.settings else None
        if given is not None and (given.source is Source.FLAG or not s.policy):
            return given.value
        if s.policy and (own := self.policy.get(s.py_name)) is not None:
            return s.kind.from_doc(own)
        return s.default if given is None else given.value


def opened(topic: Topic | TopicMetadata | str, metadata_uri: str | None = None) -> Topic:
    """``topic`` as a handle: as it is, wrapped (a :class:`TopicMetadata` already open), or
    opened (a URI, its metadata under ``metadata_uri``)."""
    if isinstance(topic, Topic):
        return topic
    if isinstance(topic, TopicMetadata):
        return Topic(topic)
    return Topic.open(topic, metadata_uri)
