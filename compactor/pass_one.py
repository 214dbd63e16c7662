"""Pass one: the latest position of every key, from footers only.

Every ledger footer carries the 128-bit key hash and flags of each record as dense
arrays, so this pass never reads a payload.  Positions number the run's records in id
order (previous compacted parts first, then the new ledgers).

The keys above the previous horizon go into a bounded map (:mod:`shale.compactor.keymap`, 24
bytes per key).  A new record survives when it is its key's entry in the map; a record
of the previous compacted ledger survives when its key is not in the map (nothing newer
was written).  Tombstones then follow :func:`~shale.compactor.rules.tombstone_fate`, held
past their retention for the topic's active subscriptions from the plan's
:attr:`~shale.compactor.plan.Plan.hold_from` on.  When the
new keys outgrow ``max_map_bytes`` the run is cut short at an entry boundary (partial
cleaning) and the plan it returns says so.

Under event-time order (:mod:`shale.ledger.ordering`) the map also keeps each key's
winning time (32 bytes per key): a new record wins for its key when its time is the
greatest, a later position breaking ties, and a record of a previous part survives when
its key is not in the map *or* its time is greater than the map's winner, which then
loses.  The times come from the footers: a part written under event order keeps them.
With a key TTL, winners whose time is past it are dropped after the merge.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from shale.compactor.config import CompactionConfig
from shale.compactor.event_map import EventKeyMapBuilder, event_map_capacity
from shale.compactor.keymap import KEY_BYTES, KeyMap, KeyMapBuilder, Run
from shale.compactor.plan import Plan, Slice
from shale.compactor.rules import held_past_retention, held_tombstones, latest_of_each_key, tombstone_fate
from shale.ledger.errors import InvalidInputError
from shale.ledger.format import FLAG_HAS_KEY, FLAG_TOMBSTONE
from shale.ledger.kernels import distinct_estimate, partition_keys
from shale.ledger.ordering import TopicOrder, decoded_times
from shale.ledger.values import dataclass
from shale.runtime.cpus import worker_count
from shale.settings.units import format_size

__all__ = ["Survivors", "latest_of_each_key", "pass_one", "tombstone_fate"]

#: Below this many new records, one thread builds the map (threads cost more than they save).
_MIN_THREADED_RECORDS = 1 << 20
#: Keys the map's table makes room for before the first record (48 bytes each) when
#: there is no estimate of how many there will be.
_PRESIZE_KEYS = 1 << 18
#: Bytes of a part's table that one group of partitioned records lands in: a fraction of
#: a core's L2 cache (1-2 MiB), which holds it while the group goes in.
_GROUP_STRETCH_BYTES = 1 << 20
_MAX_GROUP_BITS = 10
#: Smaller tables are filled record by record: grouping costs a pass over the records, and
#: tables of about 10 MB (400 k keys on two threads) measured no faster for it.
_MIN_GROUPED_BYTES = 16 << 20
#: Records partitioned at once: about as many as the tables have slots (fewer, and most
#: slots would be touched once a chunk, from memory as before), within these bounds.
_MIN_CHUNK_RECORDS = 1 << 20
_MAX_CHUNK_RECORDS = 1 << 22


@dataclass(frozen=True, slots=True, eq=False)
class Survivors:
    """Which of the run's records survive, and the counts a summary reports.

    ``plan`` is the plan the survivors belong to: the one given to :func:`pass_one`, or
    a shorter one when the key map filled up (``deferred_records`` then counts what was
    left for the next run).
    """

    plan: Plan
    keep: npt.NDArray[np.bool_]  # one flag per record read, in run order
    since_at: npt.NDArray[np.int64]  # run positions of kept tombstones ...
    since_ms: npt.NDArray[np.int64]  # ... and when each was first kept
    offsets: tuple[int, ...]  # where each slice of the plan starts in ``keep``
    records_read: int
    keys: int  # live keys (latest record is not a tombstone)
    tombstones_kept: int
    tombstones_dropped: int
    keyless_kept: int
    keyless_dropped: int
    footer_bytes: int
    map_keys: int
    map_bytes: int
    deferred_records: int
    keys_expired: int = 0  # live keys dropped for their age (key TTL)
    #: of the tombstones kept, those past their delete retention, held for subscriptions
    tombstones_held: int = 0

    @property
    def records_kept(self) -> int:
        return int(self.keep.sum())

    def slice_keep(self, i: int) -> npt.NDArray[np.bool_]:
        return self.keep[self.offsets[i]:self.offsets[i + 1]]

    def slice_delete_since(self, i: int) -> npt.NDArray[np.int64]:
        a, b = self.offsets[i], self.offsets[i + 1]
        out = np.zeros(b - a, dtype=np.int64)
        lo, hi = np.searchsorted(self.since_at, [a, b])
        out[self.since_at[lo:hi] - a] = self.since_ms[lo:hi]
        return out


def _slice_keys(s: Slice, base: int, stop: int | None = None) -> tuple[npt.NDArray[np.uint64],
                                                                         npt.NDArray[np.uint64],
                                                                         npt.NDArray[np.int64]]:
    """The latest record of each key in records ``[s.start, stop)``, sorted by hash."""
    stop = s.stop if stop is None else stop
    foot = s.file.footer
    flags = foot.col("r_flags")[s.start:stop]
    keyed = np.flatnonzero(flags & FLAG_HAS_KEY)
    hi = foot.col("r_hash_hi")[s.start:stop][keyed]
    lo = foot.col("r_hash_lo")[s.start:stop][keyed]
    pick = latest_of_each_key(hi, lo)  # in hash order
    return hi[pick], lo[pick], (base + keyed[pick]).astype(np.int64)


def _slice_records(s: Slice, base: int) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64],
                                                  npt.NDArray[np.int64] | None, int]:
    """Every keyed record of ``s``, in position order, as ``(hi, lo, pos, first)``: when
    every record has a key the hashes are views of the footer and ``pos`` is ``None``
    (the positions are ``first, first + 1, ...``)."""
    hi, lo = _hashes(s)
    keyed_mask = (s.file.footer.col("r_flags")[s.start:s.stop] & FLAG_HAS_KEY) != 0
    if keyed_mask.all():
        return hi, lo, None, base
    keyed = np.flatnonzero(keyed_mask)
    return hi[keyed], lo[keyed], (base + keyed).astype(np.int64), 0


def _hashes(s: Slice) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """The key hashes of every record of ``s`` (views of its footer)."""
    foot = s.file.footer
    return foot.col("r_hash_hi")[s.start:s.stop], foot.col("r_hash_lo")[s.start:s.stop]


def _fit_prefix(builder: KeyMapBuilder | EventKeyMapBuilder, s: Slice, base: int, must_progress: bool) -> int:
    """The end record of the longest run of whole entries of ``s`` whose keys still fit.
    When nothing was taken yet (``must_progress``) at least one entry is, so every run
    makes progress; otherwise the answer may be ``s.start`` (nothing of ``s``)."""
    starts = s.file.footer.e_rec_start
    bounds = [int(x) for x in starts if s.start < int(x) <= s.stop]
    if not bounds or bounds[-1] != s.stop:
        bounds.append(s.stop)
    if not must_progress:
        bounds.insert(0, s.start)
    lo_i, hi_i = 0, len(bounds) - 1  # bounds[lo_i] is known to be taken
    while lo_i < hi_i:
        mid = (lo_i + hi_i + 1) // 2
        khi, klo, _ = _slice_keys(s, base, bounds[mid])
        if builder.fits(khi, klo):
            lo_i = mid
        else:
            hi_i = mid - 1
    return bounds[lo_i]


def _expected_keys(plan: Plan) -> int:
    """About how many distinct keys the new records hold (a little over, so that the
    table need not grow), or a guess of at most ``_PRESIZE_KEYS`` without the C kernels."""
    new = [s.file.footer.col("r_hash_hi")[s.start:s.stop] for s in plan.new]
    estimate = distinct_estimate(new)
    if estimate is None:
        return min(sum(len(h) for h in new), _PRESIZE_KEYS)
    return estimate + estimate // 16 + 1024


def _build_in_threads(plan: Plan, capacity: int, base: int, threads: int,
                      order: TopicOrder | None = None) -> KeyMap:
    """The map of every new record, built by ``threads`` threads that each take the keys
    of one range of hash values (NumPy's sorts and gathers run without the interpreter
    lock, so the threads share the CPUs).  Only for runs whose records fit the map even
    before duplicates are removed: no partial cleaning to decide.  With an event-time
    ``order``, the map of each key's greatest (time, position) and its time."""
    shift = 64 - (threads - 1).bit_length()
    parts = 1 << (threads - 1).bit_length()
    expected = _expected_keys(plan) // parts  # hashes are uniform: each part holds its share
    if order is None and (grouped := _build_grouped(plan, capacity, base, threads, expected)) is not None:
        return grouped
    times = [decoded_times(s.file, order, s.start, s.stop) for s in plan.new] if order is not None else []

    def build(t: int) -> tuple[npt.NDArray[Any], ...]:
        builder: KeyMapBuilder | EventKeyMapBuilder = (
            EventKeyMapBuilder(capacity, expected=expected) if order is not None
            else KeyMapBuilder(capacity, expected=expected))
        at = base
        for i, s in enumerate(plan.new):
            hi, lo, pos, first = _slice_records(s, at)
            if isinstance(builder, EventKeyMapBuilder):
                event = times[i] if pos is None else times[i][pos - at]
                builder.add(hi, lo, event, pos, first=first, part_shift=shift, part=t)
            else:
                builder.add(hi, lo, pos, first=first, part_shift=shift, part=t)
            at += s.records
        return builder.finish()

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="shale-pass-one") as pool:
        ranges = list(pool.map(build, range(parts)))
    # ranges of hash values in order: the concatenation is sorted by hash
    return KeyMap.sorted(*(np.concatenate(cols) for cols in zip(*ranges, strict=True)))


