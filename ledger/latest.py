"""Which record of each key is its latest, over arrays of key hashes: the last one
written (offset order) or the one with the greatest time (event-time order, a later
position breaking ties).  Both compaction engines and the readers of the table decide
winners with these functions (:mod:`shale.ledger.ordering` says what a record's time is).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from shale.ledger.kernels import latest_positions, new_key_table

__all__ = ["latest_by_event_time", "latest_by_sorting", "latest_of_each_key"]

#: When more than this share of the last-written records of keys arrived late, sorting
#: everything by event time beats repairing those keys one by one.
_REPAIR_SHARE = 0.25
#: Records whose running maximum of event time is taken at once.
_LATE_BLOCK = 1 << 20


def latest_of_each_key(hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64]) -> npt.NDArray[np.intp]:
    """Indexes of the last occurrence of every distinct 128-bit hash ``(hi, lo)``, in
    hash order (by ``hi``, then ``lo``).  Both engines decide "latest" with this one
    function.

    With the C kernels (:mod:`shale.ledger.kernels`) each record goes once into a hash table
    homed on the top bits of ``hi``, so reading the table out gives the keys nearly in
    hash order; without them, or for keys crafted to crowd that table, the records are
    sorted (:func:`latest_by_sorting`).
    """
    got = latest_positions(hi, lo)
    return got if got is not None else latest_by_sorting(hi, lo)


def latest_by_sorting(hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64]) -> npt.NDArray[np.intp]:
    """:func:`latest_of_each_key` by sorting, in NumPy alone.

    Each record's index is packed into the low bits of its high hash and the packed
    words are sorted with NumPy's plain (vectorised) sort, several times faster than an
    argsort: equal hashes end up together in index order, and the last of each group is
    the latest occurrence.  Keys whose high halves share the kept bits (a few per
    million keys at ten million records) are found by comparing neighbours and sorted
    out exactly.
    """
    n = len(hi)
    if not n:
        return np.empty(0, dtype=np.intp)
    bits = max(1, (n - 1).bit_length())
    low = np.uint64((1 << bits) - 1)
    packed = hi & ~low
    packed |= np.arange(n, dtype=np.uint64)
    packed.sort()
    idx = (packed & low).astype(np.intp)
    packed >>= np.uint64(bits)  # now the group of each element
    last = np.empty(n, dtype=bool)
    last[-1] = True
    np.not_equal(packed[1:], packed[:-1], out=last[:-1])
    del packed
    ends = np.flatnonzero(last)  # the last element of each group
    if len(ends) == n:
        return idx
    # Neighbours in one group must hold the same key.  Gathering both halves in sorted
    # order once and comparing neighbours costs half as much as gathering each pair.
    shi, slo = hi[idx], lo[idx]
    differs = shi[1:] != shi[:-1]
    differs |= slo[1:] != slo[:-1]
    del shi, slo
    differs &= ~last[:-1]
    mixed = np.flatnonzero(differs)
    if not len(mixed):
        return idx[ends]
    return _sort_out_shared_groups(hi, lo, idx, ends, mixed)


def _sort_out_shared_groups(hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64], idx: npt.NDArray[np.intp],
                            ends: npt.NDArray[np.intp], mixed: npt.NDArray[np.intp]) -> npt.NDArray[np.intp]:
    """Groups that hold more than one key (``mixed`` points into them) are resolved with
    an exact sort and spliced back in hash order."""
    shared = np.unique(np.searchsorted(ends, mixed))  # group numbers
    first = np.where(shared > 0, ends[shared - 1] + 1, 0)
    members = np.concatenate([idx[f:e + 1] for f, e in zip(first.tolist(), ends[shared].tolist(), strict=True)])
    plain = np.delete(idx[ends], shared)  # one key per group: hi strictly increasing
    exact = members[_latest_exact(hi[members], lo[members])]  # sorted by (hi, lo)
    return np.insert(plain, np.searchsorted(hi[plain], hi[exact]), exact)


def _latest_exact(hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64]) -> npt.NDArray[np.intp]:
    order = np.lexsort((lo, hi))  # stable: equal hashes stay in index order
    shi, slo = hi[order], lo[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = (shi[1:] != shi[:-1]) | (slo[1:] != slo[:-1])
    return order[last]


def latest_by_event_time(hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64],
                         event: npt.NDArray[np.int64]) -> npt.NDArray[np.intp]:
    """Indexes of the record with the greatest ``event`` of every distinct hash
    ``(hi, lo)``, the later index breaking ties, in the hash order of
    :func:`latest_of_each_key`.  ``event`` is each record's event time in ms, records
    without one already given what they count as.

    Event times arrive nearly in index order, so the last record of a key usually wins
    anyway: whenever it is not late (no earlier record has a greater event time), no
    earlier record can beat it.  Only the keys whose last record is late have all their
    records looked up and decided exactly; when many are, everything is sorted by event
    time instead.
    """
    last = latest_of_each_key(hi, lo)
    if len(last) == 0:
        return last
    late = _late_records(event)[last]
    n_late = int(np.count_nonzero(late))
    if not n_late:
        return last
    if n_late > _REPAIR_SHARE * len(last):
        return _latest_by_event_sort(hi, lo, event)
    doubtful = last[late]
    table = new_key_table(len(doubtful))
    if table is None or table.add(hi[doubtful], lo[doubtful]) != len(doubtful):
        return _latest_by_event_sort(hi, lo, event)  # no C kernels, or crafted keys crowd the table
    members = np.flatnonzero(np.frombuffer(table.contains(hi, lo), dtype=np.bool_))
    del table
    out = last.copy()
    # the same keys, in the same hash order
    out[late] = members[_latest_by_event_sort(hi[members], lo[members], event[members])]
    return out


def _late_records(event: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """For each record, whether an earlier one has a greater event time (in blocks: a
    byte per record, not a running maximum of eight)."""
    late = np.empty(len(event), dtype=bool)
    carry = np.iinfo(np.int64).min
    for a in range(0, len(event), _LATE_BLOCK):
        block = event[a:a + _LATE_BLOCK]
        run = np.maximum.accumulate(block)
        np.maximum(run, carry, out=run)
        late[a] = block[0] < carry
        np.less(block[1:], run[:-1], out=late[a + 1:a + len(block)])
        carry = int(run[-1])
    return late


def _latest_by_event_sort(hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64],
                          event: npt.NDArray[np.int64]) -> npt.NDArray[np.intp]:
    """:func:`latest_by_event_time` by a stable sort on event time: the last occurrence
    in that order is the greatest ``(event, index)``."""
    order = np.argsort(event, kind="stable")
    return order[latest_of_each_key(hi[order], lo[order])]
