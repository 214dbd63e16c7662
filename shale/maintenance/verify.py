"""``shale verify``: recompute the compacted view from the original ledgers and compare.

The published state promises that, below its horizon, the compacted parts hold exactly
the latest record of every key (tombstones while their retention lasts; keyless records
only when kept).  Verification recomputes "the latest record of every key up to the
horizon" from the original ledgers that still exist, from footers only, and compares it
with what the parts of the compacted view (:class:`~shale.metadata.view.TopicView`) hold,
after their deletion vectors:

* **missing** — a key whose latest record is a value, absent from the compacted view;
* **extra** — a key in the compacted view whose latest record is a tombstone that is not
  there, or that no original record up to the horizon has;
* **stale** — a key whose compacted record is not its latest one.

Keys whose compacted record comes from a ledger retention has since removed cannot be
recomputed; they are counted as unverifiable, not as errors, unless an existing ledger
holds a newer record of the key (then they are stale).  Every frame of every compacted
part is read and its checksum verified too, and every record in it is checked to be one
well-formed record exactly where the part's footer puts it, with the flags the footer
gives it (exit 4 otherwise): what readers will decode.

Under event-time order "latest" is the greatest time, a later id breaking ties, and a
key whose latest record is past the key TTL (at the "now" the run aged keys at) is
expected gone, like a dropped tombstone; a compacted record from a removed ledger is
stale only when an existing ledger holds a record of greater ``(time, id)``.

"Latest" is decided here by a fold of verification's own
(:func:`~shale.maintenance.verify_fold.latest_per_key`), never by the compactor's
(:func:`~shale.compactor.rules.latest_of_each_key` and the C kernels behind it): a bug in
either then shows as a mismatch instead of passing unseen.
"""

from __future__ import annotations

from dataclasses import asdict, field
from typing import Any

import numpy as np
import numpy.typing as npt

from shale.ledger.format import FLAG_HAS_KEY, FLAG_TOMBSTONE, KIND_ORIGINAL
from shale.ledger.ids import MessageId
from shale.ledger.ordering import TopicOrder, decoded_times
from shale.ledger.reader import LedgerFile
from shale.ledger.values import dataclass
from shale.maintenance.verify_fold import latest_per_key, latest_per_key_by_time
from shale.metadata.state import TopicState
from shale.metadata.topic import TopicMetadata
from shale.metadata.view import TopicView
from shale.settings.units import count

__all__ = ["VerifyReport", "verify_topic"]

_EXAMPLES = 10


@dataclass(slots=True)
class VerifyReport:
    """What verification compared and found."""

    topic: str
    horizon: str | None
    epoch: int
    keys_expected: int = 0  # live keys (latest record a value) up to the horizon
    records_checked: int = 0  # live records of the compacted parts compared
    frames_checked: int = 0
    missing: int = 0
    extra: int = 0
    stale: int = 0
    unverifiable: int = 0
    #: event order: keys the view holds a value of that is older than a delete of theirs
    #: the view no longer keeps (dropped past the delete retention): what the order allows
    resurrected: int = 0
    #: the parts' Arrow caches compared with their parts, and those that do not match
    caches_checked: int = 0
    caches_bad: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.stale or self.caches_bad)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    def human(self) -> str:
        verdict = "ok" if self.ok else "MISMATCH"
        # a topic never compacted is said as shale status says it
        where = f"horizon {self.horizon}, epoch {self.epoch}" if self.horizon else "never compacted"
        return (f"{self.topic}: {verdict}: {where}: {count(self.keys_expected, 'live key')} recomputed, "
                f"{count(self.records_checked, 'compacted record')} and {count(self.frames_checked, 'frame')} "
                f"checked; missing {self.missing:,}, extra {self.extra:,}, "
                f"stale {self.stale:,}, unverifiable {self.unverifiable:,}"
                + (f", older than a dropped delete {self.resurrected:,}" if self.resurrected else "")
                + (f"; {count(self.caches_checked, 'Arrow cache')} checked, {self.caches_bad:,} not matching its part"
                   if self.caches_checked else "")
                + "".join(f"\n  {e}" for e in self.examples))


