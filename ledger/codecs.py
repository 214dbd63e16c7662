"""Entry compression: the codecs an entry may be stored with, and the one place that
compresses and decompresses.

An entry's codec is recorded in its ledger's footer (``e_codec``), with the size of its
payload once decompressed (``e_raw_length``).  The frame's checksum covers the stored
(compressed) bytes, so a scrub checks storage without decompressing; decompression is
bounded by the size the footer records, which is itself bounded, so a crafted entry can
never make a reader allocate more than :data:`MAX_RAW_ENTRY_BYTES`.

* ``lz4`` — an LZ4 block (no frame, no size prefix: the footer has the size).
* ``zstd`` — one Zstandard frame that declares its content size, and nothing after it;
  frames written by this build also carry zstd's content checksum (older ones, without
  it, are read as they are).
* ``zstd-dict`` — the same, compressed with one of the topic's trained dictionaries,
  whose id the frame names; a reader is given the topic's dictionaries
  (:data:`DictionarySource`).
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterator
from dataclasses import field
from typing import Any, Final

from shale.ledger.errors import CorruptLedgerError, InvalidInputError
from shale.ledger.values import dataclass

__all__ = [
    "DEFAULT_COMPRESSION",
    "MAX_DICTIONARY_BYTES",
    "MAX_RAW_ENTRY_BYTES",
    "NO_COMPRESSION",
    "Codec",
    "Compression",
    "Dictionary",
    "DictionarySource",
    "checked_zstd_frame",
    "compress",
    "compress_pieces",
    "decompress",
    "dictionary_source",
    "parse_compression",
    "zstd_decompressor",
]

#: An entry stored compressed never holds more than this once decompressed: the writer
#: stores a bigger one as it is, and a reader refuses a footer that says otherwise.
MAX_RAW_ENTRY_BYTES: Final = 256 << 20
#: A dictionary bigger than this is refused (zstd's own trainer makes 112 KiB by default).
MAX_DICTIONARY_BYTES: Final = 1 << 20
_ZSTD_DICT_MAGIC: Final = 0xEC30A437

Buffer = bytes | bytearray | memoryview


class Codec(enum.IntEnum):
    """How an entry's payload is stored (the footer's ``e_codec``)."""

    NONE = 0
    LZ4 = 1
    ZSTD = 2
    ZSTD_DICT = 3

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")


_LEVELS: Final = {Codec.ZSTD: (1, 22), Codec.ZSTD_DICT: (1, 22)}


@dataclass(frozen=True, slots=True)
class Dictionary:
    """A trained zstd dictionary: its id (also in its own bytes and in every frame
    compressed with it) and its bytes."""

    id: int
    data: bytes = field(repr=False)

    @classmethod
    def load(cls, data: bytes, where: str, expect_id: int | None = None) -> Dictionary:
        """A dictionary read from storage, checked: zstd's dictionary magic, the id it
        says it has (``expect_id``: the one it is registered under), a bounded size.
        Anything else is a :class:`CorruptLedgerError` naming ``where``."""
        if not 8 <= len(data) <= MAX_DICTIONARY_BYTES:
            raise CorruptLedgerError(f"{where}: a dictionary of {len(data)} bytes (1 MiB at most)", path=where)
        magic, did = int.from_bytes(data[0:4], "little"), int.from_bytes(data[4:8], "little")
        if magic != _ZSTD_DICT_MAGIC:
            raise CorruptLedgerError(f"{where}: not a zstd dictionary (bad magic)", path=where, position=0)
        if expect_id is not None and did != expect_id:
            raise CorruptLedgerError(f"{where}: the dictionary says it is {did}, registered as {expect_id}",
                                     path=where, position=4)
        got = cls(did, bytes(data))
        # zstd's own reading of the tables: a dictionary it cannot use would otherwise
        # fail later, in the middle of compressing or decompressing an entry
        import zstandard

        try:
            probe = b"shale dictionary probe"
            frame = _CONTEXTS.zstd_compressor(1, got).compress(probe)
            if _CONTEXTS.zstd_decompressor(got).decompress(frame, max_output_size=len(probe)) != probe:
                raise zstandard.ZstdError("it does not round-trip")
        except zstandard.ZstdError as e:
            raise CorruptLedgerError(f"{where}: not a usable zstd dictionary ({e})", path=where) from e
        return got


#: The topic's dictionaries by id (raising a :class:`CorruptLedgerError` for one it does not
#: have or that is damaged; another :class:`~shale.ledger.errors.ShaleError` when the store fails).
DictionarySource = Callable[[int], Dictionary]


def dictionary_source(dictionaries: tuple[Dictionary, ...]) -> DictionarySource:
    """A :data:`DictionarySource` of the dictionaries given."""
    by_id = {d.id: d for d in dictionaries}

    def get(dictionary_id: int) -> Dictionary:
        got = by_id.get(dictionary_id)
        if got is None:
            raise CorruptLedgerError(f"no dictionary {dictionary_id} is registered for the topic")
        return got

    return get


@dataclass(frozen=True, slots=True)
class Compression:
    """A codec and its level: what a writer compresses new entries with (and, for
    ``zstd-dict``, the dictionary: None until resolved against the topic)."""

    codec: Codec = Codec.NONE
    level: int = 0
    dictionary: Dictionary | None = None

    def __post_init__(self) -> None:
        bounds = _LEVELS.get(self.codec)
        if bounds is None and self.level:
            raise InvalidInputError(f"compression {self.codec.label} takes no level")
        if bounds is not None and not bounds[0] <= self.level <= bounds[1]:
            raise InvalidInputError(f"{self.codec.label} level {self.level} must be from {bounds[0]} to {bounds[1]}")
        if self.dictionary is not None and self.codec != Codec.ZSTD_DICT:
            raise InvalidInputError(f"compression {self.codec.label} takes no dictionary")

    def __str__(self) -> str:
        return f"{self.codec.label}:{self.level}" if self.codec in _LEVELS else self.codec.label

    @property
    def needs_dictionary(self) -> bool:
        """Whether this is ``zstd-dict`` not yet given the topic's dictionary."""
        return self.codec == Codec.ZSTD_DICT and self.dictionary is None


