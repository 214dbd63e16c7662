"""Input that comes slowly: ``shale produce`` reading a pipe.

The input is read in pieces cut at line ends, a smaller piece whenever no more input is
there yet, so that lines are appended as they come.  With a linger
(:mod:`shale.producer.linger`) a wait for more input lasts at most until what was
appended must be sealed: the reader is then told so (an empty piece) and seals before it
waits again, so a record never waits for the next one to be sealed.

Only ``read1`` is used on a buffered stream: it returns what its buffer holds, or reads
once from the file without filling the buffer past what it returns, so the buffer is
empty whenever the file descriptor is asked whether more can be read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import IO, Final

__all__ = ["CHUNK_BYTES", "chunks", "fileno", "lines", "pieces", "ready"]

#: Bytes of input scanned at a time (a chunk, its columns and the one ahead bound the memory).
CHUNK_BYTES: Final = 4 << 20

#: seconds until what was appended must be sealed (0: now; None: nothing must be)
Due = Callable[[], float | None]


def chunks(stream: IO[bytes], fd: int | None, size: int, due: Due | None = None) -> Iterator[bytes]:
    """``stream`` in pieces of about ``size`` bytes that end at a line end (the last one
    may not); a smaller piece when no more input is there yet (a pipe written slowly), so
    that lines are appended as they come.  With ``due``, an empty piece whenever a wait
    for input reaches the time ``due`` gives: the caller seals what it has then."""
    read = getattr(stream, "read1", stream.read)
    pieces: list[bytes] = []
    have = 0
    while True:
        if due is not None:
            while (wait := due()) is not None and not ready(fd, wait):
                yield b""
        got = read(max(size - have, 1 << 16))
        if got:
            pieces.append(got)
            have += len(got)
            if have < size and ready(fd):
                continue
        if not pieces:
            return
        data = b"".join(pieces)
        if not got:  # the end: the last line may lack its line end
            yield data
            return
        cut = data.rfind(b"\n") + 1
        if cut == 0:  # no line end yet: a line longer than what came so far
            pieces = [data]
            continue
        yield data[:cut] if cut < len(data) else data
        pieces = [data[cut:]] if cut < len(data) else []
        have = len(data) - cut


def pieces(stream: IO[bytes], fd: int | None, size: int, due: Due | None = None, buffers: int = 3
           ) -> Iterator[memoryview]:
    """:func:`chunks`, cut at the same places, read into ``buffers`` buffers used in turn
    rather than into new bytes for each piece (a copy and the new memory's page faults per
    piece were most of what reading cost): a piece stays as it is until ``buffers - 1``
    more were taken, and is overwritten after that."""
    import io

    # (a buffered stream reads into a buffer through read1; other raw streams may not read into one)
    readinto = stream.readinto1 if isinstance(stream, io.BufferedIOBase) else \
        stream.readinto if isinstance(stream, io.FileIO) else None
    if readinto is None:
        yield from (memoryview(c) for c in chunks(stream, fd, size, due))
        return
    ring: list[bytearray] = []
    k, have = 0, 0
    view = _buffer(ring, k, size + (1 << 16))
    while True:
        if due is not None:
            while (wait := due()) is not None and not ready(fd, wait):
                yield memoryview(b"")
        want = max(size - have, 1 << 16)
        if have + want > len(view):  # a line longer than a piece: a bigger buffer
            view = _buffer(ring, k, have + want, view[:have])
        got = readinto(view[have:have + want])
        if got:
            have += got
            if have < size and ready(fd):
                continue
        if not have:
            return
        if not got:  # the end: the last line may lack its line end
            yield view[:have]
            return
        cut = ring[k].rfind(b"\n", 0, have) + 1
        if cut == 0:  # no line end yet: a line longer than what came so far
            continue
        yield view[:cut]
        k, have = (k + 1) % buffers, have - cut
        view = _buffer(ring, k, max(size + (1 << 16), have + (1 << 16)), view[cut:cut + have])


def _buffer(ring: list[bytearray], k: int, size: int, start: memoryview | None = None) -> memoryview:
    """Buffer ``k`` of ``ring``, of ``size`` bytes at least, beginning with ``start``."""
    if k == len(ring):
        ring.append(bytearray(size))
    elif len(ring[k]) < size:
        ring[k] = bytearray(size)  # (one that a piece still views is left to it)
    view = memoryview(ring[k])
    if start is not None:
        view[:len(start)] = start
    return view


def lines(stream: IO[bytes], size: int, due: Due | None = None) -> Iterator[bytes]:
    """The lines of ``stream`` (each with its line end, the last one perhaps without), as
    they come, and an empty one whenever what was appended must be sealed (``due``)."""
    for data in chunks(stream, fileno(stream), size, due):
        if not data:
            yield b""
            continue
        *whole, last = data.split(b"\n")
        for line in whole:
            yield line + b"\n"
        if last:
            yield last


def fileno(stream: IO[bytes]) -> int | None:
    try:
        return stream.fileno()
    except (OSError, AttributeError, ValueError):  # (io.UnsupportedOperation is an OSError)
        return None


def ready(fd: int | None, timeout: float = 0.0) -> bool:
    """Whether more input can be read at once, or within ``timeout`` seconds (always,
    from anything but a pipe or socket)."""
    if fd is None:
        return True
    import select

    try:
        return bool(select.select([fd], [], [], timeout)[0])
    except (OSError, ValueError):
        return True
