"""Batches of records from Arrow data or Python sequences, checked column by column.

:func:`record_columns` turns what a caller hands :meth:`TopicWriter.append_batch
<shale.producer.TopicWriter.append_batch>` into :class:`~shale.ledger.encoder.RecordColumns`:
zero-copy views of an Arrow record batch's buffers where it can, one pass over a Python
list otherwise.  Everything is checked before anything is encoded, and a problem is one
line naming the column and, where one row is at fault, the row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from shale.ledger.encoder import Properties, RecordColumns, VarColumn
from shale.ledger.errors import InvalidInputError
from shale.ledger.record import EVENT_TIME_MAX_MS, EVENT_TIME_MIN_MS, EVENT_TIME_RANGE

__all__ = ["DEFAULT_KEY_FIELD", "DEFAULT_VALUE_FIELD", "Fields", "check_event_times", "record_columns", "shift_rows"]

DEFAULT_KEY_FIELD: Final = "key"
DEFAULT_VALUE_FIELD: Final = "value"

_TIME_UNITS_PER_MS: Final = {"s": None, "ms": 1, "us": 1_000, "ns": 1_000_000}


class Fields:
    """Which columns hold a record's key, value, properties and event time (``None``:
    no such column)."""

    __slots__ = ("event_time", "key", "properties", "value")

    def __init__(self, key: str = DEFAULT_KEY_FIELD, value: str = DEFAULT_VALUE_FIELD,
                 properties: str | None = None, event_time: str | None = None) -> None:
        self.key, self.value, self.properties, self.event_time = key, value, properties, event_time


def record_columns(data: Any, fields: Fields | None = None) -> list[RecordColumns]:
    """The records of ``data`` as column batches: ``data`` is a pyarrow ``Table`` or
    ``RecordBatch`` (or anything with ``to_batches()``), or a mapping of column name to a
    Python sequence (``bytes``/``str``/``None`` keys and values, ``dict`` properties,
    ``int`` event times in milliseconds)."""
    fields = fields or Fields()
    if isinstance(data, RecordColumns):
        return [data]
    if isinstance(data, Mapping):
        return [_from_sequences(data, fields)]
    batches = data.to_batches() if hasattr(data, "to_batches") else [data] if hasattr(data, "schema") else None
    if batches is None:
        raise InvalidInputError(f"append_batch takes an Arrow table or record batch, or a mapping of columns, "
                                f"not {type(data).__name__}")
    out, first = [], 0
    for batch in batches:
        out.append(_from_arrow(batch, fields, first))
        first += batch.num_rows
    return out


def check_event_times(cols: RecordColumns, name: str | None, first: int = 0) -> None:
    """Refuse a batch holding an event time outside
    :data:`~shale.ledger.record.EVENT_TIME_RANGE`, naming the column and the first such row
    (``first`` is the batch's first row in the whole input)."""
    times = cols.event_time
    if times is None or not len(times):
        return
    bad = (times < EVENT_TIME_MIN_MS) | (times > EVENT_TIME_MAX_MS)
    if cols.event_valid is not None:
        bad &= cols.event_valid.astype(bool)
    if bad.any():
        row = int(np.argmax(bad))
        raise InvalidInputError(f"column {name or 'event_time'!r}, row {first + row}: event time {int(times[row])} "
                                f"is outside {EVENT_TIME_RANGE}")


def shift_rows(message: str, first: int) -> str:
    """An error naming a row of one batch, naming it as a row of the whole input (whose
    row ``first`` the batch's first row is)."""
    import re

    return re.sub(r"\brow (\d+)", lambda m: f"row {int(m.group(1)) + first}", message, count=1)


# ------------------------------------------------------------------------- Arrow


def _column(batch: Any, name: str | None, required: bool) -> Any:
    if name is None:
        return None
    names = batch.schema.names
    if name not in names:
        if not required:
            raise InvalidInputError(f"no column {name!r} in the batch (its columns: {', '.join(names) or 'none'})")
        raise InvalidInputError(f"no column {name!r} in the batch (its columns: {', '.join(names) or 'none'}); "
                                "name the key and value columns (key=/value=, or --key-field/--value-field)")
    return batch.column(names.index(name))


def _validity(arr: Any) -> npt.NDArray[np.uint8] | None:
    if arr.null_count == 0:
        return None
    import pyarrow.compute as pc

    return np.asarray(pc.is_valid(arr).to_numpy(zero_copy_only=False), dtype=np.uint8)


def _var(arr: Any, name: str, first: int) -> VarColumn:
    """A binary or text column as offsets into its data (views of its buffers)."""
    import pyarrow as pa

    t = arr.type
    if pa.types.is_null(t):
        return VarColumn(np.zeros(len(arr) + 1, np.int64), b"", np.zeros(len(arr), np.uint8))
    if pa.types.is_binary_view(t) or pa.types.is_string_view(t) or pa.types.is_fixed_size_binary(t):
        arr = arr.cast(pa.large_binary())
    elif not (pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t)
              or pa.types.is_large_string(t)):
        raise InvalidInputError(f"column {name!r} is {t}, not binary or text (cast it, or pick another column)")
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        _check_utf8(arr, name, first)
    width = 8 if pa.types.is_large_binary(arr.type) or pa.types.is_large_string(arr.type) else 4
    _, off_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(off_buf, np.int32 if width == 4 else np.int64, count=len(arr) + 1,
                            offset=arr.offset * width).astype(np.int64)
    return VarColumn(offsets, memoryview(data_buf) if data_buf is not None else b"", _validity(arr))


