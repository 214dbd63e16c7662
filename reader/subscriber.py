"""A reader's durable subscription: where it starts, and committing where it stands.

:class:`~shale.reader.TopicReader` given ``subscription="name"`` opens the topic's
subscription of that name (:mod:`shale.metadata.subscriptions`), creating it at the
reader's ``start`` when there is none, and starts at its committed position.  Its
``commit()`` writes the position after the last record it returned, with
compare-and-swap over what this reader last read or wrote: a reset, or another reader of
the same subscription, makes the commit fail rather than be undone.

With ``auto_commit`` the reader commits by itself what it has handed out once it is asked
for more (at-least-once, as Kafka's auto commit): at the next ``read()``, as an iteration
or a batch reader moves on to the next ledger or part and when it reaches the end of what
there is (before a follower waits), and on ``close()`` — not when a ``with`` block ends
with an error, since what was handed out may not have been handled.

The reader holds the subscription while it is open (its
:class:`~shale.metadata.subscriptions.Member` in the document): it joins as it opens it,
every commit is also its heartbeat, and a reader that has written nothing for
:data:`~shale.metadata.subscriptions.HEARTBEAT_MS` writes one as it is asked for more or
as a follower waits (with ``auto_commit``, by committing again); it leaves as it closes,
in its last commit when it has one to make.  While it holds it, ``shale subscriptions``
refuses to reset or delete the subscription unless forced.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Iterator
from typing import Final, Literal, TypeVar

import numpy as np
import numpy.typing as npt

from shale.ledger.errors import ConflictError, InvalidInputError
from shale.ledger.ids import MIN_ID, MessageId
from shale.ledger.reader import LedgerFile
from shale.ledger.record import Message
from shale.metadata.state import TopicState
from shale.metadata.subscriptions import (
    HEARTBEAT_MS,
    Member,
    Subscription,
    SubscriptionNotFoundError,
    Subscriptions,
    check_name,
    expiry_of,
    new_member,
)
from shale.metadata.topic import TopicMetadata
from shale.settings.kinds import shown

__all__ = ["COMMIT_EVERY", "Subscriber", "Subscribing"]

_T = TypeVar("_T")
Gone = npt.NDArray[np.bool_] | None
_Start = MessageId | Literal["earliest", "latest"] | datetime.datetime

#: How often ``shale read --subscription`` commits: every this many records handed out.
COMMIT_EVERY: Final = 1000


def _now_ms() -> int:
    """This machine's clock, in ms: what heartbeats are stamped and judged by."""
    return int(time.time() * 1000)


