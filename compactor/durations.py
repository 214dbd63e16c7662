"""Durations as people type them: ``500ms``, ``30s``, ``10m``, ``24h``, ``7d`` or plain seconds."""

from __future__ import annotations

import re
from typing import Final

from shale.ledger.errors import InvalidInputError

__all__ = ["format_duration", "parse_duration"]

_UNITS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_RE: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration(text: str | int | float) -> int:
    """Milliseconds; a bare number is seconds.  Raises :class:`InvalidInputError`."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        if text < 0:
            raise InvalidInputError(f"duration {text!r} must not be negative")
        return int(text * 1000)
    m = _RE.match(str(text))
    if m is None:
        raise InvalidInputError(
            f"bad duration {text!r}: use a number with a unit (500ms, 30s, 10m, 24h, 7d) or plain seconds")
    return round(float(m.group(1)) * _UNITS[m.group(2) or "s"])


def format_duration(ms: int) -> str:
    """The shortest exact form: ``86400000`` → ``24h``."""
    for unit in ("d", "h", "m", "s"):
        if ms and ms % _UNITS[unit] == 0:
            return f"{ms // _UNITS[unit]}{unit}"
    return f"{ms}ms"
