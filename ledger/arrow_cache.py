"""A compacted part's Arrow cache: the rows decoding the part gives, kept beside it as an
Arrow IPC file, so that a read of the view as Arrow maps them instead of decompressing and
parsing the part.

A compaction run writes one for each part it writes when its topic's policy asks for it
(``arrow-cache``), named after the part (``part-00000.ledger`` → ``part-00000.arrow``,
:func:`~shale.metadata.layout.arrow_cache_name`) and recorded beside the part in the published state, so that garbage
collection, snapshots and rollback keep and delete it with its part.

The file holds exactly what :class:`~shale.ledger.arrow_batches.BatchReader` gives for every
record of the part (:func:`~shale.ledger.arrow_batches.schema`'s columns, binary keys and
values, no ``id`` text), in record batches of at most :data:`CACHE_BATCH_ROWS` rows and
about :data:`CACHE_BATCH_BYTES`, uncompressed (bench/README.md: mapped, it is read without a
copy; lz4 costs a decompression per read).  Its schema's metadata binds it to its part:
the part's ledger id, size, record count and footer checksum (:func:`binding`), and the
rows of each batch.

Nothing in it is trusted before it is checked: a cache whose binding is not its part's,
whose schema is not the reader's, that is truncated, whose batches do not hold the rows
the binding says, whose arrays do not validate (offsets in bounds), or whose blocks, read
from remote storage, are bigger than the reader may hold at once, is not used — the
reader decodes the part instead (from the first record it had not given), logs it on the
``shale.reader`` logger and counts it (:func:`cache_counts`).  So a broken cache costs speed,
never a wrong or missing row.  What a cache that passes these checks says of keys and
values is not compared with the part on every read (that is what it saves): ``shale
verify`` decodes both and compares them (:func:`cache_matches`).
"""

from __future__ import annotations

import io
import itertools
import logging
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from shale.ledger.arrow_batches import BatchReader, _cuts, id_column, record_bytes, require_pyarrow, schema

if TYPE_CHECKING:
    import pyarrow as pa

    from shale.ledger.objects import ObjectSource
    from shale.ledger.reader import LedgerFile

__all__ = ["CACHE_BATCH_BYTES", "CACHE_BATCH_ROWS", "CacheUnusable", "binding", "cache_batches", "cache_counts",
           "cache_matches", "write_cache"]

#: Rows of a cache's record batch at most.
CACHE_BATCH_ROWS: Final = 65_536
#: Records' bytes a cache's record batch holds at most (one bigger record alone): what a
#: remote read of one batch holds.
CACHE_BATCH_BYTES: Final = 8 << 20
_KEYS: Final = ("shale.arrow_cache", "ledger_id", "bytes", "records", "footer_crc32c")
_ROWS: Final = b"batch_rows"
_log = logging.getLogger("shale.reader")
_lock = threading.Lock()
#: parts read from their caches, and caches found unusable (their parts decoded), in this process
_counts = {"read": 0, "unusable": 0}


class _NotText(Exception):
    """A key or value read as text that is not UTF-8: the part is decoded from there, where
    the refusal names the record (the cache is not at fault)."""


class CacheUnusable(ValueError):
    """A cache that does not match its part or is not what a cache holds (never raised
    out of a read: the part is decoded instead)."""


def cache_counts() -> tuple[int, int]:
    """How many times, in this process, a part's rows were read from its cache, and how
    many times a cache was found unusable (its part decoded instead)."""
    with _lock:
        return _counts["read"], _counts["unusable"]


def _count(what: str) -> None:
    with _lock:
        _counts[what] += 1


def binding(f: LedgerFile) -> dict[bytes, bytes]:
    """What binds a cache to the part ``f`` (opened by :meth:`~shale.ledger.reader.LedgerFile.open`: its footer
    checksum checked against its footer, which holds every entry's checksum)."""
    values = ("1", f.ledger_id, f.size, f.n_records, f.footer_crc)
    return {k.encode(): str(v).encode() for k, v in zip(_KEYS, values, strict=True)}


