"""A :class:`TableView` built from Arrow batches (its rows held as Arrow data, found
through a hash index: :class:`~shale.reader.table_rows.TableRows`) holds, refreshes and
tells its listeners exactly what a view applying every record message by message does,
in offset order and in event-time order with a key TTL; a key is found by its bytes
whatever its hash shares with others; the rows hold at most twice the view's bytes once
decompressed; and the fold that plans the table keeps the last record of every hash."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.compactor import CompactionConfig, Compactor
from shale.ledger.ordering import EVENT_TIME
from shale.ledger.record import Record
from shale.metadata.topic import TopicMetadata
from shale.metadata.view import TopicView
from shale.producer import TopicWriter
from shale.reader import TableView
from shale.reader.latest import last_of_each_key
from shale.reader.table_rows import TableRows
from tests.needs import need_module

pa = need_module("pyarrow")
DAY = 86_400_000
T = 1_800_000_000_000


def _round(uri: str, rnd: random.Random, n: int, *, keys: int = 30, clock: int = T) -> None:
    with TopicWriter(uri, batch_size=rnd.randrange(1, 6), max_ledger_records=17, clock=lambda: clock / 1000) as w:
        for i in range(n):
            key = None if rnd.random() < 0.05 else f"k{rnd.randrange(keys)}".encode()
            value = None if rnd.random() < 0.15 else f"v{clock}-{i}".encode()
            event = None if rnd.random() < 0.3 else clock - rnd.randrange(3 * DAY)
            w.send(Record(key, value, {"n": str(i)} if i % 3 else {}, clock, event))


class _Views:
    """The same topic's view built from batches and built message by message, each with
    a listener, and a clock both read."""

    def __init__(self, uri: str, now: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
        self.heard: dict[str, list[tuple[bytes, bytes | None]]] = {"batches": [], "messages": []}
        self.batches = TableView(uri, clock=lambda: now[0] / 1000)
        with monkeypatch.context() as m:
            m.setattr(TableView, "_load", lambda self: None)
            self.messages = TableView(uri, clock=lambda: now[0] / 1000)
        assert self.batches._rows is not None and self.messages._rows is None
        self.batches.listen(lambda k, v: self.heard["batches"].append((k, v)))
        self.messages.listen(lambda k, v: self.heard["messages"].append((k, v)))

    def check(self) -> None:
        a, b = self.batches, self.messages
        assert dict(a) == dict(b) and len(a) == len(b) == len(list(a))
        assert list(a.messages()) == list(b.messages())
        for key in [*b, b"k-missing"]:
            assert (key in a) == (key in b)
            if key in b:
                assert a.message(key) == b.message(key) and a[key] == b[key]
            else:
                with pytest.raises(KeyError):
                    a.message(key)
                assert a.get(key) is None
        assert self.heard["batches"] == self.heard["messages"]

    def refresh(self) -> None:
        assert self.batches.refresh() == self.messages.refresh()
        self.check()


def test_offset_order_built_from_batches_holds_and_tells_what_messages_do(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    uri = str(tmp_path / "t")
    rnd = random.Random(7)
    _round(uri, rnd, 150)
    Compactor(uri, CompactionConfig(delete_retention_ms=0)).run()
    _round(uri, rnd, 60)
    views = _Views(uri, [T], monkeypatch)
    views.check()
    for _ in range(3):  # keys the rows hold replaced and deleted, new ones, a compaction between
        _round(uri, rnd, 40)
        views.refresh()
        Compactor(uri, CompactionConfig(delete_retention_ms=0)).run()
    assert views.heard["batches"] and len(views.batches._rows or ()) > 0


@pytest.mark.parametrize("ttl_days", [0, 2])
def test_event_time_order_and_a_ttl_built_from_batches_refresh_as_messages_do(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ttl_days: int) -> None:
    """Late records and late tombstones against the rows the view was built with, keys of
    those rows expiring as the clock moves (told in the order of their times)."""
    uri = str(tmp_path / "t")
    rnd = random.Random(11 + ttl_days)
    _round(uri, rnd, 120, clock=T - 2 * DAY)
    meta = TopicMetadata.open(uri)
    meta.update_policy({"order": EVENT_TIME, "key_ttl_ms": ttl_days * DAY})
    Compactor(uri, CompactionConfig(order=EVENT_TIME, key_ttl_ms=ttl_days * DAY, delete_retention_ms=DAY)).run()
    _round(uri, rnd, 50, clock=T - DAY)
    now = [T]
    views = _Views(uri, now, monkeypatch)
    views.check()
    for step in range(4):
        _round(uri, rnd, 30, clock=T + step * DAY // 2)
        now[0] += DAY // 2
        views.refresh()
    assert views.heard["batches"]
    if ttl_days:
        assert any(v is None for _, v in views.heard["batches"])


def _batch(keys: list[bytes]) -> Any:
    from tests.producer.test_batch_lines import record_batch

    return record_batch([{"id": (1, i, 0), "key": k, "value": b"value-" + k, "properties": [], "publish": i,
                          "event": None} for i, k in enumerate(keys)])


def test_keys_are_found_by_their_bytes_whatever_their_hashes_share(monkeypatch: pytest.MonkeyPatch) -> None:
    import shale.reader.table_rows as table_rows

    monkeypatch.setattr(table_rows, "key_hash", lambda key: (0xABCDEF0000000000, 1))  # every key's hash alike
    keys = [f"key{i}".encode() for i in range(40)]
    batches = [_batch(keys[:25]), _batch(keys[25:])]
    shared = np.full(len(keys), 0xABCDEF0000000000, dtype=np.uint64)
    empty = (np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.int64))
    rows = TableRows(batches, shared, None, empty)
    for i, k in enumerate(keys):
        assert rows.find(k) == i and rows.key(i) == k and rows.value(i) == b"value-" + k
    assert rows.find(b"key40") == -1
    rows.kill(3)
    assert rows.find(keys[3]) == -1 and rows.live == len(keys) - 1
    assert list(rows.keys()) == [k for k in keys if k != keys[3]]
    assert [m.key for m in rows.messages()] == [k for k in keys if k != keys[3]]
    with pytest.raises(ValueError):
        TableRows(batches, shared[:-1], None, empty)


def test_the_rows_hold_at_most_twice_the_views_bytes(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    with TopicWriter(uri, batch_size=100) as w:
        for i in range(20_000):
            w.append(f"key-{i % 5000:06d}", f"{i:012d}" + "x" * 52)
    Compactor(uri, CompactionConfig()).run()
    meta = TopicMetadata.open(uri)
    view_bytes = sum(int(s.open(meta).footer.raw_lengths().sum()) for s in TopicView.load(meta).parts())
    view = TableView(uri)
    assert view._rows is not None and len(view) == 5000
    assert view._rows.nbytes <= 2 * view_bytes


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 3)), max_size=300), st.sampled_from([0, 60, 62]))
def test_the_fold_keeps_the_last_record_of_each_hash(keys: list[tuple[int, int]], shift: int) -> None:
    """Hashes whose high bits collide (as packed beside positions) or whose high 64 bits
    are equal are told apart by the rest."""
    spread = [(k << shift) % (1 << 64) if shift else k * 0x9E3779B97F4A7C15 % (1 << 64) for k, _ in keys]
    hi = np.array(spread, dtype=np.uint64)
    lo = np.array([v for _, v in keys], dtype=np.uint64)
    want = sorted({key: i for i, key in enumerate(zip(hi.tolist(), lo.tolist(), strict=True))}.values())
    assert last_of_each_key(hi, lo).tolist() == want
