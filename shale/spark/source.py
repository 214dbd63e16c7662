"""The ``shale`` PySpark data source: batch reads and writes (streaming: :mod:`.stream`).

A batch read with ``table`` gives the topic's table, the latest record of every live key
as ``shale read --table`` gives it (:mod:`shale.reader.latest`): the driver plans it from
the footers, under the topic's order and key TTL, and each task reads its share of the
chosen records.  ``asOf`` (an epoch, a time, a message id or a tag) reads the topic as it
was at that point, nothing written later (:mod:`shale.metadata.asof`), its table too;
``fromSnapshot`` (an epoch) a retained snapshot's view and everything since.
``changesFrom`` (and ``changesTo``, default now) reads the changes between two points
instead (:mod:`shale.reader.changes`): a row per key whose state differs, with an ``op``
column, ``upsert`` or ``delete``.

Everything a task needs travels in the reader or writer object Spark pickles to it: the
topic's URI, the options, and the storage options the source was registered with
(:class:`~shale.storage.StorageOptions`, never printed; nothing is written to a task's
environment).  Tasks read and write the topic's store directly; the driver only plans
(metadata) and registers.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from shale.compactor.units import parse_size
from shale.ledger.errors import InvalidInputError, InvalidURIError, ShaleError
from shale.ledger.ids import MIN_ID
from shale.ledger.record import DEFAULT_MAX_RECORD_BYTES
from shale.ledger.values import dataclass
from shale.metadata.asof import AsOf, parse_point, resolve_point
from shale.metadata.topic import TopicMetadata
from shale.producer.columns import shift_rows
from shale.producer.staging import (
    StagedLedger,
    StagingWriter,
    discard_staged,
    finish_write,
    new_write_id,
    register_staged,
)
from shale.reader.arrow import DEFAULT_BATCH_ROWS, DEFAULT_MAX_BATCH_BYTES, BatchReader
from shale.reader.latest import plan_latest
from shale.reader.splits import DEFAULT_SPLIT_RECORDS, Split, plan_splits, read_split
from shale.reader.topic_reader import EARLIEST, LATEST, parse_position
from shale.storage import StorageOptions

__all__ = ["ChangePartition", "ShaleDataSource", "SplitPartition", "TablePartition"]

_TRUE = ("true", "1", "yes")


def _flag(options: Mapping[str, str], name: str) -> bool:
    value = str(options.get(name, "false")).strip().lower()
    if value not in (*_TRUE, "false", "0", "no"):
        raise InvalidInputError(f"option {name}={value!r}: expected true or false")
    return value in _TRUE


def _int(options: Mapping[str, str], name: str, default: int) -> int:
    value = options.get(name)
    if value is None:
        return default
    try:
        n = int(str(value))
    except ValueError:
        raise InvalidInputError(f"option {name}={value!r}: expected a whole number") from None
    if n < 1:
        raise InvalidInputError(f"option {name}={value!r}: must be at least 1")
    return n


def _point(options: Mapping[str, str], name: str) -> AsOf | None:
    """A point option (``asOf``, ``changesFrom``, ``changesTo``): an epoch, a time, a
    message id or a tag (None when not given)."""
    value = options.get(name)
    if value is None:
        return None
    try:
        return parse_point(str(value))
    except InvalidInputError as e:
        raise InvalidInputError(f"option {name}: {e}") from None


def _size(options: Mapping[str, str], name: str, default: int) -> int:
    """A size option (``64MiB``, ``1GB`` or plain bytes), at least one byte."""
    value = options.get(name)
    if value is None:
        return default
    try:
        n = parse_size(str(value))
    except InvalidInputError as e:
        raise InvalidInputError(f"option {name}={value!r}: {e}") from None
    if n < 1:
        raise InvalidInputError(f"option {name}={value!r}: must be at least 1 byte")
    return n


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """What a read asks for (the ``option(...)`` values of ``spark.read.format("shale")``)."""

    uri: str
    metadata: str | None
    compacted: bool
    utf8: bool
    id_text: bool
    split_records: int
    batch_rows: int
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    #: how to reach the topic's storage (None: the environment of the process opening it)
    storage: StorageOptions | None = None
    #: the topic's table: the latest record of every live key (a batch read from the start)
    table: bool = False
    #: read the topic as it was at this point (None: as it is)
    as_of: AsOf | None = None
    #: read this retained snapshot's compacted view and everything since (an epoch)
    from_snapshot: int | str | None = None
    #: read the changes from this point (to ``changes_to``, None: now) instead of records
    changes_from: AsOf | None = None
    changes_to: AsOf | None = None

    @classmethod
    def of(cls, options: Mapping[str, str]) -> ReadOptions:
        uri = options.get("path") or options.get("uri")
        if not uri:
            raise InvalidURIError("no topic: load(\"<topic-uri>\") or option(\"path\", ...)")
        as_of = _point(options, "asOf")
        snap = _point(options, "fromSnapshot")
        if snap is not None and (isinstance(snap, bool) or not isinstance(snap, (int, str))):
            raise InvalidInputError("option fromSnapshot: give an epoch or a tag")
        since, until = _point(options, "changesFrom"), _point(options, "changesTo")
        if sum(x is not None for x in (as_of, snap, since)) > 1:
            raise InvalidInputError("give one of the options asOf, fromSnapshot and changesFrom")
        if until is not None and since is None:
            raise InvalidInputError("option changesTo goes with changesFrom")
        return cls(str(uri), options.get("metadata"), _flag(options, "compacted") or as_of is not None
                   or snap is not None, _flag(options, "utf8"), _flag(options, "idText"),
                   _int(options, "splitRecords", DEFAULT_SPLIT_RECORDS), _int(options, "batchRows", DEFAULT_BATCH_ROWS),
                   _size(options, "maxBatchBytes", DEFAULT_MAX_BATCH_BYTES), table=_flag(options, "table"),
                   as_of=as_of, from_snapshot=snap, changes_from=since, changes_to=until)

    def ddl(self) -> str:
        data = "string" if self.utf8 else "binary"
        return ", ".join([*(["op string"] if self.changes_from is not None else []),
                          *(["id string"] if self.id_text else []), "ledger long", "entry long", "batch int",
                          f"key {data}", f"value {data}", "properties map<string,string>",
                          "publish_time timestamp", "event_time timestamp", "tombstone boolean"])

    def meta(self) -> TopicMetadata:
        return TopicMetadata.open(self.uri, self.metadata, self.storage)


class SplitPartition(InputPartition):
    """One :class:`~shale.reader.splits.Split`, as a Spark input partition."""

    def __init__(self, split: Split) -> None:
        super().__init__(split.to_dict())

    @property
    def split(self) -> Split:
        return Split(**self.value)


class TablePartition(InputPartition):
    """Some of the records of one object that are in the topic's table (their indexes,
    rising, as unsigned 32-bit integers: an object holds fewer than 2**32 records)."""

    def __init__(self, split: Split, records: bytes) -> None:
        super().__init__((split.to_dict(), records))

    @property
    def split(self) -> Split:
        return Split(**self.value[0])

    @property
    def records(self) -> Any:
        return np.frombuffer(self.value[1], dtype=np.uint32).astype(np.int64)


def plan_table(opts: ReadOptions) -> list[TablePartition]:
    """The driver's work for a ``table`` read: pass one of the table (footers only, the
    key TTL counted from now, read once), its chosen records cut into partitions of at
    most ``splitRecords`` records."""
    plan = plan_latest(opts.meta(), now_ms=None if opts.as_of is not None else int(time.time() * 1000),
                       as_of=opts.as_of, from_snapshot=opts.from_snapshot)
    out = []
    for chosen in plan.chosen:
        split = Split.of(chosen.segment)
        for a in range(0, len(chosen.records), opts.split_records):
            out.append(TablePartition(split, chosen.records[a:a + opts.split_records].astype(np.uint32).tobytes()))
    return out


class ChangePartition(TablePartition):
    """Records of one object that make changes between two points, all of one ``op``."""

    def __init__(self, split: Split, records: bytes, op: str) -> None:
        InputPartition.__init__(self, (split.to_dict(), records, op))

    @property
    def op(self) -> str:
        return str(self.value[2])


def plan_change_partitions(opts: ReadOptions) -> list[ChangePartition]:
    """The driver's work for a ``changesFrom`` read (:func:`~shale.reader.changes.plan_changes`),
    its records cut into partitions of at most ``splitRecords`` records."""
    from shale.reader.changes import plan_changes

    assert opts.changes_from is not None
    plan = plan_changes(opts.meta(), opts.changes_from, opts.changes_to)
    out = []
    for op, chosen in (("upsert", plan.upserts), ("delete", plan.deletes)):
        for c in chosen:
            split = Split.of(c.segment)
            for a in range(0, len(c.records), opts.split_records):
                out.append(ChangePartition(split, c.records[a:a + opts.split_records].astype(np.uint32).tobytes(), op))
    return out


def read_change_partition(opts: ReadOptions, partition: ChangePartition) -> Iterator[Any]:
    """A task's work for a ``changesFrom`` read: its records with their ``op`` (a delete
    keeps only its key)."""
    import pyarrow as pa

    from shale.reader.changes import constant_text

    target = _arrow_schema(opts)
    f = partition.split.segment.open(opts.meta())
    with BatchReader(1, max_batch_bytes=opts.max_batch_bytes, rows=opts.batch_rows, utf8=opts.utf8,
                     id_text=opts.id_text) as reader:
        for batch in reader.batches(f, partition.records):
            n = batch.num_rows
            cols = [constant_text(pa, partition.op, n)]
            for field in target:
                if field.name == "op":
                    continue
                keep = partition.op == "upsert" or field.name == "key"
                cols.append(batch.column(field.name).cast(field.type) if keep else pa.nulls(n, field.type))
            yield pa.RecordBatch.from_arrays(cols, schema=target)


def read_table_partition(opts: ReadOptions, partition: TablePartition) -> Iterator[Any]:
    """A task's work for a ``table`` read: its records, as Arrow batches of Spark's column types."""
    target = _arrow_schema(opts)
    meta = opts.meta()
    f = partition.split.segment.open(meta)
    with BatchReader(1, max_batch_bytes=opts.max_batch_bytes, rows=opts.batch_rows, utf8=opts.utf8,
                     id_text=opts.id_text) as reader:
        for batch in reader.batches(f, partition.records):
            yield batch.cast(target)


def _arrow_schema(opts: ReadOptions) -> Any:
    """The Arrow types Spark takes for the columns of :meth:`ReadOptions.ddl`."""
    import pyarrow as pa

    data = pa.string() if opts.utf8 else pa.binary()
    ts = pa.timestamp("us", tz="UTC")
    return pa.schema([*([("op", pa.string())] if opts.changes_from is not None else []),
                      *([("id", pa.string())] if opts.id_text else []),
                      ("ledger", pa.int64()), ("entry", pa.int64()), ("batch", pa.int32()),
                      ("key", data), ("value", data), ("properties", pa.map_(pa.string(), pa.string())),
                      ("publish_time", ts), ("event_time", ts), ("tombstone", pa.bool_())])


def read_partition(opts: ReadOptions, split: Split) -> Iterator[Any]:
    """A task's work: the split's records as Arrow batches of Spark's column types."""
    target = _arrow_schema(opts)
    for batch in read_split(opts.meta(), split, rows=opts.batch_rows, utf8=opts.utf8, id_text=opts.id_text,
                            max_batch_bytes=opts.max_batch_bytes):
        yield batch.cast(target)


