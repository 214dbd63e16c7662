"""A topic cut into independent splits, for engines that read in parallel (Spark).

:func:`plan_splits` reads only metadata and cuts the records with ids in ``[start, end)``
into :class:`Split`\\ s, one per segment of the topic's view
(:class:`~shale.metadata.view.TopicView`): one per compacted part (below the horizon, when
reading the compacted view), and one per slice of at most ``max_records`` records of each
original ledger above it.  :func:`read_split` reads one split as Arrow record batches, anywhere the
topic's store is reachable.  Reading every split of a plan, in plan order, gives what a
:class:`~shale.reader.TopicReader` positioned at ``start`` gives up to ``end``: no gap, no
duplicate.  Records retention removed are not a split: a read from an id at or below a
removed ledger reads what is left (the streaming source checks for lost records itself).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from shale.ledger.ids import MIN_ID, MessageId
from shale.ledger.reader import LedgerFile
from shale.ledger.values import dataclass
from shale.metadata.state import CompactionState, TopicState
from shale.metadata.topic import TopicMetadata
from shale.metadata.view import Segment, TopicView
from shale.reader.arrow import DEFAULT_MAX_BATCH_BYTES, BatchReader

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["DEFAULT_SPLIT_RECORDS", "Split", "open_split", "plan_splits", "read_split", "split_records"]

#: Records per split of an original ledger unless asked otherwise.
DEFAULT_SPLIT_RECORDS = 1_000_000


@dataclass(frozen=True, slots=True)
class Split:
    """Records ``[first, stop)`` (record indexes) of one object, with ids in
    ``[start, end)`` (``L:E:B`` texts; ``end`` empty: no bound); ``arrow_cache``: a
    compacted part's Arrow cache, which the split is read from (:mod:`shale.ledger.arrow_cache`)."""

    object: str
    ledger_id: int
    kind: int
    first: int
    stop: int
    start: str
    end: str
    deletions: str | None = None
    arrow_cache: str | None = None

    @property
    def records(self) -> int:
        """How many records the split spans at most."""
        return self.stop - self.first

    @property
    def segment(self) -> Segment:
        """The segment of the view this split reads."""
        return Segment(self.object, self.ledger_id, self.kind, self.first, self.stop, MessageId.parse(self.start),
                       MessageId.parse(self.end) if self.end else None, self.deletions)

    @classmethod
    def of(cls, segment: Segment) -> Split:
        """The split that reads ``segment``."""
        return cls(segment.object, segment.ledger_id, segment.kind, segment.first, segment.stop, str(segment.start),
                   "" if segment.end is None else str(segment.end), segment.deletions,
                   segment.part.arrow_cache if segment.part is not None else None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_splits(meta: TopicMetadata, *, compacted: bool, start: MessageId = MIN_ID, end: MessageId | None = None,
                max_records: int = DEFAULT_SPLIT_RECORDS, topic: TopicState | None = None,
                compaction: CompactionState | None = None) -> list[Split]:
    """The splits of the records with ids in ``[start, end)`` (``end`` None: to the end of
    the topic as it is), reading the compacted view first when ``compacted``."""
    topic = topic or meta.load_topic()
    view = TopicView(topic, (compaction or meta.load_compaction()) if compacted else None)
    return [Split.of(seg) for seg in view.segments(start, end, max_records=max_records)
            if isinstance(seg, Segment) and seg.records > 0]


def split_records(meta: TopicMetadata, f: LedgerFile, split: Split) -> npt.NDArray[np.int64]:
    """The record indexes of ``f`` (the split's object, opened) that ``split`` reads: its
    range, within its ids, less the records its deletion vector removes."""
    return split.segment.live(meta, f)


def open_split(meta: TopicMetadata, split: Split) -> LedgerFile:
    """The split's object, opened (its footer read and checked)."""
    return split.segment.open(meta)


def read_split(meta: TopicMetadata, split: Split, *, rows: int | None = None, utf8: bool = False,
               id_text: bool = False, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> Iterator[pa.RecordBatch]:
    """The records of ``split`` as Arrow record batches of at most ``max_batch_bytes``
    bytes of records (and ``rows`` rows, when given), decoded on one thread (needs pyarrow)."""
    f = open_split(meta, split)
    f.arrow_cache = meta.topic.key(split.arrow_cache) if split.arrow_cache else None
    with BatchReader(1, max_batch_bytes=max_batch_bytes, rows=rows, utf8=utf8, id_text=id_text) as reader:
        yield from reader.batches(f, split_records(meta, f, split))
