"""Records encoded from columns: the bulk path of the producer.

:class:`RecordColumns` holds a batch of records as Arrow lays them out (an offsets array
into one data buffer per variable-length column, a validity byte per row);
:func:`encode_columns` encodes them all at once into the msgpack records of
:mod:`shale.ledger.record` with their footer columns, in C (``ledger/_encoder.c``) where
that was built; :func:`entry_end` and :func:`entry_of` cut the result into entries.  The C and Python
paths give the same bytes, which the tests check.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import field
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt

from shale.ledger.format import NO_EVENT_TIME
from shale.ledger.kernels import load_native
from shale.ledger.record import Record, encode_record, key_hash
from shale.ledger.values import dataclass
from shale.ledger.writer import EncodedEntry

__all__ = ["ENCODER", "EncodedColumns", "Properties", "RecordColumns", "Refused", "VarColumn", "encode_columns",
           "entry_end", "entry_of"]

Buffer = bytes | bytearray | memoryview
I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]


_native: Final = load_native("_encoder")
#: ``"native"`` when the C encoder is in use, ``"python"`` otherwise.
ENCODER: Final = "native" if _native is not None else "python"


@dataclass(frozen=True, slots=True)
class VarColumn:
    """Row ``i`` is ``data[offsets[i]:offsets[i + 1]]``, or absent where ``valid[i]`` is 0
    (``valid`` ``None``: every row present)."""

    offsets: I64
    data: Buffer
    valid: U8 | None = None

    def row(self, i: int) -> bytes | None:
        if self.valid is not None and not self.valid[i]:
            return None
        return bytes(memoryview(self.data)[int(self.offsets[i]):int(self.offsets[i + 1])])

    def lengths(self) -> I64:
        return np.diff(self.offsets)


@dataclass(frozen=True, slots=True)
class Properties:
    """Each row's properties: row ``i`` holds pairs ``offsets[i]`` to ``offsets[i + 1]`` of
    ``names`` and ``values`` (UTF-8 text); absent where ``valid[i]`` is 0."""

    offsets: I64
    names: VarColumn
    values: VarColumn
    valid: U8 | None = None


@dataclass(frozen=True, slots=True)
class RecordColumns:
    """A batch of records as columns (see :func:`shale.producer.columns.record_columns` for building
    one from Arrow data or Python sequences)."""

    key: VarColumn
    value: VarColumn
    properties: Properties | None = None
    event_time: I64 | None = None
    event_valid: U8 | None = None

    def __len__(self) -> int:
        return len(self.key.offsets) - 1

    def records(self, publish_time: int) -> Iterator[Record]:
        """The records one by one (the slow path, for the fallback and the tests)."""
        props = self.properties
        for i in range(len(self)):
            pairs: dict[str, str] = {}
            if props is not None and (props.valid is None or props.valid[i]):
                for q in range(int(props.offsets[i]), int(props.offsets[i + 1])):
                    pairs[(props.names.row(q) or b"").decode()] = (props.values.row(q) or b"").decode()
            event = None
            if self.event_time is not None and (self.event_valid is None or self.event_valid[i]):
                event = int(self.event_time[i])
            yield Record(self.key.row(i), self.value.row(i), pairs, publish_time, event)


@dataclass(frozen=True, slots=True, eq=False)
class EncodedColumns:
    """Encoded records back to back, with each one's offset, size, key hash and flags."""

    payload: bytes | bytearray
    offsets: I64
    sizes: npt.NDArray[np.uint32]
    hash_hi: npt.NDArray[np.uint64]
    hash_lo: npt.NDArray[np.uint64]
    flags: npt.NDArray[np.uint8]
    publish_time: int
    #: each record's event time, :data:`~shale.ledger.format.NO_EVENT_TIME` where it has
    #: none (``None``: no record has one)
    events: I64 | None = None
    #: where each record ends (``offsets + sizes``)
    ends: I64 = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ends", self.offsets + self.sizes.astype(np.int64))


class Refused(NamedTuple):
    """Why a batch cannot be encoded: record ``row`` would exceed the size limit
    (``why == "size"``) or names one property twice (``"duplicate"``)."""

    why: str
    row: int


_WHY: Final = ("size", "duplicate")


