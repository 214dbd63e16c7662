"""The rows a :class:`~shale.reader.TableView` is built with, held as Arrow data.

The table of the view (:func:`~shale.reader.latest.plan_table`: the latest record of every
live key, found from the footers) is read in Arrow batches
(:func:`~shale.reader.latest.latest_batches`) and kept as they are: keys and values stay in
the batches' buffers, no Python object per row.  A key is found through a sorted index of
the high half of each row's 128-bit key hash, each entry packed with its row number, and
then compared byte for byte with the row's key; 8 bytes a row, beside a byte for whether
the row still holds its key's value (a refresh may replace or delete it) and, when the
view's order needs them, its time.  Under event-time order the keys whose latest record
is a tombstone are held too, by their hashes and times (a late record older than the
tombstone changes nothing).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from shale.ledger.ordering import TopicOrder
from shale.ledger.record import Message, key_hash
from shale.reader.batches import batch_messages

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["TableRows"]

_CHUNK: Final = 1 << 16


class _Columns:
    """One batch's key and value buffers, as NumPy offsets and memoryviews."""

    __slots__ = ("key_data", "key_offsets", "value_data", "value_offsets", "value_valid")

    def __init__(self, batch: pa.RecordBatch) -> None:
        _, key_offsets, key_data = batch.column("key").buffers()
        value_valid, value_offsets, value_data = batch.column("value").buffers()
        self.key_offsets = np.frombuffer(key_offsets, dtype=np.int64)
        self.key_data = memoryview(key_data) if key_data is not None else memoryview(b"")
        self.value_offsets = np.frombuffer(value_offsets, dtype=np.int64)
        self.value_data = memoryview(value_data) if value_data is not None else memoryview(b"")
        self.value_valid = None if value_valid is None else np.frombuffer(value_valid, dtype=np.uint8)


