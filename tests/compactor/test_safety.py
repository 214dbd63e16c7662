"""Data-safety corner cases: unknown publish outcomes, lying footers, mislabelled
objects, retirement timing, a compacted ledger collected under a running compaction."""

from __future__ import annotations

import os
import time
from typing import Any

import msgpack
import numpy as np
import pytest

from shale.compactor import CompactionConfig, Compactor, collect_garbage
from shale.compactor.job import HEARTBEAT_MAX_GAP_S, _Heartbeat
from shale.ledger.errors import CorruptLedgerError, StateUnknownError
from shale.ledger.format import FORMAT_VERSION, KIND_ORIGINAL, Trailer, checksum, decode_trailer, encode_trailer
from shale.ledger.reader import LedgerFile
from shale.ledger.record import Record
from shale.ledger.writer import LedgerWriter, encode_entry
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from shale.storage import ObjectStore, resolve
from shale.storage._fsspec import _mtime


def _produce(uri: str, n: int = 60, keys: int = 6) -> None:
    with TopicWriter(uri, batch_size=4, max_ledger_records=25) as w:
        for i in range(n):
            w.append(f"k{i % keys}", f"v{i}")


def _unknown_after(store: ObjectStore, method: str, *, apply: bool) -> list[int]:
    """Make the next ``method`` call on ``store`` end in StateUnknownError (after really
    writing when ``apply``)."""
    real = getattr(store, method)
    calls: list[int] = []

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            if apply:
                real(*args, **kwargs)
            raise StateUnknownError("connection reset after sending (injected)")
        return real(*args, **kwargs)

    setattr(store, method, flaky)
    return calls


@pytest.fixture
def uri() -> str:
    return f"memory://safety-{os.urandom(6).hex()}/topic"


def test_publish_that_landed_despite_an_error_counts_as_published(uri: str) -> None:
    _produce(uri)
    meta = TopicMetadata.open(uri)
    Compactor(uri).run()
    _produce(uri, 10)
    store = meta.meta.store
    _unknown_after(store, "put_if_match", apply=True)
    try:
        s = Compactor(uri).run()
    finally:
        del store.put_if_match  # type: ignore[attr-defined]
    assert s.status == "compacted"
    state = meta.load_compaction()
    assert state.epoch == 2 and all(meta.topic.store.exists(meta.topic.key(p.object)) for p in state.parts)
    assert len(TopicReader(uri, read_compacted=True).read()) == 6


def test_publish_with_unknown_outcome_deletes_nothing(uri: str) -> None:
    _produce(uri)
    Compactor(uri).run()
    _produce(uri, 10)
    meta = TopicMetadata.open(uri)
    store = meta.meta.store
    _unknown_after(store, "put_if_match", apply=False)
    try:
        with pytest.raises(StateUnknownError):
            Compactor(uri).run()
    finally:
        del store.put_if_match  # type: ignore[attr-defined]
    assert meta.load_compaction().epoch == 1
    # the output stays for garbage collection to judge; the published state still reads
    runs = {meta.topic.relative(o.key).split("/")[1] for o in meta.topic.store.list(meta.topic.key("compacted"))}
    assert len(runs) == 2
    # the old state (6 keys) and the 10 records above its horizon
    assert len(TopicReader(uri, read_compacted=True).read()) == 16


def test_producer_never_deletes_a_ledger_whose_registration_may_have_landed(uri: str) -> None:
    with TopicWriter(uri, batch_size=2) as w:
        w.append("a", "1")
    meta = TopicMetadata.open(uri)
    _unknown_after(meta.meta.store, "put_if_match", apply=True)
    try:
        with TopicWriter(uri, batch_size=2) as w:
            w.append("b", "2")
    finally:
        del meta.meta.store.put_if_match  # type: ignore[attr-defined]
    ledgers = meta.load_topic().ledgers
    assert [lg.id for lg in ledgers] == [1, 2]
    assert [m.value for m in TopicReader(uri).read()] == [b"1", b"2"]


def test_producer_retries_a_registration_that_did_not_land(uri: str) -> None:
    meta = TopicMetadata.open(uri)
    with TopicWriter(uri) as w:
        w.append("a", "1")
    _unknown_after(meta.meta.store, "put_if_match", apply=False)
    try:
        with TopicWriter(uri) as w:
            w.append("b", "2")
    finally:
        del meta.meta.store.put_if_match  # type: ignore[attr-defined]
    assert [m.value for m in TopicReader(uri).read()] == [b"1", b"2"]