class Subscriber:
    """The subscription ``name`` of the topic ``meta`` describes, as one reader uses it."""

    def __init__(self, meta: TopicMetadata, name: str, start: _Start, auto: bool,
                 handed_out: Callable[[], MessageId], topic: Callable[[], TopicState], *,
                 interval_ms: int = HEARTBEAT_MS) -> None:
        self.subscriptions = Subscriptions(meta)
        #: commit by itself what the reader handed out, as it is asked for more
        self.auto = auto
        #: the position after the last record the reader returned
        self.handed_out = handed_out
        #: the ledger list as the reader last read it (what a position is checked against)
        self.topic = topic
        #: this reader, as the subscription's document names the reader holding it (None: gone)
        self.member: Member | None = new_member(interval_ms, now_ms=_now_ms())
        sub = self.subscriptions.load(check_name(name))
        #: whether this reader created the subscription (at its ``start``)
        self.created = sub is None
        if sub is None:
            sub = self._create(name, start)
        else:  # (one committed past the end would never read again: corrupt, named)
            self.subscriptions.check_found(sub, topic())
        #: commit by itself after this many records handed out (None: only as ``auto`` says, or when told)
        self.every: int | None = None
        #: called before each commit the reader makes by itself (say, to flush what it printed)
        self.before_commit: Callable[[], None] | None = None
        #: records handed out since the last commit
        self.since = 0
        now = _now_ms()
        #: it had not committed within the topic's ``subscription-expiry`` when opened: it held
        #: nothing back meanwhile, so deletes may have been missed
        self.expired = not sub.active(now, expiry_of(meta.load_policy()))
        self.subscription: Subscription = self._join(sub)

    def _create(self, name: str, start: _Start) -> Subscription:
        if isinstance(start, MessageId):
            position = start
        elif isinstance(start, datetime.datetime):
            from shale.metadata.asof import point_ms
            from shale.metadata.positions import position_at

            position = position_at(self.subscriptions.meta, self.topic(), point_ms(start))
        elif start == "latest":
            position = self.topic().next_id
        else:
            position = MIN_ID
        try:
            return self.subscriptions.create(name, position, topic=self.topic())
        except InvalidInputError:
            # created by another reader meanwhile: take theirs
            again = self.subscriptions.load(name)
            if again is None:
                raise
            self.created = False
            return again

    def _join(self, sub: Subscription) -> Subscription:
        """``sub`` with this reader as the one holding it (written; read again while
        another writer changes it meanwhile)."""
        for _ in range(5):
            try:
                return self.subscriptions.heartbeat(sub, self._beat())
            except ConflictError:
                sub = self.subscriptions.get(sub.name)
        return self.subscriptions.heartbeat(sub, self._beat())

    def _beat(self) -> Member:
        assert self.member is not None
        self.member = self.member.beat(_now_ms())
        return self.member

    @property
    def name(self) -> str:
        return self.subscription.name

    @property
    def start(self) -> MessageId | Literal["earliest"]:
        """Where the reader starts: ``earliest`` for a subscription still at ``0:0:0``
        (so that a plain reader starts at the oldest record left, without a gap), else
        its committed position."""
        position = self.subscription.position
        return "earliest" if position == MIN_ID else position

    def commit(self, position: MessageId | None = None, *, leave: bool = False) -> MessageId:
        """Commit ``position``, by default the one after the last record the reader
        returned; returns it.  :class:`InvalidInputError` for anything but a message id at
        most that one (what the reader has not returned is not its to commit), and for a
        position past the end of the topic (where a reader that moved there with ``seek``
        would never read again).  ``leave``: the reader lets the subscription go with
        this commit (its last)."""
        handed_out = self.handed_out()
        if position is None:
            position = handed_out
        elif not isinstance(position, MessageId):
            raise InvalidInputError(f"commit({shown(repr(position))}): expected a MessageId (the id of a message "
                                    "returned, or None: after the last one returned)")
        elif position > handed_out:
            raise InvalidInputError(f"commit({position}): past what this reader has returned (it may commit up to "
                                    f"{handed_out}, the position after the last message returned)")
        member = None if leave or self.member is None else self._beat()
        self.subscription = self.subscriptions.commit(self.subscription, position, topic=self.topic(),
                                                      member=member)
        if leave:
            self.member = None
        self.since = 0
        return position

    def _commit_by_itself(self) -> None:
        """A commit the reader makes on its own: what it handed out was handled (told to
        :attr:`before_commit` first: what was done with it must be out before it is committed)."""
        if self.before_commit is not None:
            self.before_commit()
        self.commit()

    def asked(self) -> None:
        """The reader is asked for more: with a cadence, commit once :attr:`every` records
        were handed out since the last commit (they were handled, since more is asked for)."""
        if self.every is not None and self.since >= self.every:
            self._commit_by_itself()

    def at_end(self) -> None:
        """The reader handed out every record there is now: with a cadence, commit them."""
        if self.every is not None and self.since:
            self._commit_by_itself()

    def tick(self) -> None:
        """With ``auto``, commit if there is anything to commit: a new position, or the
        same one once this reader has written nothing for
        :data:`~shale.metadata.subscriptions.HEARTBEAT_MS` (its heartbeat; a commit time
        ahead of this clock is refreshed too).  Without, write the heartbeat alone then."""
        if self.member is None:
            if self.auto and self.handed_out() != self.subscription.position:
                self._commit_by_itself()
            return
        due = _now_ms() - self.member.heartbeat_ms >= HEARTBEAT_MS
        if self.auto and (due or self.handed_out() != self.subscription.position):
            self._commit_by_itself()
        elif due:
            try:
                self.subscription = self.subscriptions.heartbeat(self.subscription, self._beat())
            except (ConflictError, SubscriptionNotFoundError):
                self.member = None  # let go by a reset or a delete: its next commit says so

    def leave(self) -> None:
        """Let the subscription go, if this reader still holds it (one write); a reader a
        reset or a delete let go already has nothing to do."""
        member, self.member = self.member, None
        sub = self.subscription
        if member is None or sub.member is None or sub.member.id != member.id:
            return
        try:
            self.subscription = self.subscriptions.heartbeat(sub, None)
        except (ConflictError, SubscriptionNotFoundError):
            pass  # changed or deleted by another writer: it holds this reader no more

    def committing(self, read: Callable[[LedgerFile, int, Gone], Iterator[_T]]
                   ) -> Callable[[LedgerFile, int, Gone], Iterator[_T]]:
        """``read`` (of one ledger or part, from a record on), committing with ``auto``
        what was handed out before it begins."""
        if not self.auto:
            return read

        def committing(f: LedgerFile, start: int, gone: Gone) -> Iterator[_T]:
            self.tick()
            yield from read(f, start, gone)
        return committing


