"""A topic cut into independent splits, for engines that read in parallel (Spark).

:func:`plan_splits` reads only metadata and cuts the records with ids in ``[start, end)``
into :class:`Split`\\ s: one per compacted part (below the horizon, when reading the
compacted view), and one per slice of at most ``max_records`` records of each original
ledger above it.  :func:`read_split` reads one split as Arrow record batches, anywhere the
topic's store is reachable.  Reading every split of a plan, in plan order, gives what a
:class:`~shale.reader.TopicReader` positioned at ``start`` gives up to ``end``: no gap, no
duplicate.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from shale.ledger.deletions import read_deletions
from shale.ledger.format import KIND_COMPACTED, KIND_ORIGINAL
from shale.ledger.ids import MIN_ID, MessageId
from shale.ledger.reader import LedgerFile
from shale.metadata.state import CompactionState, TopicState
from shale.metadata.topic import TopicMetadata
from shale.reader.arrow import DEFAULT_MAX_BATCH_BYTES, BatchReader

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["DEFAULT_SPLIT_RECORDS", "Split", "open_split", "plan_splits", "read_split", "split_records"]

#: Records per split of an original ledger unless asked otherwise.
DEFAULT_SPLIT_RECORDS = 1_000_000


@dataclass(frozen=True, slots=True)
class Split:
    """Records ``[first, stop)`` (record indexes) of one object, with ids in
    ``[start, end)`` (``L:E:B`` texts; ``end`` empty: no bound)."""

    object: str
    ledger_id: int
    kind: int
    first: int
    stop: int
    start: str
    end: str
    deletions: str | None = None

    @property
    def records(self) -> int:
        """How many records the split spans at most."""
        return self.stop - self.first

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_splits(meta: TopicMetadata, *, compacted: bool, start: MessageId = MIN_ID, end: MessageId | None = None,
                max_records: int = DEFAULT_SPLIT_RECORDS, topic: TopicState | None = None,
                compaction: CompactionState | None = None) -> list[Split]:
    """The splits of the records with ids in ``[start, end)`` (``end`` None: to the end of
    the topic as it is), reading the compacted view first when ``compacted``."""
    topic = topic or meta.load_topic()
    bound = "" if end is None else str(end)
    splits: list[Split] = []
    position = start
    if compacted:
        state = compaction or meta.load_compaction()
        if state.horizon is not None and position <= state.horizon:
            for part in state.parts:
                if part.last_id is None or part.last_id < position or part.records == 0:
                    continue
                if end is not None and part.first_id is not None and part.first_id >= end:
                    continue
                splits.append(Split(part.object, state.part_ledger_id(part), KIND_COMPACTED, 0, part.records,
                                    str(position), bound, part.deletions))
            position = max(position, state.horizon.successor())
    for lg in topic.ledgers:
        if lg.id < position.ledger or (end is not None and lg.id > end.ledger) or lg.records == 0:
            continue
        if end is not None and lg.id == end.ledger and end.entry == 0 and end.batch == 0:
            continue
        for first in range(0, lg.records, max(1, max_records)):
            splits.append(Split(lg.object, lg.id, KIND_ORIGINAL, first, min(lg.records, first + max_records),
                                str(position), bound))
    return splits


def split_records(meta: TopicMetadata, f: LedgerFile, split: Split) -> npt.NDArray[np.int64]:
    """The record indexes of ``f`` (the split's object, opened) that ``split`` reads: its
    range, within its ids, less the records its deletion vector removes."""
    lo = max(split.first, f.find(MessageId.parse(split.start)))
    hi = min(split.stop, f.n_records)
    if split.end:
        hi = min(hi, f.find(MessageId.parse(split.end)))
    records = np.arange(lo, max(lo, hi), dtype=np.int64)
    if split.deletions:
        gone = read_deletions(meta.topic.store, meta.topic.key(split.deletions), f.n_records)
        records = records[~gone[records]]
    return records


def open_split(meta: TopicMetadata, split: Split) -> LedgerFile:
    """The split's object, opened (its footer read and checked)."""
    return LedgerFile.open(meta.topic.store, meta.topic.key(split.object), ledger_id=split.ledger_id,
                           kind=split.kind, dictionaries=meta.dictionaries)


def read_split(meta: TopicMetadata, split: Split, *, rows: int | None = None, utf8: bool = False,
               id_text: bool = False, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> Iterator[pa.RecordBatch]:
    """The records of ``split`` as Arrow record batches of at most ``max_batch_bytes``
    bytes of records (and ``rows`` rows, when given), decoded on one thread (needs pyarrow)."""
    f = open_split(meta, split)
    with BatchReader(1, max_batch_bytes=max_batch_bytes, rows=rows, utf8=utf8, id_text=id_text) as reader:
        yield from reader.batches(f, split_records(meta, f, split))
