"""An entry's payload read front to back as it is decompressed, never held whole.

:func:`~shale.ledger.codecs.decompress` makes a whole payload (up to
:data:`~shale.ledger.codecs.MAX_RAW_ENTRY_BYTES`).  A reader that needs a few of an entry's
records at a time reads them from a :class:`PayloadStream` instead: a zstd frame is
decompressed as it is read, so only what is asked for is held.  The checks are
``decompress``'s — the frame declares the size the footer records, its dictionary is the
topic's — and, once read to the end (:meth:`PayloadStream.finish`), it decompressed to
exactly that size, its checksum (when it carries one) held, and nothing follows the frame.
An lz4 block cannot be read in pieces: it is decompressed whole, and read from memory.

The stored bytes themselves need not be held either: a :class:`StoredPayload` reads an
entry's frame in ranged reads of a bounded size, checks its header against the footer
first and its checksum once read to the end, and hands each piece, as it is read, to
whoever watches (the zstd frame's walk, and compaction copying the frame as it is).  An
entry stored as it is then costs a piece at a time; one compressed with zstd a piece, the
frame's window (:func:`zstd_window`) and what is asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

from shale.ledger.codecs import Codec, DictionarySource, checked_zstd_frame, decompress
from shale.ledger.errors import CorruptLedgerError
from shale.ledger.kernels import crc32c

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["FRAME_HEADER_MAX", "ZSTD_STREAM_BYTES", "PayloadStream", "StoredPayload", "record_groups", "zstd_window"]

#: Stored bytes the decompressor reads at a time.
_READ_BYTES: Final = 1 << 20
#: Decompressed bytes thrown away at a time when skipping.
_SKIP_BYTES: Final = 1 << 20
_BLOCK_RLE: Final = 1
_BLOCK_RESERVED: Final = 3
#: The largest block of a zstd frame (RFC 8878), which a streaming decompressor holds
#: beside the frame's window.
_ZSTD_BLOCK: Final = 128 << 10
#: What streaming a zstd frame holds besides its window: the decompressor's context, the
#: block it decodes and the stored bytes it was handed (:data:`_READ_BYTES`).
ZSTD_STREAM_BYTES: Final = 2 * _ZSTD_BLOCK + _READ_BYTES + (256 << 10)
#: The largest window a frame may ask for (zstd's own limit on 64-bit builds): a frame
#: the format allows is read whatever its window; what that costs is counted from its
#: header (:func:`zstd_window`) by whoever bounds memory.
_MAX_WINDOW: Final = 1 << 31
#: The most bytes of a zstd frame's header (RFC 8878: 4 of magic, 14 at most after it).
FRAME_HEADER_MAX: Final = 18


def zstd_window(prefix: bytes | bytearray | memoryview, raw_length: int) -> int:
    """What streaming the zstd frame that ``prefix`` starts (its first
    :data:`FRAME_HEADER_MAX` bytes at least) holds as its window: the window its header
    declares, never more than its content (``raw_length``) — ``raw_length`` when the header
    cannot be read (the frame is refused when it is read)."""
    import zstandard

    try:
        window = int(zstandard.get_frame_parameters(prefix).window_size)
    except zstandard.ZstdError:
        return raw_length
    return min(raw_length, window + _ZSTD_BLOCK + 64) if window > 0 else raw_length


class StoredPayload:
    """The stored payload of one entry, read front to back in ranged reads of at most
    ``piece`` bytes (``read(start, end)`` reads the object): the frame's header (at
    ``offset``, ``length`` bytes with it) is checked against the footer (``count`` records)
    before anything else, its checksum once the payload is read to the end
    (:meth:`finish`).  Each piece read goes to every ``watchers`` function as it comes,
    the frame's header with the first (``watchers(piece, at)``, ``at`` its place in the
    frame).  Errors are :class:`~shale.ledger.errors.CorruptLedgerError`\\ s naming
    ``where``."""

    def __init__(self, read: Callable[[int, int], bytes | memoryview], offset: int, length: int, count: int,
                 piece: int, where: str, path: str = "") -> None:
        from shale.ledger.format import FRAME_HEADER

        self._get, self.offset, self.length, self.where, self.path = read, offset, length, where, path
        self.piece = max(piece, FRAME_HEADER.size + FRAME_HEADER_MAX)
        self.watchers: list[Callable[[memoryview, int], None]] = []
        self._buf = memoryview(b"")
        self._buf_at = 0  # where _buf starts in the frame
        self._at = FRAME_HEADER.size  # the next byte of the frame to hand out
        self._crc = 0
        self._fetched = 0  # bytes of the frame read so far
        first = self._fetch()
        plen, self._want, n = FRAME_HEADER.unpack_from(first, 0)
        if length < FRAME_HEADER.size or plen != length - FRAME_HEADER.size or n != count:
            raise CorruptLedgerError(f"{where} at byte {offset}: frame header disagrees with the footer",
                                     path=path, position=offset)
        self._crc = crc32c(first[FRAME_HEADER.size:])
        self._started = False

    def _fetch(self) -> memoryview:
        a = self._fetched
        b = min(self.length, a + self.piece)
        got = memoryview(self._get(self.offset + a, self.offset + b)).cast("B")
        if got.nbytes != b - a:
            raise CorruptLedgerError(f"{self.where}: truncated at byte {self.offset + a + got.nbytes}",
                                     path=self.path, position=self.offset + a + got.nbytes)
        if a:
            self._crc = crc32c(got, self._crc)
        self._buf, self._buf_at, self._fetched = got, a, b
        return got

    def _announce(self) -> None:
        """Hand the piece just read to the watchers (the first once they are all there)."""
        for w in self.watchers:
            w(self._buf, self._buf_at)

    @property
    def payload_length(self) -> int:
        from shale.ledger.format import FRAME_HEADER

        return self.length - FRAME_HEADER.size

    @property
    def exhausted(self) -> bool:
        """Whether every stored byte has been read."""
        return self._fetched >= self.length and self._at >= self._buf_at + self._buf.nbytes

    def peek(self, n: int) -> bytes:
        """The first ``n`` bytes of the payload (at most), before any is read."""
        from shale.ledger.format import FRAME_HEADER

        return bytes(self._buf[FRAME_HEADER.size:FRAME_HEADER.size + n])

    def read(self, n: int = -1) -> memoryview:
        """Up to ``n`` next bytes of the payload (the rest of a piece at most; none at
        the end): a file, for zstd's stream reader."""
        if not self._started:
            self._started = True
            self._announce()
        end = self._buf_at + self._buf.nbytes
        if self._at >= end:
            if self._fetched >= self.length:
                return memoryview(b"")
            self._fetch()
            self._announce()
            end = self._buf_at + self._buf.nbytes
        k = end - self._at if n < 0 else min(n, end - self._at)
        out = self._buf[self._at - self._buf_at:self._at - self._buf_at + k]
        self._at += k
        return out

    def readinto(self, out: memoryview) -> None:
        """Fill ``out`` with the next bytes of the payload."""
        got = 0
        while got < out.nbytes:
            piece = self.read(out.nbytes - got)
            if not piece.nbytes:
                raise CorruptLedgerError(f"{self.where}: payload of {self.payload_length} bytes ends early",
                                         path=self.path, position=self.offset)
            out[got:got + piece.nbytes] = piece
            got += piece.nbytes

    def finish(self) -> None:
        """Read the rest of the payload; its checksum must hold."""
        while self.read().nbytes:
            pass
        if self._crc != self._want:
            raise CorruptLedgerError(f"{self.where} at byte {self.offset}: checksum mismatch", path=self.path,
                                     position=self.offset)


