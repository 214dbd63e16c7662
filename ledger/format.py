"""The on-object layout of a ledger (see docs/format.md for the full description).

::

    header   32 bytes   magic "SHALELDG", version, kind, ledger id, created time, CRC32C
    entries  frames     [stored length u32][CRC32C u32][record count u32][stored payload]
    footer   msgpack    columnar index: entry offsets, lengths, codecs and decompressed
                        sizes, per-record key hashes, flags, offsets and sizes (+ original
                        ids for compacted parts)
    trailer  56 bytes   footer offset/length/CRC32C, ledger id, version, kind, magic

All integers are little-endian.  The footer's columns are raw little-endian arrays, so
compaction's pass one reads key hashes and positions as NumPy arrays without touching
payloads, and a reader seeks to any entry with one ranged read.

Version 3 (this build writes it) adds, to version 2, each record's event time in the
optional column ``r_event`` (:data:`NO_EVENT_TIME` for a record without one), so that
compaction may order records by event time from the footer alone.  An original ledger
leaves the column out when none of its records has an event time (producers that set
none pay nothing); a compacted part holds it exactly when the run that wrote it kept
event times, and says nothing of them otherwise.  Version 2 records each entry's codec and decompressed
size, and gives each record of a compacted part its own original id, so that a compaction
may pack the survivors of many entries into one compressed entry.  Versions 1 (no
compression; a compacted part's ids per entry) and 2 are still read.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any, Final

import msgpack
import numpy as np
import numpy.typing as npt

from shale.ledger.codecs import MAX_RAW_ENTRY_BYTES, Codec
from shale.ledger.errors import CorruptLedgerError, UnsupportedVersionError
from shale.ledger.kernels import crc32c, tiling_error
from shale.ledger.values import dataclass

__all__ = [
    "EVENT_TIME_VERSION",
    "FLAG_HAS_KEY",
    "FLAG_TOMBSTONE",
    "FORMAT_VERSION",
    "FRAME_HEADER",
    "HEADER_SIZE",
    "KIND_COMPACTED",
    "KIND_ORIGINAL",
    "NO_EVENT_TIME",
    "READ_VERSIONS",
    "TRAILER_SIZE",
    "Footer",
    "Trailer",
    "checksum",
    "columns_of",
    "decode_footer",
    "decode_header",
    "decode_trailer",
    "encode_footer",
    "encode_header",
    "encode_trailer",
    "optional_columns_of",
]

MAGIC: Final = b"SHALELDG"
END_MAGIC: Final = b"SHALEEND"
#: The version this build writes.
FORMAT_VERSION: Final = 3
#: The versions this build reads.
READ_VERSIONS: Final = (1, 2, 3)

KIND_ORIGINAL: Final = 0
KIND_COMPACTED: Final = 1
_KINDS: Final = {KIND_ORIGINAL: "original", KIND_COMPACTED: "compacted"}

FLAG_HAS_KEY: Final = 0x01
FLAG_TOMBSTONE: Final = 0x02  # value empty or absent

_HEADER: Final = struct.Struct("<8sHBBQqI")
HEADER_SIZE: Final = _HEADER.size  # 32
_TRAILER: Final = struct.Struct("<QQQqIHBB4xI8s")
TRAILER_SIZE: Final = _TRAILER.size  # 56
FRAME_HEADER: Final = struct.Struct("<III")  # payload length, CRC32C(payload), record count
_BIN32: Final = struct.Struct(">BI")  # msgpack bin 32: marker, big-endian length

#: Footers bigger than this are refused as corrupt rather than allocated.
MAX_FOOTER_BYTES: Final = 1 << 31

# name -> (dtype, per entry "e" or per record "r")
COLUMNS: Final[dict[str, tuple[str, str]]] = {
    "e_offset": ("<u8", "e"),
    "e_length": ("<u4", "e"),
    "e_publish": ("<i8", "e"),
    "e_codec": ("<u1", "e"),
    "e_raw_length": ("<u4", "e"),
    "e_ledger": ("<u8", "e"),
    "e_entry": ("<u8", "e"),
    "r_hash_hi": ("<u8", "r"),
    "r_hash_lo": ("<u8", "r"),
    "r_flags": ("<u1", "r"),
    "r_offset": ("<u4", "r"),
    "r_size": ("<u4", "r"),
    "r_ledger": ("<u8", "r"),
    "r_entry": ("<u8", "r"),
    "r_batch": ("<u4", "r"),
    "r_delete_since": ("<i8", "r"),
    "r_event": ("<i8", "r"),
    "r_publish": ("<i8", "r"),
}

_BASE_COLUMNS: Final = ("e_offset", "e_length", "e_publish", "r_hash_hi", "r_hash_lo", "r_flags", "r_offset", "r_size")
_LAYOUTS: Final[dict[tuple[int, int], tuple[str, ...]]] = {
    (1, 0): _BASE_COLUMNS,
    (1, 1): (*_BASE_COLUMNS, "e_ledger", "e_entry", "r_batch", "r_delete_since"),
    (2, 0): (*_BASE_COLUMNS, "e_codec", "e_raw_length"),
    (2, 1): (*_BASE_COLUMNS, "e_codec", "e_raw_length", "r_ledger", "r_entry", "r_batch", "r_delete_since"),
}
_LAYOUTS[(3, 0)] = _LAYOUTS[(2, 0)]
_LAYOUTS[(3, 1)] = _LAYOUTS[(2, 1)]
#: Columns a footer of this version may hold or leave out, after those of its layout.
_OPTIONAL: Final[dict[int, tuple[str, ...]]] = {1: (), 2: (), 3: ("r_event", "r_publish")}
#: The first version whose footers give each record's event time.
EVENT_TIME_VERSION: Final = 3
#: ``r_event`` of a record its producer gave no event time (producers accept only
#: years 0001 to 9999, so no event time they take is this).
NO_EVENT_TIME: Final = -(1 << 63)


def columns_of(version: int, kind: int) -> tuple[str, ...]:
    """The footer columns every ledger object of this format version and kind has
    (optional ones, :func:`optional_columns_of`, come after them when present)."""
    return _LAYOUTS[(version, kind)]


def optional_columns_of(version: int) -> tuple[str, ...]:
    """The footer columns an object of this format version may hold or leave out."""
    return _OPTIONAL[version]


def _version_error(version: int, where: str, position: int) -> UnsupportedVersionError:
    return UnsupportedVersionError(
        f"{where}: ledger format version {version} is not supported (this build reads versions "
        f"{', '.join(map(str, READ_VERSIONS))})", path=where, position=position)


def checksum(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC32C (Castagnoli), hardware accelerated where the CPU allows."""
    return crc32c(data, value)