def _check_utf8(arr: Any, name: str, first: int) -> None:
    import pyarrow as pa

    try:
        arr.validate(full=True)
    except pa.ArrowInvalid:
        # (rare: pyarrow builds checked text; only buffers assembled by hand get here)
        for i, v in enumerate(arr.cast(pa.large_binary()).to_pylist()):
            try:
                v is None or v.decode()
            except UnicodeDecodeError:
                raise InvalidInputError(f"column {name!r}, row {first + i}: text is not valid UTF-8") from None
        raise InvalidInputError(f"column {name!r}: not a valid text column") from None


def _properties(arr: Any, name: str, first: int) -> Properties:
    import pyarrow as pa

    t = arr.type
    if not (pa.types.is_map(t) and _texty(t.key_type) and _texty(t.item_type)):
        raise InvalidInputError(f"column {name!r} is {t}, not a map of text to text")
    offsets = arr.offsets.to_numpy().astype(np.int64)
    names, values = arr.keys, arr.items
    if values.null_count:
        nulls = np.flatnonzero(~values.is_valid().to_numpy(zero_copy_only=False))
        row = int(np.searchsorted(offsets, nulls[nulls >= offsets[0]][0], side="right")) - 1
        raise InvalidInputError(f"column {name!r}, row {first + row}: a property value is null")
    return Properties(offsets, _var(names, name, first), _var(values, name, first), _validity(arr))


def _texty(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t))


def _event_times(arr: Any, name: str, first: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8] | None]:
    import pyarrow as pa

    t = arr.type
    if not (pa.types.is_timestamp(t) or pa.types.is_integer(t)):
        raise InvalidInputError(f"column {name!r} is {t}, not a timestamp or integer milliseconds")
    if pa.types.is_unsigned_integer(t) and pa.types.is_uint64(t) and len(arr):
        import pyarrow.compute as pc

        if (top := pc.max(arr).as_py()) is not None and top >= 1 << 63:
            raise InvalidInputError(f"column {name!r}: {top} is not a 64-bit integer (milliseconds)")
    values = np.asarray(arr.cast(pa.int64()).fill_null(0).to_numpy(), np.int64)
    if pa.types.is_timestamp(t):
        per_ms = _TIME_UNITS_PER_MS[t.unit]
        if per_ms is None:  # seconds
            limit = (1 << 63) // 1000
            if len(values) and (bad := np.flatnonzero((values >= limit) | (values < -limit))).size:
                raise InvalidInputError(f"column {name!r}, row {first + int(bad[0])}: event time out of range, "
                                        f"which is {EVENT_TIME_RANGE}")
            values = values * 1000
        elif per_ms > 1:
            values = values // per_ms
    return values, _validity(arr)


