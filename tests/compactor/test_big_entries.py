"""Pass two's big entries, copied as they are read (:mod:`shale.compactor.big_entries`),
and what ``--max-memory`` counts for them (:mod:`shale.compactor.budget`).

A run whose reads hold less than an entry copies it alone, as a stream: what it publishes
is what a run copying whole entries publishes, whatever the codecs, and a frame that does
not decode as its footer says is refused the same way, nothing published.  A bound too
small for the biggest entry is refused before anything is read, naming the entry and the
least bound, which then holds the run.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from shale.compactor import CompactionConfig, Compactor
from shale.compactor.budget import BigEntry, Footprint, big_entry_bytes, least_memory, memory_budget
from shale.ledger.codecs import Codec, parse_compression
from shale.ledger.errors import CorruptLedgerError, InvalidInputError
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from tests import objects, tamper
from tests.compactor.test_copied_entries import HOSTILE, lie
from tests.compactor.test_copied_entries import produce as produce_small
from tests.conftest import run_cli_here

MiB = 1 << 20
#: a read holds this much decompressed: every entry below is bigger
STREAMS = dict(chunk_raw_bytes=1024)


def produce(uri: str, seed: int, n: int, keys: int, compression: str) -> None:
    """``n`` records of ``keys`` keys (some tombstones), 20 to an entry of a few KB."""
    rnd = random.Random(seed)
    with TopicWriter(uri, batch_size=20, max_ledger_records=300, compression=compression,
                     clock=lambda: 1_700_000_000.0 + seed) as w:
        for i in range(n):
            key = f"key-{rnd.randrange(keys):05d}"
            value = None if rnd.random() < 0.05 else f"v{seed}-{i}-" + "x" * rnd.randrange(50, 400)
            w.append(key, value)


def view(uri: str) -> list[tuple[str, Any, Any]]:
    with TopicReader(uri, read_compacted=True) as r:
        return [(str(m.id), m.key, m.value) for m in r.read()]


@pytest.mark.parametrize("written", ["zstd", "lz4", "none"])
@pytest.mark.parametrize("stored", ["zstd", "lz4", "none"])
def test_streamed_copies_publish_what_batched_ones_do(tmp_path: Path, stored: str, written: str) -> None:
    """Entries kept whole (the first run: mostly distinct keys) and partly (the second),
    copied as streams, give the same view as the same runs copying whole reads; the
    parts pass a scrub; an entry kept whole keeps its stored bytes."""
    streams, batches = str(tmp_path / "s"), str(tmp_path / "b")
    for rnd, (n, keys) in enumerate(((600, 100_000), (400, 300))):
        for uri in (streams, batches):
            produce(uri, rnd, n, keys, stored)
        for uri, extra in ((streams, STREAMS), (batches, {})):
            cfg = CompactionConfig(delete_retention_ms=0, compression=parse_compression(written), **extra)
            assert Compactor(uri, cfg).run().status == "compacted"
        assert view(streams) == view(batches)
        r = run_cli_here("verify", streams, "--scrub")
        assert r.returncode == 0, r.stdout + r.stderr
    meta = TopicMetadata.open(streams)
    ledger = objects.parse(tamper.read_raw(streams, meta.load_topic().ledgers[-1].object))
    parts = [objects.parse(tamper.read_raw(streams, p.object)) for p in meta.load_compaction().parts]
    if stored != "none":
        assert any(payload in p.payloads for p in parts for payload in ledger.payloads)


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_streamed_entry_that_does_not_decode_as_its_footer_says_is_refused(tmp_path: Path, kind: str) -> None:
    """Every hostile frame of ``test_copied_entries`` (every checksum right), in an entry
    kept whole: refused naming the object, and nothing published."""
    uri = str(tmp_path / "t")
    produce_small(uri)
    name = lie(uri, kind)
    before = tamper.snapshot(uri)
    for written in ("zstd", "none"):
        cfg = CompactionConfig(compression=parse_compression(written), **STREAMS)
        with pytest.raises(CorruptLedgerError, match="compressed entry") as e:
            Compactor(uri, cfg).run()
        assert name in str(e.value)
        assert tamper.snapshot(uri) == before


@pytest.mark.parametrize("stored", ["zstd", "none"])
@pytest.mark.parametrize("kept", ["whole", "partly"])
def test_a_streamed_frame_whose_checksum_fails_is_refused(tmp_path: Path, stored: str, kept: str) -> None:
    """A byte changed in an entry's last stored bytes, its frame's checksum left as it
    was: the stream finds it once read to the end, before the part is closed (an entry
    kept whole has gone to the part piece by piece by then), and nothing is published."""
    uri = str(tmp_path / "t")
    with TopicWriter(uri, batch_size=20, compression=stored) as w:
        for i in range(300):
            w.append(f"key-{i:03d}", f"value-{i}-" + "x" * 300)
        for i in range(60, 70) if kept == "partly" else ():  # (half of entry 3's keys written again)
            w.append(f"key-{i:03d}", "newer")
    name = TopicMetadata.open(uri).load_topic().ledgers[0].object
    data = bytearray(tamper.read_raw(uri, name))
    p = objects.parse(bytes(data))
    data[int(p.cols["e_offset"][3]) + int(p.cols["e_length"][3]) - 2] ^= 0x40
    tamper.write_raw(uri, name, bytes(data))
    before = tamper.snapshot(uri)
    # (zstd may find it first, by the frame's own content checksum)
    why = r"entry 1:3 at byte \d+: checksum mismatch"
    if stored == "zstd":
        why += "|entry 1:3: .*doesn't match checksum"
    with pytest.raises(CorruptLedgerError, match=why):
        Compactor(uri, CompactionConfig(delete_retention_ms=0, **STREAMS)).run()
    assert tamper.snapshot(uri) == before


def test_a_streamed_entry_whose_footer_moves_a_record_boundary_is_refused(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    produce_small(uri)
    name = TopicMetadata.open(uri).load_topic().ledgers[0].object
    p = objects.parse(tamper.read_raw(uri, name))
    r = 2 * 50 + 3
    p.cols["r_size"][r] += 1
    p.cols["r_offset"][r + 1] += 1
    p.cols["r_size"][r + 1] -= 1
    tamper.write_raw(uri, name, objects.build(p))
    with pytest.raises(CorruptLedgerError, match="of its decompressed payload"):
        Compactor(str(uri), CompactionConfig(**STREAMS)).run()


def _footprint(uri: str) -> Footprint:
    from shale.compactor.plan import make_plan

    plan = make_plan(TopicMetadata.open(uri), now_ms=2_000_000_000_000, min_compaction_lag_ms=0, footers=True)
    return Footprint.of(plan)


def produce_big(uri: str, codec: str, records: int = 4, size: int = 8 * MiB, level: str = "") -> None:
    """One entry of ``records`` records of ``size`` bytes of text, a key each."""
    with TopicWriter(uri, compression=codec + level, batch_size=records, max_entry_bytes=256 * MiB,
                     max_ledger_bytes=1 << 40) as w:
        for i in range(records):
            w.append(f"key-{i}", (b"%08d" % i * (size // 8))[:size])


def test_the_footers_say_what_a_big_entry_holds(tmp_path: Path) -> None:
    """Its biggest record; for zstd the window its frame's header declares (read while
    planning), not its content; for lz4 the block whole, stored and decompressed."""
    for codec, level in (("zstd", ":1"), ("zstd", ":19"), ("lz4", ""), ("none", "")):
        uri = str(tmp_path / f"{codec}{level}")
        produce_big(uri, codec, level=level)
        (big,) = _footprint(uri).big
        assert big.raw > 32 * MiB and big.record > 8 * MiB and "entry 1:0" in big.where
        if codec == "zstd":
            assert big.codec == Codec.ZSTD and big.held < 16 * MiB  # (level 1: 512 KiB, level 19: 8 MiB)
        elif codec == "lz4":
            assert big.held > big.raw
        else:
            assert big.held < MiB


def test_a_bound_too_small_for_a_big_entry_is_refused_with_the_least_that_would_do(tmp_path: Path) -> None:
    """Refused before anything is read (exit 2, one line naming the object and the entry),
    then compacted at the least bound it names; the budget never gives a process less
    than the biggest entry takes."""
    uri = str(tmp_path / "t")
    produce_big(uri, "zstd", size=40 * MiB)
    fp = _footprint(uri)
    least = least_memory(CompactionConfig(), fp)
    assert 40 < least < 48
    before = tamper.snapshot(uri)
    r = run_cli_here(uri, "--max-memory", f"{least - 1}MiB", script="compact")
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, line
    assert name_of(uri) in line and "entry 1:0" in line and f"give at least {least}MiB" in line, line
    assert tamper.snapshot(uri) == before
    r = run_cli_here(uri, "--max-memory", f"{least}MiB", script="compact")
    assert r.returncode == 0, r.stderr
    assert [(m.key, len(m.value or b"")) for m in TopicReader(uri, read_compacted=True).read()] == [
        (b"key-%d" % i, 40 * MiB) for i in range(4)]
    for setting in (least, 2 * least, 8 * least):
        b = memory_budget(CompactionConfig(max_memory=setting * MiB, workers=4), fp)
        share = (setting * MiB - fp.bytes) // b.processes
        assert all(big_entry_bytes(e, CompactionConfig().compression) <= share
                   for e in fp.big if e.raw > b.chunk_raw_bytes)


def test_the_least_bound_is_the_least() -> None:
    fp = Footprint(1_000, 1_000, 0, (BigEntry(200 * MiB, 60 * MiB, 3 * MiB, "x: entry 1:0", Codec.ZSTD),
                                     BigEntry(100 * MiB, 20 * MiB, 90 * MiB, "x: entry 1:1", Codec.LZ4)))
    cfg = CompactionConfig()
    least = least_memory(cfg, fp)
    memory_budget(CompactionConfig(max_memory=least * MiB), fp)
    with pytest.raises(InvalidInputError, match=f"entry 1:1 .*give at least {least}MiB"):
        memory_budget(CompactionConfig(max_memory=(least - 1) * MiB), fp)


def name_of(uri: str) -> str:
    return TopicMetadata.open(uri).load_topic().ledgers[0].object


def test_event_times_decoded_from_big_entries_order_the_run_as_batches_do(tmp_path: Path) -> None:
    """Under event-time order, objects whose footers give no event times (format
    version 2) have them decoded in pass one: a big entry as a stream, a group of records
    at a time, to the same result."""
    from tests.compactor.test_event_times import produce as produce_timed
    from tests.compactor.test_event_times import rewrite_as_version_2

    streams, batches = str(tmp_path / "s"), str(tmp_path / "b")
    for uri in (streams, batches):
        produce_timed(uri, 1, 600)
        rewrite_as_version_2(uri, [lg.object for lg in TopicMetadata.open(uri).load_topic().ledgers])
    for uri, extra in ((streams, dict(chunk_raw_bytes=256)), (batches, {})):
        cfg = CompactionConfig(order="event-time", delete_retention_ms=0, **extra)  # type: ignore[arg-type]
        assert Compactor(uri, cfg).run().status == "compacted"
    assert view(streams) == view(batches)


@pytest.mark.parametrize("written", ["zstd", "lz4", "none"])
def test_big_survivors_of_a_partly_kept_entry_are_compressed_as_streams(tmp_path: Path, written: str) -> None:
    """Records of 3 MiB (more than a group) surviving in a partly kept big entry: with
    zstd each is compressed as a stream, twice, into an entry of its own (small, as the
    text compresses); a run writing lz4 keeps them as they are; the view is whole."""
    uri = str(tmp_path / "t")
    produce_big(uri, "zstd", size=3 * MiB)
    with TopicWriter(uri) as w:
        w.append("key-1", "newer")
    cfg = CompactionConfig(delete_retention_ms=0, compression=parse_compression(written), chunk_raw_bytes=MiB)
    assert Compactor(uri, cfg).run().status == "compacted"
    got = [(m.key, m.value) for m in TopicReader(uri, read_compacted=True).read()]
    want = [(b"key-%d" % i, (b"%08d" % i * (3 * MiB // 8))[:3 * MiB]) for i in (0, 2, 3)]
    assert got == [*want, (b"key-1", b"newer")]
    (part,) = TopicMetadata.open(uri).load_compaction().parts
    p = objects.parse(tamper.read_raw(uri, part.object))
    big = [i for i, n in enumerate(p.cols["e_raw_length"].tolist()) if n >= 3 * MiB]
    assert len(big) == 3
    want = {"zstd": Codec.ZSTD, "lz4": Codec.NONE, "none": Codec.NONE}[written]
    assert all(int(p.cols["e_codec"][i]) == want for i in big)
    if written == "zstd":
        assert all(len(p.payloads[i]) < 64 << 10 for i in big)
