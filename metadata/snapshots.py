"""Reads as of an earlier compacted view: which retained view an epoch or a time names.

A compaction (or a rollback) that replaces the published view keeps it as a snapshot
while the topic's ``snapshot-retention`` says so (:class:`~shale.metadata.state.Snapshot`,
in ``compaction.json``).  A read *as of* a view reads what a compacted read of it read:
its parts, each less its deletion vector, up to its horizon, then the original ledgers
above that horizon, deciding "the latest value" in the view's own order and key TTL.

``as_of`` is an epoch (a whole number) or a time (a :class:`~datetime.datetime`; one
without a zone is UTC): the view published at or before that time and not replaced
before the next retained one was, i.e. the greatest retained epoch whose view was
published at or before it.  An epoch or time no retained view answers is a
:class:`~shale.ledger.errors.SnapshotNotFoundError` listing those that are.  It may also
be a tag (text: the name of a retained view, ``shale snapshots T --tag NAME``), which
reads exactly what its epoch reads (:func:`epoch_of_tag`).
"""

from __future__ import annotations

import datetime
import re
from typing import Final

from shale.ledger.errors import InvalidInputError, SnapshotNotFoundError
from shale.metadata.schema import MAX_ID, TAG_NAME
from shale.metadata.state import CompactionState
from shale.settings.kinds import shown
from shale.settings.units import format_time

__all__ = ["AsOf", "as_of_ms", "check_tag", "describe_as_of", "epoch_of_tag", "parse_as_of", "retained_text",
           "tags_text", "view_as_of"]

#: An epoch, a time, or a tag (the name of a retained view).
AsOf = int | datetime.datetime | str

_EXAMPLE: Final = ("an epoch (a whole number from 1), a time (ISO 8601, e.g. 2024-05-01T12:00:00Z; UTC without a "
                   "zone) or a tag (a name starting with a letter)")
_TAG: Final = re.compile(TAG_NAME)


def parse_as_of(text: str) -> AsOf:
    """``EPOCH`` or ``TIME`` as a person types it (``--as-of``, the Spark option ``asOf``)."""
    t = text.strip()
    if t.isdigit() and t.isascii():
        if len(t) > 19 or not 1 <= int(t) <= MAX_ID:
            raise InvalidInputError(_epoch_range(t))
        return int(t)
    if _TAG.fullmatch(t):  # (never an epoch nor a time: TAG_NAME)
        return t
    try:
        when = datetime.datetime.fromisoformat(t)
    except ValueError:
        raise InvalidInputError(f"{shown(t)!r} is not {_EXAMPLE}") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=datetime.UTC)


def as_of_ms(when: datetime.datetime) -> int:
    """``when`` in milliseconds since 1970 (UTC when it has no zone)."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)


def _check(as_of: object) -> AsOf:
    if isinstance(as_of, str) and _TAG.fullmatch(as_of):
        return as_of
    if isinstance(as_of, bool) or not isinstance(as_of, (int, datetime.datetime)):
        raise InvalidInputError(f"as of {shown(repr(as_of))}: expected {_EXAMPLE}")
    if isinstance(as_of, int) and not 1 <= as_of <= MAX_ID:
        raise InvalidInputError(_epoch_range(str(as_of)))
    return as_of


def _epoch_range(text: str) -> str:
    # (epochs stay below 2**62, as every id a document holds)
    return f"epoch {shown(text)} is out of range: epochs run from 1 to {MAX_ID}"


def _when(ms: int) -> str:
    return format_time(ms, style="iso")


def _views(state: CompactionState) -> list[tuple[int, int]]:
    """``(epoch, published ms)`` of every view a read may be made as of, oldest first."""
    views = [(s.epoch, s.compacted_ms) for s in state.snapshots]
    return [*views, (state.epoch, state.compacted_ms)] if state.epoch else views


def retained_text(state: CompactionState) -> str:
    """The views a read may be made as of, for a message."""
    views = _views(state)
    if not views:
        return "none: the topic was never compacted"
    return ", ".join(f"epoch {e} (published {_when(ms)})" for e, ms in views)


def describe_as_of(as_of: AsOf) -> str:
    """``as_of`` in words: ``epoch 4``, ``2024-05-01T12:00:00Z``, ``tag 'v1'`` or, past
    what a calendar holds in UTC, ``a time after 9999-12-31T23:59:59Z``."""
    if isinstance(as_of, str):
        return f"tag {as_of!r}"
    if isinstance(as_of, int):
        return f"epoch {as_of}"
    when = _when(as_of_ms(as_of))
    return when if when[:1].isdigit() else f"a time {when}"


def view_as_of(state: CompactionState, as_of: AsOf, where: str) -> CompactionState:
    """The view of ``state`` (its document: ``where``) that ``as_of`` names, as a state a
    :class:`~shale.metadata.view.TopicView` reads."""
    as_of = _check(as_of)
    if isinstance(as_of, str):  # a tag reads exactly what its epoch reads
        as_of = epoch_of_tag(state, as_of, where)
    if isinstance(as_of, int):
        found = state.at_epoch(as_of)
    else:
        ms = as_of_ms(as_of)
        published = [e for e, when in _views(state) if when <= ms]
        found = state.at_epoch(published[-1]) if published else None
    if found is None:
        how = "retained" if isinstance(as_of, int) else "published by then and retained"
        raise SnapshotNotFoundError(f"{where}: no compacted view of {describe_as_of(as_of)} is {how} "
                                    f"(retained: {retained_text(state)}; the snapshot-retention policy says how many "
                                    "are kept)")
    return found


# ------------------------------------------------------------------------ tags


def check_tag(name: object) -> str:
    """``name`` if it may name a view (1 to 200 letters, digits, ``.``, ``_``, ``-``,
    starting with a letter: never an epoch nor a time), else :class:`InvalidInputError`."""
    if not isinstance(name, str) or not _TAG.fullmatch(name):
        raise InvalidInputError(f"bad tag name {shown(str(name))!r}: use 1 to 200 letters, digits, '.', '_' or '-', "
                                "starting with a letter (so that it is never taken for an epoch or a time)")
    return name


def tags_text(state: CompactionState) -> str:
    """The topic's tags, for a message."""
    return ", ".join(f"{n} (epoch {e})" for n, e in sorted(state.tags.items())) or "none"


def epoch_of_tag(state: CompactionState, name: str, where: str = "compaction.json") -> int:
    """The epoch the tag ``name`` names in ``state`` (its document: ``where``);
    :class:`~shale.ledger.errors.SnapshotNotFoundError` when no view is tagged so."""
    epoch = state.tags.get(check_tag(name))
    if epoch is None:
        raise SnapshotNotFoundError(f"{where}: no compacted view is tagged {name!r} (tags: {tags_text(state)}; "
                                    "shale snapshots lists the retained views)")
    return epoch
