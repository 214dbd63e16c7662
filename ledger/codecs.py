"""Entry compression: the codecs an entry may be stored with, and the one place that
compresses and decompresses.

An entry's codec is recorded in its ledger's footer (``e_codec``), with the size of its
payload once decompressed (``e_raw_length``).  The frame's checksum covers the stored
(compressed) bytes, so a scrub checks storage without decompressing; decompression is
bounded by the size the footer records, which is itself bounded, so a crafted entry can
never make a reader allocate more than :data:`MAX_RAW_ENTRY_BYTES`.

* ``lz4`` — an LZ4 block (no frame, no size prefix: the footer has the size).
* ``zstd`` — one Zstandard frame that declares its content size.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from shale.ledger.errors import CorruptLedgerError, InvalidInputError

__all__ = [
    "DEFAULT_COMPRESSION",
    "MAX_RAW_ENTRY_BYTES",
    "NO_COMPRESSION",
    "Codec",
    "Compression",
    "compress",
    "decompress",
    "parse_compression",
]

#: An entry stored compressed never holds more than this once decompressed: the writer
#: stores a bigger one as it is, and a reader refuses a footer that says otherwise.
MAX_RAW_ENTRY_BYTES: Final = 256 << 20

Buffer = bytes | bytearray | memoryview


class Codec(enum.IntEnum):
    """How an entry's payload is stored (the footer's ``e_codec``)."""

    NONE = 0
    LZ4 = 1
    ZSTD = 2

    @property
    def label(self) -> str:
        return self.name.lower()


_LEVELS: Final = {Codec.ZSTD: (1, 22)}


@dataclass(frozen=True, slots=True)
class Compression:
    """A codec and its level: what a writer compresses new entries with."""

    codec: Codec = Codec.NONE
    level: int = 0

    def __post_init__(self) -> None:
        bounds = _LEVELS.get(self.codec)
        if bounds is None and self.level:
            raise InvalidInputError(f"compression {self.codec.label} takes no level")
        if bounds is not None and not bounds[0] <= self.level <= bounds[1]:
            raise InvalidInputError(f"{self.codec.label} level {self.level} must be from {bounds[0]} to {bounds[1]}")

    def __str__(self) -> str:
        return f"{self.codec.label}:{self.level}" if self.codec in _LEVELS else self.codec.label


NO_COMPRESSION: Final = Compression()
#: zstd level 1: within a few per cent of level 3's size at about 1.4 times its speed
#: (bench/codecs.py; see bench/README.md).
DEFAULT_COMPRESSION: Final = Compression(Codec.ZSTD, 1)


def parse_compression(text: str) -> Compression:
    """``none``, ``lz4``, ``zstd`` (level 1) or ``zstd:LEVEL`` (1 to 22)."""
    name, _, level = text.strip().lower().partition(":")
    try:
        codec = Codec[name.upper()] if name else None
    except KeyError:
        codec = None
    if codec is None:
        raise InvalidInputError(f"unknown compression {text!r}; one of none, lz4, zstd, zstd:LEVEL")
    if not level:
        return Compression(codec, _LEVELS[codec][0] if codec in _LEVELS else 0)
    if not level.isdigit():
        raise InvalidInputError(f"compression {text!r}: the level must be a whole number")
    return Compression(codec, int(level))


# Compressors keep their contexts between calls (a fresh zstd context costs more than
# compressing a small entry); they are per thread, as zstandard's are not thread-safe.
class _Contexts:
    def __init__(self) -> None:
        import threading

        self._local = threading.local()

    def zstd_compressor(self, level: int) -> object:
        cache: dict[int, object] | None = getattr(self._local, "zc", None)
        if cache is None:
            cache = self._local.zc = {}
        c = cache.get(level)
        if c is None:
            import zstandard

            c = cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
        return c

    def zstd_decompressor(self) -> object:
        d = getattr(self._local, "zd", None)
        if d is None:
            import zstandard

            d = self._local.zd = zstandard.ZstdDecompressor()
        return d


_CONTEXTS: Final = _Contexts()


def compress(payload: Buffer, compression: Compression) -> tuple[Codec, Buffer]:
    """``payload`` stored with ``compression``: the codec used and the stored bytes.  The
    payload is kept as it is (codec none) when compressing would not make it smaller, or
    when it is bigger than :data:`MAX_RAW_ENTRY_BYTES`."""
    size = memoryview(payload).nbytes
    codec = compression.codec
    if codec is Codec.NONE or size > MAX_RAW_ENTRY_BYTES or size == 0:
        return Codec.NONE, payload
    if codec is Codec.LZ4:
        import lz4.block

        out: bytes = lz4.block.compress(payload, store_size=False)
    else:
        out = _CONTEXTS.zstd_compressor(compression.level).compress(payload)  # type: ignore[attr-defined]
    if len(out) >= size:
        return Codec.NONE, payload
    return codec, out


def decompress(stored: Buffer, codec: int, raw_length: int, where: str | Callable[[], str],
               position: int | None = None, path: str = "") -> Buffer:
    """The payload of an entry stored with ``codec``, which the footer says holds
    ``raw_length`` bytes decompressed (at most :data:`MAX_RAW_ENTRY_BYTES`, checked when
    the footer was read).  Anything else — bytes that do not decompress, a size other
    than the footer's, a zstd frame that does not declare that size — is a
    :class:`CorruptLedgerError` naming ``where`` (the object and entry; a function giving
    it, so that the name is made only for an error)."""
    if codec == Codec.NONE:
        return stored

    def bad(why: str) -> CorruptLedgerError:
        name = where if isinstance(where, str) else where()
        return CorruptLedgerError(f"{name}: compressed entry {why}", path=path, position=position)

    if codec == Codec.LZ4:
        import lz4.block

        try:
            out: bytes = lz4.block.decompress(stored, uncompressed_size=raw_length)
        except (lz4.block.LZ4BlockError, ValueError) as e:
            raise bad(f"does not decompress with lz4 ({raw_length} bytes expected)") from e
    elif codec == Codec.ZSTD:
        import zstandard

        # A zstd frame may declare any content size, and the library allocates what it
        # declares: the declaration must match the footer (bounded) before anything else.
        try:
            declared = zstandard.frame_content_size(stored)
        except zstandard.ZstdError as e:
            raise bad("is not a zstd frame") from e
        if declared != raw_length:
            raise bad(f"declares {declared if declared >= 0 else 'no'} decompressed bytes, the footer "
                      f"{raw_length}")
        try:
            out = _CONTEXTS.zstd_decompressor().decompress(stored, max_output_size=raw_length)  # type: ignore[attr-defined]
        except zstandard.ZstdError as e:
            raise bad(f"does not decompress with zstd: {e}") from e
    else:
        raise bad(f"uses codec {codec}, which this build does not read")
    if len(out) != raw_length:
        raise bad(f"decompresses to {len(out)} bytes, the footer says {raw_length}")
    return out
