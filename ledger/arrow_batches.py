"""Ledger records as Arrow record batches, decoded a whole entry at a time
(:mod:`shale.reader.arrow` gives them to readers; a compaction run decodes its parts
with them to write their Arrow caches, :mod:`shale.ledger.arrow_cache`).

An entry is decompressed once and its records decoded straight into the buffers of Arrow
arrays by one C call (:func:`~shale.ledger.arrow_columns.arrow_columns`).  No Python object
is made per record.

Columns (:func:`schema`):

* ``ledger``, ``entry``, ``batch``: the record's message id (``id_text=True`` adds ``id``,
  its ``L:E:B`` text, first);
* ``key``, ``value``: binary (``utf8=True``: text, checked to be valid UTF-8), null for nil;
* ``properties``: a map of text to text;
* ``publish_time``, ``event_time``: timestamps in milliseconds, UTC (event time null when
  the record has none);
* ``tombstone``: the record has a key and no value (it deletes its key).

pyarrow is an optional dependency: ``pip install 'shale[arrow]'``.
"""

from __future__ import annotations

import functools
import itertools
from collections import deque
from collections.abc import Callable, Generator, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import numpy as np
import numpy.typing as npt

from shale.ledger.arrow_columns import ArrowColumns, arrow_columns
from shale.ledger.codecs import Codec
from shale.ledger.errors import InvalidInputError
from shale.ledger.format import FRAME_HEADER
from shale.ledger.messages import DEFAULT_HOLD_BYTES, check_big_entry, refuse_unholdable
from shale.ledger.reader import DEFAULT_CHUNK_BYTES, LedgerFile
from shale.ledger.record import DEFAULT_MAX_RECORD_BYTES
from shale.ledger.stream import PayloadStream

if TYPE_CHECKING:
    from concurrent.futures import Future

    import pyarrow as pa

__all__ = ["DEFAULT_BATCH_ROWS", "DEFAULT_MAX_BATCH_BYTES", "MAX_DECODE_THREADS", "ROW_BYTES", "BatchReader",
           "id_column", "record_bytes", "require_pyarrow", "schema"]

#: Rows per record batch unless asked otherwise (:meth:`~shale.reader.TopicReader.iter_batches`).
DEFAULT_BATCH_ROWS: Final = 65_536
#: Decompressed bytes a batch holds at most, and the entries a reader decompresses at once
#: across its threads, unless asked otherwise (``--max-batch-bytes``; bench/README.md,
#: *Memory against decompressed bytes*).
DEFAULT_MAX_BATCH_BYTES: Final = DEFAULT_HOLD_BYTES
#: What a row costs in a batch beside its record's bytes: its id, times and offsets.
ROW_BYTES: Final = 64
#: More decoding threads than this buy nothing: they share :data:`DEFAULT_MAX_BATCH_BYTES`.
MAX_DECODE_THREADS: Final = 8


def require_pyarrow() -> ModuleType:
    """pyarrow, or a one-line error saying how to install it."""
    try:
        import pyarrow
    except ImportError:
        raise InvalidInputError("Arrow output needs pyarrow: pip install 'shale[arrow]'") from None
    module: ModuleType = pyarrow
    return module


def schema(utf8: bool = False, id_text: bool = False) -> pa.Schema:
    """The columns of a topic as Arrow data (see the module's docstring)."""
    pa = require_pyarrow()
    data = pa.large_string() if utf8 else pa.large_binary()
    ts = pa.timestamp("ms", tz="UTC")
    return pa.schema([*([("id", pa.string())] if id_text else []),
                      ("ledger", pa.uint64()), ("entry", pa.uint64()), ("batch", pa.uint32()),
                      ("key", data), ("value", data), ("properties", pa.map_(pa.string(), pa.string())),
                      ("publish_time", ts), ("event_time", ts), ("tombstone", pa.bool_())])