def _group_bits(expected: int) -> int:
    """Bits of hash, after those that choose a part, that cut a part's table of about
    ``expected`` keys (48 bytes a key, slots to spare included) into stretches of about
    ``_GROUP_STRETCH_BYTES``; 0 when the table is smaller than ``_MIN_GROUPED_BYTES``."""
    if expected * 48 < _MIN_GROUPED_BYTES:
        return 0
    stretches = expected * 48 // _GROUP_STRETCH_BYTES
    return min(_MAX_GROUP_BITS, stretches.bit_length())


def _chunks(plan: Plan, base: int, records: int) -> Iterator[list[Run]]:
    """The keyed records of the new slices of ``plan``, as runs, in chunks of whole
    slices of about ``records`` records (one slice at least)."""
    chunk: list[Run] = []
    held = 0
    for s in plan.new:
        chunk.append(_slice_records(s, base))
        base += s.records
        held += len(chunk[-1][0])
        if held >= records:
            yield chunk
            chunk, held = [], 0
    if chunk:
        yield chunk


def _split_runs(runs: list[Run], pieces: int) -> list[list[Run]]:
    """``runs`` cut into ``pieces`` consecutive pieces of about as many records each."""
    total = sum(len(r[0]) for r in runs)
    cuts = [total * k // pieces for k in range(1, pieces)] + [total]
    out: list[list[Run]] = [[] for _ in range(pieces)]
    at = k = 0
    for hi, lo, pos, first in runs:
        a = 0
        while a < len(hi):
            while at >= cuts[k]:
                k += 1
            b = min(len(hi), a + cuts[k] - at)
            out[k].append((hi[a:b], lo[a:b], None, first + a) if pos is None else (hi[a:b], lo[a:b], pos[a:b], 0))
            at += b - a
            a = b
    return out


def _build_grouped(plan: Plan, capacity: int, base: int, threads: int, expected: int) -> KeyMap | None:
    """:func:`_build_in_threads` without event times, with the records partitioned by
    hash first (:func:`~shale.ledger.kernels.partition_keys`, the threads taking one piece
    of each chunk each) and each part's table filled group by group, so that its inserts
    stay in a stretch of the table that fits a core's cache instead of landing anywhere
    in tens of megabytes.  A chunk's partitioned copy holds 24 bytes a record, about the
    tables' size.  ``None`` when the tables are too small for this to pay, or without the
    C kernels."""
    part_bits = (threads - 1).bit_length()
    parts, shift = 1 << part_bits, 64 - part_bits
    group_bits = _group_bits(expected)
    if group_bits == 0 or partition_keys([], 1) is None:
        return None
    builders = [KeyMapBuilder(capacity, expected=expected) for _ in range(parts)]
    chunk_records = min(_MAX_CHUNK_RECORDS, max(_MIN_CHUNK_RECORDS, 2 * parts * expected))

    spare: list[bytearray | None] = [None] * threads  # each piece's buffer, for the next chunk

    def partition(k: int, piece: list[Run]) -> tuple[bytearray, npt.NDArray[np.int64]]:
        got = partition_keys(piece, part_bits + group_bits, spare[k])
        assert got is not None
        return got

    def fill(t: int, sources: list[tuple[bytearray, npt.NDArray[np.int64]]], chunk: list[Run]) -> None:
        builders[t].add_grouped(sources, chunk, shift, t)

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="shale-pass-one") as pool:
        for chunk in _chunks(plan, base, chunk_records):
            sources = list(pool.map(partition, range(threads), _split_runs(chunk, threads)))
            list(pool.map(functools.partial(fill, sources=sources, chunk=chunk), range(parts)))
            spare = [records for records, _ in sources]
        ranges = list(pool.map(KeyMapBuilder.finish, builders))
    # ranges of hash values in order: the concatenation is sorted by hash
    return KeyMap.sorted(*(np.concatenate(cols) for cols in zip(*ranges, strict=True)))


