"""Durable subscriptions: a named position in a topic, one metadata document each.

``<meta>/subscriptions/<name>.json`` holds where a subscription stands: ``position``, the
id of the next record it reads (Kafka's consumer groups commit the next offset too),
when it last committed and when it was created.  Each subscription has a document of its
own, changed with compare-and-swap (:class:`~shale.metadata.documents.DocumentStore`), so
subscribers never contend with each other, with producers or with compactors.

A subscription is **active** while it has committed within the topic's
``subscription-expiry`` (default 7 days): until then compaction keeps every tombstone at
or after its position (up to ``max-tombstone-hold``) and retention keeps every ledger it
has not read.  An expired subscription holds nothing back; a commit or a reset makes it
active again.  Commit times are stamped by the committer's clock and judged by the
compactor's, as tombstone ages are.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Final

from shale.ledger.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidInputError,
    InvalidMetadataError,
    StateUnknownError,
    TransientStorageError,
)
from shale.ledger.ids import MIN_ID, MessageId
from shale.metadata.documents import DocumentStore, Versioned
from shale.metadata.policy import TopicPolicy
from shale.metadata.schema import SUBSCRIPTION_NAME, SubscriptionDoc, message_id, validate
from shale.metadata.topic import TopicMetadata
from shale.settings import SETTINGS
from shale.settings.kinds import shown

__all__ = ["DEFAULT_EXPIRY_MS", "SUBSCRIPTIONS_DIR", "Subscription", "SubscriptionNotFoundError", "Subscriptions",
           "check_name", "expiry_of", "hold_floor"]

SUBSCRIPTIONS_DIR: Final = "subscriptions"
#: How long a subscription that does not commit stays active (the ``subscription-expiry`` policy).
DEFAULT_EXPIRY_MS: Final[int] = SETTINGS["subscription-expiry"].default
_NAME: Final = re.compile(SUBSCRIPTION_NAME)
_FILE: Final = re.compile(SUBSCRIPTION_NAME.rstrip("$") + r"\.json$")


class SubscriptionNotFoundError(InvalidInputError, LookupError):
    """The topic has no subscription of that name."""


def check_name(name: str) -> str:
    """``name`` if it may name a subscription (letters, digits, ``.``, ``_``, ``-``; at most
    200; not starting with a dot), else :class:`InvalidInputError` saying so."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidInputError(f"bad subscription name {shown(name)!r}: use 1 to 200 letters, digits, '.', '_' or "
                                "'-', not starting with '.'")
    return name


def expiry_of(policy: TopicPolicy) -> int:
    """The topic's ``subscription-expiry``: its policy's, else the default."""
    own = policy.get("subscription_expiry_ms")
    return DEFAULT_EXPIRY_MS if own is None else int(own)


@dataclass(frozen=True, slots=True)
class Subscription:
    """One subscription as its document says, with the version it was read at."""

    name: str
    #: the id of the next record it reads (``0:0:0``: the very start, the compacted view's included)
    position: MessageId
    committed_ms: int
    created_ms: int
    version: int = 0
    token: str = ""

    def active(self, now_ms: int, expiry_ms: int) -> bool:
        """Whether it committed within ``expiry_ms`` of ``now_ms``: then it holds back what
        it has not read."""
        return now_ms - self.committed_ms < expiry_ms

    def with_version(self, version: int, token: str) -> Subscription:
        return replace(self, version=version, token=token)

    def to_json(self) -> dict[str, Any]:
        return {"format": 1, "name": self.name, "position": str(self.position), "committed_ms": self.committed_ms,
                "created_ms": self.created_ms}

    @classmethod
    def from_json(cls, value: Any, version: int, token: str, name: str, where: str) -> Subscription:
        """The subscription ``value`` describes, checked against its schema and against
        its file's ``name`` (:class:`InvalidMetadataError` naming ``where`` otherwise)."""
        doc = validate(value, SubscriptionDoc, where)
        if doc.name != name:
            raise InvalidMetadataError(f"{where}: field name: {shown(doc.name)!r} is not the subscription its file "
                                       f"names ({name!r})")
        position = message_id(doc.position, where, "position")
        assert position is not None  # (a str, never None)
        return cls(doc.name, position, doc.committed_ms, doc.created_ms, version, token)


def hold_floor(subscriptions: Iterable[Subscription], now_ms: int, expiry_ms: int) -> MessageId | None:
    """The least position of the active subscriptions (None: none is active): what they
    have yet to read starts there."""
    return min((s.position for s in subscriptions if s.active(now_ms, expiry_ms)), default=None)


def _now_ms() -> int:
    return int(time.time() * 1000)