class _Piece(NamedTuple):
    """Consecutive entries decoded together: ``entries`` (rising) hold ``records[first:stop]``
    (indexes into the records asked for; each entry's first one at ``firsts``), which go
    out as the batches ``records[cuts[i]:cuts[i + 1]]``; ``held``: the bytes it holds, the
    entries' once decompressed or its batches' (:func:`record_bytes`), whichever come to
    more."""

    entries: npt.NDArray[np.int64]
    firsts: npt.NDArray[np.int64]
    first: int
    stop: int
    held: int
    cuts: list[int]


class _Run:
    """A piece being decoded: its steps (each makes the next batches) and the one pending."""

    __slots__ = ("future", "left", "piece", "steps")

    def __init__(self, piece: _Piece, steps: Generator[list[pa.RecordBatch], None, None],
                 future: Future[list[pa.RecordBatch]], left: int) -> None:
        self.piece, self.steps, self.future, self.left = piece, steps, future, left


def record_bytes(f: LedgerFile, records: npt.NDArray[np.int64], id_text: bool = False) -> npt.NDArray[np.int64]:
    """What each of ``records`` (indexes, rising) costs in a batch: its bytes once decompressed, and a row's
    share of the id, time and offset columns (:data:`ROW_BYTES`)."""
    extra = ROW_BYTES * (2 if id_text else 1)
    sizes = f.footer.col("r_size")
    # (a run of records, as a view: no gather)
    run = len(records) and int(records[-1]) - int(records[0]) == len(records) - 1
    cost: npt.NDArray[np.int64] = np.add(sizes[int(records[0]):int(records[-1]) + 1] if run else sizes[records], extra,
                                         dtype=np.int64)
    return cost


