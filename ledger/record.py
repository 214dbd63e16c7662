"""Records, messages and their msgpack encoding.

A record is encoded as the msgpack array
``[key: bin|nil, value: bin|nil, properties: map<str,str>|nil, publish_time: int, event_time: int|nil]``.
Each record is a self-contained msgpack object, so pass two of compaction can copy a
record's raw bytes without decoding it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import field
from typing import Any, Final, Protocol

import msgpack
import xxhash

from shale.ledger.errors import CorruptLedgerError, InvalidInputError, RecordTooLargeError
from shale.ledger.ids import MessageId
from shale.ledger.values import dataclass

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "EVENT_TIME_MAX_MS",
    "EVENT_TIME_MIN_MS",
    "EVENT_TIME_RANGE",
    "Message",
    "Readable",
    "Record",
    "decode_record",
    "decode_records",
    "encode_record",
    "event_time_in_range",
    "key_hash",
    "validate_record",
]

#: Upper bound on one encoded record; larger ones are refused at write and read time.
DEFAULT_MAX_RECORD_BYTES: Final = 64 * 1024 * 1024
#: A payload bigger than this is decoded as a stream, read in slices of this size.
_STREAM_BYTES: Final = 1 << 20

#: The event times producers accept, in milliseconds since the Unix epoch: years 0001 to
#: 9999, 0001-01-01T00:00:00.000Z to 9999-12-31T23:59:59.999Z.  Every reader of an export
#: holds them (Python's datetime, pyarrow, DuckDB, Polars, pandas, Spark); the format's
#: 64 bits would take more, which DuckDB cannot read as a timestamp and pyarrow cannot
#: turn into dates.
EVENT_TIME_MIN_MS: Final = -62_135_596_800_000
EVENT_TIME_MAX_MS: Final = 253_402_300_799_999
#: The accepted range, as error messages and the documentation say it.
EVENT_TIME_RANGE: Final = f"{EVENT_TIME_MIN_MS} to {EVENT_TIME_MAX_MS} ms (years 0001 to 9999)"

_EMPTY: Final[Mapping[str, str]] = {}


def event_time_in_range(ms: int) -> bool:
    """Whether ``ms`` is an event time producers accept (:data:`EVENT_TIME_RANGE`)."""
    return EVENT_TIME_MIN_MS <= ms <= EVENT_TIME_MAX_MS


@dataclass(frozen=True, slots=True)
class Record:
    """A record as a producer hands it in.

    ``value`` empty or ``None`` makes the record a tombstone for its key.
    Times are milliseconds since the Unix epoch.
    """

    key: bytes | None
    value: bytes | None
    properties: Mapping[str, str] = field(default_factory=dict)
    publish_time: int = 0
    event_time: int | None = None

    @property
    def is_tombstone(self) -> bool:
        return self.key is not None and not self.value


@dataclass(frozen=True, slots=True)
class Message:
    """A record as a consumer sees it: with its permanent :class:`MessageId`."""

    id: MessageId
    key: bytes | None
    value: bytes | None
    properties: Mapping[str, str]
    publish_time: int
    event_time: int | None

    @property
    def is_tombstone(self) -> bool:
        return self.key is not None and not self.value


_packer_local = msgpack.Packer(use_bin_type=True)
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


def validate_record(record: Record) -> None:
    """Refuse a record that could not be encoded, before it is accepted into a batch."""
    key, value = record.key, record.value
    if key is not None and not isinstance(key, bytes | bytearray | memoryview):
        raise InvalidInputError(f"record key must be bytes or None, not {type(key).__name__}")
    if value is not None and not isinstance(value, bytes | bytearray | memoryview):
        raise InvalidInputError(f"record value must be bytes or None, not {type(value).__name__}")
    for k, v in (record.properties or {}).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidInputError("record properties must map str to str")
        try:
            k.encode(), v.encode()
        except UnicodeEncodeError:
            raise InvalidInputError("record properties must be valid Unicode text") from None
    pt, et = record.publish_time, record.event_time
    if not isinstance(pt, int) or isinstance(pt, bool) or not 0 <= pt <= _I64_MAX:
        raise InvalidInputError(f"bad publish time {pt!r}")
    if et is not None and (not isinstance(et, int) or isinstance(et, bool) or not _I64_MIN <= et <= _I64_MAX):
        raise InvalidInputError(f"event time {et!r} is not a 64-bit integer (milliseconds)")


def check_record_size(record: Record, max_record_bytes: int) -> None:
    """Refuse a record whose encoding would exceed ``max_record_bytes``, before it is
    accepted into a batch (a cheap upper bound first; the exact size only near the limit)."""
    def size(b: bytes | bytearray | memoryview | None) -> int:
        return 0 if b is None else b.nbytes if isinstance(b, memoryview) else len(b)

    # msgpack adds at most 5 bytes per field and 9 per integer; text is at most 4 bytes a character
    bound = 64 + size(record.key) + size(record.value) + sum(
        4 * (len(k) + len(v)) + 10 for k, v in (record.properties or {}).items())
    if bound <= max_record_bytes:
        return
    n = len(encode_record(record))
    if n > max_record_bytes:
        raise RecordTooLargeError(f"record of {n} bytes exceeds the maximum of {max_record_bytes} bytes")


def encode_record(record: Record) -> bytes:
    """Encode one record; validate its fields on the way."""
    validate_record(record)
    key, value = record.key, record.value
    props = dict(record.properties) if record.properties else None
    data: bytes = _packer_local.pack(
        [
            None if key is None else bytes(key),
            None if value is None else bytes(value),
            props,
            record.publish_time,
            record.event_time,
        ]
    )
    return data


def key_hash(key: bytes) -> tuple[int, int]:
    """The 128-bit key hash stored in ledger footers, as ``(high, low)`` 64-bit halves.

    128 bits keep the chance of any collision negligible even at billions of keys.
    """
    h: int = xxhash.xxh3_128_intdigest(key)
    return h >> 64, h & 0xFFFFFFFFFFFFFFFF


class Readable(Protocol):
    """A source of bytes read in order (a file, :class:`~shale.ledger.stream.PayloadStream`)."""

    def read(self, n: int = -1, /) -> bytes: ...


def decode_records(
    payload: bytes | bytearray | memoryview | Readable,
    count: int,
    *,
    where: str,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    path: str = "",
    position: int | None = None,
    ends: list[int] | None = None,
) -> Iterator[tuple[bytes | None, bytes | None, Mapping[str, str], int, int | None]]:
    """Decode ``count`` consecutive records from an entry payload.

    Yields ``(key, value, properties, publish_time, event_time)`` tuples.  ``where`` names
    the object and entry for error messages.  Sizes are bounded so a hostile length field
    cannot make msgpack allocate without limit.  ``ends``, when given, gets where each
    record ends in the payload (for :func:`decode_record` to decode it again in place).
    """
    # A big payload is read as a stream, a slice at a time: the unpacker then holds one
    # record at most rather than a copy of the whole payload.
    stream: Readable | None = None
    whole: bytes | bytearray | memoryview | None = None
    if not isinstance(payload, bytes | bytearray | memoryview):
        size, stream = _STREAM_BYTES + 1, payload
    elif (size := memoryview(payload).nbytes) > _STREAM_BYTES:
        stream = _Slices(payload)
    else:
        whole = payload
    unpacker = msgpack.Unpacker(
        stream,
        raw=False,
        use_list=False,
        strict_map_key=True,
        read_size=min(_STREAM_BYTES, max(size, 1)),
        max_buffer_size=max_record_bytes + 2 * _STREAM_BYTES if stream is not None else max(size, 1),
        max_bin_len=max_record_bytes,
        max_str_len=max_record_bytes,
        max_array_len=16,
        max_map_len=1 << 20,
    )
    if whole is not None:
        unpacker.feed(whole)
    n = 0
    try:
        for obj in unpacker:
            n += 1
            if n > count:
                break
            if ends is not None:
                ends.append(unpacker.tell())
            yield _check_record(obj, where)
    except CorruptLedgerError as e:
        raise CorruptLedgerError(str(e), path=path, position=position) from None
    except (ValueError, msgpack.UnpackException, msgpack.ExtraData) as e:
        why = str(e) or ("ends in the middle of a record" if isinstance(e, msgpack.OutOfData) else "malformed msgpack")
        raise CorruptLedgerError(f"{where}: undecodable record #{n}: {why}", path=path, position=position) from e
    if n != count:
        raise CorruptLedgerError(f"{where}: entry holds {n} records, footer says {count}",
                                 path=path, position=position)


class _Slices:
    """A payload read as a file, a copied slice at a time (what msgpack's unpacker reads)."""

    def __init__(self, payload: bytes | bytearray | memoryview) -> None:
        self._view = memoryview(payload).cast("B")
        self._at = 0

    def read(self, n: int = -1, /) -> bytes:
        n = len(self._view) - self._at if n < 0 else n
        got = bytes(self._view[self._at:self._at + n])
        self._at += len(got)
        return got


def decode_record(
    data: bytes | bytearray | memoryview, *, where: str, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    path: str = "", position: int | None = None,
) -> tuple[bytes | None, bytes | None, Mapping[str, str], int, int | None]:
    """Decode one record that fills ``data`` exactly (read in place, not copied first), as
    :func:`decode_records` decodes each of its records."""
    try:
        obj = msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=True, max_bin_len=max_record_bytes,
                              max_str_len=max_record_bytes, max_array_len=16, max_map_len=1 << 20)
        return _check_record(obj, where)
    except CorruptLedgerError as e:
        raise CorruptLedgerError(str(e), path=path, position=position) from None
    except (ValueError, msgpack.UnpackException, msgpack.ExtraData) as e:
        raise CorruptLedgerError(f"{where}: undecodable record: {e or 'malformed msgpack'}", path=path,
                                 position=position) from e


def _check_record(
    obj: Any, where: str
) -> tuple[bytes | None, bytes | None, Mapping[str, str], int, int | None]:
    if not isinstance(obj, tuple) or len(obj) != 5:
        raise CorruptLedgerError(f"{where}: record is not a 5-element array")
    key, value, props, publish_time, event_time = obj
    if (
        (key is not None and not isinstance(key, bytes))
        or (value is not None and not isinstance(value, bytes))
        or (props is not None and not isinstance(props, dict))
        or not isinstance(publish_time, int)
        or (event_time is not None and not isinstance(event_time, int))
    ):
        raise CorruptLedgerError(f"{where}: record fields have the wrong types")
    if props and not all(isinstance(k, str) and isinstance(v, str) for k, v in props.items()):
        raise CorruptLedgerError(f"{where}: record properties are not a map of text to text")
    return key, value, props if props is not None else _EMPTY, publish_time, event_time
