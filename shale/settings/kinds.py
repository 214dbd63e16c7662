"""The kinds of value a setting takes: how each is typed in (a flag, a ``SHALE_*``
variable, ``shale config --set``), checked, shown, and stored in a topic's policy.

A kind's :meth:`~Kind.parse` takes text and returns the typed value or raises
:class:`~shale.ledger.errors.InvalidInputError` saying what is wrong with the value; the
caller names where it came from (the flag, the variable, the policy key).  :meth:`~Kind.check`
does the same for a value given typed (the Python API, a policy document).  The ranges of
the values a policy document may hold are msgspec constraints (:attr:`~Kind.doc_type`),
so the document's schema and the flags check the same limits.
"""

from __future__ import annotations

import functools
import math
import re
import sys
import urllib.parse
from typing import Annotated, Any, ClassVar, Final, Literal, NoReturn

from shale.ledger.codecs import Compression, parse_compression
from shale.ledger.errors import InvalidInputError, InvalidURIError
from shale.ledger.masking import mask_secrets
from shale.ledger.values import dataclass
from shale.settings.units import MAX_BYTES, MAX_MILLIS, format_duration, format_size, parse_duration, parse_size

__all__ = ["Choice", "Codec", "Duration", "Instant", "Kind", "Pairs", "Rate", "Ratio", "Size", "Switch", "Text",
           "Uri", "Url", "Whole", "shown"]

TRUE: Final = frozenset({"1", "true", "yes", "on"})
FALSE: Final = frozenset({"0", "false", "no", "off"})


@functools.cache
def _constrained(name: str) -> Any:
    """A policy document's type with msgspec's constraints; built when a policy document's
    schema is, so that parsing flags does not import msgspec."""
    import msgspec

    return {"millis": Annotated[int, msgspec.Meta(ge=0, le=MAX_MILLIS)],
            "bytes": Annotated[int, msgspec.Meta(ge=0, le=MAX_BYTES)],
            "share": Annotated[float, msgspec.Meta(ge=0.0, le=1.0)],
            "codec": Annotated[str, msgspec.Meta(max_length=16)]}[name]


def _raise(message: str) -> NoReturn:
    raise InvalidInputError(message)


def shown(text: object) -> str:
    """A value as a message quotes it: thousands of characters are cut short."""
    s = str(text)
    return s if len(s) <= 40 else s[:37] + "..."


@dataclass(frozen=True, slots=True)
class Kind:
    """A kind of value.  Subclasses say how text becomes a value and back."""

    #: what the value looks like in ``--help``
    metavar: ClassVar[str] = "VALUE"
    #: a flag that takes no value (``--dry-run``); its variable takes 1/true/yes/on or 0/false/no/off
    switch: ClassVar[bool] = False

    @property
    def doc_type(self) -> Any:
        """The type a policy document stores the value as (None: a policy cannot hold it)."""
        return None

    def parse(self, text: str) -> Any:
        """The value ``text`` stands for; raises :class:`InvalidInputError` saying why not."""
        return text

    def placeholder(self) -> str:
        """What the value looks like in ``--help``."""
        return self.metavar

    def check(self, value: Any) -> Any:
        """``value``, given typed, if it is one of this kind's; raises otherwise."""
        return value

    def show(self, value: Any) -> str:
        """``value`` as people type it."""
        return str(value)

    def to_json(self, value: Any) -> Any:
        """``value`` as JSON shows it (``--print-config``)."""
        return value

    def to_doc(self, value: Any) -> Any:
        """``value`` as a policy document stores it."""
        return value

    def from_doc(self, value: Any) -> Any:
        """A policy document's value as a run takes it."""
        return value