class BatchReader:
    """Decodes a ledger's records into record batches on a few threads (zstd and the
    :func:`~shale.ledger.arrow_columns.arrow_columns` kernel leave the interpreter lock);
    batches come out in order.

    Memory follows decompressed bytes, never rows alone: a batch holds at most
    ``max_batch_bytes`` of records (:func:`record_bytes`; a record bigger than that goes
    out alone, as one row), and what the threads work on at once — entries decompressed,
    or the batches made of them, whichever come to more — comes to at most
    ``max_batch_bytes`` too, besides the batch the caller holds.  An entry bigger than its
    thread's share is decoded alone, a batch at a time, the next one made only once the
    caller asks for it; compressed with zstd, it is decompressed as it is read (only each
    batch's records are held), its frame checked before its last batch is given, or, with
    ``check_first``, every record and the frame before its first (read twice, as a read
    of messages reads it: :func:`~shale.ledger.messages.check_big_entry`).  ``rows``, when
    given, also caps the rows of a batch.

    A compacted part opened with its Arrow cache named (``f.arrow_cache``) has its rows
    read from there (:func:`~shale.ledger.arrow_cache.cache_batches`), the part decoded
    only should the cache prove unusable."""

    def __init__(self, threads: int = 2, *, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES, rows: int | None = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, utf8: bool = False, id_text: bool = False,
                 check_first: bool = False) -> None:
        if max_batch_bytes < 1 or (rows is not None and rows < 1):
            raise InvalidInputError("a batch must be allowed one byte and one row at least")
        self.max_batch_bytes, self.rows, self.chunk_bytes = max_batch_bytes, rows, chunk_bytes
        self.utf8, self.id_text, self.check_first = utf8, id_text, check_first
        self.threads = max(1, threads)
        # (imported here: a read that makes no batches, a small topic's, imports no thread pool)
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="shale-arrow")

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> BatchReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def batches(self, f: LedgerFile, records: npt.NDArray[np.int64]) -> Iterator[pa.RecordBatch]:
        """The records ``records`` of ``f`` (indexes, rising) as record batches (see the
        class), decompressing each entry once.  Every frame read is checked, every record
        decoded.  From the part's Arrow cache instead, when it names one (see the class)."""
        require_pyarrow()
        if not len(records):
            return
        if f.arrow_cache is not None:
            from shale.ledger.arrow_cache import cache_batches

            yield from cache_batches(f, f.arrow_cache, records, rows=self.rows, utf8=self.utf8, id_text=self.id_text,
                                     limit=self.max_batch_bytes, decode=functools.partial(self._decoded, f))
            return
        yield from self._decoded(f, records)

    def _decoded(self, f: LedgerFile, records: npt.NDArray[np.int64]) -> Iterator[pa.RecordBatch]:
        """:meth:`batches`, each record decoded from the part."""
        if not len(records):
            return
        pieces = self._plan(f, records)
        active: deque[_Run] = deque()
        held = nxt = 0
        try:
            while True:
                # Start the next pieces while threads are free and their decompressed bytes
                # fit beside those in flight (one piece always: it may be bigger alone).
                while nxt < len(pieces) and len(active) <= self.threads and (
                        not active or held + pieces[nxt].held <= self.max_batch_bytes):
                    piece = pieces[nxt]
                    steps = self._steps(f, records, piece)
                    active.append(_Run(piece, steps, self._pool.submit(next, steps), _steps_of(piece, self.share)))
                    held += piece.held
                    nxt += 1
                if not active:
                    return
                run = active[0]
                got = run.future.result()
                run.left -= 1
                if not run.left:
                    active.popleft()
                    run.steps.close()  # (its decompressed entries go now, not when collected)
                    held -= run.piece.held
                yield from got
                del got
                if run.left:  # an entry bigger than a share: its next batch once this one is let go
                    run.future = self._pool.submit(next, run.steps)
        finally:
            for run in active:
                if run.future.cancel() or run.future.done():
                    run.steps.close()

    @property
    def share(self) -> int:
        """Decompressed bytes one thread decodes at once, unless one entry is bigger."""
        return max(1, self.max_batch_bytes // self.threads)

    def _plan(self, f: LedgerFile, records: npt.NDArray[np.int64]) -> list[_Piece]:
        """``records`` cut into pieces: runs of entries that hold at most :attr:`share`
        bytes (decompressed, and as batches) and span at most ``chunk_bytes`` stored, or
        one entry; each cut into batches."""
        foot = f.footer
        # where each entry's records begin among records: a search per entry, not per record
        at = np.searchsorted(records, foot.e_rec_start)
        entries = np.flatnonzero(at[1:] > at[:-1])
        refuse_unholdable(f, entries, self.max_batch_bytes)  # (before anything of the object is read)
        firsts = at[entries]  # each entry's first record
        stops = np.r_[firsts[1:], len(records)]
        raw = np.cumsum(foot.raw_lengths()[entries] + FRAME_HEADER.size)
        begin = foot.col("e_offset")[entries].astype(np.int64)
        end = begin + foot.col("e_length")[entries].astype(np.int64)
        cost = record_bytes(f, records, self.id_text)
        np.cumsum(cost, out=cost)
        made = cost[stops - 1]  # what the batches of the entries up to each come to
        pieces = []
        i = 0
        while i < len(entries):
            raw_before = int(raw[i - 1]) if i else 0
            made_before = int(made[i - 1]) if i else 0
            j = min(int(np.searchsorted(raw, raw_before + self.share, side="right")),
                    int(np.searchsorted(made, made_before + self.share, side="right")),
                    int(np.searchsorted(end, begin[i] + self.chunk_bytes, side="right")))
            j = max(j, i + 1)
            a, b = int(firsts[i]), int(stops[j - 1])
            held = max(int(raw[j - 1]) - raw_before, int(made[j - 1]) - made_before)
            pieces.append(_Piece(entries[i:j], firsts[i:j], a, b, held,
                                 _cuts(cost, a, b, self.max_batch_bytes, self.rows)))
            i = j
        return pieces

    def _steps(self, f: LedgerFile, records: npt.NDArray[np.int64],
               piece: _Piece) -> Generator[list[pa.RecordBatch], None, None]:
        """The batches of ``piece``, made on the pool's threads: all in one step when the
        piece fits a thread's share (each entry decompressed once, and read where it was
        decompressed to); else
        (one entry that holds more than the share) one batch per step, reading the entry on
        its own as a stream when it is bigger than the share (:func:`_streamed_batches`:
        only each batch's records are held), else (an lz4 block among them: it cannot be read
        in pieces) from the entry decompressed once and held until its last batch is made."""
        pa = require_pyarrow()
        sel, cuts = piece.entries, piece.cuts
        e0, e1 = int(sel[0]), int(sel[-1]) + 1
        if piece.held > self.share and self.check_first:  # (one entry, given in several batches)
            start = f.footer.e_rec_start
            check_big_entry(f, e0, int(start[e0 + 1]) - int(start[e0]), f.entry_where(e0), DEFAULT_MAX_RECORD_BYTES,
                            self.chunk_bytes)
        if (piece.held > self.share and int(f.footer.raw_lengths()[e0]) > self.share
                and int(f.footer.codecs()[e0]) != Codec.LZ4):  # (an lz4 block, decompressed whole, is read from it)
            yield from _streamed_batches(pa, f, records, piece, self.chunk_bytes, self.utf8, self.id_text)
            return
        base, buf = f.read_frames(e0, e1)
        if piece.held <= self.share:
            f.check_frames(buf, base, e0, e1)
            # each entry's payload where zstd left it (or where it is stored): not copied
            payloads = f.payloads(buf, base, sel)
            frames = np.full(len(sel), -FRAME_HEADER.size, dtype=np.int64)
            bounds = piece.firsts  # where each entry's records begin (a batch takes what it spans of each)
            ends = np.r_[bounds[1:], piece.stop]
            out = []
            for a, b in itertools.pairwise(cuts):
                recs = records[a:b]
                kept = np.maximum(np.minimum(ends, b) - np.maximum(bounds, a), 0)
                out.append(_decode(pa, f, payloads, frames, kept, recs, self.utf8, self.id_text,
                                   functools.partial(_refuse_kept, f, buf, base, sel, kept, recs)))
            yield out
            return
        payload = f.entry_payload(buf, base, e0)  # (one entry: its frame checked, decompressed)
        del buf
        for a, b in itertools.pairwise(cuts):
            recs = records[a:b]
            yield [_decode(pa, f, payload, _PAYLOAD, np.array([len(recs)]), recs, self.utf8, self.id_text,
                           functools.partial(f.check_payload, payload, e0, recs))]


def _streamed_batches(pa: Any, f: LedgerFile, records: npt.NDArray[np.int64], piece: _Piece, chunk_bytes: int,
                      utf8: bool, id_text: bool) -> Generator[list[pa.RecordBatch], None, None]:
    """The batches of ``piece``, one entry bigger than a thread's share, a batch per step:
    its stored bytes read in ranged reads of ``chunk_bytes`` and its payload decompressed
    as it is read (an lz4 block whole), only each batch's records held."""
    e0 = int(piece.entries[0])
    foot = f.footer
    offsets, sizes = foot.col("r_offset"), foot.col("r_size")
    stream = f.entry_stream(e0, f.stored_payload(e0, chunk_bytes))  # (its frame's header checked)
    cuts = piece.cuts
    for a, b in itertools.pairwise(cuts):
        recs = records[a:b]
        window, starts = _read_records(stream, offsets[recs].astype(np.int64), sizes[recs].astype(np.int64))
        if b == cuts[-1]:
            stream.finish()  # (the whole frame checked before its last batch is given)
        batch = _decode(pa, f, window, _PAYLOAD, np.array([len(recs)]), recs, utf8, id_text,
                        functools.partial(f.check_payload, window, e0, recs, starts), starts=starts)
        del window  # (the batch holds copies: the records read go before it is given)
        yield [batch]
        del batch


def _read_records(stream: PayloadStream, offsets: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64]
                  ) -> tuple[bytearray, npt.NDArray[np.int64]]:
    """The records at ``offsets`` (rising) of a payload read as ``stream``, side by side in
    a buffer of their own, and where each starts in it: runs of adjacent records are read
    at once, what lies between them skipped."""
    starts = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    window = bytearray(int(starts[-1] + sizes[-1]))
    view = memoryview(window)
    runs = np.flatnonzero(np.r_[True, offsets[1:] != offsets[:-1] + sizes[:-1]])  # each run's first record
    ends = np.r_[runs[1:], len(sizes)]
    for i, j in zip(runs.tolist(), ends.tolist(), strict=True):
        stream.skip(int(offsets[i]) - stream.at)
        stream.readinto(view[int(starts[i]):int(starts[j - 1] + sizes[j - 1])])
    return window, starts