NO_COMPRESSION: Final = Compression()
#: zstd level 1: within a few per cent of level 3's size at about 1.4 times its speed
#: (bench/codecs.py; see bench/README.md).
DEFAULT_COMPRESSION: Final = Compression(Codec.ZSTD, 1)


def parse_compression(text: str) -> Compression:
    """``none``, ``lz4``, ``zstd`` (level 1), ``zstd:LEVEL`` (1 to 22), ``zstd-dict`` or
    ``zstd-dict:LEVEL`` (zstd with the topic's newest trained dictionary)."""
    name, _, level = text.strip().lower().partition(":")
    codec = next((c for c in Codec if c.label == name), None) if name else None
    if codec is None:
        raise InvalidInputError(f"unknown compression {text!r}; one of none, lz4, zstd, zstd:LEVEL, zstd-dict, "
                                "zstd-dict:LEVEL")
    if not level:
        return Compression(codec, _LEVELS[codec][0] if codec in _LEVELS else 0)
    if not level.isdigit():
        raise InvalidInputError(f"compression {text!r}: the level must be a whole number")
    return Compression(codec, int(level))


class _Contexts:
    """Compression contexts kept between calls (a fresh zstd context costs more than
    compressing a small entry), one set per thread: zstandard's are not thread-safe."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _cache(self) -> dict[tuple[Any, ...], Any]:
        cache: dict[tuple[Any, ...], Any] | None = getattr(self._local, "cache", None)
        if cache is None:
            cache = self._local.cache = {}
        return cache

    def zstd_compressor(self, level: int, dictionary: Dictionary | None = None) -> Any:
        cache = self._cache()
        key = ("c", level, dictionary.id if dictionary else None)
        c = cache.get(key)
        if c is None or (dictionary is not None and cache.get(("cd", dictionary.id)) is not dictionary.data):
            import zstandard

            d = zstandard.ZstdCompressionDict(dictionary.data) if dictionary is not None else None
            # zstd's content checksum (XXH64 of the decompressed bytes, 4 bytes a frame):
            # a frame or a dictionary changed since it was written decompresses to
            # something else, which the checksum catches where nothing else would
            c = cache[key] = zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=True,
                                                      dict_data=d)
            if dictionary is not None:
                cache[("cd", dictionary.id)] = dictionary.data
        return c

    def zstd_decompressor(self, dictionary: Dictionary | None = None) -> Any:
        cache = self._cache()
        key = ("d", dictionary.id if dictionary else None)
        d = cache.get(key)
        if d is None or (dictionary is not None and cache.get(("dd", dictionary.id)) is not dictionary.data):
            import zstandard

            data = zstandard.ZstdCompressionDict(dictionary.data) if dictionary is not None else None
            d = cache[key] = zstandard.ZstdDecompressor(dict_data=data)
            if dictionary is not None:
                cache[("dd", dictionary.id)] = dictionary.data
        return d


_CONTEXTS: Final = _Contexts()


def zstd_decompressor(dictionary: Dictionary | None = None) -> Any:
    """This thread's zstd decompressor, with ``dictionary`` or none (zstandard's
    ``ZstdDecompressor``: it checks a frame's content checksum when the frame has one)."""
    return _CONTEXTS.zstd_decompressor(dictionary)


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
    elif codec is Codec.ZSTD_DICT:
        if compression.dictionary is None:
            raise InvalidInputError("zstd-dict compression needs the topic's dictionary (shale dictionary --train)")
        import zstandard

        try:
            out = _CONTEXTS.zstd_compressor(compression.level, compression.dictionary).compress(payload)
        except zstandard.ZstdError as e:  # (a dictionary is checked when it is read: Dictionary.load)
            raise CorruptLedgerError(f"zstd dictionary {compression.dictionary.id} cannot compress: {e}") from e
    else:
        out = _CONTEXTS.zstd_compressor(compression.level).compress(payload)
    if len(out) >= size:
        return Codec.NONE, payload
    return codec, out


