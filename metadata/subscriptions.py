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
compactor's, as tombstone ages are; clocks are trusted only so far
(:data:`CLOCK_SKEW_MS`): a commit time further ahead of the committer's clock is refused,
and one found further ahead of the judge's counts as made when the document was last
written, by the store's clock (at most now), so that no clock set wrong and no hand edit
keeps a subscription active for ever.

A position is a message id in its one text form, at most the id the topic's next ledger
starts at (:attr:`~shale.metadata.state.TopicState.next_id`: ``latest``); past it, a
subscription would never read again, so such a position is refused when given and is
corrupt metadata when found.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Final

from shale.ledger.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidInputError,
    InvalidMetadataError,
    ObjectNotFoundError,
    StateUnknownError,
    TransientStorageError,
)
from shale.ledger.ids import MIN_ID, MessageId
from shale.metadata.documents import DocumentStore, Versioned
from shale.metadata.policy import TopicPolicy
from shale.metadata.schema import SUBSCRIPTION_NAME, SubscriptionDoc, message_id, validate
from shale.metadata.state import TopicState
from shale.metadata.topic import TopicMetadata
from shale.settings import SETTINGS
from shale.settings.kinds import shown
from shale.settings.units import format_duration, format_time

__all__ = ["CLOCK_SKEW_MS", "DEFAULT_EXPIRY_MS", "SUBSCRIPTIONS_DIR", "Subscription", "SubscriptionNotFoundError",
           "Subscriptions", "check_name", "expiry_of", "hold_floor"]

SUBSCRIPTIONS_DIR: Final = "subscriptions"
#: How long a subscription that does not commit stays active (the ``subscription-expiry`` policy).
DEFAULT_EXPIRY_MS: Final[int] = SETTINGS["subscription-expiry"].default
_NAME: Final = re.compile(SUBSCRIPTION_NAME)
_FILE: Final = re.compile(SUBSCRIPTION_NAME.rstrip("$") + r"\.json$")
#: How far ahead of a clock a commit time may be and still be believed.  Clocks kept in
#: time differ by far less; an hour is also how far ahead of its broker's clock Kafka
#: takes a record's time by default (``log.message.timestamp.after.max.ms``).
CLOCK_SKEW_MS: Final = 3_600_000
#: Every topic's first ledger starts here or later: no position up to it is past an end.
_FIRST: Final = MessageId(1, 0, 0)


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
    #: when its document was last written, by the store's clock: looked up only when its
    #: commit time was too far ahead of the reader's clock to be believed
    written_ms: int | None = None

    def ahead(self, now_ms: int) -> bool:
        """Whether its commit time is too far ahead of ``now_ms`` to be believed (more than
        :data:`CLOCK_SKEW_MS`)."""
        return self.committed_ms - now_ms > CLOCK_SKEW_MS

    def commit_ms(self, now_ms: int) -> int:
        """When it counts as having last committed, judged at ``now_ms``: its commit time,
        unless that is :meth:`ahead` — then when its document was last written (by the
        store's clock), at most ``now_ms``: it expires as any other from then on."""
        if not self.ahead(now_ms):
            return self.committed_ms
        return now_ms if self.written_ms is None else min(self.written_ms, now_ms)

    def active(self, now_ms: int, expiry_ms: int) -> bool:
        """Whether it committed within ``expiry_ms`` of ``now_ms`` (:meth:`commit_ms`): then
        it holds back what it has not read."""
        return now_ms - self.commit_ms(now_ms) < expiry_ms

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


