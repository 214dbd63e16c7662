"""The local engine on several cores: pass one's map built by threads, pass two copied by
forked worker processes.  Each is checked against the single-core path on the same data;
the size thresholds are lowered so that small topics take the parallel paths."""

from __future__ import annotations

import itertools
import os
import random
import shutil
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shale.cli.errors import EXIT_CORRUPT, exit_code_of
from shale.compactor import CompactionConfig, Compactor
from shale.compactor import pass_one as pass_one_module
from shale.compactor import workers as workers_module
from shale.compactor.keymap import KeyMapBuilder
from shale.compactor.plan import make_plan
from shale.ledger.errors import CorruptLedgerError, ShaleError
from shale.ledger.format import FRAME_HEADER
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from shale.runtime.cpus import available_cpus

T0 = 1_700_000_000.0
HOUR = 3600.0


@pytest.fixture
def parallel_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers_module, "MIN_PARALLEL_BYTES", 0)
    monkeypatch.setattr(pass_one_module, "_MIN_THREADED_RECORDS", 0)
    # small topics' tables cut into many stretches, records grouped in chunks of a few slices
    monkeypatch.setattr(pass_one_module, "_GROUP_STRETCH_BYTES", 2048)
    monkeypatch.setattr(pass_one_module, "_MIN_GROUPED_BYTES", 0)
    monkeypatch.setattr(pass_one_module, "_MIN_CHUNK_RECORDS", 6_000)


def produce(uri: str, seed: int, n: int, keys: int, t: float) -> None:
    rnd = random.Random(seed)
    with TopicWriter(uri, max_ledger_records=4_000, batch_size=25, clock=lambda: t) as w:
        for i in range(n):
            k = rnd.randrange(keys)
            w.append(f"key-{k}", None if rnd.random() < 0.05 else f"{seed}-{i}-" + "v" * rnd.randrange(90))
        for i in range(50):
            w.append(None, f"keyless-{seed}-{i}")


def view(uri: str) -> list[tuple[str, Any, Any, Any]]:
    return [(str(m.id), m.key, m.value, m.properties) for m in TopicReader(uri, read_compacted=True)]


def parts(uri: str) -> list[str]:
    return [p.object for p in TopicMetadata.open(uri).load_compaction().parts]


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_workers_write_what_one_process_writes(kind: str, parallel_everywhere: None, tmp_path: Path,
                                               request: pytest.FixtureRequest) -> None:
    """Several incremental rounds (tombstones kept then expiring, a compacted part kept
    in place between copied work, a min lag cutting inside a ledger) give the same view,
    record for record, with 3 workers as with one."""
    if kind == "local":
        uri, ref = str(tmp_path / "par"), str(tmp_path / "ref")
    else:
        bucket = request.getfixturevalue("s3_bucket")
        uri, ref = f"s3://{bucket}/par", f"s3://{bucket}/ref"
    base = dict(delete_retention_ms=int(1.5 * HOUR * 1000), reuse_min_bytes=40_000, max_part_bytes=1 << 16,
                min_compaction_lag_ms=int(0.5 * HOUR * 1000))
    for hour, (seed, n) in enumerate([(1, 30_000), (2, 6_000), (3, 300)], start=1):
        for u in (uri, ref):
            produce(u, seed, n, 3_000, T0 + (hour - 1) * HOUR)
            produce(u, seed + 100, 500, 3_000, T0 + hour * HOUR)  # too young: held back
        clock = lambda h=hour: T0 + h * HOUR  # noqa: E731
        s = Compactor(uri, CompactionConfig(**base, workers=3), clock=clock).run()  # type: ignore[arg-type]
        r = Compactor(ref, CompactionConfig(**base, workers=1), clock=clock).run()  # type: ignore[arg-type]
        assert s.status == r.status == "compacted", (s.error, r.error)
        assert s.held_back_records > 0
        figures = ("records_read", "keys", "tombstones_kept", "tombstones_dropped", "keyless_dropped", "horizon")
        assert [getattr(s, f) for f in figures] == [getattr(r, f) for f in figures]
        # parts are cut differently, so which are kept in place may differ; not the total
        assert s.records_written + s.records_reused == r.records_written + r.records_reused
        assert view(uri) == view(ref)
        # the workers wrote their own parts, named by group
        assert any(p.split("/")[-1].startswith("part-00001-") for p in parts(uri)), parts(uri)
    assert s.records_reused > 0  # the last round kept a part in place between copied groups