def encode_columns(cols: RecordColumns, publish_time: int, max_record_bytes: int) -> EncodedColumns | Refused:
    """Encode every record of ``cols`` with ``publish_time``: the encoded records, or
    :class:`Refused` for the first record that cannot be."""
    n = len(cols)
    if _native is None:
        return _encode_python(cols, publish_time, max_record_bytes)
    events = _events(cols)
    p = cols.properties
    got = _native.encode_records(
        n, _c(cols.key.offsets), cols.key.data, _c(cols.key.valid), _c(cols.value.offsets), cols.value.data,
        _c(cols.value.valid), None if p is None else _c(p.offsets), None if p is None else _c(p.valid),
        None if p is None else _c(p.names.offsets), None if p is None else p.names.data,
        None if p is None else _c(p.values.offsets), None if p is None else p.values.data,
        _c(cols.event_time), _c(cols.event_valid), publish_time, max_record_bytes)
    if len(got) == 2:
        return Refused(_WHY[got[0]], got[1])
    payload, offsets, sizes, hi, lo, flags = got
    return EncodedColumns(payload, np.frombuffer(offsets, np.int64), np.frombuffer(sizes, np.uint32),
                          np.frombuffer(hi, np.uint64), np.frombuffer(lo, np.uint64), np.frombuffer(flags, np.uint8),
                          publish_time, events)


def _events(cols: RecordColumns) -> I64 | None:
    """Each record's event time, :data:`NO_EVENT_TIME` where it has none; ``None`` when
    no record has one (the footer then leaves the column out)."""
    if cols.event_time is None:
        return None
    times = np.asarray(cols.event_time, dtype=np.int64)
    if cols.event_valid is None:
        return times
    valid = np.asarray(cols.event_valid, dtype=bool)
    return np.where(valid, times, np.int64(NO_EVENT_TIME)) if valid.any() else None


def _c(a: npt.NDArray[np.generic] | None) -> npt.NDArray[np.generic] | None:
    return None if a is None else np.ascontiguousarray(a)


def _encode_python(cols: RecordColumns, publish_time: int, max_record_bytes: int) -> EncodedColumns | Refused:
    n = len(cols)
    parts: list[bytes] = []
    hi = np.zeros(n, np.uint64)
    lo = np.zeros(n, np.uint64)
    flags = np.zeros(n, np.uint8)
    props = cols.properties
    for i, rec in enumerate(cols.records(publish_time)):
        raw = encode_record(rec)
        if len(raw) > max_record_bytes:
            return Refused("size", i)
        if (props is not None and (props.valid is None or props.valid[i])
                and len(rec.properties) < props.offsets[i + 1] - props.offsets[i]):
            return Refused("duplicate", i)
        parts.append(raw)
        if rec.key is not None:
            hi[i], lo[i] = key_hash(rec.key)
            flags[i] |= 0x01
        if not rec.value:
            flags[i] |= 0x02
    sizes = np.fromiter((len(b) for b in parts), np.uint32, n)
    offsets = np.zeros(n, np.int64)
    np.cumsum(sizes[:-1], out=offsets[1:])
    return EncodedColumns(b"".join(parts), offsets, sizes, hi, lo, flags, publish_time, _events(cols))


def entry_end(enc: EncodedColumns, start: int, max_records: int, max_entry_bytes: int) -> int:
    """Where the entry starting at record ``start`` ends: after at most ``max_records``
    records and about ``max_entry_bytes`` bytes, but at least one record."""
    at = int(enc.offsets[start])
    by_bytes = int(np.searchsorted(enc.ends, at + max_entry_bytes, side="right"))
    return min(len(enc.offsets), start + max(max_records, 1), max(by_bytes, start + 1))


def entry_of(enc: EncodedColumns, start: int, end: int) -> EncodedEntry:
    """Records ``start`` to ``end`` as one entry."""
    at = int(enc.offsets[start])
    return EncodedEntry(memoryview(enc.payload)[at:int(enc.ends[end - 1])],
                        (enc.offsets[start:end] - at).astype(np.uint32), enc.sizes[start:end],
                        enc.hash_hi[start:end], enc.hash_lo[start:end], enc.flags[start:end], enc.publish_time,
                        None if enc.events is None else enc.events[start:end])
