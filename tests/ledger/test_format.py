"""The ledger object format: layout, round trips, ids, seeking, and refusing corrupt,
truncated, foreign, future-version and hostile objects with a precise error."""

from __future__ import annotations

import io
import itertools
import random
import struct
import tracemalloc
import uuid
from collections.abc import Sequence
from pathlib import Path

import msgpack
import numpy as np
import pytest

from shale.cli.errors import exit_code_of
from shale.ledger.errors import (
    CorruptLedgerError,
    InvalidInputError,
    RecordTooLargeError,
    UnsupportedVersionError,
)
from shale.ledger.format import (
    END_MAGIC,
    FLAG_HAS_KEY,
    FLAG_TOMBSTONE,
    FORMAT_VERSION,
    FRAME_HEADER,
    HEADER_SIZE,
    KIND_COMPACTED,
    KIND_ORIGINAL,
    MAGIC,
    TRAILER_SIZE,
    checksum,
    decode_trailer,
)
from shale.ledger.ids import MAX_ID, MIN_ID, MessageId
from shale.ledger.reader import LedgerFile
from shale.ledger.record import Message, Record, decode_records, encode_record, key_hash
from shale.ledger.writer import EncodedEntry, LedgerWriter, encode_entry, relabel_ledger
from shale.storage import Location, ObjectStore, resolve

_HEADER_FMT = "<8sHBBQqI"
_TRAILER_FMT = "<QQQqIHBB4xI8s"
_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1

CREATED = 1_700_000_000_123


# ------------------------------------------------------------------- helpers


def mem() -> Location:
    return resolve(f"memory://fmt-{uuid.uuid4().hex[:12]}/x")


def build(entries: Sequence[Sequence[Record]], *, ledger_id: int = 5, created_ms: int = CREATED) -> bytes:
    buf = io.BytesIO()
    w = LedgerWriter(buf, kind=KIND_ORIGINAL, ledger_id=ledger_id, created_ms=created_ms)
    for recs in entries:
        w.add_entry(encode_entry(recs))
    size = w.finish({"note": "test"})
    data = buf.getvalue()
    assert size == len(data) == w.bytes_written
    return data


def put_open(loc: Location, data: bytes, name: str = "obj.ledger") -> tuple[ObjectStore, str, LedgerFile]:
    key = loc.key(name)
    loc.store.put(key, data)
    return loc.store, key, LedgerFile.open(loc.store, key)


def open_and_read(store: ObjectStore, key: str) -> list[Message]:
    """Open an object and decode every record (both steps can detect corruption)."""
    return list(LedgerFile.open(store, key).messages())


def expect_corrupt(store: ObjectStore, key: str, *needles: str,
                   exc: type[CorruptLedgerError] = CorruptLedgerError) -> CorruptLedgerError:
    with pytest.raises(exc) as info:
        open_and_read(store, key)
    err = info.value
    msg = str(err)
    assert exit_code_of(err) == 4
    assert store.url(key) in msg, msg
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"
    assert "\n" not in msg
    return err


def entries_of(n_entries: int, per_entry: int, *, start: int = 0) -> list[list[Record]]:
    out = []
    i = start
    for _ in range(n_entries):
        recs = []
        for _ in range(per_entry):
            recs.append(Record(f"k{i}".encode(), f"v{i}".encode(), {"i": str(i)}, 1000 + i, i))
            i += 1
        out.append(recs)
    return out


def sample_entries() -> list[list[Record]]:
    return [
        [
            Record(b"alpha", b"one", {"a": "1", "b": "two"}, 100, 7),
            Record(None, b"keyless", {}, 101, None),
            Record(b"gone", None, {}, 102, None),  # tombstone: value None
            Record(b"empty", b"", {"x": ""}, 103, -5),  # tombstone: value empty
        ],
        [
            Record(b"\x00\xff\x80bin-key", bytes(range(256)) * 3, {}, 200, 1 << 40),
            Record(None, None, {}, 201, None),  # no key, no value
        ],
        [Record(b"alpha", b"again", {"\u00e9": "\u2603"}, 300, 0)],
    ]


# ------------------------------------------------------------------- round trip


def test_round_trip_keys_values_properties_times_ids() -> None:
    entries = sample_entries()
    _, _, f = put_open(mem(), build(entries, ledger_id=5))
    assert f.ledger_id == 5 and f.n_entries == 3 and f.n_records == 7
    msgs = list(f.messages())
    flat = [(e, b, r) for e, recs in enumerate(entries) for b, r in enumerate(recs)]
    assert len(msgs) == len(flat)
    for m, (e, b, r) in zip(msgs, flat, strict=True):
        assert m.id == MessageId(5, e, b)
        assert m.key == r.key
        assert m.value == r.value
        assert dict(m.properties) == dict(r.properties)
        assert m.publish_time == r.publish_time
        assert m.event_time == r.event_time
    # the distinctions a reader must keep
    assert msgs[2].value is None and msgs[3].value == b""
    assert msgs[1].key is None and msgs[5].key is None and msgs[5].value is None
    assert msgs[4].value == bytes(range(256)) * 3 and msgs[4].key == b"\x00\xff\x80bin-key"
    assert [m.is_tombstone for m in msgs] == [False, False, True, True, False, False, False]
    assert f.footer.meta == {"note": "test"}
    assert list(f.footer.col("e_publish")) == [103, 201, 300]


