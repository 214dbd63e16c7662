"""Ledger objects taken apart and put back together, byte by byte: what an older Shale
wrote (format version 1), and what a hostile writer can make of a compressed entry while
keeping every checksum right.

:func:`parse` splits an object into its footer columns and the stored payload of each
entry; :func:`build` lays them out again with fresh frame headers (lengths and CRC32C of
whatever the payloads now are), footer and trailer, so the result passes every checksum
whatever it says.  :func:`downgrade` turns an object this build wrote, with no entry
compressed, into the version 1 object an older Shale would have written for it, and
:func:`to_version_2` any object it wrote into the version 2 one (no event times).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt

from shale.ledger.format import (
    COLUMNS,
    FRAME_HEADER,
    KIND_COMPACTED,
    TRAILER_SIZE,
    Trailer,
    checksum,
    columns_of,
    decode_header,
    decode_trailer,
    encode_footer,
    encode_header,
    encode_trailer,
    optional_columns_of,
)

__all__ = ["Parsed", "build", "downgrade", "parse", "to_version_2"]


@dataclass(slots=True)
class Parsed:
    version: int
    kind: int
    ledger_id: int
    created_ms: int
    e_rec_start: npt.NDArray[np.uint64]
    cols: dict[str, npt.NDArray[Any]]
    meta: dict[str, Any]
    payloads: list[bytes]  # each entry's stored payload
    counts: list[int]  # each frame header's record count


def parse(data: bytes) -> Parsed:
    trailer = decode_trailer(data[-TRAILER_SIZE:], len(data), "object")
    header = decode_header(data, "object")
    doc = msgpack.unpackb(data[trailer.footer_offset:trailer.footer_offset + trailer.footer_length], raw=False)
    e_rec_start = np.frombuffer(doc["cols"]["e_rec_start"], dtype="<u8").copy()
    names = [*columns_of(trailer.version, trailer.kind),
             *(n for n in optional_columns_of(trailer.version) if n in doc["cols"])]
    cols = {name: np.frombuffer(doc["cols"][name], dtype=COLUMNS[name][0]).copy() for name in names}
    payloads, counts = [], []
    for off, length in zip(cols["e_offset"].tolist(), cols["e_length"].tolist(), strict=True):
        _, _, n = FRAME_HEADER.unpack_from(data, off)
        payloads.append(data[off + FRAME_HEADER.size:off + length])
        counts.append(n)
    return Parsed(trailer.version, trailer.kind, trailer.ledger_id, header.created_ms, e_rec_start, cols,
                  dict(doc.get("meta") or {}), payloads, counts)


def build(p: Parsed) -> bytes:
    """The object ``p`` describes: frames with their lengths and checksums recomputed,
    the footer's entry offsets and lengths following them."""
    out = bytearray(encode_header(p.kind, p.ledger_id, p.created_ms, p.version))
    offsets, lengths = [], []
    for payload, n in zip(p.payloads, p.counts, strict=True):
        offsets.append(len(out))
        out += FRAME_HEADER.pack(len(payload), checksum(payload), n) + payload
        lengths.append(FRAME_HEADER.size + len(payload))
    cols = dict(p.cols)
    cols["e_offset"] = np.asarray(offsets, dtype=np.uint64)
    cols["e_length"] = np.asarray(lengths, dtype=np.uint32)
    footer_at = len(out)
    footer = b"".join(bytes(x) for x in encode_footer(p.kind, p.e_rec_start, cols, p.meta, p.version))
    out += footer
    out += encode_trailer(Trailer(footer_at, len(footer), p.ledger_id, p.created_ms, checksum(footer), p.version,
                                  p.kind))
    return bytes(out)


def downgrade(data: bytes) -> bytes:
    """The version 1 object an older Shale would have written with the same entries (no
    entry may be compressed; a compacted part's entries must each hold records of one
    original entry)."""
    p = parse(data)
    assert p.version in (2, 3)
    assert not p.cols["e_codec"].any(), "version 1 has no compressed entries"
    cols = {k: v for k, v in p.cols.items() if k not in ("e_codec", "e_raw_length", "r_ledger", "r_entry", "r_event")}
    if p.kind == KIND_COMPACTED:
        starts = p.e_rec_start.astype(np.int64)
        for name, col in (("e_ledger", p.cols["r_ledger"]), ("e_entry", p.cols["r_entry"])):
            firsts = col[starts[:-1]]
            assert np.array_equal(np.repeat(firsts, np.diff(starts)), col), "an entry packs several original entries"
            cols[name] = firsts
    p.cols, p.version = cols, 1
    return build(p)


def to_version_2(data: bytes) -> bytes:
    """The version 2 object an older Shale would have written with the same entries
    (version 3 without its records' event times)."""
    p = parse(data)
    assert p.version == 3
    p.cols.pop("r_event", None)
    p.version = 2
    return build(p)