def encode_header(kind: int, ledger_id: int, created_ms: int, version: int = FORMAT_VERSION) -> bytes:
    body = _HEADER.pack(MAGIC, version, kind, 0, ledger_id, created_ms, 0)
    return _HEADER.pack(MAGIC, version, kind, 0, ledger_id, created_ms, checksum(body))


@dataclass(frozen=True, slots=True)
class Header:
    version: int
    kind: int
    ledger_id: int
    created_ms: int


def decode_header(data: bytes | memoryview, where: str) -> Header:
    if len(data) < HEADER_SIZE:
        raise CorruptLedgerError(f"{where}: truncated header ({len(data)} bytes)", path=where, position=0)
    magic, version, kind, flags, ledger_id, created, crc = _HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise CorruptLedgerError(f"{where}: not a Shale ledger object (bad magic {magic!r})", path=where, position=0)
    if version not in READ_VERSIONS:
        raise _version_error(version, where, 8)
    body = _HEADER.pack(magic, version, kind, flags, ledger_id, created, 0)
    if checksum(body) != crc:
        raise CorruptLedgerError(f"{where}: header checksum mismatch at byte 0", path=where, position=0)
    return Header(version, kind, ledger_id, created)


@dataclass(frozen=True, slots=True)
class Trailer:
    footer_offset: int
    footer_length: int
    ledger_id: int
    created_ms: int
    footer_crc: int
    version: int
    kind: int


