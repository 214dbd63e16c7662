"""Pass two's big entries: copied as they are read, never held whole.

An entry holding more, decompressed, than one of pass two's reads may
(``CompactionConfig.chunk_raw_bytes``, a sixteenth of a copying process's share under
``--max-memory``; :data:`~shale.ledger.reader.RAW_BATCH_BYTES` without it) is read alone,
in ranged reads of ``chunk_bytes`` (:class:`~shale.ledger.stream.StoredPayload`), its
payload decompressed as it is read (:class:`~shale.ledger.stream.PayloadStream`: zstd in
a window of the frame's own size, an entry stored as it is straight from the reads; an
lz4 block, which cannot be read in pieces, decompressed whole).

* **Kept whole:** its stored bytes are copied to the part as they are read, while every
  record is checked, a group of records at a time, and the frame proven to decompress to
  exactly what its footer says; it joins the part only once all of that held, and a
  failure aborts the part, so nothing undecodable is published.
* **Partly kept:** its survivors are read in order, checked, and packed into new entries
  of ``entry_bytes`` at most (or one record), each compressed as the run says; a record
  bigger than :data:`GROUP_BYTES` is compressed with zstd as a stream, twice (first for
  the size and checksum its frame's header gives, then for the bytes written after it:
  :func:`~shale.ledger.codecs.compress_pieces`), so that only the compressor is held
  beside it; a run writing lz4 keeps such a record as it is.

What this holds — the frame's window, the biggest record, a group's output, the
compressor — is what the memory budget counts for it (:mod:`shale.compactor.budget`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from shale.compactor.config import CompactionConfig
from shale.compactor.packing import record_ids
from shale.ledger.codecs import Codec, compress_pieces
from shale.ledger.events import event_times_at
from shale.ledger.format import FRAME_HEADER
from shale.ledger.ids import MessageId
from shale.ledger.reader import RAW_BATCH_BYTES, LedgerFile
from shale.ledger.stream import PayloadStream, record_groups
from shale.ledger.writer import LedgerWriter

if TYPE_CHECKING:
    from shale.compactor.pass_two import PassTwoResult, _PartSink

__all__ = ["GROUP_BYTES", "PART_ROWS_BYTES", "PIECE_BYTES", "ROW_BYTES", "big_entries", "copy_big_entry",
           "read_limit"]

I64 = npt.NDArray[np.int64]

#: A big entry's stored bytes are read this much at a time under a memory bound
#: (``chunk_bytes`` without one); a piece waits to be written while the next is read.
PIECE_BYTES: Final = 1 << 20
#: Records of a big entry checked at once, the most a new entry packed from its survivors
#: holds (bar one bigger record), and the most a big record's compressed output may take
#: before it is kept as it is.
GROUP_BYTES: Final = 1 << 20
#: The part being written is closed before a big entry when its footer's rows take more:
#: they are held while the entry is copied.
PART_ROWS_BYTES: Final = 1 << 20
#: Per record of a big entry copied whole, its rows in the part's footer (gathered, kept,
#: and encoded when the part is closed).
ROW_BYTES: Final = 256


def read_limit(config: CompactionConfig) -> int:
    """The most one of pass two's reads holds decompressed: an entry holding more is big."""
    return config.chunk_raw_bytes or RAW_BATCH_BYTES


def big_entries(f: LedgerFile, config: CompactionConfig) -> npt.NDArray[np.bool_]:
    """Which entries of ``f`` pass two copies alone, as streams."""
    return f.footer.raw_lengths() > read_limit(config)


def copy_big_entry(f: LedgerFile, e: int, keep: npt.NDArray[np.bool_], since: I64 | None, sink: _PartSink,
                   config: CompactionConfig, result: PassTwoResult, reads: Callable[[int], None]) -> None:
    """Copy the kept records (``keep``: a flag per record of ``f``) of big entry ``e``
    (see the module); ``since``: per record of ``f``, when a kept tombstone was first kept."""
    foot = f.footer
    r0, r1 = int(foot.e_rec_start[e]), int(foot.e_rec_start[e + 1])
    rec = np.flatnonzero(keep[r0:r1]).astype(np.int64) + r0
    if not len(rec):
        return
    sink.release_buffers()  # (what the entry holds takes the place of the batches' buffers)

    def read(a: int, b: int) -> bytes | memoryview:
        got = f.store.get_view(f.key, a, b)
        reads(len(got))
        return got

    stored = f.stored_payload(e, min(config.chunk_bytes, PIECE_BYTES) if config.chunk_raw_bytes else config.chunk_bytes,
                              read)
    result.bytes_read += int(foot.col("e_length")[e])
    group = GROUP_BYTES
    if len(rec) == r1 - r0:
        _copy_whole(f, e, rec, stored, since, sink, config, group)
    else:
        _copy_survivors(f, e, rec, f.entry_stream(e, stored), since, sink, config, group)


