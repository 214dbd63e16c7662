"""Incremental runs keep previous compacted parts in place, with deletion vectors."""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shale.compactor import CompactionConfig, Compactor, collect_garbage
from shale.ledger.deletions import decode_deletions, encode_deletions
from shale.ledger.errors import CorruptLedgerError, UnsupportedVersionError
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TableView, TopicReader
from tests.conftest import run_cli

T0 = 1_700_000_000.0
HOUR = 3600.0
REUSE = dict(reuse_min_bytes=0, delete_retention_ms=int(2 * HOUR * 1000))


def produce(uri: str, seed: int, n: int, keys: range, t: float) -> None:
    rnd = random.Random(seed)
    with TopicWriter(uri, max_ledger_records=5_000, batch_size=10, clock=lambda: t) as w:
        for i in range(n):
            k = rnd.choice(keys)
            w.append(f"key-{k}", None if rnd.random() < 0.05 else f"{seed}-{i}")


def compacted(uri: str) -> list[tuple[str, Any, Any]]:
    return [(str(m.id), m.key, m.value) for m in TopicReader(uri, read_compacted=True)]


def test_deletion_vector_format() -> None:
    data = encode_deletions(np.array([1, 5, 9]), 10)
    assert np.flatnonzero(decode_deletions(data, 10, "dv")).tolist() == [1, 5, 9]
    with pytest.raises(CorruptLedgerError, match="checksum"):
        decode_deletions(data[:-1] + bytes([data[-1] ^ 1]), 10, "dv")
    with pytest.raises(CorruptLedgerError, match="bad magic"):
        decode_deletions(b"X" + data[1:], 10, "dv")
    with pytest.raises(UnsupportedVersionError):
        decode_deletions(data[:8] + b"\x09\x00" + data[10:], 10, "dv")
    with pytest.raises(CorruptLedgerError, match="part of 10"):
        decode_deletions(data, 11, "dv")
    with pytest.raises(CorruptLedgerError, match="out of order"):
        decode_deletions(encode_deletions(np.array([5, 1]), 10), 10, "dv")
    with pytest.raises(CorruptLedgerError, match="truncated"):
        decode_deletions(data[:10], 10, "dv")


def test_incremental_runs_keep_parts_and_equal_copying_runs(disk_topic_uri: str, tmp_path: Path) -> None:
    """Every run is checked against the same runs on a copy that never keeps parts."""
    uri, ref = disk_topic_uri, str(tmp_path / "ref")
    copy_all = CompactionConfig(delete_retention_ms=int(2 * HOUR * 1000))  # parts are far below 8 MiB

    def step(seed: int, n: int, hour: int) -> tuple[Any, Any]:
        for u in (uri, ref):
            produce(u, seed, n, range(10_000), T0 + (hour - 1) * HOUR)
        s = Compactor(uri, CompactionConfig(**REUSE), clock=lambda: T0 + hour * HOUR).run()  # type: ignore[arg-type]
        r = Compactor(ref, copy_all, clock=lambda: T0 + hour * HOUR).run()
        assert s.status == r.status == "compacted"
        assert compacted(uri) == compacted(ref)
        assert (s.keys, s.tombstones_kept, s.tombstones_dropped) == (r.keys, r.tombstones_kept, r.tombstones_dropped)
        return s, r

    first, _ = step(1, 30_000, 1)
    assert first.records_reused == 0
    second, ref2 = step(2, 300, 2)  # 1 % new records
    # the previous parts stay; only the new survivors are copied
    assert second.records_reused > 0.9 * first.records_written
    assert second.records_written <= 300
    assert second.bytes_written < ref2.bytes_written / 20
    state = TopicMetadata.open(uri).load_compaction()
    assert any(p.deletions for p in state.parts)
    assert state.records == second.records_written + second.records_reused == len(compacted(uri))
    assert TableView(uri).refresh() == TableView(ref).refresh()
    # a third run replaces a deletion vector (and tombstones expire); gc deletes the old
    # vector, never a part still in use
    third, _ = step(3, 300, 3)
    assert third.records_reused > 0 and third.tombstones_dropped > 0
    meta = TopicMetadata.open(uri)
    report = collect_garbage(meta, now_ms=int((T0 + 4 * HOUR) * 1000), grace_ms=0,
                             orphan_grace_ms=CompactionConfig().orphan_grace_ms)
    assert any(o.endswith(".bin") for o in report.retired_deleted)
    for obj in meta.load_compaction().referenced_objects():
        assert meta.topic.store.exists(meta.topic.key(obj)), obj
    assert compacted(uri) == compacted(ref)
    # a stray object in the folder of a part kept in place goes once past the orphan
    # grace; the part and its deletion vector stay
    state = meta.load_compaction()
    kept_part = next(p for p in state.parts if p.deletions)
    stray = kept_part.object.rsplit("/", 1)[0] + "/_run.json"
    meta.topic.store.put(meta.topic.key(stray), b"{}")
    grace = CompactionConfig().orphan_grace_ms
    report = collect_garbage(meta, now_ms=int(time.time() * 1000), grace_ms=0, orphan_grace_ms=grace)
    assert stray not in report.orphans_deleted
    report = collect_garbage(meta, now_ms=int(time.time() * 1000) + grace + 60_000, grace_ms=0,
                             orphan_grace_ms=grace)
    assert stray in report.orphans_deleted
    for obj in meta.load_compaction().referenced_objects():
        assert meta.topic.store.exists(meta.topic.key(obj)), obj
    assert compacted(uri) == compacted(ref)


