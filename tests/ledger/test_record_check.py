"""``check_records`` (``ledger/_kernels.c`` and its pure-Python fallback in
:mod:`ledger.kernels`) accepts exactly the records a strict msgpack decoding accepts, with
their footer flags, and :func:`~ledger.kernels.record_problem` says what is wrong otherwise.

Pass two copies records by the sizes a footer claims; a crafted footer can move a record
boundary by a byte (one size down, the next up) and still tile its entry.  Checked here:

* records built with :func:`~ledger.record.encode_record`, then with bytes flipped, cut
  short, or boundaries shifted between neighbours (that attack, both ways round): the C
  kernel, the fallback and a reference (msgpack decoding plus type checks) agree;
* the cases one by one: bytes in properties, text keys, invalid UTF-8 in a property
  (overlong forms, surrogates, past U+10FFFF), integers that do not fit an int64, the
  larger length and count encodings, wrong flags, crafted lengths that would run astray;
* impossible ranges and mismatched or mistyped inputs raise :class:`ValueError`, from the
  extension itself as from the wrapper, on any kind of buffer (bytes, memoryview, mmap).

The native half is skipped only when ``ledger.kernels._native`` is ``None``.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.ledger import kernels
from shale.ledger.record import Record, encode_record
from tests.needs import c_extension, need_c_extension, needs

pytestmark = pytest.mark.kernels  # (scripts/sanitize.sh runs these under ASan and UBSan)

NATIVE = kernels._native
needs_native = needs(c_extension(NATIVE, "ledger/_kernels.c"))

I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]
Buf = bytes | bytearray | memoryview

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
HAS_KEY, TOMBSTONE = 0x01, 0x02
ALL_BAD_UTF8 = [b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xe0\x9f\xbf", b"\xf0\x80\x80\x80", b"\xf0\x8f\xbf\xbf",
                b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xff", b"\x80",
                b"a\xbfb", b"\xe2\x82", b"\xe2\x82a", b"\xf0\x9f\x98", b"\xc3", b"abcdefgh\xc3", b"\xc3(",
                b"abcdefghijklmnop\xed\xa0\x80"]
ALL_GOOD_UTF8 = ["", "a", "é", "€", "😀", "\U0010ffff", "\ud7ff", "\ue000", "\x7f", "abcdefghé", "ab€cdefghijklmnop"]


@pytest.fixture(params=["native", "fallback"])
def kernel_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs a test once with the C kernels (skipped without them) and once with the fallback."""
    if request.param == "native":
        need_c_extension(NATIVE, "ledger/_kernels.c")
        yield "native"
    else:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(kernels, "_native", None)
            yield "fallback"


# ----------------------------------------------------------------------------------- helpers


def is_int64(x: object) -> bool:
    return type(x) is int and I64_MIN <= x <= I64_MAX


def reference_ok(data: bytes, flags: int) -> bool:
    """The reference: one object decoded by a strict msgpack unpacker fills ``data``, is a
    5-element array of the right types, and ``flags`` are its flags."""
    n = len(data)
    unpacker = msgpack.Unpacker(raw=False, use_list=False, strict_map_key=True, max_buffer_size=max(n, 1),
                                max_bin_len=n, max_str_len=n, max_array_len=n, max_map_len=n, max_ext_len=n)
    unpacker.feed(data)
    try:
        obj: Any = unpacker.unpack()
    except (ValueError, TypeError, msgpack.UnpackException):
        return False  # cut short, undecodable, or text that is not UTF-8
    if unpacker.tell() != n or type(obj) is not tuple or len(obj) != 5:
        return False
    key, value, props, publish, event = obj
    if (key is not None and type(key) is not bytes) or (value is not None and type(value) is not bytes):
        return False
    if props is not None and (type(props) is not dict
                              or not all(type(k) is str and type(v) is str for k, v in props.items())):
        return False
    if not is_int64(publish) or (event is not None and not is_int64(event)):
        return False
    want = (0 if key is None else HAS_KEY) | (TOMBSTONE if not value else 0)
    return flags == want