def _windows(plan: Plan, window: int) -> list[tuple[int, Slice]]:
    """The new slices of ``plan`` as ``(index in plan.new, piece)``, each cut at entry
    boundaries into pieces of about ``window`` records (0: whole slices), so that what
    the map is handed at once, and the footer pages it reads, stay bounded."""
    if window <= 0:
        return list(enumerate(plan.new))
    out: list[tuple[int, Slice]] = []
    for i, s in enumerate(plan.new):
        starts = s.file.footer.e_rec_start
        cuts = [s.start]
        while cuts[-1] < s.stop:
            at = cuts[-1]
            nxt = int(starts[int(np.searchsorted(starts, at + window, side="right")) - 1])
            if nxt <= at:  # an entry bigger than the window: it alone
                nxt = int(starts[int(np.searchsorted(starts, at, side="right"))])
            cuts.append(min(nxt, s.stop))
        for a, b in itertools.pairwise(cuts):
            gone = s.gone[a - s.start:b - s.start] if s.gone is not None else None
            out.append((i, dataclasses.replace(s, start=a, stop=b, gone=gone)))
    return out


def _kept_new(plan: Plan, i: int, stop: int) -> tuple[Slice, ...]:
    """The new slices of a plan cut at record ``stop`` of its slice ``i``."""
    s = plan.new[i]
    if stop <= s.start:
        return plan.new[:i]
    gone = s.gone[:stop - s.start] if s.gone is not None else None
    return (*plan.new[:i], dataclasses.replace(s, stop=stop, gone=gone))


