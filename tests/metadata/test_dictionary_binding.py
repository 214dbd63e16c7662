"""Dictionaries bound to their content: the registration's SHA-256, zstd's content
checksum in every new frame, and ``verify --scrub`` hashing every decoded key again; a
registered dictionary that is missing is a damaged topic (exit 4) for every command; and
an object Shale may not read is a permission error (exit 2), not damage."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard

from shale.ledger.codecs import Codec, decompress
from shale.ledger.errors import InvalidMetadataError
from shale.ledger.kernels import crc32c
from shale.metadata.topic import TopicMetadata
from shale.reader import TableView, TopicReader
from tests import objects, tamper
from tests.conftest import run_cli_here
from tests.metadata.test_dictionaries import _model, _produce, _rows
from tests.needs import without_root_privileges

ROWS = _rows(4000, 3)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A topic whose second half is written with a trained dictionary (made once)."""
    uri = tmp_path_factory.mktemp("template") / "t"
    _produce(str(uri), ROWS[:2000])
    assert run_cli_here("dictionary", str(uri), "--train", "--size", "4KiB", "--use").returncode == 0
    _produce(str(uri), ROWS[2000:])
    return uri


@pytest.fixture
def topic(template: Path, tmp_path: Path) -> str:
    shutil.copytree(template, tmp_path / "t")
    return str(tmp_path / "t")


def _dictionary(uri: str) -> tuple[str, bytes]:
    (info,) = TopicMetadata.open(uri).load_topic().dictionaries
    return info.object, tamper.read_raw(uri, info.object)


def swap_dictionary(uri: str, *, keep_sha256: bool) -> str:
    """What a writer of the bucket can do: change the dictionary's content ("user-" ->
    "usex-" in its samples, so that keys decode differently) and update the size and
    CRC32C that ``topic.json`` registers to match; with ``keep_sha256`` False the SHA-256
    is removed too (as in a registration made before it was recorded)."""
    name, data = _dictionary(uri)
    half = len(data) // 2  # (the content, not the entropy tables at the start)
    swapped = data[:half] + data[half:].replace(b"user-", b"usex-")
    assert swapped != data and len(swapped) == len(data)
    tamper.write_raw(uri, name, swapped)

    def change(doc: dict[str, object]) -> None:
        (d,) = doc["value"]["dictionaries"]  # type: ignore[index]
        d.update(bytes=len(swapped), crc32c=crc32c(swapped))
        if not keep_sha256:
            d.pop("sha256", None)

    tamper.edit(uri, "topic.json", change)
    return name


def without_content_checksums(uri: str) -> None:
    """Every zstd-dict entry of the topic's ledgers rewritten as a build before frames
    carried zstd's content checksum would have written it."""
    meta = TopicMetadata.open(uri)
    _, data = _dictionary(uri)
    zdict = zstandard.ZstdCompressionDict(data)
    for lg in meta.load_topic().ledgers:
        p = objects.parse(tamper.read_raw(uri, lg.object))
        for e, stored in enumerate(p.payloads):
            if p.cols["e_codec"][e] == Codec.ZSTD_DICT:
                raw = bytes(decompress(stored, Codec.ZSTD_DICT, int(p.cols["e_raw_length"][e]), "test",
                                       dictionaries=meta.dictionaries))
                p.payloads[e] = zstandard.ZstdCompressor(level=3, dict_data=zdict, write_content_size=True,
                                                         write_checksum=False).compress(raw)
        tamper.write_raw(uri, lg.object, objects.build(p))


def test_a_registration_carries_the_sha256_of_the_dictionary(topic: str) -> None:
    name, data = _dictionary(topic)
    doc = json.loads(tamper.read_raw(topic, "_meta/topic.json"))
    (d,) = doc["value"]["dictionaries"]
    assert d["sha256"] == hashlib.sha256(data).hexdigest() and d["object"] == name
    r = run_cli_here("dictionary", topic, "--json")
    assert json.loads(r.stdout)["dictionaries"][0]["sha256"] == d["sha256"]
    for bad in ("ABC", "0" * 63, "g" * 64, 7):
        saved = tamper.read_raw(topic, "_meta/topic.json")
        tamper.edit(topic, "topic.json", lambda doc, bad=bad: doc["value"]["dictionaries"][0].update(sha256=bad))
        with pytest.raises(InvalidMetadataError, match=r"dictionaries\[0\]\.sha256"):
            TopicMetadata.open(topic).load_topic()
        tamper.write_raw(topic, "_meta/topic.json", saved)