def flags_of(record: Record) -> int:
    return (0 if record.key is None else HAS_KEY) | (TOMBSTONE if not record.value else 0)


def columns(starts: list[int], sizes: list[int], flags: list[int]) -> tuple[I64, I64, U8]:
    return np.array(starts, dtype=np.int64), np.array(sizes, dtype=np.int64), np.array(flags, dtype=np.uint8)


def native_check(buf: Buf, s: I64, z: I64, f: U8) -> int:
    assert NATIVE is not None
    return int(NATIVE.check_records(buf, s, z, f))


def fallback_check(buf: Buf, s: I64, z: I64, f: U8) -> int:
    return kernels._check_records_python(buf, s, z, f)


def check_everywhere(buf: Buf, s: I64, z: I64, f: U8) -> int:
    """The first bad record by the reference; the C kernel, the fallback and
    ``record_problem`` (record by record) must agree with it."""
    data = bytes(buf)
    oks = [reference_ok(data[a:a + n], flag) for a, n, flag in zip(s.tolist(), z.tolist(), f.tolist(), strict=True)]
    for a, n, flag, ok in zip(s.tolist(), z.tolist(), f.tolist(), oks, strict=True):
        problem = kernels.record_problem(data[a:a + n], flag)
        assert (problem == "") == ok, (data[a:a + n].hex(), flag, problem)
    want = oks.index(False) if False in oks else -1
    assert fallback_check(buf, s, z, f) == want
    if NATIVE is not None:
        assert native_check(buf, s, z, f) == want
    assert kernels.check_records(buf, s, z, f) == want
    return want


def one(data: bytes, flags: int, pad: bytes = b"") -> int:
    """``check_everywhere`` for a single record (with bytes around it, so that reading
    past its end would find something)."""
    return check_everywhere(pad + data + pad, *columns([len(pad)], [len(data)], [flags]))


def layout(encoded: list[bytes], flags: list[int], gap: bytes = b"") -> tuple[bytes, I64, I64, U8]:
    """The records one after another (``gap`` before the first)."""
    sizes = [len(e) for e in encoded]
    starts = (len(gap) + np.cumsum([0, *sizes[:-1]])).tolist() if encoded else []
    return (gap + b"".join(encoded), *columns(starts, sizes, flags))


def raw_record(key: Any = None, value: Any = None, props: Any = None, publish: Any = 0, event: Any = None) -> bytes:
    """A record packed as given, bytes as bin and str as str."""
    return bytes(msgpack.packb([key, value, props, publish, event], use_bin_type=True))


def str_element(text: bytes) -> bytes:
    """``text`` packed as a msgpack str whatever its bytes (no UTF-8 check)."""
    return bytes(msgpack.packb(text, use_bin_type=False))


def with_property(name: bytes, text: bytes) -> bytes:
    """A keyless record with one property, name and text packed as str as they are."""
    return b"\x95\xc0\xc0\x81" + str_element(name) + str_element(text) + b"\x00\xc0"


# ------------------------------------------------------------------------------- strategies

records = st.builds(
    Record,
    key=st.none() | st.binary(max_size=40),
    value=st.none() | st.binary(max_size=300),  # past 255: bin16
    properties=st.dictionaries(st.text(max_size=20), st.text(max_size=20), max_size=3),
    publish_time=st.integers(0, I64_MAX),
    event_time=st.none() | st.integers(I64_MIN, I64_MAX),
)


# ---------------------------------------------------------------------- agreement on records


@settings(max_examples=300, deadline=None)
@given(st.lists(records, max_size=8), st.binary(max_size=3))
def test_valid_records_pass_everywhere(recs: list[Record], gap: bytes) -> None:
    buf, s, z, f = layout([encode_record(r) for r in recs], [flags_of(r) for r in recs], gap)
    assert check_everywhere(buf, s, z, f) == -1


