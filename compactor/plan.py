"""Planning a run: which records are read, where the new horizon falls, how dirty the topic is.

A run reads the previous compacted ledger (its parts) and the original records above
the previous horizon, up to a new horizon bounded by the minimum compaction lag.
Nothing before the previous horizon is read again: the run's cost grows with new data
plus the compacted size, not with the topic's history.

A plan is made in one of two ways.  With ``footers=True`` (the local engine) every
object's footer is read and held, since pass one reads them all anyway.  With
``footers=False`` (the Spark engine, whose executors read the footers of their own
splits) the plan holds what the metadata says of each object, and reads at most the two
footers that fix its ends: the ledger the previous horizon lies in and the last one read.
The driver's memory then grows with the number of objects, not records.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from shale.ledger.codecs import Dictionary
from shale.ledger.deletions import read_deletions
from shale.ledger.format import FRAME_HEADER, KIND_COMPACTED, KIND_ORIGINAL
from shale.ledger.ids import MIN_ID, MessageId
from shale.ledger.reader import LedgerFile
from shale.ledger.values import dataclass
from shale.metadata.state import CompactedPart, CompactionState, LedgerInfo, TopicState
from shale.metadata.topic import TopicMetadata
from shale.metadata.view import Segment, TopicView, dirty_ratio
from shale.runtime.cpus import available_cpus
from shale.storage import Location

__all__ = ["ObjectRef", "Plan", "Slice", "make_plan", "open_slice"]

#: Footers read at a time while planning (at most one per CPU where reads are local).
FOOTER_READS = 8
#: Footers of at most this many records in all, on local storage, are read one after the
#: other on the planning thread: starting threads would cost more than it saves.
INLINE_FOOTER_RECORDS = 1 << 16


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """One ledger object as the metadata describes it: enough to open it elsewhere."""

    key: str  # the object's key in the store
    ledger_id: int
    kind: int  # KIND_ORIGINAL or KIND_COMPACTED
    records: int
    bytes: int  # the object's size, footer included
    raw_bytes: int  # what it would be were its entries stored uncompressed


@dataclass(frozen=True, slots=True, eq=False)
class Slice:
    """Records ``[start, stop)`` of one ledger object, read in this run.

    ``opened`` is the object with its footer, or None in a plan made without footers
    (:attr:`ref` then says where the object is)."""

    opened: LedgerFile | None
    start: int
    stop: int
    compacted: bool  # a part of the previous compacted ledger
    part: CompactedPart | None = None  # the part, when compacted
    gone: npt.NDArray[np.bool_] | None = None  # per record of the slice: deleted by a deletion vector
    ref: ObjectRef | None = None

    @property
    def file(self) -> LedgerFile:
        """The object, footer read (only in a plan made with footers)."""
        if self.opened is None:
            raise ValueError("this slice was planned without its footer")
        return self.opened

    @property
    def records(self) -> int:
        return self.stop - self.start

    @property
    def object(self) -> ObjectRef:
        """Where the object is, whether or not its footer was read."""
        if self.ref is not None:
            return self.ref
        f = self.file
        return ObjectRef(f.key, f.ledger_id, KIND_COMPACTED if self.compacted else KIND_ORIGINAL, f.n_records,
                         f.size, f.size)

    @property
    def removed(self) -> int:
        """Records of the slice a deletion vector removed."""
        if self.gone is not None:
            return int(self.gone.sum())
        return self.part.deleted if self.part is not None and self.opened is None else 0

    def data_bytes(self) -> int:
        """Bytes of the entries this slice covers (without its footer: estimated from
        the object's size in proportion to its records)."""
        if self.stop <= self.start:
            return 0
        if self.opened is None:
            ref = self.object
            return ref.bytes * self.records // max(ref.records, 1)
        f = self.file.footer
        e0, e1 = int(f.entry_of(self.start)), int(f.entry_of(self.stop - 1))
        offs, lens = f.col("e_offset"), f.col("e_length")
        return int(offs[e1]) + int(lens[e1]) - int(offs[e0])

    def raw_data_bytes(self) -> int:
        """:meth:`data_bytes` were the entries stored uncompressed (what decompressing
        them all would give)."""
        if self.opened is None:
            ref = self.object
            return ref.raw_bytes * self.records // max(ref.records, 1)
        if self.stop <= self.start or not self.file.footer.compressed:
            return self.data_bytes()
        f = self.file.footer
        e0, e1 = int(f.entry_of(self.start)), int(f.entry_of(self.stop - 1))
        return int(f.raw_lengths()[e0:e1 + 1].sum()) + FRAME_HEADER.size * (e1 + 1 - e0)


@dataclass(frozen=True, slots=True, eq=False)
class Plan:
    """What one run will read and the horizon it will publish."""

    topic: TopicState
    previous: CompactionState
    compacted: tuple[Slice, ...]
    new: tuple[Slice, ...]
    horizon: MessageId | None
    dirty_bytes: int
    live_bytes: int
    held_back_records: int  # above the horizon because of the minimum compaction lag
    location: Location  # the topic's folder, where the run writes
    dictionaries: tuple[Dictionary, ...] = ()  # the topic's, for processes that cannot read its metadata
    #: the least position of the topic's active subscriptions, and the run position of the
    #: first record at or after it: tombstones from there on are held for them (None: none)
    hold_floor: MessageId | None = None
    hold_from: int | None = None

    @property
    def new_records(self) -> int:
        return sum(s.records for s in self.new)

    @property
    def slices(self) -> tuple[Slice, ...]:
        return self.compacted + self.new

    @property
    def dirty_ratio(self) -> float:
        return dirty_ratio(self.dirty_bytes, self.live_bytes - self.dirty_bytes)

    @property
    def ledgers_read(self) -> int:
        return len(self.new)


def make_plan(meta: TopicMetadata, *, now_ms: int, min_compaction_lag_ms: int,
              open_file: Callable[[str, int | None, int], LedgerFile] | None = None,
              footers: bool = True, rewrite: bool = False, topic: TopicState | None = None,
              previous: CompactionState | None = None) -> Plan:
    """Read both metadata documents and the footers needed to fix this run's range
    (every footer with ``footers``; else at most two, see the module's text).

    ``rewrite``: read every original ledger still kept, not only those above the previous
    horizon, besides the previous parts (which hold what retention removed since): the
    whole topic competes again, as when its order changes.  The new horizon is then never
    below the previous one, whatever the lag (those records were compacted already).

    ``topic`` and ``previous``: the two documents as already read (a topic's handle holds
    them), else read here; a ledger list older than a truncation the state was stamped
    with is read again (the run must plan with the list the truncation left)."""
    loc = meta.topic
    opener = open_file or (lambda key, lid, kind: LedgerFile.open(loc.store, key, ledger_id=lid, kind=kind,
                                                                   dictionaries=meta.dictionaries))
    previous = meta.load_compaction() if previous is None else previous
    topic = meta.load_topic() if topic is None else topic
    if topic.generation < previous.topic_generation:
        topic = meta.load_topic()
    # What the run reads is the compacted view: every previous part, then the original
    # ledgers from the previous horizon's successor.
    view = TopicView(topic, previous)
    cutoff = now_ms - min_compaction_lag_ms
    floor = previous.horizon if rewrite else None
    todo, held_back = _ledgers_to_read(view, cutoff, MIN_ID if rewrite else view.tail_start(MIN_ID), floor)
    compacted, files = _read_footers(meta, view, todo, opener, footers or rewrite)
    new, young = _new_slices(loc, todo, files, cutoff, floor)
    horizon = new[-1].file.record_id(new[-1].stop - 1) if new else previous.horizon
    dirty = sum(s.data_bytes() for s in new)
    # Entry bytes on both sides (footers excluded), so the ratio compares like with like.
    # (records a deletion vector removed do not count as live)
    live = dirty + sum(int(s.data_bytes() * (s.part.live / s.part.records if s.part and s.part.records else 1))
                       for s in compacted)
    dictionaries = meta.dictionaries.all() if view.topic.dictionaries else ()
    return Plan(view.topic, previous, tuple(compacted), tuple(new), horizon, dirty, live, held_back + young, loc,
                dictionaries)


def _ledgers_to_read(view: TopicView, cutoff: int, start: MessageId,
                     floor: MessageId | None = None) -> tuple[list[Segment], int]:
    """The original ledgers of ``view`` from ``start`` up to the first one holding a
    record published after ``cutoff`` (too young to compact) and past ``floor``, and the
    records of the ledgers after that one."""
    todo: list[Segment] = []
    ledgers = list(view.ledgers(start))
    for i, seg in enumerate(ledgers):
        todo.append(seg)
        if _ledger(seg).last_publish > cutoff and (floor is None or seg.ledger_id > floor.ledger):
            return todo, sum(_ledger(later).records for later in ledgers[i + 1:])
    return todo, 0


def _read_footers(meta: TopicMetadata, view: TopicView, todo: list[Segment],
                  opener: Callable[[str, int | None, int], LedgerFile], footers: bool
                  ) -> tuple[list[Slice], list[LedgerFile | None]]:
    """The previous parts as slices, and the footers of the ledgers ``todo``: every one
    with ``footers``; else none of the parts', and only those of the ledger the previous
    horizon lies in (to find the record after it) and of the last ledger (to cut it at
    the lag and name the new horizon)."""
    loc = meta.topic
    parts = list(view.parts())

    def open_part(seg: Segment) -> Slice:
        f = opener(loc.key(seg.object), seg.ledger_id, KIND_COMPACTED)
        return Slice(f, 0, f.n_records, True, seg.part, seg.deleted(meta, f.n_records), _ref(loc, seg))

    needed = [footers or seg.starts_inside or i == len(todo) - 1 for i, seg in enumerate(todo)]

    def read_all(mapper: Callable[..., Iterator[Any]]) -> tuple[list[Slice], list[LedgerFile | None]]:
        if footers:
            parts_opened = mapper(open_part, parts)  # all submitted at once, both lists
        ledgers_opened = mapper(lambda i_seg: opener(loc.key(i_seg[1].object), i_seg[1].ledger_id, KIND_ORIGINAL)
                                if needed[i_seg[0]] else None, enumerate(todo))
        compacted = list(parts_opened) if footers else [
            Slice(None, 0, seg.records, True, seg.part, None, _ref(loc, seg)) for seg in parts]
        return compacted, list(ledgers_opened)

    reading = [*(parts if footers else []), *(seg for seg, need in zip(todo, needed, strict=True) if need)]
    if len(reading) <= 1 or (loc.store.reads_are_local
                             and sum(seg.records for seg in reading) <= INLINE_FOOTER_RECORDS):
        return read_all(map)  # one footer, or a small topic's on local storage: read here, no thread started
    from concurrent.futures import ThreadPoolExecutor

    # Footers are read several at a time: object stores answer each read with latency,
    # and decoding a big footer is mostly NumPy work that leaves the interpreter lock.
    reads = min(FOOTER_READS, available_cpus()) if loc.store.reads_are_local else FOOTER_READS
    with ThreadPoolExecutor(max_workers=reads, thread_name_prefix="shale-footer") as pool:
        return read_all(pool.map)


def _new_slices(loc: Location, todo: list[Segment], files: list[LedgerFile | None],
                cutoff: int, floor: MessageId | None = None) -> tuple[list[Slice], int]:
    """The records of ``todo`` this run reads, and how many of their records it leaves
    because they, or records before them, are younger than the lag allows (never those
    up to ``floor``)."""
    new: list[Slice] = []
    held_back = 0
    for seg, f in zip(todo, files, strict=True):
        start = seg.span(f)[0] if f is not None else 0
        stop = _ledger(seg).records if f is None else f.n_records
        if f is not None and _ledger(seg).last_publish > cutoff:
            # Only entries published at or before the cutoff, and nothing after the first
            # entry that is too young: the horizon must not skip over a record.
            young = np.nonzero(f.footer.col("e_publish") > cutoff)[0]
            first_young = int(young[0]) if len(young) else f.n_entries
            stop = max(start, int(f.footer.e_rec_start[first_young]))
            if floor is not None and seg.ledger_id <= floor.ledger:
                stop = max(stop, min(f.n_records, f.find(floor) + 1))
            held_back += f.n_records - stop
        if stop > start:
            new.append(Slice(f, start, stop, False, ref=_ref(loc, seg)))
    return new, held_back


def _ledger(seg: Segment) -> LedgerInfo:
    if seg.ledger is None:
        raise ValueError("an original ledger's segment describes its ledger")
    return seg.ledger


def _ref(loc: Location, seg: Segment) -> ObjectRef:
    """Where the segment's object is, as the metadata describes it."""
    d = seg.part if seg.part is not None else _ledger(seg)
    return ObjectRef(loc.key(seg.object), seg.ledger_id, seg.kind, d.records, d.bytes, d.uncompressed_bytes)


def open_slice(meta: TopicMetadata, s: Slice) -> Slice:
    """``s`` with its footer (and its part's deletion vector) read, if it was planned without."""
    if s.opened is not None:
        return s
    ref = s.object
    f = LedgerFile.open(meta.topic.store, ref.key, ledger_id=ref.ledger_id, kind=ref.kind,
                        dictionaries=meta.dictionaries)
    gone = None
    if s.part is not None and s.part.deletions:
        gone = read_deletions(meta.topic.store, meta.topic.key(s.part.deletions), f.n_records)[s.start:s.stop]
    return dataclasses.replace(s, opened=f, gone=gone)
