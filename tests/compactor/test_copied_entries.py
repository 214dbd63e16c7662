"""Compressed entries that compaction copies whole, stored bytes unchanged: each is first
proven to decompress to exactly what its footer says, so nothing undecodable is ever
published, and a retention policy never removes the last decodable copy of a record.

Every hostile frame here keeps every checksum right (``tests/objects.py`` rebuilds the
object around it) and sits in an entry all of whose records are the latest of their keys,
the entries a compaction copies as they are stored."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lz4.block
import pytest
import zstandard

from shale.compactor import CompactionConfig, Compactor
from shale.ledger.codecs import Codec, decompress, parse_compression
from shale.ledger.errors import CorruptLedgerError
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TableView, TopicReader
from tests import objects, tamper
from tests.conftest import local_spark, run_cli, run_cli_here

#: Records per entry, and the entry of the first ledger that is lied about.
BATCH = 50
ENTRY = 2


def produce(uri: str, n: int = 400, *, first: int = 0, compression: str = "zstd") -> None:
    """``n`` records of distinct keys (every record survives a compaction), about 6 KB
    an entry decompressed: big enough to be copied whole rather than packed."""
    with TopicWriter(uri, batch_size=BATCH, max_ledger_records=200, compression=compression) as w:
        for i in range(first, first + n):
            w.append(f"key-{i:06d}", f"value-{i:06d}-" + "v" * 100)


def _zstd(raw: bytes, **kw: Any) -> bytes:
    kw.setdefault("write_content_size", True)
    return zstandard.ZstdCompressor(level=1, **kw).compress(raw)


def _declaring(raw: bytes, size: int) -> bytes:
    """A zstd frame of ``raw`` whose header declares ``size`` bytes of content."""
    frame = _zstd(raw, write_content_size=False)
    fhd = frame[4]
    assert fhd & 0xE3 == 0  # no content size, a window descriptor, no dictionary id
    return frame[:4] + bytes([fhd | 0xC0]) + frame[4 + 1:4 + 2] + struct.pack("<Q", size) + frame[4 + 2:]


#: name -> (stored payload, codec) made from the entry's decompressed payload and its
#: stored bytes; and what the one line of the refusal says
HOSTILE: dict[str, tuple[Callable[[bytes, bytes], tuple[bytes, int]], str]] = {
    "content size other than the footer's": (lambda raw, st: (_zstd(raw + b"x"), Codec.ZSTD), "declares"),
    "no content size": (lambda raw, st: (_zstd(raw, write_content_size=False), Codec.ZSTD),
                        "declares no decompressed bytes"),
    "content size 2^40": (lambda raw, st: (_declaring(raw, 1 << 40), Codec.ZSTD), "declares 1099511627776"),
    "garbage of the same size": (lambda raw, st: (random.Random(7).randbytes(len(st)), Codec.ZSTD),
                                 "is not a zstd frame"),
    "not a frame": (lambda raw, st: (raw, Codec.ZSTD), "is not a zstd frame"),
    "bytes after the frame": (lambda raw, st: (st + b"\0" * 8, Codec.ZSTD), "8 bytes of unused data"),
    "a second frame after the frame": (lambda raw, st: (st + _zstd(b"more"), Codec.ZSTD), "unused data"),
    "content checksum changed": (lambda raw, st: (st[:-1] + bytes([st[-1] ^ 1]), Codec.ZSTD),
                                 "doesn't match checksum"),
    "lz4 short output": (lambda raw, st: (lz4.block.compress(raw[:-7], store_size=False), Codec.LZ4),
                         "decompresses to"),
    "lz4 bytes after the block": (lambda raw, st: (lz4.block.compress(raw, store_size=False) + b"tail", Codec.LZ4),
                                  "does not decompress with lz4"),
    "zstd-dict with no dictionary": (lambda raw, st: (st, Codec.ZSTD_DICT), "names no dictionary"),
}


def lie(uri: str, kind: str, ledger: int = 0, entry: int = ENTRY) -> str:
    """Replace entry ``entry`` of ledger ``ledger`` by the hostile frame ``kind``, every
    checksum right; the object's name."""
    meta = TopicMetadata.open(uri)
    name = meta.load_topic().ledgers[ledger].object
    p = objects.parse(tamper.read_raw(uri, name))
    assert p.cols["e_codec"][entry] == Codec.ZSTD
    raw = bytes(decompress(p.payloads[entry], Codec.ZSTD, int(p.cols["e_raw_length"][entry]), "test"))
    make, _ = HOSTILE[kind]
    p.payloads[entry], p.cols["e_codec"][entry] = make(raw, p.payloads[entry])
    tamper.write_raw(uri, name, objects.build(p))
    return name