def test_a_swapped_dictionary_with_matching_size_and_crc_is_refused_by_every_command(topic: str) -> None:
    name = swap_dictionary(topic, keep_sha256=True)
    lines = "".join(json.dumps({"key": f"user-{i:05d}", "value": "v"}) + "\n" for i in range(10))
    before = tamper.snapshot(topic)
    for args, kw in ((("read", topic), {}), (("read", topic, "--table"), {}), (("get", topic, "user-00001"), {}),
                     (("produce", topic), {"input": lines}), ((topic,), {"script": "compact"})):
        r = run_cli_here(*args, **kw)  # type: ignore[arg-type]
        assert r.returncode == 4, (args, r.stderr)
        line = r.stderr.strip()
        assert len(line.splitlines()) == 1 and name in line and "changed since it was registered" in line, line
    assert tamper.snapshot(topic) == before  # nothing produced, nothing published
    r = run_cli_here("verify", topic, "--scrub")
    assert r.returncode == 4 and name in r.stdout


def test_frames_with_a_content_checksum_catch_a_swap_the_registration_cannot(topic: str) -> None:
    """A registration made before the SHA-256 was recorded (or one a writer of the bucket
    rewrote): frames written since carry zstd's content checksum, which fails."""
    swap_dictionary(topic, keep_sha256=False)
    r = run_cli_here("read", topic)
    assert r.returncode == 4 and "doesn't match checksum" in r.stderr, r.stderr
    r = run_cli_here(topic, script="compact")
    assert r.returncode == 4 and "doesn't match checksum" in r.stderr, r.stderr


def test_scrub_catches_a_swap_in_frames_without_a_content_checksum(topic: str) -> None:
    """Frames written before they carried a checksum decode, through the swapped
    dictionary, to other records: readers cannot tell, ``verify --scrub`` can (each
    decoded key is hashed again against the footer)."""
    without_content_checksums(topic)
    assert dict(TableView(topic)) == _model(ROWS)
    assert run_cli_here("verify", topic, "--scrub").returncode == 0  # the rewrite itself is sound
    swap_dictionary(topic, keep_sha256=False)
    keys = {m.key for m in TopicReader(topic).read()}
    assert any(k is not None and k.startswith(b"usex-") for k in keys)  # what readers see, and cannot tell
    r = run_cli_here("verify", topic, "--scrub", "--json")
    assert r.returncode == 4, r.stdout + r.stderr
    doc = json.loads(r.stdout.splitlines()[0])
    assert doc["damaged"] and all("its key does not hash to the key hash its footer gives" in d["error"]
                                  for d in doc["damaged"]), doc


def test_scrub_catches_a_footer_whose_key_hash_is_not_its_keys(topic: str) -> None:
    name = TopicMetadata.open(topic).load_topic().ledgers[0].object
    p = objects.parse(tamper.read_raw(topic, name))
    p.cols["r_hash_lo"][5] ^= 1
    tamper.write_raw(topic, name, objects.build(p))
    r = run_cli_here("verify", topic, "--scrub")
    assert r.returncode == 4 and f"damaged {name}" in r.stdout and "entry 1:2, record 1: its key" in r.stdout, r.stdout


def test_a_dictionary_zstd_cannot_use_is_refused_naming_it(topic: str) -> None:
    """Cut short, its registration (size, CRC32C, SHA-256) rewritten to match: it passes
    every check of the registration, and zstd cannot load its tables."""
    name, data = _dictionary(topic)
    cut = data[:40]
    tamper.write_raw(topic, name, cut)
    tamper.edit(topic, "topic.json", lambda doc: doc["value"]["dictionaries"][0].update(
        bytes=len(cut), crc32c=crc32c(cut), sha256=hashlib.sha256(cut).hexdigest()))
    lines = "".join(json.dumps({"key": f"user-{i:05d}", "value": "v" * 50}) + "\n" for i in range(10))
    for args, kw in ((("produce", topic), {"input": lines}), ((topic,), {"script": "compact"}),
                     (("read", topic), {})):
        r = run_cli_here(*args, **kw)  # type: ignore[arg-type]
        assert r.returncode == 4, (args, r.stderr)
        line = r.stderr.strip()
        assert len(line.splitlines()) == 1 and name in line and "not a usable zstd dictionary" in line, (args, line)


def test_a_missing_registered_dictionary_is_damage_for_every_command(topic: str) -> None:
    name, _ = _dictionary(topic)
    os.unlink(Path(topic) / name)
    lines = "".join(json.dumps({"key": f"user-{i:05d}", "value": "v"}) + "\n" for i in range(10))
    for args, kw in ((("produce", topic), {"input": lines}), ((topic,), {"script": "compact"}),
                     (("read", topic), {}), (("get", topic, "user-00001"), {})):
        r = run_cli_here(*args, **kw)  # type: ignore[arg-type]
        assert r.returncode == 4, (args, r.stderr)
        line = r.stderr.strip()
        assert len(line.splitlines()) == 1 and name in line and "missing" in line, (args, line)
    r = run_cli_here("verify", topic, "--scrub")
    assert r.returncode == 4 and name in r.stdout