class ShaleBatchReader(DataSourceReader):
    def __init__(self, opts: ReadOptions, start: str) -> None:
        self.opts = opts
        self.start = start

    def partitions(self) -> list[InputPartition]:
        if self.opts.changes_from is not None:
            if self.opts.table or parse_position(self.start) != EARLIEST:
                raise InvalidInputError("option changesFrom reads the changes between two points: it takes no table "
                                        "nor start")
            return list(plan_change_partitions(self.opts))
        if self.opts.table:
            if parse_position(self.start) != EARLIEST:
                raise InvalidInputError("option table reads every key: it takes no start")
            return list(plan_table(self.opts))
        meta = self.opts.meta()
        topic = meta.load_topic()
        position = parse_position(self.start)
        if position == LATEST:
            return []
        start = MIN_ID if position == EARLIEST else position
        view, end = None, None
        if self.opts.as_of is not None:
            point = resolve_point(meta, topic, meta.load_compaction(), self.opts.as_of)
            view, end = point.base, point.end
        elif self.opts.from_snapshot is not None:
            view = meta.load_compaction_as_of(self.opts.from_snapshot)
        return [SplitPartition(s) for s in plan_splits(meta, compacted=self.opts.compacted, start=start, end=end,
                                                      max_records=self.opts.split_records, topic=topic,
                                                      compaction=view)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if isinstance(partition, ChangePartition):
            return read_change_partition(self.opts, partition)
        if isinstance(partition, TablePartition):
            return read_table_partition(self.opts, partition)
        assert isinstance(partition, SplitPartition)
        return read_partition(self.opts, partition.split)


# ------------------------------------------------------------------------- writing


@dataclass
class StagedMessage(WriterCommitMessage):
    """What one task wrote: its staged ledgers."""

    staged: list[StagedLedger]


class ShaleWriter(DataSourceArrowWriter):
    """Each task stages its ledgers; the driver registers them all (commit) or deletes
    them (abort), and with them whatever tasks it did not hear from staged, or stage
    later (:func:`~shale.producer.staging.finish_write`)."""

    def __init__(self, options: Mapping[str, str], schema: StructType, storage: StorageOptions) -> None:
        uri = options.get("path") or options.get("uri")
        if not uri:
            raise InvalidURIError("no topic: save(\"<topic-uri>\") or option(\"path\", ...)")
        self.uri, self.metadata = str(uri), options.get("metadata")
        names = set(schema.fieldNames())
        self.key = options.get("keyField", "key")
        self.value = options.get("valueField", "value")
        for role, column in (("keyField", self.key), ("valueField", self.value)):
            if column not in names:
                raise InvalidInputError(f"no column {column!r} in the DataFrame (its columns: "
                                        f"{', '.join(schema.fieldNames())}); name it with option({role!r}, ...)")
        self.properties = options.get("propertiesField", "properties" if "properties" in names else None)
        self.event_time = options.get("eventTimeField", "event_time" if "event_time" in names else None)
        self.compression = options.get("compression")
        self.batch_size = _int(options, "batchSize", 1000)
        self.max_ledger_records = _int(options, "maxLedgerRecords", 500_000)
        self.max_record_bytes = _int(options, "maxRecordBytes", DEFAULT_MAX_RECORD_BYTES)
        #: how to reach the topic's storage, here and in every task
        self.storage = storage
        meta = TopicMetadata.open(self.uri, self.metadata, storage)
        self.base = meta.create_topic().last_ledger_id + 1
        self.write_id = new_write_id()

    def write(self, iterator: Iterator[Any]) -> StagedMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        w = StagingWriter(self.uri, base=self.base, partition=partition, write=self.write_id,
                          metadata_uri=self.metadata, compression=self.compression, batch_size=self.batch_size,
                          max_ledger_records=self.max_ledger_records, max_record_bytes=self.max_record_bytes,
                          storage_options=self.storage)
        rows = 0
        try:
            for batch in iterator:
                try:
                    rows += w.append_batch(batch, key=self.key, value=self.value, properties=self.properties,
                                           event_time=self.event_time)
                except InvalidInputError as e:
                    raise type(e)(f"{self.uri}: partition {partition}, {shift_rows(str(e), rows)}") from None
            w.flush()
        except BaseException:
            w.discard()
            raise
        return StagedMessage(w.staged)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        staged = [s for m in messages if isinstance(m, StagedMessage) for s in m.staged]
        meta = TopicMetadata.open(self.uri, self.metadata, self.storage)
        try:
            register_staged(meta, staged)
        except BaseException:
            # (what cleaning up leaves is gc's: the failure to register is the news)
            with contextlib.suppress(ShaleError):
                discard_staged(meta, staged)
            with contextlib.suppress(ShaleError):
                finish_write(meta, self.write_id, self.base)
            raise
        # Registered: a failure to clean up leaves gc some leftovers, and must not fail the job.
        with contextlib.suppress(ShaleError):
            finish_write(meta, self.write_id, self.base, kept=staged)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        staged = [s for m in messages if isinstance(m, StagedMessage) for s in m.staged]
        meta = TopicMetadata.open(self.uri, self.metadata, self.storage)
        discard_staged(meta, staged)
        finish_write(meta, self.write_id, self.base)


# ------------------------------------------------------------------------- the source


class ShaleDataSource(DataSource):
    """``format("shale")``: see :mod:`shale.spark` and ``docs/spark.md``."""

    #: the storage options :func:`shale.spark.register` captured (none: this process's environment)
    storage: StorageOptions | None = None

    def _storage(self) -> StorageOptions:
        """The storage options, used here (the planning process) and sent to tasks."""
        return StorageOptions.from_environment() if self.storage is None else self.storage

    def _read_options(self) -> ReadOptions:
        return replace(ReadOptions.of(self.options), storage=self._storage())

    @classmethod
    def name(cls) -> str:
        return "shale"

    def schema(self) -> str:
        return ReadOptions.of(self.options).ddl()

    def reader(self, schema: StructType) -> DataSourceReader:
        return ShaleBatchReader(self._read_options(), str(self.options.get("start", EARLIEST)))

    def writer(self, schema: StructType, overwrite: bool) -> ShaleWriter:
        if overwrite:
            raise InvalidInputError("a Shale topic is append-only: write with mode(\"append\")")
        return ShaleWriter(self.options, schema, self._storage())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from shale.spark.stream import ShaleStreamReader

        opts = self._read_options()
        if opts.table:
            raise InvalidInputError("option table is for batch reads (a stream with compacted reads the latest "
                                    "value of every key first, then the tail)")
        if opts.as_of is not None or opts.from_snapshot is not None or opts.changes_from is not None:
            raise InvalidInputError("options asOf, fromSnapshot and changesFrom are for batch reads (a stream reads "
                                    "the published view)")
        return ShaleStreamReader(opts, self.options)
