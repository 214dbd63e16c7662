"""JSON lines of a regular file, read and scanned ahead on a thread of their own.

``shale produce`` starts this before it imports the writer and opens the topic (a fifth
of a run's time goes to starting up), so that the C scanner (``ledger/_jsonl.c``) is
busy on the other core meanwhile, and reading the file is off the main thread for the
rest of the run.  Only a regular file is read this way: it never makes the reader wait
(an interrupt need not stop a wait for input), and its chunks are cut as
:func:`~shale.producer.pipe.pieces` cuts them, so the records, their ids and any error
are those of the file read on the main thread.  At most :data:`AHEAD` chunks wait,
scanned, to be appended.  This module imports neither NumPy nor the writer.
"""

from __future__ import annotations

import importlib
import io
import os
import queue
import stat
import threading
from collections.abc import Iterator
from typing import IO, Any, Final

from shale.ledger.record import EVENT_TIME_MAX_MS, EVENT_TIME_MIN_MS
from shale.producer.pipe import pieces

__all__ = ["AHEAD", "Ahead", "scan_ahead"]

#: Chunks scanned and not appended yet, at most (each a buffer of input and its columns).
AHEAD: Final = 4

#: What the thread hands over: a chunk and what the scanner made of it; the end (None);
#: or what stopped it.
_Item = tuple[memoryview, tuple[Any, ...]] | BaseException | None


class Ahead:
    """The chunks of a regular file (``stream``) with what the scanner made of each, in
    order: iterate over it once; :meth:`close` stops the thread."""

    def __init__(self, stream: IO[bytes], native: Any, chunk_bytes: int) -> None:
        self.stream = stream
        self._start = stream.tell()
        self._queue: queue.Queue[_Item] = queue.Queue(AHEAD)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(native, chunk_bytes), name="shale-scan",
                                         daemon=True)
        self._thread.start()

    def _run(self, native: Any, chunk_bytes: int) -> None:
        try:
            # (the buffers of the chunks waiting, the two being appended and the one read)
            for data in pieces(self.stream, None, chunk_bytes, buffers=AHEAD + 4):
                if not self._put((data, native.scan(data, 1, EVENT_TIME_MIN_MS, EVENT_TIME_MAX_MS))):
                    return
            self._put(None)
        except BaseException as e:  # (raised where the chunks are taken)
            self._put(e)

    def _put(self, item: _Item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[tuple[memoryview, tuple[Any, ...]]]:
        while (item := self._queue.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        """Stop the thread (what it read and did not hand over is dropped)."""
        self._stop.set()
        self._thread.join()

    def rewound(self) -> IO[bytes]:
        """The file, from where this began, to be read otherwise (the thread stopped)."""
        self.close()
        self.stream.seek(self._start)
        return self.stream


def scan_ahead(stream: IO[bytes], chunk_bytes: int) -> IO[bytes] | Ahead:
    """``stream`` read and scanned ahead when it is a regular file and the scanner was
    built (else ``stream`` itself, read as before)."""
    if os.environ.get("SHALE_KERNELS", "").strip().lower() in ("numpy", "python"):
        return stream
    try:
        if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode) or not isinstance(stream, io.BufferedIOBase):
            return stream
        native = importlib.import_module("shale.ledger._jsonl")
    except (OSError, ValueError, ImportError):
        return stream
    return Ahead(stream, native, chunk_bytes)
