"""Trained zstd dictionaries: ``shale dictionary --train``, producing and compacting with
``zstd-dict``, and dictionaries that are missing, changed or lied about."""

from __future__ import annotations

import base64
import json
import random
import re
from pathlib import Path
from typing import Any

import pytest

from shale.compactor import CompactionConfig, Compactor, collect_garbage
from shale.ledger.codecs import Codec, Compression, Dictionary, parse_compression
from shale.ledger.errors import InvalidInputError, InvalidMetadataError
from shale.ledger.reader import LedgerFile
from shale.maintenance.dictionary import gain_text, train_dictionary
from shale.maintenance.verify import verify_topic
from shale.metadata.dictionaries import register_dictionary
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TableView, TopicReader
from tests import objects, tamper
from tests.conftest import run_cli_here


def _rows(n: int, seed: int) -> list[tuple[str, str | None]]:
    rnd = random.Random(seed)
    out: list[tuple[str, str | None]] = []
    for i in range(n):
        k = rnd.randrange(400)
        out.append((f"user-{k:05d}", None if rnd.random() < 0.02 else json.dumps(
            {"id": k, "email": f"user{k}@example.com", "status": rnd.choice(["active", "invited"]), "seq": i,
             "plan": rnd.choice(["free", "pro", "team"]), "country": rnd.choice(["DE", "FR", "US", "JP"])})))
    return out


def _produce(uri: str, rows: list[tuple[str, str | None]], **kw: Any) -> None:
    with TopicWriter(uri, batch_size=2, max_ledger_records=1500, **kw) as w:
        for k, v in rows:
            w.append(k, v)


def _codecs(uri: str, which: str = "ledgers") -> set[int]:
    meta = TopicMetadata.open(uri)
    loc = meta.topic
    names = ([lg.object for lg in meta.load_topic().ledgers] if which == "ledgers"
             else [p.object for p in meta.load_compaction().parts])
    return {c for n in names for c in LedgerFile.open(loc.store, loc.key(n)).footer.codecs().tolist()}


def _model(rows: list[tuple[str, str | None]]) -> dict[bytes, bytes]:
    table: dict[bytes, bytes] = {}
    for k, v in rows:
        if v is None:
            table.pop(k.encode(), None)
        else:
            table[k.encode()] = v.encode()
    return table