def _refuse_kept(f: LedgerFile, buf: Any, base: int, sel: npt.NDArray[np.int64], kept: npt.NDArray[np.int64],
                 recs: npt.NDArray[np.int64]) -> None:
    """Raise, naming the first of ``recs`` (``kept[i]`` of them in entry ``sel[i]``) that is
    not what its footer says (only when one is not: the entries are decompressed again)."""
    raw, frames = f.raw_frames(buf, base, sel)
    f.check_kept(raw, base, sel, kept, recs, frames=frames)


def _steps_of(piece: _Piece, share: int) -> int:
    """How many steps make ``piece``'s batches (see :meth:`BatchReader._steps`)."""
    return 1 if piece.held <= share else len(piece.cuts) - 1


def _cuts(cost: npt.NDArray[np.int64], first: int, stop: int, limit: int, rows: int | None) -> list[int]:
    """``[first, stop)`` cut into runs whose ``cost`` (a running sum) comes to at most
    ``limit`` and which have at most ``rows`` items; one item at least."""
    cuts = [first]
    k = first
    while k < stop:
        before = int(cost[k - 1]) if k else 0
        m = max(k + 1, int(np.searchsorted(cost, before + limit, side="right")))
        m = min(m, stop, k + rows) if rows is not None else min(m, stop)
        cuts.append(m)
        k = m
    return cuts