@settings(max_examples=400, deadline=None)
@given(st.lists(records, min_size=1, max_size=6), st.data())
def test_flipped_bytes_agree_everywhere(recs: list[Record], data: st.DataObject) -> None:
    encoded = [bytearray(encode_record(r)) for r in recs]
    k = data.draw(st.integers(0, len(recs) - 1))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(encoded[k]) - 1))
        encoded[k][at] = data.draw(st.integers(0, 255))
    buf, s, z, f = layout([bytes(e) for e in encoded], [flags_of(r) for r in recs])
    assert check_everywhere(buf, s, z, f) in (-1, k)


@settings(max_examples=300, deadline=None)
@given(st.lists(records, min_size=1, max_size=6), st.data())
def test_cut_records_are_refused_everywhere(recs: list[Record], data: st.DataObject) -> None:
    encoded = [encode_record(r) for r in recs]
    k = data.draw(st.integers(0, len(recs) - 1))
    buf, s, z, f = layout(encoded, [flags_of(r) for r in recs])
    z[k] = data.draw(st.integers(0, int(z[k]) - 1))  # the rest of the buffer is still there
    assert check_everywhere(buf, s, z, f) == k


@settings(max_examples=300, deadline=None)
@given(st.lists(records, min_size=2, max_size=6), st.data())
def test_a_boundary_moved_by_a_byte_is_found(recs: list[Record], data: st.DataObject) -> None:
    """The attack: the footer still tiles the entry, one record a byte short, the next a
    byte long (or the other way round)."""
    buf, s, z, f = layout([encode_record(r) for r in recs], [flags_of(r) for r in recs])
    k = data.draw(st.integers(0, len(recs) - 2))
    shift = data.draw(st.sampled_from([-1, 1]))
    z[k] += shift
    s[k + 1] += shift
    z[k + 1] -= shift
    assert int(s[k] + z[k]) == int(s[k + 1]) and int(s[-1] + z[-1]) == len(buf)  # still tiles
    assert check_everywhere(buf, s, z, f) == k


@settings(max_examples=200, deadline=None)
@given(st.lists(records, min_size=1, max_size=6), st.data())
def test_wrong_flags_are_found(recs: list[Record], data: st.DataObject) -> None:
    flags = [flags_of(r) for r in recs]
    k = data.draw(st.integers(0, len(recs) - 1))
    flags[k] = data.draw(st.integers(0, 255).filter(lambda x: x != flags[k]))
    buf, s, z, f = layout([encode_record(r) for r in recs], flags)
    assert check_everywhere(buf, s, z, f) == k


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=40), st.integers(0, 3))
def test_arbitrary_bytes_agree_everywhere(data: bytes, flags: int) -> None:
    one(data, flags, pad=b"\x00")
    one(b"\x95" + data, flags)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=12), st.binary(max_size=40))
def test_property_text_must_be_utf8(name: bytes, text: bytes) -> None:
    def utf8(b: bytes) -> bool:
        try:
            b.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True

    assert (one(with_property(name, text), TOMBSTONE) == -1) == (utf8(name) and utf8(text))


@settings(max_examples=300, deadline=None)
@given(st.integers(I64_MIN, (1 << 64) - 1), st.sampled_from(["publish", "event"]))
def test_times_must_fit_an_int64(value: int, which: str) -> None:
    packed = raw_record(b"k", b"v", None, 7, None)
    packed = packed[:-2] + (msgpack.packb(value) + b"\xc0" if which == "publish" else b"\x07" + msgpack.packb(value))
    assert (one(packed, HAS_KEY) == -1) == (I64_MIN <= value <= I64_MAX)


# ------------------------------------------------------------------------------ case by case


