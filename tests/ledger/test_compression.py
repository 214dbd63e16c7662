"""Compressed topics: entries stored with lz4 or zstd (format version 2), topics that mix
codecs and format versions, compaction's packing of survivors, and hostile compressed
entries."""

from __future__ import annotations

import json
import os
import random
from typing import Any

import numpy as np
import pytest

from shale.compactor import CompactionConfig, Compactor
from shale.ledger import codecs
from shale.ledger.codecs import (
    DEFAULT_COMPRESSION,
    MAX_RAW_ENTRY_BYTES,
    Codec,
    Compression,
    compress,
    decompress,
    parse_compression,
)
from shale.ledger.errors import CorruptLedgerError, InvalidInputError, InvalidMetadataError, UnsupportedVersionError
from shale.ledger.format import FORMAT_VERSION, KIND_COMPACTED, KIND_ORIGINAL
from shale.ledger.ids import MessageId
from shale.ledger.reader import LedgerFile
from shale.ledger.record import Message, Record
from shale.ledger.writer import LedgerWriter, encode_entry
from shale.maintenance.verify import verify_topic
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TableView, TopicReader
from shale.storage import resolve
from tests import objects, tamper
from tests.conftest import run_cli_here

CODECS = ["none", "lz4", "zstd", "zstd:9"]


def _rows(n: int, keys: int, seed: int) -> list[tuple[str, str | None]]:
    """Change-capture-like JSON rows: compressible, but not trivially."""
    rng = random.Random(seed)
    out: list[tuple[str, str | None]] = []
    for i in range(n):
        k = rng.randrange(keys)
        if rng.random() < 0.03:
            out.append((f"user-{k}", None))
            continue
        doc = {"id": k, "name": f"name-{rng.randrange(10_000)}", "email": f"u{k}@example.com",
               "status": rng.choice(["active", "invited", "suspended"]), "seq": i,
               "note": os.urandom(rng.randrange(0, 12)).hex()}
        out.append((f"user-{k}", json.dumps(doc)))
    return out


def _produce(uri: str, rows: list[tuple[str, str | None]], **kw: Any) -> None:
    opts: dict[str, Any] = {"batch_size": 20, "max_ledger_records": 400, **kw}
    with TopicWriter(uri, **opts) as w:
        for k, v in rows:
            w.append(k, v, {"src": "cdc"} if v and len(v) % 3 == 0 else None)


def _rewrite(uri: str, name: str, change: Any) -> None:
    """Replace object ``name`` of the topic with ``change(its bytes)``, on any store."""
    loc = TopicMetadata.open(uri).topic
    loc.store.put(loc.key(name), change(loc.store.get(loc.key(name))))


def _view(uri: str) -> list[tuple[MessageId, bytes | None, bytes | None, dict[str, str]]]:
    return [(m.id, m.key, m.value, dict(m.properties)) for m in TopicReader(uri, read_compacted=True)]


def _codecs_of(uri: str) -> set[int]:
    meta = TopicMetadata.open(uri)
    loc = meta.topic
    found: set[int] = set()
    for lg in meta.load_topic().ledgers:
        found |= set(LedgerFile.open(loc.store, loc.key(lg.object)).footer.codecs().tolist())
    for p in meta.load_compaction().parts:
        found |= set(LedgerFile.open(loc.store, loc.key(p.object)).footer.codecs().tolist())
    return found


# ------------------------------------------------------------------------ the codecs


def test_compression_names_parse_and_bad_ones_are_refused_in_words() -> None:
    assert parse_compression("zstd") == Compression(Codec.ZSTD, 1) == DEFAULT_COMPRESSION
    assert parse_compression(" ZSTD:7 ") == Compression(Codec.ZSTD, 7)
    assert parse_compression("lz4") == Compression(Codec.LZ4)
    assert parse_compression("none") == Compression()
    assert [str(parse_compression(t)) for t in ("zstd:3", "lz4", "none")] == ["zstd:3", "lz4", "none"]
    for bad, why in (("gzip", "unknown compression"), ("zstd:0", "from 1 to 22"), ("zstd:23", "from 1 to 22"),
                     ("lz4:3", "takes no level"), ("zstd:x", "whole number"), ("", "unknown compression")):
        with pytest.raises(InvalidInputError, match=why):
            parse_compression(bad)


