"""``shale produce``'s input appended to a topic: :func:`produce` picks the way for JSON
lines (the C scanner, or line by line where it was not built) and for columnar files:
Parquet, Arrow IPC and CSV, batch by batch.

Each batch read from the file goes through :meth:`TopicWriter.append_batch
<shale.producer.TopicWriter.append_batch>` (no Python call per record).  The columns are
checked against the file's schema before the first record is appended, so a missing or
mistyped column appends nothing; a bad row (a value over the record limit, a null
property) stops the run at its batch: the batches before it are sealed and registered,
that batch and the rest are not (the error says how many records were appended).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import IO, Any, Final

from shale.ledger.errors import InvalidInputError
from shale.producer.ahead import Ahead
from shale.producer.columns import DEFAULT_KEY_FIELD, DEFAULT_VALUE_FIELD, Fields, shift_rows
from shale.producer.formats import FORMATS, format_of
from shale.producer.writer import TopicWriter
from shale.reader.arrow import require_pyarrow
from shale.runtime import interrupts

__all__ = ["FORMATS", "format_of", "produce", "produce_columnar"]

#: Rows per batch read from a Parquet or CSV file.
_BATCH_ROWS: Final = 256 * 1024


def produce(writer: TopicWriter, stream: IO[bytes] | Ahead, name: str, fmt: str | None = None,
            fields: Fields | None = None, progress: Callable[[int, int], None] | None = None) -> None:
    """Every record of ``stream`` (JSON lines, or a Parquet, Arrow IPC or CSV file: ``fmt``,
    by default what ``name``'s suffix says) appended to ``writer``: JSON lines through the C
    scanner where it was built, else line by line (the same records and errors either
    way); a columnar file batch by batch, its columns named by ``fields``.  ``progress``
    is told of each batch (records, bytes); an interrupt stops between two.  A bad record
    raises naming it; what was appended before it stays appended (and is sealed when the
    writer closes)."""
    def done(rows: int, nbytes: int) -> None:
        if progress is not None:
            progress(rows, nbytes)
        interrupts.check()

    fmt = fmt or format_of(name)
    if not isinstance(stream, Ahead) and fmt != "jsonl":
        produce_columnar(writer, stream, name, fmt, fields or Fields(DEFAULT_KEY_FIELD, DEFAULT_VALUE_FIELD), done)
        return
    from shale.producer.jsonl_ingest import SCANNER, append_lines, produce_lines

    if SCANNER == "native":
        produce_lines(writer, stream, name, done)  # (a file scanned ahead: shale.producer.ahead)
    else:
        append_lines(writer, stream.rewound() if isinstance(stream, Ahead) else stream, name, progress)


def produce_columnar(writer: TopicWriter, stream: IO[bytes], name: str, fmt: str, fields: Fields,
                     progress: Callable[[int, int], None] | None = None) -> int:
    """Append every row of a Parquet, Arrow IPC or CSV stream; return how many."""
    batches = _prefetched(_batches(stream, name, fmt, fields))
    total = 0
    for batch in batches:
        try:
            total += writer.append_batch(batch, key=fields.key, value=fields.value, properties=fields.properties,
                                         event_time=fields.event_time)
        except InvalidInputError as e:
            raise InvalidInputError(f"{name}: {shift_rows(str(e), total)}") from None
        if progress is not None:
            progress(batch.num_rows, batch.nbytes)
    return total


def _prefetched(batches: Iterator[Any], depth: int = 2) -> Iterator[Any]:
    """``batches``, read ahead on a thread of their own: the file is decoded (pyarrow lets
    go of the interpreter lock) while the batch before is encoded and compressed."""
    import queue
    import threading

    q: queue.Queue[tuple[str, Any]] = queue.Queue(depth)
    stop = threading.Event()

    def put(item: tuple[str, Any]) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for b in batches:
                if not put(("batch", b)):
                    return
            put(("end", None))
        except BaseException as e:  # handed to the consumer, raised there
            put(("error", e))

    t = threading.Thread(target=run, name="shale-read-ahead", daemon=True)
    t.start()
    try:
        while True:
            kind, item = q.get()
            if kind == "end":
                return
            if kind == "error":
                raise item
            yield item
    finally:
        stop.set()
        t.join(timeout=5)


def _batches(stream: IO[bytes], name: str, fmt: str, fields: Fields) -> Iterator[Any]:
    pa = require_pyarrow()
    wanted = [c for c in (fields.key, fields.value, fields.properties, fields.event_time) if c is not None]
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            source = stream if stream.seekable() else pa.BufferReader(stream.read())
            pf = pq.ParquetFile(source)
            _check_schema(pf.schema_arrow, wanted, name)
            reader = pf.iter_batches(batch_size=_BATCH_ROWS, columns=wanted)
        elif fmt == "arrow":
            ipc = _ipc_reader(pa, stream)
            _check_schema(ipc.schema, wanted, name)
            reader = ipc if not hasattr(ipc, "get_batch") else (
                ipc.get_batch(i) for i in range(ipc.num_record_batches))
        elif fmt == "csv":
            import pyarrow.csv as pcsv

            text = {fields.key: pa.string(), fields.value: pa.string()}
            reader = pcsv.open_csv(stream, read_options=pcsv.ReadOptions(block_size=16 << 20),
                                   convert_options=pcsv.ConvertOptions(column_types=text, include_columns=wanted))
            _check_schema(reader.schema, wanted, name)
        else:
            raise InvalidInputError(f"unknown input format {fmt!r} (one of {', '.join(FORMATS)})")
        yield from reader
    except pa.ArrowKeyError as e:  # a column the CSV header does not have
        raise InvalidInputError(f"{name}: {_first_line(e).strip(chr(39))}; pick columns with --key-field and "
                                "--value-field") from None
    except (pa.ArrowException, OSError) as e:
        raise InvalidInputError(f"{name}: not readable as {fmt}: {_first_line(e)}") from None


def _ipc_reader(pa: Any, stream: IO[bytes]) -> Any:
    """An Arrow IPC file (random access) or stream, whichever the bytes are."""
    if stream.seekable():
        try:
            return pa.ipc.open_file(stream)
        except pa.ArrowInvalid:
            stream.seek(0)
    return pa.ipc.open_stream(stream)


def _check_schema(schema: Any, wanted: list[str], name: str) -> None:
    missing = [c for c in wanted if c not in schema.names]
    if missing:
        raise InvalidInputError(f"{name}: no column {missing[0]!r} (its columns: {', '.join(schema.names)}); "
                                "pick columns with --key-field and --value-field")


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
