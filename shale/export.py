"""``shale export``: a topic, its compacted view or its table (the latest value of every
key) as one Parquet, Arrow IPC or JSON-lines object, written wherever Shale writes (a local
path, ``s3://bucket/key``, any fsspec URI).

The object becomes visible only once it is complete (the store's streaming upload, a
local file linked or renamed into place); a failed export leaves nothing behind.  OUT
is never inside a topic, and never replaces anything but a regular file, and that only
when asked to (:mod:`shale.export_target`).  Parquet and Arrow
come from the reader's record batches (:mod:`shale.reader.arrow`: no Python object per
record), so DuckDB, Polars, pandas and Spark read the result directly.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

from shale.export_target import open_output
from shale.ledger.errors import InvalidInputError
from shale.ledger.reader import DEFAULT_CHUNK_BYTES
from shale.ledger.values import dataclass
from shale.metadata.asof import AsOf, describe_point
from shale.reader import TopicReader
from shale.reader.arrow import DEFAULT_MAX_BATCH_BYTES, require_pyarrow, schema
from shale.reader.latest import table_batches, table_messages
from shale.reader.topic_reader import EARLIEST, Position
from shale.settings.units import count
from shale.storage import ObjectWriter

__all__ = ["CODECS", "FORMATS", "JSONL_BLOCK_BYTES", "ExportResult", "export_topic", "format_of"]

FORMATS: Final = ("parquet", "arrow", "jsonl")
_SUFFIXES: Final = {".parquet": "parquet", ".pq": "parquet", ".arrow": "arrow", ".feather": "arrow",
                    ".ipc": "arrow", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl"}

#: How each format may compress (Arrow IPC knows no snappy; JSON lines are not compressed).
CODECS: Final = {"parquet": ("zstd", "lz4", "snappy", "none"), "arrow": ("zstd", "lz4", "none")}

#: JSON lines are written in blocks of about this many bytes.
JSONL_BLOCK_BYTES: Final = 1 << 20

#: Called as rows are written: rows so far, bytes so far.
Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class ExportResult:
    """What an export wrote."""

    topic: str
    out: str
    format: str
    what: str  # "records", "compacted view" or "table"
    rows: int
    bytes: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "out": self.out, "format": self.format, "what": self.what, "rows": self.rows,
                "bytes": self.bytes, "seconds": round(self.seconds, 3)}

    def human(self) -> str:
        return (f"{self.topic}: exported the {self.what}, {count(self.rows, 'row')}, to "
                f"{self.out} ({self.format}, {count(self.bytes, 'byte')}) in {self.seconds:.2f}s")


def format_of(out_uri: str, given: str | None) -> str:
    """The format asked for, else the one the output's name suggests, else Parquet."""
    if given is not None:
        if given not in FORMATS:
            raise InvalidInputError(f"unknown export format {given!r}; one of {', '.join(FORMATS)}")
        return given
    name = out_uri.rstrip("/").rsplit("/", 1)[-1].lower()
    return next((f for suffix, f in _SUFFIXES.items() if name.endswith(suffix)), "parquet")


class _Sink(io.RawIOBase):
    """A streaming upload as the file pyarrow writes to."""

    def __init__(self, writer: ObjectWriter, progress: Callable[[int], None]) -> None:
        self._writer, self._progress, self._pos = writer, progress, 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        self._writer.write(data)
        self._pos += n
        self._progress(self._pos)
        return n

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:  # the upload is finished by export_topic, not by pyarrow
        pass


def export_topic(topic_uri: str, out_uri: str, *, metadata_uri: str | None = None, compacted: bool = False,
                 table: bool = False, fmt: str | None = None, start: Position = EARLIEST, compression: str = "zstd",
                 utf8: bool = False, progress: Progress | None = None, overwrite: bool = False,
                 max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES, as_of: AsOf | None = None,
                 changes: tuple[AsOf, AsOf | None] | None = None) -> ExportResult:
    """Write the topic's records (``compacted``: its compacted view; ``table``: the latest
    value of every live key) from ``start`` to ``out_uri`` as ``fmt``; see the module.
    ``as_of`` (an epoch, a time, a message id or a tag): of the topic as it was at that
    point, nothing written later (:mod:`shale.metadata.asof`; implies ``compacted``).
    ``changes`` (``(since, until)``, until None: now): the changes between two points
    instead (:mod:`shale.reader.changes`: a row per key whose state differs, with an
    ``op`` column).

    ``out_uri`` ``-`` is standard output.  An ``out_uri`` inside a topic, or that is not a
    regular file, is refused; so is one that exists unless ``overwrite``
    (:mod:`shale.export_target` says exactly what).  ``max_batch_bytes``: the decompressed
    bytes of records a batch holds, and that are decompressed at once
    (:class:`~shale.reader.arrow.BatchReader`)."""
    t0 = time.perf_counter()
    want = _Request(format_of(out_uri, fmt), compression, utf8, max_batch_bytes, table, compacted, as_of, changes)
    want.check(start)
    reader = TopicReader(topic_uri, metadata_uri=metadata_uri, read_compacted=compacted or table, start=start,
                         chunk_bytes=min(DEFAULT_CHUNK_BYTES, max_batch_bytes), as_of=as_of,
                         max_batch_bytes=max_batch_bytes)
    out = open_output(out_uri, reader.meta, overwrite=overwrite, binary=want.fmt != "jsonl")
    rows = [0]
    nbytes = [0]

    def note(pos: int) -> None:
        nbytes[0] = pos
        if progress is not None:
            progress(rows[0], pos)

    with out as writer:
        want.write(reader, _Sink(writer, note), rows)
    return ExportResult(reader.meta.uri, out.uri, want.fmt, want.what(reader), rows[0], nbytes[0],
                        time.perf_counter() - t0)