def test_producer_registration_that_lands_after_it_was_looked_for(uri: str) -> None:
    """A registration whose outcome was unknown lands only later, after the producer
    looked and did not find it (a request can outlive the client's timeout): the
    producer's retry then conflicts with its own write.  The registered object must
    survive, and the records must be registered once."""
    with TopicWriter(uri, batch_size=2) as w:
        w.append("a", "1")
    meta = TopicMetadata.open(uri)
    store = meta.meta.store
    real = store.put_if_match
    pending: list[tuple[Any, ...]] = []

    def late(*args: Any) -> Any:
        if not getattr(late, "done", False):
            late.done = True  # type: ignore[attr-defined]
            pending.append(args)
            raise StateUnknownError("timed out; the request is still in flight (injected)")
        if pending:
            real(*pending.pop())  # the first request lands now, before the retry is handled
        return real(*args)

    store.put_if_match = late  # type: ignore[method-assign]
    try:
        with TopicWriter(uri, batch_size=2) as w:
            w.append("b", "2")
    finally:
        del store.put_if_match  # type: ignore[attr-defined]
    ledgers = meta.load_topic().ledgers
    assert [lg.id for lg in ledgers] == [1, 2]
    for lg in ledgers:
        assert meta.topic.store.exists(meta.topic.key(lg.object)), lg.object
    assert [m.value for m in TopicReader(uri).read()] == [b"1", b"2"]
    assert Compactor(uri, CompactionConfig()).run().status == "compacted"


def test_s3_retry_that_finds_another_body_is_unknown_not_a_conflict(s3_bucket: str) -> None:
    import boto3

    from shale.storage._s3 import S3Store
    from shale.storage.retry import RetryPolicy

    raw = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")

    class LostThenOvertaken:
        """The first PUT lands, then another writer replaces the object, then the
        response of the first PUT is lost."""

        def __init__(self) -> None:
            self.n = 0

        def __getattr__(self, op: str) -> Any:
            real = getattr(raw, op)
            if op != "put_object":
                return real

            def call(**kw: Any) -> Any:
                self.n += 1
                r = real(**kw)
                if self.n == 2:
                    raw.put_object(Bucket=kw["Bucket"], Key=kw["Key"], Body=b"someone else")
                    from botocore.exceptions import ConnectionClosedError

                    raise ConnectionClosedError(endpoint_url="http://moto")
                return r

            return call

    store = S3Store(s3_bucket, retry=RetryPolicy(sleep=lambda _s: None), client=LostThenOvertaken())
    token = store.put_if_absent("doc", b"v1")
    with pytest.raises(StateUnknownError):
        store.put_if_match("doc", b"v2", token)


# --------------------------------------------------------------- hostile footers


def _ledger_bytes() -> bytes:
    import io

    buf = io.BytesIO()
    w = LedgerWriter(buf, kind=KIND_ORIGINAL, ledger_id=1, created_ms=0)
    w.add_entry(encode_entry([Record(b"k1", b"AAAA", {}, 1), Record(b"k2", b"BBBB", {}, 1)]))
    w.finish()
    return buf.getvalue()


def _with_footer(data: bytes, change: Any) -> bytes:
    t = decode_trailer(data, len(data), "x")
    doc = msgpack.unpackb(data[t.footer_offset:t.footer_offset + t.footer_length], raw=False)
    change(doc)
    footer = msgpack.packb(doc, use_bin_type=True)
    trailer = encode_trailer(Trailer(t.footer_offset, len(footer), t.ledger_id, t.created_ms, checksum(footer),
                                     FORMAT_VERSION, t.kind))
    return data[:t.footer_offset] + footer + trailer


def _cols(doc: dict[str, Any], name: str, dtype: str, fn: Any) -> None:
    arr = np.frombuffer(doc["cols"][name], dtype=dtype).copy()
    fn(arr)
    doc["cols"][name] = arr.tobytes()


