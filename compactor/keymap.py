"""The latest-key map of pass one: 24 bytes per key, bounded.

Only keys above the previous horizon (the dirty part of the run) go in the map, as
three parallel NumPy arrays — 64-bit high hash, 64-bit low hash, 64-bit run position:
24 bytes per key, the figure of Kafka's SkimpyOffsetMap, against 110-130 bytes for a
Python dict (the finished map adds a one-byte-per-key filter for lookups).  Records of
the previous compacted ledger are checked against the map
(superseded or not) and never enter it, so the map grows with the keys written since the
last run, not with the topic.

When the dirty keys do not fit in ``--max-map-bytes``, pass one stops adding ledgers
(cutting inside a ledger at an entry boundary) and the run publishes the horizon it
reached; the next run continues from there — Kafka's partial cleaning.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from shale.compactor.rules import latest_of_each_key
from shale.ledger.kernels import KeyTable, new_key_table
from shale.ledger.values import dataclass

__all__ = ["EVENT_KEY_BYTES", "KEY_BYTES", "KeyMap", "KeyMapBuilder", "Run"]

KEY_BYTES: Final = 24
#: A map that also keeps each key's winning event time (event-time order).
EVENT_KEY_BYTES: Final = 32
# Waiting records are merged once they outnumber the map this many times (or reach
# _MIN_MERGE): each merge costs a sort of map + waiting, so waiting longer means fewer
# passes over the map, at up to this many times its memory in waiting records.
_MERGE_FACTOR: Final = 3
_MIN_MERGE: Final = 1 << 22
#: Fewer lookups than this per thread are not worth a thread.
_MIN_LOOKUPS_PER_THREAD: Final = 1 << 17

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
#: A run of records as :meth:`KeyMapBuilder.add` takes them: hashes, positions (``None``:
#: ``first, first + 1, ...``) and ``first``.
Run = tuple[U64, U64, I64 | None, int]


@dataclass(frozen=True, slots=True, eq=False)
class KeyMap:
    """Distinct keys with the run position of their latest record, sorted by hash, and
    under event-time order that record's event time (``event``, ``None`` otherwise).

    Lookups (:meth:`contains`, :meth:`events_of`) go through a hash table of the C
    kernels, or without them through a one-byte-per-key filter in front of a binary
    search; either is built on the first lookup (a full run never looks up)."""

    hi: U64
    lo: U64
    pos: I64
    shared_high: bool  # two keys share the high 64 bits (lookups then take a slower path)
    event: I64 | None = None
    _lookup: dict[str, Any] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.hi)

    @property
    def nbytes(self) -> int:
        extra = self.event.nbytes if self.event is not None else 0
        return int(self.hi.nbytes + self.lo.nbytes + self.pos.nbytes + extra)

    @classmethod
    def sorted(cls, hi: U64, lo: U64, pos: I64, event: I64 | None = None) -> KeyMap:
        """A map of distinct keys sorted by hash."""
        return cls.of(hi, lo, pos, bool(len(hi) > 1 and np.any(hi[1:] == hi[:-1])), event)

    @classmethod
    def of(cls, hi: U64, lo: U64, pos: I64, shared_high: bool, event: I64 | None = None) -> KeyMap:
        """A map of hash-sorted arrays."""
        return cls(hi, lo, pos, shared_high, event)

    def events_of(self, hi: U64, lo: U64) -> tuple[npt.NDArray[np.bool_], I64]:
        """For each query hash, whether the map holds it and the event time of its
        winning record there (0 where it does not).  Only for a map with event times."""
        if self.event is None:
            raise ValueError("this key map keeps no event times")
        at = self._index(hi, lo)
        found = at >= 0
        events = np.zeros(len(hi), dtype=np.int64)
        events[found] = self.event[at[found]]
        return found, events

    def index_of(self, hi: U64, lo: U64) -> tuple[npt.NDArray[np.bool_], I64]:
        """For each query hash, whether the map holds it and where (its index into the
        map's arrays; 0 where it does not)."""
        at = self._index(hi, lo)
        found = at >= 0
        return found, np.where(found, at, 0)

    def _index(self, hi: U64, lo: U64) -> I64:
        """Where each query hash is in the map, -1 where it is not."""
        n = len(self.hi)
        out = np.full(len(hi), -1, dtype=np.int64)
        if not n or not len(hi):
            return out
        self.prepare_lookups()
        table = self._lookup["table"]
        if table is not None and self._lookup.get("indexed"):
            at: I64 = np.frombuffer(table.lookup(hi, lo)[0], dtype=np.int64)
            return at
        idx = np.searchsorted(self.hi, hi)
        safe = np.minimum(idx, n - 1)
        same_hi = (idx < n) & (self.hi[safe] == hi)
        exact = same_hi & (self.lo[safe] == lo)
        out[exact] = safe[exact]
        if self.shared_high:
            # several keys may share this high half: their low halves are sorted after it
            for q in np.flatnonzero(same_hi & ~exact).tolist():
                stop = int(np.searchsorted(self.hi, hi[q], side="right"))
                start = int(idx[q])
                j = start + int(np.searchsorted(self.lo[start:stop], lo[q]))
                if j < stop and self.lo[j] == lo[q]:
                    out[q] = j
        return out

    @property
    def filter_words(self) -> npt.NDArray[np.uint64]:
        """A one-hash filter of 8 bits per key (1 byte per key, ~12 % false positives):
        most lookups of keys that are not in the map stop here instead of searching it."""
        return self._filter()[0]

    def _filter(self) -> tuple[npt.NDArray[np.uint64], int]:
        got: tuple[npt.NDArray[np.uint64], int] | None = self._lookup.get("filter")
        if got is None:
            bits = max(10, int(np.ceil(np.log2(max(1, len(self.hi)) * 8))))
            shift = 64 - bits
            words = np.zeros(1 << (bits - 6), dtype=np.uint64)
            if len(self.hi):
                slot = self.hi >> np.uint64(shift)  # non-decreasing, since hi is sorted
                word = (slot >> np.uint64(6)).astype(np.int64)
                mask = np.left_shift(np.uint64(1), slot & np.uint64(63))
                starts = np.flatnonzero(np.r_[True, word[1:] != word[:-1]])
                words[word[starts]] = np.bitwise_or.reduceat(mask, starts)
            got = self._lookup["filter"] = (words, shift)
        return got

    def contains(self, hi: U64, lo: U64, threads: int = 1,
                 pool: ThreadPoolExecutor | None = None) -> npt.NDArray[np.bool_]:
        """For each query hash, whether the map holds it (the table's lookups split over
        up to ``threads`` threads when there are many, those of ``pool`` when given: a
        caller with many calls to make starts its threads once)."""
        n = len(self.hi)
        if not n or not len(hi):
            return np.zeros(len(hi), dtype=bool)
        self.prepare_lookups()
        table = self._lookup["table"]
        if table is not None:
            parts = min(threads, len(hi) // _MIN_LOOKUPS_PER_THREAD)
            if parts <= 1:
                return np.frombuffer(table.contains(hi, lo), dtype=np.bool_)
            cuts = np.linspace(0, len(hi), parts + 1).astype(np.int64).tolist()

            def look(ab: tuple[int, int]) -> bytearray:
                got: bytearray = table.contains(hi[ab[0]:ab[1]], lo[ab[0]:ab[1]])
                return got

            if pool is not None:
                found = list(pool.map(look, itertools.pairwise(cuts)))
            else:
                with ThreadPoolExecutor(max_workers=parts, thread_name_prefix="shale-lookup") as own:
                    found = list(own.map(look, itertools.pairwise(cuts)))
            return np.frombuffer(b"".join(found), dtype=np.bool_)
        words, shift = self._filter()
        slot = hi >> np.uint64(shift)
        maybe = ((words[(slot >> np.uint64(6)).astype(np.int64)] >> (slot & np.uint64(63)))
                 & np.uint64(1)).astype(bool)
        out = np.zeros(len(hi), dtype=bool)
        q = np.flatnonzero(maybe)
        out[q] = self._search(hi[q], lo[q])
        return out

    def prepare_lookups(self) -> None:
        """Build what :meth:`contains` needs now (it would on its first call): before
        lookups from several threads at once, so that they do not each build it."""
        if "table" not in self._lookup:
            n = len(self.hi)
            table = new_key_table(n) if n else None
            # the table holds each key's index into the map's arrays (for _index)
            if table is not None and table.add(self.hi, self.lo) != n:
                table = None  # crafted keys crowd it: search instead
            self._lookup["indexed"] = table is not None
            if table is not None:
                table.prepare_lookups()
            else:
                self._filter()
            self._lookup["table"] = table

    def _search(self, hi: U64, lo: U64) -> npt.NDArray[np.bool_]:
        n = len(self.hi)
        if not len(hi):
            return np.zeros(0, dtype=bool)
        idx = np.searchsorted(self.hi, hi)
        safe = np.minimum(idx, n - 1)
        same_hi = (idx < n) & (self.hi[safe] == hi)
        found: npt.NDArray[np.bool_] = same_hi & (self.lo[safe] == lo)
        if self.shared_high:
            for q in np.flatnonzero(same_hi & ~found):
                j = int(idx[q])
                while j < n and self.hi[j] == hi[q]:
                    if self.lo[j] == lo[q]:
                        found[q] = True
                        break
                    j += 1
        return found


class KeyMapBuilder:
    """Collects the latest position of each key, chunk by chunk, in position order.

    With the C kernels every record goes straight into one hash table
    (:func:`shale.ledger.kernels.new_key_table`), read out sorted at the end.  Without them
    (or when keys crafted to share their top hash bits crowd that table) the merged map
    is kept sorted by hash and new chunks (records in position order, a key possibly
    several times) wait until they outnumber the map a few times over, then merge into
    it with one sort; what waits counts against the capacity like the map, so map and
    waiting records together never exceed it."""

    def __init__(self, capacity: int, expected: int = 0) -> None:
        """``expected``: how many keys to make room for from the start (a guess; the
        table grows past it)."""
        self.capacity = max(1, capacity)
        self._table: KeyTable | None = new_key_table(min(expected, self.capacity))
        empty = np.empty(0, dtype=np.uint64)
        self._map: tuple[U64, U64, I64] = (empty, empty.copy(), np.empty(0, dtype=np.int64))
        self._hi: list[U64] = []
        self._lo: list[U64] = []
        self._pos: list[I64] = []
        self._pending = 0  # entries added since the last merge

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
        return self._distinct_with(hi, lo) <= self.capacity

    def add(self, hi: U64, lo: U64, pos: I64 | None = None, *, first: int = 0, part_shift: int = 64,
            part: int = 0) -> None:
        """Add one chunk of records, in position order, every position after those of
        earlier chunks (a key may appear several times).  ``pos`` is the records'
        positions, or ``None`` for ``first, first + 1, ...``.  With ``part_shift`` < 64
        only the records whose ``hi >> part_shift`` is ``part`` are added (one thread's
        share of the hash range)."""
        if self._table is not None:
            taken = self._table.add(hi, lo, pos, first, part_shift, part)
            if taken == len(hi):
                return
            # crafted keys crowd the table: go on merging sorted runs, from what it holds
            self._map = self._read_table()
            hi, lo = hi[taken:], lo[taken:]
            pos, first = (pos[taken:], 0) if pos is not None else (None, first + taken)
        if pos is None:
            pos = np.arange(first, first + len(hi), dtype=np.int64)
        if part_shift < 64:
            mine = (hi >> np.uint64(part_shift)) == part
            hi, lo, pos = hi[mine], lo[mine], pos[mine]
        self._hi.append(hi)
        self._lo.append(lo)
        self._pos.append(pos)
        self._pending += len(hi)
        if self._pending > max(_MERGE_FACTOR * len(self._map[0]), _MIN_MERGE):
            self.merge()

    def add_grouped(self, sources: Sequence[tuple[bytearray, I64]], runs: Sequence[Run], part_shift: int = 64,
                    part: int = 0) -> None:
        """Add the records of ``runs`` (each ``(hi, lo, pos, first)`` as :meth:`add` takes
        them, in position order, after those of earlier calls) from ``sources``, their
        :func:`~shale.ledger.kernels.partition_keys` groups: only the records of this
        builder's part (``part_shift`` and ``part`` as for :meth:`add`), group by group,
        so that each group's inserts stay in one stretch of the table."""
        if self._table is not None:
            if self._table.add_grouped(sources, part_shift, part):
                return
            # Crafted keys crowd the table: go on merging sorted runs, from what it holds.
            # It may hold some of these records; they come again below at the same
            # positions, and the last occurrence of a key is still its latest record.
            self._map = self._read_table()
        for hi, lo, pos, first in runs:
            self.add(hi, lo, pos, first=first, part_shift=part_shift, part=part)

    def _read_table(self) -> tuple[U64, U64, I64]:
        table, self._table = self._table, None
        if table is None:
            return self._map
        return _arrays(table.finish())

    def _distinct_with(self, hi: U64, lo: U64) -> int:
        all_hi = np.concatenate([self._map[0], *self._hi, hi])
        all_lo = np.concatenate([self._map[1], *self._lo, lo])
        return len(latest_of_each_key(all_hi, all_lo))

    def merge(self) -> None:
        """Fold the waiting chunks into the map, keeping the latest record of each key."""
        if not self._hi:
            return
        hi = np.concatenate([self._map[0], *self._hi])
        lo = np.concatenate([self._map[1], *self._lo])
        pos = np.concatenate([self._map[2], *self._pos])
        self._hi, self._lo, self._pos, self._pending = [], [], [], 0
        # Later chunks hold later positions, so the last occurrence in this order is the
        # latest record of each key.
        keep = latest_of_each_key(hi, lo)
        self._map = (hi[keep], lo[keep], pos[keep])

    def finish(self) -> tuple[U64, U64, I64]:
        """The merged keys, sorted by hash, and their latest positions; the builder is
        left empty."""
        if self._table is not None:
            self._map = self._read_table()
            self._table = new_key_table()
        self.merge()
        out = self._map
        empty = np.empty(0, dtype=np.uint64)
        self._map = (empty, empty.copy(), np.empty(0, dtype=np.int64))
        return out

    def build(self, for_lookups: bool = False) -> KeyMap:
        """The finished map, sorted by hash.  ``for_lookups``: the map will be asked
        :meth:`KeyMap.contains`, so the table it was built in is kept for that (instead
        of being freed now and a new one built on the first lookup)."""
        table = self._table
        if not for_lookups or table is None or self._hi or len(self._map[0]):
            return KeyMap.sorted(*self.finish())
        self._table = new_key_table()
        m = KeyMap.sorted(*_arrays(table.finish(keep=True)))
        m._lookup["table"] = table
        return m


def _arrays(keys: tuple[bytearray, bytearray, bytearray]) -> tuple[U64, U64, I64]:
    """A key table's read-out (hi, lo, pos buffers) as arrays."""
    hi, lo, pos = keys
    return np.frombuffer(hi, dtype=np.uint64), np.frombuffer(lo, dtype=np.uint64), np.frombuffer(pos, dtype=np.int64)
