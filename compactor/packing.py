"""Pass two's new entries: survivors packed together, compressed.

An entry whose records all survive is copied as it is stored (its frame and checksum
unchanged, compressed or not), once it is proven to decode to what its footer says.  The
rest is packed: each partly kept entry (and, when the
run compresses, each small one) is decompressed once, its survivors are checked, and the
survivors of neighbouring entries are cut into new entries of about ``entry_bytes``
(decompressed), each compressed on its own.  A new entry never spans an entry copied
whole, so the output keeps the records' order; every record keeps its original id (a
compacted part of format version 2 carries one per record) and, when the run keeps
them, its event time (version 3 keeps it in the footer).

Everything here works on one batch of entries read together and returns their output
as :class:`Frames`, for pass two to append to its parts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from shale.ledger.codecs import Codec, Compression, compress
from shale.ledger.events import copied_event_times
from shale.ledger.format import FRAME_HEADER, KIND_COMPACTED
from shale.ledger.kernels import Scratch, copy_plan, crc32c, gather_ranges
from shale.ledger.reader import RAW_BATCH_BYTES, LedgerFile

__all__ = ["SMALL_ENTRY_SHARE", "Frames", "compressed_frames", "pack", "record_ids"]

#: An entry holding less than this share of ``entry_bytes`` (decompressed) is packed with
#: its neighbours even when all its records survive, if the run compresses: one record or
#: a few compress badly on their own, and a producer sending tiny batches would otherwise
#: leave its tiny frames in the compacted ledger for good.
SMALL_ENTRY_SHARE = 16


class Frames(NamedTuple):
    """Complete frames to append, in order, and the footer rows of their records."""

    blob: bytes | memoryview  # the frames back to back
    frame_at: npt.NDArray[np.int64]  # where each starts in blob, then blob's length
    counts: npt.NDArray[np.int64]  # records per frame
    publish: npt.NDArray[Any]  # largest publish time per frame
    codecs: npt.NDArray[np.uint8]
    raw_lengths: npt.NDArray[np.int64]  # payload bytes per frame, decompressed
    cols: dict[str, npt.NDArray[Any]]  # r_hash_hi, r_hash_lo, r_flags, r_offset, r_size
    ledgers: Any  # original ids: one ledger for all, or one per record
    entries: npt.NDArray[np.uint64]
    batches: npt.NDArray[np.uint32]
    rec: npt.NDArray[np.int64]  # the source record of each, in the ledger read
    events: npt.NDArray[np.int64] | None  # each record's event time, when the run keeps them
    #: each record's publish time as the topic's order counts it, when the run keeps times
    record_publish: npt.NDArray[np.int64] | None = None


def record_ids(f: LedgerFile, sel: npt.NDArray[Any], kept: npt.NDArray[np.int64], rec: npt.NDArray[np.int64],
               in_entry: npt.NDArray[np.uint32]) -> tuple[Any, npt.NDArray[np.uint64], npt.NDArray[np.uint32]]:
    """The original ids of the kept records ``rec`` (``kept[i]`` of them from entry
    ``sel[i]``; ``in_entry``: each one's place in its entry): ledgers, entries, batches."""
    foot = f.footer
    if foot.ids_per_record:
        return foot.cols["r_ledger"][rec], foot.cols["r_entry"][rec], foot.cols["r_batch"][rec]
    if foot.kind == KIND_COMPACTED:  # version 1: ids per entry, batch indexes per record
        return (np.repeat(foot.cols["e_ledger"][sel], kept), np.repeat(foot.cols["e_entry"][sel], kept),
                foot.cols["r_batch"][rec])
    # an original ledger: a record's batch index is its place in its entry
    return f.ledger_id, np.repeat(np.asarray(sel, dtype=np.uint64), kept), in_entry


def pack(f: LedgerFile, sel: npt.NDArray[Any], kept: npt.NDArray[np.int64], base: int, buf: bytes | memoryview,
         keep: npt.NDArray[np.bool_], compression: Compression, entry_bytes: int,
         scratch: Scratch, *, event_times: bool = False) -> Iterator[Frames]:
    """The output of entries ``sel`` (``kept[i]`` records of ``sel[i]`` survive, by
    ``keep``; frames checked, inside ``buf`` read from ``base``) when the run compresses:
    big entries kept whole as they are stored, everything else packed.  In pieces whose
    decompressed bytes stay under :data:`~shale.ledger.reader.RAW_BATCH_BYTES`.
    ``event_times``: give each record's event time with it."""
    foot = f.footer
    counts = foot.e_rec_start[sel + 1] - foot.e_rec_start[sel]
    raw = foot.raw_lengths()[sel]
    whole = (kept == counts) & (raw >= entry_bytes // SMALL_ENTRY_SHARE)
    ends = np.cumsum(np.where(whole, 0, raw + FRAME_HEADER.size))
    i = 0
    while i < len(sel):
        j = max(i + 1, int(np.searchsorted(ends, (int(ends[i - 1]) if i else 0) + RAW_BATCH_BYTES, side="right")))
        yield _pack_piece(f, sel[i:j], kept[i:j], whole[i:j], base, buf, keep, compression, entry_bytes, scratch,
                          event_times)
        i = j


def _pack_piece(f: LedgerFile, sel: npt.NDArray[Any], kept: npt.NDArray[np.int64], whole: npt.NDArray[np.bool_],
                base: int, buf: bytes | memoryview, keep: npt.NDArray[np.bool_], compression: Compression,
                entry_bytes: int, scratch: Scratch, event_times: bool) -> Frames:
    foot = f.footer
    offs = foot.col("e_offset")[sel].astype(np.int64) - base
    lens = foot.col("e_length")[sel].astype(np.int64)
    # every kept record, in order, and its place in its entry
    plan = copy_plan(keep, foot.e_rec_start, sel, offs, lens, foot.col("r_offset"), foot.col("r_size"))
    rec, owner = plan.rec, np.repeat(np.arange(len(sel)), kept)
    codecs = foot.codecs()[sel]
    in_whole = whole[owner]
    # Entries kept whole keep their stored bytes: the records of those stored as they are
    # are checked where they lie, and a compressed one is first proven to decompress to
    # exactly what its footer says (every record checked), in bounded pieces, so that
    # nothing undecodable is ever published.
    plain = whole & (codecs == Codec.NONE)
    if plain.any():
        f.check_kept(buf, base, sel[plain], kept[plain], rec[plain[owner]])
    stored = whole & (codecs != Codec.NONE)
    if stored.any():
        f.check_entries(buf, base, sel[stored], scratch)
    offsets = foot.col("r_offset")[rec].copy()
    packed = _packed(f, sel, kept, whole, owner[~in_whole], rec[~in_whole], base, buf, compression, entry_bytes,
                     scratch)
    offsets[~in_whole] = packed.offsets
    # the output frames in order: an entry kept whole at its place, a packed entry at its
    # first record's (none spans an entry kept whole)
    w = np.flatnonzero(whole)
    order = np.argsort(np.r_[w, packed.at_entry], kind="stable")
    view = memoryview(buf)
    frames = [view[o:o + n] for o, n in zip(offs[w].tolist(), lens[w].tolist(), strict=True)] + packed.frames
    ordered = [frames[k] for k in order.tolist()]
    frame_at = np.zeros(len(ordered) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in ordered], out=frame_at[1:])
    publish = foot.col("e_publish")[sel]
    ledgers, entries, batches = record_ids(f, sel, kept, rec, plan.in_entry)
    # (scratch is free again: the packed records were copied out of it)
    events = copied_event_times(f, buf, base, sel, kept, rec, scratch) if event_times else None
    return Frames(
        b"".join(ordered), frame_at, np.r_[kept[w], packed.counts][order].astype(np.int64),
        np.r_[publish[w], packed.publish][order], np.r_[codecs[w], packed.codecs][order].astype(np.uint8),
        np.r_[foot.raw_lengths()[sel][w], packed.raw][order].astype(np.int64),
        {"r_hash_hi": foot.col("r_hash_hi")[rec], "r_hash_lo": foot.col("r_hash_lo")[rec],
         "r_flags": foot.col("r_flags")[rec], "r_offset": offsets, "r_size": foot.col("r_size")[rec]},
        ledgers, entries, batches, rec, events, f.footer.record_publish()[rec] if event_times else None)


class _Packed(NamedTuple):
    frames: list[bytes]
    at_entry: npt.NDArray[np.int64]  # index into sel of each new entry's first record's entry
    counts: npt.NDArray[np.int64]
    publish: npt.NDArray[Any]
    codecs: npt.NDArray[np.uint8]
    raw: npt.NDArray[np.int64]
    offsets: npt.NDArray[np.uint32]  # each packed record's offset in its new entry


def _packed(f: LedgerFile, sel: npt.NDArray[Any], kept: npt.NDArray[np.int64], whole: npt.NDArray[np.bool_],
            owner: npt.NDArray[np.int64], rec: npt.NDArray[np.int64], base: int, buf: bytes | memoryview,
            compression: Compression, entry_bytes: int, scratch: Scratch) -> _Packed:
    """The new entries of the records ``rec`` (``owner``: the index into ``sel`` of each
    one's entry) of the entries of ``sel`` not kept whole."""
    foot = f.footer
    if not len(rec):
        e = np.zeros(0, dtype=np.int64)
        return _Packed([], e, e, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint8), e,
                       np.zeros(0, dtype=np.uint32))
    p = np.flatnonzero(~whole)
    raw, frames = f.raw_frames(buf, base, sel[p], scratch)
    f.check_kept(raw, base, sel[p], kept[p], rec, frames=frames)
    sizes = foot.col("r_size")[rec].astype(np.int64)
    # (frames of the decompressed entries, by the index into sel of each record's entry)
    frame_of = np.zeros(len(sel), dtype=np.int64)
    frame_of[p] = frames
    at = frame_of[owner] + FRAME_HEADER.size + foot.col("r_offset")[rec].astype(np.int64)
    survivors = gather_ranges(raw, at, at + sizes)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    # a new entry holds the records whose first byte falls in its entry_bytes, counted
    # from the start of their run (the records between two entries kept whole)
    run = np.cumsum(whole)[owner]
    first_of_run = np.r_[True, run[1:] != run[:-1]]
    local = starts - np.maximum.accumulate(np.where(first_of_run, starts, 0))
    group = local // entry_bytes
    firsts = np.flatnonzero(first_of_run | np.r_[True, group[1:] != group[:-1]])
    bounds = np.r_[starts[firsts], ends[-1]]
    counts = np.diff(np.r_[firsts, len(rec)]).astype(np.int64)
    out, codecs = compressed_frames(survivors, bounds, counts, compression)
    publish = np.maximum.reduceat(foot.col("e_publish")[sel][owner], firsts)
    return _Packed(out, owner[firsts], counts, publish, codecs, np.diff(bounds),
                   (starts - np.repeat(bounds[:-1], counts)).astype(np.uint32))


def compressed_frames(payloads: memoryview, bounds: npt.NDArray[np.int64], counts: npt.NDArray[Any],
                      compression: Compression) -> tuple[list[bytes], npt.NDArray[np.uint8]]:
    """Frames of the payloads ``payloads[bounds[i]:bounds[i + 1]]`` (``counts[i]``
    records each), each compressed with ``compression`` where that makes it smaller,
    and their codecs."""
    frames: list[bytes] = []
    codecs = np.empty(len(counts), dtype=np.uint8)
    for i, (a, b, n) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist(), counts.tolist(), strict=True)):
        codec, stored = compress(payloads[a:b], compression)
        codecs[i] = codec
        frames.append(FRAME_HEADER.pack(len(stored), crc32c(stored), n) + bytes(stored))
    return frames, codecs