def refused(uri: str, why: str, name: str, *flags: str, run: Callable[..., Any] = run_cli) -> None:
    """``compact`` refuses in one line (exit 4) naming the object and why, and publishes
    nothing: the topic's objects are all as they were, retention policy or not."""
    before = tamper.snapshot(uri)
    r = run(uri, *flags, script="compact")
    assert r.returncode == 4, r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and name in line and why in line and "Traceback" not in line, line
    assert tamper.snapshot(uri) == before


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("written", ["zstd", "none"])
def test_compaction_refuses_a_compressed_entry_that_does_not_decode_as_its_footer_says(tmp_path: Path, kind: str,
                                                                                        written: str) -> None:
    """Whether the run writes compressed entries (whole entries kept among packed ones)
    or uncompressed ones (whole entries copied as they are), with a retention policy
    that would remove every compacted ledger after a publish.  (The commands run in this
    process; the tests below run them as processes, whose standard error is one line.)"""
    uri = str(tmp_path / "t")
    produce(uri)
    assert run_cli_here("config", uri, "--set", "retention=1ms").returncode == 0
    name = lie(uri, kind)
    refused(uri, HOSTILE[kind][1], name, "--compression", written, run=run_cli_here)
    # every record outside the entry is still readable where it was
    records = TopicReader(uri, start=f"1:{ENTRY + 1}:0").read()
    assert len(records) == 400 - (ENTRY + 1) * BATCH
    if written != "zstd":
        return  # (nothing was published: what readers say does not depend on the run's codec)
    # and readers agree with compaction
    for args in (("read", uri), ("read", uri, "--compacted"), ("verify", uri, "--scrub")):
        r = run_cli_here(*args)
        assert r.returncode == 4 and name in r.stdout + r.stderr, (args, r.stdout, r.stderr)


def test_the_refusal_holds_on_s3_and_for_every_reader(disk_topic_uri: str) -> None:
    uri = disk_topic_uri
    produce(uri)
    assert run_cli("compact", uri).returncode == 0
    produce(uri, first=400)
    assert run_cli("config", uri, "--set", "retention=1ms").returncode == 0
    name = lie(uri, "bytes after the frame", ledger=-1)
    refused(uri, "unused data", name)
    key = f"key-{400 + 200 + ENTRY * BATCH:06d}"  # a record of the entry lied about
    for args in (("read", uri, "--compacted"), ("read", uri, "--table"), ("get", uri, key), ("verify", uri, "--scrub")):
        r = run_cli(*args)
        assert r.returncode == 4 and name in r.stdout + r.stderr, (args, r.stdout, r.stderr)
    with pytest.raises(CorruptLedgerError, match="unused data"):
        len(TableView(uri))


def test_a_whole_compressed_entry_whose_footer_moves_a_record_boundary_is_refused(tmp_path: Path) -> None:
    """Every record of a compressed entry copied whole is checked where its footer puts
    it, as the records of an uncompressed one are."""
    uri = str(tmp_path / "t")
    produce(uri)
    name = TopicMetadata.open(uri).load_topic().ledgers[0].object
    p = objects.parse(tamper.read_raw(uri, name))
    r = ENTRY * BATCH + 3
    p.cols["r_size"][r] += 1
    p.cols["r_offset"][r + 1] += 1
    p.cols["r_size"][r + 1] -= 1
    tamper.write_raw(uri, name, objects.build(p))
    for written in ("zstd", "none"):
        refused(uri, "of its decompressed payload", name, "--compression", written)


def test_healthy_whole_entries_are_copied_as_they_are_stored(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    produce(uri)
    meta = TopicMetadata.open(uri)
    ledger = objects.parse(tamper.read_raw(uri, meta.load_topic().ledgers[0].object))
    Compactor(uri, CompactionConfig(delete_retention_ms=0)).run()
    (part,) = meta.load_compaction().parts
    compacted = objects.parse(tamper.read_raw(uri, part.object))
    assert ledger.payloads[0] in compacted.payloads  # stored bytes unchanged
    assert zstandard.get_frame_parameters(ledger.payloads[0]).has_checksum  # new frames carry zstd's checksum
    assert [m.value for m in TopicReader(uri, read_compacted=True).read()] == [
        f"value-{i:06d}-".encode() + b"v" * 100 for i in range(400)]


def test_frames_written_without_a_content_checksum_stay_readable(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    produce(uri)
    name = TopicMetadata.open(uri).load_topic().ledgers[0].object
    p = objects.parse(tamper.read_raw(uri, name))
    for e, stored in enumerate(p.payloads):
        raw = zstandard.ZstdDecompressor().decompress(stored)
        p.payloads[e] = _zstd(raw, write_checksum=False)
        assert not zstandard.get_frame_parameters(p.payloads[e]).has_checksum
    tamper.write_raw(uri, name, objects.build(p))
    assert run_cli("compact", uri).returncode == 0
    assert len(TopicReader(uri, read_compacted=True).read()) == 400
    r = run_cli("verify", uri, "--scrub")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_the_spark_engine_refuses_it_too(tmp_path: Path) -> None:
    """The Spark engine's pass two copies through the same code: a task that meets the
    frame fails the run, which publishes nothing and leaves nothing behind."""
    from shale.compactor.spark import SparkOptions
    from shale.compactor.spark.engine import SparkEngine

    uri = str(tmp_path / "t")
    produce(uri)
    produce(uri, first=400)
    name = lie(uri, "content size other than the footer's", ledger=2)
    before = tamper.snapshot(uri)
    engine = SparkEngine(SparkOptions(master="local[2]", split_bytes=1 << 16, split_records=100,
                                      conf=(("spark.ui.enabled", "false"),)), session=local_spark())
    try:
        for written in ("zstd", "none"):
            config = CompactionConfig(delete_retention_ms=0, compression=parse_compression(written))
            with pytest.raises(CorruptLedgerError, match=f"{name.split('/')[-1]}.*declares"):
                Compactor(uri, config, engine=engine).run()
            assert tamper.snapshot(uri) == before
    finally:
        engine.close()