def write_cache(f: LedgerFile, sink: Any, *, threads: int = 2, compression: str | None = None) -> int:
    """Write the cache of the part ``f`` to ``sink`` (a binary file object), a batch at a
    time; its rows."""
    pa = require_pyarrow()
    n = f.n_records
    records = np.arange(n, dtype=np.int64)
    # the batches are cut from the footer's sizes before any is made: their rows go in the
    # schema, which is written first
    cost = np.cumsum(record_bytes(f, records)) if n else records
    cuts = _cuts(cost, 0, n, CACHE_BATCH_BYTES, CACHE_BATCH_ROWS) if n else [0]
    meta = binding(f) | {_ROWS: ",".join(str(b - a) for a, b in itertools.pairwise(cuts)).encode()}
    with (BatchReader(threads, max_batch_bytes=CACHE_BATCH_BYTES) as reader,
          pa.ipc.new_file(sink, schema().with_metadata(meta),
                          options=pa.ipc.IpcWriteOptions(compression=compression)) as w):
        for a, b in itertools.pairwise(cuts):
            got = list(reader.batches(f, records[a:b]))
            w.write_batch(got[0] if len(got) == 1 else
                          pa.Table.from_batches(got, schema=schema()).combine_chunks().to_batches()[0])
    return n


class _Ranged(io.RawIOBase):
    """A remote object as a file pyarrow reads at offsets, no read bigger than ``limit``
    (a hostile cache cannot make the reader hold what its blocks declare)."""

    def __init__(self, store: ObjectSource, key: str, limit: int) -> None:
        super().__init__()
        self.store, self.key, self.limit, self.at = store, key, limit, 0
        self.size = store.get_tail(key, 0)[1]

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.at

    def seek(self, offset: int, whence: int = 0) -> int:
        self.at = offset + (0 if whence == 0 else self.at if whence == 1 else self.size)
        return self.at

    def read(self, n: int = -1) -> bytes:
        n = self.size - self.at if n is None or n < 0 else min(n, self.size - self.at)
        if n > self.limit:
            raise CacheUnusable(f"a block of {n} bytes, more than the {self.limit} a read may hold")
        data = bytes(self.store.get_view(self.key, self.at, self.at + n)) if n > 0 else b""
        self.at += len(data)
        return data


def _open(f: LedgerFile, key: str, limit: int) -> tuple[Any, list[int]]:
    """The cache ``key`` of ``f`` opened, its binding and schema checked; its batches' rows."""
    pa = require_pyarrow()
    store = f.store
    if getattr(store, "scheme", "") == "file":  # mapped: read without a copy, and nothing held
        source: Any = pa.py_buffer(store.get_view(key, 0, 1 << 62))
    else:
        source = pa.PythonFile(_Ranged(store, key, limit), mode="r")
    try:
        reader = pa.ipc.open_file(source)
    except (pa.ArrowInvalid, OSError) as e:
        raise CacheUnusable(f"not an Arrow file ({e})") from None
    meta = reader.schema.metadata or {}
    if {k: v for k, v in meta.items() if k != _ROWS} != binding(f):
        raise CacheUnusable("its binding is not its part's")
    if not reader.schema.remove_metadata().equals(schema()):
        raise CacheUnusable("its schema is not the reader's")
    try:
        rows = [int(r) for r in meta.get(_ROWS, b"").split(b",")] if f.n_records else []
    except ValueError:
        raise CacheUnusable("its batches' rows are not numbers") from None
    if len(rows) != reader.num_record_batches or sum(rows) != f.n_records or any(r < 1 for r in rows):
        raise CacheUnusable("its batches do not hold its part's records")
    return reader, rows