@dataclass(slots=True)
class _Records:
    """Keyed records as parallel arrays: hash, id (ledger, entry, batch), tombstone."""

    hi: list[npt.NDArray[np.uint64]] = field(default_factory=list)
    lo: list[npt.NDArray[np.uint64]] = field(default_factory=list)
    ids: list[npt.NDArray[np.uint64]] = field(default_factory=list)  # (n, 3)
    tomb: list[npt.NDArray[np.bool_]] = field(default_factory=list)
    times: list[npt.NDArray[np.int64]] = field(default_factory=list)  # when the order needs them

    def add(self, f: LedgerFile, start: int, stop: int, present: npt.NDArray[np.bool_] | None = None,
            order: TopicOrder | None = None) -> None:
        idx = _keyed(f, start, stop, present)
        self.hi.append(f.footer.col("r_hash_hi")[idx])
        self.lo.append(f.footer.col("r_hash_lo")[idx])
        self.ids.append(f.record_ids(idx))
        self.tomb.append((f.footer.col("r_flags")[idx] & FLAG_TOMBSTONE) != 0)
        if order is not None and order.needs_times:
            self.times.append(decoded_times(f, order, start, stop)[idx - start])

    def arrays(self) -> tuple[Any, Any, Any, Any]:
        if not self.hi:
            e = np.empty(0, dtype=np.uint64)
            return e, e, np.empty((0, 3), dtype=np.uint64), np.empty(0, dtype=bool)
        return (np.concatenate(self.hi), np.concatenate(self.lo), np.concatenate(self.ids),
                np.concatenate(self.tomb))

    def all_times(self) -> npt.NDArray[np.int64]:
        return np.concatenate(self.times) if self.times else np.empty(0, dtype=np.int64)


@dataclass(slots=True)
class _Originals:
    """The keyed records of original ledgers, in id order, as parallel arrays (hash,
    tombstone); their ids are worked out only for the records a comparison needs, from
    each ledger's id, entry starts and record indexes (a fraction of a footer's size)."""

    hi: list[npt.NDArray[np.uint64]] = field(default_factory=list)
    lo: list[npt.NDArray[np.uint64]] = field(default_factory=list)
    tomb: list[npt.NDArray[np.bool_]] = field(default_factory=list)
    sources: list[tuple[int, npt.NDArray[np.int64], npt.NDArray[np.int64]]] = field(default_factory=list)
    times: list[npt.NDArray[np.int64]] = field(default_factory=list)  # when the order needs them

    def add(self, f: LedgerFile, ledger_id: int, start: int, stop: int, order: TopicOrder | None = None) -> None:
        foot = f.footer
        idx = _keyed(f, start, stop, None)
        self.hi.append(foot.col("r_hash_hi")[idx])
        self.lo.append(foot.col("r_hash_lo")[idx])
        self.tomb.append((foot.col("r_flags")[idx] & FLAG_TOMBSTONE) != 0)
        self.sources.append((ledger_id, np.array(foot.e_rec_start, dtype=np.int64), idx))
        if order is not None and order.needs_times:
            self.times.append(decoded_times(f, order, start, stop)[idx - start])

    def all_times(self) -> npt.NDArray[np.int64]:
        return np.concatenate(self.times) if self.times else np.empty(0, dtype=np.int64)

    def arrays(self) -> tuple[Any, Any, Any]:
        if not self.hi:
            e = np.empty(0, dtype=np.uint64)
            return e, e, np.empty(0, dtype=bool)
        return np.concatenate(self.hi), np.concatenate(self.lo), np.concatenate(self.tomb)

    def ids(self, positions: npt.NDArray[np.intp]) -> npt.NDArray[np.uint64]:
        """The ids ``(ledger, entry, batch)`` of the records at ``positions``."""
        out = np.empty((len(positions), 3), dtype=np.uint64)
        order = np.argsort(positions, kind="stable")
        at = positions[order]
        offsets = np.cumsum([0] + [len(idx) for _, _, idx in self.sources])
        bounds = np.searchsorted(at, offsets)
        for (lid, rec_start, idx), off, b0, b1 in zip(self.sources, offsets[:-1].tolist(), bounds[:-1].tolist(),
                                                      bounds[1:].tolist(), strict=True):
            rows = idx[at[b0:b1] - off]
            entry = np.searchsorted(rec_start, rows, side="right") - 1
            where = order[b0:b1]
            out[where, 0] = lid
            out[where, 1] = entry
            out[where, 2] = rows - rec_start[entry]
        return out


def _keyed(f: LedgerFile, start: int, stop: int, present: npt.NDArray[np.bool_] | None) -> npt.NDArray[np.int64]:
    """Indexes of the keyed records among ``start:stop`` (and ``present`` ones)."""
    keep = (f.footer.col("r_flags")[start:stop] & FLAG_HAS_KEY) != 0
    if present is not None:
        keep &= present[start:stop]
    return start + np.flatnonzero(keep)