def test_the_cases_the_footer_must_not_hide() -> None:
    cases: list[tuple[bytes, int, bool]] = [
        (raw_record(b"k", b"v", {b"a": b"b"}, 1, None), HAS_KEY, False),  # bytes in properties
        (raw_record(b"k", b"v", {"a": b"b"}, 1, None), HAS_KEY, False),
        (raw_record(b"k", b"v", {b"a": "b"}, 1, None), HAS_KEY, False),
        (raw_record(b"k", b"v", {"a": "b"}, 1, None), HAS_KEY, True),
        (raw_record("k", b"v", None, 1, None), HAS_KEY, False),  # a text key
        (raw_record(b"k", "v", None, 1, None), HAS_KEY, False),  # a text value
        (raw_record(b"k", b"v", None, (1 << 63) - 1, None), HAS_KEY, True),
        (raw_record(b"k", b"v", None, 1 << 63, None), HAS_KEY, False),  # uint64 too large
        (raw_record(b"k", b"v", None, (1 << 64) - 1, None), HAS_KEY, False),
        (raw_record(b"k", b"v", None, I64_MIN, I64_MIN), HAS_KEY, True),
        (raw_record(b"k", b"v", None, 1, 1 << 63), HAS_KEY, False),
        (raw_record(b"k", b"v", None, 1.5, None), HAS_KEY, False),
        (raw_record(b"k", b"v", None, 1, 2.5), HAS_KEY, False),
        (raw_record(b"k", b"v", None, True, None), HAS_KEY, False),
        (raw_record(b"k", b"v", None, 1, False), HAS_KEY, False),
        (raw_record(b"k", b"v", [], 1, None), HAS_KEY, False),
        (raw_record(b"k", b"v", {}, 1, None), HAS_KEY, True),
        (raw_record(b"k", b"v", {"a": 1}, 1, None), HAS_KEY, False),
        (raw_record(b"k", b"v", {"a": None}, 1, None), HAS_KEY, False),
        (raw_record(None, None, None, None, None), 0, False),
        (raw_record(b"k", b"", None, 1, None), HAS_KEY | TOMBSTONE, True),
        (raw_record(b"k", None, None, 1, None), HAS_KEY | TOMBSTONE, True),
        (raw_record(b"", None, None, 1, None), HAS_KEY | TOMBSTONE, True),  # an empty key is a key
        (raw_record(None, b"", None, 1, None), 0, False),  # the writer flags an empty value, keyed or not
        (raw_record(None, b"", None, 1, None), TOMBSTONE, True),
        (raw_record(None, b"v", None, 1, None), TOMBSTONE, False),
        (bytes(msgpack.packb([b"k", b"v", None, 1], use_bin_type=True)), HAS_KEY, False),
        (bytes(msgpack.packb([b"k", b"v", None, 1, None, None], use_bin_type=True)), HAS_KEY, False),
        (bytes(msgpack.packb({"k": "v"})), 0, False),
        (b"", 0, False),
        (b"\x95", 0, False),
        (b"\x95\xc0\xc0\xc0\x00\xc0", TOMBSTONE, True),
        (b"\x95\xc0\xc0\xc0\x00\xc0\xc0", 0, False),  # a byte left over
        (b"\x95\xc0\xc0\xc0\x00", 0, False),  # no event time
        (b"\x95\xc0\xc0\xc0\xc0\xc0", 0, False),  # a nil publish time
        (b"\x95\xc0\xc0\xc0\x00\xc1", 0, False),  # never used
        (b"\x95\xc0\xc0\xc0\x00\xd4\x00\x00", 0, False),  # an ext where the event time is
        (b"\x95\xc0\xc0\xc0\x00\xc7\x00\x05", 0, False),
    ]
    for data, flags, ok in cases:
        assert (one(data, flags, pad=b"\xc0\xc0") == -1) == ok, (data.hex(), flags)


