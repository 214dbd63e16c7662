"""Memory bounded by decompressed bytes wherever records are read into batches: batches of
at most ``max_batch_bytes``, no more decompressed at once across the reader's threads, big
zstd entries read as streams, the table found in two passes (footers, then only the
chosen records) equal to the table view's, JSON lines written in blocks of bytes, and the
peak memory of ``shale export`` and ``shale read --table`` on a topic of 1 GB decompressed
(a few KB stored)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shale.export
from shale.compactor import CompactionConfig, Compactor
from shale.export import JSONL_BLOCK_BYTES, export_topic
from shale.ledger import codecs
from shale.ledger.errors import InvalidInputError
from shale.ledger.record import Message, Record
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.producer.jsonlines import message_to_json
from shale.reader import TableView, TopicReader, latest
from shale.reader.arrow import BatchReader
from shale.reader.latest import last_of_each_key, latest_batches, latest_messages, plan_latest
from shale.reader.splits import plan_splits
from tests import objects, tamper
from tests.conftest import ROOT, run_cli
from tests.craft import build_topic
from tests.needs import need_module

pa = need_module("pyarrow")
T0 = 1_700_000_000_000
MiB = 1 << 20


def _fields(m: Message) -> tuple[Any, ...]:
    return (str(m.id), m.key, m.value, sorted(m.properties.items()), m.publish_time, m.event_time)


def _rows(table: Any) -> list[tuple[Any, ...]]:
    """A table's rows as :func:`_fields` gives a message's."""
    def ms(t: Any) -> int | None:
        return None if t is None else int(t.timestamp() * 1000)

    return [(f"{r['ledger']}:{r['entry']}:{r['batch']}", r["key"], r["value"], sorted(r["properties"]),
             ms(r["publish_time"]), ms(r["event_time"])) for r in table.to_pylist()]


def _mixed(uri: str, codec: str, seed: int = 1) -> None:
    """Small records of many sizes (some without a key, some tombstones, properties), and
    entries of four records of 3 MiB: 12 MiB decompressed each."""
    rnd = random.Random(seed)
    with TopicWriter(uri, batch_size=40, compression=codec, max_entry_bytes=16 * MiB) as w:
        for i in range(1200):
            key = None if rnd.random() < 0.05 else f"k{rnd.randrange(200)}".encode()
            value = rnd.choice([None, b"", rnd.randbytes(rnd.randrange(0, 4000)), f"v{i}".encode() * 50])
            props = {f"p{j}": "é" * j for j in range(rnd.randrange(3))}
            w.send(Record(key, value, props, T0 + i, rnd.choice([None, T0 + 7 * i])))
    with TopicWriter(uri, batch_size=4, compression=codec, max_entry_bytes=16 * MiB) as w:
        for i in range(12):
            w.append(f"big-{i % 5}", f"{seed}:{i:06d}".encode() * (3 * MiB // 9), {"n": str(i)})


@pytest.mark.parametrize("codec", ["zstd", "lz4", "none"])
def test_batches_hold_at_most_the_byte_budget(tmp_path: Path, codec: str) -> None:
    uri = str(tmp_path / "t")
    _mixed(uri, codec)
    want = [_fields(m) for m in TopicReader(uri)]
    budgets: tuple[int, ...] = (64 << 10, 1 * MiB, 5 * MiB)
    if codec == "lz4":
        # an lz4 block is decompressed whole: one bigger than the budget (and than 1 MiB) is
        # refused, naming the budget that would read it, rather than held past the bound
        with pytest.raises(InvalidInputError, match=r"is an lz4 block of 10\.\dMiB, which is read whole.*give at "
                                                    r"least 1\dMiB"):
            list(TopicReader(uri).iter_batches(rows=None, max_batch_bytes=64 << 10))
        budgets = (16 * MiB,)
    for budget in budgets:
        batches = list(TopicReader(uri).iter_batches(rows=None, max_batch_bytes=budget, id_text=True))
        for b in batches:
            # Arrow's own count of the batch's buffers; a record bigger than the budget alone
            assert b.num_rows == 1 or b.nbytes <= budget, (budget, b.num_rows, b.nbytes)
        assert sum(b.nbytes > budget for b in batches) >= (12 if budget < 3 * MiB else 0)
        assert _rows(pa.Table.from_batches(batches).drop(["id"])) == want


def test_rows_still_cap_a_batch_when_asked(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    _mixed(uri, "zstd")
    batches = list(TopicReader(uri).iter_batches(rows=7, max_batch_bytes=1 * MiB))
    assert all(b.num_rows <= 7 for b in batches)
    assert sum(b.num_rows for b in batches) == len(TopicReader(uri).read())


class _Watched(BatchReader):
    """A batch reader that records the bytes held by the pieces alive at once."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.lock = threading.Lock()
        self.alive: dict[int, int] = {}
        self.seen: list[tuple[int, int]] = []  # (pieces alive, their bytes) at each start

    def _steps(self, f: Any, records: Any, piece: Any) -> Any:
        inner = super()._steps(f, records, piece)

        def watched() -> Any:
            with self.lock:
                self.alive[id(inner)] = piece.held
                self.seen.append((len(self.alive), sum(self.alive.values())))
            try:
                yield from inner
            finally:
                with self.lock:
                    self.alive.pop(id(inner), None)
        return watched()