@pytest.mark.parametrize("name", CODECS[1:])
def test_each_codec_round_trips_and_incompressible_payloads_stay_as_they_are(name: str) -> None:
    payload = b"".join(json.dumps({"n": i, "v": "abc" * (i % 7)}).encode() for i in range(300))
    codec, stored = compress(payload, parse_compression(name))
    assert codec == parse_compression(name).codec and len(stored) < len(payload) // 3
    assert bytes(decompress(stored, codec, len(payload), "t")) == payload
    noise = os.urandom(5000)
    codec, stored = compress(noise, parse_compression(name))
    assert codec == Codec.NONE and bytes(stored) == noise


def test_a_zstd_frame_that_declares_more_than_the_footer_is_refused_before_it_is_decompressed() -> None:
    bomb = codecs._CONTEXTS.zstd_compressor(1).compress(b"\0" * (64 << 20))  # type: ignore[attr-defined]
    assert len(bomb) < 10_000
    with pytest.raises(CorruptLedgerError, match="declares 67108864 decompressed bytes, the footer 100"):
        decompress(bomb, Codec.ZSTD, 100, "obj: entry 1:0")
    with pytest.raises(CorruptLedgerError, match="does not decompress with lz4"):
        decompress(compress(b"x" * 100_000, Compression(Codec.LZ4))[1], Codec.LZ4, 1000, "obj")
    import lz4.block

    with pytest.raises(CorruptLedgerError, match="decompresses to 10 bytes, the footer says 20"):
        decompress(lz4.block.compress(b"y" * 10, store_size=False), Codec.LZ4, 20, "obj")


# ------------------------------------------------------------------------ the format


def test_a_ledger_records_each_entrys_codec_and_size_and_may_mix_codecs() -> None:
    import io

    buf = io.BytesIO()
    w = LedgerWriter(buf, kind=KIND_ORIGINAL, ledger_id=3, created_ms=5)
    batches = []
    for i, name in enumerate(["none", "lz4", "zstd", "zstd:5"]):
        w.compression = parse_compression(name)
        recs = [Record(f"k{j}".encode(), json.dumps({"i": i, "j": j, "pad": "p" * 40}).encode(), {"a": "b"}, 7)
                for j in range(30)]
        batches.append(recs)
        w.add_entry(encode_entry(recs))
    w.finish()
    data = buf.getvalue()
    assert int.from_bytes(data[8:10], "little") == FORMAT_VERSION == 3
    store = resolve("memory://fmt-mix/x").store
    store.put("t/l", data)
    f = LedgerFile.open(store, "t/l", ledger_id=3, kind=KIND_ORIGINAL)
    assert f.footer.codecs().tolist() == [Codec.NONE, Codec.LZ4, Codec.ZSTD, Codec.ZSTD]
    assert f.footer.raw_lengths().tolist() == [len(encode_entry(b).payload) for b in batches]
    assert w.bytes_saved == sum(f.footer.raw_lengths()) - sum(int(x) - 12 for x in f.footer.col("e_length"))
    got = list(f.messages())
    assert [(m.key, m.value) for m in got] == [(r.key, r.value) for b in batches for r in b]
    assert got[31].id == MessageId(3, 1, 1)
    # a seek into a compressed entry decompresses that entry only
    calls: list[int] = []
    real = codecs.decompress

    def counting(*a: Any, **k: Any) -> Any:
        calls.append(a[1])
        return real(*a, **k)

    import shale.ledger.reader as reader_module

    reader_module.decompress = counting  # type: ignore[assignment]
    try:
        m = next(f.messages(f.find(MessageId(3, 2, 17))))
    finally:
        reader_module.decompress = real
    assert m.id == MessageId(3, 2, 17) and calls == [Codec.ZSTD]