class _FrameWalk:
    """Where a zstd frame ends, found from its block headers as its bytes go by (RFC
    8878, 3.1.1.2): :func:`_frame_end` for a frame never held whole."""

    def __init__(self, header: int, checksum: bool, skip: int) -> None:
        self.at = header  # the next block header, in the payload
        self.end = -1  # where the frame ends, once known (-2: a reserved block)
        self._checksum = checksum
        self._skip = skip  # bytes before the payload in what is watched (the frame header)
        self._tail = b""  # the last bytes seen (a block header may straddle two pieces)
        self._tail_at = 0

    def feed(self, piece: memoryview, at: int) -> None:
        start = at - self._skip
        stop = start + piece.nbytes
        while self.end == -1 and self.at + 3 <= stop:
            if self.at >= start:
                head = bytes(piece[self.at - start:self.at - start + 3])
            else:  # (begun in the piece before)
                head = (self._tail[self.at - self._tail_at:] + bytes(piece[:self.at + 3 - start]))[:3]
            word = head[0] | head[1] << 8 | head[2] << 16
            last, kind, size = word & 1, (word >> 1) & 3, word >> 3
            if kind == _BLOCK_RESERVED:
                self.end = -2
                return
            self.at += 3 + (1 if kind == _BLOCK_RLE else size)
            if last:
                self.end = self.at + (4 if self._checksum else 0)
        kept = (self._tail + bytes(piece[-3:]))[-3:] if piece.nbytes < 3 else bytes(piece[-3:])
        self._tail, self._tail_at = kept, stop - len(kept)


