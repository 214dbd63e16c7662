"""``compact --max-memory``: one setting bounds the whole run, whatever the topic's size.

Runs compact a backlog of unique keys in parts (each run continues where the last
stopped, reading the compacted records of the runs before again) inside a memory cgroup
limited to the setting plus the stated fixed overhead (:data:`OVERHEAD`, as
docs/operations.md sizes a Kubernetes limit): every run must finish, never be killed
for memory, peak within the bound, and the view they leave must hold every key with its
value.  The 20-million-key topic runs with ``SHALE_LONG_TESTS=1``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shale.compactor import CompactionConfig
from shale.compactor.budget import (
    COLUMN_BYTES_PER_RECORD,
    LOCAL_OVERHEAD,
    MAP_BYTES_PER_KEY,
    OBJECT_STORE_OVERHEAD,
    WINDOW_BYTES_PER_RECORD,
    Footprint,
    memory_budget,
)
from shale.ledger.errors import InvalidInputError
from shale.ledger.reader import LedgerFile
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from tests.cgroups import cgroup_unavailable, run_limited
from tests.conftest import ROOT, run_cli_here
from tests.needs import needs

MiB = 1 << 20
OVERHEAD = LOCAL_OVERHEAD  # what a run holds besides the setting (docs/operations.md)
LONG = os.environ.get("SHALE_LONG_TESTS") == "1"
_BATCH = 500_000


def make_topic(path: Path | str, keys: int) -> None:
    """``keys`` records, one key each (``key-N``, value ``value-N`` and padding), zstd."""
    with TopicWriter(str(path), compression="zstd") as w:
        for start in range(0, keys, _BATCH):
            ids = range(start, min(keys, start + _BATCH))
            w.append_batch({"key": [b"key-%010d" % i for i in ids],
                            "value": [b"value-%010d-" % i + bytes(40) for i in ids]})


def compact_until_done(topic: Path | str, setting: str, limit: int, max_runs: int) -> list[dict[str, object]]:
    """``shale compact --max-memory SETTING`` under ``limit``, run after run until nothing
    is left for the next; each run's summary with its peak RSS."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = []
    for _ in range(max_runs):
        got = run_limited([sys.executable, "-m", "shale.cli", "compact", str(topic), "--max-memory", setting,
                           "--json", "--min-dirty-ratio", "0"], limit, env=env, cwd=str(ROOT))
        assert not got.oom_killed, f"killed for memory under {limit} bytes: {got.stderr}"
        assert got.exit_code == 0, got.stderr
        summary = json.loads(got.stdout.splitlines()[-1])
        summary["peak_rss"] = got.peak_rss
        print(f"run {len(out) + 1}: peak RSS {got.peak_rss >> 20} MiB, {summary['records_written']} written, "
              f"{summary['deferred_records']} deferred, limit {limit >> 20} MiB, failcnt {got.failcnt}")
        out.append(summary)
        if not summary["deferred_records"]:
            return out
    raise AssertionError(f"still deferred after {max_runs} runs: {out[-1]}")


def check_view(topic: Path | str, keys: int) -> None:
    """The compacted view holds every key once, in key order, each with its value."""
    import pyarrow as pa

    seen = 0
    with TopicReader(str(topic), read_compacted=True) as r:
        for batch in r.iter_batches(1 << 18):
            n = batch.num_rows
            want = pa.array([b"key-%010d" % i for i in range(seen, seen + n)], pa.binary())
            assert batch.column("key").cast(pa.binary()).equals(want)
            values = batch.column("value")
            for j in (0, n - 1):
                assert values[j].as_py() == b"value-%010d-" % (seen + j) + bytes(40)
            seen += n
    assert seen == keys


cgroups = needs(lambda: cgroup_unavailable() and f"{cgroup_unavailable()} (these runs need root and cgroup v1)")


@cgroups
def test_runs_stay_within_the_setting_under_a_memory_limit(tmp_path: Path) -> None:
    keys, setting = 1_500_000, 64 * MiB
    topic = tmp_path / "topic"
    make_topic(topic, keys)
    runs = compact_until_done(topic, "64MiB", setting + OVERHEAD, max_runs=12)
    assert len(runs) >= 3  # the backlog took several runs: each read the compacted records again
    for r in runs:
        assert r["status"] == "compacted"
        assert r["peak_rss"] <= setting + OVERHEAD, r
    assert sum(int(r["records_written"]) for r in runs) >= keys
    check_view(topic, keys)


