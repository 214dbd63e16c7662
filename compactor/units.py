"""Sizes and durations as people type them, one parser each for every command.

Sizes (humanfriendly): ``64MiB``, ``256MB``, ``1GB``, ``1.5GiB``, ``8 KiB`` or plain bytes.
``KB``, ``MB``, ``GB`` and ``TB`` are powers of 1000 and ``KiB``, ``MiB``, ``GiB`` and ``TiB``
powers of 1024, as on every disk and cloud bill.

Durations (pytimeparse2, and isodate for ISO 8601): ``500ms``, ``30s``, ``10m``, ``1h30m``,
``24h``, ``7d``, ``1w``, ``PT1H``, ``P1D`` or plain seconds.
"""

from __future__ import annotations

import datetime
import math
from typing import Final

import humanfriendly
import isodate
import pytimeparse2

from shale.ledger.errors import InvalidInputError

__all__ = ["format_duration", "format_size", "parse_duration", "parse_size"]

_MS: Final = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000}
_UNITS: Final = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10),
                 ("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3))
_DURATION_HELP: Final = "use a number with a unit (500ms, 30s, 10m, 1h30m, 24h, 7d, 1w), ISO 8601 (PT1H) or seconds"


def parse_size(text: str | int) -> int:
    """Bytes; raises :class:`InvalidInputError`."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise InvalidInputError(f"size {text} must not be negative")
        return text
    try:
        value = humanfriendly.parse_size(str(text).strip())
    except humanfriendly.InvalidSize:
        raise InvalidInputError(f"bad size {text!r}: use bytes or a unit (64MiB, 256MB, 1GB, 1.5GiB)") from None
    if value < 0:
        raise InvalidInputError(f"size {text!r} must not be negative")
    return int(value)


def format_size(n: int) -> str:
    """The shortest exact form: ``268435456`` → ``256MiB``, ``500000000000`` → ``500GB``."""
    forms = [f"{n // size}{unit}" for unit, size in _UNITS if n and n % size == 0]
    return min(forms, key=len, default=f"{n}B")


def parse_duration(text: str | int | float) -> int:
    """Milliseconds; a bare number is seconds.  Raises :class:`InvalidInputError`."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds: float | None = float(text)
    else:
        t = str(text).strip()
        seconds = _iso_seconds(t) if t[:1] in ("P", "p") else _plain_seconds(t)
    if seconds is None or not math.isfinite(seconds):
        raise InvalidInputError(f"bad duration {text!r}: {_DURATION_HELP}")
    if seconds < 0:
        raise InvalidInputError(f"duration {text!r} must not be negative")
    return round(seconds * 1000)


def _plain_seconds(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        value = pytimeparse2.parse(text)
    except (ValueError, OverflowError):
        return None
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return None if value is None else float(value)


def _iso_seconds(text: str) -> float | None:
    try:
        value = isodate.parse_duration(text.upper())
    except (isodate.ISO8601Error, ValueError):
        return None
    if not isinstance(value, datetime.timedelta):
        return None  # years and months have no fixed length: refused rather than guessed
    return value.total_seconds()


def format_duration(ms: int) -> str:
    """The shortest exact form: ``86400000`` → ``1d``, ``5400000`` → ``90m``."""
    for unit, size in _MS.items():
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
