"""Each record's event time in the footer (format version 3): the column ``r_event``
(``NO_EVENT_TIME`` for a record without one), left out when no record has one (whatever
the records' publish times), written by every writer, read back by
:meth:`Footer.event_times` and refused when it has the wrong length."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shale.ledger.errors import CorruptLedgerError
from shale.ledger.format import KIND_ORIGINAL, NO_EVENT_TIME
from shale.ledger.reader import LedgerFile
from shale.ledger.record import Record
from shale.ledger.writer import LedgerWriter, encode_entry
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.producer.columns import Fields
from shale.producer.ingest import produce_columnar
from shale.storage import resolve
from tests import objects


def _write(entries: list[list[Record]]) -> bytes:
    buf = io.BytesIO()
    w = LedgerWriter(buf, kind=KIND_ORIGINAL, ledger_id=1, created_ms=5)
    for recs in entries:
        w.add_entry(encode_entry(recs))
    w.finish()
    return buf.getvalue()


def _open(data: bytes) -> LedgerFile:
    loc = resolve("memory://event-times")
    loc.store.put(loc.key("l"), data)
    return LedgerFile.open(loc.store, loc.key("l"))


def _decoded(f: LedgerFile) -> list[int]:
    """Each record's event time, ``NO_EVENT_TIME`` where it has none, decoded."""
    return [NO_EVENT_TIME if m.event_time is None else m.event_time for m in f.messages()]


def _entries(events: list[int | None], publish: list[int] | None = None) -> list[list[Record]]:
    pub = publish or [1000 + i // 4 for i in range(len(events))]
    recs = [Record(f"k{i % 5}".encode(), b"v" if i % 7 else b"", None, pub[i], e) for i, e in enumerate(events)]
    return [recs[i:i + 4] for i in range(0, len(recs), 4)]


@pytest.mark.parametrize("which", ["none", "some", "all"])
def test_round_trip_with_none_some_or_all_event_times(which: str) -> None:
    n = 22
    events: list[int | None] = {
        "none": [None] * n,
        "some": [None if i % 3 else -62135596800000 + i for i in range(n)],
        "all": [5_000 - 7 * i for i in range(n)],
    }[which]
    f = _open(_write(_entries(events)))
    assert f.footer.version == 3
    # no event time anywhere costs nothing: the column is left out
    assert ("r_event" in f.footer.cols) == (which != "none")
    got = f.event_times()
    assert got is not None and got.dtype == np.int64
    assert got.tolist() == _decoded(f)
    if which == "none":
        assert got.tolist() == [NO_EVENT_TIME] * n


def test_records_without_event_times_published_at_different_times_cost_nothing() -> None:
    """Records of one entry published at different times (as ``append`` stamps them),
    none with an event time: no column, and the footer says so exactly."""
    f = _open(_write(_entries([None] * 8, publish=[100, 101, 102, 103, 104, 104, 104, 104])))
    assert "r_event" not in f.footer.cols
    assert f.event_times().tolist() == [NO_EVENT_TIME] * 8  # type: ignore[union-attr]
    mixed = _open(_write(_entries([None, 7, None, None], publish=[100, 101, 102, 103])))
    assert mixed.event_times().tolist() == [NO_EVENT_TIME, 7, NO_EVENT_TIME, NO_EVENT_TIME]  # type: ignore[union-attr]


def test_versions_1_and_2_do_not_say() -> None:
    data = _write(_entries([7, None, 9, 11, None, 3]))
    v2 = _open(objects.to_version_2(data))
    v1 = _open(objects.downgrade(data))
    assert (v2.footer.version, v1.footer.version) == (2, 1)
    assert v2.event_times() is None and v1.event_times() is None and v2.footer.event_times() is None
    assert _decoded(v2) == _decoded(v1) == [7, NO_EVENT_TIME, 9, 11, NO_EVENT_TIME, 3]


@pytest.mark.parametrize("delta", [-1, 1])
def test_an_event_column_of_the_wrong_length_is_corrupt(delta: int) -> None:
    p = objects.parse(_write(_entries([1, 2, None, 4, 5])))
    p.cols["r_event"] = np.arange(5 + delta, dtype=np.int64)
    with pytest.raises(CorruptLedgerError, match="column r_event has"):
        _open(objects.build(p))


def _every_ledger(uri: str) -> list[LedgerFile]:
    meta = TopicMetadata.open(uri)
    return [LedgerFile.open(meta.topic.store, meta.topic.key(lg.object)) for lg in meta.load_topic().ledgers]


def _check_topic(uri: str, *, columns: bool) -> None:
    files = _every_ledger(uri)
    assert files
    for f in files:
        got = f.event_times()
        assert got is not None and got.tolist() == _decoded(f)
    assert any("r_event" in f.footer.cols for f in files) == columns


def test_producer_append_writes_each_records_event_time(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    clock = [1_700_000_000.0]
    with TopicWriter(uri, batch_size=6, max_ledger_records=20, compression="lz4", clock=lambda: clock[0]) as w:
        for i in range(50):
            clock[0] += 0.001 * (i % 2)  # records of one entry published at different times
            w.append(f"k{i % 9}", f"v{i}", event_time=None if i % 4 else 1_600_000_000_000 - i)
    _check_topic(uri, columns=True)
    plain = str(tmp_path / "plain")
    with TopicWriter(plain, batch_size=6, max_ledger_records=20, clock=lambda: clock[0]) as w:
        for i in range(30):
            clock[0] += 0.001  # each record its own publish time, none an event time: no column
            w.append(f"k{i % 9}", f"v{i}")
    _check_topic(plain, columns=False)


def _table(n: int) -> pa.Table:
    return pa.table({"key": [f"k{i % 11}" for i in range(n)], "value": [f"v{i}" if i % 6 else None for i in range(n)],
                     "ts": pa.array([None if i % 3 == 0 else 1_500_000_000_000 + 13 * i for i in range(n)],
                                    pa.timestamp("ms"))})


def test_append_batch_and_arrow_ingest_write_each_records_event_time(tmp_path: Path) -> None:
    uri = str(tmp_path / "batch")
    with TopicWriter(uri, batch_size=16, max_ledger_records=64) as w:
        w.append_batch(_table(128), event_time="ts")  # two whole ledgers
        w.append_batch(_table(40))  # no event time column: a ledger of its own
    _check_topic(uri, columns=True)
    assert "r_event" not in _every_ledger(uri)[-1].footer.cols
    sink = io.BytesIO()
    pq.write_table(_table(120), sink)
    ingested = str(tmp_path / "ingest")
    with TopicWriter(ingested, batch_size=16, max_ledger_records=64) as w:
        produce_columnar(w, io.BytesIO(sink.getvalue()), "in.parquet", "parquet", Fields("key", "value", None, "ts"))
    _check_topic(ingested, columns=True)
