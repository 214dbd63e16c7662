"""The JSON-lines forms of records (``shale produce`` input, ``shale read`` output)."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from shale.ledger.errors import InvalidInputError
from shale.ledger.record import Message

__all__ = ["message_to_json", "parse_record_line"]


def _text_or_b64(data: bytes | None, name: str, out: dict[str, Any]) -> None:
    if data is None:
        out[name] = None
        return
    try:
        out[name] = data.decode("utf-8")
    except UnicodeDecodeError:
        out[f"{name}_b64"] = base64.b64encode(data).decode("ascii")


def message_to_json(m: Message, value_format: str = "text") -> dict[str, Any]:
    """``{"id","key","value","properties","publish_time","event_time"}``; binary keys and
    values that are not UTF-8 appear as ``key_b64`` / ``value_b64``.  With
    ``value_format="json"`` a value that is a JSON document appears as that document
    (an object, an array...); any other value as text."""
    out: dict[str, Any] = {"id": str(m.id)}
    _text_or_b64(m.key, "key", out)
    _text_or_b64(m.value, "value", out)
    if value_format == "json" and isinstance(out.get("value"), str):
        try:
            out["value"] = json.loads(out["value"])
        except ValueError:
            pass  # not a JSON document: shown as the text it is
    out["properties"] = dict(m.properties)
    out["publish_time"] = m.publish_time
    out["event_time"] = m.event_time
    return out


def _field_bytes(doc: dict[str, Any], name: str, where: str) -> bytes | None:
    b64 = f"{name}_b64"
    if b64 in doc and doc[b64] is not None:
        if doc.get(name) is not None:
            raise InvalidInputError(f"{where}: give either {name!r} or {b64!r}, not both")
        try:
            return base64.b64decode(doc[b64], validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise InvalidInputError(f"{where}: {b64!r} is not valid base64") from None
    value = doc.get(name)
    if value is None:
        return None
    if name == "value" and isinstance(value, dict | list):
        # a JSON document is stored as its compact JSON text (read --value-format json shows it again)
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if not isinstance(value, str):
        what = "a string, a JSON object or array, or null" if name == "value" else "a string or null"
        raise InvalidInputError(f"{where}: {name!r} must be {what}")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInputError(f"{where}: {name!r} is not valid Unicode text (lone surrogate)") from None


def parse_record_line(
    line: str, where: str
) -> tuple[bytes | None, bytes | None, dict[str, str], int | None]:
    """Parse one input line into ``(key, value, properties, event_time)``."""
    try:
        doc = json.loads(line)
    except ValueError as e:
        raise InvalidInputError(f"{where}: not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise InvalidInputError(f"{where}: expected a JSON object")
    unknown = set(doc) - {"key", "key_b64", "value", "value_b64", "properties", "event_time"}
    if unknown:
        noun = "field" if len(unknown) == 1 else "fields"
        raise InvalidInputError(f"{where}: unknown {noun} {', '.join(sorted(unknown))}")
    key = _field_bytes(doc, "key", where)
    value = _field_bytes(doc, "value", where)
    props = doc.get("properties") or {}
    if not isinstance(props, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in props.items()):
        raise InvalidInputError(f"{where}: 'properties' must map strings to strings")
    event_time = doc.get("event_time")
    if event_time is not None and (not isinstance(event_time, int) or isinstance(event_time, bool)
                                   or not -(1 << 63) <= event_time < 1 << 63):
        raise InvalidInputError(f"{where}: 'event_time' must be a 64-bit integer (milliseconds)")
    return key, value, props, event_time
