"""The JSON-lines forms of records (``shale produce`` input, ``shale read`` output).

A value given as a JSON object or array is stored as its text, byte for byte as the line
has it (checked, never decoded and encoded again: numbers keep every digit, names given
twice stay twice).  With ``--value-format json`` a value that strict JSON parsers read is
printed as its text again; any other is printed as a JSON string, so every line printed
is strict JSON.
"""

from __future__ import annotations

import binascii
import json
import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Final, TextIO

import msgspec

from shale.ledger.errors import InvalidInputError, mid_sentence
from shale.ledger.record import EVENT_TIME_RANGE, Message, event_time_in_range

if TYPE_CHECKING:
    import pyarrow as pa

    from shale.reader.batches import MessageBatch

__all__ = ["BLOCK_BYTES", "MAX_JSON_DEPTH", "LineOutput", "batch_lines", "change_line", "change_to_json",
           "json_document", "message_line", "message_to_json", "parse_record_line", "write_batches"]

#: How deeply a JSON value may nest.  Python's ``json`` gives up near 1,000 levels less
#: the caller's own stack, so a value printed inside a line stays readable well below it.
MAX_JSON_DEPTH: Final = 512

_TOO_DEEP: Final = f"JSON nested more than {MAX_JSON_DEPTH} levels deep"
_FIELDS: Final = frozenset({"key", "key_b64", "value", "value_b64", "properties", "event_time"})


class _Line(msgspec.Struct, forbid_unknown_fields=True):
    key: str | None = None
    key_b64: str | None = None
    #: the value's JSON text as the line has it (empty when the line has no value)
    value: msgspec.Raw = msgspec.Raw(b"")
    value_b64: str | None = None
    properties: dict[str, str] | None = None
    event_time: int | None = None


_LINE: Final = msgspec.json.Decoder(_Line)
_TEXT: Final = msgspec.json.Decoder(str)
_ANY: Final = msgspec.json.Decoder()
_ENCODER: Final = msgspec.json.Encoder()
# a JSON string, escapes included (to find the nesting outside strings)
_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
# outside strings, where alone a valid document can hold them, line breaks are whitespace
_LINE_BREAKS: Final = bytes.maketrans(b"\r\n", b"  ")


# -------------------------------------------------------------------- output


def _text_or_b64(data: bytes | None, name: str, out: dict[str, Any]) -> None:
    if data is None:
        out[name] = None
        return
    try:
        out[name] = data.decode("utf-8")
    except UnicodeDecodeError:
        # (base64.b64encode, without importing base64 into every command that prints a record)
        out[f"{name}_b64"] = binascii.b2a_base64(data, newline=False).decode("ascii")


def _depth(text: bytes) -> int:
    """How deeply a valid JSON text nests (a bound, exact from ``MAX_JSON_DEPTH`` on)."""
    if len(text) <= 2 * MAX_JSON_DEPTH:
        return len(text) // 2  # each level takes two bytes: no need to look
    opened = text.count(b"[") + text.count(b"{")
    if opened <= MAX_JSON_DEPTH:
        return opened
    import numpy as np

    bare = np.frombuffer(_STRING.sub(b"", text), np.uint8)
    steps = ((bare == ord("[")) | (bare == ord("{"))).astype(np.int64) - ((bare == ord("]")) | (bare == ord("}")))
    return int(np.cumsum(steps).max(initial=0))


def json_document(text: bytes) -> msgspec.Raw | None:
    """``text`` (UTF-8) as a JSON document to print as it is, or ``None`` when strict parsers
    would not read it back: not JSON (``NaN``, ``Infinity``, malformed), nested deeper than
    :data:`MAX_JSON_DEPTH`, or numbers parsers refuse (a float beyond 64-bit floats, an
    integer of more than 4,300 digits).  Line breaks between its tokens become spaces, so
    that it fits on one line; nothing else changes."""
    if _depth(text) > MAX_JSON_DEPTH:
        return None
    try:
        _ANY.decode(text)
    except (msgspec.DecodeError, RecursionError):
        return None
    return msgspec.Raw(text.translate(_LINE_BREAKS) if b"\n" in text or b"\r" in text else text)


def message_to_json(m: Message, value_format: str = "text") -> dict[str, Any]:
    """``{"id","key","value","properties","publish_time","event_time"}``; binary keys and
    values that are not UTF-8 appear as ``key_b64`` / ``value_b64``.  With
    ``value_format="json"`` a value that is a JSON document strict parsers read (see
    :func:`json_document`) is a :class:`msgspec.Raw` of its text, to be encoded with
    ``msgspec.json`` (:func:`message_line` does); any other value is its text."""
    out: dict[str, Any] = {"id": str(m.id)}
    _text_or_b64(m.key, "key", out)
    _text_or_b64(m.value, "value", out)
    if value_format == "json" and isinstance(out.get("value"), str) and m.value:
        doc = json_document(m.value)
        if doc is not None:
            out["value"] = doc
    out["properties"] = dict(m.properties)
    out["publish_time"] = m.publish_time
    out["event_time"] = m.event_time
    return out