def test_every_length_and_count_encoding() -> None:
    # arrays as array16 and array32; keys, values and texts as their 8-, 16- and 32-bit forms
    body = b"\xc4\x01k\xc5\x00\x02vv\xde\x00\x01\xd9\x01a\xda\x00\x01b\xcf" + struct.pack(">Q", 5) + b"\xd3" + \
        struct.pack(">q", -5)
    assert one(b"\xdc\x00\x05" + body, HAS_KEY) == -1
    assert one(b"\xdd\x00\x00\x00\x05" + body, HAS_KEY) == -1
    for head in (b"\x94", b"\x96", b"\x90", b"\x9f", b"\xdc\x00\x04", b"\xdd\x00\x00\x00\x06", b"\xdc\x00",
                 b"\xdd\x00\x00\x00"):
        assert one(head + body, HAS_KEY) == 0, head.hex()
    big = Record(b"k" * 300, b"v" * 70_000, {f"p{i}": "x" * (i * 20) for i in range(20)}, 1, -1)
    packed = encode_record(big)
    assert b"\xc6\x00\x01\x11\x70" in packed and packed[:1] == b"\x95"  # bin32, map16, str8, str16 inside
    assert one(packed, HAS_KEY) == -1
    map32 = b"\x95\xc0\xc0\xdf\x00\x00\x00\x01\xdb\x00\x00\x00\x01a\xa0\x00\xc0"
    assert one(map32, TOMBSTONE) == -1
    for integer in (b"\xcc\x05", b"\xcd\x00\x05", b"\xce\x00\x00\x00\x05", b"\xd0\xff", b"\xd1\xff\xff",
                    b"\xd2\xff\xff\xff\xff", b"\x7f", b"\xe0", b"\xff"):
        assert one(b"\x95\xc0\xc0\xc0" + integer + integer, TOMBSTONE) == -1, integer.hex()


def test_crafted_lengths_do_not_read_astray() -> None:
    huge = [b"\x95\xc6\xff\xff\xff\xff", b"\x95\xc0\xc5\xff\xff", b"\x95\xc0\xc0\xdf\xff\xff\xff\xff\xa0\xa0",
            b"\x95\xc0\xc0\x81\xdb\xff\xff\xff\xff", b"\x95\xc0\xc0\x8f", b"\x95\xc0\xc0\xc0\xcf\x00",
            b"\x95\xc0\xc0\xc0\xd3", b"\x95\xc0\xc0\xc0\x00\xd3\x00", b"\xdd\x00\x00", b"\x95\xc4"]
    for data in huge:
        assert one(data, 0) == 0, data.hex()
        assert one(data, 0, pad=b"\x00" * 64) == 0, data.hex()  # bytes past its size do not help


@pytest.mark.parametrize("text", ALL_BAD_UTF8, ids=[t.hex() for t in ALL_BAD_UTF8])
def test_invalid_utf8_in_a_property_is_refused(text: bytes) -> None:
    assert one(with_property(b"name", text), 0) == 0
    assert one(with_property(text, b"text"), 0) == 0
    assert "UTF-8" in kernels.record_problem(with_property(b"name", text), 0)


@pytest.mark.parametrize("text", ALL_GOOD_UTF8, ids=[t.encode().hex() for t in ALL_GOOD_UTF8])
def test_valid_utf8_in_a_property_is_taken(text: str) -> None:
    assert one(encode_record(Record(None, None, {text: text}, 1, None)), TOMBSTONE) == -1


@pytest.mark.parametrize(("data", "flags", "words"), [
    (raw_record(b"k", b"v", None, 1, None), HAS_KEY, ""),
    (bytes(msgpack.packb([b"k", b"v", None, 1], use_bin_type=True)), HAS_KEY, "not a 5-element array"),
    (raw_record(b"k", b"v", {b"a": b"b"}, 1, None), HAS_KEY, "properties are not a map of text to text"),
    (raw_record("k", b"v", None, 1, None), HAS_KEY, "key is neither bytes nor nil"),
    (raw_record(b"k", b"v", None, 1, None) + b"\x00\x00", HAS_KEY, "2 bytes left over after the record"),
    (raw_record(b"k", b"v", None, 1, None) + b"\x00", HAS_KEY, "1 byte left over after the record"),
    (raw_record(b"k", b"v", None, 1, None)[:-1], HAS_KEY, "record runs past its size"),
    (raw_record(b"k", b"v", None, 1, None), 0, "flags say no key but the record has one"),
    (raw_record(None, b"v", None, 1, None), HAS_KEY, "flags say a key but the record has none"),
    (raw_record(b"k", b"", None, 1, None), HAS_KEY, "flags say not a tombstone but the record is one"),
    (raw_record(b"k", b"v", None, 1, None), HAS_KEY | TOMBSTONE, "flags say a tombstone but the record is not one"),
    (raw_record(b"k", b"v", None, 1, None), HAS_KEY | 0x80, "flags 0x81 have bits other than key and tombstone set"),
    (raw_record(b"k", b"v", None, 1 << 63, None), HAS_KEY, "publish time does not fit a signed 64-bit integer"),
    (raw_record(b"k", b"v", None, 1, "x"), HAS_KEY, "event time is not an integer or nil"),
    (with_property(b"a", b"\xed\xa0\x80"), 0, "a property is not valid UTF-8"),
])
def test_record_problem_says_what_is_wrong(data: bytes, flags: int, words: str) -> None:
    assert kernels.record_problem(data, flags) == words
    assert kernels.record_problem(memoryview(data), flags) == words