def compress_pieces(payload: memoryview, compression: Compression, cap: int
                    ) -> tuple[Codec, int, int, Callable[[], Iterator[Buffer]]]:
    """:func:`compress` for a payload too big to hold twice: its codec, its stored size and
    the CRC32C of its stored bytes, and a function giving those bytes in pieces, to write
    after a frame header that says all that.  A payload of at most ``cap`` bytes is
    compressed whole; a bigger one, with zstd, as a stream twice (first for the size and
    the checksum, keeping nothing, then for the pieces: zstd gives the same bytes for the
    same input, and the second pass must come to the same size and checksum), so that
    nothing but the compressor's context is held besides it; with lz4, which compresses a
    block whole, it is kept as it is."""
    from shale.ledger.kernels import crc32c

    size = payload.nbytes
    if size <= cap or compression.codec not in (Codec.ZSTD, Codec.ZSTD_DICT):
        codec, stored = compress(payload, compression) if size <= cap else (Codec.NONE, payload)
        return codec, memoryview(stored).nbytes, crc32c(stored), lambda: iter((stored,))
    length = crc = 0
    for piece in _zstd_pieces(payload, compression):
        length += len(piece)
        crc = crc32c(piece, crc)
    if length >= size:
        return Codec.NONE, size, crc32c(payload), lambda: iter((payload,))

    def again() -> Iterator[Buffer]:
        got = check = 0
        for piece in _zstd_pieces(payload, compression):
            got += len(piece)
            check = crc32c(piece, check)
            yield piece
        if (got, check) != (length, crc):
            raise CorruptLedgerError(f"zstd gave {got} bytes compressing {size} bytes again, {length} the first time")

    return compression.codec, length, crc, again


def _zstd_pieces(payload: memoryview, compression: Compression) -> Iterator[bytes]:
    """``payload`` compressed with ``compression`` (zstd) as one frame declaring its size,
    in pieces, a megabyte of input at a time."""
    if compression.dictionary is None and compression.codec is Codec.ZSTD_DICT:
        raise InvalidInputError("zstd-dict compression needs the topic's dictionary (shale dictionary --train)")
    import zstandard

    step = 1 << 20
    try:
        c = _CONTEXTS.zstd_compressor(compression.level, compression.dictionary).compressobj(size=payload.nbytes)
        for at in range(0, payload.nbytes, step):
            got = c.compress(payload[at:at + step])
            if got:
                yield got
        yield c.flush()
    except zstandard.ZstdError as e:
        raise CorruptLedgerError(f"zstd cannot compress: {e}") from e