def _id(row: npt.NDArray[np.uint64]) -> str:
    return str(MessageId(int(row[0]), int(row[1]), int(row[2])))


def verify_topic(meta: TopicMetadata) -> VerifyReport:
    """Compare the published compacted view of ``meta``'s topic with one recomputed from
    its original ledgers."""
    state = meta.load_compaction()
    topic = meta.load_topic()
    h = state.horizon
    report = VerifyReport(meta.uri, str(h) if h else None, state.epoch)
    published = _published(meta, TopicView(topic, state), report, state.order)
    original, existing = _recomputed(meta, topic, h, state.order)
    decided = int(state.last_run.get("decided_ms") or state.compacted_ms)
    _compare(report, published, original, existing, state.order, decided)
    return report


def _published(meta: TopicMetadata, view: TopicView, report: VerifyReport, order: TopicOrder) -> _Records:
    """The live records of the compacted parts (every part of the view, whole), every frame
    and record checked on the way."""
    published = _Records()
    for part in view.parts():
        f = part.open(meta)
        gone = part.deleted(meta, f.n_records)
        for c0, c1 in f.chunks(0, f.n_entries):
            base, buf = f.read_frames(c0, c1)
            f.check_frames(buf, base, c0, c1)
            # the records themselves, as readers will decode them (decompressed)
            f.check_records_in(buf, base, c0, c1)
            report.frames_checked += c1 - c0
        published.add(f, 0, f.n_records, None if gone is None else ~gone, order)
        if (cache := part.arrow_cache(meta)) is not None:
            _check_cache(f, cache, report)
    return published


def _check_cache(f: LedgerFile, cache: str, report: VerifyReport) -> None:
    """Compare the part ``f``'s Arrow cache with the part, row by row (a mismatch: exit 4)."""
    from shale.ledger.arrow_cache import cache_matches

    report.caches_checked += 1
    why = cache_matches(f, cache)
    if why:
        report.caches_bad += 1
        if len(report.examples) < _EXAMPLES:
            report.examples.append(f"{f.store.url(cache)}: the Arrow cache does not match its part: {why}")


def _recomputed(meta: TopicMetadata, topic: TopicState, h: MessageId | None,
                order: TopicOrder) -> tuple[_Originals, set[int]]:
    """The keyed records of the original ledgers up to the horizon (footers only), and
    the ids of the ledgers that still exist there."""
    loc = meta.topic
    existing: set[int] = set()
    original = _Originals()
    if h is not None:
        for lg in topic.ledgers:
            if lg.id > h.ledger:
                break
            existing.add(lg.id)
            f = LedgerFile.open(loc.store, loc.key(lg.object), ledger_id=lg.id, kind=KIND_ORIGINAL)
            stop = f.find(h.successor()) if lg.id == h.ledger else f.n_records
            original.add(f, lg.id, 0, stop, order)
    return original, existing