class PayloadStream:
    """The payload of one entry (``stored``: its bytes, or a :class:`StoredPayload` reading
    them; its codec and the size its footer records), read in order: :meth:`read`,
    :meth:`skip`, then :meth:`finish`.  Errors are
    :class:`~shale.ledger.errors.CorruptLedgerError`\\ s naming ``where``."""

    def __init__(self, stored: bytes | bytearray | memoryview | StoredPayload, codec: int, raw_length: int,
                 where: str, *, path: str = "", position: int | None = None,
                 dictionaries: DictionarySource | None = None) -> None:
        self.raw_length, self.where, self.path, self.position = raw_length, where, path, position
        self._at = 0
        self._reader: Any = None
        self._view: memoryview | None = None
        self._source: StoredPayload | None = None
        self._walk: _FrameWalk | None = None
        zstd = codec in (Codec.ZSTD, Codec.ZSTD_DICT)
        if isinstance(stored, StoredPayload):
            self._source = stored
            if codec == Codec.NONE:
                if stored.payload_length != raw_length:
                    raise self._bad(f"is stored in {stored.payload_length} bytes, the footer says {raw_length}")
                return
            if zstd:
                self._reader = self._zstd(stored, codec == Codec.ZSTD_DICT, dictionaries)
                return
            whole = bytearray(stored.payload_length)  # (an lz4 block is decompressed whole)
            stored.readinto(memoryview(whole))
            stored.finish()
            self._source = None
            data: bytes | bytearray | memoryview = whole
        else:
            data = stored
        if zstd:
            self._reader = self._zstd(data, codec == Codec.ZSTD_DICT, dictionaries)
        else:
            self._view = memoryview(decompress(data, codec, raw_length, where, position=position, path=path,
                                               dictionaries=dictionaries)).cast("B")

    def _bad(self, why: str) -> CorruptLedgerError:
        return CorruptLedgerError(f"{self.where}: compressed entry {why}", path=self.path, position=self.position)

    def _zstd(self, stored: bytes | bytearray | memoryview | StoredPayload, with_dictionary: bool,
              dictionaries: DictionarySource | None) -> Any:
        import zstandard

        # the checks decompress() makes before decompressing, exactly
        prefix = stored.peek(FRAME_HEADER_MAX) if isinstance(stored, StoredPayload) else stored
        dictionary = checked_zstd_frame(prefix, self.raw_length, self._bad, dictionaries, with_dictionary)
        params = zstandard.get_frame_parameters(prefix)
        header = zstandard.frame_header_size(prefix)
        if isinstance(stored, StoredPayload):
            # (the frame's end is checked as its bytes go by, and once they all have: finish())
            self._walk = _FrameWalk(header, params.has_checksum, stored.length - stored.payload_length)
            stored.watchers.append(self._walk.feed)
        else:
            view = memoryview(stored).cast("B")
            end = _frame_end(view, header, params.has_checksum)
            if end != len(view):
                raise self._bad("is not one whole zstd frame" if end < 0 else
                                f"has {len(view) - end} bytes after its zstd frame")
        data = zstandard.ZstdCompressionDict(dictionary.data) if dictionary is not None else None
        source: Any = stored  # (a StoredPayload reads as a file does)
        return zstandard.ZstdDecompressor(dict_data=data, max_window_size=_MAX_WINDOW).stream_reader(
            source, read_size=_READ_BYTES, read_across_frames=False)

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
        elif self._reader is None and self._source is not None:
            self._source.readinto(out)
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
        if self._at + n > self.raw_length:
            raise self._bad(f"holds {self.raw_length} bytes, {self._at + n} were asked for")
        if self._view is not None:
            self._at += n
            return
        if self._reader is None and self._source is not None:
            while n:  # (read where they lie, not copied)
                k = self._source.read(n).nbytes
                if not k:
                    raise self._bad(f"holds {self.raw_length} bytes, {self._at} were read")
                n -= k
                self._at += k
            return
        scratch = memoryview(bytearray(min(n, _SKIP_BYTES)))
        while n:
            k = min(n, scratch.nbytes)
            self.readinto(scratch[:k])
            n -= k

    def finish(self) -> None:
        """Read the rest: the frame must decompress to the size its footer records, no
        more, its checksum (if any) holding; and, read from a :class:`StoredPayload`, the
        stored bytes must be one whole frame that ends where they do, their checksum
        holding."""
        self.skip(self.raw_length - self._at)
        if self._reader is not None:
            import zstandard

            try:
                extra = self._reader.read(1)
            except zstandard.ZstdError as e:
                raise self._bad(self._frame_verdict() or f"does not decompress with zstd: {e}") from e
            if extra:
                raise self._bad(f"decompresses to more than the {self.raw_length} bytes the footer says")
            self._reader.close()
        if self._source is not None:
            self._source.finish()
            walk, length = self._walk, self._source.payload_length
            if walk is not None and walk.end != length:
                raise self._bad("is not one whole zstd frame" if walk.end < 0 or walk.end > length else
                                f"has {length - walk.end} bytes after its zstd frame")

    def _fill(self, out: memoryview) -> None:
        import zstandard

        got = 0
        try:
            while got < out.nbytes:
                n = self._reader.readinto(out[got:])
                if not n:
                    raise self._bad(self._frame_verdict() or
                                    f"decompresses to {self._at + got} bytes, the footer says {self.raw_length}")
                got += n
        except zstandard.ZstdError as e:
            raise self._bad(self._frame_verdict() or f"does not decompress with zstd: {e}") from e

    def _frame_verdict(self) -> str | None:
        """What is wrong with the stored frame's shape, once what was read of it says so:
        the same words a whole entry's check gives, rather than the decompressor's."""
        walk, source = self._walk, self._source
        if walk is None or source is None:
            return None
        length = source.payload_length
        if walk.end == -2 or walk.end > length or (walk.end == -1 and source.exhausted):
            return "is not one whole zstd frame"
        if walk.end >= 0 and walk.end != length:
            return f"has {length - walk.end} bytes after its zstd frame"
        return None


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