@dataclass(frozen=True, slots=True)
class Duration(Kind):
    """Milliseconds, typed as ``30s``, ``1h30m``, ``PT1H`` or seconds."""

    least: int = 0
    why: str = ""
    metavar: ClassVar[str] = "DURATION"

    @property
    def doc_type(self) -> Any:
        return _constrained("millis")

    def parse(self, text: str) -> int:
        return self._checked(parse_duration(text), text)

    def check(self, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidInputError(f"{shown(value)!r} is not a whole number of milliseconds")
        if not 0 <= value <= MAX_MILLIS:
            raise InvalidInputError(f"{value} ms is out of range (0 to about 146 million years)")
        return self._checked(value, format_duration(value))

    def _checked(self, value: int, given: object) -> int:
        if value < self.least:
            least = format_duration(self.least)
            raise InvalidInputError(f"{shown(given)!r} is below {least}" + (f" ({self.why})" if self.why else ""))
        return value

    def show(self, value: Any) -> str:
        return format_duration(value)


#: The last millisecond of the year 9999 (Python's last time).
_LAST_MS: Final = 253_402_300_799_999


@dataclass(frozen=True, slots=True)
class Instant(Kind):
    """A moment, in milliseconds since 1970: typed as ISO 8601 (UTC unless it names a zone)
    or as the milliseconds themselves."""

    metavar: ClassVar[str] = "TIME"

    def parse(self, text: str) -> int:
        import datetime

        t = text.strip()
        if t.isdigit() and t.isascii():  # (a number of thousands of digits is not read)
            return self.check(int(t) if len(t) <= 15 else t)
        try:
            when = datetime.datetime.fromisoformat(t)
        except ValueError:
            raise InvalidInputError(f"{shown(t)!r} is not a time: ISO 8601 (e.g. 2024-05-01T12:00:00Z; UTC without "
                                    "a zone) or milliseconds since 1970") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        return int(when.timestamp() * 1000)

    def check(self, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _LAST_MS:
            raise InvalidInputError(f"{shown(value)!r} is not a time in milliseconds since 1970 (up to the year 9999)")
        return value

    def show(self, value: Any) -> str:
        import datetime

        start = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
        return (start + datetime.timedelta(milliseconds=value)).isoformat(timespec="milliseconds")


@dataclass(frozen=True, slots=True)
class Size(Kind):
    """Bytes, typed as ``64MiB``, ``1GB`` or bytes, from ``least`` up (``why``: what
    the least is for, in messages)."""

    least: int = 0
    most: int = MAX_BYTES
    why: str = ""
    metavar: ClassVar[str] = "SIZE"

    @property
    def doc_type(self) -> Any:
        return _constrained("bytes")

    def parse(self, text: str) -> int:
        return self._checked(parse_size(text), text)

    def check(self, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidInputError(f"{shown(value)!r} is not a whole number of bytes")
        if not 0 <= value <= MAX_BYTES:
            raise InvalidInputError(f"{value} bytes is out of range (0 to 4EiB)")
        return self._checked(value, value)

    def _checked(self, value: int, given: object) -> int:
        if self.least <= value <= self.most:
            return value
        why = f" ({self.why})" if self.why else ""
        if value > self.most:
            return _raise(f"{shown(given)!r} is above {format_size(self.most)}{why}")
        return _raise(f"{shown(given)!r} must be at least {format_size(self.least)}{why}")

    def show(self, value: Any) -> str:
        return format_size(value)


@dataclass(frozen=True, slots=True)
class Rate(Kind):
    """Bytes per second: 0 (no limit) or, as typed, at least ``floor``, below which one
    8 MiB ranged read alone would take minutes and a run of any size days."""

    floor: int = 64 << 10
    metavar: ClassVar[str] = "SIZE"

    def parse(self, text: str) -> int:
        return self._checked(parse_size(text), text)

    def check(self, value: Any) -> int:
        # typed in code (a rate split between workers, a test's), only a size: the floor
        # keeps a person from a run that would take days
        return Size().check(value)

    def _checked(self, value: int, given: object) -> int:
        if 0 < value < self.floor:
            raise InvalidInputError(f"{shown(given)!r} is below the lowest rate, {format_size(self.floor)} per second "
                                    "(0: no limit)")
        return value

    def show(self, value: Any) -> str:
        return format_size(value)


@dataclass(frozen=True, slots=True)
class Ratio(Kind):
    """A share from 0 to 1."""

    metavar: ClassVar[str] = "R"

    @property
    def doc_type(self) -> Any:
        return _constrained("share")

    def parse(self, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise InvalidInputError(f"{shown(text)!r} is not a number") from None
        return self._checked(value, text)

    def check(self, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidInputError(f"{shown(value)!r} is not a number")
        return self._checked(float(value), value)

    @staticmethod
    def _checked(value: float, given: object) -> float:
        if math.isnan(value) or not 0.0 <= value <= 1.0:
            raise InvalidInputError(f"{shown(given)!r} must be between 0 and 1")
        return value


@dataclass(frozen=True, slots=True)
class Whole(Kind):
    """A whole number from ``least`` to ``most``."""

    least: int = 1
    most: int = sys.maxsize
    metavar: ClassVar[str] = "N"

    @property  # (a number in this instance's range, in a policy document)
    def doc_type(self) -> Any:
        import msgspec

        return Annotated[int, msgspec.Meta(ge=self.least, le=self.most)]

    def parse(self, text: str) -> int:
        try:
            value = int(text)
        except ValueError:  # not a number, or one of thousands of digits
            raise InvalidInputError(f"{shown(text)!r} is not a whole number from {self.least} to {self.most}") from None
        return self._checked(value, text)

    def check(self, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidInputError(f"{shown(value)!r} is not a whole number")
        return self._checked(value, value)

    def _checked(self, value: int, given: object) -> int:
        if not self.least <= value <= self.most:
            bounds = (f"from {self.least} to {self.most}" if self.most == sys.maxsize
                      else f"between {self.least} and {self.most}")
            raise InvalidInputError(f"{shown(given)!r} must be {bounds}")
        return value


@dataclass(frozen=True, slots=True)
class Seconds(Kind):
    """A number of seconds, more than 0 (a timeout)."""

    metavar: ClassVar[str] = "SECONDS"

    def parse(self, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise InvalidInputError(f"{shown(text)!r} is not a number of seconds") from None
        return self.check(value)

    def check(self, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
            raise InvalidInputError(f"{shown(value)!r} is not a number of seconds more than 0")
        return float(value)


@dataclass(frozen=True, slots=True)
class Switch(Kind):
    """On or off: a flag without a value; typed as 1/true/yes/on or 0/false/no/off."""

    switch: ClassVar[bool] = True
    metavar: ClassVar[str] = "true|false"

    @property
    def doc_type(self) -> Any:
        return bool

    def parse(self, text: str) -> bool:
        word = text.strip().lower()
        if word not in TRUE | FALSE:
            raise InvalidInputError(f"{shown(text)!r} is not a switch (1/true/yes/on or 0/false/no/off)")
        return word in TRUE

    def check(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise InvalidInputError(f"{shown(value)!r} is not true or false")
        return value

    def show(self, value: Any) -> str:
        return "true" if value else "false"


@dataclass(frozen=True, slots=True)
class Choice(Kind):
    """One of a few words."""

    values: tuple[str, ...] = ()

    @property  # (one of this instance's words, in a policy document)
    def doc_type(self) -> Any:
        return Literal[self.values]

    def parse(self, text: str) -> str:
        return self.check(text.strip())

    def placeholder(self) -> str:
        return "{" + ",".join(self.values) + "}"

    def check(self, value: Any) -> str:
        if value not in self.values:
            raise InvalidInputError(f"{shown(value)!r} is not one of {', '.join(self.values)}")
        return str(value)


@dataclass(frozen=True, slots=True)
class Codec(Kind):
    """How entries are compressed: ``none``, ``lz4``, ``zstd``, ``zstd:LEVEL``, ``zstd-dict[:LEVEL]``."""

    metavar: ClassVar[str] = "CODEC"

    @property
    def doc_type(self) -> Any:
        return _constrained("codec")

    def parse(self, text: str) -> Compression:
        return parse_compression(text)

    def check(self, value: Any) -> Compression:
        return value if isinstance(value, Compression) else parse_compression(str(value))

    def to_json(self, value: Any) -> Any:
        return None if value is None else str(value)

    def to_doc(self, value: Any) -> str:
        return str(self.check(value))

    def from_doc(self, value: Any) -> Compression:
        return parse_compression(value)


@dataclass(frozen=True, slots=True)
class Text(Kind):
    """Any text (a name, a column, a path)."""

    @property
    def doc_type(self) -> Any:
        return str

    def parse(self, text: str) -> str:
        return text


_SCHEME: Final = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")


@dataclass(frozen=True, slots=True)
class Uri(Kind):
    """A local path or a URI (``file:///data/t``, ``s3://bucket/prefix``); a scheme must
    be followed by ``//`` and a bucket or host (``file:/path`` aside)."""

    metavar: ClassVar[str] = "URI"

    @property
    def doc_type(self) -> Any:
        return str

    def parse(self, text: str) -> str:
        if not text.strip():
            raise InvalidURIError("empty URI")
        found = _SCHEME.match(text)
        if found and found.group(1).lower() != "file" and not text[found.end():].startswith("//"):
            scheme = found.group(1)
            raise InvalidURIError(f"URI {shown(mask_secrets(text))!r} names no bucket or host: "
                                  f"use {scheme}://BUCKET/PREFIX")
        return text

    def check(self, value: Any) -> str:
        return self.parse(str(value))


@dataclass(frozen=True, slots=True)
class Url(Kind):
    """An http:// or https:// URL, checked now: one that cannot be parsed is a usage
    error, not a failure after the work is done (its password is never shown)."""

    metavar: ClassVar[str] = "URL"

    def parse(self, text: str) -> str:
        try:
            u = urllib.parse.urlsplit(text.strip())
            u.port  # noqa: B018  (raises for a port out of range)
        except ValueError as e:
            raise InvalidInputError(f"{mask_secrets(text)!r} is not a URL: {e}") from None
        if u.scheme not in ("http", "https") or not u.hostname:
            raise InvalidInputError(f"{mask_secrets(text)!r} is not an http:// or https:// URL")
        return text.strip()


@dataclass(frozen=True, slots=True)
class Pairs(Kind):
    """``KEY=VALUE`` whose key starts with ``prefix`` (a Spark setting)."""

    prefix: str = "spark."
    what: str = "a Spark setting"
    metavar: ClassVar[str] = "KEY=VALUE"

    def parse(self, text: str) -> tuple[str, str]:
        key, sep, value = text.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InvalidInputError(f"{shown(text)!r} is not KEY=VALUE")
        if not key.startswith(self.prefix):
            raise InvalidInputError(f"{shown(key)!r} is not {self.what} (they start with {self.prefix!r})")
        return key, value

    def show(self, value: Any) -> str:
        key, val = value
        return f"{key}={val}"

    def to_json(self, value: Any) -> Any:
        return mask_secrets(self.show(value))