def _cut(plan: Plan, i: int, stop: int, capacity: int, config: CompactionConfig) -> tuple[Plan, int]:
    """``plan`` cut short where the key map filled up (at record ``stop`` of its new slice
    ``i``), and how many records that leaves for the next run.  A rewrite reads the new
    ledgers from the start, below the previous horizon: cut there, the previous parts'
    records above the cut would be read twice, so such a run is refused (it publishes
    nothing)."""
    kept_new = _kept_new(plan, i, stop)
    deferred = sum(x.records for x in plan.new) - sum(x.records for x in kept_new)
    last = kept_new[-1] if kept_new else None
    horizon = last.file.record_id(last.stop - 1) if last else plan.previous.horizon
    previous = plan.previous.horizon
    if previous is not None and (horizon is None or horizon < previous):
        raise InvalidInputError(
            f"{plan.location.uri}: a rewrite weighs every record up to the previous horizon {previous} again in one "
            f"run, and their keys do not fit in the key map ({capacity:,} keys: --max-map-bytes "
            f"{format_size(config.max_map_bytes)}{', within --max-memory' if config.max_memory else ''}): raise it; "
            "nothing was published")
    return dataclasses.replace(plan, new=tuple(kept_new), horizon=horizon), deferred


def _build_map(plan: Plan, config: CompactionConfig) -> tuple[Plan, KeyMap, int]:
    """Put the new records' keys in a map; cut the plan where the map is full."""
    capacity = config.max_map_bytes // KEY_BYTES
    base = sum(s.records for s in plan.compacted)
    new_records = sum(s.records for s in plan.new)
    threads = worker_count(config.workers)
    bounded = config.map_window_records > 0
    if threads > 1 and _MIN_THREADED_RECORDS <= new_records <= capacity and not bounded:
        return plan, _build_in_threads(plan, capacity, base, threads), 0
    # Room for the keys the new records hold, so that the table need not grow (a
    # bounded run's map may take its whole capacity: it need not read every new hash
    # first to estimate them).
    builder = KeyMapBuilder(capacity, expected=min(new_records, capacity) if bounded else _expected_keys(plan))
    for n, (i, s) in enumerate(_windows(plan, config.map_window_records)):
        # Whole records go in, not one per key: the builder dedups many slices in one
        # sort, which beats a sort per slice followed by merges.
        hi, lo, pos, first = _slice_records(s, base)
        if builder.fits(hi, lo):
            builder.add(hi, lo, pos, first=first)
            base += s.records
            if bounded:
                s.file.release_pages()
            continue
        stop = _fit_prefix(builder, s, base, must_progress=n == 0)
        if stop > s.start:
            builder.add(*_slice_keys(s, base, stop))
        cut, deferred = _cut(plan, i, stop, capacity, config)
        return cut, builder.build(for_lookups=bool(plan.compacted)), deferred
    return plan, builder.build(for_lookups=bool(plan.compacted)), 0