# ------------------------------------------------------------------ topics, every backend


def test_mixed_codec_and_version_topics_compact_to_the_same_content_as_uncompressed(topic_uri: str) -> None:
    """A topic produced in turns with every codec, one of its ledgers and its first
    compacted part rewritten as an older Shale wrote them (format version 1), compacts
    to the same view as the same records produced and compacted uncompressed."""
    plain = topic_uri.replace("/orders", "/plain")
    rows = _rows(2400, 300, seed=1)
    for i, name in enumerate(CODECS * 2):  # the same ledgers in both topics
        _produce(topic_uri, rows[i * 200:(i + 1) * 200], compression=name)
        _produce(plain, rows[i * 200:(i + 1) * 200], compression="none")
    # ledger 1 as version 1 (it was written uncompressed)
    meta = TopicMetadata.open(topic_uri)
    first = meta.load_topic().ledgers[0]
    _rewrite(topic_uri, first.object, objects.downgrade)
    assert LedgerFile.open(meta.topic.store, meta.topic.key(first.object)).footer.version == 1
    none, zstd = CompactionConfig(delete_retention_ms=0, compression=Compression()), CompactionConfig(
        delete_retention_ms=0)
    Compactor(plain, none).run()
    Compactor(topic_uri, zstd).run()
    assert _view(topic_uri) == _view(plain)
    assert {Codec.NONE, Codec.LZ4, Codec.ZSTD} <= _codecs_of(topic_uri)
    # more of each, then incremental runs (the second from compacted parts of mixed codecs)
    _produce(topic_uri, rows[1600:2000], compression="lz4")
    _produce(plain, rows[1600:2000], compression="none")
    Compactor(topic_uri, CompactionConfig(delete_retention_ms=0, compression=Compression(Codec.LZ4))).run()
    Compactor(plain, none).run()
    assert _view(topic_uri) == _view(plain)
    _produce(topic_uri, rows[2000:], compression="zstd:3")
    _produce(plain, rows[2000:], compression="none")
    for uri, cfg in ((topic_uri, zstd), (plain, none)):
        Compactor(uri, cfg).run()
    assert _view(topic_uri) == _view(plain)
    assert dict(TableView(topic_uri)) == dict(TableView(plain))
    assert [m.id for m in TopicReader(topic_uri)] == [m.id for m in TopicReader(plain)]
    assert verify_topic(TopicMetadata.open(topic_uri)).ok
    stored = TopicMetadata.open(topic_uri).load_compaction()
    assert sum(p.bytes for p in stored.parts) < sum(p.bytes for p in TopicMetadata.open(plain).load_compaction().parts)


