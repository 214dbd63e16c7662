"""Records' event times: from a footer where it gives them (format version 3), else
decoded from the records themselves.

A record's event time is the one its producer gave it, or :data:`NO_EVENT_TIME` where it
has none.  A compaction run that keeps event times copies each record's into the footer
of the part it writes, so it takes them from the footer of the object it reads when that
footer has them, and decodes the records it copies otherwise (objects written before
version 3, parts written by runs that did not keep them); a scrub decodes every record
and compares where the footer says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt

from shale.ledger.errors import CorruptLedgerError
from shale.ledger.format import FRAME_HEADER, NO_EVENT_TIME
from shale.ledger.kernels import Scratch, record_columns

if TYPE_CHECKING:
    from shale.ledger.reader import LedgerFile

__all__ = ["check_event_times", "copied_event_times", "decoded_event_times", "event_times_at"]

#: Records decoded at once (their decoded columns take ~100 bytes each).
_BLOCK: Final = 1 << 18
#: Decompressed bytes :func:`read_event_times` holds at once unless told
#: (:data:`~shale.ledger.reader.RAW_BATCH_BYTES`).
_RAW_BYTES: Final = 64 << 20
#: Records of an entry read as a stream decoded at once.
_GROUP_BYTES: Final = 1 << 20

I64 = npt.NDArray[np.int64]


def decoded_event_times(f: LedgerFile, raw: bytes | bytearray | memoryview, frames: I64, counts: I64,
                        records: I64) -> I64:
    """The event time (:data:`NO_EVENT_TIME` where none) of each of ``records`` of
    ``f``, decoded: checked records, ``counts[i]`` of them in the entry whose frame starts
    at ``frames[i]`` of ``raw`` (laid out as :meth:`~shale.ledger.reader.LedgerFile.raw_frames` gives it)."""
    return _decoded_times(f, raw, frames, counts, records)[0]


def _decoded_times(f: LedgerFile, raw: bytes | bytearray | memoryview, frames: I64, counts: I64,
                   records: I64) -> tuple[I64, I64]:
    """:func:`decoded_event_times`, and each record's own publish time."""
    foot = f.footer
    at = np.repeat(frames + FRAME_HEADER.size, counts) + foot.col("r_offset")[records].astype(np.int64)
    return _times_at(f, raw, at, records)


def event_times_at(f: LedgerFile, buf: bytes | bytearray | memoryview, at: I64, records: I64) -> I64:
    """The event time (:data:`NO_EVENT_TIME` where none) of each of ``records`` of ``f``
    (checked records, which start in ``buf`` at ``at``): from the footer when it gives
    them, else decoded."""
    known = f.event_times()
    if known is not None:
        return np.asarray(known[records], dtype=np.int64)
    return _times_at(f, buf, at, records)[0]


def _times_at(f: LedgerFile, raw: bytes | bytearray | memoryview, at: I64, records: I64) -> tuple[I64, I64]:
    """The event and publish times of ``records``, decoded where they start in ``raw`` (``at``)."""
    foot = f.footer
    sizes = foot.col("r_size")[records].astype(np.int64)
    out = np.empty(len(records), dtype=np.int64)
    publish = np.empty(len(records), dtype=np.int64)
    for a in range(0, len(records), _BLOCK):  # (arrays bounded by records, not bytes)
        b = min(a + _BLOCK, len(records))
        bad, cols = record_columns(raw, at[a:b], sizes[a:b])
        if cols is None:
            mid = f.record_id(int(records[a + bad]))
            raise CorruptLedgerError(f"{f.url}: record {mid} cannot be decoded", path=f.url)
        out[a:b] = np.where(cols.has_event, cols.event, np.int64(NO_EVENT_TIME))
        publish[a:b] = cols.publish
    return out, publish


def copied_event_times(f: LedgerFile, buf: bytes | memoryview, base: int, sel: I64, kept: I64, rec: I64,
                       scratch: Scratch | None = None) -> I64:
    """The event time (:data:`NO_EVENT_TIME` where none) of each of the records ``rec``
    of ``f`` that compaction copies (``kept[i]`` of them from entry ``sel[i]``, their frames checked,
    inside ``buf`` read from ``base``; the records checked): from the footer when it
    gives them, else decoded, decompressing what is compressed (into ``scratch``)."""
    known = f.event_times()
    if known is not None:
        return np.asarray(known[rec], dtype=np.int64)
    out = np.empty(len(rec), dtype=np.int64)
    first = np.zeros(len(sel) + 1, dtype=np.int64)
    np.cumsum(kept, out=first[1:])
    i = 0
    for piece, raw, frames in f.decompressed(buf, base, np.asarray(sel, dtype=np.int64), scratch):
        j = i + len(piece)
        a, b = int(first[i]), int(first[j])
        out[a:b] = decoded_event_times(f, raw, frames, kept[i:j], rec[a:b])
        i = j
    return out