# ----------------------------------------------------------------------------------- inputs


def sample() -> tuple[bytes, I64, I64, U8]:
    recs = [Record(b"k%d" % i, b"v" * i, {}, i, None) for i in range(5)]
    return layout([encode_record(r) for r in recs], [flags_of(r) for r in recs], gap=b"\x00\x00\x00")


def test_any_kind_of_buffer(kernel_path: str, tmp_path: Path) -> None:
    buf, s, z, f = sample()
    path = tmp_path / "records"
    path.write_bytes(buf)
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm, memoryview(mm) as view:
        buffers: list[Any] = [buf, bytearray(buf), memoryview(buf), view, np.frombuffer(buf, dtype=np.uint8),
                              memoryview(buf + b"\x00").cast("H")]  # ranges count bytes whatever the item size
        for b in buffers:
            assert kernels.check_records(b, s, z, f) == -1
        assert kernels.check_records(buf, s.astype(np.uint32), z.astype(">i8"), f.astype(np.int64)) == -1
        assert kernels.check_records(buf, s.tolist(), z.tolist(), f.tolist()) == -1
        f2 = f.copy()
        f2[3] ^= TOMBSTONE
        assert kernels.check_records(view, s, z, f2) == 3
        assert kernels.check_records(buf, s[:0], z[:0], f[:0]) == -1


@needs_native
def test_native_reads_unaligned_columns() -> None:
    buf, s, z, f = sample()
    cols = []
    for a in (s, z):
        raw = bytearray(a.nbytes + 1)
        raw[1:] = a.tobytes()
        cols.append(memoryview(raw)[1:].cast("q"))
    flags = memoryview(bytearray(b"\x00" + f.tobytes()))[1:]
    assert native_check(buf, cols[0], cols[1], flags) == -1  # type: ignore[arg-type]


