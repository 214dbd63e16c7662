"""Shale's hot loops: in C (``ledger/_kernels.c``) where that extension was built, in
NumPy and plain Python otherwise — the same results either way, which the tests check.

The C versions exist because these loops are either one Python step per element
(a memoryview and a checksum call per frame, a slice per surviving record) or, for the
latest record of every key, random gathers over every record that no NumPy expression
avoids.  ``SHALE_KERNELS=numpy`` in the environment forces the fallbacks (to compare, or
to rule the extension out when chasing a problem); :data:`KERNELS` says which are used.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from types import ModuleType
from typing import Final, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from shale.ledger._record_parser import record_fields_at, record_problem_at

__all__ = ["EXTENSIONS", "KERNELS", "CopyPlan", "EventKeyTable", "KeyTable", "RecordColumns", "Scratch", "check_frames",
           "check_kept", "check_records", "copy_plan", "crc32c", "crc32c_ranges", "distinct_estimate", "gather_ranges",
           "latest_positions", "load_native", "new_event_key_table", "new_key_table", "partition_keys",
           "record_columns", "record_problem", "start_writeback", "tiling_error"]

Buffer = bytes | bytearray | memoryview


def load_native(name: str) -> ModuleType | None:
    """The C extension ``shale.ledger.<name>``, or None when it was not built or
    ``SHALE_KERNELS=numpy`` (or ``python``) asks for the fallbacks."""
    if os.environ.get("SHALE_KERNELS", "").strip().lower() in ("numpy", "python"):
        return None
    import importlib

    try:
        return importlib.import_module(f"shale.ledger.{name}")
    except ImportError:
        found = _installed_extension(name)
    if found is None:
        _warn_fallback(name)
    return found


#: The C extensions, each with the source it is built from.
EXTENSIONS: Final = {"_kernels": "ledger/_kernels.c", "_encoder": "ledger/_encoder.c", "_jsonl": "ledger/_jsonl.c"}
_warned: set[str] = set()


def _warn_fallback(name: str) -> None:
    """One line on standard error (through the ``shale`` logger), once: the extensions that
    were not built, whose NumPy and Python fallbacks run instead (the same results at many
    times the CPU).  Asked for with ``SHALE_KERNELS=numpy``, the fallbacks say nothing."""
    if name in _warned:
        return
    import logging

    missing = [n for n in EXTENSIONS if n not in _warned and (n == name or not _found(n))]
    _warned.update(missing)
    logging.getLogger("shale").warning(
        "shale: warning: the C extension%s %s %s not built: the NumPy fallbacks run instead, at many times the CPU "
        "(install a C compiler and reinstall shale; SHALE_KERNELS=numpy asks for them without this warning)",
        "s" if len(missing) > 1 else "", ", ".join(f"{n} ({EXTENSIONS[n]})" for n in missing),
        "were" if len(missing) > 1 else "was")


def _found(name: str) -> bool:
    """Whether the extension ``shale.ledger.<name>`` is there to import (not imported)."""
    import importlib.util

    try:
        return importlib.util.find_spec(f"shale.ledger.{name}") is not None
    except ImportError:
        return False


def _installed_extension(name: str) -> ModuleType | None:
    """``shale.ledger.<name>`` from an installed copy of this same version of Shale, when
    Shale itself was imported from a zip (as Spark ships it to executors): compiled
    extensions cannot be imported from a zip, but the executors may well have them."""
    import importlib.machinery
    import importlib.metadata
    import importlib.util
    import sys

    shale = sys.modules.get("shale")
    origin = str(getattr(shale, "__file__", "") or "")
    if ".zip" not in origin:
        return None
    try:
        if importlib.metadata.version("shale") != getattr(shale, "__version__", None):
            return None  # another version's kernels may not match this code
    except importlib.metadata.PackageNotFoundError:
        return None
    plain = [p for p in sys.path if ".zip" not in p]
    specs = [importlib.machinery.PathFinder.find_spec("shale", plain)]
    for finder in sys.meta_path:  # an editable install's finder, for one
        find = getattr(finder, "find_spec", None)
        if finder is not importlib.machinery.PathFinder and find is not None:
            try:
                specs.append(find("shale", None))
            except Exception:  # a third-party finder that fails only means "not there"
                continue
    for spec in specs:
        for folder in (spec.submodule_search_locations or []) if spec is not None else []:
            if ".zip" in folder:
                continue
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                path = os.path.join(folder, "ledger", name + suffix)
                if os.path.isfile(path):
                    ext = importlib.util.spec_from_file_location(f"shale.ledger.{name}", path)
                    if ext is None or ext.loader is None:
                        continue
                    module = importlib.util.module_from_spec(ext)
                    ext.loader.exec_module(module)
                    sys.modules[f"shale.ledger.{name}"] = module
                    return module
    return None


_native: Final = load_native("_kernels")
#: ``"native"`` when the C kernels are in use, ``"numpy"`` otherwise.
KERNELS: Final = "native" if _native is not None else "numpy"
# Without the CPU's CRC instruction the C table-driven CRC is slower than the crc32c
# package's own (which also knows ARM's), so only the loop around it is saved then.
_native_crc: Final = _native if _native is not None and _native.HARDWARE_CRC else None


def _crc_package() -> ModuleType:
    import crc32c as package  # only without the C kernels' CRC: its import is not free

    return package


def crc32c(data: Buffer, value: int = 0) -> int:
    """CRC32C (Castagnoli) of ``data``, continuing from ``value``; hardware accelerated
    where the CPU allows."""
    if _native_crc is not None:
        return int(_native_crc.crc32c(data, value))
    return int(_crc_package().crc32c(data, value))


def _i64(a: npt.ArrayLike) -> npt.NDArray[np.int64]:
    return np.ascontiguousarray(a, dtype=np.int64)


def _bytes(buf: Buffer) -> memoryview:
    """``buf`` as bytes, whatever its item type: ranges count bytes, as in C."""
    view = memoryview(buf)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def crc32c_ranges(buf: Buffer, starts: npt.ArrayLike, ends: npt.ArrayLike) -> npt.NDArray[np.uint32]:
    """The CRC32C of ``buf[starts[i]:ends[i]]`` for every ``i``.  Ranges must lie inside
    ``buf`` (:class:`ValueError` otherwise)."""
    s, e = _i64(starts), _i64(ends)
    if _native_crc is not None:
        return np.frombuffer(_native_crc.crc32c_ranges(buf, s, e), dtype="<u4").astype(np.uint32, copy=False)
    view = _bytes(buf)
    _check_ranges(len(view), s, e)
    return np.fromiter(map(_crc_package().crc32c, map(view.__getitem__, map(slice, s.tolist(), e.tolist()))),
                       dtype=np.uint32, count=len(s))


class Scratch:
    """A buffer reused from batch to batch, so that each batch does not ask the system
    for fresh pages (which costs more than the copy into them)."""

    def __init__(self) -> None:
        self._buf: npt.NDArray[np.uint8] = np.empty(0, dtype=np.uint8)

    def take(self, n: int) -> memoryview:
        """A writable view of ``n`` bytes, valid until the next call."""
        if len(self._buf) < n:
            # A new buffer rather than a resize (views of the old one may still be alive),
            # and not zero-filled: every byte handed out is written before it is read.
            self._buf = np.empty(max(n, 2 * len(self._buf)), dtype=np.uint8)
        return self._buf.data[:n]


def check_frames(buf: Buffer, offsets: npt.ArrayLike, lengths: npt.ArrayLike, counts: npt.ArrayLike) -> int:
    """Check the frames at ``buf[offsets[i]:offsets[i] + lengths[i]]`` (a 12-byte header:
    payload length, CRC32C of the payload, record count; then the payload) against the
    footer's ``lengths`` and ``counts``: the index of the first bad one, or -1."""
    o, n, c = _i64(offsets), _i64(lengths), _i64(counts)
    if _native_crc is not None:
        return int(_native_crc.check_frames(buf, o, n, c))
    view = _bytes(buf)
    if np.any(n < 12):
        raise ValueError("a frame is shorter than its header")
    _check_ranges(len(view), o, o + n)
    data = np.frombuffer(view, dtype=np.uint8)
    head = data[o[:, None] + np.arange(12)].view("<u4")  # (frames, 3)
    ok = (head[:, 0] == n - 12) & (head[:, 2] == c)
    ok &= crc32c_ranges(view, o + 12, o + n) == head[:, 1]
    return -1 if ok.all() else int(np.argmin(ok))