def message_line(m: Message, value_format: str = "text") -> str:
    """One JSON line (without its newline) for ``m``, as ``shale read`` prints it: strict
    JSON whatever the record holds."""
    return _ENCODER.encode(message_to_json(m, value_format)).decode("utf-8")


def change_to_json(op: str, key: bytes, m: Message | None, value_format: str = "text") -> dict[str, Any]:
    """A change as ``shale changes`` prints it: ``{"op": "upsert", ...the record}`` or
    ``{"op": "delete", "key"}`` (``key_b64`` for a key that is not UTF-8)."""
    if m is not None:
        return {"op": op, **message_to_json(m, value_format)}
    out: dict[str, Any] = {"op": op}
    _text_or_b64(key, "key", out)
    return out


def change_line(op: str, key: bytes, m: Message | None, value_format: str = "text") -> str:
    """One JSON line (without its newline) for a change (:func:`change_to_json`)."""
    return _ENCODER.encode(change_to_json(op, key, m, value_format)).decode("utf-8")


# ---------------------------------------------------------- output, in batches

#: Lines of a batch are written in blocks of about this many bytes (a longer line alone).
BLOCK_BYTES: Final = 1 << 20
#: What the C kernel says of a block (``json_lines`` in ``ledger/_kernels.c``).
_DONE, _HANDOFF, _GROW = 0, 1, 2


def batch_lines(batch: pa.RecordBatch, value_format: str = "text", *,
                block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[memoryview, int]]:
    """The lines :func:`message_line` makes of the rows of ``batch`` (the columns of
    :mod:`shale.reader.arrow`), each ending in a newline, in blocks of about
    ``block_bytes``: ``(block, rows)``, the lines of the next ``rows`` rows.  A block is
    valid until the next one is asked for.

    Written by the C kernel (``json_lines``) from the batch's buffers, byte for byte what
    :func:`message_line` makes; a row it cannot decide — property names given twice, a
    value printed as JSON whose document it cannot tell that msgspec reads or refuses —
    is made by :func:`message_line`, and so is every row without the kernel."""
    from shale.ledger import kernels

    native = kernels._native  # (looked up at each call: the tests swap it for the fallback)
    columns = None if native is None else _kernel_columns(batch)
    if native is None or columns is None:
        yield from _python_blocks(batch, 0, batch.num_rows, value_format, block_bytes)
        return
    json_values = value_format == "json"
    out = bytearray(block_bytes)
    row, n = 0, batch.num_rows
    while row < n:
        written, reached, status, need = native.json_lines(columns, row, n, json_values, out)
        if written:
            yield memoryview(out)[:written], reached - row
        if status == _GROW:  # one line bigger than a block: a buffer of its own
            big = bytearray(need)
            written, reached, status, need = native.json_lines(columns, row, row + 1, json_values, big)
            yield memoryview(big)[:written], 1
            del big
        elif status == _HANDOFF:
            yield from _python_blocks(batch, reached, reached + 1, value_format, block_bytes)
            reached += 1
        row = reached


