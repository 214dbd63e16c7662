"""What changed between two points: one change per key whose state differs.

The state of a topic at a point (:mod:`shale.metadata.asof`) is its table: the latest
record of every live key.  The changes from point A to point B are, for every key whose
state differs, an **upsert** with the key's record at B, or a **delete** when the key has
no live record at B — what a warehouse ``MERGE`` or a cache refresh needs, Paimon's
``incremental-between`` in diff mode.  A key whose record at B is the same record as at A
(the same message id) has not changed; one written again with an equal value has, and
is an upsert.

Two ways, both reading footers to decide and records only for the changes:

* **Between two retained epochs** (neither with a key TTL, whose state would also move
  with the clock), from their compacted views alone: a view holds at most one live record
  per key, so the keys that changed are those of the records live in one view and not in
  the other.  Parts both views share are compared by their deletion vectors (nothing at
  all is read when the vectors are the same object); only the parts one view has and the
  other does not are read, footers only.  An incremental compaction that keeps its parts
  in place makes this proportional to what it changed, not to the view.
* **Otherwise** (a time, an id, now, a key TTL): the two tables are planned from footers
  (:func:`~shale.reader.latest.plan_latest`) and compared key by key.

Upserts come first, in id order, then deletes, in the id order of the records they
delete.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from shale.ledger.format import FLAG_HAS_KEY, FLAG_TOMBSTONE, KIND_COMPACTED
from shale.ledger.ids import MIN_ID
from shale.ledger.reader import DEFAULT_CHUNK_BYTES, LedgerFile
from shale.ledger.record import Message
from shale.ledger.values import dataclass
from shale.metadata.asof import AsOf, parse_point
from shale.metadata.state import CompactedPart, CompactionState
from shale.metadata.topic import TopicMetadata
from shale.metadata.view import Segment
from shale.reader.arrow import DEFAULT_BATCH_ROWS, DEFAULT_MAX_BATCH_BYTES, BatchReader, decode_threads, require_pyarrow
from shale.reader.latest import Chosen, LatestPlan, plan_latest

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Change", "ChangePlan", "change_batches", "change_schema", "changes", "constant_text", "plan_changes",
           "view_difference"]

Op = Literal["upsert", "delete"]


@dataclass(frozen=True, slots=True)
class Change:
    """One key whose state differs: ``upsert`` with its record at the later point
    (``message``), or ``delete`` (``message`` None)."""

    op: Op
    key: bytes
    message: Message | None = None


@dataclass(frozen=True, slots=True)
class ChangePlan:
    """The records to read: ``upserts`` of the later point's view, and ``deletes`` of the
    earlier one's (each the record of a key that is gone, read for its key); ``how``:
    ``views`` (two retained epochs compared by their parts) or ``tables``."""

    upserts: tuple[Chosen, ...]
    deletes: tuple[Chosen, ...]
    how: str

    @property
    def rows(self) -> int:
        return sum(len(c.records) for c in (*self.upserts, *self.deletes))


def _point(p: AsOf | str) -> AsOf:
    return parse_point(p) if isinstance(p, str) else p


def _opened(topic: TopicMetadata | str) -> TopicMetadata:
    return TopicMetadata.open(topic) if isinstance(topic, str) else topic


def plan_changes(topic: TopicMetadata | str, since: AsOf | str, until: AsOf | str | None = None) -> ChangePlan:
    """Which records make the changes from ``since`` to ``until`` (None: the topic as it
    is now) of ``topic`` (its metadata, or its URI); a point the kept history cannot
    answer is refused as a read as of it is."""
    meta = _opened(topic)
    since, until = _point(since), None if until is None else _point(until)
    views = _epoch_views(meta, since, until)
    if views is not None:
        return _by_views(meta, *views)
    return _by_tables(meta, plan_latest(meta, as_of=since), plan_latest(meta, as_of=until))


def _epoch_views(meta: TopicMetadata, since: AsOf, until: AsOf | None
                 ) -> tuple[CompactionState, CompactionState] | None:
    """The two retained views when both points are epochs (or tags) without a key TTL."""
    if until is None or not all(isinstance(p, (int, str)) and not isinstance(p, bool) for p in (since, until)):
        return None
    from shale.metadata.asof import resolve_point

    topic, state = meta.load_topic(), meta.load_compaction()
    a, b = resolve_point(meta, topic, state, since), resolve_point(meta, topic, state, until)
    if a.base.order.key_ttl_ms or b.base.order.key_ttl_ms:
        return None
    return a.base, b.base


# ------------------------------------------------------------------------ two views


@dataclass
class _Side:
    """Candidate records of one view: where they are, their ids, hashes and flags."""

    chunks: list[tuple[Segment, npt.NDArray[np.int64]]]
    ids: list[npt.NDArray[np.uint64]]
    hi: list[npt.NDArray[np.uint64]]
    lo: list[npt.NDArray[np.uint64]]
    flags: list[npt.NDArray[np.uint8]]

    @classmethod
    def empty(cls) -> _Side:
        return cls([], [], [], [], [])

    def add(self, seg: Segment, f: LedgerFile, records: npt.NDArray[np.int64]) -> None:
        if not len(records):
            return
        foot = f.footer
        self.chunks.append((seg, records))
        self.ids.append(np.stack(f.record_id_columns(records), axis=1))
        self.hi.append(foot.col("r_hash_hi")[records])
        self.lo.append(foot.col("r_hash_lo")[records])
        self.flags.append(foot.col("r_flags")[records])

    def cat(self) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], npt.NDArray[np.uint64],
                           npt.NDArray[np.uint8]]:
        if not self.chunks:
            z = np.empty(0, dtype=np.uint64)
            return np.empty((0, 3), dtype=np.uint64), z, z, np.empty(0, dtype=np.uint8)
        return np.concatenate(self.ids), np.concatenate(self.hi), np.concatenate(self.lo), np.concatenate(self.flags)

    def chosen(self, keep: npt.NDArray[np.bool_]) -> tuple[Chosen, ...]:
        out, at = [], 0
        for seg, records in self.chunks:
            mine = keep[at:at + len(records)]
            at += len(records)
            if mine.any():
                out.append(Chosen(seg, records[mine]))
        return tuple(out)


def _segment(state: CompactionState, part: CompactedPart) -> Segment:
    return Segment(part.object, state.part_ledger_id(part), KIND_COMPACTED, 0, part.records, MIN_ID, None,
                   part.deletions, part=part)


def _by_views(meta: TopicMetadata, a: CompactionState, b: CompactionState) -> ChangePlan:
    """Changes between two compacted views: the records live in one and not the other."""
    return _decide(*_sides(meta, a, b), "views")


def view_difference(topic: TopicMetadata | str, since: int, until: int
                    ) -> tuple[tuple[Chosen, ...], tuple[Chosen, ...], npt.NDArray[np.uint64]] | None:
    """The records of the table of epoch ``until`` that the table of epoch ``since`` lacks,
    and those of ``since``'s table that ``until``'s lacks (each a record with a key and a
    value, by id: a key written again is in both), with the ids of the latter (rows
    ``(ledger, entry, batch)``), from the two views' parts alone (see the module); None
    when either epoch has a key TTL, whose table also moves with the clock.  What a copy of
    the table kept by epoch (an Iceberg table) adds and deletes."""
    meta = _opened(topic)
    views = _epoch_views(meta, since, until)
    if views is None:
        return None
    old, new = _sides(meta, *views)
    ids_o, _, _, fl_o = old.cat()
    ids_n, _, _, fl_n = new.cat()
    in_both_o, in_both_n = _matches(ids_o, ids_n)
    live_value_n = ((fl_n & FLAG_HAS_KEY) != 0) & ((fl_n & FLAG_TOMBSTONE) == 0) & ~in_both_n
    live_value_o = ((fl_o & FLAG_HAS_KEY) != 0) & ((fl_o & FLAG_TOMBSTONE) == 0) & ~in_both_o
    return new.chosen(live_value_n), old.chosen(live_value_o), ids_o[live_value_o]


def _sides(meta: TopicMetadata, a: CompactionState, b: CompactionState) -> tuple[_Side, _Side]:
    """The records live in view ``a`` and not in ``b`` (by where they are: a part both
    views hold, compared by its deletion vectors) and those live in ``b`` and not in ``a``."""
    old, new = _Side.empty(), _Side.empty()
    a_parts = {p.object: p for p in a.parts}
    b_parts = {p.object: p for p in b.parts}
    for part in a.parts:
        seg = _segment(a, part)
        twin = b_parts.get(part.object)
        if twin is not None and twin.deletions == part.deletions:
            continue  # the same records live in both
        f = seg.open(meta)
        gone_a = seg.deleted(meta, f.n_records)
        live_a = np.ones(f.n_records, dtype=np.bool_) if gone_a is None else ~gone_a
        if twin is None:
            old.add(seg, f, np.flatnonzero(live_a))
            continue
        gone_b = _segment(b, twin).deleted(meta, f.n_records)
        live_b = np.ones(f.n_records, dtype=np.bool_) if gone_b is None else ~gone_b
        old.add(seg, f, np.flatnonzero(live_a & ~live_b))
        new.add(_segment(b, twin), f, np.flatnonzero(live_b & ~live_a))
    for part in b.parts:
        if part.object not in a_parts:
            seg = _segment(b, part)
            f = seg.open(meta)
            new.add(seg, f, seg.live(meta, f))
    return old, new


def _decide(old: _Side, new: _Side, how: str) -> ChangePlan:
    """Of records live in the old view (``old``) or the new one (``new``) but maybe not
    both: upserts are the new ones with a key and a value that the old view did not hold
    (by id), deletes the old ones with a key and a value whose key has no such upsert and
    that the new view does not hold."""
    ids_o, hi_o, lo_o, fl_o = old.cat()
    ids_n, hi_n, lo_n, fl_n = new.cat()
    in_both_o, in_both_n = _matches(ids_o, ids_n)
    live_value_n = ((fl_n & FLAG_HAS_KEY) != 0) & ((fl_n & FLAG_TOMBSTONE) == 0) & ~in_both_n
    live_value_o = ((fl_o & FLAG_HAS_KEY) != 0) & ((fl_o & FLAG_TOMBSTONE) == 0) & ~in_both_o
    keys_o = np.stack([hi_o, lo_o], axis=1)
    keys_n = np.stack([hi_n[live_value_n], lo_n[live_value_n]], axis=1)
    upserted, _ = _matches(keys_o, keys_n)
    return ChangePlan(new.chosen(live_value_n), old.chosen(live_value_o & ~upserted), how)


def _matches(a: npt.NDArray[np.uint64], b: npt.NDArray[np.uint64]
             ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """Which rows of ``a`` occur in ``b`` and which of ``b`` occur in ``a`` (rows of
    unsigned words, compared whole; each row at most once on each side)."""
    na, nb = len(a), len(b)
    in_a, in_b = np.zeros(na, dtype=np.bool_), np.zeros(nb, dtype=np.bool_)
    if not na or not nb:
        return in_a, in_b
    rows = np.concatenate([a, b])
    side = np.r_[np.zeros(na, dtype=np.int8), np.ones(nb, dtype=np.int8)]
    order = np.lexsort((side, *rows.T[::-1]))
    s = rows[order]
    pair = np.flatnonzero(np.all(s[1:] == s[:-1], axis=1))
    first, second = order[pair], order[pair + 1]
    ok = (first < na) & (second >= na)
    in_a[first[ok]] = True
    in_b[second[ok] - na] = True
    return in_a, in_b


# ----------------------------------------------------------------------- two tables


def _table_side(meta: TopicMetadata, plan: LatestPlan) -> _Side:
    side = _Side.empty()
    for c in plan.chosen:
        side.add(c.segment, c.segment.open(meta), c.records)
    return side


def _by_tables(meta: TopicMetadata, a: LatestPlan, b: LatestPlan) -> ChangePlan:
    """Changes between two tables: keys by hash, their records by id."""
    return _decide(_table_side(meta, a), _table_side(meta, b), "tables")


# ------------------------------------------------------------------------- reading


def changes(topic: TopicMetadata | str, since: AsOf | str, until: AsOf | str | None = None, *,
            chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[Change]:
    """The changes of ``topic`` (its metadata, or its URI) from ``since`` to ``until``
    (None: now), upserts then deletes, one entry decompressed and one record decoded at a
    time.  A point is an epoch, a :class:`~datetime.datetime`, a
    :class:`~shale.ledger.ids.MessageId`, a tag, or any of them as text."""
    meta = _opened(topic)
    plan = plan_changes(meta, since, until)
    for c in plan.upserts:
        for m in c.segment.open(meta).messages_at(c.records, chunk_bytes=chunk_bytes):
            yield Change("upsert", m.key or b"", m)
    for c in plan.deletes:
        for m in c.segment.open(meta).messages_at(c.records, chunk_bytes=chunk_bytes):
            yield Change("delete", m.key or b"")


def change_schema(utf8: bool = False) -> pa.Schema:
    """The changes as Arrow data: ``op`` (``upsert`` or ``delete``), then the columns of a
    read (:func:`~shale.reader.arrow.schema`), null but for ``key`` in a delete."""
    from shale.reader.arrow import schema

    pa = require_pyarrow()
    base = schema(utf8)
    return pa.schema([("op", pa.string()), *base])


def change_batches(topic: TopicMetadata | str, since: AsOf | str, until: AsOf | str | None = None, *,
                   utf8: bool = False, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
                   rows: int | None = DEFAULT_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """The changes as Arrow record batches of :func:`change_schema`, upserts then
    deletes, each of at most ``max_batch_bytes`` of records (needs pyarrow)."""
    pa = require_pyarrow()
    meta = _opened(topic)
    plan = plan_changes(meta, since, until)
    out = change_schema(utf8)
    with BatchReader(decode_threads(), max_batch_bytes=max_batch_bytes, rows=rows,
                     chunk_bytes=min(DEFAULT_CHUNK_BYTES, max_batch_bytes), utf8=utf8) as reader:
        for op, chosen in (("upsert", plan.upserts), ("delete", plan.deletes)):
            for c in chosen:
                for batch in reader.batches(c.segment.open(meta), c.records):
                    n = batch.num_rows
                    cols = [constant_text(pa, op, n)]
                    for name in out.names[1:]:
                        keep = op == "upsert" or name == "key"
                        cols.append(batch.column(name) if keep else pa.nulls(n, out.field(name).type))
                    yield pa.RecordBatch.from_arrays(cols, schema=out)


def constant_text(pa: Any, text: str, n: int) -> Any:
    """A string array of ``n`` times ``text``, made from its buffers (converting a Python
    list would import pandas' glue into pyarrow on first use, which costs more than the
    whole read of a small change set)."""
    data = text.encode()
    offsets = np.arange(0, (n + 1) * len(data), len(data), dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data * n))
