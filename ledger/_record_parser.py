"""A plain-Python parser of one encoded record: the fallback of the C kernels' record
check (``check_records`` in ``_kernels.c``), and what explains, in words, what is wrong
with a record either of them refused."""

from __future__ import annotations

import struct
from typing import Final

__all__ = ["record_fields_at", "record_problem_at"]

# msgpack type bytes of a record's fields (see check_records in _kernels.c)
_NIL: Final = 0xC0
_FIELDS: Final = 5
_FIXARRAY: Final = range(0x90, 0xA0)
_FIXMAP: Final = range(0x80, 0x90)
_FIXSTR: Final = range(0xA0, 0xC0)
_FIX_COUNT: Final = 0x0F  # the low bits of a fixarray or fixmap type byte: its count
_FIXSTR_LEN: Final = 0x1F
_U8, _U16, _U32 = struct.Struct(">B"), struct.Struct(">H"), struct.Struct(">I")
_BIN: Final = {0xC4: _U8, 0xC5: _U16, 0xC6: _U32}  # type byte: the length that follows it
_STR: Final = {0xD9: _U8, 0xDA: _U16, 0xDB: _U32}
_ARRAY: Final = {0xDC: _U16, 0xDD: _U32}
_MAP: Final = {0xDE: _U16, 0xDF: _U32}
# uint8, uint16, uint32, uint64, int8, int16, int32, int64: the integer that follows
_INT: Final = {0xCC + i: struct.Struct(form) for i, form in enumerate((">B", ">H", ">I", ">Q", ">b", ">h", ">i", ">q"))}
_POSFIXINT_END: Final = 0x80
_NEGFIXINT: Final = 0xE0
_I64_MAX: Final = (1 << 63) - 1
_HAS_KEY: Final = 0x01
_TOMBSTONE: Final = 0x02
_NOT_TEXT: Final = "properties are not a map of text to text"


class _Bad(Exception):
    """What is wrong with a record, found while reading it."""


class _RecordReader:
    """Reads the msgpack elements of the record at ``data[pos:end]``, checking every read
    against its end."""

    __slots__ = ("data", "end", "pos")

    def __init__(self, data: memoryview, pos: int, end: int) -> None:
        self.data, self.pos, self.end = data, pos, end

    def skip(self, n: int) -> int:
        """Move past ``n`` bytes; where they start."""
        at = self.pos
        if n > self.end - at:
            raise _Bad("record runs past its size")
        self.pos = at + n
        return at

    def byte(self) -> int:
        return self.data[self.skip(1)]

    def number(self, form: struct.Struct) -> int:
        value: int = form.unpack_from(self.data, self.skip(form.size))[0]
        return value

    def head(self) -> None:
        t = self.byte()
        n = t & _FIX_COUNT if t in _FIXARRAY else self.number(_ARRAY[t]) if t in _ARRAY else -1
        if n != _FIELDS:
            raise _Bad(f"not a {_FIELDS}-element array")

    def bin(self, what: str) -> int:
        """The length of a bin element, -1 for nil."""
        t = self.byte()
        if t == _NIL:
            return -1
        if t not in _BIN:
            raise _Bad(f"{what} is neither bytes nor nil")
        n = self.number(_BIN[t])
        self.skip(n)
        return n

    def text(self) -> tuple[int, int]:
        """Where a str element's bytes start, and how many."""
        t = self.byte()
        if t not in _FIXSTR and t not in _STR:
            raise _Bad(_NOT_TEXT)
        n = t & _FIXSTR_LEN if t in _FIXSTR else self.number(_STR[t])
        at = self.skip(n)
        try:
            str(self.data[at:at + n], "utf-8")  # strict: no overlong forms, surrogates, nor past U+10FFFF
        except UnicodeDecodeError:
            raise _Bad("a property is not valid UTF-8") from None
        return at, n

    def properties(self) -> list[tuple[int, int]]:
        """Each property's name and value, as (start, length), one after the other."""
        t = self.byte()
        if t == _NIL:
            return []
        if t not in _FIXMAP and t not in _MAP:
            raise _Bad(_NOT_TEXT)
        # a crafted count runs past the record's end soon enough: each string takes a byte
        return [self.text() for _ in range(2 * (t & _FIX_COUNT if t in _FIXMAP else self.number(_MAP[t])))]

    def integer(self, what: str, nil: bool = False) -> int | None:
        """An integer's value (None for nil, where nil is allowed)."""
        t = self.byte()
        if t < _POSFIXINT_END:
            return t
        if t >= _NEGFIXINT:
            return t - 0x100
        if nil and t == _NIL:
            return None
        if t not in _INT:
            raise _Bad(f"{what} is not an integer{' or nil' if nil else ''}")
        value = self.number(_INT[t])
        if value > _I64_MAX:
            raise _Bad(f"{what} does not fit a signed 64-bit integer")
        return value


#: A record's fields (:func:`record_fields_at`): key start and length (-1: nil), value start
#: and length, publish time, event time (None: nil), and each property's name and value as
#: (start, length), one after the other.
Fields = tuple[int, int, int, int, int, int | None, list[tuple[int, int]]]


def record_fields_at(data: memoryview, pos: int, end: int) -> Fields | None:
    """The fields of the record at ``data[pos:end]`` (offsets into ``data``), or None when
    it is not exactly one well-formed record: the fallback of ``record_columns``."""
    r = _RecordReader(data, pos, end)
    try:
        r.head()
        key = r.bin("key")
        key_at = r.pos - max(key, 0)
        value = r.bin("value")
        value_at = r.pos - max(value, 0)
        props = r.properties()
        publish = r.integer("publish time")
        event = r.integer("event time", nil=True)
    except _Bad:
        return None
    if r.pos != end or publish is None:
        return None
    return key_at, key, value_at, value, publish, event, props


def record_problem_at(data: memoryview, pos: int, end: int, flags: int) -> str:
    r = _RecordReader(data, pos, end)
    try:
        r.head()
        key, value = r.bin("key"), r.bin("value")
        r.properties()
        r.integer("publish time")
        r.integer("event time", nil=True)
    except _Bad as e:
        return str(e)
    if (left := end - r.pos) > 0:
        return f"{left} byte{'s' if left > 1 else ''} left over after the record"
    want = (0 if key < 0 else _HAS_KEY) | (_TOMBSTONE if value <= 0 else 0)  # as the writer sets them
    if flags == want:
        return ""
    if flags & ~(_HAS_KEY | _TOMBSTONE):
        return f"flags {flags:#04x} have bits other than key and tombstone set"
    if (flags ^ want) & _HAS_KEY:
        return "flags say no key but the record has one" if key >= 0 else "flags say a key but the record has none"
    if flags & _TOMBSTONE:
        return "flags say a tombstone but the record is not one"
    return "flags say not a tombstone but the record is one"