def test_a_mostly_superseded_part_is_copied_not_kept(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    produce(uri, 1, 4_000, range(1_000), T0)
    Compactor(uri, CompactionConfig(**REUSE), clock=lambda: T0 + HOUR).run()  # type: ignore[arg-type]
    old = {p.object for p in TopicMetadata.open(uri).load_compaction().parts}
    produce(uri, 2, 6_000, range(1_000), T0 + HOUR)  # nearly every key again
    s = Compactor(uri, CompactionConfig(**REUSE), clock=lambda: T0 + 2 * HOUR).run()  # type: ignore[arg-type]
    assert s.records_reused == 0
    new = TopicMetadata.open(uri).load_compaction()
    assert not old & {p.object for p in new.parts}
    assert old <= set().union(*(r.objects for r in new.retired))


def test_corrupt_deletion_vector_is_exit_4_for_compact_and_read(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    produce(uri, 1, 5_000, range(2_000), T0)
    Compactor(uri, CompactionConfig(**REUSE), clock=lambda: T0 + HOUR).run()  # type: ignore[arg-type]
    produce(uri, 2, 100, range(2_000), T0 + HOUR)
    Compactor(uri, CompactionConfig(**REUSE), clock=lambda: T0 + 2 * HOUR).run()  # type: ignore[arg-type]
    dv = next(p.deletions for p in TopicMetadata.open(uri).load_compaction().parts if p.deletions)
    path = Path(uri) / dv
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    shutil.copy(path, tmp_path / "evidence")
    res = run_cli("read", uri, "--compacted")
    assert res.returncode == 4 and dv.split("/")[-1] in res.stderr and res.stderr.count("\n") == 1
    produce(uri, 3, 100, range(2_000), T0 + 2 * HOUR)
    res = run_cli(uri, script="compact")
    assert res.returncode == 4 and dv.split("/")[-1] in res.stderr


@pytest.mark.parametrize(("sizes", "kept_in_place"), [
    ("BSB", [True, True, True]),  # a small part between two kept in place: copying it would only rewrite it
    ("BSSB", [True, False, False, True]),  # two small neighbours: copied, so merged into one
    ("BBS", [True, True, False]),  # the last part merges with the new records copied after it
    ("SBB", [True, True, True]),  # first, with a kept neighbour
])
def test_small_parts_are_copied_only_to_merge(tmp_path: Path, sizes: str, kept_in_place: list[bool]) -> None:
    import dataclasses

    from shale.compactor.pass_one import pass_one
    from shale.compactor.pass_two import plan_work
    from shale.compactor.plan import make_plan
    from shale.metadata.state import CompactedPart

    uri = str(tmp_path / "t")
    produce(uri, 1, 40_000, range(20_000), T0)
    first = Compactor(uri, CompactionConfig(max_part_bytes=1 << 16, delete_retention_ms=0),
                      clock=lambda: T0 + HOUR).run()
    assert first.status == "compacted"
    produce(uri, 2, 300, range(20_000), T0 + HOUR)
    meta = TopicMetadata.open(uri)
    plan = make_plan(meta, now_ms=int((T0 + 2 * HOUR) * 1000), min_compaction_lag_ms=0)
    assert len(plan.compacted) >= len(sizes) and plan.new
    # the parts' sizes as the case says (B: big, S: small); the rest big
    labels = sizes + "B" * (len(plan.compacted) - len(sizes))
    if sizes.endswith("S"):
        labels = "B" * (len(plan.compacted) - len(sizes)) + sizes  # the case's last part is the last one
    compacted = tuple(dataclasses.replace(s, part=dataclasses.replace(s.part, bytes=10**9 if c == "B" else 10))
                      for s, c in zip(plan.compacted, labels, strict=True))
    plan = dataclasses.replace(plan, compacted=compacted)
    config = CompactionConfig(delete_retention_ms=0, reuse_min_bytes=1000)
    survivors = pass_one(plan, config, int((T0 + 2 * HOUR) * 1000))
    work = plan_work(plan, survivors, config, topic=meta.topic, run_dir="compacted/test-run", on_object=lambda _n: None)
    got = [isinstance(w, CompactedPart) for w in work[:len(plan.compacted)]]
    want = ([True] * (len(plan.compacted) - len(sizes)) + kept_in_place if sizes.endswith("S")
            else kept_in_place + [True] * (len(plan.compacted) - len(sizes)))
    assert got == want, (labels, got)
    assert not any(isinstance(w, CompactedPart) for w in work[len(plan.compacted):])  # new records: copied


@pytest.mark.parametrize("fail", ["vector", "copy"])
def test_a_failed_write_during_an_incremental_run_publishes_nothing_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: str) -> None:
    """Deletion vectors are written while the new survivors are copied: when either
    write fails the run fails, the other is waited for, and the run's folder is removed
    with everything in it; the next run then succeeds.

    The two writes are made to overlap, whatever the machine's speed: a failing vector
    fails only once the copy has a part open, and that part is closed (made visible)
    only after the failure; a vector is written only once the copy has failed."""
    import threading

    from shale.storage import ObjectWriter
    from shale.storage._local import LocalStore

    guard_s = 60  # only reached if the run does not overlap the two writes
    uri = str(tmp_path / "t")
    produce(uri, 1, 20_000, range(4_000), T0)
    Compactor(uri, CompactionConfig(**REUSE), clock=lambda: T0 + HOUR).run()  # type: ignore[arg-type]
    before = TopicMetadata.open(uri).load_compaction()
    produce(uri, 2, 300, range(4_000), T0 + HOUR)
    real_put, real_writer = LocalStore.put, LocalStore.open_writer
    part_open, vector_failed, copy_failed = threading.Event(), threading.Event(), threading.Event()
    written: list[str] = []  # objects made visible by the failing run

    class HeldOpen(ObjectWriter):
        """A part that is closed only once the vector has failed."""

        def __init__(self, inner: ObjectWriter, key: str) -> None:
            self.inner, self.key = inner, key

        def write(self, data: bytes | bytearray | memoryview, /) -> int:
            return self.inner.write(data)

        def close(self) -> None:
            assert vector_failed.wait(guard_s), "the vector was not written while the copy ran"
            self.inner.close()
            written.append(self.key)

        def abort(self) -> None:
            self.inner.abort()

    def put(self: LocalStore, key: str, data: bytes, *, durable: bool = True) -> None:
        if "/deletions-" in key:
            if fail == "vector":
                assert part_open.wait(guard_s), "the copy did not run while the vector was written"
                vector_failed.set()
                raise OSError(28, "No space left on device")
            assert copy_failed.wait(guard_s), "the copy did not run while the vector was written"
            real_put(self, key, data, durable=durable)
            written.append(key)
            return
        real_put(self, key, data, durable=durable)

    def open_writer(self: LocalStore, key: str) -> Any:
        if "/part-" in key:
            if fail == "copy":
                copy_failed.set()
                raise OSError(28, "No space left on device")
            part_open.set()
            return HeldOpen(real_writer(self, key), key)
        return real_writer(self, key)

    monkeypatch.setattr(LocalStore, "put", put)
    monkeypatch.setattr(LocalStore, "open_writer", open_writer)
    with pytest.raises(OSError, match="No space left"):
        Compactor(uri, CompactionConfig(**REUSE), clock=lambda: T0 + 2 * HOUR).run()  # type: ignore[arg-type]
    # the write that did not fail was waited for: it finished (then was removed, below)
    survivor = "/part-" if fail == "vector" else "/deletions-"
    assert written and all(survivor in k for k in written), written
    after = TopicMetadata.open(uri).load_compaction()
    assert after.version == before.version  # nothing published
    # the failed run's folder holds nothing (a local folder may stay, empty, as an
    # object store's prefix would)
    left = [p for p in (tmp_path / "t" / "compacted").rglob("*")
            if p.is_file() and not p.is_relative_to(tmp_path / "t" / "compacted" / before.compacted_ledger)]
    assert left == []
    monkeypatch.undo()
    s = Compactor(uri, CompactionConfig(**REUSE), clock=lambda: T0 + 2 * HOUR).run()  # type: ignore[arg-type]
    assert s.status == "compacted" and s.records_reused > 0


def test_lookups_of_many_parts_run_ahead_with_the_same_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With several previous parts, pass one hands every part's lookups to its pool at
    once; the survivors are those of one thread looking each part up in turn."""
    import threading

    from shale.compactor.keymap import KeyMap
    from shale.compactor.pass_one import pass_one
    from shale.compactor.plan import make_plan

    uri = str(tmp_path / "t")
    produce(uri, 1, 20_000, range(4_000), T0)
    first = Compactor(uri, CompactionConfig(max_part_bytes=1 << 16, **REUSE), clock=lambda: T0 + HOUR).run()
    assert first.status == "compacted"
    produce(uri, 2, 2_000, range(4_000), T0 + HOUR)
    meta = TopicMetadata.open(uri)
    plan = make_plan(meta, now_ms=int((T0 + 2 * HOUR) * 1000), min_compaction_lag_ms=0)
    assert len(plan.compacted) >= 3  # one for each thread of the second pass one
    callers: list[str] = []
    contains = KeyMap.contains

    def spy(self: KeyMap, *args: Any, **kw: Any) -> Any:
        callers.append(threading.current_thread().name)
        return contains(self, *args, **kw)

    monkeypatch.setattr(KeyMap, "contains", spy)
    now = int((T0 + 2 * HOUR) * 1000)
    one = pass_one(plan, CompactionConfig(workers=1, **REUSE), now)
    assert callers == ["MainThread"] * len(plan.compacted)
    callers.clear()
    ahead = pass_one(plan, CompactionConfig(workers=3, **REUSE), now)
    assert len(callers) == len(plan.compacted) and all(c.startswith("shale-lookup") for c in callers)
    assert np.array_equal(one.keep, ahead.keep)
    assert (one.keys, one.tombstones_kept, one.records_read) == (ahead.keys, ahead.tombstones_kept, ahead.records_read)
    assert 0 < int(one.keep[:sum(s.records for s in plan.compacted)].sum()) < sum(s.records for s in plan.compacted)