def _build_event_map(plan: Plan, config: CompactionConfig) -> tuple[Plan, KeyMap, int]:
    """:func:`_build_map` under event-time order: the map keeps each key's greatest
    ``(time, position)`` and its time."""
    order = config.topic_order
    capacity = event_map_capacity(config.max_map_bytes)
    base = sum(s.records for s in plan.compacted)
    threads = worker_count(config.workers)
    new_records = sum(s.records for s in plan.new)
    bounded = config.map_window_records > 0
    if threads > 1 and _MIN_THREADED_RECORDS <= new_records <= capacity and not bounded:
        return plan, _build_in_threads(plan, capacity, base, threads, order), 0
    # room for the keys the new records hold, so that the table need not grow
    builder = EventKeyMapBuilder(capacity, expected=min(new_records, capacity) if bounded else _expected_keys(plan))
    for n, (i, s) in enumerate(_windows(plan, config.map_window_records)):
        hi, lo, pos, first = _slice_records(s, base)
        times = decoded_times(s.file, order, s.start, s.stop, config.chunk_raw_bytes)
        if pos is not None:
            times = times[pos - base]
        if builder.fits(hi, lo):
            builder.add(hi, lo, times, pos, first=first)
            base += s.records
            if bounded:
                s.file.release_pages()
            continue
        stop = _fit_prefix(builder, s, base, must_progress=n == 0)
        if stop > s.start:
            k = stop - s.start if pos is None else int(np.searchsorted(pos, base + stop - s.start))
            builder.add(hi[:k], lo[:k], times[:k], None if pos is None else pos[:k], first=first)
        cut, deferred = _cut(plan, i, stop, capacity, config)
        return cut, builder.build(), deferred
    return plan, builder.build(), 0


