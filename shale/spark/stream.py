"""``spark.readStream.format("shale")``: a Structured Streaming source over a topic.

An offset is a position: ``{"next": "L:E:B", "view": bool}``, the id the next micro-batch
starts from and, for the first batch of a ``compacted`` stream, whether it reads the
compacted view first (Pulsar's ``readCompacted`` for a stream: the latest value of every
key, then the tail).  A micro-batch's end is always the end of a registered ledger, so
the records of ``[start, end)`` are fixed once planned: a query restarted from its
checkpoint re-reads exactly the batches it had not committed.  ``maxRecordsPerTrigger``
caps a batch at the ledgers that hold about that many records (at least one ledger).

The first batch of a compacted stream reads the compacted view as published when it is
planned; were it re-run after a newer compaction, it reads that one (the same keys' latest
values as of a later horizon, never fewer records than the topic holds).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from shale.compactor.spark.environment import ForwardedEnvironment
from shale.ledger.errors import InvalidInputError
from shale.ledger.ids import MIN_ID, MessageId
from shale.metadata.state import LedgerInfo
from shale.reader.splits import plan_splits
from shale.reader.topic_reader import EARLIEST, LATEST, parse_position
from shale.spark.source import ReadOptions, SplitPartition, read_partition

__all__ = ["ShaleStreamReader"]


class ShaleStreamReader(DataSourceStreamReader):
    def __init__(self, opts: ReadOptions, options: Mapping[str, str], env: ForwardedEnvironment) -> None:
        self.opts = opts
        self.env = env
        self.start = str(options.get("start", EARLIEST))
        limit = options.get("maxRecordsPerTrigger")
        try:
            self.max_records = int(str(limit)) if limit is not None else None
        except ValueError:
            raise InvalidInputError(f"option maxRecordsPerTrigger={limit!r}: expected a whole number") from None
        if self.max_records is not None and self.max_records < 1:
            raise InvalidInputError("option maxRecordsPerTrigger: must be at least 1")

    def _end_of_topic(self) -> MessageId:
        self.env.apply()
        topic = self.opts.meta().load_topic()
        last = topic.ledgers[-1] if topic.ledgers else None
        return MessageId(last.id, last.entries, 0) if last else MIN_ID

    def initialOffset(self) -> dict[str, Any]:
        position = parse_position(self.start)
        if position == LATEST:
            return {"next": str(self._end_of_topic()), "view": False}
        start = MIN_ID if position == EARLIEST else position
        return {"next": str(start), "view": self.opts.compacted}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.max_records is None else ReadMaxRows(self.max_records)

    def latestOffset(self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None) -> dict[str, Any]:
        start = start or self.initialOffset()
        self.env.apply()
        position = MessageId.parse(start["next"])
        meta = self.opts.meta()
        ahead = [lg for lg in meta.load_topic().ledgers if MessageId(lg.id, lg.entries, 0) > position]
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        taken: list[LedgerInfo] = []
        records = 0
        if start.get("view"):
            state = meta.load_compaction()
            if state.horizon is not None and state.horizon >= position:
                # The first batch reads the compacted view whole, so it ends past the horizon.
                records = sum(part.live for part in state.parts)
                taken = [lg for lg in ahead if lg.id <= state.horizon.ledger]
                ahead = ahead[len(taken):]
        for lg in ahead:
            if budget is not None and taken and records >= budget:
                break
            taken.append(lg)
            records += lg.records
        if not taken:
            return start
        last = taken[-1]
        return {"next": str(MessageId(last.id, last.entries, 0)), "view": False}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[SplitPartition]:
        if start == end:
            return []
        self.env.apply()
        meta = self.opts.meta()
        splits = plan_splits(meta, compacted=bool(start.get("view")), start=MessageId.parse(start["next"]),
                             end=MessageId.parse(end["next"]), max_records=self.opts.split_records)
        return [SplitPartition(s) for s in splits]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, SplitPartition)
        return read_partition(self.opts, self.env, partition.split)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: a topic keeps its records whether or not a stream read them."""