def test_a_version_1_compacted_ledger_is_read_and_compacted_incrementally(topic_uri: str) -> None:
    rows = _rows(1200, 150, seed=2)
    plain = topic_uri.replace("/orders", "/plain")
    config = CompactionConfig(delete_retention_ms=0, compression=Compression(), reuse_min_bytes=0)
    for uri in (topic_uri, plain):
        _produce(uri, rows[:800], compression="none")
        Compactor(uri, config).run()
    meta = TopicMetadata.open(topic_uri)
    (part,) = meta.load_compaction().parts
    _rewrite(topic_uri, part.object, objects.downgrade)
    f = LedgerFile.open(meta.topic.store, meta.topic.key(part.object), kind=KIND_COMPACTED)
    assert f.footer.version == 1 and not f.footer.ids_per_record
    assert _view(topic_uri) == _view(plain)
    middle = _view(plain)[len(_view(plain)) // 2][0]
    assert TopicReader(topic_uri, read_compacted=True, start=middle).read(1)[0].id == middle
    # the next run keeps the version 1 part in place (with a deletion vector) or copies it
    _produce(topic_uri, rows[800:], compression="zstd")
    _produce(plain, rows[800:], compression="none")
    for uri in (topic_uri, plain):
        Compactor(uri, CompactionConfig(delete_retention_ms=0, reuse_min_bytes=0)).run()
    assert _view(topic_uri) == _view(plain)
    assert verify_topic(TopicMetadata.open(topic_uri)).ok


def test_compacted_parts_kept_in_place_with_deletion_vectors_work_compressed(topic_uri: str) -> None:
    rows = _rows(3000, 1000, seed=3)
    _produce(topic_uri, rows[:2800], compression="zstd")
    base = CompactionConfig(delete_retention_ms=0, reuse_min_bytes=0, max_part_bytes=1 << 16)
    Compactor(topic_uri, base).run()
    before = TopicMetadata.open(topic_uri).load_compaction().parts
    assert len(before) > 1 and _codecs_of(topic_uri) >= {Codec.ZSTD}
    _produce(topic_uri, rows[2800:], compression="zstd")
    s = Compactor(topic_uri, base).run()
    after = TopicMetadata.open(topic_uri).load_compaction().parts
    kept = {p.object for p in before} & {p.object for p in after}
    assert kept and s.records_reused > 0
    assert any(p.deletions for p in after if p.object in kept)
    model: dict[bytes, bytes] = {}
    for k, v in rows:
        if v is None:
            model.pop(k.encode(), None)
        else:
            model[k.encode()] = v.encode()
    assert dict(TableView(topic_uri)) == model
    assert verify_topic(TopicMetadata.open(topic_uri)).ok


def test_sparse_survivors_of_small_entries_are_packed_into_few_compressed_entries(topic_uri: str) -> None:
    """Every key updated 20 times, entries of 5 records: almost every entry keeps one
    record or none, and the last ones keep all five.  The compacted ledger holds them in
    entries of about entry_bytes, compressed, not in one tiny frame per original entry;
    ids and values unchanged."""
    rng = random.Random(4)
    rows = [(f"k{rng.randrange(500)}", json.dumps({"seq": i, "pad": "abcd" * 8})) for i in range(10_000)]
    _produce(topic_uri, rows, batch_size=5, max_ledger_records=2000, compression="zstd")
    Compactor(topic_uri, CompactionConfig(delete_retention_ms=0, entry_bytes=8 << 10)).run()
    state = TopicMetadata.open(topic_uri).load_compaction()
    assert state.records == 500
    entries = sum(p.entries for p in state.parts)
    assert entries <= 12, entries  # 500 records of about 110 bytes in entries of 8 KiB (5 ledgers)
    loc = TopicMetadata.open(topic_uri).topic
    for p in state.parts:
        foot = LedgerFile.open(loc.store, loc.key(p.object)).footer
        assert int(foot.col("e_length").astype(np.int64).sum()) * 3 < int(foot.raw_lengths().sum())
        assert p.uncompressed_bytes - p.bytes == int(foot.raw_lengths().sum()) - int(
            foot.col("e_length").astype(np.int64).sum() - 12 * foot.n_entries)
    latest = {k: (i, v) for i, (k, v) in enumerate(rows)}
    got = {m.key: m.value for m in TopicReader(topic_uri, read_compacted=True)}
    assert got == {k.encode(): v.encode() for k, (_, v) in latest.items()}
    ids = [m.id for m in TopicReader(topic_uri, read_compacted=True)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    # each record keeps its own original id: seek to any of them
    target = ids[len(ids) // 3]
    assert TopicReader(topic_uri, read_compacted=True, start=target).read(1)[0].id == target
    assert verify_topic(TopicMetadata.open(topic_uri)).ok


def test_the_producers_default_is_the_topics_policy_else_zstd(tmp_path: Any) -> None:
    uri = str(tmp_path / "t")
    _produce(uri, _rows(100, 10, seed=5))
    assert _codecs_of(uri) == {Codec.ZSTD}
    r = run_cli_here("config", uri, "--set", "compression=lz4")
    assert r.returncode == 0, r.stderr
    _produce(uri, _rows(100, 10, seed=6))
    meta = TopicMetadata.open(uri)
    last = meta.load_topic().ledgers[-1]
    assert set(LedgerFile.open(meta.topic.store, meta.topic.key(last.object)).footer.codecs().tolist()) == {
        Codec.LZ4}
    # the command's flag wins over the policy; the policy over the variable
    lines = "".join(json.dumps({"key": k, "value": v}) + "\n" for k, v in _rows(50, 5, seed=7))
    r = run_cli_here("produce", uri, "--compression", "none", "--json", input=lines)
    assert r.returncode == 0, r.stderr
    r = run_cli_here("produce", uri, "--json", input=lines, env={"SHALE_COMPRESSION": "none"})
    assert r.returncode == 0, r.stderr
    ledgers = TopicMetadata.open(uri).load_topic().ledgers
    got = [set(LedgerFile.open(meta.topic.store, meta.topic.key(lg.object)).footer.codecs().tolist())
           for lg in ledgers[-2:]]
    assert got == [{Codec.NONE}, {Codec.LZ4}]
    r = run_cli_here("config", uri, "--set", "compression=brotli")
    assert r.returncode == 2 and "unknown compression 'brotli'" in r.stderr
    r = run_cli_here("produce", uri, "--compression", "zstd:99", input=lines)
    assert r.returncode == 2 and "zstd level 99 must be from 1 to 22" in r.stderr and "Traceback" not in r.stderr


def test_a_hostile_compression_policy_is_refused(tmp_path: Any) -> None:
    uri = str(tmp_path / "t")
    _produce(uri, _rows(20, 5, seed=8))
    assert run_cli_here("config", uri, "--set", "compression=zstd:4").returncode == 0
    tamper.edit(uri, "policy.json", lambda d: d["value"].update(compression="zstd:77"))
    with pytest.raises(InvalidMetadataError, match="field compression: zstd level 77"):
        TopicWriter(uri)
    r = run_cli_here("compact", uri)
    assert r.returncode == 4 and "compression" in r.stderr


def test_status_shows_bytes_stored_and_uncompressed(tmp_path: Any) -> None:
    uri = str(tmp_path / "t")
    _produce(uri, _rows(3000, 200, seed=9), compression="zstd")
    assert run_cli_here("compact", uri).returncode == 0
    r = run_cli_here("status", uri, "--json")
    doc = json.loads(r.stdout)
    assert doc["raw_bytes"] > 2 * doc["bytes"]
    assert all(lg["raw_bytes"] > lg["bytes"] for lg in doc["ledger_list"])
    assert doc["compaction"]["compacted_raw_bytes"] > doc["compaction"]["compacted_bytes"]
    text = run_cli_here("status", uri).stdout
    assert f"{doc['bytes']:,} bytes stored ({doc['raw_bytes']:,} uncompressed," in text
    assert "raw bytes" in text


# ------------------------------------------------------------------ hostile compressed entries


def _entry_of_first_ledger(uri: str) -> tuple[str, objects.Parsed]:
    meta = TopicMetadata.open(uri)
    name = meta.load_topic().ledgers[0].object
    return name, objects.parse(tamper.read_raw(uri, name))


def _refused(uri: str, expect: str, name: str) -> None:
    """``compact`` refuses with exit 4 in one line saying ``expect``, and publishes
    nothing; ``read`` and ``verify --scrub`` refuse too (exit 4), naming object ``name``."""
    before = tamper.read_raw(uri, "_meta/compaction.json")
    r = run_cli_here("compact", uri)
    assert r.returncode == 4, r.stderr
    assert expect in r.stderr and name in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert tamper.read_raw(uri, "_meta/compaction.json") == before
    r = run_cli_here("read", uri)
    assert r.returncode == 4 and name in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run_cli_here("verify", uri, "--scrub")
    assert r.returncode == 4 and name in r.stdout + r.stderr


def _compacted_once(uri: str) -> None:
    _produce(uri, _rows(600, 60, seed=10), compression="zstd", batch_size=50)
    assert run_cli_here("compact", uri).returncode == 0
    _produce(uri, _rows(600, 60, seed=11), compression="zstd", batch_size=50)


def test_a_corrupt_compressed_entry_within_its_checksum_is_refused(disk_topic_uri: str) -> None:
    uri = disk_topic_uri
    _compacted_once(uri)
    meta = TopicMetadata.open(uri)
    name = meta.load_topic().ledgers[-1].object
    p = objects.parse(tamper.read_raw(uri, name))
    # the last entry, whose records are partly the latest of their keys: it is decompressed
    assert p.cols["e_codec"][-1] == Codec.ZSTD
    good = p.payloads[-1]
    p.payloads[-1] = good[:-16]  # a frame cut short: it does not decompress
    tamper.write_raw(uri, name, objects.build(p))
    _refused(uri, "compressed entry does not decompress with zstd", name)
    # bytes changed inside the frame: zstd's content checksum no longer matches
    stored = bytearray(good)
    stored[len(stored) // 2:len(stored) // 2 + 8] = b"\xff" * 8
    p.payloads[-1] = bytes(stored)
    tamper.write_raw(uri, name, objects.build(p))
    _refused(uri, "doesn't match checksum", name)
    # the same in a frame written before frames carried a checksum: it decompresses, to
    # records that are not records
    import zstandard

    raw = zstandard.ZstdDecompressor().decompress(good)
    # (0xc1 is the one byte msgpack never uses: whatever the records held, these are not
    # records; bytes changed at random might only have changed a value, which nothing
    # can tell in a frame without a checksum)
    old = zstandard.ZstdCompressor(level=1, write_content_size=True, write_checksum=False).compress(
        b"\xc1" * len(raw))
    assert not zstandard.get_frame_parameters(old).has_checksum
    p.payloads[-1] = old
    tamper.write_raw(uri, name, objects.build(p))
    _refused(uri, "of its decompressed payload", name)


def test_a_decompression_bomb_is_refused(disk_topic_uri: str) -> None:
    """A few kilobytes that decompress to 200 MiB, the footer saying the entry's true size:
    refused from the frame's declaration, before anything is decompressed."""
    uri = disk_topic_uri
    _compacted_once(uri)
    name = TopicMetadata.open(uri).load_topic().ledgers[-1].object
    p = objects.parse(tamper.read_raw(uri, name))
    p.payloads[0] = codecs._CONTEXTS.zstd_compressor(3).compress(b"\0" * (200 << 20))  # type: ignore[attr-defined]
    tamper.write_raw(uri, name, objects.build(p))
    _refused(uri, "declares 209715200 decompressed bytes", name)


def test_a_footer_claiming_a_huge_decompressed_entry_is_refused_when_read(disk_topic_uri: str) -> None:
    uri = disk_topic_uri
    _compacted_once(uri)
    name = TopicMetadata.open(uri).load_topic().ledgers[-1].object
    p = objects.parse(tamper.read_raw(uri, name))
    p.cols["e_raw_length"][0] = MAX_RAW_ENTRY_BYTES + 1
    tamper.write_raw(uri, name, objects.build(p))
    _refused(uri, f"claims {MAX_RAW_ENTRY_BYTES + 1} bytes decompressed", name)


def test_an_unknown_codec_is_named(tmp_path: Any) -> None:
    uri = str(tmp_path / "t")
    _produce(uri, _rows(100, 10, seed=12))
    name, p = _entry_of_first_ledger(uri)
    p.cols["e_codec"][2] = 9
    tamper.write_raw(uri, name, objects.build(p))
    meta = TopicMetadata.open(uri)
    with pytest.raises(UnsupportedVersionError, match="entry 2 is compressed with codec 9, which this build"):
        LedgerFile.open(meta.topic.store, meta.topic.key(name))
    r = run_cli_here("compact", uri)
    assert r.returncode == 4 and "codec 9" in r.stderr


def test_records_that_lie_inside_a_compressed_entry_are_refused_by_compaction(tmp_path: Any) -> None:
    """Within every checksum, a compressed entry whose footer moves a record boundary:
    pass two decompresses the partly kept entry and checks each survivor."""
    uri = str(tmp_path / "t")
    _produce(uri, [(f"k{i % 7}", f"value-{i:04d}") for i in range(60)], batch_size=20, compression="zstd")
    name, p = _entry_of_first_ledger(uri)
    assert p.cols["e_codec"][0] == Codec.ZSTD
    # records 53 and 54, of the third entry, are the latest of their keys
    p.cols["r_size"][53] += 1
    p.cols["r_offset"][54] += 1
    p.cols["r_size"][54] -= 1
    tamper.write_raw(uri, name, objects.build(p))
    before = tamper.read_raw(uri, "_meta/compaction.json") if (tmp_path / "t/_meta/compaction.json").exists() else None
    r = run_cli_here("compact", uri)
    assert r.returncode == 4, r.stderr
    assert "of its decompressed payload" in r.stderr and name in r.stderr
    after = tamper.read_raw(uri, "_meta/compaction.json") if (tmp_path / "t/_meta/compaction.json").exists() else None
    assert after == before


def test_compressed_messages_decode_like_uncompressed_ones() -> None:
    """Record for record, every codec reads back what the producer sent (properties,
    event times, tombstones, keyless records and binary values included)."""
    rng = random.Random(13)
    sent: list[Record] = []
    for i in range(500):
        key = None if i % 17 == 0 else f"k{rng.randrange(40)}".encode()
        value = None if i % 11 == 0 else (os.urandom(rng.randrange(1, 30)) if i % 2 else b"v" * rng.randrange(1, 99))
        sent.append(Record(key, value, {"i": str(i)} if i % 3 else {}, 1000 + i, i if i % 5 else None))
    got: dict[str, list[Message]] = {}
    for name in CODECS:
        uri = f"memory://codecs-{name}/t"
        with TopicWriter(uri, compression=name, batch_size=rng.randrange(1, 40)) as w:
            for r in sent:
                w.send(r)
        got[name] = TopicReader(uri).read()
    for name in CODECS:
        assert [(m.key, m.value or None, dict(m.properties), m.publish_time, m.event_time) for m in got[name]] == [
            (r.key, r.value or None, dict(r.properties), r.publish_time, r.event_time) for r in sent]


def test_raw_batches_bound_what_is_decompressed_at_once() -> None:
    import io

    buf = io.BytesIO()
    w = LedgerWriter(buf, kind=KIND_ORIGINAL, ledger_id=1, created_ms=0, compression=DEFAULT_COMPRESSION)
    for i in range(10):
        w.add_entry(encode_entry([Record(b"k", bytes([65 + i]) * 100_000)]))
    w.finish()
    store = resolve("memory://batches/x").store
    store.put("l", buf.getvalue())
    f = LedgerFile.open(store, "l")
    pieces = list(f.raw_batches(np.arange(10, dtype=np.int64), limit=250_000))
    assert [len(p) for p in pieces] == [2, 2, 2, 2, 2]
    base, data = f.read_frames(0, 10)
    raw, at = f.raw_frames(data, base, pieces[1])
    assert bytes(raw[at[1] + 12:at[1] + 12 + 5]) == bytes(f.entry_payload(data, base, 3))[:5]