class Subscriptions:
    """The subscriptions of the topic ``meta`` describes (documents in its metadata folder).
    ``clock`` (seconds, :func:`time.time` by default) is what commits are stamped with,
    and what a commit time given is checked against."""

    def __init__(self, meta: TopicMetadata, *, clock: Callable[[], float] | None = None) -> None:
        self.meta = meta
        self.docs = DocumentStore(meta.meta.child(SUBSCRIPTIONS_DIR))
        self.clock = clock or time.time

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _stamp(self, now_ms: int | None) -> int:
        """The commit time to write: now by this writer's clock, or ``now_ms`` unless it is
        before 1970 or more than :data:`CLOCK_SKEW_MS` ahead of that clock."""
        now = self._now_ms()
        if now_ms is None:
            return now
        if isinstance(now_ms, bool) or not isinstance(now_ms, int) or now_ms < 0:
            raise InvalidInputError(f"{self.meta.uri}: commit time {shown(repr(now_ms))}: expected milliseconds "
                                    "since 1970")
        if now_ms - now > CLOCK_SKEW_MS:
            raise InvalidInputError(
                f"{self.meta.uri}: commit time {format_time(now_ms)} UTC is more than "
                f"{format_duration(CLOCK_SKEW_MS)} ahead of this clock ({format_time(now)} UTC): refused, since a "
                "commit from the future would keep the subscription active past its expiry")
        return now_ms

    def check_position(self, position: MessageId, topic: TopicState | None = None) -> MessageId:
        """``position`` if a subscription may stand there: a message id at most the topic's
        :attr:`~shale.metadata.state.TopicState.next_id` (by ``topic``, read again when
        that is not enough to tell); else :class:`InvalidInputError`."""
        if not isinstance(position, MessageId):
            raise InvalidInputError(f"{self.meta.uri}: position {shown(repr(position))} is not a message id "
                                    "(a MessageId)")
        end = _FIRST if topic is None else topic.next_id
        if position > end:
            end = self.meta.load_topic().next_id
            if position > end:
                raise InvalidInputError(
                    f"{self.meta.uri}: position {position} is past the end of the topic (latest is {end}, where its "
                    "next ledger starts): a subscription there would never read again")
        return position

    def check_found(self, sub: Subscription, topic: TopicState) -> TopicState:
        """The topic's ledger list (``topic``, or read again if ``sub`` was committed past
        it meanwhile), once ``sub``'s position is known to lie within it;
        :class:`InvalidMetadataError` naming its document if it lies past the end."""
        if sub.position <= topic.next_id:
            return topic
        topic = self.meta.load_topic()
        if sub.position > topic.next_id:
            raise InvalidMetadataError(
                f"{self.url(sub.name)}: field position: {sub.position} is past the end of the topic (latest is "
                f"{topic.next_id}): it would never read again (shale subscriptions {self.meta.uri} --reset "
                f"{sub.name} --to latest, or --delete {sub.name})")
        return topic

    def url(self, name: str) -> str:
        """The URI of ``name``'s document."""
        return self.docs.url(f"{check_name(name)}.json")

    def _of(self, name: str, doc: Versioned | None) -> Subscription | None:
        if doc is None:
            return None
        sub = Subscription.from_json(doc.value, doc.version, doc.token, name, self.url(name))
        if sub.ahead(self._now_ms()):
            sub = replace(sub, written_ms=self._written_ms(name))
        return sub

    def _written_ms(self, name: str) -> int | None:
        """When ``name``'s document was last written, by the store's clock (None: it is
        gone).  Read after the document, so never before the version read was written."""
        loc = self.docs.location
        try:
            return int(loc.store.stat(loc.key(f"{name}.json")).mtime * 1000)
        except ObjectNotFoundError:
            return None

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

    def create(self, name: str, position: MessageId = MIN_ID, *, now_ms: int | None = None,
               topic: TopicState | None = None) -> Subscription:
        """A new subscription at ``position`` (:meth:`check_position`, by ``topic`` when
        given), committed at ``now_ms`` (:meth:`_stamp`); :class:`InvalidInputError` if it
        exists."""
        now = self._stamp(now_ms)
        sub = Subscription(check_name(name), self.check_position(position, topic), now, now)
        try:
            v = self.docs.create(f"{name}.json", sub.to_json())
        except AlreadyExistsError:
            raise InvalidInputError(f"{self.meta.uri}: subscription {name!r} exists already") from None
        return sub.with_version(v.version, v.token)

    def commit(self, sub: Subscription, position: MessageId, *, now_ms: int | None = None,
               topic: TopicState | None = None) -> Subscription:
        """``sub`` at ``position`` (:meth:`check_position`, by ``topic`` when given),
        written over the version ``sub`` was read or written at: :class:`ConflictError` if
        another writer changed it since (a reset, another reader of it),
        :class:`SubscriptionNotFoundError` if it was deleted."""
        new = replace(sub, position=self.check_position(position, topic), committed_ms=self._stamp(now_ms),
                      written_ms=None)
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

    def reset(self, name: str, position: MessageId, *, now_ms: int | None = None,
              topic: TopicState | None = None) -> tuple[Subscription, Subscription]:
        """Move ``name`` to ``position`` (:meth:`check_position`, by ``topic`` when given),
        which counts as a commit; the subscription before and after.
        :class:`SubscriptionNotFoundError` if there is none."""
        check_name(name)
        self.check_position(position, topic)
        stamp = self._stamp(now_ms)
        before: list[Subscription] = []

        def existing(doc: Versioned | None) -> Subscription:
            sub = self._of(name, doc)
            if sub is None:
                raise self._missing(name)
            return sub

        def moved(current: Subscription) -> Subscription:
            before[:] = [current]
            return replace(current, position=position, committed_ms=stamp, written_ms=None)

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