@pytest.mark.parametrize("case,needle", [
    ("offset_lies", "record offsets"),
    ("sizes_short", "add up"),
    ("empty_entry", "no records"),
    ("negative_entries", "structure"),
    ("cols_list", "structure"),
    ("col_odd_length", "whole array"),
    ("col_not_bytes", "whole array"),
    ("offset_wraps", "data region"),
])
def test_hostile_footers_are_corrupt_not_crashes(case: str, needle: str) -> None:
    changes = {
        "offset_lies": lambda d: _cols(d, "r_offset", "<u4", lambda a: a.__setitem__(1, 0)),
        "sizes_short": lambda d: _cols(d, "r_size", "<u4", lambda a: a.__setitem__(1, a[1] - 1)),
        "empty_entry": lambda d: d.update(n_entries=2) or d["cols"].update(
            e_rec_start=np.array([0, 0, 2], "<u8").tobytes(),
            e_offset=np.array([32, 32], "<u8").tobytes(), e_length=np.array([0, 0], "<u4").tobytes(),
            e_publish=np.array([1, 1], "<i8").tobytes()),
        "negative_entries": lambda d: d.update(n_entries=-1),
        "cols_list": lambda d: d.update(cols=[1, 2]),
        "col_odd_length": lambda d: d["cols"].update(r_size=d["cols"]["r_size"] + b"\x00"),
        "col_not_bytes": lambda d: d["cols"].update(r_flags="text"),
        "offset_wraps": lambda d: _cols(d, "e_offset", "<u8", lambda a: a.__setitem__(0, (1 << 64) - 8)),
    }
    data = _with_footer(_ledger_bytes(), changes[case])
    loc = resolve(f"memory://hostile-{os.urandom(4).hex()}/x")
    loc.store.put(loc.key("l"), data)
    with pytest.raises(CorruptLedgerError, match=needle):
        LedgerFile.open(loc.store, loc.key("l"))


def test_object_registered_under_another_id_is_refused(uri: str) -> None:
    _produce(uri, 30)
    meta = TopicMetadata.open(uri)
    first, second = meta.load_topic().ledgers[:2]
    store = meta.topic.store
    store.put(meta.topic.key(second.object), store.get(meta.topic.key(first.object)))
    with pytest.raises(CorruptLedgerError, match="registered as ledger 2"):
        TopicReader(uri).read()
    with pytest.raises(CorruptLedgerError, match=second.object):
        Compactor(uri).run()


def test_unknown_modification_time_counts_as_new() -> None:
    import time

    before = time.time()
    assert before <= _mtime({"size": 3}) <= time.time()  # now, however long the call took
    assert _mtime({"last_modified": "2020-01-01T00:00:00Z"}) == 1577836800.0
    assert _mtime({"mtime": 12.5}) == 12.5


def test_a_heartbeat_that_once_went_stale_stays_stale(uri: str) -> None:
    _produce(uri, 5)
    hb = _Heartbeat(TopicMetadata.open(uri), "compacted/run", {})
    hb.beat()
    assert hb.healthy()
    hb.went_stale = True
    hb.beat()
    assert not hb.healthy()
    hb.went_stale = False
    hb.last_ok -= HEARTBEAT_MAX_GAP_S + 1
    assert not hb.healthy()


def test_retirement_is_stamped_at_publish_time(uri: str) -> None:
    _produce(uri)
    Compactor(uri).run()
    _produce(uri, 10)
    calls: list[int] = []

    start = float(int(time.time()) + 10)

    def clock() -> float:  # the run starts at ``start`` and publishes an hour later
        calls.append(1)
        return start if len(calls) == 1 else start + 3600

    assert Compactor(uri, clock=clock).run().status == "compacted"
    assert TopicMetadata.open(uri).load_compaction().retired[0].retired_ms == int(start + 3600) * 1000


def test_compacted_ledger_collected_under_a_run_is_a_lost_race(uri: str) -> None:
    _produce(uri, 200, keys=50)
    Compactor(uri).run()
    _produce(uri, 20, keys=50)
    meta = TopicMetadata.open(uri)
    done: list[str] = []

    def rival(msg: str) -> None:
        if msg.startswith("pass two") and not done:
            done.append(Compactor(uri, CompactionConfig(gc_grace_ms=0)).run().status)
            collect_garbage(meta, now_ms=10**15, grace_ms=0, orphan_grace_ms=3_600_000)

    s = Compactor(uri, progress=rival).run()
    assert done == ["compacted"]
    assert s.status == "conflict" and not s.ok
    state = meta.load_compaction()
    assert state.epoch == 2  # the rival's
    objects = {meta.topic.relative(o.key) for o in meta.topic.store.list(meta.topic.key("compacted"))}
    assert objects == {p.object for p in state.parts}