def check_records(buf: Buffer, starts: npt.ArrayLike, sizes: npt.ArrayLike, flags: npt.ArrayLike) -> int:
    """Check that ``buf[starts[i]:starts[i] + sizes[i]]`` is exactly one well-formed record
    (``[key: bin | nil, value: bin | nil, properties: map<str, str> | nil, publish_time:
    int64, event_time: int64 | nil]``, filling its size) and that ``flags[i]`` are its
    footer flags (bit 0: it has a key; bit 1: it has a key and its value is nil or empty;
    no other bit): the index of the first record that is not, or -1.  Ranges must lie
    inside ``buf`` and flags be bytes (:class:`ValueError` otherwise);
    :func:`record_problem` tells what is wrong with a record."""
    s, z, f = _i64(starts), _i64(sizes), _flag_bytes(flags)
    if _native is not None:
        return int(_native.check_records(buf, s, z, f))
    return _check_records_python(buf, s, z, f)


def _flag_bytes(flags: npt.ArrayLike) -> npt.NDArray[np.uint8]:
    f = np.asarray(flags)
    if f.dtype != np.uint8 and (f.dtype.kind not in "biu" or (f.size and (f.min() < 0 or f.max() > 0xFF))):
        raise ValueError("flags must be integers from 0 to 255")
    return np.ascontiguousarray(f, dtype=np.uint8)