@dataclass(frozen=True, slots=True)
class _Request:
    """What an export writes, and how."""

    fmt: str
    compression: str
    utf8: bool
    max_batch_bytes: int
    table: bool
    compacted: bool
    as_of: AsOf | None
    changes: tuple[AsOf, AsOf | None] | None

    def check(self, start: Position) -> None:
        """Refuse what cannot be written, before anything is."""
        if self.fmt in CODECS and (self.compression or "none") not in CODECS[self.fmt]:
            raise InvalidInputError(f"--compression {self.compression!r}: {self.fmt} takes "
                                    f"{', '.join(CODECS[self.fmt])}")
        if self.table and start != EARLIEST:
            raise InvalidInputError("--table exports every key: it takes no --start")
        if self.changes is not None and (self.table or self.compacted or self.as_of is not None
                                         or start != EARLIEST):
            raise InvalidInputError("--changes-from exports the changes between two points: it takes no --table, "
                                    "--compacted, --as-of or --start")

    def write(self, reader: TopicReader, sink: _Sink, rows: list[int]) -> None:
        if self.changes is not None:
            _write_changes(reader, self.changes, self.fmt, self.compression, sink, rows, self.utf8,
                           self.max_batch_bytes)
        elif self.fmt == "jsonl":
            messages = (table_messages(reader.meta, as_of=self.as_of, hold_bytes=self.max_batch_bytes) if self.table
                        else iter(reader))
            rows[0] = _write_jsonl(messages, sink, rows)
        else:
            batches = (table_batches(reader.meta, utf8=self.utf8, max_batch_bytes=self.max_batch_bytes,
                                     as_of=self.as_of) if self.table
                       else reader.iter_batches(utf8=self.utf8, max_batch_bytes=self.max_batch_bytes))
            _write_arrow(batches, self.fmt, self.compression, sink, rows, self.utf8)

    def what(self, reader: TopicReader) -> str:
        """What was exported, in words."""
        if self.changes is not None:
            since, until = self.changes
            return f"changes from {describe_point(since)} to {'now' if until is None else describe_point(until)}"
        what = "table" if self.table else "compacted view" if self.compacted or self.as_of is not None else "records"
        return what if reader.point is None else f"{what} as of {reader.point.label}"


def _write_changes(reader: TopicReader, changes: tuple[AsOf, AsOf | None], fmt: str, compression: str, sink: _Sink,
                   rows: list[int], utf8: bool, max_batch_bytes: int) -> None:
    from shale.reader import changes as changed

    since, until = changes
    if fmt == "jsonl":
        _write_jsonl(changed.changes(reader.meta, since, until, chunk_bytes=reader.chunk_bytes), sink, rows)
    else:
        batches = changed.change_batches(reader.meta, since, until, utf8=utf8, max_batch_bytes=max_batch_bytes)
        _write_arrow(batches, fmt, compression, sink, rows, utf8, changed.change_schema(utf8))


def _write_arrow(batches: Iterator[Any], fmt: str, compression: str, sink: _Sink, rows: list[int],
                 utf8: bool, columns: Any = None) -> None:
    pa = require_pyarrow()
    codec = None if compression in ("", "none") else compression
    columns = schema(utf8) if columns is None else columns
    if fmt == "parquet":
        import pyarrow.parquet as pq

        # no statistics of values: the writer would keep copies of the least and greatest
        # value of each row group (of records up to 64 MiB), and a value's min/max skips nothing
        stats = [f.name for f in columns if f.name != "value"]
        writer: Any = pq.ParquetWriter(sink, columns, compression=codec or "none", write_statistics=stats)
    else:
        writer = pa.ipc.new_file(sink, columns, options=pa.ipc.IpcWriteOptions(compression=codec))
    with writer:
        for b in batches:
            writer.write_batch(b)
            rows[0] += b.num_rows


def _write_jsonl(messages: Iterator[Any], sink: _Sink, rows: list[int]) -> int:
    """The records as ``shale read`` prints them, one JSON object a line, written in blocks
    of about :data:`JSONL_BLOCK_BYTES` (one write per line would cost more than the
    encoding); a longer line is written on its own, never copied into a block."""
    from shale.producer.jsonlines import change_to_json, message_to_json
    from shale.reader.changes import Change

    block: list[bytes] = []
    held = 0
    for m in messages:
        doc = change_to_json(m.op, m.key, m.message) if isinstance(m, Change) else message_to_json(m, "text")
        text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
        del m  # (a big value goes before its line is encoded)
        line = text.encode()
        del text
        rows[0] += 1
        if held + len(line) + 1 > JSONL_BLOCK_BYTES and block:
            sink.write(b"".join(block))
            block, held = [], 0
        if len(line) + 1 > JSONL_BLOCK_BYTES:
            sink.write(line)
            sink.write(b"\n")
            continue
        block += (line, b"\n")
        held += len(line) + 1
    if block:
        sink.write(b"".join(block))
    return rows[0]