def test_footer_flags_and_key_hashes() -> None:
    entries = sample_entries()
    _, _, f = put_open(mem(), build(entries))
    recs = [r for e in entries for r in e]
    flags = f.footer.col("r_flags")
    hi, lo = f.footer.col("r_hash_hi"), f.footer.col("r_hash_lo")
    assert list(flags) == [
        FLAG_HAS_KEY,
        0,
        FLAG_HAS_KEY | FLAG_TOMBSTONE,
        FLAG_HAS_KEY | FLAG_TOMBSTONE,
        FLAG_HAS_KEY,
        FLAG_TOMBSTONE,  # no key, value nil: the tombstone bit means "value nil or empty"
        FLAG_HAS_KEY,
    ]
    for i, r in enumerate(recs):
        if r.key is None:
            assert (int(hi[i]), int(lo[i])) == (0, 0)
        else:
            assert (int(hi[i]), int(lo[i])) == key_hash(r.key)
    # same key, same hash; different keys, different hashes
    assert (hi[0], lo[0]) == (hi[6], lo[6])
    assert (hi[0], lo[0]) != (hi[2], lo[2])
    assert key_hash(b"alpha") != key_hash(b"alphb")
    # an original ledger derives batch indexes and entry ids from its layout
    assert list(f.batch_indexes) == [0, 1, 2, 3, 0, 1, 0]
    assert list(f.entry_ids) == [0, 1, 2] and list(f.entry_ledgers) == [5, 5, 5]
    assert list(f.footer.delete_since()) == [0] * 7


def test_frames_and_record_slices_match_the_documented_layout() -> None:
    entries = sample_entries()
    data = build(entries)
    _, _, f = put_open(mem(), data)
    offs, lens = f.footer.col("e_offset"), f.footer.col("e_length")
    r_off, r_size = f.footer.col("r_offset"), f.footer.col("r_size")
    rec_start = f.footer.e_rec_start
    for e, recs in enumerate(entries):
        o, n = int(offs[e]), int(lens[e])
        plen, crc, count = FRAME_HEADER.unpack_from(data, o)
        payload = data[o + FRAME_HEADER.size: o + n]
        assert plen == len(payload) == n - 12
        assert crc == checksum(payload)
        assert count == len(recs)
        # every record is a self-contained msgpack array at its footer offset/size
        for b, r in enumerate(recs):
            i = int(rec_start[e]) + b
            raw = payload[int(r_off[i]): int(r_off[i]) + int(r_size[i])]
            assert raw == encode_record(r)
            assert msgpack.unpackb(raw)[0] == r.key
    # frames are contiguous and the footer follows the last one
    t = decode_trailer(data, len(data), "x")
    assert int(offs[0]) == HEADER_SIZE
    assert all(int(offs[i]) + int(lens[i]) == int(offs[i + 1]) for i in range(len(offs) - 1))
    assert int(offs[-1]) + int(lens[-1]) == t.footer_offset
    assert t.footer_offset + t.footer_length + TRAILER_SIZE == len(data)
    assert t.footer_crc == checksum(data[t.footer_offset: t.footer_offset + t.footer_length])


def test_header_and_trailer_fields_at_documented_offsets() -> None:
    data = build(sample_entries(), ledger_id=0x0102030405060708, created_ms=CREATED)
    # header (docs/format.md): magic 0-7, version 8-9, kind 10, flags 11, ledger id 12-19,
    # created 20-27, CRC32C 28-31 of the header with the CRC zeroed
    assert data[0:8] == MAGIC == b"SHALELDG"
    assert struct.unpack_from("<H", data, 8)[0] == FORMAT_VERSION == 3
    assert data[10] == KIND_ORIGINAL and data[11] == 0
    assert struct.unpack_from("<Q", data, 12)[0] == 0x0102030405060708
    assert struct.unpack_from("<q", data, 20)[0] == CREATED
    header = bytearray(data[:HEADER_SIZE])
    crc = struct.unpack_from("<I", header, 28)[0]
    header[28:32] = b"\0\0\0\0"
    assert crc == checksum(bytes(header))
    # trailer: footer offset 0-7, length 8-15, ledger id 16-23, created 24-31, footer CRC
    # 32-35, version 36-37, kind 38, flags 39, reserved 40-43, CRC 44-47, magic 48-55
    tr = data[-TRAILER_SIZE:]
    assert TRAILER_SIZE == 56
    fo, fl, lid, created = struct.unpack_from("<QQQq", tr, 0)
    assert fo + fl == len(data) - TRAILER_SIZE
    assert lid == 0x0102030405060708 and created == CREATED
    assert struct.unpack_from("<I", tr, 32)[0] == checksum(data[fo: fo + fl])
    assert struct.unpack_from("<H", tr, 36)[0] == 3 and tr[38] == KIND_ORIGINAL and tr[39] == 0
    assert tr[40:44] == b"\0\0\0\0"
    zeroed = bytearray(tr)
    zeroed[44:48] = b"\0\0\0\0"
    assert struct.unpack_from("<I", tr, 44)[0] == checksum(bytes(zeroed))
    assert tr[48:56] == END_MAGIC == b"SHALEEND"


def test_header_is_32_bytes_and_the_first_frame_starts_at_byte_32() -> None:
    """docs/format.md: "header (32 bytes)", "+---+ 32 | entry frame 0"."""
    data = build(sample_entries())
    _, _, f = put_open(mem(), data)
    assert HEADER_SIZE == 32
    assert int(f.footer.col("e_offset")[0]) == 32
    # the first frame header sits right after the documented header
    plen, _, count = FRAME_HEADER.unpack_from(data, 32)
    assert count == 4 and plen == int(f.footer.col("e_length")[0]) - 12


def test_partial_reads_and_small_chunks_give_the_same_records() -> None:
    entries = entries_of(20, 5)
    _, _, f = put_open(mem(), build(entries))
    everything = list(f.messages())
    assert [m.value for m in everything] == [f"v{i}".encode() for i in range(100)]
    # tiny chunks force one ranged read per entry
    assert list(f.messages(chunk_bytes=1)) == everything
    assert list(f.messages(13, 57, chunk_bytes=100)) == everything[13:57]
    assert list(f.messages(57)) == everything[57:]
    assert list(f.messages(99, 1000)) == everything[99:]
    assert list(f.messages(40, 40)) == []
    assert [f.record_id(i) for i in range(100)] == [m.id for m in everything]