class LineOutput:
    """Where blocks of lines go: a text stream's binary buffer when it has one and encodes
    UTF-8 (the lines are UTF-8: the bytes are those the text would have been), else the
    text stream itself."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        raw = getattr(out, "buffer", None)
        encoding = (getattr(out, "encoding", None) or "").lower().replace("_", "-")
        self._raw = raw if raw is not None and encoding in ("utf-8", "utf8") else None
        out.flush()  # (what the text layer holds goes first)

    def write(self, block: memoryview) -> None:
        if self._raw is not None:
            self._raw.write(block)
        else:
            self.out.write(str(block, "utf-8"))

    def flush(self) -> None:
        self.out.flush()


def write_batches(batches: Iterable[MessageBatch | pa.RecordBatch], out: LineOutput, value_format: str = "text", *,
                  flush: bool = False) -> int:
    """Write the lines of every row of ``batches`` (:func:`batch_lines`) to ``out``, flushing
    after each batch with ``flush``; how many rows were written."""
    rows = 0
    for batch in batches:
        records = getattr(batch, "records", batch)
        for block, n in batch_lines(records, value_format):
            out.write(block)
            rows += n
        if flush:
            out.flush()
    return rows


def _python_blocks(batch: pa.RecordBatch, start: int, stop: int, value_format: str,
                   block_bytes: int) -> Iterator[tuple[memoryview, int]]:
    """Rows ``[start, stop)`` of ``batch`` through :func:`message_line`, in blocks."""
    from shale.reader.batches import batch_messages

    for a in range(start, stop, max(1, block_bytes // 64)):
        b = min(stop, a + max(1, block_bytes // 64))
        text = "".join(message_line(m, value_format) + "\n" for m in batch_messages(batch.slice(a, b - a)))
        yield memoryview(text.encode("utf-8")), b - a


def _kernel_columns(batch: pa.RecordBatch) -> tuple[Any, ...] | None:
    """The buffers ``json_lines`` reads (see ``ledger/_kernels.c``), or None when the batch
    is not laid out as :mod:`shale.reader.arrow` makes batches (a slice not at its start, a
    null map): the Python path prints it."""
    col = batch.column
    props = col("properties")
    arrays = [col(name) for name in ("ledger", "entry", "batch", "key", "value", "publish_time", "event_time")]
    if any(a.offset for a in arrays) or props.offset or props.null_count or props.values.offset or any(
            props.values.field(i).offset for i in range(2)):
        return None
    ledger, entry, index, key, value, publish, event = (a.buffers() for a in arrays)
    p = props.buffers()  # map validity, offsets, struct validity, then each child's validity, offsets, data
    return (ledger[1], entry[1], index[1], *key, *value, p[1], p[4], p[5], p[7], p[8], publish[1], *event)


# --------------------------------------------------------------------- input


def _b64(text: str, name: str, where: str) -> bytes:
    import base64

    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInputError(f"{where}: {name!r} is not valid base64") from None


def _value(raw: msgspec.Raw, where: str) -> bytes | None:
    """The value's bytes: a string's UTF-8, an object's or array's own text."""
    text = bytes(raw)
    first = text[:1]
    if first == b'"':
        # the text between the quotes is the string's UTF-8 unless it holds an escape
        return text[1:-1] if b"\\" not in text else _TEXT.decode(text).encode("utf-8")
    if first in (b"{", b"["):
        if (depth := _depth(text)) > MAX_JSON_DEPTH:
            raise InvalidInputError(f"{where}: 'value' nests {depth:,} levels deep, more than {MAX_JSON_DEPTH}")
        return text
    if not text or text == b"null":
        return None
    raise InvalidInputError(f"{where}: 'value' must be a string, a JSON object or array, or null")


def parse_record_line(
    line: str, where: str
) -> tuple[bytes | None, bytes | None, dict[str, str], int | None]:
    """Parse one input line into ``(key, value, properties, event_time)``.

    A value given as a JSON object or array is its text exactly as the line has it;
    a line that is not strict JSON, nests deeper than :data:`MAX_JSON_DEPTH` or has an
    event time outside :data:`~shale.ledger.record.EVENT_TIME_RANGE` is refused."""
    try:
        doc = _LINE.decode(line)
    except msgspec.ValidationError as e:
        raise InvalidInputError(f"{where}: {_wrong_field(line, str(e))}") from None
    except msgspec.DecodeError as e:
        raise InvalidInputError(f"{where}: {_not_json(line, str(e))}") from None
    except RecursionError:
        raise InvalidInputError(f"{where}: {_TOO_DEEP}") from None
    if doc.key is not None and doc.key_b64 is not None:
        raise InvalidInputError(f"{where}: give either 'key' or 'key_b64', not both")
    key = _b64(doc.key_b64, "key_b64", where) if doc.key_b64 is not None else (
        None if doc.key is None else doc.key.encode("utf-8"))
    value = _value(doc.value, where)
    if doc.value_b64 is not None:
        if value is not None:
            raise InvalidInputError(f"{where}: give either 'value' or 'value_b64', not both")
        value = _b64(doc.value_b64, "value_b64", where)
    event_time = doc.event_time
    if event_time is not None and not event_time_in_range(event_time):
        raise InvalidInputError(f"{where}: 'event_time' {event_time} is outside {EVENT_TIME_RANGE}")
    return key, value, doc.properties or {}, event_time


def _wrong_field(line: str, why: str) -> str:
    """msgspec's complaint about a field, in the words of the command's documentation."""
    if why.startswith("Object contains unknown field"):
        try:
            unknown = sorted(set(json.loads(line)) - _FIELDS)
        except (ValueError, RecursionError):
            unknown = []
        unknown = unknown or [why.rsplit("`", 2)[-2]]
        return f"unknown {'field' if len(unknown) == 1 else 'fields'} {', '.join(unknown)}"
    field = re.search(r"at `\$\.(\w+)", why)
    name = field.group(1) if field else None
    if name == "properties":
        return "'properties' must map strings to strings"
    if name == "event_time":
        return f"'event_time' must be an integer, in milliseconds from {EVENT_TIME_RANGE}"
    if name in ("key", "key_b64", "value_b64"):
        return f"{name!r} must be a string or null"
    if name is None and why.startswith("Expected `object`"):
        return "expected a JSON object"
    return f"not a record: {why}"


def _not_json(line: str, why: str) -> str:
    """Why a line is not strict JSON, said as well as Python's parser says it (whose
    messages name the line and column), else as msgspec does."""
    constants: list[str] = []

    def constant(name: str) -> float:
        constants.append(name)
        return 0.0

    try:
        json.loads(line, parse_constant=constant)
    except RecursionError:
        return _TOO_DEEP
    except ValueError as e:
        return f"not valid JSON: {mid_sentence(str(e))}"
    if constants:
        return f"not valid JSON: {constants[0]} is not a JSON number"
    if re.search(r"\\u[dD][89a-fA-F]", line):
        return "not valid JSON: a \\u escape is half of a surrogate pair (not valid Unicode)"
    return f"not valid JSON: {mid_sentence(why)}"