def encode_trailer(t: Trailer) -> bytes:
    body = _TRAILER.pack(
        t.footer_offset, t.footer_length, t.ledger_id, t.created_ms, t.footer_crc,
        t.version, t.kind, 0, 0, END_MAGIC,
    )
    crc = checksum(body)
    return _TRAILER.pack(
        t.footer_offset, t.footer_length, t.ledger_id, t.created_ms, t.footer_crc,
        t.version, t.kind, 0, crc, END_MAGIC,
    )


def decode_trailer(data: bytes | memoryview, object_size: int, where: str) -> Trailer:
    """Decode the trailer from the last ``TRAILER_SIZE`` bytes of ``data``."""
    pos = object_size - TRAILER_SIZE
    if object_size < HEADER_SIZE + TRAILER_SIZE or len(data) < TRAILER_SIZE:
        raise CorruptLedgerError(
            f"{where}: truncated ledger object ({object_size} bytes is too small)", path=where, position=0
        )
    fo, fl, lid, created, fcrc, version, kind, flags, crc, magic = _TRAILER.unpack_from(
        data, len(data) - TRAILER_SIZE
    )
    if magic != END_MAGIC:
        raise CorruptLedgerError(
            f"{where}: truncated or not a ledger object: no trailer at byte {pos} (size {object_size})",
            path=where,
            position=pos,
        )
    if version not in READ_VERSIONS:
        raise _version_error(version, where, pos)
    body = _TRAILER.pack(fo, fl, lid, created, fcrc, version, kind, flags, 0, END_MAGIC)
    if checksum(body) != crc:
        raise CorruptLedgerError(f"{where}: trailer checksum mismatch at byte {pos}", path=where, position=pos)
    if kind not in _KINDS:
        raise CorruptLedgerError(f"{where}: unknown ledger kind {kind} at byte {pos}", path=where, position=pos)
    if fl > MAX_FOOTER_BYTES or fo < HEADER_SIZE or fo + fl != pos:
        raise CorruptLedgerError(
            f"{where}: footer bounds {fo}+{fl} do not fit the object (trailer at byte {pos})",
            path=where,
            position=pos,
        )
    return Trailer(fo, fl, lid, created, fcrc, version, kind)