def test_large_footer_is_read_beyond_the_tail() -> None:
    """A footer bigger than the 256 KiB tail read needs a second ranged read."""
    entries = entries_of(300, 50)
    data = build(entries, ledger_id=9)
    loc = mem()
    store, key, f = put_open(loc, data)
    t = decode_trailer(data, len(data), "x")
    assert t.footer_length > 256 * 1024  # the footer does not fit in the tail read
    assert f.n_records == 15_000 and f.n_entries == 300
    assert f.first_id() == MessageId(9, 0, 0) and f.last_id() == MessageId(9, 299, 49)
    msgs = list(f.messages(14_990))
    assert [m.value for m in msgs] == [f"v{i}".encode() for i in range(14_990, 15_000)]
    assert f.find(MessageId(9, 150, 7)) == 150 * 50 + 7
    # a flipped byte deep in that footer is still caught
    bad = bytearray(data)
    bad[t.footer_offset + 1000] ^= 0x01
    store.put(key, bytes(bad))
    expect_corrupt(store, key, "footer checksum mismatch", f"byte {t.footer_offset}")


def test_empty_ledger() -> None:
    _, _, f = put_open(mem(), build([], ledger_id=3))
    assert f.n_entries == 0 and f.n_records == 0
    assert f.first_id() is None and f.last_id() is None
    assert list(f.messages()) == []
    assert f.find(MessageId(3, 0, 0)) == 0


# --------------------------------------------------------------------- seeking


def test_find_record_id_first_last_in_an_original_ledger() -> None:
    # ledger 7: entry 0 has 3 records, entry 1 has 2, entry 2 has 4
    entries = [entries_of(1, 3)[0], entries_of(1, 2, start=3)[0], entries_of(1, 4, start=5)[0]]
    _, _, f = put_open(mem(), build(entries, ledger_id=7))
    assert f.first_id() == MessageId(7, 0, 0)
    assert f.last_id() == MessageId(7, 2, 3)
    assert [str(f.record_id(i)) for i in range(9)] == [
        "7:0:0", "7:0:1", "7:0:2", "7:1:0", "7:1:1", "7:2:0", "7:2:1", "7:2:2", "7:2:3"]
    # exact ids
    for i in range(9):
        assert f.find(f.record_id(i)) == i
    # missing ids map to the next existing record
    assert f.find(MessageId(7, 0, 3)) == 3  # past entry 0's last batch -> entry 1
    assert f.find(MessageId(7, 1, 99)) == 5
    assert f.find(MessageId(7, 2, 4)) == 9  # past the last record -> end
    assert f.find(MessageId(7, 3, 0)) == 9
    # ids before and after the ledger
    assert f.find(MessageId(6, 99, 99)) == 0
    assert f.find(MIN_ID) == 0
    assert f.find(MessageId(8, 0, 0)) == 9
    assert f.find(MAX_ID) == 9
    # reading from find() starts at the right record
    assert [m.id for m in f.messages(f.find(MessageId(7, 1, 1)))][:2] == [MessageId(7, 1, 1), MessageId(7, 2, 0)]


def _compacted(loc: Location) -> tuple[ObjectStore, str, LedgerFile, list[tuple[MessageId, Record]]]:
    """A compacted part holding survivors from original ledgers 2, 3 and 6."""
    plan = [
        # (ledger, entry, batches, delete_since per record)
        (2, 0, [0, 2], [0, 0]),
        (2, 5, [1], [0]),
        (3, 1, [0, 3, 4], [0, 1234, 0]),
        (6, 0, [7], [99]),
    ]
    buf = io.BytesIO()
    w = LedgerWriter(buf, kind=KIND_COMPACTED, ledger_id=11, created_ms=CREATED)
    expected: list[tuple[MessageId, Record]] = []
    n = 0
    for led, ent, batches, since in plan:
        recs = []
        for ds in since:
            value = b"" if ds else f"val-{n}".encode()
            recs.append(Record(f"key-{n}".encode(), value, {"n": str(n)}, 500 + n, None))
            n += 1
        w.add_entry(encode_entry(recs), ledger=led, entry_id=ent,
                    batch=np.asarray(batches, dtype=np.uint32), delete_since=np.asarray(since, dtype=np.int64))
        expected += [(MessageId(led, ent, b), r) for b, r in zip(batches, recs, strict=True)]
    w.finish()
    store, key, f = put_open(loc, buf.getvalue(), "part-00000.ledger")
    return store, key, f, expected


def test_compacted_ledger_reads_back_original_ids() -> None:
    store, key, f, expected = _compacted(mem())
    assert f.footer.kind == KIND_COMPACTED and f.ledger_id == 11
    msgs = list(f.messages())
    assert [m.id for m in msgs] == [mid for mid, _ in expected]
    assert [m.value for m in msgs] == [r.value for _, r in expected]
    assert [m.key for m in msgs] == [r.key for _, r in expected]
    assert list(f.footer.delete_since()) == [0, 0, 0, 0, 1234, 0, 99]
    assert list(f.entry_ledgers) == [2, 2, 3, 6] and list(f.entry_ids) == [0, 5, 1, 0]
    assert f.first_id() == MessageId(2, 0, 0) and f.last_id() == MessageId(6, 0, 7)
    # the header of a compacted part says so
    assert LedgerFile.open(store, key).footer.kind == KIND_COMPACTED
    assert store.get(key)[10] == KIND_COMPACTED


def test_find_across_entries_of_different_original_ledgers() -> None:
    _, _, f, expected = _compacted(mem())
    ids = [mid for mid, _ in expected]  # 2:0:0 2:0:2 2:5:1 3:1:0 3:1:3 3:1:4 6:0:7
    for i, mid in enumerate(ids):
        assert f.find(mid) == i
    assert f.find(MessageId(2, 0, 1)) == 1  # dropped batch -> next batch in the entry
    assert f.find(MessageId(2, 0, 3)) == 2  # past the entry -> next entry of the ledger
    assert f.find(MessageId(2, 1, 0)) == 2  # dropped entry -> next entry
    assert f.find(MessageId(2, 6, 0)) == 3  # past ledger 2 -> first entry of ledger 3
    assert f.find(MessageId(3, 1, 1)) == 4
    assert f.find(MessageId(4, 0, 0)) == 6  # a ledger with no survivors -> ledger 6
    assert f.find(MessageId(5, 9, 9)) == 6
    assert f.find(MessageId(6, 0, 8)) == 7 == f.n_records
    assert f.find(MessageId(1, 99, 0)) == 0
    assert f.find(MessageId(7, 0, 0)) == 7