#: The frame of an entry whose payload starts a buffer (:func:`arrow_columns`).
_PAYLOAD: Final = np.array([-FRAME_HEADER.size], dtype=np.int64)


def _decode(pa: Any, f: LedgerFile, raw: Any, frames: npt.NDArray[np.int64], kept: npt.NDArray[np.int64],
            recs: npt.NDArray[np.int64], utf8: bool, id_text: bool, refuse: Callable[[], object],
            starts: npt.NDArray[np.int64] | None = None) -> Any:
    """The records ``recs`` of ``f`` as one batch: ``kept[i]`` of them in the entry whose
    frame starts at ``raw[frames[i]:]`` (at the record offsets its footer gives), or, with
    ``starts``, one payload's records read side by side into ``raw`` from ``starts``.
    ``refuse`` raises, naming the record and what is wrong with it, when one is not what
    its footer says."""
    foot = f.footer
    offsets, sizes, flags = foot.col("r_offset"), foot.col("r_size"), foot.col("r_flags")
    rec = recs
    if starts is not None:  # (inside one payload: its offsets fit 32 bits as the footer's do)
        offsets, sizes, flags = starts.astype(np.uint32), sizes[recs], flags[recs]
        rec = np.arange(len(recs), dtype=np.int64)
    # from the system's allocator rather than pyarrow's default pool: in a new process that
    # pool (mimalloc) takes fresh huge pages for the first batches, which costs more system
    # time than the rest of the first read (bench/README.md); later reads cost the same
    alloc = functools.partial(pa.allocate_buffer, memory_pool=pa.system_memory_pool())
    bad, cols = arrow_columns(raw, frames, kept, rec, offsets, sizes, flags, alloc)
    if cols is None:
        refuse()
        raise AssertionError(f"record {bad} was refused and then accepted")  # never: refuse raises
    return _batch(pa, f, cols, recs, utf8, id_text)