def check_event_times(f: LedgerFile, raw: bytes | bytearray | memoryview, frames: I64, counts: I64,
                      records: I64) -> None:
    """Each of ``records`` (checked, laid out as for :func:`decoded_event_times`) has the
    event time its footer gives, when the footer gives them: a footer that says otherwise
    would make compaction keep another record than the newest."""
    known = f.event_times()
    if known is None or not len(records):
        return
    decoded, publish = _decoded_times(f, raw, frames, counts, records)
    kept_publish = f.footer.cols.get("r_publish")
    if kept_publish is not None:
        # a record's entry was published no earlier than the record itself
        early = np.flatnonzero(kept_publish[records] < publish)
        if len(early):
            index = int(records[early[0]])
            e = int(f.footer.entry_of(index))
            raise CorruptLedgerError(
                f"{f.url}: record {f.record_id(index)}: its footer's publish time {int(kept_publish[index])} is "
                f"before the record's own {int(publish[early[0]])}", path=f.url,
                position=int(f.footer.col("e_offset")[e]))
    wrong = np.flatnonzero(decoded != known[records])
    if len(wrong):
        index = int(records[wrong[0]])
        e = int(f.footer.entry_of(index))
        raise CorruptLedgerError(
            f"{f.url}: record {f.record_id(index)}: its event time {_shown(int(decoded[wrong[0]]))} is not the "
            f"{_shown(int(known[index]))} its footer gives", path=f.url, position=int(f.footer.col("e_offset")[e]))


def _shown(ms: int) -> str:
    return "none" if ms == NO_EVENT_TIME else str(ms)


def read_event_times(f: LedgerFile, start: int = 0, stop: int | None = None, raw_bytes: int = _RAW_BYTES) -> I64:
    """The event time (:data:`NO_EVENT_TIME` where none) of records ``[start, stop)`` of
    ``f``: from the footer when it gives them, else read and decoded (the entries holding
    them, checked, in chunks of at most ``raw_bytes`` decompressed; an entry bigger than
    that read on its own as a stream, :data:`_GROUP_BYTES` of records at a time)."""
    stop = f.n_records if stop is None else stop
    known = f.event_times()
    if known is not None:
        return np.asarray(known[start:stop], dtype=np.int64)
    out = np.empty(stop - start, dtype=np.int64)
    if stop <= start:
        return out
    foot = f.footer
    starts = foot.e_rec_start
    e0 = int(np.searchsorted(starts, start, side="right")) - 1
    e1 = int(np.searchsorted(starts, stop, side="left"))
    scratch = Scratch()
    for c0, c1 in f.chunks(e0, e1, raw_bytes=raw_bytes):
        if c1 == c0 + 1 and int(foot.raw_lengths()[c0]) > raw_bytes:
            _streamed_times(f, c0, start, stop, out, raw_bytes)
            continue
        base, buf = f.read_frames(c0, c1)
        f.check_frames(buf, base, c0, c1)
        for piece, raw, frames in f.decompressed(buf, base, np.arange(c0, c1, dtype=np.int64), scratch):
            first = starts[piece].astype(np.int64)
            counts = starts[piece + 1].astype(np.int64) - first
            records = np.repeat(first - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
            times = decoded_event_times(f, raw, frames, counts, records)
            inside = (records >= start) & (records < stop)
            out[records[inside] - start] = times[inside]
    return out


def _streamed_times(f: LedgerFile, e: int, start: int, stop: int, out: I64, piece: int) -> None:
    """:func:`read_event_times` of the records of entry ``e`` (those in ``[start, stop)``
    into ``out``), read as a stream in ranged reads of ``piece`` bytes, every record
    checked and the whole frame proven."""
    from shale.ledger.stream import record_groups

    foot = f.footer
    r0, r1 = int(foot.e_rec_start[e]), int(foot.e_rec_start[e + 1])
    rec = np.arange(r0, r1, dtype=np.int64)
    stream = f.entry_stream(e, f.stored_payload(e, min(piece, _GROUP_BYTES)))
    for a, b, view, at in record_groups(stream, foot.col("r_offset")[rec], foot.col("r_size")[rec], _GROUP_BYTES):
        f.check_payload(view, e, rec[a:b], starts=at)
        times = _times_at(f, view, at, rec[a:b])[0]
        inside = (rec[a:b] >= start) & (rec[a:b] < stop)
        out[rec[a:b][inside] - start] = times[inside]
    stream.finish()