def _compare(report: VerifyReport, published: _Records, original: _Originals, existing: set[int],
             topic_order: TopicOrder, decided_ms: int) -> None:
    """Count and name, in ``report``, what the published view has that the recomputed
    one has not, and the other way round."""
    p_hi, p_lo, p_ids, p_tomb = published.arrays()
    o_hi, o_lo, o_tomb = original.arrays()
    o_t, p_t = original.all_times(), published.all_times()
    report.records_checked = len(p_hi)
    # verify's own fold, not the compactor's (so that either can catch the other)
    by_time = topic_order.by_event_time
    latest = latest_per_key_by_time(o_hi, o_lo, o_t) if by_time else latest_per_key(o_hi, o_lo)  # by hash
    e_hi, e_lo, e_tomb = o_hi[latest], o_lo[latest], o_tomb[latest]
    e_t = o_t[latest] if len(o_t) else o_t
    del o_hi, o_lo, o_tomb, o_t
    if topic_order.key_ttl_ms:
        e_tomb = e_tomb | topic_order.expired(e_t, decided_ms)  # expected gone, as a dropped tombstone is
    e_ids = original.ids(latest)
    report.keys_expected = int((~e_tomb).sum())
    # the compacted view holds one record per key; look each up among the expected ones
    order = np.lexsort((p_lo, p_hi))
    p_hi, p_lo, p_ids, p_tomb = p_hi[order], p_lo[order], p_ids[order], p_tomb[order]
    if len(p_t):
        p_t = p_t[order]
    at = _find(e_hi, e_lo, p_hi, p_lo)
    found = at >= 0
    j = at[found]
    gone_ledger = ~np.isin(p_ids[:, 0], np.fromiter(existing, dtype=np.uint64, count=len(existing)))
    other = np.zeros(len(p_hi), dtype=bool)  # the compacted record is not the recomputed latest
    other[found] = np.any(p_ids[found] != e_ids[j], axis=1)
    newer = np.zeros(len(p_hi), dtype=bool)  # ... and an existing ledger holds a newer record
    newer[found] = _later(e_ids[j], p_ids[found])
    after_delete = np.zeros(len(p_hi), dtype=bool)
    if by_time:
        newer[found] = (e_t[j] > p_t[found]) | ((e_t[j] == p_t[found]) & newer[found])  # by (time, id)
        after_delete[found] = _after_delete(other[found] & newer[found], e_tomb[j], p_ids[found], e_ids[j])
        report.resurrected = int((after_delete & ~p_tomb).sum())
    differs = other & newer & ~after_delete
    flag = np.zeros(len(p_hi), dtype=bool)
    flag[found] = p_tomb[found] != e_tomb[j]
    flag &= ~other
    # its ledger is gone: nothing newer exists either (a newer one would be stale, above)
    unverifiable = (~found | (other & ~newer)) & gone_ledger
    orphan = (~found | (other & ~newer)) & ~gone_ledger & ~p_tomb
    have = np.zeros(len(e_hi), dtype=bool)
    have[at[found]] = True
    lost = np.flatnonzero(~have & ~e_tomb)
    report.stale, report.unverifiable = int(differs.sum()), int(unverifiable.sum())
    report.extra, report.missing = int(flag.sum() + orphan.sum()), len(lost)
    examples = [(f"stale: compacted record {_id(p_ids[i])}, latest is {_id(e_ids[at[i]])}")
                for i in np.flatnonzero(differs)[:_EXAMPLES]]
    examples += [f"extra: record {_id(p_ids[i])} differs from the original in its tombstone flag"
                 for i in np.flatnonzero(flag)[:_EXAMPLES]]
    examples += [f"extra: compacted record {_id(p_ids[i])} has no original up to the horizon"
                 for i in np.flatnonzero(orphan)[:_EXAMPLES]]
    examples += [f"missing: the key of record {_id(e_ids[i])} (its latest) is not in the compacted view"
                 for i in lost[:_EXAMPLES]]
    report.examples = [*report.examples, *examples][:_EXAMPLES]  # (the caches' first)


def _after_delete(stale: npt.NDArray[np.bool_], e_tomb: npt.NDArray[np.bool_],
                  p_ids: npt.NDArray[np.uint64], e_ids: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
    """Of compacted records newer ones outweigh (``stale``), those written after a delete
    of greater time that the view no longer keeps (dropped once past its retention):
    event-time order keeps them (docs/compaction.md), so they are no mismatch.  A value
    among them brought its key back; a delete among them deletes it as the dropped one did."""
    return np.asarray(stale & e_tomb & _later(p_ids, e_ids))


def _later(a: npt.NDArray[np.uint64], b: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
    """Row by row, whether id ``a`` (ledger, entry, batch) comes after id ``b``."""
    return np.asarray((a[:, 0] > b[:, 0]) | ((a[:, 0] == b[:, 0]) & (
        (a[:, 1] > b[:, 1]) | ((a[:, 1] == b[:, 1]) & (a[:, 2] > b[:, 2])))))


def _find(hi: Any, lo: Any, q_hi: Any, q_lo: Any) -> npt.NDArray[np.int64]:
    """Index in the hash-sorted ``(hi, lo)`` of each query hash, -1 where absent."""
    out = np.full(len(q_hi), -1, dtype=np.int64)
    if not len(hi) or not len(q_hi):
        return out
    i = np.searchsorted(hi, q_hi, side="left")
    safe = np.minimum(i, len(hi) - 1)
    same_hi = hi[safe] == q_hi
    hit = same_hi & (lo[safe] == q_lo)
    out[hit] = i[hit]
    for q in np.flatnonzero(same_hi & ~hit):  # rare: several keys share a high half
        j = int(i[q])
        while j < len(hi) and hi[j] == q_hi[q]:
            if lo[j] == q_lo[q]:
                out[q] = j
                break
            j += 1
    return out