def _check_text(pa: Any, f: LedgerFile, recs: npt.NDArray[np.int64], array: Any, what: str) -> None:
    """Text columns must hold valid UTF-8: refused in one line naming the first record that
    does not."""
    try:
        array.validate(full=True)
    except pa.ArrowInvalid:
        for i, item in enumerate(array.cast(pa.large_binary()).to_pylist()):
            try:
                if item is not None:
                    item.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidInputError(f"{f.url}: record {f.record_id(int(recs[i]))}: the {what} is not valid "
                                        "UTF-8 text; read it as binary (without utf8)") from None
        raise


def _plain(pa: Any, values: npt.NDArray[Any], kind: Any) -> Any:
    """A NumPy array of fixed-width values as an Arrow array without a copy, and without
    ``pa.array``, which looks for pandas objects and so imports pandas (a fifth of a
    second) on its first call."""
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])


def _batch(pa: Any, f: LedgerFile, cols: ArrowColumns, recs: npt.NDArray[np.int64], utf8: bool,
           id_text: bool) -> Any:
    n = len(recs)
    ledgers, entries, batches = f.record_id_columns(recs)
    kind = pa.large_string() if utf8 else pa.large_binary()
    key = pa.Array.from_buffers(kind, n, [cols.key_valid, cols.key_offsets, cols.key_data], null_count=cols.key_nulls)
    value = pa.Array.from_buffers(kind, n, [cols.value_valid, cols.value_offsets, cols.value_data],
                                  null_count=cols.value_nulls)
    if utf8:
        _check_text(pa, f, recs, key, "key")
        _check_text(pa, f, recs, value, "value")
    pairs = cols.name_offsets.size // 4 - 1
    names = pa.Array.from_buffers(pa.string(), pairs, [None, cols.name_offsets, cols.name_data], null_count=0)
    texts = pa.Array.from_buffers(pa.string(), pairs, [None, cols.text_offsets, cols.text_data], null_count=0)
    properties = pa.MapArray.from_arrays(pa.Array.from_buffers(pa.int32(), n + 1, [None, cols.prop_offsets]), names,
                                         texts)
    ts = pa.timestamp("ms", tz="UTC")
    publish = pa.Array.from_buffers(ts, n, [None, cols.publish], null_count=0)
    event = pa.Array.from_buffers(ts, n, [cols.event_valid, cols.event], null_count=cols.event_nulls)
    ledger = _plain(pa, np.asarray(ledgers, dtype=np.uint64), pa.uint64())
    entry = _plain(pa, np.asarray(entries, dtype=np.uint64), pa.uint64())
    batch = _plain(pa, np.asarray(batches, dtype=np.uint32), pa.uint32())
    text = [id_column(pa, ledger, entry, batch)] if id_text else []  # (a third of the rest: asked for only)
    tombstone = pa.Array.from_buffers(pa.bool_(), n, [None, cols.tombstone], null_count=0)
    return pa.RecordBatch.from_arrays([*text, ledger, entry, batch, key, value, properties, publish, event, tombstone],
                                      schema=schema(utf8, id_text))


def id_column(pa: Any, ledger: Any, entry: Any, batch: Any) -> Any:
    """The ``id`` column (``L:E:B`` text) of the ``ledger``, ``entry`` and ``batch`` columns."""
    import pyarrow.compute as pc

    return pc.binary_join_element_wise(pc.cast(ledger, pa.string()), pc.cast(entry, pa.string()),
                                       pc.cast(batch, pa.string()), ":")
