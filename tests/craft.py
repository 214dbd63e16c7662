"""Crafting hostile topics on a local folder: lies told *within* the checksums.

A hostile writer of the same folder (or a hand edit, or an old tool) can change a ledger
object's footer and then recompute the footer's CRC32C in the trailer and the trailer's
own CRC, so the object still passes every checksum and only the deeper checks (footer
consistency, the record check, the ids a registration promises) can catch the lie; and
it can rewrite a metadata document directly, going round compare-and-swap.  The helpers
here do exactly that, plus what a test needs around it:

* :func:`build_topic` — the small fuzz topic: six ledgers, three compactions (so the
  state has three parts, a deletion vector and a non-empty ``retired``) and work above
  the horizon;
* :func:`read_raw_ledger` / :func:`write_raw_ledger` — a ledger's footer as plain NumPy
  columns, and writing it back re-encoded with a fresh trailer (offsets, lengths and both
  checksums recomputed), whatever the columns now say;
* :func:`json_paths`, :func:`get_at`, :func:`set_at`, :func:`delete_at` — walking and
  editing a metadata document's ``value``;
* :func:`snapshot` / :func:`snapshot_diff` — every file, folder and link under a folder
  (bytes included), to prove that nothing outside a topic was touched.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt

from shale.compactor import CompactionConfig, Compactor
from shale.ledger.format import (
    COLUMNS,
    KIND_COMPACTED,
    KIND_ORIGINAL,
    TRAILER_SIZE,
    Trailer,
    checksum,
    columns_of,
    decode_trailer,
    encode_footer,
    encode_trailer,
)
from shale.producer import TopicWriter

__all__ = [
    "RawLedger",
    "build_topic",
    "delete_at",
    "get_at",
    "json_paths",
    "load_document",
    "read_raw_ledger",
    "save_document",
    "set_at",
    "snapshot",
    "snapshot_diff",
    "write_raw_ledger",
]

JsonPath = tuple[str | int, ...]


# --------------------------------------------------------------------------- the topic

def build_topic(uri: str) -> None:
    """The fuzz topic.

    Ledgers 1 to 3 (six records each, entries of three): keys ``k0``..``k7`` repeated across
    ledgers, one tombstone and one keyless record; compacted.  Ledger 4 updates two keys
    (the first part is kept in place with a deletion vector), ledger 5 two more and a
    keyless record (the vector is replaced, the old one retired); compacted after each.
    Ledger 6 (two entries) lies above the horizon: work for the next run.
    """
    config = CompactionConfig(delete_retention_ms=0, reuse_min_bytes=0)
    with TopicWriter(uri, max_ledger_records=6, batch_size=3) as w:
        for i in range(18):
            if i == 7:
                w.append("k1", None)  # tombstone
            elif i == 9:
                w.append(None, "keyless")
            else:
                w.append(f"k{i % 8}", f"v{i}", {"n": str(i)})
    Compactor(uri, config).run()
    with TopicWriter(uri, max_ledger_records=6, batch_size=3) as w:
        for i in range(2):
            w.append(f"k{i}", f"w{i}")
    Compactor(uri, config).run()
    with TopicWriter(uri, max_ledger_records=6, batch_size=3) as w:
        for i in range(2):
            w.append(f"k{i + 2}", f"x{i}")
        w.append(None, "keyless-2")
    Compactor(uri, config).run()
    with TopicWriter(uri, max_ledger_records=6, batch_size=3) as w:
        for i in range(4):
            w.append(f"k{i + 5}", f"y{i}")


# ------------------------------------------------------------------------ ledger footers

@dataclass(slots=True)
class RawLedger:
    """A ledger object's bytes with its footer as writable columns.

    Nothing is validated beyond the trailer (which this module always rewrites
    consistently), so a footer made inconsistent by an earlier edit can be edited again.
    """

    path: Path
    data: bytes
    trailer: Trailer
    e_rec_start: npt.NDArray[np.uint64]
    cols: dict[str, npt.NDArray[Any]]
    meta: dict[str, Any]

    @property
    def kind(self) -> int:
        return self.trailer.kind

    @property
    def n_entries(self) -> int:
        return len(self.e_rec_start) - 1

    @property
    def n_records(self) -> int:
        return len(self.cols["r_flags"])

    def column(self, name: str) -> npt.NDArray[Any]:
        return self.e_rec_start if name == "e_rec_start" else self.cols[name]

    def column_names(self) -> list[str]:
        return ["e_rec_start", *self.cols]


def read_raw_ledger(path: Path) -> RawLedger:
    data = path.read_bytes()
    trailer = decode_trailer(data[-TRAILER_SIZE:], len(data), str(path))
    raw = data[trailer.footer_offset:trailer.footer_offset + trailer.footer_length]
    doc = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    e_rec_start = np.frombuffer(doc["cols"]["e_rec_start"], dtype="<u8").copy()
    cols: dict[str, npt.NDArray[Any]] = {}
    for name in columns_of(trailer.version, trailer.kind):
        cols[name] = np.frombuffer(doc["cols"][name], dtype=COLUMNS[name][0]).copy()
    return RawLedger(path, data, trailer, e_rec_start, cols, dict(doc.get("meta") or {}))


def write_raw_ledger(led: RawLedger) -> None:
    """Write ``led`` back: the data region as it was, the footer re-encoded from the
    columns, and a new trailer whose footer offset, length and CRC32C match it (and whose
    own CRC is recomputed), so the object passes its checksums whatever the footer says."""
    assert led.kind in (KIND_ORIGINAL, KIND_COMPACTED)
    t = led.trailer
    footer = b"".join(bytes(p) for p in encode_footer(led.kind, led.e_rec_start, led.cols, led.meta, t.version))
    trailer = Trailer(t.footer_offset, len(footer), t.ledger_id, t.created_ms, checksum(footer), t.version, t.kind)
    data = led.data[:t.footer_offset] + footer + encode_trailer(trailer)
    led.path.write_bytes(data)
    led.data, led.trailer = data, trailer


# ---------------------------------------------------------------------- metadata documents

def load_document(path: Path) -> dict[str, Any]:
    """A metadata document's envelope ``{"version", "updated_ms", "writer", "value"}``."""
    doc: dict[str, Any] = json.loads(path.read_bytes())
    return doc