def test_compacted_entries_need_their_original_ids() -> None:
    w = LedgerWriter(io.BytesIO(), kind=KIND_COMPACTED, ledger_id=1, created_ms=0)
    with pytest.raises(InvalidInputError, match="original ids"):
        w.add_entry(encode_entry([Record(b"k", b"v")]))
    with pytest.raises(InvalidInputError, match="r_batch"):
        w.add_entry(encode_entry([Record(b"k", b"v")]), ledger=1, entry_id=0,
                    batch=np.asarray([0, 1], dtype=np.uint32), delete_since=np.asarray([0], dtype=np.int64))


def test_relabel_changes_the_ledger_id_and_still_verifies() -> None:
    loc = mem()
    original = build(sample_entries(), ledger_id=5)
    relabelled = relabel_ledger(original, 42)
    assert len(relabelled) == len(original)
    _, _, f = put_open(loc, relabelled)
    assert f.ledger_id == 42
    msgs = list(f.messages())
    assert [m.id.ledger for m in msgs] == [42] * 7
    assert [str(m.id) for m in msgs][:2] == ["42:0:0", "42:0:1"]
    assert [m.value for m in msgs] == [m.value for m in put_open(loc, original, "orig.ledger")[2].messages()]
    # header and trailer both carry the new id, with valid checksums
    assert struct.unpack_from("<Q", relabelled, 12)[0] == 42
    assert decode_trailer(relabelled, len(relabelled), "x").ledger_id == 42
    assert decode_trailer(relabelled, len(relabelled), "x").created_ms == CREATED
    # only the header and the trailer changed
    assert relabelled[HEADER_SIZE:-TRAILER_SIZE] == original[HEADER_SIZE:-TRAILER_SIZE]
    # relabelling refuses what is not a ledger
    with pytest.raises(CorruptLedgerError):
        relabel_ledger(original[:-1], 43)


# ------------------------------------------------------------------ corruption


def test_bit_flip_in_an_entry_payload_names_the_entry_and_byte() -> None:
    loc = mem()
    data = build(sample_entries(), ledger_id=5)
    store, key, f = put_open(loc, data)
    off = int(f.footer.col("e_offset")[1])
    bad = bytearray(data)
    bad[off + FRAME_HEADER.size + 7] ^= 0x04
    store.put(key, bytes(bad))
    err = expect_corrupt(store, key, "entry 5:1", f"byte {off}", "checksum mismatch")
    assert err.position == off and err.path == store.url(key)
    # the damage is local: entry 0 still reads, and opening alone does not fail
    f2 = LedgerFile.open(store, key)
    assert [m.key for m in f2.messages(0, 4)] == [b"alpha", None, b"gone", b"empty"]


def test_bit_flip_in_a_frame_header_is_caught() -> None:
    loc = mem()
    data = build(sample_entries(), ledger_id=5)
    store, key, f = put_open(loc, data)
    off = int(f.footer.col("e_offset")[2])
    for pos in (off, off + 4, off + 8):  # length, CRC, record count
        bad = bytearray(data)
        bad[pos] ^= 0x01
        store.put(key, bytes(bad))
        expect_corrupt(store, key, "entry 5:2", f"byte {off}")


