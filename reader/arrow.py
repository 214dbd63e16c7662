"""Topics as Arrow data: record batches decoded a whole entry at a time.

An entry is decompressed once and its records decoded into columns by one C call
(:func:`~shale.ledger.kernels.record_columns`); keys, values and property texts are then
gathered into Arrow buffers by byte ranges.  No Python object is made per record.

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

import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from shale.ledger.errors import InvalidInputError
from shale.ledger.format import FLAG_TOMBSTONE, FRAME_HEADER
from shale.ledger.kernels import RecordColumns, Scratch, gather_ranges, record_columns
from shale.ledger.reader import DEFAULT_CHUNK_BYTES, LedgerFile

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["DEFAULT_BATCH_ROWS", "BatchReader", "latest_rows", "require", "require_pyarrow", "schema"]

#: Rows per record batch unless asked otherwise.
DEFAULT_BATCH_ROWS: Final = 65_536


def require_pyarrow() -> ModuleType:
    """pyarrow, or a one-line error saying how to install it."""
    try:
        import pyarrow
    except ImportError:
        raise InvalidInputError("Arrow output needs pyarrow: pip install 'shale[arrow]'") from None
    module: ModuleType = pyarrow
    return module


def require(name: str) -> ModuleType:
    """An optional library (pandas, polars), or a one-line error saying how to install it."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        raise InvalidInputError(f"this needs {name}: pip install {name}") from None


def schema(utf8: bool = False, id_text: bool = False) -> pa.Schema:
    """The columns of a topic as Arrow data (see the module's docstring)."""
    pa = require_pyarrow()
    data = pa.large_string() if utf8 else pa.large_binary()
    ts = pa.timestamp("ms", tz="UTC")
    return pa.schema([*([("id", pa.string())] if id_text else []),
                      ("ledger", pa.uint64()), ("entry", pa.uint64()), ("batch", pa.uint32()),
                      ("key", data), ("value", data), ("properties", pa.map_(pa.string(), pa.string())),
                      ("publish_time", ts), ("event_time", ts), ("tombstone", pa.bool_())])


def latest_rows(table: pa.Table) -> pa.Table:
    """The rows of ``table`` (records in id order) that are the latest of their key and not
    tombstones, in id order: a table view's contents (keyless rows are left out)."""
    pa = require_pyarrow()
    import pyarrow.compute as pc

    keyed = table.filter(pc.is_valid(table["key"]))
    rows = pa.array(np.arange(keyed.num_rows, dtype=np.int64))
    last = keyed.append_column("__row", rows).group_by("key", use_threads=False).aggregate([("__row", "max")])
    latest = keyed.take(pa.array(np.sort(last["__row_max"].to_numpy())))
    return latest.filter(pc.invert(latest["tombstone"]))


class BatchReader:
    """Decodes chunks of a ledger's entries into record batches on a few threads (zstd,
    the record kernel and the gathers all leave the interpreter lock), each with a
    decompression buffer of its own; batches come out in order."""

    def __init__(self, threads: int = 2, *, rows: int = DEFAULT_BATCH_ROWS, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 utf8: bool = False, id_text: bool = False) -> None:
        self.rows, self.chunk_bytes, self.utf8, self.id_text = rows, chunk_bytes, utf8, id_text
        self.threads = max(1, threads)
        self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="shale-arrow")
        self._local = threading.local()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> BatchReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def batches(self, f: LedgerFile, records: npt.NDArray[np.int64]) -> Iterator[pa.RecordBatch]:
        """The records ``records`` of ``f`` (indexes, rising) as record batches of at most
        ``rows`` rows, reading whole entries in ranged reads of about ``chunk_bytes`` and
        decompressing each entry once.  Every frame read is checked, every record decoded."""
        require_pyarrow()
        if not len(records):
            return
        entry_of = f.footer.entry_of(records)
        chunks = [(c0, c1) for c0, c1 in f.chunks(int(entry_of[0]), int(entry_of[-1]) + 1, self.chunk_bytes)]
        ahead: deque[Future[list[pa.RecordBatch]]] = deque()
        nxt = 0
        try:
            for _ in chunks:
                while nxt < len(chunks) and len(ahead) <= self.threads:
                    ahead.append(self._pool.submit(self._chunk, f, records, entry_of, *chunks[nxt]))
                    nxt += 1
                yield from ahead.popleft().result()
        finally:
            for fut in ahead:
                fut.cancel()

    def _chunk(self, f: LedgerFile, records: npt.NDArray[np.int64], entry_of: npt.NDArray[np.int64], c0: int,
               c1: int) -> list[pa.RecordBatch]:
        pa = require_pyarrow()
        lo, hi = np.searchsorted(entry_of, [c0, c1])
        if lo == hi:
            return []
        scratch: Scratch | None = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = Scratch()
        base, buf = f.read_frames(c0, c1)
        f.check_frames(buf, base, c0, c1)
        owners = entry_of[lo:hi]  # rising
        out = []
        for sel in f.raw_batches(owners[np.r_[True, owners[1:] != owners[:-1]]]):
            a, b = np.searchsorted(entry_of, [sel[0], sel[-1] + 1])
            batch = _decode(pa, f, base, buf, sel, records[a:b], entry_of[a:b], scratch, self.utf8, self.id_text)
            out += [batch.slice(k, self.rows) for k in range(0, batch.num_rows, self.rows)]
        return out