def test_a_trained_dictionary_shrinks_small_entries_and_everything_reads_back(disk_topic_uri: str) -> None:
    uri = disk_topic_uri
    rows = _rows(6000, 1)
    _produce(uri, rows[:3000])
    r = run_cli_here("dictionary", uri, "--train", "--size", "8KiB", "--use", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["used"] and report["records_sampled"] > 1000
    assert report["zstd_dict_bytes"] * 1.5 < report["zstd_bytes"], report  # clearly smaller on entries of 2 records
    assert run_cli_here("config", uri).stdout.strip() == "compression  zstd-dict:3"
    # a producer follows the policy; so does a compaction (and entries of 2 records are
    # small: all packed anew, with the dictionary)
    _produce(uri, rows[3000:])
    meta = TopicMetadata.open(uri)
    first, last = meta.load_topic().ledgers[0], meta.load_topic().ledgers[-1]
    assert first.bytes > last.bytes * 1.3
    assert _codecs(uri) >= {Codec.ZSTD, Codec.ZSTD_DICT}
    assert run_cli_here("compact", uri).returncode == 0
    assert _codecs(uri, "parts") == {Codec.ZSTD_DICT}
    assert dict(TableView(uri)) == _model(rows)
    assert [m.value for m in TopicReader(uri)] == [v.encode() if v else None for _, v in rows]
    r = run_cli_here("verify", uri, "--scrub")
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_cli_here("get", uri, rows[-1][0])
    assert r.returncode in (0, 5)
    listing = run_cli_here("dictionary", uri, "--json")
    (d,) = json.loads(listing.stdout)["dictionaries"]
    assert d["id"] == report["dictionary_id"] and d["object"].startswith("dictionaries/")


def test_a_newer_dictionary_leaves_older_entries_readable_and_gc_keeps_every_dictionary(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    rows = _rows(9000, 2)
    _produce(uri, rows[:3000])
    meta = TopicMetadata.open(uri)
    first = train_dictionary(meta, size=4096, rng=random.Random(1)).dictionary
    register_dictionary(meta, first)
    _produce(uri, rows[3000:6000], compression="zstd-dict")
    Compactor(uri, CompactionConfig(delete_retention_ms=0, compression=parse_compression("zstd-dict:5"))).run()
    second = train_dictionary(meta, size=4096, rng=random.Random(2)).dictionary
    register_dictionary(meta, second)
    _produce(uri, rows[6000:], compression="zstd-dict")
    assert [d.id for d in TopicMetadata.open(uri).load_topic().dictionaries] == [first.id, second.id]
    # retention removes the ledgers written with the first dictionary; gc deletes them,
    # and never a dictionary: the compacted part still holds entries that need it
    assert run_cli_here("truncate", uri, "--before-ledger", "5").returncode == 0
    report = collect_garbage(TopicMetadata.open(uri), grace_ms=0, orphan_grace_ms=15 * 60_000,
                             now_ms=TopicMetadata.open(uri).now_ms() + 3_600_000)
    assert any("ledgers/" in x for x in report.to_json()["deleted"]), report.to_json()
    assert len(list((tmp_path / "t" / "dictionaries").iterdir())) == 2
    Compactor(uri, CompactionConfig(delete_retention_ms=0)).run()
    assert dict(TableView(uri)) == _model(rows)
    assert verify_topic(TopicMetadata.open(uri)).ok


def test_zstd_dict_without_a_dictionary_is_refused_in_words(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    with pytest.raises(InvalidInputError, match="needs a trained dictionary and the topic has none"):
        TopicWriter(uri, compression="zstd-dict")
    lines = "".join(json.dumps({"key": "k", "value": "v"}) + "\n" for _ in range(10))
    r = run_cli_here("produce", uri, "--compression", "zstd-dict", input=lines)
    assert r.returncode == 2 and "shale dictionary" in r.stderr and "Traceback" not in r.stderr
    assert run_cli_here("produce", uri, input=lines).returncode == 0
    r = run_cli_here("compact", uri, "--compression", "zstd-dict:4")
    assert r.returncode == 2 and "needs a trained dictionary" in r.stderr
    r = run_cli_here("dictionary", uri, "--train")
    assert r.returncode == 2 and "cannot train a dictionary on" in r.stderr and len(r.stderr.splitlines()) == 1


def _dictionary_topic(tmp_path: Path) -> tuple[str, TopicMetadata]:
    uri = str(tmp_path / "t")
    rows = _rows(4000, 3)
    _produce(uri, rows[:2000])
    assert run_cli_here("dictionary", uri, "--train", "--size", "4KiB", "--use").returncode == 0
    _produce(uri, rows[2000:])
    return uri, TopicMetadata.open(uri)


def test_a_changed_dictionary_object_is_refused_naming_it(tmp_path: Path) -> None:
    uri, meta = _dictionary_topic(tmp_path)
    (d,) = meta.load_topic().dictionaries
    path = tmp_path / "t" / d.object
    data = bytearray(path.read_bytes())
    data[200] ^= 0xFF
    path.write_bytes(bytes(data))
    before = tamper.read_raw(uri, "_meta/topic.json")
    for args in (("read", uri), ("compact", uri)):
        r = run_cli_here(*args)
        assert r.returncode == 4, (args, r.stderr)
        assert d.object in r.stderr and "changed since it was registered" in r.stderr
    assert tamper.read_raw(uri, "_meta/topic.json") == before
    assert not (tmp_path / "t" / "compacted").exists() or not list((tmp_path / "t" / "compacted").rglob("*.ledger"))


def test_an_entry_naming_an_unknown_dictionary_is_refused(tmp_path: Path) -> None:
    uri, meta = _dictionary_topic(tmp_path)
    last = meta.load_topic().ledgers[-1].object
    p = objects.parse(tamper.read_raw(uri, last))
    assert p.cols["e_codec"][0] == Codec.ZSTD_DICT
    # the same records compressed with another topic's dictionary, checksums right
    stranger = train_dictionary(meta, size=4096, rng=random.Random(9)).dictionary
    from shale.ledger.codecs import compress, decompress

    payload = bytes(decompress(p.payloads[0], Codec.ZSTD_DICT, int(p.cols["e_raw_length"][0]), "x",
                               dictionaries=meta.dictionaries))
    p.payloads[0] = bytes(compress(payload, Compression(Codec.ZSTD_DICT, 3, stranger))[1])
    tamper.write_raw(uri, last, objects.build(p))
    r = run_cli_here("read", uri)
    assert r.returncode == 4 and f"dictionary {stranger.id}" in r.stderr and "no dictionary" in r.stderr


def test_hostile_dictionary_entries_in_topic_json_are_refused(tmp_path: Path) -> None:
    uri, _ = _dictionary_topic(tmp_path)
    cases = [
        (lambda d: d["value"]["dictionaries"][0].update(object="ledgers/x.zdict"), "is not the name of dictionary"),
        (lambda d: d["value"]["dictionaries"].append(dict(d["value"]["dictionaries"][0])), "registered twice"),
        (lambda d: d["value"]["dictionaries"][0].update(bytes=1 << 30), r"dictionaries\[0\]\.bytes: expected"),
    ]
    for change, why in cases:
        saved = tamper.read_raw(uri, "_meta/topic.json")
        tamper.edit(uri, "topic.json", change)
        with pytest.raises(InvalidMetadataError, match=why):
            TopicMetadata.open(uri).load_topic()
        r = run_cli_here("read", uri)
        assert r.returncode == 4 and "topic.json: field dictionaries[" in r.stderr
        tamper.write_raw(uri, "_meta/topic.json", saved)


def test_dictionary_bytes_are_checked_before_use() -> None:
    from shale.ledger.errors import CorruptLedgerError

    with pytest.raises(CorruptLedgerError, match="not a zstd dictionary"):
        Dictionary.load(b"\0" * 64, "d")
    with pytest.raises(CorruptLedgerError, match="says it is 7, registered as 8"):
        Dictionary.load(bytes.fromhex("37a430ec") + (7).to_bytes(4, "little") + b"\0" * 100, "d", expect_id=8)
    with pytest.raises(CorruptLedgerError, match="1 MiB at most"):
        Dictionary.load(b"\0" * ((1 << 20) + 1), "d")


def _unhelpful(uri: str) -> None:
    """Entries the dictionary is trained on (even ones: four letters) unlike those it is
    measured on (odd ones: base64 of random bytes), so that it makes them larger."""
    rnd = random.Random(5)
    with TopicWriter(uri, batch_size=20) as w:
        for i in range(4000):
            even = i // 20 % 2 == 0
            w.append(f"k{i}", "".join(rnd.choice("abcd") for _ in range(100)) if even
                     else base64.b64encode(rnd.randbytes(75)).decode())


def test_use_refuses_a_dictionary_that_does_not_help_and_the_ratio_is_worded_right(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    _unhelpful(uri)
    r = run_cli_here("dictionary", uri, "--train", "--size", "4KiB", "--use")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "--use refused: the dictionary trained does not help" in r.stderr and "% larger)" in r.stderr, r.stderr
    assert "nothing was registered" in r.stderr and "x smaller" not in r.stderr
    meta = TopicMetadata.open(uri)
    assert meta.load_policy().get("compression") is None and meta.load_topic().dictionaries == ()
    # without --use it is registered, and said to make entries larger
    r = run_cli_here("dictionary", uri, "--train", "--size", "4KiB", "--json")
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["helps"] is False and report["zstd_dict_bytes"] > report["zstd_bytes"]
    text = run_cli_here("dictionary", uri, "--train", "--size", "4KiB").stdout
    assert re.search(r"with the dictionary [\d,]+ \(\d+\.\d% larger\); it does not help: keep zstd", text), text
    assert gain_text(1000, 1190) == "19.0% larger" and gain_text(1000, 400) == "2.50x smaller"
    assert gain_text(1000, 1000) == "no smaller"
