"""Leftovers of writes that never finished, collected by ``shale gc`` past the orphan
grace, and nothing else: ledgers a distributed write staged and nobody registered, the
write's own folder under ``staging/``, and dictionaries a training wrote but could not
register.  Registered objects, strangers' files and other topics (nested or beside)
are never touched.  Locally (``shale gc`` as a process, ages set on the files) and on
S3 (the store's clock moved on by ``now_ms``, as S3's times cannot be set)."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

from shale.ledger.errors import ConflictError
from shale.maintenance.dictionary import train_dictionary
from shale.maintenance.gc import collect_garbage
from shale.metadata import dictionaries
from shale.metadata.dictionaries import register_dictionary
from shale.metadata.documents import DocumentStore
from shale.metadata.layout import UNREGISTERED_MAX_AGE_MS, staging_done_name, staging_task_name
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.producer.staging import StagingWriter, new_write_id
from shale.reader import TopicReader
from shale.storage import resolve
from tests.conftest import make_root, run_cli
from tests.tamper import read_raw

GRACE_MS = 15 * 60_000
HOUR_MS = 3_600_000


def _objects(uri: str) -> dict[str, bytes]:
    """Every object of the folder ``uri`` (and below), by name relative to it."""
    loc = resolve(uri)
    return {loc.relative(info.key): loc.store.get(info.key) for info in loc.store.list(loc.prefix)}


def _put(uri: str, name: str, data: bytes) -> None:
    """Write ``name`` under the folder ``uri`` as anyone could (no Shale name checks)."""
    loc = resolve(uri)
    loc.store.put(loc.key(name), data)


def _gc(uri: str, kind: str, later_ms: int) -> list[str]:
    """``shale gc`` with a 15-minute orphan grace, ``later_ms`` after now: locally as a
    process, with every file of the topic's root aged by that much; on S3 in this
    process, with the store's clock moved on."""
    if kind == "local":
        root = Path(uri).parent
        then = time.time() - later_ms / 1000
        for path in root.rglob("*"):
            os.utime(path, (then, then), follow_symlinks=False)
        p = run_cli("gc", uri, "--orphan-grace", "15m", "--json")
        assert p.returncode == 0, p.stderr
        import json

        deleted: list[str] = json.loads(p.stdout)["deleted"]
        return deleted
    meta = TopicMetadata.open(uri)
    report = collect_garbage(meta, grace_ms=0, orphan_grace_ms=GRACE_MS, now_ms=meta.now_ms() + later_ms)
    return sorted(report.retired_deleted + report.orphans_deleted)


def _stage(uri: str, write: str | None, partition: int, n: int, base: int) -> StagingWriter:
    w = StagingWriter(uri, base=base, partition=partition, write=write, max_ledger_records=10)
    w.append_batch({"key": [f"k{i}" for i in range(n)], "value": [f"v{i}" for i in range(n)]})
    w.flush()
    return w


# ------------------------------------------------------------- staged, never registered