def test_gc_discards_unfinished_writes_only_past_the_orphan_grace(disk_topic_uri: str) -> None:
    """A writer killed mid-write (a compactor, a Spark task, a producer) leaves a
    temporary file or an incomplete multipart upload; gc removes it once it is older
    than the orphan grace, never before."""
    with TopicWriter(disk_topic_uri) as w:
        w.append("k", "v")
    meta = TopicMetadata.open(disk_topic_uri)
    store, loc = meta.topic.store, meta.topic
    for name in ("compacted/000000000001-0123456789ab/part-00000.ledger",
                 "ledgers/00000000000000000002-0123456789ab.ledger", "ledgers/not-ours.ledger"):
        w2 = store.open_writer(loc.key(name))
        w2.write(b"z" * (17 << 20))  # past one multipart part on S3; never closed
    assert len(list(store.unfinished_writes(loc.key("compacted")))) == 1
    assert len(list(store.unfinished_writes(loc.key("ledgers")))) == 2
    grace = CompactionConfig().orphan_grace_ms
    now = int(time.time() * 1000)
    if disk_topic_uri.startswith("/"):
        # (moto reports every multipart upload as started in 2010, so only the local
        # folder can show that a young unfinished write is left alone)
        report = collect_garbage(meta, now_ms=now, grace_ms=0, orphan_grace_ms=grace)
        assert not report.orphans_deleted
    report = collect_garbage(meta, now_ms=now + grace + 60_000, grace_ms=0, orphan_grace_ms=grace)
    found = sorted(report.orphans_deleted)
    assert len(found) == 2 and all(x.endswith("(unfinished write)") for x in found)
    assert found[0].startswith("compacted/000000000001-0123456789ab/") and "part-00000" in found[0]
    assert found[1].startswith("ledgers/") and "00000000000000000002-0123456789ab" in found[1]
    assert list(store.unfinished_writes(loc.key("compacted"))) == []
    # a name Shale never writes is not its to discard, however old
    assert [loc.relative(i.key).endswith("not-ours.ledger") for i in store.unfinished_writes(loc.key("ledgers"))] \
        == [True]
    assert [m.value for m in TopicReader(disk_topic_uri)] == [b"v"]


def test_a_run_published_while_gc_lists_is_never_taken_for_orphans(uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """gc reads the state, then lists ``compacted/``: a run that publishes in between
    (forced here, as the listing starts) is found by reading the state again, and none of
    its objects is deleted, however old gc's clock makes them look."""
    _produce(uri, 200, keys=50)
    Compactor(uri).run()
    _produce(uri, 20, keys=50)
    meta = TopicMetadata.open(uri)
    store = meta.topic.store
    real = store.list
    rival: list[str] = []

    def listing(prefix: str) -> Any:
        if prefix == meta.topic.key("compacted") and not rival:
            rival.append("running")
            rival[0] = Compactor(uri, CompactionConfig(collect_garbage=False)).run().status
        return real(prefix)

    monkeypatch.setattr(store, "list", listing)  # this store object only
    report = collect_garbage(meta, now_ms=10**15, grace_ms=10**15, orphan_grace_ms=3_600_000)
    monkeypatch.undo()
    state = meta.load_compaction()
    assert rival == ["compacted"] and state.epoch == 2
    assert not set(report.orphans_deleted) & state.referenced_objects()
    assert all(store.exists(meta.topic.key(o)) for o in state.referenced_objects())
    assert len(TopicReader(uri, read_compacted=True).read()) == 50


def test_gc_refuses_an_orphan_grace_below_the_minimum_and_deletes_nothing(uri: str) -> None:
    """Producers and compactors publish within a third of the minimum orphan grace after
    uploading: a shorter one could take an upload about to be registered for a leftover."""
    from shale.compactor.config import MIN_ORPHAN_GRACE_MS
    from shale.ledger.errors import InvalidInputError

    _produce(uri, 30)
    meta = TopicMetadata.open(uri)
    store = meta.topic.store
    store.put(meta.topic.key("ledgers/00000000000000000099-0123456789ab.ledger"), b"an upload not registered yet")
    before = sorted(o.key for o in store.list(meta.topic.prefix))
    with pytest.raises(InvalidInputError, match="orphan grace must be at least 15 minutes"):
        collect_garbage(meta, now_ms=10**15, grace_ms=0, orphan_grace_ms=MIN_ORPHAN_GRACE_MS - 1)
    assert sorted(o.key for o in store.list(meta.topic.prefix)) == before
    report = collect_garbage(meta, now_ms=10**15, grace_ms=0, orphan_grace_ms=MIN_ORPHAN_GRACE_MS)
    assert report.orphans_deleted == ["ledgers/00000000000000000099-0123456789ab.ledger"]
