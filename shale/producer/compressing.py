"""Entries compressed on the compression threads while the writer's caller goes on.

:meth:`TopicWriter.append_batch <shale.producer.TopicWriter.append_batch>` cuts its
records into entries and hands them here in groups (a task of about
:data:`TASK_BYTES`); the compression threads compress them (compressors let go of the
interpreter lock) while the calling thread goes on with its next batch, which is what
keeps both cores busy when one thread reads, scans and encodes the input.  Entries come
back strictly in the order they were given; at most :data:`MAX_PENDING_BYTES` of raw
entries wait at a time (beyond that, :meth:`Compressing.submit` gives back the oldest
before it takes more), so memory stays bounded however large a batch is.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Final

from shale.ledger.codecs import Buffer, Codec, Compression, compress
from shale.ledger.encoder import EncodedColumns, entry_of
from shale.ledger.writer import EncodedEntry
from shale.runtime.cpus import available_cpus

__all__ = ["MAX_PENDING_BYTES", "TASK_BYTES", "Compressed", "Compressing"]

#: An entry with its codec and stored bytes.
Compressed = tuple[EncodedEntry, tuple[Codec, Buffer]]

#: Raw bytes of entries per task (a task per small entry would cost more in hand-offs
#: than compressing it), at most :data:`_TASK_ENTRIES` entries.
TASK_BYTES: Final = 1 << 20
_TASK_ENTRIES: Final = 64

#: Raw bytes of entries given and not taken back yet, at most (a task's worth more).
MAX_PENDING_BYTES: Final = 8 << 20


def _task(enc: EncodedColumns, bounds: list[tuple[int, int]], compression: Compression) -> list[Compressed]:
    out = []
    for i, j in bounds:
        entry = entry_of(enc, i, j)
        out.append((entry, compress(entry.payload, compression)))
    return out


class Compressing:
    """The entries given to :meth:`submit` and not taken back yet, being compressed."""

    def __init__(self, threads: int | None = None) -> None:
        self._threads = available_cpus() if threads is None else threads
        self._pool: ThreadPoolExecutor | None = None
        self._pending: deque[tuple[Future[list[Compressed]], int, int]] = deque()  # (task, records, bytes)
        #: records given and not taken back yet, and their raw bytes
        self.records = self.bytes = 0

    def submit(self, enc: EncodedColumns, bounds: list[tuple[int, int]], compression: Compression
               ) -> Iterator[Compressed]:
        """Give the entries ``bounds`` of ``enc`` to be compressed; yield, in order, those
        given before that must be taken back to keep what waits bounded (with one thread,
        or no compression, every entry given, compressed here)."""
        if self._threads <= 1 or compression.codec is Codec.NONE:
            yield from self.drain()
            yield from _task(enc, bounds, compression)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="shale-compress")
        for group, size in _groups(enc, bounds):
            while self._pending and self.bytes + size > MAX_PENDING_BYTES:
                yield from self._take()
            self._pending.append((self._pool.submit(_task, enc, group, compression),
                                  group[-1][1] - group[0][0], size))
            self.records += group[-1][1] - group[0][0]
            self.bytes += size

    def drain(self) -> Iterator[Compressed]:
        """Every entry given and not taken back yet, in order."""
        while self._pending:
            yield from self._take()

    def _take(self) -> list[Compressed]:
        future, records, size = self._pending[0]
        try:
            got = future.result()
        except BaseException:
            self.discard()
            raise
        self._pending.popleft()
        self.records -= records
        self.bytes -= size
        return got

    def discard(self) -> None:
        """Forget what waits (after a failure: it is not appended)."""
        for future, _, _ in self._pending:
            future.cancel()
        self._pending.clear()
        self.records = self.bytes = 0

    def close(self) -> None:
        """Stop the compression threads (what waits is forgotten: drain it first)."""
        self.discard()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _groups(enc: EncodedColumns, bounds: list[tuple[int, int]]) -> Iterator[tuple[list[tuple[int, int]], int]]:
    """``bounds`` in consecutive groups of about :data:`TASK_BYTES`, with their raw bytes."""
    group: list[tuple[int, int]] = []
    size = 0
    for i, j in bounds:
        group.append((i, j))
        size += int(enc.ends[j - 1]) - int(enc.offsets[i])
        if size >= TASK_BYTES or len(group) >= _TASK_ENTRIES:
            yield group, size
            group, size = [], 0
    if group:
        yield group, size