class TableRows:
    """The rows of ``batches`` (the columns of :mod:`shale.reader.arrow`, each row the
    latest record of its key), with ``hi`` (each row's key hash, high half), ``times``
    (each row's time, when the order needs them) and ``tombstones`` (hashes and times of
    the keys whose latest record is a tombstone, under event-time order)."""

    def __init__(self, batches: list[pa.RecordBatch], hi: npt.NDArray[np.uint64],
                 times: npt.NDArray[np.int64] | None,
                 tombstones: tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], npt.NDArray[np.int64]]) -> None:
        self.batches = [b for b in batches if b.num_rows]
        self._starts = [0]
        for b in self.batches:
            self._starts.append(self._starts[-1] + b.num_rows)
        n = self._starts[-1]
        if len(hi) != n or (times is not None and len(times) != n):
            raise ValueError(f"{n} rows, {len(hi)} hashes, {None if times is None else len(times)} times")
        self._columns = [_Columns(b) for b in self.batches]
        self.times = times
        #: whether each row still holds its key's value
        self.alive = np.ones(n, dtype=np.bool_)
        #: rows alive
        self.live = n
        self._bits = max(1, (n - 1).bit_length())
        self._low = np.uint64((1 << self._bits) - 1)
        self._index = np.bitwise_and(hi, ~self._low)
        for a in range(0, n, _CHUNK):  # (the row numbers a slice at a time: no copy of the whole)
            self._index[a:a + _CHUNK] |= np.arange(a, min(n, a + _CHUNK), dtype=np.uint64)
        self._index.sort()
        t_hi, t_lo, t_times = tombstones
        order = np.lexsort((t_lo, t_hi))
        self._t_hi, self._t_lo, self._t_times = t_hi[order], t_lo[order], np.asarray(t_times, dtype=np.int64)[order]
        self._t_alive = np.ones(len(order), dtype=np.bool_)

    def __len__(self) -> int:
        return len(self.alive)

    @property
    def nbytes(self) -> int:
        """The bytes the rows and their index hold."""
        held = sum(int(b.nbytes) for b in self.batches) + self._index.nbytes + self.alive.nbytes
        return held + (0 if self.times is None else self.times.nbytes) + 25 * len(self._t_hi)

    # ------------------------------------------------------------------ rows

    def _where(self, row: int) -> tuple[int, int]:
        b = bisect.bisect_right(self._starts, row) - 1
        return b, row - self._starts[b]

    def key(self, row: int) -> bytes:
        b, i = self._where(row)
        c = self._columns[b]
        return bytes(c.key_data[int(c.key_offsets[i]):int(c.key_offsets[i + 1])])

    def value(self, row: int) -> bytes | None:
        b, i = self._where(row)
        c = self._columns[b]
        if c.value_valid is not None and not (int(c.value_valid[i >> 3]) >> (i & 7)) & 1:
            return None
        return bytes(c.value_data[int(c.value_offsets[i]):int(c.value_offsets[i + 1])])

    def message(self, row: int) -> Message:
        b, i = self._where(row)
        return batch_messages(self.batches[b].slice(i, 1))[0]

    def find(self, key: bytes) -> int:
        """The live row of ``key``, or -1."""
        prefix = np.uint64(key_hash(key)[0]) & ~self._low
        index, low = self._index, self._low
        at = int(np.searchsorted(index, prefix))
        while at < len(index) and bool((index[at] & ~low) == prefix):
            row = int(index[at] & low)
            if self.alive[row] and self.key(row) == key:
                return row
            at += 1
        return -1

    def kill(self, row: int) -> None:
        """The row no longer holds its key's value (replaced, deleted or expired)."""
        if self.alive[row]:
            self.alive[row] = False
            self.live -= 1

    def rows(self) -> Iterator[int]:
        """The live rows, in id order."""
        return iter(np.flatnonzero(self.alive).tolist())

    def keys(self) -> Iterator[bytes]:
        for b, c in enumerate(self._columns):
            start = self._starts[b]
            alive = self.alive[start:self._starts[b + 1]]
            offsets, data = c.key_offsets, c.key_data
            for i in np.flatnonzero(alive).tolist():
                yield bytes(data[int(offsets[i]):int(offsets[i + 1])])

    def messages(self) -> Iterator[Message]:
        """The live rows' messages, in id order."""
        for b, batch in enumerate(self.batches):
            alive = self.alive[self._starts[b]:self._starts[b + 1]]
            if alive.any():
                got = batch_messages(batch if alive.all() else batch.filter(_mask(alive)))
                yield from got

    # ----------------------------------------------------------- tombstones

    def _tombstone(self, key: bytes) -> int:
        hi, lo = key_hash(key)
        at = int(np.searchsorted(self._t_hi, np.uint64(hi)))
        while at < len(self._t_hi) and int(self._t_hi[at]) == hi:
            if int(self._t_lo[at]) == lo and self._t_alive[at]:
                return at
            at += 1
        return -1

    def tombstone_time(self, key: bytes) -> int | None:
        """The time of the tombstone that is ``key``'s latest record, if one is held."""
        at = self._tombstone(key)
        return None if at < 0 else int(self._t_times[at])

    def forget_tombstone(self, key: bytes) -> None:
        at = self._tombstone(key)
        if at >= 0:
            self._t_alive[at] = False

    def expire(self, order: TopicOrder, now_ms: int) -> list[tuple[int, bytes]]:
        """Drop the live rows whose time is past the key TTL at ``now_ms``, and forget the
        tombstones that are: ``(time, key)`` of each row dropped, in that order."""
        if not order.key_ttl_ms or self.times is None:
            return []
        self._t_alive &= ~order.expired(self._t_times, now_ms)
        gone = np.flatnonzero(self.alive & order.expired(self.times, now_ms))
        self.alive[gone] = False
        self.live -= len(gone)
        return sorted((int(self.times[row]), self.key(row)) for row in gone.tolist())


def _mask(alive: npt.NDArray[np.bool_]) -> Any:
    import pyarrow as pa

    return pa.array(alive)