@pytest.mark.parametrize("kind", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_what_a_write_staged_and_nobody_registered_is_collected_after_the_grace(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    root = make_root(kind, request, tmp_path)
    uri, beside, nested = f"{root}/t", f"{root}/t2", f"{root}/t/staging/0123456789ab"
    with TopicWriter(uri) as w:
        w.append("a", "1")
    base = TopicMetadata.open(uri).load_topic().last_ledger_id + 1
    # a write whose driver died: two tasks staged ledgers, nothing registered, no marker
    crashed = new_write_id()
    staged = [s.info["object"] for p in (0, 1) for s in _stage(uri, crashed, p, 25, base).staged]
    # a write that was aborted while a task's process died between its upload and its check
    aborted = new_write_id()
    late = [s.info["object"] for s in _stage(uri, aborted, 2, 5, base).staged]
    _put(uri, staging_done_name(aborted), b"{}")
    # a write with no folder of its own (staged by an older build)
    older = [s.info["object"] for s in _stage(uri, None, 3, 5, base).staged]
    # strangers: other names in the staging folder, and topics inside it and beside it
    strangers = {"staging/notes.txt": b"notes", f"staging/{crashed}/notes.json": b"{}",
                 f"staging/{crashed}/task-1-0123456789ab.json": b"{}",
                 f"staging/{crashed}x/task-000001-0123456789ab.json": b"{}",
                 "staging/_done.json": b"{}"}
    for name, data in strangers.items():
        _put(uri, name, data)
    for other in (beside, f"{root}/apart"):
        with TopicWriter(other) as w:
            w.append("b", "2")
        _stage(other, new_write_id(), 0, 5, 2)
    _copy(f"{root}/apart", nested)  # (Shale refuses to create a topic inside another)
    registered = {lg.object for lg in TopicMetadata.open(uri).load_topic().ledgers}
    before = _objects(uri)
    expect = sorted([*staged, *late, *older, staging_task_name(crashed, 0, _nonce(staged[0])),
                     staging_task_name(crashed, 1, _nonce(staged[-1])), staging_task_name(aborted, 2, _nonce(late[0])),
                     staging_done_name(aborted)])
    assert set(expect) <= set(before) and len(staged) == 6 and len(late) == len(older) == 1
    others = {u: _objects(u) for u in (beside,)}

    assert _gc(uri, kind, GRACE_MS - 60_000) == []  # within the grace: a write may still be running
    assert _objects(uri) == before
    assert _gc(uri, kind, GRACE_MS + 60_000) == expect
    after = _objects(uri)
    assert after == {n: d for n, d in before.items() if n not in expect}
    assert registered <= set(after) and all(n in after for n in strangers)
    assert {u: _objects(u) for u in (beside,)} == others
    for other in (beside, nested):  # their own leftovers are theirs: untouched, readable
        assert [m.key for m in TopicReader(other)] == [b"b"]
    assert [m.key for m in TopicReader(uri)] == [b"a"]


def _copy(src: str, dst: str) -> None:
    """Every object of the topic ``src``, put under ``dst`` as they are."""
    for name, data in _objects(src).items():
        _put(dst, name, data)


def _nonce(name: str) -> str:
    return name.rsplit("-", 1)[1].removesuffix(".ledger")


# -------------------------------------------------------------- unregistered dictionaries


def _rows_topic(uri: str) -> None:
    rnd = random.Random(5)
    with TopicWriter(uri, batch_size=2, max_ledger_records=2000) as w:
        for i in range(3000):
            k = rnd.randrange(300)
            w.append(f"user-{k:05d}", f'{{"id": {k}, "email": "user{k}@example.com", "seq": {i}}}')


@pytest.mark.parametrize("kind", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_a_dictionary_whose_registration_failed_is_collected_and_a_registered_one_never(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_root(kind, request, tmp_path)
    uri = f"{root}/t"
    _rows_topic(uri)
    meta = TopicMetadata.open(uri)
    kept = train_dictionary(meta, size=4096, rng=random.Random(1)).dictionary
    register_dictionary(meta, kept)
    failed = train_dictionary(meta, size=4096, rng=random.Random(2)).dictionary
    real = DocumentStore.replace
    appended: list[bool] = []

    def another_writer_first(self: DocumentStore, name: str, *args: Any, **kwargs: Any) -> Any:
        # between the dictionary's upload (done) and its registration: a producer appends
        if name == "topic.json" and not appended:
            appended.append(True)
            with TopicWriter(uri) as w:
                w.append("meanwhile", "x")
        return real(self, name, *args, **kwargs)

    monkeypatch.setattr(DocumentStore, "replace", another_writer_first)
    with pytest.raises(ConflictError, match="the dictionary was not registered"):
        register_dictionary(meta, failed, attempts=1)
    monkeypatch.undo()
    topic = TopicMetadata.open(uri).load_topic()
    assert [d.id for d in topic.dictionaries] == [kept.id]
    on_store = sorted(n for n in _objects(uri) if n.startswith("dictionaries/"))
    assert len(on_store) == 2
    (leftover,) = [n for n in on_store if n != topic.dictionaries[0].object]
    assert f"{failed.id:010d}" in leftover
    strangers = {"dictionaries/notes.txt": b"notes", "dictionaries/0000000001-zzz.zdict": b"not ours",
                 f"dictionaries/inner/{leftover.split('/')[1]}": read_raw(uri, leftover)}
    for name, data in strangers.items():
        _put(uri, name, data)
    before = _objects(uri)

    assert not [n for n in _gc(uri, kind, GRACE_MS - 60_000) if n.startswith("dictionaries/")]
    assert _objects(uri) == before
    assert _gc(uri, kind, 2 * HOUR_MS) == [leftover]
    after = _objects(uri)
    assert after == {n: d for n, d in before.items() if n != leftover}
    assert topic.dictionaries[0].object in after and all(n in after for n in strangers)
    assert len(list(TopicReader(uri))) == 3001


def test_a_registration_slower_than_the_safe_age_registers_a_fresh_copy(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Garbage collection may take an unregistered dictionary older than its grace: a
    registration that waited that long writes the dictionary again and registers the
    copy (and deletes the old object), never a name gc may be deleting."""
    uri = str(tmp_path / "t")
    _rows_topic(uri)
    meta = TopicMetadata.open(uri)
    d = train_dictionary(meta, size=4096, rng=random.Random(3)).dictionary
    clock = [1000.0]

    class Slow:
        @staticmethod
        def monotonic() -> float:
            clock[0] += 1.5 * UNREGISTERED_MAX_AGE_MS / 1000  # every reading: more than the safe age later
            return clock[0]

    monkeypatch.setattr(dictionaries, "time", Slow, raising=False)
    store = meta.topic.store
    real_put = store.put
    uploads: list[str] = []

    def put(key: str, data: bytes, **kw: Any) -> None:
        if key.endswith(".zdict"):
            uploads.append(meta.topic.relative(key))
        real_put(key, data, **kw)

    monkeypatch.setattr(store, "put", put)
    info = register_dictionary(meta, d)
    assert len(uploads) == 2 and info.object == uploads[1] != uploads[0]  # a fresh copy registered ...
    names = sorted(p.name for p in (tmp_path / "t" / "dictionaries").iterdir())
    assert names == [info.object.split("/")[1]]  # ... and the old one deleted
    assert [x.object for x in TopicMetadata.open(uri).load_topic().dictionaries] == [info.object]
