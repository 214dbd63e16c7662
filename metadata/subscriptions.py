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

A reader holding a subscription says so in its document (its :class:`Member`, Kafka's
group member): it joins when it opens the subscription, and its heartbeat is the time
every write of it carries — its commits, and a refresh when it has written nothing for
:data:`HEARTBEAT_MS` — so a busy reader's heartbeats cost nothing more than its commits
and an idle one's one small write every half minute.  It counts as gone
(:meth:`Member.alive`) three heartbeat intervals after its last heartbeat (Kafka's
session timeout) and leaves when it closes.  A reset or a delete is refused while a
reader holds the subscription unless forced (the reader's next commit then fails, as
any reader's whose subscription another writer changed).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, Final, Literal

from shale.ledger.errors import (
    AlreadyExistsError,
    ConflictError,
    InUseError,
    InvalidInputError,
    InvalidMetadataError,
    ObjectNotFoundError,
    StateUnknownError,
    TransientStorageError,
)
from shale.ledger.ids import MIN_ID, MessageId
from shale.ledger.values import dataclass
from shale.metadata.documents import DocumentStore, Versioned
from shale.metadata.policy import TopicPolicy
from shale.metadata.schema import SUBSCRIPTION_NAME, SubscriptionDoc, message_id, validate
from shale.metadata.state import TopicState
from shale.metadata.topic import TopicMetadata
from shale.settings import SETTINGS
from shale.settings.kinds import shown
from shale.settings.units import format_duration, format_time

__all__ = ["CLOCK_SKEW_MS", "DEFAULT_EXPIRY_MS", "HEARTBEAT_MS", "SUBSCRIPTIONS_DIR", "Member", "Subscription",
           "SubscriptionNotFoundError", "Subscriptions", "check_name", "expiry_of", "hold_floor", "new_member"]

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
#: A reader that has written nothing to its subscription for this long writes a heartbeat
#: (a follower waiting longer between polls, at each poll).
HEARTBEAT_MS: Final = 30_000
#: A reader counts as gone this many of its heartbeat intervals after its last heartbeat.
_MISSED_HEARTBEATS: Final = 3


class SubscriptionNotFoundError(InvalidInputError, LookupError):
    """The topic has no subscription of that name."""


def check_name(name: str) -> str:
    """``name`` if it may name a subscription (letters, digits, ``.``, ``_``, ``-``; at most
    200; not starting with a dot), else :class:`InvalidInputError` saying so."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidInputError(f"bad subscription name {shown(name)!r}: use 1 to 200 letters, digits, '.', '_' or "
                                "'-', not starting with '.'")
    return name


@dataclass(frozen=True, slots=True)
class Member:
    """The reader holding a subscription: who it is, when it last said so (by its clock),
    and how long after that it counts as gone."""

    id: str
    heartbeat_ms: int
    timeout_ms: int

    def heartbeat_at(self, now_ms: int, written_ms: int | None = None) -> int:
        """When it counts as having last said so, judged at ``now_ms``: its heartbeat, unless
        that is more than its timeout ahead of ``now_ms`` (a clock set wrong, a hand edit)
        — then when the document was last written (``written_ms``, by the store's clock),
        at most ``now_ms``; long ago when that is unknown."""
        if self.heartbeat_ms - now_ms <= self.timeout_ms:
            return self.heartbeat_ms
        return 0 if written_ms is None else min(written_ms, now_ms)

    def age_ms(self, now_ms: int, written_ms: int | None = None) -> int:
        """How long ago its last heartbeat was (0 when it is ahead of ``now_ms`` but believed)."""
        return max(0, now_ms - self.heartbeat_at(now_ms, written_ms))

    def alive(self, now_ms: int, written_ms: int | None = None) -> bool:
        """Whether it still holds the subscription at ``now_ms``: its last heartbeat is
        less than its timeout old."""
        return now_ms - self.heartbeat_at(now_ms, written_ms) < self.timeout_ms

    def beat(self, now_ms: int) -> Member:
        return replace(self, heartbeat_ms=now_ms)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "heartbeat_ms": self.heartbeat_ms, "timeout_ms": self.timeout_ms}


def new_member(interval_ms: int = HEARTBEAT_MS, *, now_ms: int = 0) -> Member:
    """A member for a reader of this process that heartbeats at least every
    ``interval_ms`` (:data:`HEARTBEAT_MS` at the least)."""
    import os
    import secrets
    import socket

    interval = max(HEARTBEAT_MS, int(interval_ms))
    host = socket.gethostname()[:200] or "localhost"
    return Member(f"{host}:{os.getpid()}:{secrets.token_hex(3)}", now_ms, _MISSED_HEARTBEATS * interval)


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
    #: commit time (or its member's heartbeat) was too far ahead of the reader's clock to be believed
    written_ms: int | None = None
    #: the reader holding it, as it last said so (None: none has, or the last one left)
    member: Member | None = None

    def holder(self, now_ms: int) -> Member | None:
        """The reader holding it at ``now_ms`` (None: none, or it is gone)."""
        m = self.member
        return m if m is not None and m.alive(now_ms, self.written_ms) else None

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
        doc = {"format": 1, "name": self.name, "position": str(self.position), "committed_ms": self.committed_ms,
               "created_ms": self.created_ms}
        if self.member is not None:
            doc["member"] = self.member.to_json()
        return doc

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
        m = doc.member
        member = None if m is None else Member(m.id, m.heartbeat_ms, m.timeout_ms)
        return cls(doc.name, position, doc.committed_ms, doc.created_ms, version, token, member=member)


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
        now = self._now_ms()
        m = sub.member
        if sub.ahead(now) or (m is not None and m.heartbeat_ms - now > m.timeout_ms):
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
               topic: TopicState | None = None, member: Member | Literal["keep"] | None = "keep") -> Subscription:
        """``sub`` at ``position`` (:meth:`check_position`, by ``topic`` when given),
        written over the version ``sub`` was read or written at: :class:`ConflictError` if
        another writer changed it since (a reset, another reader of it),
        :class:`SubscriptionNotFoundError` if it was deleted.  ``member``: the reader
        holding it from now on (None: none; by default, the one ``sub`` names)."""
        new = replace(sub, position=self.check_position(position, topic), committed_ms=self._stamp(now_ms),
                      written_ms=None, member=sub.member if member == "keep" else member)
        return self._replace(sub, new)

    def heartbeat(self, sub: Subscription, member: Member | None) -> Subscription:
        """``sub`` written again as it is but for its member, ``member`` (None: the reader
        leaves): no commit, but as :meth:`commit` over the version ``sub`` was read at."""
        return self._replace(sub, replace(sub, member=member, written_ms=None))

    def _replace(self, sub: Subscription, new: Subscription) -> Subscription:
        try:
            v = self.docs.replace(f"{sub.name}.json", new.to_json(), sub.version, token=sub.token or None)
        except (StateUnknownError, TransientStorageError):
            # the write may have landed: only the document can tell (what it holds is then ours)
            now = self.load(sub.name)
            if now is None or now.version != sub.version + 1 or now.to_json() != new.to_json():
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

    def check_free(self, sub: Subscription, *, force: bool = False, doing: str = "reset") -> None:
        """:class:`InUseError` if a reader holds ``sub`` now (by this clock) and not ``force``."""
        now = self._now_ms()
        m = sub.holder(now)
        if m is None or force:
            return
        raise InUseError(
            f"{self.meta.uri}: cannot {doing} subscription {sub.name!r}: reader {m.id} holds it (last heartbeat "
            f"{m.age_ms(now, sub.written_ms) // 1000}s ago; a reader counts as gone "
            f"{format_duration(m.timeout_ms)} after its last heartbeat): stop it first, or force it (--force: the "
            "reader then fails at its next commit)")

    def reset(self, name: str, position: MessageId, *, now_ms: int | None = None,
              topic: TopicState | None = None, force: bool = False) -> tuple[Subscription, Subscription]:
        """Move ``name`` to ``position`` (:meth:`check_position`, by ``topic`` when given),
        which counts as a commit; the subscription before and after.
        :class:`SubscriptionNotFoundError` if there is none; :class:`InUseError` if a
        reader holds it, unless ``force`` (it is let go: that reader's next commit fails)."""
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
            self.check_free(current, force=force)
            before[:] = [current]
            return replace(current, position=position, committed_ms=stamp, written_ms=None, member=None)

        after = self.docs.update(f"{check_name(name)}.json", moved, load=existing,
                                 what=f"{self.meta.uri}: resetting subscription {name!r}")
        return before[0], after

    def delete(self, name: str, *, force: bool = False) -> None:
        """Remove ``name``'s document (read or not: a damaged one is removed too);
        :class:`SubscriptionNotFoundError` if there is none; :class:`InUseError` if a
        reader holds it, unless ``force``."""
        loc = self.docs.location
        key = loc.key(f"{check_name(name)}.json")
        try:
            sub = self.load(name)
        except InvalidMetadataError:
            sub = None  # damaged: nobody reads it
        else:
            if sub is None:
                raise self._missing(name)
            self.check_free(sub, force=force, doing="delete")
        if not loc.store.exists(key):
            raise self._missing(name)
        loc.store.delete(key)