@cgroups
@pytest.mark.s3
def test_runs_on_object_storage_stay_within_the_setting(s3_bucket: str, tmp_path: Path) -> None:
    keys, setting = 600_000, 64 * MiB
    topic = f"s3://{s3_bucket}/topic"
    make_topic(topic, keys)
    runs = compact_until_done(topic, "64MiB", setting + OBJECT_STORE_OVERHEAD, max_runs=8)
    assert len(runs) >= 2
    assert max(int(r["peak_rss"]) for r in runs) <= setting + OBJECT_STORE_OVERHEAD  # type: ignore[call-overload]
    check_view(topic, keys)


@cgroups
@pytest.mark.skipif(not LONG, reason="20 million keys: SHALE_LONG_TESTS=1")
def test_twenty_million_keys_under_a_memory_limit(tmp_path: Path) -> None:
    keys, setting = 20_000_000, 256 * MiB
    topic = tmp_path / "topic"
    make_topic(topic, keys)
    runs = compact_until_done(topic, "256MiB", setting + OVERHEAD, max_runs=40)
    assert max(int(r["peak_rss"]) for r in runs) <= setting + OVERHEAD  # type: ignore[call-overload]
    check_view(topic, keys)


def make_one_entry(path: Path | str) -> None:
    """One entry of 4 records of 63 MiB of text (252 MiB decompressed; an entry may hold
    256 MiB), a few KB stored with zstd, written by the public writer."""
    with TopicWriter(str(path), compression="zstd", batch_size=4, max_entry_bytes=256 * MiB) as w:
        for i in range(4):
            w.append(f"key-{i}", big_value(i, 63 * MiB))


def make_twelve(path: Path | str) -> None:
    """Twelve records of 60 MB of text, each in an entry of its own."""
    with TopicWriter(str(path), compression="zstd", max_entry_bytes=MiB) as w:
        for i in range(12):
            w.append(f"key-{i}", big_value(i, 60_000_000))