def _check_records_python(buf: Buffer, s: npt.NDArray[np.int64], z: npt.NDArray[np.int64],
                          f: npt.NDArray[np.uint8]) -> int:
    view = _bytes(buf)
    if not len(s) == len(z) == len(f):
        raise ValueError("starts, sizes and flags must have one length")
    size = len(view)
    outside = (s < 0) | (z < 0) | (s > size - np.maximum(z, 0))
    if outside.any():
        i = int(np.argmax(outside))
        raise ValueError(f"record {i} ({int(z[i])} bytes at {int(s[i])}) lies outside the buffer of {size} bytes")
    for i, (at, n, flag) in enumerate(zip(s.tolist(), z.tolist(), f.tolist(), strict=True)):
        if record_problem_at(view, at, at + n, flag):
            return i
    return -1


def check_kept(buf: Buffer, frames: npt.ArrayLike, kept: npt.ArrayLike, rec: npt.ArrayLike,
               offsets: npt.NDArray[np.uint32], sizes: npt.NDArray[np.uint32], flags: npt.NDArray[np.uint8]) -> int:
    """:func:`check_records` for the records compaction copies from a batch of entries,
    without building their ranges first: entry ``i`` of the batch has its frame at
    ``buf[frames[i]:]`` and ``kept[i]`` of its records copied, taken in order from ``rec``
    (indexes into the ledger's footer columns ``offsets``, ``sizes`` and ``flags``).
    Returns the index into ``rec`` of the first bad record, or -1."""
    f, k, r = _i64(frames), _i64(kept), _i64(rec)
    o = np.ascontiguousarray(offsets, dtype=np.uint32)
    z = np.ascontiguousarray(sizes, dtype=np.uint32)
    fl = np.ascontiguousarray(flags, dtype=np.uint8)
    if _native is not None:
        return int(_native.check_kept(buf, f, k, r, o, z, fl))
    if len(f) != len(k) or int(k.sum()) != len(r) or np.any(k < 0):
        raise ValueError("frames and kept must have one length, and kept must add up to the records of rec")
    if len(r) and (int(r.min()) < 0 or int(r.max()) >= len(o)):
        raise ValueError("an index of rec is not a record of the footer columns")
    starts = np.repeat(f, k) + 12 + o[r].astype(np.int64)
    return check_records(buf, starts, z[r].astype(np.int64), fl[r])