class Subscriptions:
    """The subscriptions of the topic ``meta`` describes (documents in its metadata folder)."""

    def __init__(self, meta: TopicMetadata) -> None:
        self.meta = meta
        self.docs = DocumentStore(meta.meta.child(SUBSCRIPTIONS_DIR))

    def url(self, name: str) -> str:
        """The URI of ``name``'s document."""
        return self.docs.url(f"{check_name(name)}.json")

    def _of(self, name: str, doc: Versioned | None) -> Subscription | None:
        if doc is None:
            return None
        return Subscription.from_json(doc.value, doc.version, doc.token, name, self.url(name))

    def load(self, name: str) -> Subscription | None:
        """The subscription ``name``, or None if the topic has none of that name."""
        return self._of(name, self.docs.read(f"{check_name(name)}.json"))

    def get(self, name: str) -> Subscription:
        """The subscription ``name``; :class:`SubscriptionNotFoundError` if there is none."""
        sub = self.load(name)
        if sub is None:
            raise self._missing(name)
        return sub

    def _missing(self, name: str) -> SubscriptionNotFoundError:
        return SubscriptionNotFoundError(f"{self.meta.uri}: no subscription {name!r} (shale subscriptions "
                                         f"{self.meta.uri} lists them)")

    def names(self) -> list[str]:
        """The names of the topic's subscriptions, sorted (one listing of their folder;
        objects not named as a subscription's document are not subscriptions)."""
        loc = self.docs.location
        found = (loc.relative(info.key) for info in loc.store.list(f"{loc.prefix}/"))
        return sorted(rel[:-len(".json")] for rel in found if _FILE.fullmatch(rel))

    def list(self) -> list[Subscription]:
        """Every subscription of the topic, by name (removed while listed: left out)."""
        names = self.names()
        if len(names) <= 1:
            subs = [self.load(n) for n in names]
        else:  # each a read with latency on an object store
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=min(8, len(names)), thread_name_prefix="shale-subs") as pool:
                subs = list(pool.map(self.load, names))
        return [s for s in subs if s is not None]

    def create(self, name: str, position: MessageId = MIN_ID, *, now_ms: int | None = None) -> Subscription:
        """A new subscription at ``position``; :class:`InvalidInputError` if it exists."""
        now = _now_ms() if now_ms is None else now_ms
        sub = Subscription(check_name(name), position, now, now)
        try:
            v = self.docs.create(f"{name}.json", sub.to_json())
        except AlreadyExistsError:
            raise InvalidInputError(f"{self.meta.uri}: subscription {name!r} exists already") from None
        return sub.with_version(v.version, v.token)

    def commit(self, sub: Subscription, position: MessageId, *, now_ms: int | None = None) -> Subscription:
        """``sub`` at ``position``, written over the version ``sub`` was read or written at:
        :class:`ConflictError` if another writer changed it since (a reset, another reader
        of it), :class:`SubscriptionNotFoundError` if it was deleted."""
        new = replace(sub, position=position, committed_ms=_now_ms() if now_ms is None else now_ms)
        try:
            v = self.docs.replace(f"{sub.name}.json", new.to_json(), sub.version, token=sub.token or None)
        except (StateUnknownError, TransientStorageError):
            # the write may have landed: only the document can tell (what it holds is then ours)
            now = self.load(sub.name)
            if now is None or (now.version, now.position, now.committed_ms) != (sub.version + 1, position,
                                                                                 new.committed_ms):
                raise
            return now
        except ConflictError as e:
            now = self.load(sub.name)
            if now is None:
                raise SubscriptionNotFoundError(f"{self.meta.uri}: subscription {sub.name!r} was deleted") from None
            raise ConflictError(
                f"{self.url(sub.name)}: subscription {sub.name!r} was changed by another writer (a reset, or another "
                f"reader of it) since this reader last committed: it stands at {now.position} now; open it again "
                "to go on from there", expected=e.expected, found=e.found) from None
        return new.with_version(v.version, v.token)

    def reset(self, name: str, position: MessageId, *, now_ms: int | None = None) -> tuple[Subscription, Subscription]:
        """Move ``name`` to ``position`` (which counts as a commit); the subscription before
        and after.  :class:`SubscriptionNotFoundError` if there is none."""
        before: list[Subscription] = []

        def existing(doc: Versioned | None) -> Subscription:
            sub = self._of(name, doc)
            if sub is None:
                raise self._missing(name)
            return sub

        def moved(current: Subscription) -> Subscription:
            before[:] = [current]
            return replace(current, position=position, committed_ms=_now_ms() if now_ms is None else now_ms)

        after = self.docs.update(f"{check_name(name)}.json", moved, load=existing,
                                 what=f"{self.meta.uri}: resetting subscription {name!r}")
        return before[0], after

    def delete(self, name: str) -> None:
        """Remove ``name``'s document (read or not: a damaged one is removed too);
        :class:`SubscriptionNotFoundError` if there is none."""
        loc = self.docs.location
        key = loc.key(f"{check_name(name)}.json")
        if not loc.store.exists(key):
            raise self._missing(name)
        loc.store.delete(key)