def test_flipped_byte_in_the_footer() -> None:
    loc = mem()
    data = build(sample_entries())
    t = decode_trailer(data, len(data), "x")
    store, key, _ = put_open(loc, data)
    for delta in (0, t.footer_length // 2, t.footer_length - 1):
        bad = bytearray(data)
        bad[t.footer_offset + delta] ^= 0x80
        store.put(key, bytes(bad))
        err = expect_corrupt(store, key, "footer checksum mismatch", f"byte {t.footer_offset}")
        assert err.position == t.footer_offset


def test_flipped_byte_in_the_header_and_trailer() -> None:
    loc = mem()
    data = build(sample_entries())
    store, key, _ = put_open(loc, data)
    bad = bytearray(data)
    bad[13] ^= 0x01  # inside the header's ledger id
    store.put(key, bytes(bad))
    expect_corrupt(store, key, "header checksum mismatch", "byte 0")
    bad = bytearray(data)
    bad[-TRAILER_SIZE + 26] ^= 0x01  # inside the trailer's created time
    store.put(key, bytes(bad))
    expect_corrupt(store, key, "trailer checksum mismatch", f"byte {len(data) - TRAILER_SIZE}")


def test_header_and_trailer_that_disagree() -> None:
    data = build(sample_entries(), ledger_id=5)
    bad = bytearray(data)
    h = list(struct.unpack_from(_HEADER_FMT, data, 0))
    h[4], h[6] = 6, 0  # another ledger id, with a valid header checksum
    h[6] = checksum(struct.pack(_HEADER_FMT, *h))
    bad[:HEADER_SIZE] = struct.pack(_HEADER_FMT, *h)
    store, key, _ = put_open(mem(), build([[Record(b"k", b"v")]]))
    store.put(key, bytes(bad))
    expect_corrupt(store, key, "disagree")


@pytest.mark.parametrize("cut", [1, 10, TRAILER_SIZE, TRAILER_SIZE + 5, "footer", "mid-entries"])
def test_truncated_object(cut: int | str) -> None:
    data = build(sample_entries())
    t = decode_trailer(data, len(data), "x")
    if cut == "footer":
        short = data[: t.footer_offset]
    elif cut == "mid-entries":
        short = data[: t.footer_offset - 100]
    else:
        assert isinstance(cut, int)
        short = data[:-cut]
    store, key, _ = put_open(mem(), build([[Record(b"k", b"v")]]))
    store.put(key, short)
    err = expect_corrupt(store, key, "truncated", f"size {len(short)}")
    assert err.position == len(short) - TRAILER_SIZE


@pytest.mark.parametrize("size", [0, 1, TRAILER_SIZE, 32 + TRAILER_SIZE - 1])
def test_object_smaller_than_header_and_trailer(size: int) -> None:
    data = build(sample_entries())
    store, key, _ = put_open(mem(), data)
    # keep the real trailer where there is room, so only the size gives it away
    store.put(key, data[-size:] if size else b"")
    expect_corrupt(store, key, "truncated", f"{size} bytes")


def test_bad_magic_at_the_start() -> None:
    data = build(sample_entries())
    assert len(data) < 256 * 1024  # small: the header arrives with the tail read
    bad = bytearray(data)
    bad[0:8] = b"PAR1\0\0\0\0"
    store, key, _ = put_open(mem(), data)
    store.put(key, bytes(bad))
    err = expect_corrupt(store, key, "bad magic", "not a Shale ledger")
    assert err.position == 0


@pytest.mark.parametrize("size", [100, 5000, 300_000])
def test_garbage_bytes_are_not_a_ledger(size: int) -> None:
    rng = random.Random(size)
    junk = bytes(rng.getrandbits(8) for _ in range(size))
    store, key, _ = put_open(mem(), build([[Record(b"k", b"v")]]))
    store.put(key, junk)
    expect_corrupt(store, key, "not a ledger object", f"size {size}")
    store.put(key, b'{"this": "is json, not a ledger"}' * 10)
    expect_corrupt(store, key, "not a ledger object")


def _with_trailer_version(data: bytes, version: int) -> bytes:
    fields = list(struct.unpack_from(_TRAILER_FMT, data, len(data) - TRAILER_SIZE))
    fields[5] = version
    fields[8] = 0
    fields[8] = checksum(struct.pack(_TRAILER_FMT, *fields))  # a well-formed trailer
    return data[:-TRAILER_SIZE] + struct.pack(_TRAILER_FMT, *fields)


def _with_header_version(data: bytes, version: int) -> bytes:
    fields = list(struct.unpack_from(_HEADER_FMT, data, 0))
    fields[1] = version
    fields[6] = 0
    fields[6] = checksum(struct.pack(_HEADER_FMT, *fields))
    return struct.pack(_HEADER_FMT, *fields) + data[struct.calcsize(_HEADER_FMT):]


@pytest.mark.parametrize("where", ["trailer", "header", "both"])
def test_future_format_version_is_refused_by_version(where: str) -> None:
    data = build(sample_entries())
    bad = data
    if where in ("trailer", "both"):
        bad = _with_trailer_version(bad, 4)
        # the patched trailer is well formed: its own checksum matches
        fields = struct.unpack_from(_TRAILER_FMT, bad, len(bad) - TRAILER_SIZE)
        body = struct.pack(_TRAILER_FMT, *fields[:8], 0, fields[9])
        assert checksum(body) == fields[8]
    if where in ("header", "both"):
        bad = _with_header_version(bad, 4)
    store, key, _ = put_open(mem(), data)
    store.put(key, bad)
    err = expect_corrupt(store, key, "version 4", "not supported", exc=UnsupportedVersionError)
    assert "checksum" not in str(err)
    assert isinstance(err, CorruptLedgerError) and exit_code_of(err) == 4


def test_unknown_version_wins_over_checksum() -> None:
    """A future trailer whose checksum we cannot judge is still reported as a version."""
    data = build(sample_entries())
    bad = bytearray(data)
    struct.pack_into("<H", bad, len(bad) - TRAILER_SIZE + 36, 7)  # stale trailer CRC
    store, key, _ = put_open(mem(), data)
    store.put(key, bytes(bad))
    expect_corrupt(store, key, "version 7", exc=UnsupportedVersionError)


# --------------------------------------------------------------- hostile input


def _hostile_entry(payload: bytes, n_records: int = 1) -> EncodedEntry:
    z64 = np.zeros(n_records, dtype=np.uint64)
    return EncodedEntry(payload, np.zeros(n_records, dtype=np.uint32),
                        np.full(n_records, len(payload), dtype=np.uint32), z64, z64.copy(),
                        np.full(n_records, FLAG_HAS_KEY, dtype=np.uint8), 0)


@pytest.mark.parametrize("payload", [
    b"\x95\xc6\x7f\xff\xff\xff" + b"x" * 64,  # key: bin32 declaring 2 GiB
    b"\x95\xc4\x01k\xc6\xff\xff\xff\xfe" + b"x" * 64,  # value: bin32 declaring 4 GiB
    b"\xdd\xff\xff\xff\xff" + b"\xc0" * 64,  # array32 declaring 4 G elements
    b"\x95\xc0\xc0\xdf\xff\xff\xff\xff" + b"\xc0" * 64,  # map32 declaring 4 G pairs
    b"\x95\xc0\xc0\xdb\x7f\xff\xff\xff" + b"x" * 64,  # str32 declaring 2 GiB
])
def test_huge_declared_lengths_are_refused_without_allocating(payload: bytes) -> None:
    buf = io.BytesIO()
    w = LedgerWriter(buf, kind=KIND_ORIGINAL, ledger_id=4, created_ms=0)
    w.add_entry(encode_entry([Record(b"ok", b"fine")]))
    w.add_entry(_hostile_entry(payload))  # a frame with a valid checksum around hostile records
    w.finish()
    store, key, f = put_open(mem(), buf.getvalue())
    assert [m.value for m in f.messages(0, 1)] == [b"fine"]
    tracemalloc.start()
    try:
        with pytest.raises(CorruptLedgerError) as info:
            list(f.messages())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 1024 * 1024
    msg = str(info.value)
    assert store.url(key) in msg and "entry 4:1" in msg
    assert exit_code_of(info.value) == 4


def test_decode_records_bounds_each_record() -> None:
    big = encode_record(Record(b"k", b"v" * 500))
    # a complete record over the limit is refused, naming where
    with pytest.raises(CorruptLedgerError, match="WHERE: undecodable record"):
        list(decode_records(big, 1, where="WHERE", max_record_bytes=100))
    assert next(decode_records(big, 1, where="WHERE", max_record_bytes=1000))[1] == b"v" * 500
    # a declared length far over the limit with no data behind it
    tracemalloc.start()
    try:
        with pytest.raises(CorruptLedgerError, match="WHERE"):
            list(decode_records(b"\x95\xc6\x7f\xff\xff\xff", 1, where="WHERE", max_record_bytes=1024))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024
    # count mismatches, wrong shapes and wrong types
    two = encode_record(Record(b"a", b"1")) + encode_record(Record(b"b", b"2"))
    with pytest.raises(CorruptLedgerError, match="footer says 3"):
        list(decode_records(two, 3, where="W"))
    with pytest.raises(CorruptLedgerError):
        list(decode_records(two, 1, where="W"))
    with pytest.raises(CorruptLedgerError, match="5-element"):
        list(decode_records(msgpack.packb([b"k", b"v"]), 1, where="W"))
    with pytest.raises(CorruptLedgerError, match="wrong types"):
        list(decode_records(msgpack.packb(["str-key", b"v", None, 0, None]), 1, where="W"))
    with pytest.raises(CorruptLedgerError):
        list(decode_records(b"\xc1\xc1\xc1", 1, where="W"))  # 0xc1 is never valid msgpack


def test_reader_refuses_records_over_its_limit() -> None:
    store, key, f = put_open(mem(), build([[Record(b"k", b"x" * 5000)]], ledger_id=8))
    with pytest.raises(CorruptLedgerError) as info:
        list(f.messages(max_record_bytes=1000))
    assert store.url(key) in str(info.value) and "entry 8:0" in str(info.value)
    assert [m.value for m in f.messages(max_record_bytes=10_000)] == [b"x" * 5000]


def test_encode_entry_refuses_records_over_the_limit() -> None:
    rec = Record(b"key", b"v" * 1000)
    size = len(encode_record(rec))
    assert encode_entry([rec], max_record_bytes=size).n_records == 1  # exactly at the limit
    with pytest.raises(RecordTooLargeError, match=f"{size} bytes exceeds the maximum of {size - 1}") as info:
        encode_entry([Record(b"a", b"small"), rec], max_record_bytes=size - 1)
    assert exit_code_of(info.value) == 2 and isinstance(info.value, InvalidInputError)
    with pytest.raises(InvalidInputError):
        encode_entry([])
    with pytest.raises(InvalidInputError, match="key must be bytes"):
        encode_entry([Record("text-key", b"v")])  # type: ignore[arg-type]


def test_writer_refuses_entries_over_its_limit_and_writes_after_finish() -> None:
    w = LedgerWriter(io.BytesIO(), kind=KIND_ORIGINAL, ledger_id=1, created_ms=0, max_entry_bytes=100)
    with pytest.raises(RecordTooLargeError):
        w.add_entry(encode_entry([Record(b"k", b"v" * 200)]))
    w.add_entry(encode_entry([Record(b"k", b"v")]))
    w.finish()
    with pytest.raises(InvalidInputError, match="finished"):
        w.add_entry(encode_entry([Record(b"k", b"v")]))
    with pytest.raises(InvalidInputError):
        LedgerWriter(io.BytesIO(), kind=9, ledger_id=1, created_ms=0)


# ------------------------------------------------------------------ message ids


def test_message_id_ordering() -> None:
    ids = [MessageId(2, 0, 0), MessageId(1, 3, 0), MessageId(1, 2, 10), MessageId(1, 2, 3), MessageId(0, 99, 99),
           MessageId(10, 0, 0)]
    assert sorted(ids) == [MessageId(0, 99, 99), MessageId(1, 2, 3), MessageId(1, 2, 10), MessageId(1, 3, 0),
                           MessageId(2, 0, 0), MessageId(10, 0, 0)]
    # numeric, not textual: 10 > 2
    assert MessageId(10, 0, 0) > MessageId(2, 0, 0) and MessageId(1, 2, 10) > MessageId(1, 2, 3)
    assert MIN_ID <= MessageId(0, 0, 0) < MessageId(0, 0, 1) < MAX_ID
    assert MessageId(3, 4, 5) == MessageId(3, 4, 5) and len({MessageId(3, 4, 5), MessageId(3, 4, 5)}) == 1
    assert MessageId(3, 4) == MessageId(3, 4, 0)


def test_message_id_text_form() -> None:
    assert str(MessageId(3, 17, 0)) == "3:17:0"
    assert MessageId.parse("3:17:0") == MessageId(3, 17, 0)
    assert MessageId.parse("3:17:2") == MessageId(3, 17, 2)
    assert MessageId.parse(str(MAX_ID)) == MAX_ID
    assert str(MAX_ID) == f"{_U64}:{_U64}:{_U32}"
    for mid in (MessageId(0, 0, 0), MessageId(12345678901234, 5, 7)):
        assert MessageId.parse(str(mid)) == mid
    assert MessageId(1, 2, 3).as_tuple() == (1, 2, 3)


@pytest.mark.parametrize("text", ["", "3:17", "3:17:0:1", "a:b:c", "-1:0:0", "3:-1:0", "3:17:x", "3.0:17:0",
                                  "3 17 0", "3::0", "earliest", "0x3:1:0",
                                  # one spelling only: no spaces around, no leading zero
                                  "  3:17:2 ", " 1:0:0", "1:0:0\n", "01:00:00", "3:017:0", "3:17:00"])
def test_message_id_parse_errors(text: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        MessageId.parse(text)
    assert exit_code_of(info.value) == 2
    msg = str(info.value)
    assert "bad message id" in msg and repr(text) in msg  # quotes what was given
    assert "LEDGER:ENTRY:BATCH" in msg  # and says what is expected


@pytest.mark.parametrize("text", [f"{_U64 + 1}:0:0", f"0:{_U64 + 1}:0", f"0:0:{_U32 + 1}"])
def test_message_id_parse_out_of_range(text: str) -> None:
    with pytest.raises(InvalidInputError, match="out of range") as info:
        MessageId.parse(text)
    assert exit_code_of(info.value) == 2


def test_message_id_out_of_range_construction() -> None:
    for args in [(-1, 0, 0), (0, -1, 0), (0, 0, -1), (_U64 + 1, 0, 0), (0, 0, _U32 + 1)]:
        with pytest.raises(InvalidInputError):
            MessageId(*args)


def test_message_id_successor() -> None:
    assert MessageId(1, 2, 3).successor() == MessageId(1, 2, 4)
    assert MessageId(1, 2, _U32).successor() == MessageId(1, 3, 0)
    a = MessageId(4, 5, 6)
    assert a < a.successor()
    # nothing lies strictly between an id and its successor
    neighbours = [MessageId(4, 5, 6), MessageId(4, 5, 7), MessageId(4, 6, 0), MessageId(4, 5, 5)]
    assert not [x for x in neighbours if a < x < a.successor()]


# ----------------------------------------------------------- on every backend


def test_truncated_and_bit_flipped_objects_on_every_backend(topic_uri: str) -> None:
    loc = resolve(topic_uri)
    store = loc.store
    data = build(sample_entries(), ledger_id=5)
    good = loc.key("ledgers/00000000000000000005-good.ledger")
    store.put(good, data)
    assert open_and_read(store, good)[0].key == b"alpha"
    f = LedgerFile.open(store, good)
    off = int(f.footer.col("e_offset")[1])

    flipped = loc.key("ledgers/00000000000000000005-flip.ledger")
    bad = bytearray(data)
    bad[off + FRAME_HEADER.size + 3] ^= 0x20
    store.put(flipped, bytes(bad))
    expect_corrupt(store, flipped, "entry 5:1", f"byte {off}", "checksum mismatch")

    t = decode_trailer(data, len(data), "x")
    footer_flip = loc.key("ledgers/00000000000000000005-footer.ledger")
    bad = bytearray(data)
    bad[t.footer_offset + 3] ^= 0x01
    store.put(footer_flip, bytes(bad))
    expect_corrupt(store, footer_flip, "footer checksum mismatch", f"byte {t.footer_offset}")

    truncated = loc.key("ledgers/00000000000000000005-short.ledger")
    store.put(truncated, data[:-20])
    expect_corrupt(store, truncated, "truncated", f"size {len(data) - 20}")

    tiny = loc.key("ledgers/00000000000000000005-tiny.ledger")
    store.put(tiny, data[:40])
    expect_corrupt(store, tiny, "truncated", "40 bytes")


def test_empty_object_on_every_backend(topic_uri: str) -> None:
    loc = resolve(topic_uri)
    key = loc.key("ledgers/00000000000000000001-empty.ledger")
    loc.store.put(key, b"")
    expect_corrupt(loc.store, key, "truncated", "0 bytes")


def test_object_shrinking_after_open_is_reported_as_truncated(topic_uri: str) -> None:
    """The footer was read, then the object lost its entries: the ranged read comes back short."""
    loc = resolve(topic_uri)
    key = loc.key("ledgers/00000000000000000005-x.ledger")
    data = build(sample_entries(), ledger_id=5)
    loc.store.put(key, data)
    f = LedgerFile.open(loc.store, key)
    off = int(f.footer.col("e_offset")[2])
    loc.store.put(key, data[: off + 5])
    with pytest.raises(CorruptLedgerError) as info:
        list(f.messages())
    msg = str(info.value)
    assert loc.store.url(key) in msg and "truncated" in msg and f"object ends at {off + 5}" in msg


# ------------------------------------------------------------------- footer decoding fast path

def _refooter(data: bytes, change: dict[str, np.ndarray], framing: bytes | None = None) -> bytes:
    """``data`` with its footer re-encoded the way the writer frames it, some columns
    replaced (and, with ``framing``, its first bytes replaced too)."""
    from shale.ledger.format import Trailer, decode_footer, encode_footer, encode_trailer
    t = decode_trailer(data, len(data), "x")
    foot = decode_footer(data[t.footer_offset:t.footer_offset + t.footer_length], t, "x")
    cols = {**foot.cols, **change}
    footer = b"".join(encode_footer(t.kind, foot.e_rec_start, cols, foot.meta))
    if framing is not None:
        footer = framing + footer[len(framing):]
    trailer = encode_trailer(Trailer(t.footer_offset, len(footer), t.ledger_id, t.created_ms, checksum(footer),
                                     FORMAT_VERSION, t.kind))
    return data[:t.footer_offset] + footer + trailer


def test_footer_columns_are_views_of_the_footer_and_equal_a_msgpack_decode() -> None:
    """The writer's framing is split without copying the columns; any msgpack reader
    gets the same arrays."""
    from shale.ledger.format import _split_footer, decode_footer
    data = build(entries_of(40, 25))
    t = decode_trailer(data, len(data), "x")
    raw = data[t.footer_offset:t.footer_offset + t.footer_length]
    assert _split_footer(memoryview(raw)) is not None
    foot = decode_footer(raw, t, "x")
    doc = msgpack.unpackb(raw, raw=False)
    assert doc["n_entries"] == foot.n_entries == 40 and doc["meta"] == foot.meta == {"note": "test"}
    whole = np.frombuffer(raw, dtype=np.uint8)
    for name, arr in foot.cols.items():
        assert arr.tobytes() == doc["cols"][name], name
        assert np.shares_memory(arr, whole), f"{name} was copied"


@pytest.mark.parametrize("framing,needle", [
    (b"\x83\xa9n_entries\x28\xa4cols\x8c\xabe_rec_start\xc6\x7f\xff\xff\xff", "undecodable"),  # bin past the end
    (b"\x83\xa9n_entries\x28\xa4cols\x8c\xabe_rec_stert", "e_rec_start missing"),  # renamed column
    (b"\x83\xa9n_entries\x29", "wrong shape"),  # one entry too many
])
def test_hostile_footers_in_the_writers_framing(framing: bytes, needle: str) -> None:
    data = _refooter(build(entries_of(40, 25)), {}, framing)
    loc = mem()
    loc.store.put(loc.key("l"), data)
    with pytest.raises(CorruptLedgerError, match=needle):
        LedgerFile.open(loc.store, loc.key("l"))


def test_record_offsets_that_wrap_around_32_bits_are_refused() -> None:
    """Sizes of 2**32 - 10, 20 and 5 bytes: the offsets agree with the sizes modulo 2**32
    and the last record ends at the payload's end, yet the records overrun the entry."""
    data = build([[Record(b"a", b"x" * 5, {}, 1), Record(b"b", b"y" * 5, {}, 1), Record(b"c", b"z" * 5, {}, 1)]])
    loc = mem()
    _, _, f = put_open(loc, data)
    size = f.footer.col("r_size").copy()
    end = int(f.footer.col("r_offset")[2]) + int(size[2])  # the payload's length
    size[:] = [(1 << 32) - 10, 20, end - 10]
    offset = np.array([0, (1 << 32) - 10, 10], dtype="<u4")
    bad = _refooter(data, {"r_size": size, "r_offset": offset})
    loc.store.put(loc.key("w"), bad)
    with pytest.raises(CorruptLedgerError, match="record offsets do not follow record sizes"):
        LedgerFile.open(loc.store, loc.key("w"))


def test_local_big_reads_are_mapped_and_outlive_the_file(tmp_path: object) -> None:
    """A big read of a local object is a view of the mapped file, equal to a copying read,
    and stays readable after the object is deleted (gc while a run still reads it)."""
    loc = resolve(str(tmp_path))
    key = loc.key("big.ledger")
    data = bytes(range(256)) * 12_000  # 3 MB
    loc.store.put(key, data)
    view = loc.store.get_view(key, 70_000, len(data) + 10)
    assert isinstance(view, memoryview) and view.readonly
    assert view == loc.store.get_range(key, 70_000, len(data))
    small = loc.store.get_view(key, 5, 4000)
    assert isinstance(small, bytes) and small == data[5:4000]
    loc.store.delete(key)
    assert bytes(view[-256:]) == bytes(range(256))
    with pytest.raises(FileNotFoundError):
        loc.store.get_view(key, 0, len(data))


def test_a_column_given_in_chunks_encodes_as_the_joined_column() -> None:
    """The writer hands big batches of a column over as they are (no join): the footer's
    bytes are exactly those of the joined column, including empty chunks."""
    from shale.ledger.format import decode_footer, encode_footer
    data = build(entries_of(30, 20))
    t = decode_trailer(data, len(data), "x")
    foot = decode_footer(data[t.footer_offset:t.footer_offset + t.footer_length], t, "x")
    cols = {name: np.asarray(col) for name, col in foot.cols.items()}
    n = len(cols["r_hash_hi"])
    cols |= {"r_ledger": np.ones(n, np.uint64), "r_entry": np.arange(n, dtype=np.uint64),
             "r_batch": np.arange(n, dtype=np.uint32), "r_delete_since": np.arange(n, dtype=np.int64)}
    joined = b"".join(encode_footer(KIND_COMPACTED, foot.e_rec_start, cols, foot.meta))
    cuts = [0, 0, 7, n // 2, n]  # an empty chunk, then uneven ones
    chunked = {name: ([col[a:b] for a, b in itertools.pairwise(cuts)] if len(col) == n else col)
               for name, col in cols.items()}
    assert b"".join(encode_footer(KIND_COMPACTED, foot.e_rec_start, chunked, foot.meta)) == joined


@pytest.mark.parametrize("records_per_batch", [3, 20_000])
def test_a_ledger_written_in_batches_reads_back_whole(tmp_path: Path, records_per_batch: int) -> None:
    """Compacted ledgers written batch by batch (small batches joined, big ones written
    chunk by chunk) read back with every column in order."""
    loc = resolve(str(tmp_path))
    rng = np.random.default_rng(3)
    sink = loc.store.open_writer(loc.key("c.ledger"))
    w = LedgerWriter(sink, kind=KIND_COMPACTED, ledger_id=9, created_ms=1)
    his: list[np.ndarray] = []
    for b in range(4):
        n = records_per_batch
        payload = rng.integers(0, 256, size=10 * n, dtype=np.uint8).tobytes()
        header = FRAME_HEADER.pack(len(payload), checksum(payload), n)
        hi = rng.integers(0, 2**63, size=n, dtype=np.uint64)
        his.append(hi)
        cols = {"r_hash_hi": hi, "r_hash_lo": hi ^ np.uint64(5), "r_flags": np.full(n, 1, np.uint8),
                "r_offset": (np.arange(n) * 10).astype(np.uint32), "r_size": np.full(n, 10, np.uint32)}
        w.add_frames(header + payload, np.array([len(header) + len(payload)]), np.array([n]), np.array([b]), cols,
                     ledgers=np.array([1]), entry_ids=np.array([b]), batch=np.arange(n, dtype=np.uint32),
                     delete_since=np.zeros(n, np.int64))
    w.finish()
    sink.close()
    f = LedgerFile.open(loc.store, loc.key("c.ledger"), ledger_id=9, kind=KIND_COMPACTED)
    assert f.n_records == 4 * records_per_batch
    assert np.array_equal(f.footer.col("r_hash_hi"), np.concatenate(his))
    assert f.footer.col("r_batch").tolist() == list(range(records_per_batch)) * 4
