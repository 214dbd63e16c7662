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

Retention may remove ledgers a stopped or lagging query had yet to read (its checkpoint's
offset, or the batch it re-runs, lies at or below the topic's ``removed_through``): the
query then fails naming the range (:class:`~shale.ledger.errors.GapError`), unless the
option ``failOnDataLoss`` is ``false`` (Kafka's source has the same option), when it logs
a warning and goes on with the oldest records left.  A batch's end offset is the end of a
ledger (``L:E:0``, ``E`` its entry count), so a query that read a ledger whole loses nothing
when that ledger goes; a ``start`` id at or below a removed ledger is refused when the
query begins.  ``earliest`` starts at the oldest record left.

``trigger(availableNow=True)`` reads what the topic holds when the query starts, up to the
end of the last ledger registered then, in batches of ``maxRecordsPerTrigger``, and stops;
a restarted query first re-runs the batch it had not committed, then reads on to that end.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from shale.ledger.errors import InvalidInputError, ObjectNotFoundError
from shale.ledger.format import KIND_ORIGINAL
from shale.ledger.ids import MIN_ID, MessageId
from shale.metadata.state import LedgerInfo, TopicState
from shale.metadata.view import TopicView
from shale.reader.gaps import Gap, log_gap, log_start
from shale.reader.splits import plan_splits
from shale.reader.topic_reader import EARLIEST, LATEST, parse_position
from shale.spark.source import ReadOptions, SplitPartition, read_partition

__all__ = ["ShaleStreamReader"]

_REMEDY = "option failOnDataLoss=false goes on there"


class ShaleStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: ReadOptions, options: Mapping[str, str]) -> None:
        self.opts = opts
        self.start = str(options.get("start", EARLIEST))
        limit = options.get("maxRecordsPerTrigger")
        try:
            self.max_records = int(str(limit)) if limit is not None else None
        except ValueError:
            raise InvalidInputError(f"option maxRecordsPerTrigger={limit!r}: expected a whole number") from None
        if self.max_records is not None and self.max_records < 1:
            raise InvalidInputError("option maxRecordsPerTrigger: must be at least 1")
        loss = str(options.get("failOnDataLoss", "true")).strip().lower()
        if loss not in ("true", "1", "yes", "false", "0", "no"):
            raise InvalidInputError(f"option failOnDataLoss={loss!r}: expected true or false")
        #: fail the query when records it had yet to read were removed (else: a warning, and on)
        self.fail_on_data_loss = loss in ("true", "1", "yes")
        #: under ``availableNow``: the end of the topic when the query started, read no further
        self.target: MessageId | None = None

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the end an ``availableNow`` query reads to: the end of the last ledger
        registered now.  Without it Spark would read everything in one batch, whatever
        ``maxRecordsPerTrigger`` says."""
        self.target = self._end_of_topic()

    def _end_of_topic(self) -> MessageId:
        topic = self.opts.meta().load_topic()
        last = topic.ledgers[-1] if topic.ledgers else None
        return MessageId(last.id, last.entries, 0) if last else log_start(topic)

    def initialOffset(self) -> dict[str, Any]:
        position = parse_position(self.start)
        if position == LATEST:
            return {"next": str(self._end_of_topic()), "view": False}
        if position == EARLIEST:
            # the oldest record left (a compacted stream reads the whole view first)
            start = MIN_ID if self.opts.compacted else log_start(self.opts.meta().load_topic())
            return {"next": str(start), "view": self.opts.compacted}
        offset = {"next": str(position), "view": self.opts.compacted}
        self._check_loss(offset, exact=True)
        return offset

    def _lost(self, topic: TopicState, offset: dict[str, Any], *, exact: bool = False) -> Gap | None:
        """The records from ``offset`` on that retention removed, if any (the view's rule,
        :meth:`~shale.metadata.view.TopicView.removed_from`).  Unless ``exact`` (a ``start``
        id), an offset ``L:E:0`` with ``E`` > 0 is a batch's end, past ledger ``L``.  A
        ``view`` offset reads the compacted view first, which holds what it covers of the
        removed ledgers (:meth:`~shale.metadata.view.TopicView.uncovered`)."""
        if topic.removed_through < 1:
            return None
        position = MessageId.parse(str(offset["next"]))
        first = position
        if not exact and position.entry > 0 and position.batch == 0:
            first = MessageId(position.ledger + 1, 0, 0)
        compacted = bool(offset.get("view"))
        if compacted and position == MIN_ID:
            return None  # earliest: the view, then the tail; what went before the query began is no gap
        view = TopicView(topic, self.opts.meta().load_compaction() if compacted else None)
        gone = view.removed_from(view.tail_start(first))
        if gone is not None and compacted:
            gone = view.uncovered(gone)
        if gone is None:
            return None
        return Gap(self.opts.meta().uri, gone.first, gone.through, horizon=gone.horizon if compacted else None,
                   uncovered=compacted, remedy=_REMEDY)

    def _check_loss(self, offset: dict[str, Any], topic: TopicState | None = None, *, exact: bool = False,
                    warn: bool = True) -> Gap | None:
        """Fail on records lost from ``offset`` (or, with ``failOnDataLoss`` false, warn)."""
        gap = self._lost(topic or self.opts.meta().load_topic(), offset, exact=exact)
        if gap is not None:
            if self.fail_on_data_loss:
                raise gap.error()
            if warn:
                log_gap(replace(gap, how="skipped"))
        return gap

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.max_records is None else ReadMaxRows(self.max_records)

    def latestOffset(self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None) -> dict[str, Any]:
        start = start or self.initialOffset()
        position = MessageId.parse(start["next"])
        meta = self.opts.meta()
        topic = meta.load_topic()
        gap = self._check_loss(start, topic)
        ahead = [lg for lg in topic.ledgers if MessageId(lg.id, lg.entries, 0) > position
                 and (self.target is None or MessageId(lg.id, lg.entries, 0) <= self.target)]
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        taken: list[LedgerInfo] = []
        records = 0
        if start.get("view"):
            view = TopicView(topic, meta.load_compaction())
            if view.holds(position):
                # The first batch reads the compacted view whole, so it ends past the horizon:
                # at the end of the first ledger wholly above it.
                records = view.compacted_records
                above = {lg.id for lg in view.ledgers_wholly_above()}
                taken = [lg for lg in ahead if lg.id not in above]
                ahead = ahead[len(taken):]
        for lg in ahead:
            if budget is not None and taken and records >= budget:
                break
            taken.append(lg)
            records += lg.records
        if not taken:
            if gap is not None and not start.get("view"):
                # past what is gone even with nothing new: the warning is given once
                return {"next": str(gap.resume), "view": False}
            return start
        last = taken[-1]
        return {"next": str(MessageId(last.id, last.entries, 0)), "view": False}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[SplitPartition]:
        if start == end:
            return []
        meta = self.opts.meta()
        topic = meta.load_topic()
        # a batch re-run after a restart: its ledgers may have been removed since it was planned
        self._check_loss(start, topic, warn=False)
        splits = plan_splits(meta, compacted=bool(start.get("view")), start=MessageId.parse(start["next"]),
                             end=MessageId.parse(end["next"]), max_records=self.opts.split_records, topic=topic)
        return [SplitPartition(s) for s in splits]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, SplitPartition)
        split = partition.split
        try:
            yield from read_partition(self.opts, split)
        except ObjectNotFoundError:
            # removed and collected between planning and reading: data lost, not a damaged topic
            topic = self.opts.meta().load_topic()
            if split.kind != KIND_ORIGINAL or topic.ledger(split.ledger_id) is not None:
                raise
            first = max(MessageId.parse(split.start), MessageId(split.ledger_id, 0, 0))
            gap = Gap(self.opts.meta().uri, first, split.ledger_id, remedy=_REMEDY)
            if self.fail_on_data_loss:
                raise gap.error() from None
            log_gap(replace(gap, how="skipped"))

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: a topic keeps its records whether or not a stream read them."""