class RecordColumns(NamedTuple):
    """Records decoded into columns (:func:`record_columns`); offsets are into the buffer
    the records were read from, lengths -1 for nil."""

    key_at: npt.NDArray[np.int64]
    key_len: npt.NDArray[np.int64]
    value_at: npt.NDArray[np.int64]
    value_len: npt.NDArray[np.int64]
    publish: npt.NDArray[np.int64]
    event: npt.NDArray[np.int64]  # 0 where there is none
    has_event: npt.NDArray[np.bool_]
    pairs: npt.NDArray[np.int64]  # properties per record
    name_at: npt.NDArray[np.int64]  # per property, in order
    name_len: npt.NDArray[np.int64]
    pval_at: npt.NDArray[np.int64]
    pval_len: npt.NDArray[np.int64]


def record_columns(buf: Buffer, starts: npt.ArrayLike, sizes: npt.ArrayLike) -> tuple[int, RecordColumns | None]:
    """Decode the records ``buf[starts[i]:starts[i] + sizes[i]]`` into columns, without a
    Python object per record: ``(-1, columns)``, or ``(i, None)`` when record ``i`` is not
    exactly one well-formed record (:func:`record_problem` says why).  Ranges must lie
    inside ``buf`` (:class:`ValueError` otherwise)."""
    s, z = _i64(starts), _i64(sizes)
    if _native is not None:
        bad, cols = _native.record_columns(buf, s, z)
        if cols is None:
            return int(bad), None
        c = [np.frombuffer(col, dtype=np.int64) if i != 6 else np.zeros(0, np.int64) for i, col in enumerate(cols)]
        has_event = np.frombuffer(cols[6], dtype=np.uint8).astype(bool)
        return -1, RecordColumns(c[0], c[1], c[2], c[3], c[4], c[5], has_event, c[7], c[8], c[9], c[10], c[11])
    return _record_columns_python(buf, s, z)


