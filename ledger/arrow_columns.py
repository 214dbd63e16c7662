"""Records decoded straight into the buffers of an Arrow record batch.

:func:`arrow_columns` finds records as :func:`~shale.ledger.kernels.check_kept` does
(entries' frames in a buffer, how many of each entry's records, which ones), checks them
as :func:`~shale.ledger.kernels.record_columns` does, and writes the buffers
:mod:`shale.reader.arrow` makes its arrays of — in one C call (``ledger/_kernels.c``)
where the kernels were built, in NumPy otherwise; the same buffers either way, which the
tests check.  The buffers come from the caller's ``alloc`` (pyarrow's
``allocate_buffer``: its pool reuses pages from batch to batch), so this module needs no
pyarrow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from shale.ledger import kernels
from shale.ledger.kernels import Buffer, _record_columns_python, gather_ranges

__all__ = ["ArrowColumns", "arrow_columns"]

FRAME_HEADER = 12
INT32_MAX = (1 << 31) - 1


class ArrowColumns(NamedTuple):
    """The buffers of a batch's columns (:func:`arrow_columns`), each from ``alloc``;
    validity bitmaps are None where the column has no nulls."""

    key_offsets: Any  # int64, one more than the records
    key_data: Any
    key_valid: Any
    value_offsets: Any
    value_data: Any
    value_valid: Any
    publish: Any  # int64
    event: Any  # int64, 0 where there is none
    event_valid: Any
    prop_offsets: Any  # int32: each record's first property
    name_offsets: Any  # int32, one more than the properties
    name_data: Any
    text_offsets: Any
    text_data: Any
    tombstone: Any  # bits: a key and a nil or empty value
    key_nulls: int
    value_nulls: int
    event_nulls: int


def arrow_columns(buf: Buffer | tuple[Buffer, ...], frames: npt.ArrayLike, kept: npt.ArrayLike, rec: npt.ArrayLike,
                  offsets: npt.NDArray[np.uint32], sizes: npt.NDArray[np.uint32], flags: npt.NDArray[np.uint8],
                  alloc: Callable[[int], Any]) -> tuple[int, ArrowColumns | None]:
    """The records ``rec`` (indexes into the footer columns ``offsets``, ``sizes`` and
    ``flags``; ``kept[i]`` of them, in order, in the entry whose frame starts at
    ``buf[frames[i]:]``, or whose payload starts at ``buf[frames[i] + 12:]``; ``buf`` may
    also be one buffer per entry, each entry's frame then in its own) as Arrow
    buffers: ``(-1, columns)``, or ``(i, None)`` when ``rec[i]`` is not exactly one
    well-formed record or its flags (bit 0: a key; bit 1: a nil or empty value) do not say
    what it holds.  An index, count or range that does not fit is a :class:`ValueError`;
    property offsets past 32 bits an :class:`OverflowError`."""
    f = np.ascontiguousarray(frames, dtype=np.int64)
    k = np.ascontiguousarray(kept, dtype=np.int64)
    r = np.ascontiguousarray(rec, dtype=np.int64)
    o = np.ascontiguousarray(offsets, dtype=np.uint32)
    z = np.ascontiguousarray(sizes, dtype=np.uint32)
    fl = np.ascontiguousarray(flags, dtype=np.uint8)
    native = kernels._native  # (looked up at each call: the tests swap it for the fallback)
    if native is not None:
        bad, bufs, nulls = native.arrow_columns(buf, f, k, r, o, z, fl, alloc)
        return (int(bad), None) if bufs is None else (-1, ArrowColumns(*bufs, *nulls))
    return _arrow_columns_python(buf, f, k, r, o, z, fl, alloc)


_MISFIT = "an index, a count or a record's range does not fit the buffers given"


def _arrow_columns_python(buf: Buffer | tuple[Buffer, ...], f: npt.NDArray[np.int64], k: npt.NDArray[np.int64],
                          r: npt.NDArray[np.int64], o: npt.NDArray[np.uint32], z: npt.NDArray[np.uint32],
                          fl: npt.NDArray[np.uint8], alloc: Callable[[int], Any]) -> tuple[int, ArrowColumns | None]:
    _check_shapes(f, k, r, o, z, fl)
    joined, starts, size = _locate(buf, f, k, r, o, z)
    try:
        bad, cols = _record_columns_python(joined, starts, size)
    except ValueError:
        raise ValueError(_MISFIT) from None
    if cols is None:  # (a record before it may still have the wrong flags)
        _, cols = _record_columns_python(joined, starts[:bad], size[:bad])
        assert cols is not None
    flags = fl[r[:len(cols.key_len)]]
    wrong = (((flags & 1) != 0) != (cols.key_len >= 0)) | (((flags & 2) != 0) != (cols.value_len <= 0))
    if wrong.any():
        return int(np.argmax(wrong)), None
    if bad >= 0:
        return bad, None
    return -1, _buffers(joined, cols, len(r), alloc)


def _check_shapes(f: npt.NDArray[np.int64], k: npt.NDArray[np.int64], r: npt.NDArray[np.int64],
                  o: npt.NDArray[np.uint32], z: npt.NDArray[np.uint32], fl: npt.NDArray[np.uint8]) -> None:
    """Every length, index and count fits, as the C kernel checks before reading a record."""
    if len(f) != len(k) or len(z) != len(o) or len(fl) != len(o):
        raise ValueError("frames and kept must have one length, offsets, sizes and flags another")
    if np.any(f < -FRAME_HEADER) or np.any(k < 0) or int(k.sum()) != len(r) or (
            len(r) and (int(r.min()) < 0 or int(r.max()) >= len(o))):
        raise ValueError(_MISFIT)


def _locate(buf: Buffer | tuple[Buffer, ...], f: npt.NDArray[np.int64], k: npt.NDArray[np.int64],
            r: npt.NDArray[np.int64], o: npt.NDArray[np.uint32], z: npt.NDArray[np.uint32],
            ) -> tuple[Buffer, npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """One buffer, and where each record starts in it and its size."""
    starts = np.repeat(f, k) + FRAME_HEADER + o[r].astype(np.int64)
    size = z[r].astype(np.int64)
    if not isinstance(buf, tuple):
        return buf, starts, size
    # one buffer per entry: side by side, each record kept inside its own
    if len(buf) != len(f):
        raise ValueError("data must hold one buffer per entry of frames")
    lens = np.array([memoryview(b).nbytes for b in buf], dtype=np.int64)
    owner = np.repeat(np.arange(len(f)), k)
    if np.any((starts < 0) | (starts + size > lens[owner])):
        raise ValueError(_MISFIT)
    starts += (np.cumsum(lens) - lens)[owner]
    return b"".join(buf), starts, size


def _buffers(buf: Buffer, cols: Any, n: int, alloc: Callable[[int], Any]) -> ArrowColumns:
    """The Arrow buffers of checked record columns, each from ``alloc``."""
    def put(values: npt.NDArray[Any] | memoryview) -> Any:
        data = (np.ascontiguousarray(values).data if isinstance(values, np.ndarray) else values).cast("B")
        out = alloc(len(data))
        memoryview(out).cast("B")[:len(data)] = data
        return out

    def offsets_of(lengths: npt.NDArray[np.int64], dtype: type[np.int32 | np.int64]) -> Any:
        at: npt.NDArray[Any] = np.zeros(len(lengths) + 1, dtype=dtype)
        np.cumsum(np.maximum(lengths, 0), out=at[1:])
        return put(at)

    def bits(mask: npt.NDArray[np.bool_]) -> Any:
        return put(np.packbits(mask, bitorder="little"))

    def data(at: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]) -> Any:
        return put(gather_ranges(buf, at, at + np.maximum(lengths, 0)))

    if max(int(cols.pairs.sum()), int(cols.name_len.sum()), int(cols.pval_len.sum())) > INT32_MAX:
        raise OverflowError("the records' properties do not fit 32-bit Arrow offsets, or their bytes a buffer")
    key_nulls, value_nulls = int((cols.key_len < 0).sum()), int((cols.value_len < 0).sum())
    event_nulls = int(n - cols.has_event.sum())
    return ArrowColumns(
        offsets_of(cols.key_len, np.int64), data(cols.key_at, cols.key_len),
        bits(cols.key_len >= 0) if key_nulls else None,
        offsets_of(cols.value_len, np.int64), data(cols.value_at, cols.value_len),
        bits(cols.value_len >= 0) if value_nulls else None,
        put(np.ascontiguousarray(cols.publish)), put(np.ascontiguousarray(cols.event)),
        bits(cols.has_event) if event_nulls else None,
        offsets_of(cols.pairs, np.int32), offsets_of(cols.name_len, np.int32), data(cols.name_at, cols.name_len),
        offsets_of(cols.pval_len, np.int32), data(cols.pval_at, cols.pval_len),
        bits((cols.key_len >= 0) & (cols.value_len <= 0)), key_nulls, value_nulls, event_nulls)