class Subscribing:
    """What :class:`~shale.reader.TopicReader` does as a durable subscription's reader
    (its ``subscription`` and ``auto_commit``)."""

    #: the durable subscription it reads as, if any
    subscriber: Subscriber | None
    _pending: Message | None
    _next: MessageId
    _topic: TopicState

    def _subscribe(self, meta: TopicMetadata, name: str | None, start: _Start, auto_commit: bool,
                   commit_every: int | None = None, before_commit: Callable[[], None] | None = None,
                   interval_ms: int = HEARTBEAT_MS) -> _Start:
        """Open the subscription ``name`` (created at ``start`` when new), if any, committing
        by itself as ``auto_commit`` and ``commit_every`` say; where the reader starts.
        ``interval_ms``: the longest the reader may go between two looks at the topic (a
        follower's poll interval)."""
        self.subscriber = None
        if name is None:
            if auto_commit or commit_every is not None:
                given = "auto_commit" if auto_commit else "commit_every"
                raise InvalidInputError(f"{given} needs a subscription (TopicReader(..., subscription=NAME))")
            return start
        if commit_every is not None and (isinstance(commit_every, bool) or not isinstance(commit_every, int)
                                         or commit_every < 1):
            raise InvalidInputError(f"commit_every={shown(repr(commit_every))}: expected a whole number of records, "
                                    "at least 1")
        self.subscriber = Subscriber(meta, name, start, auto_commit, self._handed_out, lambda: self._topic,
                                     interval_ms=interval_ms)
        self.subscriber.every, self.subscriber.before_commit = commit_every, before_commit
        return self.subscriber.start

    def commit(self, position: MessageId | None = None) -> MessageId:
        """Commit to the reader's subscription the position after the last message
        returned (or ``position``: the id of one returned but not handled, at most that
        position), and return it; :class:`InvalidInputError` for any other position."""
        if self.subscriber is None:
            raise InvalidInputError("this reader reads as no subscription (TopicReader(..., subscription=NAME))")
        return self.subscriber.commit(position)

    def _handed_out(self) -> MessageId:
        """The position after the last message returned (a message looked at but not taken is not)."""
        return self._pending.id if self._pending is not None else self._next

    def _tick(self) -> None:
        if self.subscriber is not None:
            self.subscriber.tick()

    def _leave(self) -> None:
        if self.subscriber is not None:
            self.subscriber.leave()

    def _asked(self) -> None:
        """More is asked for: what was handed out so far was handled (a cadence may commit it)."""
        if self.subscriber is not None:
            self.subscriber.asked()

    def _handed(self, message: Message | None) -> None:
        """``message`` handed out (None: every record there is now was)."""
        if self.subscriber is not None:
            if message is None:
                self.subscriber.at_end()
            else:
                self.subscriber.since += 1