def _from_arrow(batch: Any, fields: Fields, first: int) -> RecordColumns:
    key = _var(_column(batch, fields.key, True), fields.key, first)
    value = _var(_column(batch, fields.value, True), fields.value, first)
    props = None
    if fields.properties is not None:
        props = _properties(_column(batch, fields.properties, False), fields.properties, first)
    event = valid = None
    if fields.event_time is not None:
        event, valid = _event_times(_column(batch, fields.event_time, False), fields.event_time, first)
    return RecordColumns(key, value, props, event, valid)


# ---------------------------------------------------------------- Python sequences


def _from_sequences(data: Mapping[str, Sequence[Any]], fields: Fields) -> RecordColumns:
    cols: dict[str, Sequence[Any]] = dict(data)
    for name in (fields.key, fields.value):
        if name not in cols:
            raise InvalidInputError(f"no column {name!r} in the batch (its columns: {', '.join(cols) or 'none'})")
    n = len(cols[fields.key])
    for other in (fields.value, fields.properties, fields.event_time):
        if other is not None and other in cols and len(cols[other]) != n:
            raise InvalidInputError(f"column {other!r} has {len(cols[other])} rows, column {fields.key!r} {n}")
    key = _seq_var(cols[fields.key], fields.key)
    value = _seq_var(cols[fields.value], fields.value)
    props = None
    if fields.properties is not None and fields.properties in cols:
        props = _seq_properties(cols[fields.properties], fields.properties)
    event = valid = None
    if fields.event_time is not None and fields.event_time in cols:
        event, valid = _seq_event_times(cols[fields.event_time], fields.event_time)
    return RecordColumns(key, value, props, event, valid)


def _seq_var(rows: Sequence[Any], name: str) -> VarColumn:
    out: list[bytes] = []
    valid = np.ones(len(rows), np.uint8)
    for i, v in enumerate(rows):
        if v is None:
            valid[i] = 0
            out.append(b"")
        elif isinstance(v, bytes | bytearray | memoryview):
            out.append(bytes(v))
        elif isinstance(v, str):
            try:
                out.append(v.encode())
            except UnicodeEncodeError:
                raise InvalidInputError(f"column {name!r}, row {i}: text is not valid Unicode") from None
        else:
            raise InvalidInputError(f"column {name!r}, row {i}: {type(v).__name__} is not bytes, text or None")
    offsets = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, out), np.int64, len(out)), out=offsets[1:])
    return VarColumn(offsets, b"".join(out), valid if not valid.all() else None)


def _seq_properties(rows: Sequence[Any], name: str) -> Properties:
    offsets = np.zeros(len(rows) + 1, np.int64)
    names: list[str] = []
    values: list[str] = []
    valid = np.ones(len(rows), np.uint8)
    for i, props in enumerate(rows):
        if props is None:
            valid[i] = 0
        elif not isinstance(props, Mapping):
            raise InvalidInputError(f"column {name!r}, row {i}: {type(props).__name__} is not a mapping")
        else:
            for k, v in props.items():
                if not isinstance(k, str) or not isinstance(v, str):
                    raise InvalidInputError(f"column {name!r}, row {i}: properties must map text to text")
                names.append(k)
                values.append(v)
        offsets[i + 1] = len(names)
    return Properties(offsets, _seq_var(names, name), _seq_var(values, name), valid if not valid.all() else None)


def _seq_event_times(rows: Sequence[Any], name: str) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8] | None]:
    out = np.zeros(len(rows), np.int64)
    valid = np.ones(len(rows), np.uint8)
    for i, v in enumerate(rows):
        if v is None:
            valid[i] = 0
        elif isinstance(v, int) and not isinstance(v, bool) and -(1 << 63) <= v < (1 << 63):
            out[i] = v
        else:
            raise InvalidInputError(f"column {name!r}, row {i}: {v!r} is not a 64-bit integer (milliseconds)")
    return out, valid if not valid.all() else None