def _copy_whole(f: LedgerFile, e: int, rec: I64, stored: Any, since: I64 | None, sink: _PartSink,
                config: CompactionConfig, group: int) -> None:
    """Entry ``e`` copied as it is stored, its pieces written as they are read, every
    record checked and the frame proven whole before the part takes it."""
    foot = f.footer
    length = int(foot.col("e_length")[e])
    w = _part_for(sink, length, len(rec))
    up = sink.upload

    def copy(piece: memoryview, at: int) -> None:
        if up is not None:
            up.drain(0)  # (one piece waits to be written while the next is read)
        w.write_frame_bytes(piece)

    stored.watchers.append(copy)
    stream = f.entry_stream(e, stored)
    events = np.empty(len(rec), dtype=np.int64) if config.keeps_times else None
    for a, b, view, starts in record_groups(stream, foot.col("r_offset")[rec], foot.col("r_size")[rec], group):
        f.check_payload(view, e, rec[a:b], starts=starts)
        if events is not None:
            events[a:b] = event_times_at(f, view, starts, rec[a:b])
    stream.finish()
    _register(sink, w, f, e, rec, since, length, int(foot.codecs()[e]), int(foot.raw_lengths()[e]),
              foot.col("r_offset")[rec], events, config.keeps_times)


def _copy_survivors(f: LedgerFile, e: int, rec: I64, stream: PayloadStream, since: I64 | None, sink: _PartSink,
                    config: CompactionConfig, group: int) -> None:
    """The kept records ``rec`` of entry ``e`` read from its ``stream``, checked and
    packed into new entries of at most ``entry_bytes`` (or one record)."""
    foot = f.footer
    sizes = foot.col("r_size")[rec].astype(np.int64)
    for a, b, view, starts in record_groups(stream, foot.col("r_offset")[rec], foot.col("r_size")[rec],
                                                   min(group, config.entry_bytes)):
        f.check_payload(view, e, rec[a:b], starts=starts)
        if b == len(rec):
            stream.finish()  # (the whole frame proven before its last records are written)
        events = event_times_at(f, view, starts, rec[a:b]) if config.keeps_times else None
        n = int(starts[-1] + sizes[b - 1])
        if sink.upload is not None:
            sink.upload.drain(0)  # (the entry before is written before this one is made)
        codec, stored, crc, pieces = compress_pieces(view[:n], config.compression, group)
        length = FRAME_HEADER.size + stored
        w = _part_for(sink, length, b - a)
        w.write_frame_bytes(FRAME_HEADER.pack(stored, crc, b - a))
        for piece in pieces():
            if sink.upload is not None:
                sink.upload.drain(0)  # (one piece waits to be written while the next is made)
            w.write_frame_bytes(piece)
        _register(sink, w, f, e, rec[a:b], since, length, int(codec), n, starts.astype(np.uint32), events,
                  config.keeps_times)
        if codec == Codec.NONE and sink.upload is not None:
            sink.upload.wait_for(sink.upload.submitted)  # (the buffer written is read into again)


def _part_for(sink: _PartSink, length: int, count: int) -> LedgerWriter:
    """The part a frame of ``length`` bytes and ``count`` records goes into: the current
    one, unless it has entries and the frame would take it past its size, or its
    footer's rows are more than :data:`PART_ROWS_BYTES`."""
    w = sink.writer()
    cost = length + w.footer_bytes_per_entry + count * w.footer_bytes_per_record
    rows = w.n_records * w.footer_bytes_per_record
    if w.n_entries and (cost > sink.max_part_bytes - w.estimated_size or rows > PART_ROWS_BYTES):
        sink.close()
        w = sink.writer()
    return w


def _register(sink: _PartSink, w: LedgerWriter, f: LedgerFile, e: int, rec: I64, since: I64 | None, length: int,
              codec: int, raw: int, offsets: npt.NDArray[Any], events: I64 | None, keeps_times: bool) -> None:
    """Add the frame just written to ``w`` (one entry of the records ``rec`` of entry
    ``e``) with its records' footer rows and original ids."""
    foot = f.footer
    n = len(rec)
    r0 = int(foot.e_rec_start[e])
    ledgers, entries, batches = record_ids(f, np.array([e]), np.array([n], dtype=np.int64), rec,
                                           (rec - r0).astype(np.uint32))
    ledgers = np.broadcast_to(np.asarray(ledgers, dtype=np.uint64), (n,))
    entries = np.asarray(entries, dtype=np.uint64)
    cols = {"r_hash_hi": foot.col("r_hash_hi")[rec], "r_hash_lo": foot.col("r_hash_lo")[rec],
            "r_flags": foot.col("r_flags")[rec], "r_offset": np.asarray(offsets, dtype=np.uint32),
            "r_size": foot.col("r_size")[rec]}
    w.add_frames(None, np.array([length], dtype=np.int64), np.array([n], dtype=np.int64),
                 foot.col("e_publish")[[e]], cols, codecs=np.array([codec], dtype=np.uint8),
                 raw_lengths=np.array([raw], dtype=np.int64), ledgers=ledgers, entry_ids=entries, batch=batches,
                 delete_since=since[rec] if since is not None else np.zeros(n, dtype=np.int64),
                 events=events, record_publish=foot.record_publish()[rec] if keeps_times else None)
    sink.note_ids(MessageId(int(ledgers[0]), int(entries[0]), int(batches[0])),
                  MessageId(int(ledgers[-1]), int(entries[-1]), int(batches[-1])))
