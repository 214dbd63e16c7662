"""Sizes and durations as people type them, one parser each for every command; and
counts and times as people read them (:func:`count`: ``1 record``, ``2,000 records``;
:func:`format_time`: ``2024-05-01 12:00:00``).

Sizes (humanfriendly): ``64MiB``, ``256MB``, ``1GB``, ``1.5GiB``, ``8 KiB`` or plain bytes.
``KB``, ``MB``, ``GB`` and ``TB`` are powers of 1000 and ``KiB``, ``MiB``, ``GiB`` and ``TiB``
powers of 1024, as on every disk and cloud bill.

Durations (pytimeparse2, and isodate for ISO 8601): ``500ms``, ``30s``, ``10m``, ``1h30m``,
``24h``, ``7d``, ``1w``, ``PT1H``, ``P1D`` or plain seconds.
"""

from __future__ import annotations

import datetime
import math
from typing import Final, Literal

from shale.ledger.errors import InvalidInputError

__all__ = ["MAX_BYTES", "MAX_MILLIS", "count", "format_duration", "format_size", "format_time", "parse_duration",
           "parse_size"]

#: The longest duration and the largest size a setting may hold (about 146 million years
#: and 4 EiB): a sum or difference with a time in milliseconds stays a signed 64-bit integer.
MAX_MILLIS: Final = (1 << 62) - 1
MAX_BYTES: Final = (1 << 62) - 1

_MS: Final = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000}
_UNITS: Final = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10),
                 ("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3))
_DURATION_HELP: Final = "use a number with a unit (500ms, 30s, 10m, 1h30m, 24h, 7d, 1w), ISO 8601 (PT1H) or seconds"
#: What the limits are, in words, for messages.
_MAX_DURATION_TEXT: Final = "at most about 146 million years"
_MAX_SIZE_TEXT: Final = "at most 4EiB"


def parse_size(text: str | int) -> int:
    """Bytes, from 0 to 4 EiB; raises :class:`InvalidInputError`."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        import humanfriendly  # (imported when a size is typed: a command that takes none never needs it)

        try:
            value = int(humanfriendly.parse_size(str(text).strip()))
        except (humanfriendly.InvalidSize, ValueError, OverflowError):
            raise InvalidInputError(f"bad size {_short(text)!r}: use bytes or a unit (64MiB, 256MB, 1GB, "
                                    "1.5GiB)") from None
    if value < 0:
        raise InvalidInputError(f"size {_short(text)!r} must not be negative")
    if value > MAX_BYTES:
        raise InvalidInputError(f"size {_short(text)!r} is out of range ({_MAX_SIZE_TEXT})")
    return value


def _short(text: object) -> str:
    """``text`` as a message quotes it: a value thousands of digits long is cut short."""
    shown = str(text)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def format_size(n: int) -> str:
    """The shortest exact form: ``268435456`` → ``256MiB``, ``500000000000`` → ``500GB``."""
    forms = [f"{n // size}{unit}" for unit, size in _UNITS if n and n % size == 0]
    return min(forms, key=len, default=f"{n}B")


def parse_duration(text: str | int | float) -> int:
    """Milliseconds, from 0 to about 146 million years; a bare number is seconds.  Raises
    :class:`InvalidInputError`."""
    try:
        if isinstance(text, int | float) and not isinstance(text, bool):
            seconds: float | None = float(text)
        else:
            t = str(text).strip()
            seconds = _iso_seconds(t) if t[:1] in ("P", "p") else _plain_seconds(t)
    except OverflowError:
        raise InvalidInputError(f"duration {_short(text)!r} is out of range ({_MAX_DURATION_TEXT})") from None
    if seconds is not None and math.isinf(seconds):
        raise InvalidInputError(f"duration {_short(text)!r} is out of range ({_MAX_DURATION_TEXT})")
    if seconds is None or math.isnan(seconds):
        raise InvalidInputError(f"bad duration {_short(text)!r}: {_DURATION_HELP}")
    if seconds < 0:
        raise InvalidInputError(f"duration {_short(text)!r} must not be negative")
    if seconds * 1000 > MAX_MILLIS:
        raise InvalidInputError(f"duration {_short(text)!r} is out of range ({_MAX_DURATION_TEXT})")
    return round(seconds * 1000)


def _plain_seconds(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        pass
    import pytimeparse2  # (imported when a duration is typed, as are isodate and humanfriendly)

    try:
        value = pytimeparse2.parse(text)
    except (ValueError, OverflowError):
        return None
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return None if value is None else float(value)


def _iso_seconds(text: str) -> float | None:
    import isodate

    try:
        value = isodate.parse_duration(text.upper())
    except (isodate.ISO8601Error, ValueError):
        return None
    except OverflowError:
        raise  # a number too big: out of range, not malformed
    if not isinstance(value, datetime.timedelta):
        return None  # years and months have no fixed length: refused rather than guessed
    return value.total_seconds()


def format_duration(ms: int) -> str:
    """The shortest exact form: ``86400000`` → ``1d``, ``5400000`` → ``90m``."""
    for unit, size in _MS.items():
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def count(n: int, noun: str, plural: str = "") -> str:
    """``n`` and ``noun``, in the plural unless ``n`` is 1: ``1 record``, ``2,000 records``,
    ``3 entries`` (``plural`` where adding an s is wrong)."""
    if n == 1:
        return f"1 {noun}"
    return f"{n:,} {plural or (noun[:-1] + 'ies' if noun.endswith('y') and noun[-2:-1] not in 'aeiou' else noun + 's')}"


_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_FIRST: Final = datetime.datetime.min.replace(tzinfo=datetime.UTC)
_LAST: Final = datetime.datetime.max.replace(tzinfo=datetime.UTC, microsecond=0)


def format_time(ms: int, *, style: Literal["seconds", "minutes", "iso"] = "seconds") -> str:
    """``ms`` (since 1970, UTC) as people read it: ``2024-05-01 12:00:00`` (``minutes``:
    ``2024-05-01 12:00``; ``iso``: ``2024-05-01T12:00:00Z``), the year always in four
    digits.  A time no calendar date holds (a document may say year 146 million) is said
    as such, ``after 9999-12-31 23:59:59``, never an error."""
    try:
        when = _EPOCH + datetime.timedelta(milliseconds=ms)
        outside = ""
    except OverflowError:
        when, outside = (_LAST, "after ") if ms > 0 else (_FIRST, "before ")
    # (strftime's %Y gives year 1 as "1" on glibc: the year is formatted here)
    text = f"{when.year:04d}-{when:%m-%d}{'T' if style == 'iso' else ' '}{when:%H:%M}"
    if style != "minutes":
        text += f":{when:%S}"
    return outside + text + ("Z" if style == "iso" else "")