def pass_one(plan: Plan, config: CompactionConfig, now_ms: int) -> Survivors:
    """Decide the survivors of ``plan`` under ``config`` at time ``now_ms``."""
    if config.topic_order.by_event_time:
        plan, key_map, deferred = _build_event_map(plan, config)
    else:
        plan, key_map, deferred = _build_map(plan, config)
    threads = worker_count(config.workers)
    # One pool for the lookups of every previous part (threads started once, not per part).
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="shale-lookup") as lookups:
        try:
            return _decide(plan, key_map, deferred, config, now_ms, threads, lookups)
        except BaseException:
            lookups.shutdown(cancel_futures=True)  # lookups handed ahead are no longer wanted
            raise


def _lookups_ahead(plan: Plan, key_map: KeyMap, threads: int,
                   lookups: ThreadPoolExecutor) -> dict[int, Future[npt.NDArray[np.bool_]]]:
    """With enough previous parts to give every thread one, all their lookups handed to
    the pool at once (by slice): each part's answer is then taken in order, so the pool
    looks up the next parts while the caller finishes the part before."""
    previous = [i for i, s in enumerate(plan.slices) if s.compacted]
    if len(previous) < threads or threads <= 1 or key_map.event is not None:
        return {}
    key_map.prepare_lookups()

    def look(s: Slice) -> npt.NDArray[np.bool_]:
        found = key_map.contains(*_hashes(s))
        s.file.release_pages()  # the answer is all that is kept of the part's hashes
        return found

    return {i: lookups.submit(look, plan.slices[i]) for i in previous}


@dataclass(slots=True)
class _Tally:
    """What :func:`_decide` counts as it goes through the slices."""

    keyed: int = 0
    unsuperseded: int = 0  # records of previous parts whose key has no newer record
    absent: int = 0  # records of previous parts that a deletion vector already removed
    beaten: int = 0  # keys of the map whose previous part's record has the greater time
    expired_keys: int = 0  # live keys past the key TTL
    expired_tombs: int = 0  # tombstones past the key TTL (dropped as when past delete retention)


_TOMB_BITS: Final = np.uint8(FLAG_HAS_KEY | FLAG_TOMBSTONE)


def _previous_live(s: Slice, has_key: npt.NDArray[np.bool_], times: npt.NDArray[np.int64] | None, key_map: KeyMap,
                   keep: npt.NDArray[np.bool_], newer: Callable[[], npt.NDArray[np.bool_]],
                   tally: _Tally) -> npt.NDArray[np.bool_]:
    """Which keyed records of a previous part survive: their key has no new record, or
    (event order) theirs is newer than the map's winner, which then loses (a tie goes
    to the later position, the map's record)."""
    if times is not None and key_map.event is not None:
        found, at = key_map.index_of(*_hashes(s))
        wins = has_key & found
        wins[wins] = times[wins] > key_map.event[at[wins]]
        keep[key_map.pos[at[wins]]] = False
        tally.beaten += int(np.count_nonzero(wins))
        live = has_key & (~found | wins)
    else:
        # every record is looked up (no gather of the keyed ones): the answer for a
        # keyless or deleted one is masked out here
        live = has_key & ~newer()
    tally.unsuperseded += int(np.count_nonzero(live))
    return live


def _expire(k: npt.NDArray[np.bool_], has_key: npt.NDArray[np.bool_], flags: npt.NDArray[np.uint8],
            times: npt.NDArray[np.int64], cutoff: int, tally: _Tally) -> None:
    """Drop the winners past the key TTL, as if deleted (aged after the merge, by the
    time that orders: no older record of their key can come back)."""
    old = k & has_key & (times < cutoff)
    old_tombs = int(np.count_nonzero(old & ((flags & _TOMB_BITS) == _TOMB_BITS)))
    tally.expired_tombs += old_tombs
    tally.expired_keys += int(np.count_nonzero(old)) - old_tombs
    k &= ~old


