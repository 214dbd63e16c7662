"""``TopicReader(subscription=...)``: resuming where a subscription last committed,
``commit()``, ``auto_commit``, and what happens when another writer changes the
subscription under a reader; the documents' names and schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shale.ledger.errors import ConflictError, InUseError, InvalidInputError, InvalidMetadataError, StateUnknownError
from shale.ledger.ids import MIN_ID, MessageId
from shale.metadata.subscriptions import SubscriptionNotFoundError, Subscriptions, check_name
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from tests.tamper import edit, write_raw


def produce(uri: str, n: int, first: int = 0) -> None:
    """``n`` records, four a ledger, two an entry: ``k<i>`` = ``v<i>``."""
    with TopicWriter(uri, batch_size=2, max_ledger_records=4) as w:
        for i in range(first, first + n):
            w.append(f"k{i}", f"v{i}")


def values(messages: list) -> list[int]:  # type: ignore[type-arg]
    return [int(m.value[1:]) for m in messages]


def position(uri: str, name: str) -> MessageId:
    return Subscriptions(TopicMetadata.open(uri)).get(name).position


def test_a_subscription_resumes_where_it_last_committed(disk_topic_uri: str) -> None:
    uri = disk_topic_uri
    produce(uri, 10)
    with TopicReader(uri, subscription="app") as r:
        assert values(r.read(limit=3)) == [0, 1, 2]
        assert r.commit() == MessageId(1, 1, 1)  # the id of the next record to read
        assert values(r.read(limit=2)) == [3, 4]  # read, not committed
    with TopicReader(uri, subscription="app", start="latest") as r:  # start applies to a new one only
        assert values(r.read()) == list(range(3, 10))
        r.commit()
    assert position(uri, "app") == MessageId(4, 0, 0)  # past the last ledger read to its end
    produce(uri, 2, first=10)
    with TopicReader(uri, subscription="app") as r:
        assert values(r.read()) == [10, 11]
    # a new subscription starts where it is told: latest, an id, or earliest by default
    with TopicReader(uri, subscription="new", start="latest") as r:
        assert r.read() == [] and position(uri, "new") == MessageId(5, 0, 0)
    with TopicReader(uri, subscription="mid", start=MessageId(2, 1, 0), read_compacted=True) as r:
        assert values(r.read()) == list(range(6, 12))


def test_auto_commit_commits_what_was_handed_out_once_asked_for_more(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    produce(uri, 10)
    with TopicReader(uri, subscription="auto", auto_commit=True) as r:
        r.read(limit=3)
        assert position(uri, "auto") == MIN_ID  # not handled yet
        r.read(limit=1)  # the first three were: committed as the reader is asked for more
        assert position(uri, "auto") == MessageId(1, 1, 1)
    assert position(uri, "auto") == MessageId(2, 0, 0)  # closed: what it handed out
    # iterating: committed as it moves to the next ledger, and at the end
    seen = []
    with TopicReader(uri, subscription="auto", auto_commit=True) as r:
        for m in r:
            seen.append((int(m.value[1:]), position(uri, "auto")))
    assert seen[:3] == [(4, MessageId(2, 0, 0)), (5, MessageId(2, 0, 0)), (6, MessageId(2, 0, 0))]
    assert seen[4] == (8, MessageId(3, 0, 0))  # the next ledger begun: the one before was handled
    assert position(uri, "auto") == MessageId(4, 0, 0)
    # a block that ends with an error leaves what it handed out uncommitted
    produce(uri, 2, first=10)
    with pytest.raises(RuntimeError), TopicReader(uri, subscription="auto", auto_commit=True) as r:
        r.read()
        raise RuntimeError("the handler failed")
    assert position(uri, "auto") == MessageId(4, 0, 0)


def test_a_message_looked_at_but_not_taken_is_not_committed(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    produce(uri, 4)
    with TopicReader(uri, subscription="peek", follow=True, poll_interval=0.01) as r:
        # (no timeout: the records are there, and read_next returns one as soon as it looks)
        assert r.read_next().value == b"v0"  # type: ignore[union-attr]
        assert r.has_message_available()
        assert r.commit() == MessageId(1, 0, 1)  # v1 was looked at, not taken
        assert [r.read_next().value for _ in range(3)] == [b"v1", b"v2", b"v3"]  # type: ignore[union-attr]


def test_a_commit_loses_to_a_reset_or_another_reader_and_a_deleted_subscription_is_said(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    produce(uri, 8)
    subs = Subscriptions(TopicMetadata.open(uri))
    a = TopicReader(uri, subscription="shared")
    a.read(limit=2)
    a.commit()
    b = TopicReader(uri, subscription="shared")  # takes the subscription over from a
    a.read(limit=1)
    b.read(limit=5)
    with pytest.raises(ConflictError, match=r"changed by another writer.*stands at 1:0:2 now"):
        a.commit()  # never undoes what the reader holding it now does
    b.commit()
    # b holds it: a reset or a delete is refused unless forced, and a forced one lets b go
    with pytest.raises(InUseError, match=r"reader \S+:\d+:\w+ holds it .*--force"):
        subs.reset("shared", MIN_ID)
    assert position(uri, "shared") == MessageId(2, 1, 1)
    subs.reset("shared", MIN_ID, force=True)
    with pytest.raises(ConflictError, match="shared"):
        b.commit()
    assert position(uri, "shared") == MIN_ID
    c = TopicReader(uri, subscription="shared")
    with pytest.raises(InUseError, match="cannot delete"):
        subs.delete("shared")
    subs.delete("shared", force=True)
    with pytest.raises(SubscriptionNotFoundError, match="'shared' was deleted"):
        c.commit()
    assert subs.names() == []


def test_names_documents_and_misuse_are_refused_in_one_line(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    produce(uri, 2)
    for bad in ("", ".hidden", "a/b", "..", "x" * 201, "sp ace", "ünï"):
        with pytest.raises(InvalidInputError, match="bad subscription name"):
            TopicReader(uri, subscription=bad)
    assert check_name("a.b_c-9") == "a.b_c-9"
    with pytest.raises(InvalidInputError, match="reads as no subscription"):
        TopicReader(uri).commit()
    with pytest.raises(InvalidInputError, match="auto_commit needs a subscription"):
        TopicReader(uri, auto_commit=True)
    subs = Subscriptions(TopicMetadata.open(uri))
    with pytest.raises(InvalidInputError, match="exists already"):
        subs.create("twice")
        subs.create("twice")
    with pytest.raises(SubscriptionNotFoundError, match="no subscription 'nope'"):
        subs.reset("nope", MIN_ID)
    # a hostile or damaged document is corrupt metadata naming the file, and can still be deleted
    hostile = [{"position": "not an id"}, {"name": "other"}, {"extra": 1}, {"committed_ms": -1}]
    for change in hostile:
        subs.create("bad")
        edit(uri, "subscriptions/bad.json", lambda doc, change=change: doc["value"].update(change))
        with pytest.raises(InvalidMetadataError, match=r"_meta/subscriptions/bad\.json: "):
            TopicReader(uri, subscription="bad")
        subs.delete("bad")
    write_raw(uri, "_meta/subscriptions/bad.json", b"{not json")
    with pytest.raises(InvalidMetadataError, match=r"subscriptions/bad\.json: not a metadata document"):
        subs.list()
    subs.delete("bad")
    # what is not named as a subscription's document is no subscription
    write_raw(uri, "_meta/subscriptions/notes.txt", json.dumps({"a": 1}).encode())
    assert subs.names() == ["twice"]


def test_a_plain_subscription_at_earliest_starts_at_the_oldest_record_left(tmp_path: Path) -> None:
    """A new subscription at earliest is at 0:0:0 (the compacted view's start); read
    plain, it starts at the oldest ledger retention left, without a gap."""
    uri = str(tmp_path / "t")
    produce(uri, 12)
    TopicMetadata.open(uri).truncate(3)
    with TopicReader(uri, subscription="fresh") as r:
        assert values(r.read(limit=1)) == [8]
        assert r.commit() == MessageId(3, 0, 1)


def test_a_commit_whose_answer_is_lost_is_known_from_the_document(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit that landed but whose answer did not come back is recognised, so the
    reader's next commit is not taken for another writer's; one that did not land is
    raised as it is."""
    uri = str(tmp_path / "t")
    produce(uri, 6)
    r = TopicReader(uri, subscription="app")
    store = r.meta.meta.store
    real = type(store).put_if_match
    lost: list[bool] = []

    def answer_lost(self: object, key: str, data: bytes, token: str) -> str:
        if not lost:
            return real(self, key, data, token)  # type: ignore[arg-type]
        if lost.pop():  # the write lands, its answer does not come back
            real(self, key, data, token)  # type: ignore[arg-type]
        raise StateUnknownError(f"{key}: the connection dropped")

    monkeypatch.setattr(type(store), "put_if_match", answer_lost)
    r.read(limit=2)
    lost.append(True)  # lands, the answer is lost
    assert r.commit() == MessageId(1, 0, 2) == position(uri, "app")
    r.read(limit=2)
    lost.append(False)  # does not land
    with pytest.raises(StateUnknownError):
        r.commit()
    assert position(uri, "app") == MessageId(1, 0, 2)