def _record_columns_python(buf: Buffer, s: npt.NDArray[np.int64], z: npt.NDArray[np.int64]
                           ) -> tuple[int, RecordColumns | None]:
    view = _bytes(buf)
    if len(s) != len(z):
        raise ValueError("starts and sizes must have one length")
    _check_ranges(len(view), s, s + z)
    rows: list[tuple[int, ...]] = []
    spans: list[tuple[int, int]] = []
    for i, (at, n) in enumerate(zip(s.tolist(), z.tolist(), strict=True)):
        got = record_fields_at(view, at, at + n)
        if got is None:
            return i, None
        key_at, key_len, value_at, value_len, publish, event, props = got
        rows.append((key_at, key_len, value_at, value_len, publish, event or 0, event is not None, len(props) // 2))
        spans.extend(props)
    cols = np.array(rows, dtype=np.int64).reshape(len(rows), 8).T
    props_arr = np.array(spans, dtype=np.int64).reshape(len(spans), 2)
    names, values = props_arr[0::2], props_arr[1::2]
    c = [np.ascontiguousarray(col) for col in cols]
    return -1, RecordColumns(c[0], c[1], c[2], c[3], c[4], c[5], c[6].astype(bool), c[7],
                             np.ascontiguousarray(names[:, 0]), np.ascontiguousarray(names[:, 1]),
                             np.ascontiguousarray(values[:, 0]), np.ascontiguousarray(values[:, 1]))


def record_problem(data: Buffer, flags: int) -> str:
    """What is wrong with one encoded record and its footer flags, in a few words (for an
    error message), or ``""`` when :func:`check_records` would accept them."""
    view = _bytes(data)
    return record_problem_at(view, 0, len(view), flags)


def gather_ranges(buf: Buffer, starts: npt.ArrayLike, ends: npt.ArrayLike,
                  scratch: Scratch | None = None) -> memoryview:
    """``buf[starts[0]:ends[0]] + buf[starts[1]:ends[1]] + ...`` as one writable buffer
    (in ``scratch`` when given, so valid until its next use).  Ranges must lie inside
    ``buf`` (:class:`ValueError` otherwise)."""
    s, e = _i64(starts), _i64(ends)
    view = _bytes(buf)
    if _native is not None and scratch is None:
        return memoryview(_native.gather_ranges(view, s, e))  # (which checks the ranges itself)
    _check_ranges(len(view), s, e)  # (before anything is allocated for them)
    lens = e - s
    if len(lens) and int(lens.max()) > 0 and len(lens) > (1 << 62) // int(lens.max()):
        raise ValueError("the ranges add up to more bytes than can be held")
    total = int(lens.sum())
    out = scratch.take(total) if scratch is not None else memoryview(bytearray(total))
    if _native is not None:
        _native.gather_ranges(view, s, e, out)
        return out
    at = 0
    for a, b in zip(s.tolist(), e.tolist(), strict=True):
        out[at:at + b - a] = view[a:b]
        at += b - a
    return out


def tiling_error(offsets: npt.NDArray[np.uint32], sizes: npt.NDArray[np.uint32], entry_starts: npt.NDArray[np.int64],
                 lengths: npt.NDArray[np.uint32]) -> int:
    """Whether the records of a footer tile their entries' payloads: 0 when they do (each
    entry's first record starts at 0, each next one where the one before it ends, without
    wrapping past 2**32, and the last ends where the 12-byte-headed frame of ``lengths``
    does); 1 when offsets do not follow sizes; 2 when they do but some entry's sizes do
    not add up to its payload; 3 when ``entry_starts`` (the first record of each entry,
    then the record count) do not rise through the records."""
    o = np.ascontiguousarray(offsets, dtype=np.uint32)
    z = np.ascontiguousarray(sizes, dtype=np.uint32)
    st = np.ascontiguousarray(entry_starts, dtype=np.int64)
    n_len = np.ascontiguousarray(lengths, dtype=np.uint32)
    if _native is not None:
        return int(_native.tiling_error(o, z, st, n_len))
    if len(z) != len(o) or len(st) != len(n_len) + 1:
        raise ValueError("sizes must be as long as offsets, entry_starts one longer than lengths")
    n = len(o)
    if not len(n_len):
        return 0
    if st[0] < 0 or np.any(st[1:] <= st[:-1]) or st[-1] > n:
        return 3
    # a few passes over the columns, in 32-bit words: a sum that wrapped past 2**32 lands
    # below the offset it was added to, so offsets may not fall inside an entry
    firsts, lasts = st[:-1], st[1:] - 1
    follows = np.empty(n, dtype=bool)
    follows[0] = True
    np.equal(o[1:], o[:-1] + z[:-1], out=follows[1:])
    follows[1:] &= o[1:] >= o[:-1]
    follows[firsts] = o[firsts] == 0  # entries start afresh
    if not follows[st[0]:st[-1]].all():
        return 1
    ends = o[lasts].astype(np.int64) + z[lasts].astype(np.int64)
    return 2 if np.any(ends != n_len.astype(np.int64) - 12) else 0


class CopyPlan(NamedTuple):
    """How the kept records of some entries of a ledger are copied (:func:`copy_plan`)."""

    rec: npt.NDArray[np.int64]  # the kept records, in order
    in_entry: npt.NDArray[np.uint32]  # each one's place in its entry
    new_off: npt.NDArray[np.uint32]  # each one's offset in its output frame's payload
    kept: npt.NDArray[np.int64]  # per entry: records kept
    whole: npt.NDArray[np.bool_]  # per entry: all of them (the frame is copied as it is)
    lengths: npt.NDArray[np.int64]  # per entry: the output frame's length, header included
    starts: npt.NDArray[np.int64]  # byte ranges of the buffer read that, joined, make the
    ends: npt.NDArray[np.int64]  # output frames (a rebuilt frame's header still to be written)


def copy_plan(keep: npt.NDArray[np.bool_], entry_starts: npt.NDArray[np.int64], sel: npt.NDArray[np.int64],
              e_off: npt.NDArray[np.int64], e_len: npt.NDArray[np.int64], offsets: npt.NDArray[np.uint32],
              sizes: npt.NDArray[np.uint32]) -> CopyPlan:
    """How to copy the kept records (``keep``, one flag per record of a ledger) of the
    entries ``sel`` (rising), whose frames lie at ``e_off`` (``e_len`` bytes each) of the
    buffer read: an entry whose records are all kept is copied whole, frame as it was;
    otherwise its output frame is its old 12-byte header (for the caller to rewrite)
    followed by its kept records' bytes, one range per run of adjacent ones.
    ``entry_starts`` is the first record of each entry, then the record count;
    ``offsets`` and ``sizes`` place each record in its entry's payload."""
    k = np.asarray(keep)
    # one byte per record, non-zero for kept (any other item type is compared with 0 first)
    k8 = np.ascontiguousarray(k).view(np.uint8) if k.dtype in (np.bool_, np.uint8) else (k != 0).view(np.uint8)
    st, sl = _i64(entry_starts), _i64(sel)
    eo, el = _i64(e_off), _i64(e_len)
    o = np.ascontiguousarray(offsets, dtype=np.uint32)
    z = np.ascontiguousarray(sizes, dtype=np.uint32)
    if _native is not None:
        got = _native.copy_plan(k8, st, sl, eo, el, o, z)
        dtypes = (np.int64, np.uint32, np.uint32, np.int64, np.bool_, np.int64, np.int64, np.int64)
        return CopyPlan(*(np.frombuffer(b, dtype=d) for b, d in zip(got, dtypes, strict=True)))
    return _copy_plan_numpy(k8 != 0, st, sl, eo, el, o, z)


def _copy_plan_numpy(keep: npt.NDArray[np.bool_], st: npt.NDArray[np.int64], sel: npt.NDArray[np.int64],
                     e_off: npt.NDArray[np.int64], e_len: npt.NDArray[np.int64], offsets: npt.NDArray[np.uint32],
                     sizes: npt.NDArray[np.uint32]) -> CopyPlan:
    n, n_entries = len(sel), len(st) - 1
    if len(offsets) != len(keep) or len(sizes) != len(keep) or n_entries < 0 or len(e_off) != n or len(e_len) != n:
        raise ValueError("keep, offsets and sizes must have one length (the records), entry_starts one more than "
                         "the entries, sel, e_off and e_len one length")
    if np.any((sel < 0) | (sel >= n_entries)):
        raise ValueError("an entry of sel is not an entry of the ledger")
    r0, r1 = st[sel], st[sel + 1]
    if np.any((r0 < 0) | (r1 < r0) | (r1 > len(keep))):
        raise ValueError("entry_starts put an entry's records outside the ledger")
    counts = r1 - r0
    # every record of the entries of sel, and the entry (index into sel) of each
    owner = np.repeat(np.arange(n), counts)
    every = np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(r0 - (np.cumsum(counts) - counts), counts)
    picked = keep[every]
    rec, which = every[picked], owner[picked]
    kept = np.bincount(which, minlength=n).astype(np.int64)
    whole = kept == counts
    in_entry = (rec - r0[which]).astype(np.uint32)
    offs = offsets[rec].astype(np.int64)
    size = sizes[rec].astype(np.int64)
    partial = ~whole[which]
    new_off = offs.copy()
    # a partly kept entry's records follow one another in its new payload
    p_which, p_size = which[partial], size[partial]
    ends = np.cumsum(p_size)
    first = np.r_[True, p_which[1:] != p_which[:-1]] if len(p_which) else np.zeros(0, dtype=bool)
    entry_base = np.maximum.accumulate(np.where(first, ends - p_size, 0)) if len(p_which) else ends
    new_off[partial] = ends - p_size - entry_base
    p_len = np.bincount(p_which, weights=p_size, minlength=n).astype(np.int64) if n else np.zeros(0, np.int64)
    lengths = np.where(whole, e_len, 12 + p_len)
    # byte ranges: runs of adjacent kept records of each partly kept entry
    p_start = e_off[p_which] + 12 + offs[partial]
    p_end = p_start + p_size
    if len(p_start):
        brk = np.flatnonzero((p_start[1:] != p_end[:-1]) | (p_which[1:] != p_which[:-1])) + 1
        run_lo, run_hi = p_start[np.r_[0, brk]], p_end[np.r_[brk - 1, len(p_end) - 1]]
        run_entry = p_which[np.r_[0, brk]]
    else:
        run_lo = run_hi = run_entry = p_start
    runs_per_entry = np.bincount(run_entry, minlength=n) if n else np.zeros(0, np.int64)
    per = np.where(whole, 1, 1 + runs_per_entry)
    slot0 = np.cumsum(per) - per
    starts = np.empty(int(per.sum()), dtype=np.int64)
    stops = np.empty_like(starts)
    starts[slot0] = e_off
    stops[slot0] = np.where(whole, e_off + e_len, e_off + 12)
    if len(run_entry):
        rank = np.arange(len(run_entry)) - np.searchsorted(run_entry, run_entry, side="left")
        slot = slot0[run_entry] + 1 + rank
        starts[slot], stops[slot] = run_lo, run_hi
    return CopyPlan(rec, in_entry, new_off.astype(np.uint32), kept, whole, lengths.astype(np.int64), starts, stops)


def start_writeback(fd: int, offset: int, nbytes: int) -> bool:
    """Ask the system to start writing bytes ``[offset, offset + nbytes)`` of the open
    file ``fd`` to disk without waiting (Linux ``sync_file_range``), so that the sync that
    makes the file durable has less left to wait for.  A hint: ``False`` where it is not
    supported (or without the C kernels); the file must still be synced."""
    if _native is None:
        return False
    return bool(_native.start_writeback(fd, offset, nbytes))


def latest_positions(hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64]) -> npt.NDArray[np.intp] | None:
    """Indexes of the last occurrence of every distinct ``(hi, lo)``, in hash order — or
    ``None`` when the C kernels are not in use or the keys crowd its table (keys crafted
    to share their top hash bits); the caller then sorts instead
    (:func:`shale.compactor.rules.latest_of_each_key`)."""
    if _native is None:
        return None
    got = _native.latest_of_each_key(np.ascontiguousarray(hi, dtype=np.uint64),
                                     np.ascontiguousarray(lo, dtype=np.uint64))
    if got is None:
        return None
    return np.frombuffer(got, dtype=np.int64).astype(np.intp, copy=False)


class KeyTable(Protocol):
    """The C kernels' table of the latest position of every key (see ``_kernels.c``)."""

    @property
    def nbytes(self) -> int: ...

    @property
    def with_events(self) -> bool: ...

    def __len__(self) -> int: ...

    def add(self, hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64], pos: npt.NDArray[np.int64] | None = None,
            first: int = 0, part_shift: int = 64, part: int = 0) -> int: ...

    def add_grouped(self, sources: Sequence[tuple[bytearray, npt.NDArray[np.int64]]], part_shift: int = 64,
                    part: int = 0) -> bool:
        """Put the records of :func:`partition_keys` results that lie in this table's part,
        group after group; ``False`` when crafted keys crowd the table (some of them may
        be in it then)."""

    def contains(self, hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64]) -> bytearray: ...

    def lookup(self, hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64]) -> tuple[bytearray, None]:
        """The position held for each key (int64, -1 where none)."""

    def finish(self, keep: bool = False) -> tuple[bytearray, bytearray, bytearray]: ...

    def prepare_lookups(self) -> None: ...