def test_a_corrupt_entry_found_by_a_worker_fails_the_run_cleanly(parallel_everywhere: None, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    produce(uri, 1, 20_000, 2_000, T0)
    ledgers = sorted((tmp_path / "t" / "ledgers").rglob("*.ledger"))
    victim = ledgers[-2]  # the last ledger holds only the keyless records
    data = bytearray(victim.read_bytes())
    data[len(data) // 3] ^= 0xFF  # inside an entry's payload, where survivors are
    victim.write_bytes(bytes(data))
    with pytest.raises(CorruptLedgerError, match="checksum mismatch") as e:
        Compactor(uri, CompactionConfig(workers=2)).run()
    # the worker's error arrives whole: its class, exit code, object and position
    assert exit_code_of(e.value) == EXIT_CORRUPT and e.value.path.endswith(victim.name)
    assert e.value.position is not None and 32 < e.value.position < len(data)
    assert TopicMetadata.open(uri).load_compaction().compacted_ledger is None
    assert not [p for p in (tmp_path / "t" / "compacted").rglob("*") if p.is_file()]


def _die_in_group_one(g: int) -> Any:
    if g == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return _copy_group(g)


_copy_group = workers_module._copy_group


def test_a_worker_killed_mid_run_fails_the_run_and_leaves_nothing(parallel_everywhere: None, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    uri = str(tmp_path / "t")
    produce(uri, 1, 20_000, 2_000, T0)
    monkeypatch.setattr(workers_module, "_copy_group", _die_in_group_one)
    with pytest.raises(ShaleError, match="a pass-two worker process died"):
        Compactor(uri, CompactionConfig(workers=2)).run()
    assert TopicMetadata.open(uri).load_compaction().compacted_ledger is None
    assert not [p for p in (tmp_path / "t" / "compacted").rglob("*") if p.is_file()]
    monkeypatch.setattr(workers_module, "_copy_group", _copy_group)
    assert Compactor(uri, CompactionConfig(workers=2)).run().status == "compacted"


def test_split_work_tiles_the_plan_in_order(tmp_path: Path) -> None:
    """Groups cover every entry of every slice exactly once, in order, at entry
    boundaries, with costs that do not differ wildly."""
    uri = str(tmp_path / "t")
    produce(uri, 1, 30_000, 3_000, T0)
    meta = TopicMetadata.open(uri)
    plan = make_plan(meta, now_ms=int(T0 * 1000) + 1, min_compaction_lag_ms=0)
    rng = np.random.default_rng(1)
    work = []
    for s in plan.slices:
        keep = rng.random(s.records) < np.linspace(0.01, 0.9, s.records)  # survivors crowd at the end
        work.append((s, keep, np.zeros(s.records, dtype=np.int64)))
    groups = workers_module.split_work(work, 2)
    assert len(groups) >= 4
    pieces = [p for g in groups for p in g.items]
    for (s, keep, _), pieces_of_s in zip(work, _by_file(pieces), strict=True):
        assert pieces_of_s[0][0].start == s.start and pieces_of_s[-1][0].stop == s.stop
        for (a, _, _), (b, _, _) in itertools.pairwise(pieces_of_s):
            assert a.stop == b.start and b.start in set(s.file.footer.e_rec_start.tolist())
        assert np.array_equal(np.concatenate([p[1] for p in pieces_of_s]), keep)
    costs = [sum(workers_module.work_cost(p) for p in g.items) for g in groups]
    assert max(costs[:-1]) < 3 * min(costs[:-1])


def _by_file(pieces: list[Any]) -> list[list[Any]]:
    out: list[list[Any]] = []
    for p in pieces:
        if out and out[-1][0][0].file is p[0].file:
            out[-1].append(p)
        else:
            out.append([p])
    return out


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("threads", [2, 3, 4])
def test_threaded_map_equals_one_builder(threads: int, grouped: bool, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ways of building the map in threads: each thread taking its part of every
    record, and (``grouped``: stretches of the table lowered so that this small topic's
    tables have many) the records partitioned by hash first, in chunks of a few slices."""
    uri = str(tmp_path / "t")
    produce(uri, 1, 20_000, 2_500, T0)
    plan = make_plan(TopicMetadata.open(uri), now_ms=int(T0 * 1000) + 1, min_compaction_lag_ms=0)
    calls: list[int] = []
    real_partition = pass_one_module.partition_keys

    def partition(runs: Any, bits: int, out: Any = None) -> Any:
        calls.append(bits)
        return real_partition(runs, bits, out)

    monkeypatch.setattr(pass_one_module, "partition_keys", partition)
    if grouped:
        monkeypatch.setattr(pass_one_module, "_GROUP_STRETCH_BYTES", 2048)
        monkeypatch.setattr(pass_one_module, "_MIN_GROUPED_BYTES", 0)
        monkeypatch.setattr(pass_one_module, "_MIN_CHUNK_RECORDS", 6_000)
    got = pass_one_module._build_in_threads(plan, 10**6, 0, threads)
    # (one probing call for whether the kernels are there, then one per piece of a chunk)
    assert (len(calls) > 1 + threads) == grouped
    b = KeyMapBuilder(10**6)
    at = 0
    for s in plan.new:
        hi, lo, pos, first = pass_one_module._slice_records(s, at)
        b.add(hi, lo, pos, first=first)
        at += s.records
    want = b.build()
    assert len(want) == 2_500
    assert np.array_equal(got.hi, want.hi) and np.array_equal(got.lo, want.lo)
    assert np.array_equal(got.pos, want.pos)


def test_available_cpus_is_at_least_one() -> None:
    assert 1 <= available_cpus() <= (os.cpu_count() or 1)


def test_frame_check_names_the_entry(tmp_path: Path) -> None:
    """The vectorised frame check finds a flipped byte in any entry of a chunk."""
    from shale.ledger.reader import LedgerFile
    from shale.storage import resolve

    uri = str(tmp_path / "t")
    produce(uri, 1, 2_000, 100, T0)
    path = sorted((tmp_path / "t" / "ledgers").rglob("*.ledger"))[0]
    loc = resolve(str(path.parent))
    f = LedgerFile.open(loc.store, loc.key(path.name))
    base, buf = f.read_frames(0, f.n_entries)
    f.check_frames(buf, base, 0, f.n_entries)
    for entry, where in ((7, FRAME_HEADER.size + 3), (f.n_entries - 1, 4), (3, 0)):
        off = int(f.footer.col("e_offset")[entry]) - base
        bad = bytearray(buf)
        bad[off + where] ^= 0x01
        with pytest.raises(ShaleError, match=f"entry {f.ledger_id}:{entry} at byte"):
            f.check_frames(bytes(bad), base, 0, f.n_entries)
    shutil.rmtree(tmp_path / "t")


def test_topics_compacted_in_threads_keep_their_workers_apart(parallel_everywhere: None, tmp_path: Path) -> None:
    """Two runs in two threads, each forking its own workers, write each its own topic."""
    from concurrent.futures import ThreadPoolExecutor

    uris = [str(tmp_path / name) for name in ("a", "b", "ref-a", "ref-b")]
    for i, uri in enumerate(uris):
        produce(uri, 1 + i % 2, 12_000, 1_500, T0)
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda u: Compactor(u, CompactionConfig(workers=2)).run(), uris[:2]))
    assert [r.status for r in runs] == ["compacted", "compacted"]
    for uri, ref in ((uris[0], uris[2]), (uris[1], uris[3])):
        assert Compactor(ref, CompactionConfig(workers=1)).run().status == "compacted"
        assert view(uri) == view(ref)
    assert view(uris[0]) != view(uris[1])


def test_split_work_makes_no_part_too_small_to_keep(tmp_path: Path) -> None:
    """With a minimum output, every group but the last writes at least about that much:
    survivors are rare in the old ledgers, so those groups cover more of them."""
    uri = str(tmp_path / "t")
    produce(uri, 1, 30_000, 3_000, T0)
    plan = make_plan(TopicMetadata.open(uri), now_ms=int(T0 * 1000) + 1, min_compaction_lag_ms=0)
    rng = np.random.default_rng(1)
    work = [(s, rng.random(s.records) < np.linspace(0.001, 0.9, s.records), np.zeros(s.records, dtype=np.int64))
            for s in plan.slices]
    loose = workers_module.split_work(work, 2)
    total = sum(workers_module._out_bytes(w) for w in work)
    floor = total // 6
    groups = workers_module.split_work(work, 2, min_out_bytes=floor)
    outs = [sum(workers_module._out_bytes(p) for p in g.items) for g in groups]
    assert min(outs[:-1]) >= floor, outs
    assert min(sum(workers_module._out_bytes(p) for p in g.items) for g in loose[:-1]) < floor  # it did matter
    pieces = [p for g in groups for p in g.items]
    assert sum(len(p[1]) for p in pieces) == sum(s.records for s in plan.slices)  # still every record, once


def test_a_run_on_worker_processes_does_not_import_numpy_ma(tmp_path: Path) -> None:
    """Cutting the work for the workers (on the run's critical path, before any worker
    starts) uses nothing that imports ``numpy.ma`` (``np.unique`` does, on its first call)."""
    import subprocess
    import sys

    uri = str(tmp_path / "t")
    produce(uri, 1, 30_000, 3_000, T0)
    script = ("import sys\n"
              "from shale.compactor import CompactionConfig, Compactor, pass_one, workers\n"
              "workers.MIN_PARALLEL_BYTES = 0\n"
              "pass_one._MIN_THREADED_RECORDS = 0\n"
              "assert 'numpy.ma' not in sys.modules\n"
              "assert Compactor(sys.argv[1], CompactionConfig(workers=2)).run().status == 'compacted'\n"
              "print('numpy.ma' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", script, uri], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False"]
    assert len(parts(uri)) > 1  # (the workers wrote parts of their own)


def test_pass_one_of_a_run_for_workers_imports_the_process_pool_meanwhile(tmp_path: Path) -> None:
    """When pass two will likely fork workers, what it needs to fork them is imported
    while pass one runs, not after it; and nothing imports it for a run of one process."""
    import subprocess
    import sys

    uri = str(tmp_path / "t")
    produce(uri, 1, 30_000, 3_000, T0)
    script = ("import sys, threading\n"
              "from shale.compactor import CompactionConfig, workers\n"
              "from shale.compactor.engine import LocalEngine\n"
              "from shale.compactor.plan import make_plan\n"
              "from shale.metadata.topic import TopicMetadata\n"
              "workers.MIN_PARALLEL_BYTES = int(sys.argv[2])\n"
              "plan = make_plan(TopicMetadata.open(sys.argv[1]), now_ms=1 << 62, min_compaction_lag_ms=0)\n"
              "LocalEngine().pass_one(plan, CompactionConfig(workers=2), 1 << 62)\n"
              "for t in threading.enumerate():\n"
              "    if t is not threading.main_thread(): t.join()\n"
              "print('concurrent.futures.process' in sys.modules)\n")
    for threshold, imported in ((0, "True"), (1 << 40, "False")):
        r = subprocess.run([sys.executable, "-c", script, uri, str(threshold)], capture_output=True, text=True,
                           check=False)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [imported]
