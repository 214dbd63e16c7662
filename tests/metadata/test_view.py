"""The view of a topic (:mod:`shale.metadata.view`) from metadata documents alone."""

from __future__ import annotations

from dataclasses import replace

from shale.ledger.format import KIND_COMPACTED, KIND_ORIGINAL
from shale.ledger.ids import MIN_ID, MessageId
from shale.metadata.state import CompactedPart, CompactionState, LedgerInfo, TopicState
from shale.metadata.view import Removed, Segment, TopicView


def _ledger(i: int, entries: int = 3, records: int = 5) -> LedgerInfo:
    return LedgerInfo(i, f"ledgers/{i:020d}-x.ledger", entries, records, 100, 1, 2, 3)


def _part(n: int, first: MessageId, last: MessageId, deleted: int = 0) -> CompactedPart:
    return CompactedPart(f"compacted/1-abc/part-{n}.ledger", 1, 2, 50, first, last, 1,
                         f"compacted/1-abc/dv-{n}.bin" if deleted else None, deleted)


def _topic(ids: range, removed_through: int = 0) -> TopicState:
    return TopicState(tuple(_ledger(i) for i in ids), 0, generation=1 if removed_through else 0,
                      removed_through=removed_through)


H = MessageId(3, 1, 0)
STATE = CompactionState(1, H, "1-abc", (_part(0, MessageId(1, 0, 0), MessageId(2, 2, 0), deleted=1),
                                        _part(1, MessageId(3, 0, 0), H)))


def _objects(items: list[Segment | Removed]) -> list[tuple[object, ...]]:
    return [(s.object.split("/")[-1], s.kind, s.first, s.stop, str(s.start)) if isinstance(s, Segment)
            else ("removed", str(s.first), s.through, str(s.covered)) for s in items]


def test_compacted_view_is_parts_then_the_ledgers_from_the_horizons_successor() -> None:
    view = TopicView(_topic(range(1, 6)), STATE)
    got = list(view.segments())
    assert _objects(got) == [
        ("part-0.ledger", KIND_COMPACTED, 0, 2, "0:0:0"),
        ("part-1.ledger", KIND_COMPACTED, 0, 2, "0:0:0"),
        # the horizon's ledger still holds records after it; ledgers below it are not read again
        ("00000000000000000003-x.ledger", KIND_ORIGINAL, 0, 5, "3:1:1"),
        ("00000000000000000004-x.ledger", KIND_ORIGINAL, 0, 5, "3:1:1"),
        ("00000000000000000005-x.ledger", KIND_ORIGINAL, 0, 5, "3:1:1")]
    assert got[0].deletions == "compacted/1-abc/dv-0.bin" and got[1].deletions is None  # type: ignore[union-attr]
    assert [s.starts_inside for s in view.ledgers(view.tail_start(MIN_ID))] == [True, False, False]
    # from an id above the first part: the second part, then the same tail
    assert _objects(list(view.segments(MessageId(2, 5, 0))))[0] == ("part-1.ledger", KIND_COMPACTED, 0, 2, "2:5:0")
    # from an id above the horizon: original ledgers only; a ledger wholly below is not one
    assert _objects(list(view.segments(MessageId(4, 3, 0)))) == [
        ("00000000000000000005-x.ledger", KIND_ORIGINAL, 0, 5, "4:3:0")]
    # bounded: nothing at or past the end
    assert _objects(list(view.segments(MIN_ID, MessageId(3, 0, 0)))) == _objects(got[:1])


def test_plain_view_in_slices() -> None:
    view = TopicView(_topic(range(1, 3)))
    assert [(s.ledger_id, s.first, s.stop) for s in view.segments(max_records=2)] == [
        (1, 0, 2), (1, 2, 4), (1, 4, 5), (2, 0, 2), (2, 2, 4), (2, 4, 5)]
    assert view.skip(MessageId(1, 3, 0)) == MessageId(2, 0, 0)  # read to its end: at the next ledger
    assert view.skip(MessageId(1, 2, 0)) == MessageId(1, 2, 0)


def test_records_retention_removed_from_an_id() -> None:
    # ledgers 1-4 removed; the horizon's ledger (3) among them
    topic = _topic(range(5, 7), removed_through=4)
    plain = TopicView(topic)
    assert plain.removed_from(MessageId(5, 0, 0)) is None
    gone = plain.removed_from(MessageId(2, 1, 0))
    assert gone == Removed(MessageId(2, 1, 0), 4, MIN_ID) and gone.resume == MessageId(5, 0, 0) and gone.uncovered
    assert _objects(list(plain.segments(MessageId(2, 1, 0))))[0] == ("removed", "2:1:0", 4, "0:0:0")
    # the compacted view holds what lies below the horizon's ledger's end; ledger 4 held
    # records above it (removed with allow_uncompacted): those no view holds
    view = TopicView(topic, STATE)
    assert view.covered() == MessageId(4, 0, 0)
    got = list(view.segments(MessageId(2, 1, 0)))
    assert _objects(got) == [("part-0.ledger", KIND_COMPACTED, 0, 2, "2:1:0"),
                             ("part-1.ledger", KIND_COMPACTED, 0, 2, "2:1:0"), ("removed", "4:0:0", 4, "4:0:0"),
                             ("00000000000000000005-x.ledger", KIND_ORIGINAL, 0, 5, "3:1:1"),
                             ("00000000000000000006-x.ledger", KIND_ORIGINAL, 0, 5, "3:1:1")]
    # a removed horizon ledger a reader had listed says whether records lay above the horizon
    assert view.covered([_ledger(3, entries=2)]) == MessageId(4, 0, 0)
    assert view.covered([_ledger(3, entries=5)]) == H.successor()
    # the topic records where the last removed ledger ended: that decides, listed or not
    ended = TopicView(replace(topic, removed_last=MessageId(4, 3, 0)), STATE)
    assert ended.removed_from(MessageId(4, 3, 1)) is None and ended.removed_from(MessageId(4, 3, 0)) is not None
    ends_at_horizon = TopicView(replace(_topic(range(5, 7), removed_through=3), removed_last=H), STATE)
    assert ends_at_horizon.covered([_ledger(3, entries=5)]) == MessageId(4, 0, 0)
    assert ends_at_horizon.removed_from(H.successor()) is None
    past_horizon = TopicView(replace(_topic(range(5, 7), removed_through=3), removed_last=MessageId(3, 4, 0)), STATE)
    assert past_horizon.covered() == H.successor() and past_horizon.removed_from(H.successor()) is not None
    # from earliest, what went before the read began is no gap; only ledgers 1-3 removed: none lost
    assert not any(isinstance(s, Removed) for s in view.segments())
    assert not any(isinstance(s, Removed) for s in TopicView(_topic(range(4, 7), 3), STATE).segments(MIN_ID))