def cache_batches(f: LedgerFile, key: str, records: npt.NDArray[np.int64], *, rows: int | None, utf8: bool,
                  id_text: bool, limit: int,
                  decode: Callable[[npt.NDArray[np.int64]], Iterator[pa.RecordBatch]]) -> Iterator[pa.RecordBatch]:
    """The records ``records`` of ``f`` (indexes, rising) as record batches of at most
    ``rows`` rows, read from its cache ``key``; from the first record a cache that proves
    unusable did not give, ``decode(records)`` instead (logged and counted).  ``limit``:
    the most a remote read holds at once."""
    pa = require_pyarrow()
    done = 0
    try:
        reader, counts = _open(f, key, limit)
        starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=starts[1:])
        bounds = np.searchsorted(records, starts)
        for i in range(len(counts)):
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            if lo == hi:
                continue  # (not read at all)
            batch = _checked(pa, reader, i, counts[i])
            for out in _selected(pa, batch, records[lo:hi] - int(starts[i]), rows, utf8, id_text):
                yield out
                done += out.num_rows
        _count("read")
    except _NotText:
        yield from decode(records[done:])  # (which refuses it in one line naming the record)
        return
    except (CacheUnusable, pa.ArrowException, OSError) as e:
        _count("unusable")
        _log.warning("%s: its Arrow cache %s is not used (%s); the part is decoded", f.url,
                     f.store.url(key), e)
        yield from decode(records[done:])


def _checked(pa: Any, reader: Any, i: int, rows: int) -> Any:
    """Batch ``i`` of the cache, its arrays validated in full (offsets in bounds)."""
    batch = reader.get_batch(i)
    if batch.num_rows != rows:
        raise CacheUnusable(f"batch {i} holds {batch.num_rows} rows, not {rows}")
    batch.validate(full=True)
    return batch


def _selected(pa: Any, batch: Any, sub: npt.NDArray[np.int64], rows: int | None, utf8: bool,
              id_text: bool) -> Iterator[Any]:
    """The rows ``sub`` (rising) of ``batch``, as the reader's columns, at most ``rows`` a batch."""
    if len(sub) == batch.num_rows:
        pass
    elif int(sub[-1]) - int(sub[0]) == len(sub) - 1:
        batch = batch.slice(int(sub[0]), len(sub))  # (a run: a view, not a copy)
    else:
        batch = batch.take(pa.array(sub))
    step = rows or batch.num_rows
    for a in range(0, batch.num_rows, step):
        yield _columns(pa, batch.slice(a, step) if step < batch.num_rows else batch, utf8, id_text)


def _columns(pa: Any, batch: Any, utf8: bool, id_text: bool) -> Any:
    if not utf8 and not id_text:
        return batch.replace_schema_metadata(None)  # (the reader's schema: checked when the cache was opened)
    cols = batch.columns
    if utf8:
        try:  # (a cast checks the text)
            cols[3:5] = [c.cast(pa.large_string()) for c in cols[3:5]]
        except pa.ArrowInvalid:
            raise _NotText from None
    if id_text:
        cols = [id_column(pa, *cols[:3]), *cols]
    return pa.RecordBatch.from_arrays(cols, schema=schema(utf8, id_text))


def cache_matches(f: LedgerFile, key: str, *, limit: int = 4 * CACHE_BATCH_BYTES) -> str:
    """Why the cache ``key`` does not hold what decoding the part ``f`` gives ("" when it
    does): its binding and structure, then every row compared, a batch at a time (what a
    remote read holds at once: at most ``limit``)."""
    pa = require_pyarrow()
    try:
        reader, counts = _open(f, key, limit)
        at = 0
        with BatchReader(2, max_batch_bytes=CACHE_BATCH_BYTES) as r:
            for i, n in enumerate(counts):
                cached = pa.Table.from_batches([_checked(pa, reader, i, n)])
                decoded = pa.Table.from_batches(list(r.batches(f, np.arange(at, at + n, dtype=np.int64))),
                                                schema=schema())
                if not cached.equals(decoded):
                    return f"the rows of its batch {i} are not the part's records {at} to {at + n - 1}"
                at += n
    except (CacheUnusable, pa.ArrowException, OSError) as e:
        return str(e)
    return ""