def record_groups(stream: PayloadStream, offsets: Any, sizes: Any, limit: int
                  ) -> Iterator[tuple[int, int, memoryview, npt.NDArray[np.int64]]]:
    """Records of one entry at ``offsets`` (rising: a footer's records tile its payload)
    of ``sizes`` bytes, read from ``stream`` in runs of at most ``limit`` bytes (or one
    record): ``(a, b, view, starts)`` for records ``a`` to ``b - 1``, side by side in
    ``view`` from ``starts``.  The buffer is reused from run to run."""
    import numpy as np

    offsets = np.asarray(offsets, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64)
    buf = memoryview(bytearray(int(max(min(limit, int(sizes.sum())), int(sizes.max())))))
    ends = np.cumsum(sizes)
    # each stretch of adjacent records is read at once, what lies between skipped
    breaks = np.r_[True, offsets[1:] != offsets[:-1] + sizes[:-1]]
    a = 0
    while a < len(sizes):
        before = int(ends[a - 1]) if a else 0
        b = max(a + 1, int(np.searchsorted(ends, before + limit, side="right")))
        firsts = np.flatnonzero(breaks[a:b] | (np.arange(a, b) == a)) + a
        for i, j in zip(firsts.tolist(), [*firsts[1:].tolist(), b], strict=True):
            stream.skip(int(offsets[i]) - stream.at)
            at = (int(ends[i - 1]) if i else 0) - before
            stream.readinto(buf[at:at + int(ends[j - 1]) - (int(ends[i - 1]) if i else 0)])
        yield a, b, buf, np.r_[0, ends[a:b - 1] - before].astype(np.int64)
        a = b
