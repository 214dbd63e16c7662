"""Planning a run: which records are read, where the new horizon falls, how dirty the topic is.

A run reads the previous compacted ledger (its parts) and the original records above
the previous horizon, up to a new horizon bounded by the minimum compaction lag.
Nothing before the previous horizon is read again: the run's cost grows with new data
plus the compacted size, not with the topic's history.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shale.compactor.cpus import available_cpus
from shale.ledger.codecs import Dictionary
from shale.ledger.deletions import read_deletions
from shale.ledger.format import FRAME_HEADER, KIND_COMPACTED, KIND_ORIGINAL
from shale.ledger.ids import MessageId
from shale.ledger.reader import LedgerFile
from shale.ledger.storage import Location
from shale.metadata.state import CompactedPart, CompactionState, LedgerInfo, TopicState
from shale.metadata.topic import TopicMetadata

__all__ = ["Plan", "Slice", "make_plan"]

#: Footers read at a time while planning (at most one per CPU where reads are local).
FOOTER_READS = 8


@dataclass(frozen=True, slots=True, eq=False)
class Slice:
    """Records ``[start, stop)`` of one ledger object, read in this run."""

    file: LedgerFile
    start: int
    stop: int
    compacted: bool  # a part of the previous compacted ledger
    part: CompactedPart | None = None  # the part, when compacted
    gone: npt.NDArray[np.bool_] | None = None  # per record of the slice: deleted by a deletion vector

    @property
    def records(self) -> int:
        return self.stop - self.start

    def data_bytes(self) -> int:
        """Bytes of the entries this slice covers."""
        if self.stop <= self.start:
            return 0
        f = self.file.footer
        e0, e1 = int(f.entry_of(self.start)), int(f.entry_of(self.stop - 1))
        offs, lens = f.col("e_offset"), f.col("e_length")
        return int(offs[e1]) + int(lens[e1]) - int(offs[e0])

    def raw_data_bytes(self) -> int:
        """:meth:`data_bytes` were the entries stored uncompressed (what decompressing
        them all would give)."""
        if self.stop <= self.start or not self.file.footer.compressed:
            return self.data_bytes()
        f = self.file.footer
        e0, e1 = int(f.entry_of(self.start)), int(f.entry_of(self.stop - 1))
        return int(f.raw_lengths()[e0:e1 + 1].sum()) + FRAME_HEADER.size * (e1 + 1 - e0)


def dirty_ratio(dirty_bytes: float, compacted_live_bytes: float) -> float:
    """Kafka's dirty ratio: bytes above the horizon over all live bytes (those plus the
    live bytes of the compacted ledger); 0 when nothing is above the horizon."""
    total = dirty_bytes + compacted_live_bytes
    return dirty_bytes / total if dirty_bytes and total else 0.0


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
              open_file: Callable[[str, int | None, int], LedgerFile] | None = None) -> Plan:
    """Read both metadata documents and the footers needed to fix this run's range."""
    store, loc = meta.topic.store, meta.topic
    opener = open_file or (lambda key, lid, kind: LedgerFile.open(store, key, ledger_id=lid, kind=kind,
                                                                   dictionaries=meta.dictionaries))
    previous = meta.load_compaction()
    topic = meta.load_topic()
    prev_h = previous.horizon
    cutoff = now_ms - min_compaction_lag_ms

    # The ledgers this run reads: every previous part, then the ledgers above the
    # previous horizon up to the first one holding a record too young to compact.
    todo: list[LedgerInfo] = []
    held_back = 0
    for i, lg in enumerate(topic.ledgers):
        if prev_h is not None and lg.id < prev_h.ledger:
            continue
        todo.append(lg)
        if lg.last_publish > cutoff:
            held_back = sum(later.records for later in topic.ledgers[i + 1:])
            break

    def open_part(p: CompactedPart) -> Slice:
        f = opener(loc.key(p.object), previous.part_ledger_id(p), KIND_COMPACTED)
        gone = read_deletions(store, loc.key(p.deletions), f.n_records) if p.deletions else None
        return Slice(f, 0, f.n_records, True, p, gone)

    # Footers are read several at a time: object stores answer each read with latency,
    # and decoding a big footer is mostly NumPy work that leaves the interpreter lock.
    reads = min(FOOTER_READS, available_cpus()) if store.reads_are_local else FOOTER_READS
    with ThreadPoolExecutor(max_workers=reads, thread_name_prefix="shale-footer") as pool:
        parts_opened = pool.map(open_part, previous.parts)  # all submitted at once, both lists
        ledgers_opened = pool.map(lambda lg: opener(loc.key(lg.object), lg.id, KIND_ORIGINAL), todo)
        compacted, files = list(parts_opened), list(ledgers_opened)
    new: list[Slice] = []
    for lg, f in zip(todo, files, strict=True):
        start = f.find(prev_h.successor()) if prev_h is not None and lg.id == prev_h.ledger else 0
        stop = f.n_records
        if lg.last_publish > cutoff:
            # Only entries published at or before the cutoff, and nothing after the first
            # entry that is too young: the horizon must not skip over a record.
            young = np.nonzero(f.footer.col("e_publish") > cutoff)[0]
            first_young = int(young[0]) if len(young) else f.n_entries
            stop = max(start, int(f.footer.e_rec_start[first_young]))
            held_back += f.n_records - stop
        if stop > start:
            new.append(Slice(f, start, stop, False))
    horizon = new[-1].file.record_id(new[-1].stop - 1) if new else prev_h
    dirty = sum(s.data_bytes() for s in new)
    # Entry bytes on both sides (footers excluded), so the ratio compares like with like.
    # (records a deletion vector removed do not count as live)
    live = dirty + sum(int(s.data_bytes() * (s.part.live / s.part.records if s.part and s.part.records else 1))
                       for s in compacted)
    dictionaries = meta.dictionaries.all() if topic.dictionaries else ()
    return Plan(topic, previous, tuple(compacted), tuple(new), horizon, dirty, live, held_back, loc, dictionaries)
