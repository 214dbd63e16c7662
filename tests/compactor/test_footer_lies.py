"""Footers that lie within their checksums: compaction must not publish what readers
cannot decode, verify must not call it ok, and a reader must not print records under
wrong ids before it fails."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from shale.compactor import CompactionConfig, Compactor
from shale.ledger.format import (
    FRAME_HEADER,
    TRAILER_SIZE,
    Trailer,
    checksum,
    decode_footer,
    decode_trailer,
    encode_footer,
    encode_trailer,
)
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from tests.conftest import run_cli_here

Columns = dict[str, Any]


def rewrite_footer(path: Path, change: Callable[[Columns, np.ndarray], None], body: bytes | None = None) -> None:
    """Change a ledger object's footer columns (and, given ``body``, everything before
    the footer), then recompute the footer's and the trailer's checksums, so that only
    the deeper checks can tell."""
    data = path.read_bytes()
    trailer = decode_trailer(data[-TRAILER_SIZE:], len(data), str(path))
    raw = data[trailer.footer_offset:trailer.footer_offset + trailer.footer_length]
    footer = decode_footer(raw, trailer, str(path))
    cols = {k: np.array(v) for k, v in footer.cols.items()}
    starts = np.array(footer.e_rec_start)
    change(cols, starts)
    new = b"".join(bytes(p) for p in encode_footer(footer.kind, starts, cols, footer.meta))
    body = data[:trailer.footer_offset] if body is None else body
    t = Trailer(len(body), len(new), trailer.ledger_id, trailer.created_ms, checksum(new), trailer.version,
                trailer.kind)
    path.write_bytes(body + new + encode_trailer(t))


def move_boundary(cols: Columns, starts: np.ndarray, entry: int = 0, record: int = 1) -> None:
    """One record one byte shorter, the next one a byte longer: the entry still tiles."""
    i = int(starts[entry]) + record
    cols["r_size"][i] -= 1
    cols["r_size"][i + 1] += 1
    cols["r_offset"][i + 1] -= 1


def _topic(tmp_path: Path, name: str = "t") -> tuple[str, Path]:
    uri = str(tmp_path / name)
    # stored uncompressed: the tests edit record bytes in place (compressed entries that
    # lie are tested in test_compression.py)
    with TopicWriter(uri, batch_size=100, compression="none") as w:
        for i in range(100):
            w.append(f"k{i}", f"value-{i:04d}", {"source": "test"})
    ledger = next((tmp_path / name / "ledgers").glob("*.ledger"))
    return uri, ledger


def test_a_moved_record_boundary_is_refused_by_compaction(tmp_path: Path) -> None:
    uri, ledger = _topic(tmp_path)
    rewrite_footer(ledger, move_boundary)
    # a plain read decodes the payload as a stream and still prints every record ...
    r = run_cli_here("read", uri)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 100
    # ... but compaction copies by the footer: it must refuse, and publish nothing
    r = run_cli_here(uri, "--json", script="compact")
    assert r.returncode == 4, r.stdout + r.stderr
    line = json.loads(r.stdout)
    assert line["status"] == "error" and ledger.name in line["error"] and "entry 1:0" in line["error"]
    assert "record 1" in line["error"] or "record 2" in line["error"]
    assert TopicMetadata.open(uri).load_compaction().epoch == 0
    assert not list((tmp_path / "t" / "compacted").rglob("*.ledger"))


def test_verify_checks_the_compacted_records_themselves(tmp_path: Path) -> None:
    """A compacted part whose footer moved a boundary after it was published: the frames'
    checksums hold and the keys match, but the next compaction could not copy it as it
    stands: verify says so, naming the part."""
    uri, _ = _topic(tmp_path)
    assert Compactor(uri, CompactionConfig()).run().status == "compacted"
    assert run_cli_here("verify", uri).returncode == 0
    part = next((tmp_path / "t" / "compacted").rglob("*.ledger"))
    rewrite_footer(part, move_boundary)
    r = run_cli_here("verify", uri)
    assert r.returncode == 4, r.stdout + r.stderr
    assert part.name in r.stderr and r.stderr.count("\n") == 1
    r = run_cli_here(uri, script="compact")  # nothing new: nothing copied, nothing to refuse
    assert r.returncode == 0, r.stderr


def test_bytes_in_properties_are_refused_and_never_published(tmp_path: Path) -> None:
    """A record whose properties hold bytes instead of text (a foreign writer): reading
    it is a clean exit 4, and compaction refuses to copy it."""
    import msgpack

    from shale.ledger.writer import LedgerWriter

    uri, ledger = _topic(tmp_path)
    # rebuild the ledger with one record's properties as bytes (same sizes: b"test" for "test")
    data = bytearray(ledger.read_bytes())
    good = msgpack.packb({"source": "test"})
    bad = msgpack.packb({b"source": b"test"}, use_bin_type=True)
    assert len(good) + 2 == len(bad)
    del LedgerWriter  # (the record is patched in place below instead)
    at = data.find(good)
    # keep sizes: drop two bytes of the value to make room ("value-0000" -> "value-00")
    value = msgpack.packb(b"value-0000", use_bin_type=True)
    v_at = data.rfind(value, 0, at)
    data[v_at:at + len(good)] = msgpack.packb(b"value-00", use_bin_type=True) + data[v_at + len(value):at] + bad
    # the frame's checksum over the new payload
    frame = 32
    plen = int.from_bytes(data[frame:frame + 4], "little")
    payload = bytes(data[frame + FRAME_HEADER.size:frame + FRAME_HEADER.size + plen])
    data[frame + 4:frame + 8] = checksum(payload).to_bytes(4, "little")
    ledger.write_bytes(bytes(data))
    r = run_cli_here("read", uri)
    assert r.returncode == 4 and "text" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert "Error" not in r.stderr and "Traceback" not in r.stderr
    r = run_cli_here(uri, script="compact")
    assert r.returncode == 4, r.stdout + r.stderr
    assert TopicMetadata.open(uri).load_compaction().epoch == 0


def test_read_prints_no_record_of_an_entry_that_fails(tmp_path: Path) -> None:
    """An entry whose payload holds one record fewer than its footer and frame say (the
    missing one's footer size zero, so the footer still tiles): nothing of that entry is
    printed, rather than records under shifted ids."""
    uri = str(tmp_path / "t")
    with TopicWriter(uri, batch_size=50, compression="none") as w:
        for i in range(100):
            w.append(f"k{i}", f"v{i}")
    ledger = next((tmp_path / "t" / "ledgers").glob("*.ledger"))
    data = bytearray(ledger.read_bytes())
    # entry 1 (the second frame): drop its first record from the payload
    trailer = decode_trailer(bytes(data[-TRAILER_SIZE:]), len(data), "x")
    footer = decode_footer(bytes(data[trailer.footer_offset:trailer.footer_offset + trailer.footer_length]),
                           trailer, "x")
    off1 = int(footer.col("e_offset")[1])
    first_size = int(footer.col("r_size")[50])
    plen = int.from_bytes(data[off1:off1 + 4], "little")
    payload = bytes(data[off1 + 12 + first_size:off1 + 12 + plen])
    frame = (len(payload).to_bytes(4, "little") + checksum(payload).to_bytes(4, "little")
             + (50).to_bytes(4, "little") + payload)
    rest = bytes(data[off1 + 12 + plen:trailer.footer_offset])
    assert rest == b""
    body = bytes(data[:off1]) + frame
    shift = first_size

    def change(cols: Columns, starts: np.ndarray) -> None:
        cols["e_length"][1] -= shift
        cols["e_raw_length"][1] -= shift
        cols["r_offset"][51:100] -= shift
        cols["r_size"][50] = 0
        cols["r_offset"][50] = 0

    rewrite_footer(ledger, change, body)
    r = run_cli_here("read", uri)
    assert r.returncode == 4, r.stderr
    printed = [json.loads(x)["id"] for x in r.stdout.splitlines()]
    assert printed == [f"1:0:{i}" for i in range(50)], "only entry 0, whose records are all there"
    assert "1:1" in r.stderr and r.stderr.count("\n") == 1