def test_bytes_decompressed_at_once_are_bounded_across_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    uri = str(tmp_path / "t")
    _mixed(uri, "zstd")
    whole: list[int] = []
    real = codecs.decompress

    def counted(stored: Any, codec: int, raw_length: int, *a: Any, **kw: Any) -> Any:
        whole.append(raw_length)
        return real(stored, codec, raw_length, *a, **kw)

    monkeypatch.setattr("shale.ledger.reader.decompress", counted)
    meta = TopicMetadata.open(uri)
    budget = 2 * MiB
    got = []
    for lg in meta.load_topic().ledgers:
        from shale.ledger.reader import LedgerFile

        f = LedgerFile.open(meta.topic.store, meta.topic.key(lg.object))
        with _Watched(2, max_batch_bytes=budget, chunk_bytes=64 << 10) as reader:
            got += list(reader.batches(f, np.arange(f.n_records, dtype=np.int64)))
            # pieces decoded at once across both threads: within the budget, or one alone
            assert all(n == 1 or held <= budget for n, held in reader.seen)
            assert max(n for n, _ in reader.seen) >= 1
    # the 12 MiB entries were never decompressed whole: read as streams, a batch at a time
    assert whole and max(whole) <= budget // 2
    assert _rows(pa.Table.from_batches(got)) == [_fields(m) for m in TopicReader(uri)]


