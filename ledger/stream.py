"""An entry's payload read front to back as it is decompressed, never held whole.

:func:`~shale.ledger.codecs.decompress` makes a whole payload (up to
:data:`~shale.ledger.codecs.MAX_RAW_ENTRY_BYTES`).  A reader that needs a few of an entry's
records at a time reads them from a :class:`PayloadStream` instead: a zstd frame is
decompressed as it is read, so only what is asked for is held.  The checks are
``decompress``'s — the frame declares the size the footer records, its dictionary is the
topic's — and, once read to the end (:meth:`PayloadStream.finish`), it decompressed to
exactly that size, its checksum (when it carries one) held, and nothing follows the frame.
An lz4 block cannot be read in pieces: it is decompressed whole, and read from memory.
"""

from __future__ import annotations

from typing import Any, Final

from shale.ledger.codecs import Codec, DictionarySource, checked_zstd_frame, decompress
from shale.ledger.errors import CorruptLedgerError

__all__ = ["PayloadStream", "stream_for"]

#: Stored bytes the decompressor reads at a time.
_READ_BYTES: Final = 1 << 20
#: Decompressed bytes thrown away at a time when skipping.
_SKIP_BYTES: Final = 1 << 20
_BLOCK_RLE: Final = 1
_BLOCK_RESERVED: Final = 3


class PayloadStream:
    """The payload of one entry (``stored``, its codec and the size its footer records),
    read in order: :meth:`read`, :meth:`skip`, then :meth:`finish`.  Errors are
    :class:`~shale.ledger.errors.CorruptLedgerError`\\ s naming ``where``."""

    def __init__(self, stored: bytes | bytearray | memoryview, codec: int, raw_length: int, where: str, *,
                 path: str = "", position: int | None = None, dictionaries: DictionarySource | None = None) -> None:
        self.raw_length, self.where, self.path, self.position = raw_length, where, path, position
        self._at = 0
        self._reader: Any = None
        self._view: memoryview | None = None
        if codec in (Codec.ZSTD, Codec.ZSTD_DICT):
            self._reader = self._zstd(stored, codec == Codec.ZSTD_DICT, dictionaries)
        else:
            self._view = memoryview(decompress(stored, codec, raw_length, where, position=position, path=path,
                                               dictionaries=dictionaries)).cast("B")

    def _bad(self, why: str) -> CorruptLedgerError:
        return CorruptLedgerError(f"{self.where}: compressed entry {why}", path=self.path, position=self.position)

    def _zstd(self, stored: bytes | bytearray | memoryview, with_dictionary: bool,
              dictionaries: DictionarySource | None) -> Any:
        import zstandard

        # the checks decompress() makes before decompressing, exactly
        dictionary = checked_zstd_frame(stored, self.raw_length, self._bad, dictionaries, with_dictionary)
        params = zstandard.get_frame_parameters(stored)
        header = zstandard.frame_header_size(stored)
        view = memoryview(stored).cast("B")
        end = _frame_end(view, header, params.has_checksum)
        if end != len(view):
            raise self._bad("is not one whole zstd frame" if end < 0 else
                            f"has {len(view) - end} bytes after its zstd frame")
        data = zstandard.ZstdCompressionDict(dictionary.data) if dictionary is not None else None
        return zstandard.ZstdDecompressor(dict_data=data).stream_reader(stored, read_size=_READ_BYTES,
                                                                       read_across_frames=False)

    @property
    def at(self) -> int:
        """How many bytes of the payload were read or skipped."""
        return self._at

    def readinto(self, out: memoryview) -> None:
        """Fill ``out`` with the next bytes of the payload."""
        n = out.nbytes
        if self._at + n > self.raw_length:
            raise self._bad(f"holds {self.raw_length} bytes, {self._at + n} were asked for")
        if self._view is not None:
            out[:] = self._view[self._at:self._at + n]
        else:
            self._fill(out)
        self._at += n

    def take(self, n: int) -> bytearray:
        """The next ``n`` bytes of the payload."""
        out = bytearray(n)
        self.readinto(memoryview(out))
        return out

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` next bytes (all the rest when negative; none at the end): the stream
        as a file, for msgpack's unpacker."""
        n = self.raw_length - self._at if n < 0 else min(n, self.raw_length - self._at)
        return bytes(self.take(n))

    def skip(self, n: int) -> None:
        """Pass over the next ``n`` bytes of the payload (decompressing them, unseen)."""
        if self._view is not None:
            if self._at + n > self.raw_length:
                raise self._bad(f"holds {self.raw_length} bytes, {self._at + n} were asked for")
            self._at += n
            return
        scratch = memoryview(bytearray(min(n, _SKIP_BYTES)))
        while n:
            k = min(n, scratch.nbytes)
            self.readinto(scratch[:k])
            n -= k

    def finish(self) -> None:
        """Read the rest: the frame must decompress to the size its footer records, no
        more, its checksum (if any) holding."""
        self.skip(self.raw_length - self._at)
        if self._reader is not None:
            import zstandard

            try:
                extra = self._reader.read(1)
            except zstandard.ZstdError as e:
                raise self._bad(f"does not decompress with zstd: {e}") from e
            if extra:
                raise self._bad(f"decompresses to more than the {self.raw_length} bytes the footer says")
            self._reader.close()

    def _fill(self, out: memoryview) -> None:
        import zstandard

        got = 0
        try:
            while got < out.nbytes:
                n = self._reader.readinto(out[got:])
                if not n:
                    raise self._bad(f"decompresses to {self._at + got} bytes, the footer says {self.raw_length}")
                got += n
        except zstandard.ZstdError as e:
            raise self._bad(f"does not decompress with zstd: {e}") from e


def _frame_end(data: memoryview, header: int, checksum: bool) -> int:
    """Where the zstd frame that starts ``data`` (its header ``header`` bytes long) ends,
    walking its block headers (RFC 8878, 3.1.1.2); -1 if it does not end inside ``data``."""
    at = header
    while True:
        if at + 3 > len(data):
            return -1
        word = data[at] | data[at + 1] << 8 | data[at + 2] << 16
        last, kind, size = word & 1, (word >> 1) & 3, word >> 3
        if kind == _BLOCK_RESERVED:
            return -1
        at += 3 + (1 if kind == _BLOCK_RLE else size)
        if last:
            break
    at += 4 if checksum else 0
    return at if at <= len(data) else -1


def stream_for(codec: int, raw_length: int, limit: int) -> bool:
    """Whether an entry is better read as a stream than decompressed whole: compressed
    (with zstd: an lz4 block is decompressed whole anyway) and bigger than ``limit``."""
    return codec in (Codec.ZSTD, Codec.ZSTD_DICT) and raw_length > limit