def _decode(pa: Any, f: LedgerFile, base: int, buf: bytes | memoryview, sel: npt.NDArray[np.int64],
            recs: npt.NDArray[np.int64], owner: npt.NDArray[np.int64], scratch: Scratch, utf8: bool,
            id_text: bool) -> Any:
    """The records ``recs`` (of the entries ``owner``, all among ``sel``) as one batch."""
    foot = f.footer
    raw, frames = f.raw_frames(buf, base, sel, scratch)
    place = np.zeros(int(sel[-1] - sel[0]) + 1, dtype=np.int64)  # entry -> its index in sel
    place[sel - sel[0]] = np.arange(len(sel))
    starts = frames[place[owner - sel[0]]] + FRAME_HEADER.size + foot.col("r_offset")[recs].astype(np.int64)
    bad, cols = record_columns(raw, starts, foot.col("r_size")[recs].astype(np.int64))
    if cols is None:
        # names the entry, the record and what is wrong with it
        f.check_kept(raw, base, sel, np.bincount(place[owner - sel[0]], minlength=len(sel)), recs, frames=frames)
        raise AssertionError(f"record {bad} was refused and then accepted")  # never: check_kept raises
    return _batch(pa, f, raw, cols, recs, utf8, id_text)


def _binary(pa: Any, raw: Any, at: npt.NDArray[np.int64], length: npt.NDArray[np.int64], kind: Any) -> Any:
    """Byte ranges of ``raw`` (length -1: null) as one Arrow array of ``kind``."""
    n = len(at)
    size = np.maximum(length, 0)
    offsets = np.zeros(n + 1, dtype=np.int64 if kind in (pa.large_binary(), pa.large_string()) else np.int32)
    np.cumsum(size, out=offsets[1:])
    # into memory NumPy asks for (huge pages where the system gives them): faulting in
    # the fresh pages of a bytearray costs more than the copy itself
    data = gather_ranges(raw, at, at + size, Scratch())
    nulls = length < 0
    validity = None
    if nulls.any():
        validity = pa.py_buffer(np.packbits(~nulls, bitorder="little"))
    return pa.Array.from_buffers(kind, n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)],
                                 null_count=int(nulls.sum()))


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


def _batch(pa: Any, f: LedgerFile, raw: Any, cols: RecordColumns, recs: npt.NDArray[np.int64], utf8: bool,
           id_text: bool) -> Any:
    n = len(recs)
    ledgers, entries, batches = f.record_id_columns(recs)
    kind = pa.large_string() if utf8 else pa.large_binary()
    key = _binary(pa, raw, cols.key_at, cols.key_len, kind)
    value = _binary(pa, raw, cols.value_at, cols.value_len, kind)
    if utf8:
        _check_text(pa, f, recs, key, "key")
        _check_text(pa, f, recs, value, "value")
    names = _binary(pa, raw, cols.name_at, cols.name_len, pa.string())
    texts = _binary(pa, raw, cols.pval_at, cols.pval_len, pa.string())
    prop_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(cols.pairs, out=prop_offsets[1:])
    properties = pa.MapArray.from_arrays(pa.array(prop_offsets), names, texts)
    ts = pa.timestamp("ms", tz="UTC")
    publish = pa.Array.from_buffers(ts, n, [None, pa.py_buffer(np.ascontiguousarray(cols.publish))])
    has_event = cols.has_event
    event_validity = None if has_event.all() else pa.py_buffer(np.packbits(has_event, bitorder="little"))
    event = pa.Array.from_buffers(ts, n, [event_validity, pa.py_buffer(np.ascontiguousarray(cols.event))],
                                  null_count=int(n - has_event.sum()))
    ledger, entry, batch = pa.array(ledgers), pa.array(entries), pa.array(batches.astype(np.uint32))
    text = []
    if id_text:  # (costs about a third of the rest: asked for, not given by default)
        import pyarrow.compute as pc

        text = [pc.binary_join_element_wise(pc.cast(ledger, pa.string()), pc.cast(entry, pa.string()),
                                            pc.cast(batch, pa.string()), ":")]
    tombstone = ((f.footer.col("r_flags")[recs] & FLAG_TOMBSTONE) != 0) & (cols.key_len >= 0)
    return pa.RecordBatch.from_arrays([*text, ledger, entry, batch, key, value, properties, publish, event,
                                       pa.array(tombstone)], schema=schema(utf8, id_text))