BAD_INPUTS: dict[str, tuple[list[int], list[int], list[int]]] = {
    "negative start": ([-1], [3], [0]),
    "negative size": ([0], [-1], [0]),
    "past the buffer": ([0], [101], [0]),
    "start past the buffer": ([101], [0], [0]),
    "far past the buffer": ([1 << 62], [1 << 62], [0]),
    "start plus size overflows": ([I64_MAX], [I64_MAX], [0]),
    "huge size": ([1], [I64_MAX], [0]),
    "bad range after a bad record": ([0, 0], [1, 101], [0, 0]),
    "sizes of another length": ([0, 1], [1], [0, 0]),
    "flags of another length": ([0, 1], [1, 1], [0]),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_impossible_ranges_raise_value_error(kernel_path: str, case: str) -> None:
    buf = b"\xc0" * 100
    starts, sizes, flags = BAD_INPUTS[case]
    s, z, f = np.array(starts, dtype=np.int64), np.array(sizes, dtype=np.int64), np.array(flags, dtype=np.uint8)
    with pytest.raises(ValueError):
        kernels.check_records(buf, s, z, f)
    with pytest.raises(ValueError):
        fallback_check(buf, s, z, f)
    if NATIVE is not None:
        with pytest.raises(ValueError):
            native_check(buf, s, z, f)


@pytest.mark.parametrize("flags", [[256], [-1], [1.0], ["a"]])
def test_flags_that_are_not_bytes_raise_value_error(kernel_path: str, flags: list[Any]) -> None:
    buf, s, z, _ = sample()
    with pytest.raises(ValueError):
        kernels.check_records(buf, s[:1], z[:1], np.array(flags))


@needs_native
def test_native_refuses_columns_of_other_types() -> None:
    assert NATIVE is not None
    buf, s, z, f = sample()
    assert NATIVE.check_records(buf, s, z, f) == -1
    for args in ((buf, s.astype(np.int32), z, f), (buf, s, z.astype(np.float64), f), (buf, s, z.astype(">i8"), f),
                 (buf, s, z, f.astype(np.uint16)), (buf, s, z, f.astype(np.float32)), (buf, s, z, f[:-1]),
                 (buf, s[:-1], z, f)):
        with pytest.raises(ValueError):
            NATIVE.check_records(*args)
    with pytest.raises(TypeError):
        NATIVE.check_records(buf, s, z)
    assert NATIVE.check_records(buf, s, z, f.astype(np.int8)) == -1  # any 1-byte item type


def _kept_case(records: list[Record], kept: list[list[int]], bad: int | None = None) -> tuple[Any, ...]:
    """A buffer of frames (one per entry of ``kept``, each holding ``records``) and the
    footer columns and copy selection check_kept takes; ``bad`` moves the boundary after
    record ``bad`` of every entry by one byte."""
    raws = [encode_record(r) for r in records]
    sizes = [len(x) for x in raws]
    offs = [sum(sizes[:i]) for i in range(len(raws))]
    if bad is not None:
        sizes[bad] -= 1
        sizes[bad + 1] += 1
        offs[bad + 1] -= 1
    payload = b"".join(raws)
    frame = struct.pack("<III", len(payload), 0, len(raws)) + payload
    n = len(raws)
    buf = frame * len(kept)
    frames = np.array([i * len(frame) for i in range(len(kept))], dtype=np.int64)
    rec = np.array([e * n + r for e, rs in enumerate(kept) for r in rs], dtype=np.int64)
    col = lambda v, dt: np.array(v * len(kept), dtype=dt)  # noqa: E731
    flags = [flags_of(r) for r in records]
    return (buf, frames, np.array([len(rs) for rs in kept], dtype=np.int64), rec,
            col(offs, np.uint32), col(sizes, np.uint32), col(flags, np.uint8))


@pytest.mark.parametrize("use_native", [True, False])
def test_check_kept_checks_the_copied_records_only(use_native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The records compaction copies, found through the copy plan (entry frames, kept
    counts, record indexes): a moved boundary is found where it is copied, and not where
    it is not; both implementations agree; bad selections are ValueErrors."""
    if use_native:
        need_c_extension(NATIVE, "ledger/_kernels.c")
    if not use_native:
        monkeypatch.setattr(kernels, "_native", None)
    recs = [Record(b"k%d" % i, b"v" * (i + 1), {"p": "q"} if i % 2 else {}, 1, None) for i in range(5)]
    assert kernels.check_kept(*_kept_case(recs, [[0, 1, 2, 3, 4], [1, 3]])) == -1
    # the boundary after record 1 moved: records 1 and 2 are both wrong
    assert kernels.check_kept(*_kept_case(recs, [[0, 3, 4], [0, 4]], bad=1)) == -1
    assert kernels.check_kept(*_kept_case(recs, [[0, 3], [0, 2, 4]], bad=1)) == 3
    assert kernels.check_kept(*_kept_case(recs, [[0, 1]], bad=1)) == 1
    buf, frames, kept, rec, offs, sizes, flags = _kept_case(recs, [[0, 1]])
    for wrong in (np.array([2, 1]), np.array([-1])):
        with pytest.raises(ValueError):
            kernels.check_kept(buf, frames, wrong, rec, offs, sizes, flags)
    with pytest.raises(ValueError):
        kernels.check_kept(buf, frames, kept, np.array([0, 99], dtype=np.int64), offs, sizes, flags)
    with pytest.raises(ValueError):
        kernels.check_kept(buf, frames + len(buf), kept, rec, offs, sizes, flags)