class EventKeyTable(Protocol):
    """The C kernels' table of each key's record with the greatest ``(event time,
    position)``: a :class:`KeyTable` made with ``with_events=True``, 32 bytes a slot."""

    @property
    def nbytes(self) -> int: ...

    @property
    def with_events(self) -> bool: ...

    def __len__(self) -> int: ...

    def add(self, hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64], pos: npt.NDArray[np.int64] | None = None,
            first: int = 0, part_shift: int = 64, part: int = 0, *, event: npt.NDArray[np.int64]) -> int: ...

    def contains(self, hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64]) -> bytearray: ...

    def lookup(self, hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64]) -> tuple[bytearray, bytearray]:
        """The position and event time held for each key (int64 each, -1 and 0 where none)."""

    def finish(self, keep: bool = False) -> tuple[bytearray, bytearray, bytearray, bytearray]: ...

    def prepare_lookups(self) -> None: ...


def distinct_estimate(his: Sequence[npt.NDArray[np.uint64]]) -> int | None:
    """About how many distinct values the arrays hold together (HyperLogLog, within a
    few per cent), or ``None`` without the C kernels."""
    if _native is None:
        return None
    return int(_native.distinct_estimate([np.ascontiguousarray(h, dtype=np.uint64) for h in his]))


def partition_keys(runs: Sequence[tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], npt.NDArray[np.int64] | None,
                                        int]],
                   bits: int, out: bytearray | None = None) -> tuple[bytearray, npt.NDArray[np.int64]] | None:
    """The records of ``runs`` (``(hi, lo, pos, first)`` as :meth:`KeyTable.add` takes
    them) grouped by the top ``bits`` bits of their hash: 24 bytes a record (written into
    ``out`` when it is big enough: a buffer handed back costs no fresh pages), and where
    each group ends; for :meth:`KeyTable.add_grouped`.  ``None`` without the C kernels."""
    if _native is None:
        return None
    records, ends = _native.partition_keys(list(runs), bits, out)
    return records, np.frombuffer(ends, dtype=np.int64)


def new_key_table(expected: int = 0) -> KeyTable | None:
    """An empty table for the latest position of every key (with room for ``expected``
    keys from the start), or ``None`` without the C kernels
    (:class:`shale.compactor.keymap.KeyMapBuilder` then merges sorted runs)."""
    if _native is None:
        return None
    table: KeyTable = _native.KeyTable(expected)
    return table


def new_event_key_table(expected: int = 0) -> EventKeyTable | None:
    """An empty table for the position and event time of each key's record with the
    greatest ``(event time, position)`` (with room for ``expected`` keys from the start),
    or ``None`` without the C kernels (:class:`shale.compactor.event_map.EventKeyMapBuilder`
    then merges sorted runs)."""
    if _native is None:
        return None
    table: EventKeyTable = _native.KeyTable(expected, with_events=True)
    return table


def _check_ranges(size: int, s: npt.NDArray[np.int64], e: npt.NDArray[np.int64]) -> None:
    if len(s) != len(e):
        raise ValueError("starts and ends must be int64 buffers of one length")
    bad = (s < 0) | (e < s) | (e > size)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"range {i} ({int(s[i])}..{int(e[i])}) lies outside the buffer of {size} bytes")