def _decide(plan: Plan, key_map: KeyMap, deferred: int, config: CompactionConfig, now_ms: int, threads: int,
            lookups: ThreadPoolExecutor) -> Survivors:
    offsets = list(itertools.accumulate((s.records for s in plan.slices), initial=0))
    n = offsets[-1]
    keep = np.zeros(n, dtype=bool)
    keep[key_map.pos] = True  # each new key's latest record
    tomb_at: list[npt.NDArray[np.int64]] = []
    tomb_since: list[npt.NDArray[np.int64]] = []
    tally = _Tally()
    # (a bounded run looks each part up in turn: answers for every part at once would
    # cost a byte per record of the whole view)
    ahead = _lookups_ahead(plan, key_map, threads, lookups) if not config.map_window_records else {}
    order = config.topic_order
    for i, s in enumerate(plan.slices):
        a, b = offsets[i], offsets[i + 1]
        foot = s.file.footer
        flags = foot.col("r_flags")[s.start:s.stop]
        has_key = (flags & FLAG_HAS_KEY) != 0
        if s.gone is not None:
            has_key &= ~s.gone
            tally.absent += int(np.count_nonzero(s.gone))
        n_keyed = int(np.count_nonzero(has_key))
        tally.keyed += n_keyed
        k = keep[a:b]
        times = decoded_times(s.file, order, s.start, s.stop, config.chunk_raw_bytes) if order.needs_times else None
        since = None
        if s.compacted:
            def newer(i: int = i, s: Slice = s) -> npt.NDArray[np.bool_]:
                return ahead.pop(i).result() if i in ahead else key_map.contains(*_hashes(s), threads=threads,
                                                                                 pool=lookups)

            k |= _previous_live(s, has_key, times, key_map, keep, newer, tally)
            since = foot.delete_since()[s.start:s.stop]
        if config.retain_null_key and n_keyed < b - a:
            keyless_here = (flags & FLAG_HAS_KEY) == 0
            if s.gone is not None:
                keyless_here &= ~s.gone
            k |= keyless_here
        if config.key_ttl_ms and times is not None:
            _expire(k, has_key, flags, times, now_ms - config.key_ttl_ms, tally)
        tomb = np.flatnonzero(k & ((flags & _TOMB_BITS) == _TOMB_BITS))
        tomb_at.append(a + tomb)
        tomb_since.append(since[tomb] if since is not None else np.zeros(len(tomb), dtype=np.int64))
        s.file.release_pages()  # pass two maps again what it reads of this footer
    return _survivors(plan, keep, tomb_at, tomb_since, offsets, tally, key_map, deferred, config, now_ms)


def _survivors(plan: Plan, keep: npt.NDArray[np.bool_], tomb_at: list[npt.NDArray[np.int64]],
               tomb_since: list[npt.NDArray[np.int64]], offsets: list[int], tally: _Tally, key_map: KeyMap,
               deferred: int, config: CompactionConfig, now_ms: int) -> Survivors:
    """The decision, once the kept tombstones' fate is settled, with its counts."""
    n = offsets[-1]
    tomb = np.concatenate(tomb_at) if tomb_at else np.empty(0, dtype=np.int64)
    since_all = np.concatenate(tomb_since) if tomb_since else np.empty(0, dtype=np.int64)
    # Tombstones stay for delete_retention after the first run that kept them (KIP-534),
    # and longer while an active subscription has yet to read them.
    expired, first_kept = tombstone_fate(since_all, now_ms, config.delete_retention_ms,
                                         held=held_tombstones(tomb, plan.hold_from),
                                         max_hold_ms=config.max_tombstone_hold_ms)
    keep[tomb[expired]] = False
    distinct = len(key_map) + tally.unsuperseded - tally.beaten - tally.expired_keys - tally.expired_tombs
    keyless = n - tally.absent - tally.keyed
    return Survivors(
        plan=plan, keep=keep, since_at=tomb[~expired], since_ms=first_kept[~expired], offsets=tuple(offsets),
        records_read=n - tally.absent, keys=distinct - len(tomb), tombstones_kept=len(tomb) - int(expired.sum()),
        tombstones_dropped=int(expired.sum()) + tally.expired_tombs, keys_expired=tally.expired_keys,
        tombstones_held=held_past_retention(expired, first_kept, now_ms, config.delete_retention_ms),
        keyless_kept=keyless if config.retain_null_key else 0,
        keyless_dropped=0 if config.retain_null_key else keyless,
        footer_bytes=sum(s.file.footer_bytes for s in plan.slices),
        map_keys=len(key_map), map_bytes=key_map.nbytes, deferred_records=deferred,
    )