def test_big_zstd_entries_read_as_streams_read_as_the_same_records_stored_plainly(tmp_path: Path) -> None:
    zstd, plain = str(tmp_path / "z"), str(tmp_path / "p")
    _mixed(zstd, "zstd")
    _mixed(plain, "none")
    for uri in (zstd, plain):
        Compactor(uri, CompactionConfig(delete_retention_ms=0, reuse_min_bytes=0)).run()
        with TopicWriter(uri, batch_size=4, compression="zstd" if uri == zstd else "none",
                         max_entry_bytes=16 * MiB) as w:
            for i in range(4):
                w.append(f"big-{i}", f"again-{i}".encode() * (3 * MiB // 7))
    def same(fields: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        return [f[:4] + f[5:] for f in fields]  # (the big records' publish times differ)

    for compacted in (False, True):
        a = [_fields(m) for m in TopicReader(zstd, read_compacted=compacted)]
        assert same(a) == same([_fields(m) for m in TopicReader(plain, read_compacted=compacted)])
    table = [_fields(m) for m in TableView(zstd).messages()]
    assert same(table) == same([_fields(m) for m in TableView(plain).messages()])
    meta = TopicMetadata.open(zstd)
    assert [_fields(m) for m in latest_messages(meta, plan_latest(meta))] == table
    assert _rows(pa.Table.from_batches(latest_batches(meta, plan_latest(meta), max_batch_bytes=1 * MiB))) == table
    assert _rows(TopicReader(zstd, read_compacted=True).to_arrow(max_batch_bytes=1 * MiB)) == [
        _fields(m) for m in TopicReader(zstd, read_compacted=True)]


# --------------------------------------------------------------------------- the table


def _random_topic(uri: str) -> None:
    """Tombstones, keyless records, compacted parts kept with deletion vectors, a tail."""
    rnd = random.Random(7)

    def produce(n: int, seed: int) -> None:
        with TopicWriter(uri, batch_size=rnd.randrange(3, 40), max_ledger_records=300) as w:
            for i in range(n):
                key = None if rnd.random() < 0.05 else f"k{rnd.randrange(150)}".encode()
                value = None if rnd.random() < 0.1 else f"v{seed}-{i}".encode()
                w.send(Record(key, value, {"s": str(seed)}, T0 + i, None))

    produce(900, 1)
    Compactor(uri, CompactionConfig(delete_retention_ms=3_600_000, retain_null_key=True)).run()
    produce(40, 2)
    Compactor(uri, CompactionConfig(delete_retention_ms=3_600_000, reuse_min_bytes=0, reuse_min_live=0.1)).run()
    produce(250, 3)


@pytest.mark.parametrize("make", [build_topic, _random_topic], ids=["fuzz-topic", "random"])
def test_the_table_in_two_passes_is_the_table_view(tmp_path: Path, make: Any) -> None:
    uri = str(tmp_path / "t")
    make(uri)
    state = TopicMetadata.open(uri).load_compaction()
    assert state.horizon is not None and any(p.deletions for p in state.parts)
    want = list(TableView(uri).messages())
    assert want and [m.id for m in want] == sorted(m.id for m in want)
    meta = TopicMetadata.open(uri)
    plan = plan_latest(meta)
    assert plan.rows == len(want)
    assert [_fields(m) for m in latest_messages(meta, plan)] == [_fields(m) for m in want]
    assert _rows(TableView(uri).to_arrow()) == [_fields(m) for m in want]
    # the commands, in every format
    r = run_cli("read", uri, "--table")
    assert r.returncode == 0, r.stderr
    assert [json.loads(line) for line in r.stdout.splitlines()] == [message_to_json(m) for m in want]
    for fmt in ("parquet", "arrow", "jsonl"):
        out = tmp_path / f"table.{fmt}"
        r = run_cli("export", uri, str(out), "--table", "--max-batch-bytes", "1KiB")
        assert r.returncode == 0, r.stderr
        if fmt == "jsonl":
            assert [json.loads(line) for line in out.read_text().splitlines()] == [message_to_json(m) for m in want]
        else:
            import pyarrow.parquet as pq

            table = pq.read_table(out) if fmt == "parquet" else pa.ipc.open_file(str(out)).read_all()
            assert _rows(table) == [_fields(m) for m in want]
            assert not any(table["tombstone"].to_pylist())


def test_the_fold_keeps_the_last_record_of_each_hash() -> None:
    rnd = np.random.default_rng(3)
    keys = rnd.integers(0, 500, 20_000)
    hi = keys.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # (wraps: a hash's spread)
    lo = (keys * 7 + 1).astype(np.uint64)
    hi[keys % 50 == 0] = np.uint64(42)  # keys sharing 64 bits of hash: told apart by the other 64
    want = sorted({int(k): i for i, k in enumerate(keys.tolist())}.values())
    assert last_of_each_key(hi, lo).tolist() == want
    assert last_of_each_key(hi[:0], lo[:0]).tolist() == []


def test_a_record_published_between_the_passes_is_not_in_the_table(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    uri = str(tmp_path / "t")
    _random_topic(uri)
    want = [_fields(m) for m in TableView(uri).messages()]
    keys = [m[1] for m in want]

    def publish(new: str) -> None:
        with TopicWriter(uri) as w:
            w.append(keys[0], "changed")  # an update of a live key
            w.append(keys[1], None)  # a tombstone of a live key
            w.append(new, "x")
        # and a compaction that replaces the view pass one planned (gc has yet to run)
        Compactor(uri, CompactionConfig(delete_retention_ms=0, reuse_min_bytes=0)).run()

    meta = TopicMetadata.open(uri)
    plan = plan_latest(meta)
    publish("brand-new")
    assert [_fields(m) for m in latest_messages(meta, plan)] == want
    assert _rows(pa.Table.from_batches(latest_batches(meta, plan))) == want
    # the same between the passes of an export
    want = [_fields(m) for m in TableView(uri).messages()]
    keys = [m[1] for m in want]
    real = latest.plan_latest

    def plan_then_publish(*a: Any, **kw: Any) -> Any:
        got = real(*a, **kw)
        publish("newer")
        return got

    monkeypatch.setattr(latest, "plan_latest", plan_then_publish)
    out = tmp_path / "table.jsonl"
    export_topic(uri, str(out), table=True)
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [m[0] for m in want]
    assert "newer" not in out.read_text()


def test_a_part_removed_before_the_second_pass_has_given_anything_is_planned_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = str(tmp_path / "t")
    _random_topic(uri)
    real = latest.plan_latest
    plans = []

    def plan_then_retire(*a: Any, **kw: Any) -> Any:
        got = real(*a, **kw)
        plans.append(got)
        if len(plans) == 1:  # a newer compaction retires the parts, and gc deletes them
            old = TopicMetadata.open(uri).load_compaction().parts
            with TopicWriter(uri) as w:
                w.append("newer", "x")
            Compactor(uri, CompactionConfig(delete_retention_ms=3_600_000, reuse_min_bytes=1 << 40)).run()
            for part in old:
                (Path(uri) / part.object).unlink()
        return got

    monkeypatch.setattr(latest, "plan_latest", plan_then_retire)
    out = tmp_path / "table.parquet"
    export_topic(uri, str(out), table=True)
    import pyarrow.parquet as pq

    assert len(plans) == 2
    assert _rows(pq.read_table(out)) == [_fields(m) for m in TableView(uri).messages()]


def test_a_table_view_as_arrow_is_as_of_its_last_refresh(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    _random_topic(uri)
    view = TableView(uri)
    before = [_fields(m) for m in view.messages()]
    with TopicWriter(uri) as w:
        w.append(before[0][1], "changed")
        w.append("brand-new", "x")
    assert _rows(view.to_arrow(max_batch_bytes=4096)) == before
    view.refresh()
    assert _rows(view.to_arrow()) == [_fields(m) for m in view.messages()] != before


# ------------------------------------------------------------------------ JSON lines


def test_json_lines_are_written_in_blocks_of_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = str(tmp_path / "t")
    with TopicWriter(uri) as w:
        for i in range(3000):
            w.append(f"k{i}", "x" * 2000)
        w.append("big", "y" * (3 * JSONL_BLOCK_BYTES))
    writes: list[int] = []
    real = shale.export._Sink.write

    def counted(self: Any, data: Any) -> int:
        writes.append(memoryview(data).nbytes)
        return real(self, data)

    monkeypatch.setattr(shale.export._Sink, "write", counted)
    for table in (False, True):
        writes.clear()
        out = tmp_path / f"out-{table}.jsonl"
        export_topic(uri, str(out), fmt="jsonl", table=table)
        lines = out.read_bytes().splitlines(keepends=True)
        assert len(lines) == 3001
        big = max(len(line) for line in lines)
        # blocks of about a MiB; the one longer line on its own
        assert all(n <= JSONL_BLOCK_BYTES or n == big - 1 for n in writes), sorted(writes)[-3:]
        assert len(writes) >= 6_000_000 // JSONL_BLOCK_BYTES


# ---------------------------------------------------------------- commands and settings


def test_the_setting_is_a_flag_and_a_variable_and_is_checked(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    uri = str(tmp_path / "t")
    with TopicWriter(uri) as w:
        for i in range(400):
            w.append(f"k{i}", "v" * 100)
    out = tmp_path / "x.parquet"
    assert run_cli("export", uri, str(out)).returncode == 0
    assert pq.ParquetFile(out).num_row_groups == 1
    out = tmp_path / "small-batches.parquet"
    r = run_cli("export", uri, str(out), env={"SHALE_MAX_BATCH_BYTES": "4KiB"})
    assert r.returncode == 0, r.stderr
    assert pq.ParquetFile(out).num_row_groups >= 400 * 200 // 4096  # each batch a row group
    assert pq.read_table(out).num_rows == 400
    for argv in (["export", uri, str(tmp_path / "y.parquet")], ["read", uri, "--table"]):
        r = run_cli(*argv, "--max-batch-bytes", "0")
        assert r.returncode == 2 and "--max-batch-bytes" in r.stderr and len(r.stderr.splitlines()) == 1
    r = run_cli("read", uri, "--table", "--max-batch-bytes", "1KiB", "--limit", "3")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 3


def test_the_spark_source_reads_batches_within_its_budget(tmp_path: Path) -> None:
    need_module("pyspark")
    from shale.spark.source import ReadOptions, read_partition

    uri = str(tmp_path / "t")
    _mixed(uri, "zstd")
    opts = ReadOptions.of({"path": uri, "maxBatchBytes": "1MiB", "batchRows": "100000"})
    assert opts.max_batch_bytes == MiB
    batches = [b for s in plan_splits(TopicMetadata.open(uri), compacted=False)
               for b in read_partition(opts, s)]
    assert all(b.num_rows == 1 or b.nbytes <= MiB for b in batches)
    assert sum(b.num_rows for b in batches) == len(TopicReader(uri).read())
    with pytest.raises(ValueError, match="maxBatchBytes"):
        ReadOptions.of({"path": uri, "maxBatchBytes": "lots"})


# ------------------------------------------------------------------------ hostile frames


def _big_entry_topic(uri: str) -> tuple[str, objects.Parsed]:
    with TopicWriter(uri, batch_size=4, compression="zstd", max_entry_bytes=16 * MiB) as w:
        for i in range(8):
            w.append(f"k{i}", f"{i:04d}".encode() * (3 * MiB // 4))
    name = TopicMetadata.open(uri).load_topic().ledgers[0].object
    return name, objects.parse(tamper.read_raw(uri, name))


@pytest.mark.parametrize("lie", ["trailing bytes", "cut short", "other content", "checksum", "names a dictionary"])
def test_a_big_frame_that_lies_is_refused_by_every_reader(tmp_path: Path, lie: str) -> None:
    import zstandard

    uri = str(tmp_path / "t")
    name, p = _big_entry_topic(uri)
    good = p.payloads[1]
    raw = zstandard.ZstdDecompressor().decompress(good)
    if lie == "trailing bytes":
        p.payloads[1] = good + b"more"
        expect = "4 bytes after its zstd frame"
    elif lie == "cut short":
        p.payloads[1] = good[:-64]
        expect = "not one whole zstd frame"
    elif lie == "checksum":  # the frame's own content checksum no longer matches what it holds
        assert zstandard.get_frame_parameters(good).has_checksum
        p.payloads[1] = good[:-4] + bytes(b ^ 0xFF for b in good[-4:])
        expect = "does not decompress with zstd"
    elif lie == "names a dictionary":  # stored as plain zstd, its frame asks for a dictionary
        d = zstandard.train_dictionary(4096, [raw[i:i + 512] + bytes([i % 251]) for i in range(0, 1 << 20, 512)])
        p.payloads[1] = zstandard.ZstdCompressor(dict_data=d, write_content_size=True).compress(raw)
        expect = f"names dictionary {d.dict_id()}"
    else:  # records that are not records, of the size the footer says
        p.payloads[1] = zstandard.ZstdCompressor(write_content_size=True).compress(raw[::-1])
        expect = "record"
    tamper.write_raw(uri, name, objects.build(p))
    out = tmp_path / "x.parquet"
    # (entries of 12 MiB: read as streams by every reader at these settings)
    for argv in (["read", uri], ["read", uri, "--table"], ["export", uri, str(out), "--max-batch-bytes", "4MiB"],
                 ["export", uri, str(out), "--table", "--max-batch-bytes", "4MiB"]):
        r = run_cli(*argv)
        assert r.returncode == 4, (argv, r.stderr)
        assert expect in r.stderr and name in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not out.exists()


# ------------------------------------------------------------------------ peak memory


#: Runs a command and prints its peak resident set size (kB) and exit code.  A child
#: forked from a big process counts that process's pages as its own peak, even after it
#: execs: the command is started from this small process instead.
_MEASURE = ("import os, subprocess, sys; c = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL); "
            "_, s, u = os.wait4(c.pid, 0); print(u.ru_maxrss, os.waitstatus_to_exitcode(s))")


def _peak_rss(*argv: str) -> int:
    """Peak resident set size (bytes) of ``shale ARGV``, run as a process of its own."""
    r = subprocess.run([sys.executable, "-c", _MEASURE, sys.executable, "-m", "shale.cli", *argv],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    kb, code = map(int, r.stdout.split())
    assert code == 0, r.stderr
    return kb * 1024


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SHALE_LONG_TESTS") != "1",
                    reason="builds a topic of 1 GB decompressed (about 20 s): SHALE_LONG_TESTS=1 runs it; "
                    "bench/memory_bytes.py measures the same at several sizes")
def test_peak_memory_follows_neither_the_topic_nor_its_entries(tmp_path: Path) -> None:
    """A topic of 1 GiB decompressed and a few KB stored: 4 entries of 4 records of 63 MiB
    (the reader once held every entry of a chunk, and the table whole: 2 GB and more).
    The bound is generous (bench/memory_bytes.py has the figures)."""
    uri = str(tmp_path / "t")
    with TopicWriter(uri, batch_size=4, compression="zstd", max_entry_bytes=256 * MiB,
                     max_ledger_bytes=1 << 40) as w:
        for i in range(16):
            w.append(f"k{i}", b"0123456789abcdef" * (63 * MiB // 16))
    assert sum(f.stat().st_size for f in Path(uri).rglob("*.ledger")) < MiB
    bound = 800_000_000
    for argv in (["export", uri, str(tmp_path / "x.parquet")], ["export", uri, str(tmp_path / "x.jsonl")],
                 ["export", uri, str(tmp_path / "t.arrow"), "--table"], ["read", uri, "--table"]):
        assert _peak_rss(*argv) < bound, argv