def decompress(stored: Buffer, codec: int, raw_length: int, where: str | Callable[[], str],
               position: int | None = None, path: str = "", dictionaries: DictionarySource | None = None) -> Buffer:
    """The payload of an entry stored with ``codec``, which the footer says holds
    ``raw_length`` bytes decompressed (at most :data:`MAX_RAW_ENTRY_BYTES`, checked when
    the footer was read).  Anything else — bytes that do not decompress, a size other
    than the footer's, a zstd frame that does not declare that size, a dictionary the
    topic does not have — is a :class:`CorruptLedgerError` naming ``where`` (the object
    and entry; a function giving it, so that the name is made only for an error)."""
    if codec == Codec.NONE:
        return stored

    def bad(why: str) -> CorruptLedgerError:
        name = where if isinstance(where, str) else where()
        return CorruptLedgerError(f"{name}: compressed entry {why}", path=path, position=position)

    if codec == Codec.LZ4:
        import lz4.block

        try:
            # LZ4_decompress_safe fails unless the block ends exactly where its input
            # does; a block that stops short of the footer's size is caught below.
            out: bytes = lz4.block.decompress(stored, uncompressed_size=raw_length)
        except (lz4.block.LZ4BlockError, ValueError) as e:
            raise bad(f"does not decompress with lz4 ({raw_length} bytes expected)") from e
    elif codec in (Codec.ZSTD, Codec.ZSTD_DICT):
        out = _decompress_zstd(stored, raw_length, bad, dictionaries if codec == Codec.ZSTD_DICT else None,
                               codec == Codec.ZSTD_DICT)
    else:
        raise bad(f"uses codec {codec}, which this build does not read")
    if len(out) != raw_length:
        raise bad(f"decompresses to {len(out)} bytes, the footer says {raw_length}")
    return out


def _decompress_zstd(stored: Buffer, raw_length: int, bad: Callable[[str], CorruptLedgerError],
                     dictionaries: DictionarySource | None, with_dictionary: bool) -> bytes:
    import zstandard

    dictionary = checked_zstd_frame(stored, raw_length, bad, dictionaries, with_dictionary)
    try:
        # One frame, exactly: bytes after it are refused (the frame's end is where zstd
        # says, not where the footer says), and so is a frame whose content checksum,
        # when it has one, does not match what it decompresses to.
        out: bytes = _CONTEXTS.zstd_decompressor(dictionary).decompress(stored, max_output_size=raw_length,
                                                                       allow_extra_data=False)
    except zstandard.ZstdError as e:
        raise bad(f"does not decompress with zstd: {e}") from e
    return out


def checked_zstd_frame(stored: Buffer, raw_length: int, bad: Callable[[str], CorruptLedgerError],
                       dictionaries: DictionarySource | None, with_dictionary: bool) -> Dictionary | None:
    """What a zstd frame must be before anything is decompressed (whether whole or as a
    stream): it declares the footer's size, and names a dictionary exactly when it is
    stored as ``zstd-dict`` — one the topic has.  Returns that dictionary; anything else
    is ``bad(why)`` raised."""
    import zstandard

    # A zstd frame may declare any content size, and the library allocates what it
    # declares: the declaration must match the footer (bounded) before anything else.
    try:
        params = zstandard.get_frame_parameters(stored)
    except zstandard.ZstdError as e:
        raise bad("is not a zstd frame") from e
    declared = params.content_size
    if declared != raw_length:
        raise bad(f"declares {declared if 0 <= declared < 1 << 63 else 'no'} decompressed bytes, the footer "
                  f"{raw_length}")
    if not with_dictionary:
        if params.dict_id:
            raise bad(f"is stored as zstd without a dictionary, and its frame names dictionary {params.dict_id}")
        return None
    if not params.dict_id:
        raise bad("is stored as zstd-dict, and its frame names no dictionary")
    if dictionaries is None:
        raise bad(f"is compressed with dictionary {params.dict_id}, and the topic's dictionaries were not given")
    try:
        return dictionaries(params.dict_id)
    except CorruptLedgerError as e:
        # (a store that fails, or refuses access, is not the entry's fault: said as it is)
        raise bad(f"is compressed with dictionary {params.dict_id}: {e}") from e
