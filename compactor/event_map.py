"""The key map of pass one under event-time order: 32 bytes per key.

Besides each key's hash and the run position of its winning record (the 24 bytes of
:mod:`shale.compactor.keymap`), the map keeps that record's event time, so that a
record read later — in a later ledger, or on a later run — can be weighed against it:
the record with the greatest event time wins, a later position breaking ties.

Records arrive in position order, but their event times need not: a later ledger may
hold an older event.  With the C kernels every record goes into one event table
(:func:`shale.ledger.kernels.new_event_key_table`), which keeps each key's greatest
``(event time, position)`` and is read out sorted at the end, as
:class:`~shale.compactor.keymap.KeyMapBuilder` does with its table.  Without them (or
when keys crafted to share their top hash bits crowd that table) sorted runs are merged
in NumPy: chunks wait until they outnumber the map a few times over, are reduced to one
record per key, and merged into the map.  Waiting records count against the capacity
like the map's keys.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from shale.compactor.keymap import EVENT_KEY_BYTES, KeyMap
from shale.compactor.rules import latest_by_event_time, latest_of_each_key
from shale.ledger.kernels import EventKeyTable, new_event_key_table

__all__ = ["EventKeyMapBuilder", "event_map_capacity"]

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
Columns = tuple[U64, U64, I64, I64]

# As in keymap: merge once the waiting records outnumber the map this many times (or
# reach _MIN_MERGE), trading passes over the map against memory in waiting records.
_MERGE_FACTOR: Final = 3
_MIN_MERGE: Final = 1 << 22


def event_map_capacity(max_map_bytes: int) -> int:
    """How many keys an event-time map of at most ``max_map_bytes`` bytes holds."""
    return max(1, max_map_bytes // EVENT_KEY_BYTES)


def _empty() -> Columns:
    return (np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.uint64),
            np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))


class EventKeyMapBuilder:
    """Collects, for each key, the position and event time of its record with the
    greatest ``(event time, position)``, chunk by chunk in position order."""

    def __init__(self, capacity: int, expected: int = 0) -> None:
        """``capacity``: keys at most (see :func:`event_map_capacity`); ``expected``: how
        many keys to make room for from the start (a guess; the table grows past it)."""
        self.capacity = max(1, capacity)
        self._table: EventKeyTable | None = new_event_key_table(min(expected, self.capacity))
        self._map: Columns = _empty()
        self._waiting: list[Columns] = []
        self._pending = 0  # records waiting since the last merge

    @property
    def upper_bound(self) -> int:
        """Distinct keys at most (exact right after a merge, and always with the table)."""
        in_table = len(self._table) if self._table is not None else 0
        return in_table + len(self._map[0]) + self._pending

    def fits(self, hi: U64, lo: U64) -> bool:
        """Whether adding these keys keeps the map within capacity (merging if needed)."""
        if self.upper_bound + len(hi) <= self.capacity:
            return True
        if self._table is not None:
            new = np.frombuffer(self._table.contains(hi, lo), dtype=np.bool_) == 0
            return len(self._table) + len(latest_of_each_key(hi[new], lo[new])) <= self.capacity
        self.merge()
        if self.upper_bound + len(hi) <= self.capacity:
            return True
        all_hi = np.concatenate([self._map[0], hi])
        all_lo = np.concatenate([self._map[1], lo])
        return len(latest_of_each_key(all_hi, all_lo)) <= self.capacity

    def add(self, hi: U64, lo: U64, event: I64, pos: I64 | None = None, *, first: int = 0,
            part_shift: int = 64, part: int = 0) -> None:
        """Add one chunk of records, in position order, every position after those of
        earlier chunks (a key may appear several times); ``event`` is each record's event
        time (what it counts as, for a record without one).  ``pos``, ``first``,
        ``part_shift`` and ``part`` are as for :meth:`KeyMapBuilder.add
        <shale.compactor.keymap.KeyMapBuilder.add>`."""
        event = np.ascontiguousarray(event, dtype=np.int64)
        if self._table is not None:
            taken = self._table.add(hi, lo, pos, first, part_shift, part, event=event)
            if taken == len(hi):
                return
            # crafted keys crowd the table: go on merging sorted runs, from what it holds
            self._map = self._read_table()
            hi, lo, event = hi[taken:], lo[taken:], event[taken:]
            pos, first = (pos[taken:], 0) if pos is not None else (None, first + taken)
        if pos is None:
            pos = np.arange(first, first + len(hi), dtype=np.int64)
        if part_shift < 64:
            mine = (hi >> np.uint64(part_shift)) == part
            hi, lo, pos, event = hi[mine], lo[mine], pos[mine], event[mine]
        self._waiting.append((hi, lo, pos, event))
        self._pending += len(hi)
        if self._pending > max(_MERGE_FACTOR * len(self._map[0]), _MIN_MERGE):
            self.merge()

    def merge(self) -> None:
        """Fold the waiting chunks into the map, keeping each key's winner."""
        if not self._waiting:
            return
        hi, lo, pos, event = (np.concatenate(cols) for cols in zip(*self._waiting, strict=True))
        self._waiting, self._pending = [], 0
        # Waiting records are in position order, so a later index is a later position.
        keep = latest_by_event_time(hi, lo, event)
        self._map = _merge_sorted(self._map, (hi[keep], lo[keep], pos[keep], event[keep]))

    def _read_table(self) -> Columns:
        table, self._table = self._table, None
        if table is None:
            return self._map
        hi, lo, pos, event = table.finish()
        return (np.frombuffer(hi, dtype=np.uint64), np.frombuffer(lo, dtype=np.uint64),
                np.frombuffer(pos, dtype=np.int64), np.frombuffer(event, dtype=np.int64))

    def finish(self) -> Columns:
        """The merged keys sorted by hash, with the position and event time of each
        one's winner; the builder is left empty."""
        if self._table is not None:
            self._map = self._read_table()
            self._table = new_event_key_table()
        self.merge()
        out, self._map = self._map, _empty()
        return out

    def build(self) -> KeyMap:
        """The finished map, sorted by hash, with its event times."""
        hi, lo, pos, event = self.finish()
        return KeyMap.sorted(hi, lo, pos, event)