@dataclass(frozen=True, slots=True, eq=False)
class Footer:
    """The columnar index of one ledger object.

    ``e_rec_start`` has one more element than there are entries: records of entry ``i``
    are ``e_rec_start[i]:e_rec_start[i+1]``.  Compacted parts carry the original id of
    every record (version 2: ``r_ledger``, ``r_entry``, ``r_batch``; version 1: per entry,
    ``e_ledger`` and ``e_entry``) and the time each kept tombstone was first kept
    (``r_delete_since``, 0 = not a tombstone).  Record offsets and sizes place records in
    their entry's payload once decompressed.
    """

    kind: int
    ledger_id: int
    data_end: int
    e_rec_start: npt.NDArray[np.int64]
    cols: dict[str, npt.NDArray[Any]]
    meta: dict[str, Any]
    version: int = FORMAT_VERSION
    #: columns derived from the others, made once on first use
    _derived: dict[str, npt.NDArray[Any]] = field(default_factory=dict, repr=False, compare=False)

    @property
    def n_entries(self) -> int:
        return len(self.e_rec_start) - 1

    @property
    def n_records(self) -> int:
        return int(self.e_rec_start[-1])

    def col(self, name: str) -> npt.NDArray[Any]:
        return self.cols[name]

    @property
    def ids_per_record(self) -> bool:
        """Whether each record carries its own original id (compacted parts of version 2,
        whose entries may pack records of several original entries)."""
        return "r_ledger" in self.cols

    def entry_of(self, records: Any) -> Any:
        """The entry holding each of ``records`` (record indexes: one, or an array)."""
        return np.searchsorted(self.e_rec_start, records, side="right") - 1

    def codecs(self) -> npt.NDArray[np.uint8]:
        """Each entry's codec (:class:`~shale.ledger.codecs.Codec`)."""
        got = self.cols.get("e_codec")
        return got if got is not None else np.zeros(self.n_entries, dtype=np.uint8)

    def raw_lengths(self) -> npt.NDArray[np.int64]:
        """Each entry's payload size once decompressed."""
        got = self.cols.get("e_raw_length")
        if got is not None:
            return got.astype(np.int64)
        return self.cols["e_length"].astype(np.int64) - FRAME_HEADER.size

    @property
    def compressed(self) -> bool:
        """Whether any entry is stored compressed."""
        got = self.cols.get("e_codec")
        return got is not None and bool(got.any())

    def entry_ledgers(self) -> npt.NDArray[np.uint64]:
        """The original ledger of each entry (its first record's, where an entry packs
        records of several)."""
        if self.ids_per_record:
            return self.cols["r_ledger"][self.e_rec_start[:-1]]
        if self.kind == KIND_COMPACTED:
            return self.cols["e_ledger"]
        return np.full(self.n_entries, self.ledger_id, dtype=np.uint64)

    def entry_ids(self) -> npt.NDArray[np.uint64]:
        """The original entry id of each entry (its first record's, as above)."""
        if self.ids_per_record:
            return self.cols["r_entry"][self.e_rec_start[:-1]]
        if self.kind == KIND_COMPACTED:
            return self.cols["e_entry"]
        return np.arange(self.n_entries, dtype=np.uint64)

    def record_ledgers(self, records: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
        """The original ledger id of each of ``records`` (record indexes)."""
        if self.ids_per_record:
            return np.asarray(self.cols["r_ledger"][records], dtype=np.uint64)
        if self.kind == KIND_COMPACTED:
            return np.asarray(self.cols["e_ledger"][self.entry_of(records)], dtype=np.uint64)
        return np.full(len(records), self.ledger_id, dtype=np.uint64)

    def record_entries(self, records: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
        """The original entry id of each of ``records``."""
        if self.ids_per_record:
            return np.asarray(self.cols["r_entry"][records], dtype=np.uint64)
        if self.kind == KIND_COMPACTED:
            return np.asarray(self.cols["e_entry"][self.entry_of(records)], dtype=np.uint64)
        return np.asarray(self.entry_of(records), dtype=np.uint64)

    def batch_indexes(self) -> npt.NDArray[np.uint32]:
        if self.kind == KIND_COMPACTED:
            return self.cols["r_batch"]
        counts = np.diff(self.e_rec_start)
        starts = np.repeat(self.e_rec_start[:-1], counts)
        return (np.arange(self.n_records, dtype=np.int64) - starts).astype(np.uint32)

    def delete_since(self) -> npt.NDArray[np.int64]:
        if self.kind == KIND_COMPACTED:
            return self.cols["r_delete_since"]
        return np.zeros(self.n_records, dtype=np.int64)

    def event_times(self) -> npt.NDArray[np.int64] | None:
        """Each record's event time in ms as its producer gave it, :data:`NO_EVENT_TIME`
        for a record without one (version 3: the column ``r_event``; an original ledger
        without it has no record with an event time); ``None`` when the footer does not
        say: versions 1 and 2, and a compacted part without the column (written by a run
        that did not keep event times).  The records then say (they must be decoded)."""
        if self.version < EVENT_TIME_VERSION:
            return None
        got = self.cols.get("r_event")
        if got is not None:
            return got
        if self.kind == KIND_COMPACTED:
            return None
        return np.full(self.n_records, NO_EVENT_TIME, dtype=np.int64)

    def record_publish(self) -> npt.NDArray[np.int64]:
        """Each record's publish time as the topic's order and key expiry count it: the
        publish time of the entry it was first written in (``e_publish`` of an original
        ledger; a compacted part keeps it in the column ``r_publish`` when its run kept
        record times, and otherwise gives its own entries' times, which are never earlier)."""
        got = self.cols.get("r_publish")
        if got is not None:
            return np.asarray(got, dtype=np.int64)
        made = self._derived.get("r_publish")
        if made is None:
            made = self._derived["r_publish"] = np.repeat(self.cols["e_publish"].astype(np.int64),
                                                          np.diff(self.e_rec_start))
        return made


def encode_footer(
    kind: int, e_rec_start: npt.NDArray[Any], cols: Mapping[str, npt.NDArray[Any] | Sequence[npt.NDArray[Any]]],
    meta: dict[str, Any], version: int = FORMAT_VERSION,
) -> list[bytes | memoryview]:
    """The footer as pieces to write back to back: a msgpack map ``{"n_entries",
    "cols": {name: raw little-endian bytes}, "meta"}``.  The map is framed by hand so
    that each column goes out as views of its arrays (a bin 32 header, then the bytes)
    instead of being copied into one buffer; any msgpack reader decodes it.  A column
    may be given as a list of chunks, which are then written one after another (a writer
    that collected a column batch by batch need not join the batches first)."""
    arrays: dict[str, list[npt.NDArray[Any]]] = {"e_rec_start": [np.ascontiguousarray(e_rec_start, dtype="<u8")]}
    # (an optional column goes out when given)
    for name in (*columns_of(version, kind), *(n for n in optional_columns_of(version) if n in cols)):
        dtype = COLUMNS[name][0]
        col = cols[name]
        chunks = [col] if isinstance(col, np.ndarray) else list(col)
        arrays[name] = [np.ascontiguousarray(c, dtype=dtype) for c in chunks]
    # a fixmap up to 15 columns, else a map 16 (a compacted part with event times has 16)
    head = bytes([0x80 | len(arrays)]) if len(arrays) <= 15 else b"\xde" + len(arrays).to_bytes(2, "big")
    pieces: list[bytes | memoryview] = [
        b"\x83" + msgpack.packb("n_entries") + msgpack.packb(len(e_rec_start) - 1) + msgpack.packb("cols") + head]
    for name, chunks in arrays.items():
        raws = [c.data.cast("B") for c in chunks if c.nbytes]
        pieces.append(msgpack.packb(name) + _BIN32.pack(0xC6, sum(len(r) for r in raws)))
        pieces.extend(raws)
    pieces.append(msgpack.packb("meta") + msgpack.packb(meta, use_bin_type=True))
    return pieces


def _uint_at(data: memoryview, p: int) -> tuple[int, int] | None:
    """The msgpack unsigned integer at ``p`` and the position after it."""
    b = data[p]
    if b < 0x80:
        return b, p + 1
    size = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}.get(b)
    if size is None or p + 1 + size > len(data):
        return None
    return int.from_bytes(data[p + 1:p + 1 + size], "big"), p + 1 + size


def _map_len_at(data: memoryview, p: int) -> tuple[int, int] | None:
    """The length of the msgpack fixmap or map 16 at ``p`` and the position after its header."""
    b = data[p]
    if b & 0xF0 == 0x80:
        return b & 0x0F, p + 1
    if b == 0xDE and p + 3 <= len(data):
        return int.from_bytes(data[p + 1:p + 3], "big"), p + 3
    return None


def _str_at(data: memoryview, p: int) -> tuple[str, int] | None:
    """The msgpack fixstr at ``p`` (every name in a footer is short) and the position after it."""
    b = data[p]
    n = b & 0x1F
    if b & 0xE0 != 0xA0 or p + 1 + n > len(data):
        return None
    try:
        return bytes(data[p + 1:p + 1 + n]).decode(), p + 1 + n
    except UnicodeDecodeError:
        return None


def _split_footer(data: memoryview) -> tuple[int, dict[str, memoryview], Any] | None:
    """``(n_entries, columns, meta)`` of a footer laid out the way :func:`encode_footer`
    writes it, the columns as views of ``data`` (no copy: footers run to hundreds of
    megabytes); ``None`` for any other layout, which is then decoded by msgpack."""
    try:
        if len(data) < 2 or data[0] != 0x83:
            return None
        key = _str_at(data, 1)
        if key is None or key[0] != "n_entries":
            return None
        got = _uint_at(data, key[1])
        if got is None:
            return None
        n_entries, p = got
        key = _str_at(data, p)
        if key is None or key[0] != "cols":
            return None
        got = _map_len_at(data, key[1])
        if got is None:
            return None
        n_cols, p = got
        cols: dict[str, memoryview] = {}
        for _ in range(n_cols):
            name = _str_at(data, p)
            if name is None or name[0] in cols or data[name[1]] != 0xC6:
                return None
            p = name[1] + 5
            size = int.from_bytes(data[name[1] + 1:p], "big")
            if p + size > len(data):
                return None
            cols[name[0]] = data[p:p + size]
            p += size
        key = _str_at(data, p)
        if key is None or key[0] != "meta":
            return None
        meta = msgpack.unpackb(data[key[1]:], raw=False, strict_map_key=True)
    except (IndexError, ValueError, msgpack.UnpackException):
        return None
    return n_entries, cols, meta


def decode_footer(data: bytes | memoryview, trailer: Trailer, where: str) -> Footer:
    """Decode and validate a footer; every inconsistency is a :class:`CorruptLedgerError`."""
    pos = trailer.footer_offset
    if checksum(data) != trailer.footer_crc:
        raise CorruptLedgerError(f"{where}: footer checksum mismatch at byte {pos}", path=where, position=pos)
    n_entries, raw_cols, meta = _footer_document(data, where, pos)

    def bad(why: str) -> CorruptLedgerError:
        return CorruptLedgerError(f"{where}: inconsistent footer at byte {pos}: {why}", path=where, position=pos)

    if not isinstance(raw_cols, dict) or not isinstance(meta, dict) or n_entries < 0:
        raise bad("wrong structure")

    def column(name: str, dtype: str) -> npt.NDArray[Any]:
        raw = raw_cols.get(name)
        if raw is None:
            raise bad(f"column {name} missing")
        if not isinstance(raw, bytes | memoryview) or len(raw) % np.dtype(dtype).itemsize:
            raise bad(f"column {name} is not a whole array of {dtype}")
        return np.frombuffer(raw, dtype=dtype)

    raw_start = column("e_rec_start", "<u8")
    if len(raw_start) != n_entries + 1 or raw_start[0] != 0 or raw_start[-1] >= 1 << 40:
        raise bad("entry record index has the wrong shape")
    e_rec_start = raw_start.astype(np.int64)
    if n_entries and np.any(np.diff(e_rec_start) < 1):
        raise bad("an entry holds no records or the record index goes backwards")
    n_records = int(e_rec_start[-1])
    cols: dict[str, npt.NDArray[Any]] = {}
    optional = [n for n in optional_columns_of(trailer.version) if n in raw_cols]
    for name in (*columns_of(trailer.version, trailer.kind), *optional):
        dtype, per = COLUMNS[name]
        cols[name] = column(name, dtype)
        if len(cols[name]) != (n_entries if per == "e" else n_records):
            raise bad(f"column {name} has {len(cols[name])} rows")
    _check_codecs_known(cols, n_entries, where, pos)
    why = _layout_error(cols, e_rec_start, pos) if n_entries else ""
    if why:
        raise bad(why)
    return Footer(trailer.kind, trailer.ledger_id, pos, e_rec_start, cols, meta, trailer.version)


def _footer_document(data: bytes | memoryview, where: str, pos: int) -> tuple[int, Any, Any]:
    """A footer's entry count, raw columns and meta (unchecked), split without copying
    the columns when it has the usual layout, else decoded as any MessagePack map."""
    split = _split_footer(memoryview(data))
    if split is not None:
        return split
    try:
        doc = msgpack.unpackb(data, raw=False, strict_map_key=True, max_bin_len=MAX_FOOTER_BYTES)
        return int(doc["n_entries"]), doc["cols"], doc.get("meta") or {}
    except (ValueError, KeyError, TypeError, AttributeError, msgpack.UnpackException) as e:
        raise CorruptLedgerError(f"{where}: undecodable footer at byte {pos}: {e}", path=where, position=pos) from e


def _check_codecs_known(cols: dict[str, npt.NDArray[Any]], n_entries: int, where: str, pos: int) -> None:
    """Every entry's codec is one this build reads."""
    if "e_codec" not in cols or not n_entries:
        return
    unknown = np.flatnonzero(cols["e_codec"] > max(Codec))
    if len(unknown):
        raise UnsupportedVersionError(
            f"{where}: entry {int(unknown[0])} is compressed with codec {int(cols['e_codec'][unknown[0]])}, "
            "which this build does not read", path=where, position=pos)


def _layout_error(cols: dict[str, npt.NDArray[Any]], e_rec_start: npt.NDArray[np.int64], data_end: int) -> str:
    """Why the entries and records of a footer do not lay out the data region ("" when
    they do): frames inside it, in order, not overlapping, each at least its header;
    records tiling each entry's payload exactly."""
    offsets, lengths = cols["e_offset"], cols["e_length"].astype(np.uint64)
    # Compared without adding, so huge offsets cannot wrap around.
    if (offsets[0] < HEADER_SIZE or np.any(offsets > np.uint64(data_end))
            or np.any(lengths > np.uint64(data_end) - offsets)
            or np.any(offsets[1:] - offsets[:-1] < lengths[:-1]) or np.any(offsets[1:] < offsets[:-1])):
        return "entry offsets overlap or leave the data region"
    if np.any(lengths < FRAME_HEADER.size):
        return "entry shorter than its frame header"
    payload_lengths = cols["e_length"]
    if "e_codec" in cols:
        why = _codec_error(cols)
        if why:
            return why
        # records tile the payload once decompressed (no wrap: the size is bounded)
        payload_lengths = cols["e_raw_length"] + np.uint32(FRAME_HEADER.size)
    why = _tiling_error(cols["r_offset"], cols["r_size"], e_rec_start, payload_lengths)
    if why or "r_ledger" not in cols:
        return why
    return _id_order_error(cols["r_ledger"], cols["r_entry"], cols["r_batch"])


def _codec_error(cols: dict[str, npt.NDArray[Any]]) -> str:
    """Why the entries' codecs and decompressed sizes are inconsistent ("" when they are
    not): an entry stored as it is holds exactly its payload; a compressed one holds at
    most :data:`~shale.ledger.codecs.MAX_RAW_ENTRY_BYTES` once decompressed (a crafted
    footer must not make a reader allocate more)."""
    codec, raw = cols["e_codec"], cols["e_raw_length"]
    plain = codec == Codec.NONE
    if np.any(raw[plain] != cols["e_length"][plain] - np.uint32(FRAME_HEADER.size)):
        return "an uncompressed entry's size differs from its frame's"
    big = np.flatnonzero(~plain & ((raw > MAX_RAW_ENTRY_BYTES) | (raw == 0)))
    if len(big):
        return (f"entry {int(big[0])} claims {int(raw[big[0]])} bytes decompressed (a compressed entry holds "
                f"1 to {MAX_RAW_ENTRY_BYTES} bytes)")
    return ""


def _id_order_error(ledgers: npt.NDArray[np.uint64], entries: npt.NDArray[np.uint64],
                    batches: npt.NDArray[np.uint32]) -> str:
    """Why a compacted part's record ids do not strictly rise ("" when they do): readers
    seek in them by binary search."""
    if len(ledgers) < 2:
        return ""
    same_l = ledgers[1:] == ledgers[:-1]
    if np.any(ledgers[1:] < ledgers[:-1]):
        return "record ids go backwards"
    same_e = same_l & (entries[1:] == entries[:-1])
    if np.any(same_l & (entries[1:] < entries[:-1])) or np.any(same_e & (batches[1:] <= batches[:-1])):
        return "record ids go backwards or repeat"
    return ""


def _tiling_error(offset: npt.NDArray[np.uint32], size: npt.NDArray[np.uint32], e_rec_start: npt.NDArray[np.int64],
                  lengths: npt.NDArray[np.uint32]) -> str:
    """Why the records do not tile their entries' payloads ("" when they do): the first
    record of an entry starts at 0, each next one where the previous ends, and the last
    ends at the payload's end (one pass in C, :func:`shale.ledger.kernels.tiling_error`)."""
    return _TILING_ERRORS[tiling_error(offset, size, e_rec_start, lengths)]


_TILING_ERRORS: Final = ("", "record offsets do not follow record sizes", "record sizes do not add up to their entry",
                         "the entry record index goes backwards")
