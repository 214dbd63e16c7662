"""Incremental Spark runs: a Bloom filter of the new records' keys, and what the tasks
reading the previous compacted parts decide with it, without the shuffle.  Nothing here
imports PySpark."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from shale.compactor.keyfilter import KeyFilter
from shale.compactor.rules import held_past_retention, held_tombstones, tombstone_fate
from shale.ledger.errors import ShaleError, TransientStorageError
from shale.ledger.format import FLAG_HAS_KEY, FLAG_TOMBSTONE
from shale.ledger.ordering import decoded_times
from shale.ledger.reader import LedgerFile
from shale.ledger.values import dataclass

if TYPE_CHECKING:
    from shale.compactor.spark.tasks import SplitSpec, TaskContext

__all__ = ["Settled", "filter_task", "settle"]


@dataclass(frozen=True, slots=True)
class Settled:
    """The records of a previous part's split whose key is surely not new: each is the
    last of its key (a compacted part holds one per key), so it is kept, unless it is
    past the key TTL or a tombstone past its retention.  Masks and times over the split's
    records."""

    pending: npt.NDArray[np.bool_]  # keyed records whose key may be new: decided by the reduce side
    keep: npt.NDArray[np.bool_]  # settled here and kept
    since: npt.NDArray[np.int64]  # when each kept tombstone was first kept (0 elsewhere)
    keys: int  # settled keyed records
    tombstones: int
    dropped: int  # tombstones past their retention or the key TTL
    expired: int  # live records past the key TTL
    held: int = 0  # tombstones kept past their retention for subscriptions

    def counts(self) -> dict[str, int]:
        return {"keys": self.keys, "tombstones": self.tombstones, "dropped": self.dropped, "expired": self.expired,
                "kept": int(np.count_nonzero(self.keep)), "held": self.held}


def settle(ctx: TaskContext, sp: SplitSpec, f: LedgerFile, present: npt.NDArray[np.bool_] | None,
           times: npt.NDArray[np.int64] | None = None) -> Settled | None:
    """What a split of a previous part decides without the shuffle (None: nothing, no
    filter of new keys, or not a previous part).  The map task and the write task both
    call it on the same records and get the same answer.  ``times``: the split's record
    times, if the caller has them (read here when the key TTL needs them)."""
    if ctx.new_keys is None or not sp.previous:
        return None
    foot = f.footer
    flags = foot.col("r_flags")[sp.start:sp.stop]
    keyed = (flags & FLAG_HAS_KEY) != 0
    if present is not None:
        keyed &= present
    idx = np.flatnonzero(keyed)
    maybe = ctx.new_keys.may_contain(foot.col("r_hash_hi")[sp.start:sp.stop][idx],
                                     foot.col("r_hash_lo")[sp.start:sp.stop][idx])
    pending = np.zeros(sp.records, dtype=bool)
    pending[idx[maybe]] = True
    sure = idx[~maybe]
    is_tomb = (flags[sure] & FLAG_TOMBSTONE) != 0
    n_tomb = int(np.count_nonzero(is_tomb))
    keep = np.zeros(sp.records, dtype=bool)
    rule = ctx.config.topic_order
    old = np.zeros(len(sure), dtype=bool)
    if rule.key_ttl_ms and len(sure):
        if times is None:
            times = decoded_times(f, rule, sp.start, sp.stop)
        old = rule.expired(times[sure], ctx.now_ms)  # as if deleted: the tombstone rules do not apply
    keep[sure[~old]] = True
    tomb = sure[is_tomb & ~old]
    expired, first_kept = tombstone_fate(foot.delete_since()[sp.start:sp.stop][tomb], ctx.now_ms,
                                         ctx.config.delete_retention_ms,
                                         held=held_tombstones(sp.base + tomb, ctx.hold_from),
                                         max_hold_ms=ctx.config.max_tombstone_hold_ms)
    keep[tomb[expired]] = False
    since = np.zeros(sp.records, dtype=np.int64)
    since[tomb[~expired]] = first_kept[~expired]
    old_tombs = int(np.count_nonzero(old & is_tomb))
    return Settled(pending, keep, since, len(sure), n_tomb, int(np.count_nonzero(expired)) + old_tombs,
                   int(np.count_nonzero(old)) - old_tombs,
                   held_past_retention(expired, first_kept, ctx.now_ms, ctx.config.delete_retention_ms))


def filter_task(ctx: TaskContext, size: int, task_indexes: Iterable[int]) -> Iterator[KeyFilter]:
    """The Bloom filter of the keys of the new records in these map tasks' slices.  A
    slice that cannot be read gives a filter of every key, so that pass one's map task
    meets the same error and reports it."""
    loc = ctx.location()
    out = KeyFilter(np.zeros(size // 8, dtype=np.uint8))
    for i in (i for t in task_indexes for i in range(*ctx.tasks[t])):
        sp = ctx.slices[i]
        if sp.previous:
            continue
        try:
            f = ctx.open(loc, sp)
        except TransientStorageError:
            raise  # Spark retries the task
        except ShaleError:
            f = None
        if f is None or sp.stop > f.n_records:
            yield KeyFilter(np.full(size // 8, 0xFF, dtype=np.uint8))
            return
        foot = f.footer
        keyed = np.flatnonzero((foot.col("r_flags")[sp.start:sp.stop] & FLAG_HAS_KEY) != 0)
        out = out.union(KeyFilter.of(foot.col("r_hash_hi")[sp.start:sp.stop][keyed],
                                     foot.col("r_hash_lo")[sp.start:sp.stop][keyed], size))
    yield out
