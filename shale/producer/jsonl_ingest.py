"""``shale produce`` of JSON lines as columns: a C scanner and the bulk append.

The input is read in chunks cut at line ends, into buffers used in turn
(:func:`~shale.producer.pipe.pieces`).  ``ledger/_jsonl.c`` turns each chunk's lines into
record columns on a thread of its own (it lets go of the interpreter lock), while the chunk
before is encoded and appended through :meth:`TopicWriter.append_batch
<shale.producer.TopicWriter.append_batch>`, whose entries are compressed on other threads
while the next chunk is scanned.  A regular file is read and scanned ahead, from before the
writer was imported (:mod:`shale.producer.ahead`); a pipe is read here, on the main thread,
where an interrupt stops a wait for input.  The scanner never decides that a line is
wrong: a line it is not sure of goes through :func:`~shale.producer.jsonlines.parse_record_line`
and the checks of :meth:`TopicWriter.append <shale.producer.TopicWriter.append>`, as every
line did before, so a line is stored, or refused with its ``<input>:<line>`` message,
exactly as the line-by-line path would.  A refused line stops the run with every record
before it appended (and none after it); an interrupt waits for the chunk being appended.
Input that comes slowly (a pipe) is appended as it comes, before each wait for more; its
records are held back until they fill an entry, and appended at the end, at a bad line or
at an interrupt.

When the scanner was not built, ``shale produce`` parses line by line (same results).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import IO, Final

import numpy as np
import numpy.typing as npt

from shale.ledger.encoder import Properties, RecordColumns, VarColumn
from shale.ledger.errors import InvalidInputError
from shale.ledger.kernels import load_native
from shale.ledger.record import (
    EVENT_TIME_MAX_MS,
    EVENT_TIME_MIN_MS,
    EVENT_TIME_RANGE,
    Record,
    check_record_size,
    event_time_in_range,
    validate_record,
)
from shale.ledger.values import dataclass
from shale.producer.ahead import Ahead
from shale.producer.pipe import CHUNK_BYTES, fileno, pieces, ready
from shale.producer.writer import TopicWriter
from shale.runtime import interrupts

__all__ = ["CHUNK_BYTES", "SCANNER", "append_lines", "produce_lines"]

_native: Final = load_native("_jsonl")
#: ``"native"`` when the C scanner is in use, ``"python"`` otherwise.
SCANNER: Final = "native" if _native is not None else "python"


I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]
Parsed = tuple[bytes | None, bytes | None, dict[str, str], int | None]


@dataclass(frozen=True, slots=True)
class _Scanned:
    """One chunk's records as the scanner left them: rows of the lines it took, in line
    order (``line``: each row's line number in the chunk, from 1), and the lines left to
    Python."""

    data: memoryview  # (a buffer of :func:`~shale.producer.pipe.pieces`: used until the chunk is appended)
    lines: int
    line: I64
    key: VarColumn
    value: VarColumn
    map_off: I64
    names: VarColumn
    values: VarColumn
    event: I64
    event_valid: U8
    flagged: I64  # (line number, start, end) per line left to Python


def produce_lines(writer: TopicWriter, stream: IO[bytes] | Ahead, name: str,
                  progress: Callable[[int, int], None] | None = None, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Append the record of every JSON line of ``stream`` (or of a file read and scanned
    ahead: :mod:`shale.producer.ahead`); return how many.  A bad line raises
    :class:`InvalidInputError` naming ``<name>:<line>`` after every record before it was
    appended.  A writer with a linger seals what it has whenever a wait for more input
    reaches it (:mod:`shale.producer.pipe`)."""
    from concurrent.futures import ThreadPoolExecutor

    assert _native is not None
    if isinstance(stream, Ahead):
        return _produce_ahead(writer, stream, name, progress, chunk_bytes)
    fd = fileno(stream)
    # Input is read here, where an interrupt stops a wait for it; a chunk is scanned on the
    # thread (the scanner lets go of the interpreter lock) while the one before is appended.
    with ThreadPoolExecutor(1, thread_name_prefix="shale-scan") as scanner:
        feed = _Feed(writer, name, progress, chunk_bytes)
        try:
            for data in interrupts.interruptible(pieces(stream, fd, chunk_bytes, feed.due if feed.lingers else None)):
                if not data:  # the linger: what came is sealed before the wait goes on
                    feed.catch_up()
                    writer.seal_if_due()
                    continue
                scanning = scanner.submit(_scan, data)
                feed.catch_up()
                if ready(fd):
                    feed.ahead = scanning, feed.first
                else:  # no more input yet: what came is appended before the wait
                    feed.append(scanning.result(), feed.first, True)
                    writer.settle()
            feed.catch_up(small=False)
        except KeyboardInterrupt:
            feed.let_go()  # read and checked: accepted
            raise
    feed.let_go()
    return feed.total


def _produce_ahead(writer: TopicWriter, ahead: Ahead, name: str, progress: Callable[[int, int], None] | None,
                   chunk_bytes: int) -> int:
    """:func:`produce_lines` of chunks scanned ahead: each appended as it comes."""
    feed = _Feed(writer, name, progress, chunk_bytes)
    last: _Scanned | None = None
    try:
        for data, got in interrupts.interruptible(ahead):
            if last is not None:
                feed.append(last, feed.first, True)
            last = _columns(data, got)
        if last is not None:
            feed.append(last, feed.first, False)
    except KeyboardInterrupt:
        feed.let_go()  # read and checked: accepted
        raise
    feed.let_go()
    return feed.total


class _Feed:
    """What :func:`produce_lines` has scanned and appended: records appended so far, the
    number of the next chunk's first line, the records of an entry not full yet held for
    the next chunk's (never with a linger: what came is sealed in time instead), and the
    chunk being scanned while the one before is appended."""

    def __init__(self, writer: TopicWriter, name: str, progress: Callable[[int, int], None] | None,
                 chunk_bytes: int) -> None:
        self.writer, self.name, self.progress, self.chunk_bytes = writer, name, progress, chunk_bytes
        self.lingers = writer.linger.max_age_ms > 0
        self.total, self.first = 0, 1
        self.held: RecordColumns | None = None
        self.ahead: tuple[Future[_Scanned], int] | None = None

    def due(self) -> float | None:
        """Seconds a wait for input may last: none while a chunk waits to be appended."""
        return 0.0 if self.ahead is not None else self.writer.linger_due()

    def catch_up(self, *, small: bool = True) -> None:
        """Append the chunk scanned ahead, if any."""
        if self.ahead is not None:
            future, first = self.ahead
            self.ahead = None
            self.append(future.result(), first, small)

    def append(self, chunk: _Scanned, first: int, small: bool) -> None:
        cols, error = _records(chunk, first, self.name, self.writer)
        self.first = first + chunk.lines
        if self.held is not None:
            cols, self.held = _concat(self.held, cols), None
        # (a big chunk makes whole entries but its last)
        if error is None and small and not self.lingers and len(chunk.data) < self.chunk_bytes // 4:
            cols, self.held = _split(cols, _whole_entries(self.writer, len(cols)), self.writer.max_entry_bytes)
        if len(cols):
            self.total += self.writer.append_batch(cols)
        if error is not None:
            raise error
        if self.progress is not None:
            self.progress(len(cols), len(chunk.data))

    def let_go(self) -> None:
        """Append what is held."""
        if self.held is not None:
            held, self.held = self.held, None
            self.total += self.writer.append_batch(held)


def append_lines(writer: TopicWriter, stream: IO[bytes], name: str,
                 progress: Callable[[int, int], None] | None = None) -> None:
    """Every line of ``stream`` appended one by one, as :func:`produce_lines` does where the
    scanner was not built (and as it checks itself against): each line read, checked and
    appended in turn, as it comes; a bad line raises naming it (``name:LINE``), an interrupt
    stops between two lines.  A writer with a linger seals what it has whenever a wait for
    more input reaches it (:mod:`shale.producer.pipe`).  ``progress`` is told of each line
    (1 record, its bytes)."""
    from shale.producer.jsonlines import parse_record_line
    from shale.producer.pipe import lines

    n = 0
    for raw in interrupts.interruptible(lines(stream, CHUNK_BYTES, writer.linger_due)):
        if not raw:  # the linger: what came is sealed before the wait goes on
            writer.seal_if_due()
            continue
        n += 1
        if progress is not None:
            progress(1, len(raw))
        where = f"{name}:{n}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInputError(f"{where}: not valid UTF-8") from None
        if not line.strip():
            continue
        key, value, props, event_time = parse_record_line(line, where)
        try:
            writer.append(key, value, props, event_time)
        except InvalidInputError as e:
            raise InvalidInputError(f"{where}: {e}") from None


def _whole_entries(writer: TopicWriter, n: int) -> int:
    """How many of ``n`` records make whole entries (of ``batch_size`` records, fewer where
    a ledger is full sooner) after the records appended so far."""
    in_ledger, done = writer.ledger_records % writer.max_ledger_records, 0
    while True:
        size = min(writer.batch_size, writer.max_ledger_records - in_ledger)
        if n - done < size:
            return done
        done += size
        in_ledger = (in_ledger + size) % writer.max_ledger_records


def _scan(data: memoryview) -> _Scanned:
    """The records of a chunk of lines, numbered from 1."""
    assert _native is not None
    return _columns(data, _native.scan(data, 1, EVENT_TIME_MIN_MS, EVENT_TIME_MAX_MS))


def _i64(b: bytes) -> I64:
    return np.frombuffer(b, np.int64)


def _u8(b: bytes) -> U8:
    return np.frombuffer(b, np.uint8)


def _columns(data: memoryview, got: tuple[int, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes,
                                     bytes, bytes, bytes, bytes, bytes]) -> _Scanned:
    (lines, line, key_off, key, key_valid, value_off, value, value_valid, map_off, pk_off, pk, pv_off, pv, event,
     event_valid, flagged) = got
    return _Scanned(data, lines, _i64(line), VarColumn(_i64(key_off), key, _u8(key_valid)),
                    VarColumn(_i64(value_off), value, _u8(value_valid)), _i64(map_off), VarColumn(_i64(pk_off), pk),
                    VarColumn(_i64(pv_off), pv), _i64(event), _u8(event_valid), _i64(flagged).reshape(-1, 3))


def _records(chunk: _Scanned, first: int, name: str, writer: TopicWriter
             ) -> tuple[RecordColumns, InvalidInputError | None]:
    """The chunk's records up to its first bad line, and that line's error (``None``:
    every line is good); its first line is line ``first`` of the input."""
    lines: list[int] = []
    records: list[Parsed] = []
    error: InvalidInputError | None = None
    stop = None
    for line_no, start, end in chunk.flagged.tolist():
        where = f"{name}:{first + line_no - 1}"
        try:
            parsed = _parse(bytes(chunk.data[start:end]), where, writer.max_record_bytes)
        except InvalidInputError as e:
            error, stop = e, line_no
            break
        if parsed is not None:
            lines.append(line_no)
            records.append(parsed)
    n = len(chunk.line) if stop is None else int(np.searchsorted(chunk.line, stop))
    cols = _merged(chunk, n, lines, records)
    # the records the scanner took, checked as TopicWriter.append checks each record
    too_big = _over_size_bound(cols, writer.max_record_bytes)
    if too_big.size:
        at = np.searchsorted(chunk.line[:n], lines)
        inserted = set((at + np.arange(len(lines))).tolist())  # (checked when parsed)
        row_lines = np.insert(chunk.line[:n], at, lines)
        for row in too_big.tolist():
            if row in inserted:
                continue
            try:
                check_record_size(_record(cols, row), writer.max_record_bytes)
            except InvalidInputError as e:
                return _head(cols, row), InvalidInputError(f"{name}:{first + int(row_lines[row]) - 1}: {e}")
    return cols, error


def _parse(raw: bytes, where: str, max_record_bytes: int) -> Parsed | None:
    """One line as the line-by-line path reads and checks it (``None``: a blank line)."""
    from shale.producer.jsonlines import parse_record_line

    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInputError(f"{where}: not valid UTF-8") from None
    if not line.strip():
        return None
    key, value, props, event_time = parse_record_line(line, where)
    record = Record(key, value, dict(props), _now_ms(), event_time)
    try:
        validate_record(record)
        if event_time is not None and not event_time_in_range(event_time):
            raise InvalidInputError(f"event time {event_time} is outside {EVENT_TIME_RANGE}")
        check_record_size(record, max_record_bytes)
    except InvalidInputError as e:
        raise InvalidInputError(f"{where}: {e}") from None
    return key, value, dict(props), event_time


def _merged(chunk: _Scanned, n: int, lines: list[int], records: list[Parsed]) -> RecordColumns:
    """The scanner's first ``n`` rows with ``records`` (of lines ``lines``) put in line order."""
    at = np.searchsorted(chunk.line[:n], np.asarray(lines, np.int64))
    key = _insert(_head_var(chunk.key, n), at, [r[0] for r in records])
    value = _insert(_head_var(chunk.value, n), at, [r[1] for r in records])
    map_off = chunk.map_off[:n + 1]
    counts = np.insert(np.diff(map_off), at, [len(r[2]) for r in records])
    pair_at = np.repeat(map_off[at], [len(r[2]) for r in records])
    names = _insert(chunk.names, pair_at, [k.encode() for r in records for k in r[2]])
    values = _insert(chunk.values, pair_at, [v.encode() for r in records for v in r[2].values()])
    event = np.insert(chunk.event[:n], at, [0 if r[3] is None else r[3] for r in records])
    event_valid = np.insert(chunk.event_valid[:n], at, [r[3] is not None for r in records])
    offsets = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    props = Properties(offsets, names, values) if offsets[-1] else None
    return RecordColumns(key, value, props, event if event_valid.any() else None,
                         event_valid if event_valid.any() else None)


def _head_var(col: VarColumn, n: int) -> VarColumn:
    return VarColumn(col.offsets[:n + 1], col.data, None if col.valid is None else col.valid[:n])


def _insert(col: VarColumn, at: npt.NDArray[np.intp], items: list[bytes | None]) -> VarColumn:
    """``col`` with ``items`` put before its rows ``at`` (ascending; ``None``: absent)."""
    if not items:
        return col
    off = col.offsets
    lengths = np.insert(np.diff(off), at, [0 if b is None else len(b) for b in items])
    pieces: list[bytes | memoryview] = []
    data = memoryview(col.data)
    prev = int(off[0])
    for cut, b in zip(off[at].tolist(), items, strict=True):
        pieces.append(data[prev:cut])
        pieces.append(b or b"")
        prev = cut
    pieces.append(data[prev:int(off[-1])])
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    valid = np.ones(len(off) - 1, np.uint8) if col.valid is None else col.valid
    return VarColumn(offsets, b"".join(pieces), np.insert(valid, at, [b is not None for b in items]))


def _over_size_bound(cols: RecordColumns, max_record_bytes: int) -> npt.NDArray[np.intp]:
    """The rows whose size bound (that of :func:`~shale.ledger.record.check_record_size`, or
    a greater one) is over the limit: only they need their exact size."""
    bound = 64 + cols.key.lengths() + cols.value.lengths()
    p = cols.properties
    if p is not None:
        cost = np.zeros(len(p.names.offsets), np.int64)
        np.cumsum(4 * (p.names.lengths() + p.values.lengths()) + 10, out=cost[1:])
        bound += cost[p.offsets[1:]] - cost[p.offsets[:-1]]
    return np.flatnonzero(bound > max_record_bytes)


def _record(cols: RecordColumns, row: int) -> Record:
    """Row ``row`` as a record, with a publish time of today's encoded size."""
    pairs: dict[str, str] = {}
    p = cols.properties
    if p is not None:
        for q in range(int(p.offsets[row]), int(p.offsets[row + 1])):
            pairs[(p.names.row(q) or b"").decode()] = (p.values.row(q) or b"").decode()
    event = None
    if cols.event_time is not None and cols.event_valid is not None and cols.event_valid[row]:
        event = int(cols.event_time[row])
    return Record(cols.key.row(row), cols.value.row(row), pairs, _now_ms(), event)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _head(cols: RecordColumns, n: int) -> RecordColumns:
    """The first ``n`` rows of ``cols``."""
    p = cols.properties
    props = None if p is None else Properties(p.offsets[:n + 1], p.names, p.values)
    return RecordColumns(_head_var(cols.key, n), _head_var(cols.value, n), props,
                         None if cols.event_time is None else cols.event_time[:n],
                         None if cols.event_valid is None else cols.event_valid[:n])


def _split(cols: RecordColumns, n: int, max_held_bytes: int) -> tuple[RecordColumns, RecordColumns | None]:
    """The first ``n`` rows of ``cols``, and the rest (``None``: none, or more than
    ``max_held_bytes`` of keys and values, appended at once)."""
    if n == len(cols):
        return cols, None
    held = _rows_from(cols, n)
    if len(held.key.data) + len(held.value.data) > max_held_bytes:
        return cols, None
    return _head(cols, n), held


def _slice(c: VarColumn, start: int, stop: int) -> VarColumn:
    """Rows ``start`` to ``stop`` of ``c``, their bytes copied."""
    off = c.offsets[start:stop + 1]
    return VarColumn(off - off[0], bytes(memoryview(c.data)[int(off[0]):int(off[-1])]),
                     None if c.valid is None else c.valid[start:stop].copy())


def _rows_from(cols: RecordColumns, n: int) -> RecordColumns:
    """The rows of ``cols`` from row ``n`` on, their bytes copied."""
    end = len(cols)
    p = cols.properties
    props = None
    if p is not None:
        first, last = int(p.offsets[n]), int(p.offsets[end])
        props = Properties(p.offsets[n:end + 1] - first, _slice(p.names, first, last), _slice(p.values, first, last))
    return RecordColumns(_slice(cols.key, n, end), _slice(cols.value, n, end), props,
                         None if cols.event_time is None else cols.event_time[n:end].copy(),
                         None if cols.event_valid is None else cols.event_valid[n:end].copy())


def _concat(a: RecordColumns, b: RecordColumns) -> RecordColumns:
    """The rows of ``a`` then those of ``b``."""
    pa, pb = a.properties, b.properties
    props = None
    if pa is not None or pb is not None:
        pa, pb = pa or _no_pairs(len(a)), pb or _no_pairs(len(b))
        first_a, last_a = int(pa.offsets[0]), int(pa.offsets[len(a)])
        first_b, last_b = int(pb.offsets[0]), int(pb.offsets[len(b)])
        offsets = np.concatenate([pa.offsets[:len(a)] - first_a,
                                  pb.offsets[:len(b) + 1] - first_b + (last_a - first_a)])
        props = Properties(offsets, _joined(_slice(pa.names, first_a, last_a), _slice(pb.names, first_b, last_b)),
                           _joined(_slice(pa.values, first_a, last_a), _slice(pb.values, first_b, last_b)))
    event = valid = None
    if a.event_valid is not None or b.event_valid is not None:
        event = np.concatenate([_times(a), _times(b)])
        valid = np.concatenate([_event_valid(a), _event_valid(b)])
    return RecordColumns(_joined(_slice(a.key, 0, len(a)), _slice(b.key, 0, len(b))),
                         _joined(_slice(a.value, 0, len(a)), _slice(b.value, 0, len(b))), props, event, valid)


def _joined(x: VarColumn, y: VarColumn) -> VarColumn:
    """The rows of ``x`` then those of ``y`` (both with offsets from 0)."""
    off = np.concatenate([x.offsets[:-1], y.offsets + len(x.data)])
    return VarColumn(off, b"".join([x.data, y.data]), np.concatenate([_valid(x), _valid(y)]))


def _valid(c: VarColumn) -> U8:
    return np.ones(len(c.offsets) - 1, np.uint8) if c.valid is None else c.valid


def _no_pairs(n: int) -> Properties:
    empty = VarColumn(np.zeros(1, np.int64), b"")
    return Properties(np.zeros(n + 1, np.int64), empty, empty)


def _times(cols: RecordColumns) -> I64:
    return np.zeros(len(cols), np.int64) if cols.event_time is None else cols.event_time


def _event_valid(cols: RecordColumns) -> U8:
    return np.zeros(len(cols), np.uint8) if cols.event_valid is None else cols.event_valid