# ------------------------------------------------------------------- permission denied


def run_unprivileged(*args: str) -> subprocess.CompletedProcess[str]:
    """``shale ARGS`` without root's power to read any file (tests run as root, and root
    reads a file whatever its mode: :func:`tests.needs.without_root_privileges`)."""
    cmd = [os.path.abspath(Path(sys.executable).parent / "shale"), *args]
    return subprocess.run(without_root_privileges(cmd), capture_output=True, text=True, timeout=300, cwd="/",
                          env={**os.environ, "HOME": "/"})


def test_an_unreadable_ledger_is_a_permission_error_not_damage(topic: str) -> None:
    assert run_unprivileged("verify", topic, "--scrub").returncode == 0  # everything readable so far
    lg = TopicMetadata.open(topic).load_topic().ledgers[-1]
    os.chmod(Path(topic) / lg.object, 0)
    for args in (("verify", topic, "--scrub"), ("status", topic)):
        r = run_unprivileged(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        line = r.stderr.strip()
        assert len(line.splitlines()) == 1 and lg.object in line and "permission denied" in line, (args, line)
        assert "DAMAGE" not in r.stdout and "damaged" not in r.stdout + r.stderr


def test_an_unreadable_dictionary_is_a_permission_error_not_damage(topic: str) -> None:
    name, _ = _dictionary(topic)
    os.chmod(Path(topic) / name, 0)
    for args in (("read", topic), ("verify", topic, "--scrub")):
        r = run_unprivileged(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        line = r.stderr.strip().splitlines()[-1]
        assert name in line and "permission denied" in line, (args, r.stderr)


def test_scrub_hashes_every_form_of_key_a_record_may_have() -> None:
    """Keys absent, empty, of 5, 300 and 70,000 bytes (bin 8, 16, 32), in records
    headed by a fixarray or an array 16 (both well formed), compressed or not: each hashes
    to its footer's key hash, and one hash changed is named."""
    import io

    import numpy as np

    from shale.ledger.codecs import DEFAULT_COMPRESSION, NO_COMPRESSION
    from shale.ledger.errors import CorruptLedgerError
    from shale.ledger.format import KIND_ORIGINAL
    from shale.ledger.reader import LedgerFile
    from shale.ledger.record import Record
    from shale.ledger.writer import LedgerWriter, encode_entry
    from shale.storage import resolve

    keys = [None, b"", b"k" * 5, b"m" * 300, b"n" * 70_000, b"tail"]
    records = [Record(k, b"v" * 20, {"i": str(i)}, 1000 + i) for i, k in enumerate(keys)]
    store = resolve("memory://key-forms/x").store
    for n, compression in enumerate((NO_COMPRESSION, DEFAULT_COMPRESSION)):
        entry = encode_entry(records)
        # the same records with an array 16 head (0xdc 00 05) instead of a fixarray (0x95)
        payload = b"".join(b"\xdc\x00\x05" + bytes(entry.payload[o + 1:o + s])
                           for o, s in zip(entry.r_offset.tolist(), entry.r_size.tolist(), strict=True))
        sizes = (entry.r_size + 2).astype(np.uint32)
        offsets = np.r_[0, np.cumsum(sizes)[:-1]].astype(np.uint32)
        wide = type(entry)(payload, offsets, sizes, entry.r_hash_hi, entry.r_hash_lo, entry.r_flags,
                           entry.publish_time)
        buf = io.BytesIO()
        w = LedgerWriter(buf, kind=KIND_ORIGINAL, ledger_id=1, created_ms=0, compression=compression)
        w.add_entry(entry)
        w.add_entry(wide)
        w.finish()
        store.put(f"l{n}", buf.getvalue())
        f = LedgerFile.open(store, f"l{n}")
        assert int(f.footer.codecs()[0]) == (0 if n == 0 else 2)
        base, data = f.read_frames(0, 2)
        f.check_entries(data, base, np.arange(2, dtype=np.int64), key_hashes=True)
        p = objects.parse(buf.getvalue())
        p.cols["r_hash_hi"][10] ^= 1 << 63  # the 70,000-byte key, in the array 16 entry
        store.put(f"bad{n}", objects.build(p))
        f = LedgerFile.open(store, f"bad{n}")
        base, data = f.read_frames(0, 2)
        with pytest.raises(CorruptLedgerError, match="entry 1:1, record 4: its key does not hash"):
            f.check_entries(data, base, np.arange(2, dtype=np.int64), key_hashes=True)