def _merge_sorted(old: Columns, new: Columns) -> Columns:
    """Two maps of distinct keys sorted by hash, as one: a key in both keeps the newer
    map's record unless the older one's event time is greater (every position of ``new``
    comes after those of ``old``)."""
    if not len(old[0]):
        return new
    o_hi = old[0]
    if len(o_hi) > 1 and np.any(o_hi[1:] == o_hi[:-1]):
        return _merge_by_sorting(old, new)
    # No two keys of ``old`` share a high half, so the one key of ``old`` a query can
    # match is where its high half would go.
    at = np.searchsorted(o_hi, new[0])
    safe = np.minimum(at, len(o_hi) - 1)
    same_hi = (at < len(o_hi)) & (o_hi[safe] == new[0])
    both = same_hi & (old[1][safe] == new[1])
    hi, lo, pos, event = (col.copy() for col in old)
    win = both.copy()
    win[both] = new[3][both] >= event[safe[both]]
    for mine, theirs in zip((hi, lo, pos, event), new, strict=True):
        mine[safe[win]] = theirs[win]
    # the others go in hash order: after the key of ``old`` with their high half when
    # its low half is smaller
    fresh = ~both
    at = at + (same_hi & (old[1][safe] < new[1]))
    where = at[fresh]
    return (np.insert(hi, where, new[0][fresh]), np.insert(lo, where, new[1][fresh]),
            np.insert(pos, where, new[2][fresh]), np.insert(event, where, new[3][fresh]))


def _merge_by_sorting(old: Columns, new: Columns) -> Columns:
    """:func:`_merge_sorted` for keys of ``old`` that share high halves."""
    hi = np.concatenate([old[0], new[0]])
    lo = np.concatenate([old[1], new[1]])
    # The last occurrence of each key is its entry in ``new`` where it has one; the last
    # occurrence in the reversed concatenation is its entry in ``old``.  Both answers
    # list the same keys in the same hash order.
    last = latest_of_each_key(hi, lo)
    n = len(hi)
    first = n - 1 - latest_of_each_key(hi[::-1].copy(), lo[::-1].copy())
    event = np.concatenate([old[3], new[3]])
    pick = np.where(event[first] > event[last], first, last)
    pos = np.concatenate([old[2], new[2]])
    return hi[pick], lo[pick], pos[pick], event[pick]