def save_document(path: Path, doc: Any) -> None:
    """Overwrite the document directly (no compare-and-swap: a hand edit)."""
    path.write_text(json.dumps(doc, separators=(",", ":")))


def json_paths(node: Any, prefix: JsonPath = ()) -> list[JsonPath]:
    """The path of every node under ``node`` (``node`` itself first, as ``()``)."""
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += json_paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += json_paths(v, (*prefix, i))
    return out


def get_at(root: Any, path: JsonPath) -> Any:
    for step in path:
        root = root[step]
    return root


def set_at(root: Any, path: JsonPath, value: Any) -> Any:
    """``root`` with the node at ``path`` replaced (the new root when ``path`` is ``()``)."""
    if not path:
        return value
    get_at(root, path[:-1])[path[-1]] = value
    return root


def delete_at(root: Any, path: JsonPath) -> None:
    assert path, "the root cannot be deleted"
    del get_at(root, path[:-1])[path[-1]]


# ------------------------------------------------------------------------------ snapshots

Entry = tuple[str, bytes]


def snapshot(root: Path, exclude: tuple[Path, ...] = ()) -> dict[str, Entry]:
    """Every file (with its bytes), folder and symbolic link (with its target) under
    ``root``, by relative path, without following links; the folders in ``exclude``
    and everything under them are left out."""
    out: dict[str, Entry] = {}
    skip = {os.fspath(p) for p in exclude}
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = [d for d in dirs if os.path.join(folder, d) not in skip]
        for name in dirs + files:
            path = os.path.join(folder, name)
            if path in skip:
                continue
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                out[rel] = ("link", os.readlink(path).encode())
            elif os.path.isdir(path):
                out[rel] = ("dir", b"")
            elif os.path.isfile(path):
                out[rel] = ("file", Path(path).read_bytes())
            else:
                out[rel] = ("other", b"")
    return out


def snapshot_diff(before: dict[str, Entry], after: dict[str, Entry]) -> list[str]:
    """What changed between two snapshots, one line each (empty when nothing did)."""
    lines = [f"removed {p}" for p in sorted(before.keys() - after.keys())]
    lines += [f"created {p}" for p in sorted(after.keys() - before.keys())]
    lines += [f"changed {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]]
    return lines