def big_value(i: int, size: int) -> bytes:
    return (b"value-%02d-" % i * (size // 9 + 1))[:size]


def check_big_view(topic: Path | str, records: int, size: int) -> None:
    """The compacted view holds every record once, each with its whole value."""
    with TopicReader(str(topic), read_compacted=True) as r:
        got = [(m.key, m.value == big_value(i, size)) for i, m in enumerate(r)]
    assert got == [(b"key-%d" % i, True) for i in range(records)]


def compact_limited(topic: Path | str, setting: str, limit: int) -> tuple[int, str, int]:
    """``compact --max-memory SETTING`` under a cgroup limit of ``limit``: its exit code,
    standard error and peak RSS; never killed for memory."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    got = run_limited([sys.executable, "-m", "shale.cli", "compact", str(topic), "--max-memory", setting, "--json",
                       "--min-dirty-ratio", "0"], limit, env=env, cwd=str(ROOT))
    assert not got.oom_killed, f"killed for memory under {limit >> 20} MiB: {got.stderr}"
    print(f"{setting}: exit {got.exit_code}, peak RSS {got.peak_rss >> 20} MiB, limit {limit >> 20} MiB, "
          f"failcnt {got.failcnt}")
    return got.exit_code, got.stderr.strip(), got.peak_rss


@cgroups
def test_an_entry_of_252_mib_is_refused_under_64mib_and_compacted_within_the_least_bound(tmp_path: Path) -> None:
    """Records of 63 MiB do not fit a run under 64 MiB: refused before anything is read
    (exit 2, one line naming the object, the entry and the least bound), nothing
    written; compacted at that bound and at 384 MiB, each within its limit."""
    import re
    import shutil

    source = tmp_path / "source"
    make_one_entry(source)
    topic = tmp_path / "topic"
    shutil.copytree(source, topic)
    before = {p: p.read_bytes() for p in topic.rglob("*") if p.is_file()}
    code, err, _ = compact_limited(topic, "64MiB", 64 * MiB + OVERHEAD)
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    ledger = next(topic.rglob("*.ledger")).name
    assert ledger in err and "entry 1:0" in err, err
    assert {p: p.read_bytes() for p in topic.rglob("*") if p.is_file()} == before
    m = re.search(r"give at least (\d+)MiB", err)
    assert m is not None, err
    least = int(m.group(1))
    assert 64 < least < 128
    for setting in (least, 384):
        shutil.rmtree(topic)
        shutil.copytree(source, topic)
        code, err, peak = compact_limited(topic, f"{setting}MiB", setting * MiB + OVERHEAD)
        assert code == 0, err
        assert peak <= setting * MiB + OVERHEAD
        check_big_view(topic, 4, 63 * MiB)


@cgroups
def test_twelve_records_of_60_mb_are_compacted_within_64mib(tmp_path: Path) -> None:
    topic = tmp_path / "topic"
    make_twelve(topic)
    code, err, peak = compact_limited(topic, "64MiB", 64 * MiB + OVERHEAD)
    assert code == 0, err
    assert peak <= 64 * MiB + OVERHEAD
    check_big_view(topic, 12, 60_000_000)


@cgroups
@pytest.mark.s3
def test_big_entries_on_object_storage_stay_within_the_setting(s3_bucket: str) -> None:
    topic = f"s3://{s3_bucket}/topic"
    make_twelve(topic)
    code, err, peak = compact_limited(topic, "64MiB", 64 * MiB + OBJECT_STORE_OVERHEAD)
    assert code == 0, err
    assert peak <= 64 * MiB + OBJECT_STORE_OVERHEAD
    check_big_view(topic, 12, 60_000_000)


def _mapped_rss(address: int) -> int:
    """Resident bytes of the mapping of this process that holds ``address``."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "Rss:":
                return int(line.split()[1]) * 1024
    raise AssertionError("no mapping holds the address")


@needs(lambda: None if Path("/proc/self/smaps").exists() else "no /proc/self/smaps (Linux) to count pages by")
def test_footer_pages_are_given_back_once_read(tmp_path: Path) -> None:
    make_topic(tmp_path / "topic", 200_000)  # one ledger, its footer mapped (over 1 MiB)
    meta = TopicMetadata.open(str(tmp_path / "topic"))
    path = next((tmp_path / "topic").rglob("*.ledger"))
    f = LedgerFile.open(meta.topic.store, str(path.resolve()).lstrip("/"))
    assert f.footer_mapped
    hashes = f.footer.col("r_hash_hi")
    address = hashes.ctypes.data
    assert _mapped_rss(address) < 64 << 10  # checked, every page read, then given back
    assert int(hashes.sum(dtype=np.uint64) & 1) in (0, 1)  # reading the column maps it again
    assert _mapped_rss(address) >= hashes.nbytes // 2
    f.release_pages()
    assert _mapped_rss(address) < 64 << 10
    assert f.footer.col("r_hash_hi").tobytes() == hashes.tobytes()  # the columns are still all there


def test_the_budget_stays_within_the_setting() -> None:
    for setting in (32 * MiB, 64 * MiB, 256 * MiB, 4096 * MiB):
        for records, largest in ((1_000, 1_000), (1_500_000, 500_000), (20_000_000, 500_000)):
            fp = Footprint(records, largest, 0)
            try:
                b = memory_budget(CompactionConfig(max_memory=setting, workers=2), fp)
            except InvalidInputError:
                assert fp.bytes + (16 << 20) > setting
                continue
            map_peak = b.map_bytes // 24 * MAP_BYTES_PER_KEY + b.window_records * WINDOW_BYTES_PER_RECORD
            assert fp.bytes + map_peak <= setting
            # per process: reads in flight, decompressed and re-framed buffers (each may
            # double), the columns of a read's records, the part's footer as it is
            # encoded, the writes waiting
            per_process = (b.read_parallelism * b.chunk_bytes + 6 * b.chunk_raw_bytes
                           + b.chunk_records * COLUMN_BYTES_PER_RECORD + 2 * b.max_part_bytes + b.write_behind_bytes)
            assert fp.bytes + b.processes * per_process <= setting
            assert b.map_bytes >= 24 and b.processes >= 1 and b.chunk_records >= 1


def test_a_setting_too_small_for_the_topic_is_refused_in_one_line(tmp_path: Path) -> None:
    make_topic(tmp_path / "topic", 100_000)
    cfg = CompactionConfig(max_memory=32 * MiB)
    with pytest.raises(InvalidInputError, match="too small for a run over 20,000,000 records"):
        memory_budget(cfg, Footprint(20_000_000, 100_000, 0))
    r = run_cli_here("compact", str(tmp_path / "topic"), "--max-memory", "1MiB")
    assert r.returncode == 2
    assert "--max-memory" in r.stderr and "at least 32MiB" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("order", ["offset", "event-time"])
def test_key_map_windows_progress_to_the_unbounded_result(tmp_path: Path, order: str) -> None:
    """A bounded run hands the key map windows of records, cut inside ledgers: run after
    run, they publish what one unbounded run does."""
    from shale.compactor import Compactor
    from tests.compactor.test_memory import HOUR, T0, compacted, produce

    small, big = str(tmp_path / "small"), str(tmp_path / "big")
    cfg: dict[str, Any] = dict(delete_retention_ms=int(HOUR * 1000), order=order)
    for rnd, n in enumerate((12_000, 3_000)):
        for u in (small, big):
            produce(u, seed=rnd, n=n, keys=5_000, t=T0 + rnd * HOUR)
        now = T0 + (rnd + 0.5) * HOUR
        assert Compactor(big, CompactionConfig(**cfg), clock=lambda now=now: now).run().deferred_records == 0
        runs = 0
        while True:
            s = Compactor(small, CompactionConfig(max_map_bytes=1024 * 32, map_window_records=500, **cfg),
                          clock=lambda now=now: now).run()
            if s.status == "nothing-to-do":
                break
            assert s.status == "compacted", s.error
            runs += 1
            assert runs < 60, "no progress"
        assert runs >= 2  # the map forced several runs
        assert compacted(small) == compacted(big)
        a, b = TopicMetadata.open(small).load_compaction(), TopicMetadata.open(big).load_compaction()
        assert (a.horizon, a.keys, a.tombstones) == (b.horizon, b.keys, b.tombstones)


def test_topics_compacted_at_once_share_the_bound() -> None:
    from shale.settings import resolve

    one = CompactionConfig.from_settings(resolve("compact", {"max-memory": 512 * MiB}, {}))
    four = CompactionConfig.from_settings(resolve("compact", {"max-memory": 512 * MiB, "parallel": 4}, {}))
    unset = CompactionConfig.from_settings(resolve("compact", {}, {}))
    assert (one.max_memory, four.max_memory, unset.max_memory) == (512 * MiB, 128 * MiB, None)


def test_reads_are_cut_by_decompressed_bytes_and_records(tmp_path: Path) -> None:
    make_topic(tmp_path / "topic", 50_000)
    meta = TopicMetadata.open(str(tmp_path / "topic"))
    path = next((tmp_path / "topic").rglob("*.ledger"))
    f = LedgerFile.open(meta.topic.store, str(path.resolve()).lstrip("/"))
    raw, starts = f.footer.raw_lengths(), f.footer.e_rec_start
    assert f.footer.compressed and int(raw.sum()) > 2 * int(f.footer.col("e_length").astype(np.int64).sum())
    whole = list(f.chunks(0, f.n_entries, 8 << 20))
    for raw_bytes, records in ((64 << 10, 0), (0, 3_000), (200 << 10, 2_000), (1, 1)):
        got = list(f.chunks(0, f.n_entries, 8 << 20, raw_bytes=raw_bytes, records=records))
        assert [a for a, _ in got] == [0, *(b for _, b in got[:-1])] and got[-1][1] == f.n_entries
        assert len(got) > len(whole)
        for a, b in got:
            if b - a > 1:  # (one entry is read whole, whatever its size)
                assert not raw_bytes or int(raw[a:b].sum()) <= raw_bytes
                assert not records or int(starts[b] - starts[a]) <= records
