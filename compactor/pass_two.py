"""Pass two: copy the surviving records, in id order, into the new compacted ledger.

Records are copied as raw bytes, never re-encoded: an entry whose records all survive is
copied whole (frame and checksum unchanged; a compressed one only once it is proven to
decompress to what its footer says); otherwise its surviving records' bytes are joined
into a new frame.  When the run keeps event times (``CompactionConfig.keeps_times``),
each record's goes with it into the new footer, from the footer it is copied from, or
decoded from the record when that footer does not say (:mod:`shale.ledger.events`);
otherwise the parts say nothing of them, and none is gathered.  Reads are large ranged
reads of consecutive entries; output parts roll at ``max_part_bytes`` and stream to
storage.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import field, replace
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from shale.compactor.big_entries import big_entries, copy_big_entry
from shale.compactor.config import CompactionConfig
from shale.compactor.packing import Frames, pack, record_ids
from shale.compactor.pass_one import Survivors
from shale.compactor.plan import Plan, Slice
from shale.ledger.codecs import Codec
from shale.ledger.deletions import encode_deletions
from shale.ledger.events import copied_event_times
from shale.ledger.format import FRAME_HEADER, KIND_COMPACTED
from shale.ledger.ids import MessageId
from shale.ledger.kernels import CopyPlan, Scratch, copy_plan, crc32c_ranges, gather_ranges
from shale.ledger.reader import LedgerFile
from shale.ledger.values import dataclass
from shale.ledger.writer import LedgerWriter
from shale.metadata.state import CompactedPart
from shale.runtime.throttle import Throttle
from shale.storage import Location
from shale.storage.write_behind import ThrottledWriter, WriteBehind

__all__ = ["Copy", "Fate", "PassTwoResult", "Work", "choose_reuse", "decide_work", "plan_work", "reuse_part",
           "slice_fate", "write_parts", "write_vectors"]


@dataclass(slots=True)
class PassTwoResult:
    parts: list[CompactedPart] = field(default_factory=list)
    records_written: int = 0
    records_reused: int = 0  # live records of previous parts kept in place
    bytes_written: int = 0
    bytes_read: int = 0


class _PartSink:
    """Writes compacted parts, rolling to a new object at ``max_part_bytes``.

    The writes go on in ``writes`` (one thread) while the next batch is built, so a
    batch is built in one of two buffers taken in turn (:meth:`batch_buffer`), each
    reused once the writes of the batch before last are done."""

    def __init__(self, topic: Location, run_dir: str, epoch: int, now_ms: int, max_part_bytes: int,
                 result: PassTwoResult, on_object: Callable[[str], None], writes: ThreadPoolExecutor,
                 name_prefix: str = "part-", throttle: Throttle | None = None) -> None:
        self.topic, self.run_dir, self.epoch, self.now_ms = topic, run_dir, epoch, now_ms
        self.name_prefix = name_prefix
        #: parts keep records' publish times only where one lacks an event time (event order)
        self.publish_for_untimed_only = False
        self.throttle = throttle
        self.max_part_bytes = max_part_bytes
        #: bytes of writes that may wait for the disk or the network
        self.max_pending_bytes = 64 << 20
        self.result = result
        self.on_object = on_object
        self._writes = writes
        self._writer: LedgerWriter | None = None
        self._upload: WriteBehind | None = None
        self._name = ""
        self._first: MessageId | None = None
        self._last: MessageId | None = None
        self._buffers = (Scratch(), Scratch())  # reused batch after batch (fresh pages cost more than the copy)
        #: where entries are decompressed, batch after batch (read only while a batch is built)
        self.raw_buffer = Scratch()
        self._in_use: list[tuple[WriteBehind, int] | None] = [None, None]  # writes still reading each buffer
        self._turn = 0

    def batch_buffer(self) -> Scratch:
        """The buffer to build the next batch in; call :meth:`batch_done` once the batch
        has been handed to the writer."""
        held = self._in_use[self._turn]
        if held is not None and held[0] is self._upload:
            held[0].wait_for(held[1])  # (a part closed or aborted since has finished its writes)
        self._in_use[self._turn] = None
        return self._buffers[self._turn]

    @property
    def upload(self) -> WriteBehind | None:
        """The writes of the part being written (None between parts)."""
        return self._upload

    def release_buffers(self) -> None:
        """Give back the batch buffers, once every write waiting is done: a big entry
        copied as a stream takes their place (:mod:`shale.compactor.big_entries`)."""
        if self._upload is not None:
            self._upload.drain(0)  # (and every other write waiting)
        self._in_use = [None, None]
        self._buffers = (Scratch(), Scratch())
        self.raw_buffer = Scratch()

    def batch_done(self) -> None:
        up = self._upload
        self._in_use[self._turn] = (up, up.submitted) if up is not None else None
        self._turn ^= 1

    def writer(self) -> LedgerWriter:
        if self._writer is None:
            self._name = f"{self.run_dir}/{self.name_prefix}{len(self.result.parts):05d}.ledger"
            self.on_object(self._name)
            upload = self.topic.store.open_writer(self.topic.key(self._name))
            self._upload = WriteBehind(ThrottledWriter(upload, self.throttle) if self.throttle else upload,
                                       self._writes, max_pending_bytes=self.max_pending_bytes)
            self._writer = LedgerWriter(self._upload, kind=KIND_COMPACTED, ledger_id=self.epoch,
                                        created_ms=self.now_ms)
            self._writer.publish_for_untimed_only = self.publish_for_untimed_only
        return self._writer

    def note_ids(self, first: MessageId, last: MessageId) -> None:
        if self._first is None:
            self._first = first
        self._last = last
        w = self._writer
        if w is not None and w.estimated_size >= self.max_part_bytes:
            self.close()

    def close(self) -> None:
        w, up = self._writer, self._upload
        if w is None or up is None:
            return
        size = w.finish()
        up.close()
        self.result.parts.append(CompactedPart(self._name, w.n_entries, w.n_records, size,
                                               self._first, self._last, ledger_id=self.epoch,
                                               raw_bytes=size + w.bytes_saved))
        self.result.bytes_written += size
        self.result.records_written += w.n_records
        self._writer = self._upload = None
        self._first = self._last = None

    def abort(self) -> None:
        if self._upload is not None:
            self._upload.abort()
        self._writer = self._upload = None


def plan_work(plan: Plan, survivors: Survivors, config: CompactionConfig, *, topic: Location, run_dir: str,
              on_object: Callable[[str], None]) -> list[Work]:
    """What pass two does with each slice, in order: copy its kept records, or keep the
    previous part in place (its deletion vector is written here)."""
    work, vectors = decide_work(plan, survivors, config, run_dir=run_dir, on_object=on_object)
    write_vectors(topic, vectors)
    return work


def decide_work(plan: Plan, survivors: Survivors, config: CompactionConfig, *, run_dir: str,
                on_object: Callable[[str], None]) -> tuple[list[Work], list[tuple[str, bytes]]]:
    """:func:`plan_work` without the writing: the work, and the deletion vectors (name
    under the topic, bytes) of the parts kept in place, for the caller to write before
    the run publishes.  Every name has been passed to ``on_object``."""
    work: list[Work] = []
    vectors: list[tuple[str, bytes]] = []
    keeps = [survivors.slice_keep(i) for i in range(len(plan.slices))]
    fates = [slice_fate(s, int(np.count_nonzero(keep)), config) for s, keep in zip(plan.slices, keeps, strict=True)]
    for i, (s, keep, reuse) in enumerate(zip(plan.slices, keeps, choose_reuse(fates), strict=True)):
        if reuse:
            assert s.part is not None
            work.append(reuse_part(s.part, plan.previous.part_ledger_id(s.part), ~keep, s.gone,
                                   f"{run_dir}/deletions-{len(vectors):05d}.bin", vectors))
        else:
            work.append(Copy(s, keep, survivors.slice_delete_since(i)))
    for name, _ in vectors:
        on_object(name)
    return work, vectors


def write_vectors(topic: Location, vectors: list[tuple[str, bytes]]) -> None:
    """Write deletion vectors, all at once: an object store answers each with latency,
    and a local folder commits several files' syncs together."""
    if len(vectors) > 1:
        with ThreadPoolExecutor(max_workers=min(len(vectors), 8), thread_name_prefix="shale-deletions") as pool:
            list(pool.map(lambda v: topic.store.put(topic.key(v[0]), v[1]), vectors))
    elif vectors:
        topic.store.put(topic.key(vectors[0][0]), vectors[0][1])


class Fate(enum.Enum):
    """What pass two does with a slice."""

    #: keep a previous part in place (with a deletion vector) rather than copy it: it is
    #: big enough to be worth it and mostly live
    REUSE = "reuse"
    #: copy its kept records: mostly dead, or not a whole previous part
    COPY = "copy"
    #: mostly live but small: copied when that merges it with a neighbour (see :func:`decide_work`)
    SMALL = "small"


def slice_fate(s: Slice, live: int, config: CompactionConfig) -> Fate:
    """The fate of slice ``s`` of which ``live`` records survive (before its neighbours
    are considered: see :func:`choose_reuse`)."""
    if not s.compacted or s.part is None or s.start != 0 or s.stop != s.object.records:
        return Fate.COPY
    if live == 0 or live < config.reuse_min_live * s.part.records:
        return Fate.COPY
    return Fate.REUSE if s.part.bytes >= config.reuse_min_bytes else Fate.SMALL


def choose_reuse(fates: list[Fate]) -> list[bool]:
    """Which slices, of those whose fates are given in order, are kept in place."""
    out = []
    for i, fate in enumerate(fates):
        if fate is Fate.SMALL:
            # Copying a small part merges it with a neighbour that is copied too; with
            # none (its neighbours are kept in place), the copy would only rewrite it.
            near = fates[max(0, i - 1):i] + fates[i + 1:i + 2]
            out.append(not any(f in (Fate.COPY, Fate.SMALL) for f in near))
        else:
            out.append(fate is Fate.REUSE)
    return out


def reuse_part(part: CompactedPart, ledger_id: int, gone: npt.NDArray[np.bool_],
               old_gone: npt.NDArray[np.bool_] | None, name: str, vectors: list[tuple[str, bytes]]) -> CompactedPart:
    """``part`` kept in place, ``gone`` (one flag per record) no longer live; its new
    deletion vector, if it needs one, is added to ``vectors`` (name, bytes) for the
    caller to write.  ``old_gone``: what its current vector removes."""
    if old_gone is not None and np.array_equal(gone, old_gone):
        return replace(part, ledger_id=ledger_id)  # nothing new deleted: same vector
    positions = np.flatnonzero(gone)
    if not len(positions):
        return replace(part, ledger_id=ledger_id, deletions=None, deleted=0)
    vectors.append((name, encode_deletions(positions, len(gone))))
    return replace(part, ledger_id=ledger_id, deletions=name, deleted=len(positions))


class Copy(NamedTuple):
    """Pass two's work on a slice: copy its kept records."""

    slice: Slice
    keep: npt.NDArray[np.bool_]  # one flag per record of the slice
    since: npt.NDArray[np.int64]  # per record: when a kept tombstone was first kept (0: not one)


#: One step of pass two, in id order: a copy, or a previous part kept in place.
Work = Copy | CompactedPart


def write_parts(work: Iterable[Work], config: CompactionConfig,
                *, topic: Location, run_dir: str, epoch: int, now_ms: int, on_object: Callable[[str], None],
                name_prefix: str = "part-") -> PassTwoResult:
    """Copy the kept records of each ``(slice, keep, delete_since)`` into parts named
    ``<run_dir>/<name_prefix>NNNNN.ledger``, in order.  A failure aborts the part being
    written; parts already closed are the caller's to remove."""
    result = PassTwoResult()
    reads = Throttle(config.max_read_bytes_per_s)
    writes = Throttle(config.max_write_bytes_per_s)
    writer_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shale-write")
    sink = _PartSink(topic, run_dir, epoch, now_ms, config.max_part_bytes, result, on_object, writer_thread,
                     name_prefix, writes if writes.rate else None)
    sink.publish_for_untimed_only = config.topic_order.by_event_time
    sink.max_pending_bytes = config.write_behind_bytes
    pool = ThreadPoolExecutor(max_workers=config.read_parallelism, thread_name_prefix="shale-read")
    try:
        for item in work:
            if isinstance(item, CompactedPart):  # a previous part kept in place, in id order
                sink.close()
                result.parts.append(item)
                result.records_reused += item.live
                continue
            s, keep, since = item
            _copy_slice(s, keep, since, sink, config, result, pool, reads)
            s.file.release_pages()  # the footer pages read for it (mapped again if needed)
        sink.close()
    except BaseException:
        # Reads and writes still in flight are waited for below: none may sleep on.
        reads.cancel()
        writes.cancel()
        sink.abort()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        writer_thread.shutdown(wait=True)
    return result


def _copy_slice(s: Slice, keep: np.ndarray, since: np.ndarray, sink: _PartSink, config: CompactionConfig,
                result: PassTwoResult, pool: ThreadPoolExecutor,
                reads: Throttle) -> None:
    if not keep.any():
        return
    f = s.file
    foot = f.footer
    rec_start = foot.e_rec_start
    # per-record survival over the whole object (the slice may start mid-object)
    if s.start == 0 and s.stop == f.n_records:
        full_keep = keep
    else:
        full_keep = np.zeros(f.n_records, dtype=bool)
        full_keep[s.start:s.stop] = keep
    full_since: np.ndarray | None = None  # only tombstones kept by an earlier run have one
    if since.any():
        full_since = np.zeros(f.n_records, dtype=np.int64)
        full_since[s.start:s.stop] = since
    per_entry = (np.add.reduceat(full_keep, rec_start[:-1], dtype=np.int64) if f.n_entries
                 else np.zeros(0, dtype=np.int64))
    # reduceat gives wrong sums for empty entries; entries always hold >= 1 record
    wanted = np.flatnonzero(per_entry > 0)
    spans = _spans(f, wanted, big_entries(f, config), config)

    def fetch(sel: np.ndarray) -> tuple[int, bytes | memoryview]:
        got = f.read_frames(int(sel[0]), int(sel[-1]) + 1)
        reads(len(got[1]))
        return got

    # Several ranged reads in flight (object stores answer each with latency, not
    # bandwidth), at most read_parallelism chunks ahead of the copy, and none past a big
    # entry before it is copied (what it holds takes the place of reads and batches).
    ahead: deque[Future[tuple[int, bytes | memoryview]]] = deque()
    nxt = 0
    for k, (sel, big) in enumerate(spans):
        if big:
            copy_big_entry(f, int(sel[0]), full_keep, full_since, sink, config, result, reads)
            continue
        while nxt < len(spans) and len(ahead) < config.read_parallelism:
            if spans[nxt][1]:
                if nxt > k:
                    break
                nxt += 1
                continue
            ahead.append(pool.submit(fetch, spans[nxt][0]))
            nxt += 1
        base, buf = ahead.popleft().result()
        lo_e, hi_e = int(sel[0]), int(sel[-1]) + 1
        result.bytes_read += len(buf)
        # Every frame that was read is checked, survivors or not: checksums cost little
        # next to the read, and corruption should not go unnoticed just because it sits
        # next to obsolete records.
        f.check_frames(buf, base, lo_e, hi_e)
        _copy_batch(f, sel, per_entry[sel], base, buf, full_keep, full_since, sink, config)


def _spans(f: LedgerFile, wanted: npt.NDArray[np.int64], big: npt.NDArray[np.bool_],
           config: CompactionConfig) -> list[tuple[npt.NDArray[np.int64], bool]]:
    """The entries ``wanted`` (those holding survivors) in the order pass two copies
    them: each big one alone (``True``), the rest in reads of consecutive entries that
    never reach over a big one, wanted or not (only the span of entries that hold
    survivors is read)."""
    spans: list[tuple[npt.NDArray[np.int64], bool]] = []
    lo, hi = int(wanted[0]), int(wanted[-1]) + 1
    edges = [*(np.flatnonzero(big[lo:hi]) + lo).tolist(), hi]
    start = lo
    for edge in edges:
        seg = wanted[np.searchsorted(wanted, start):np.searchsorted(wanted, edge)]
        if len(seg):
            for c0, c1 in f.chunks(int(seg[0]), int(seg[-1]) + 1, config.chunk_bytes,
                                   raw_bytes=config.chunk_raw_bytes, records=config.chunk_records):
                sel = seg[np.searchsorted(seg, c0):np.searchsorted(seg, c1)]
                if len(sel):
                    spans.append((sel, False))
        if edge < hi and _is_wanted(wanted, edge):
            spans.append((np.array([edge], dtype=np.int64), True))
        start = edge + 1
    return spans


def _is_wanted(wanted: npt.NDArray[np.int64], e: int) -> bool:
    i = int(np.searchsorted(wanted, e))
    return i < len(wanted) and int(wanted[i]) == e


def _copy_batch(f: LedgerFile, sel: npt.NDArray[Any], kept: npt.NDArray[np.int64], base: int,
                buf: bytes | memoryview, keep: npt.NDArray[np.bool_], since: npt.NDArray[np.int64] | None,
                sink: _PartSink, config: CompactionConfig) -> None:
    """Copy the kept records of entries ``sel`` (frames checked, all in ``buf`` read from
    ``base``): an entry whose records all survive keeps its stored bytes, compressed or
    not; the rest is packed into new entries, compressed as the run says
    (:mod:`shale.compactor.packing`).  A run that writes entries uncompressed copies the
    survivors of a partly kept uncompressed entry into a frame of their own
    (:func:`_copy_entries`) and packs only those of compressed entries."""
    if config.compression.codec != Codec.NONE:
        for frames in pack(f, sel, kept, base, buf, keep, config.compression, config.entry_bytes, sink.raw_buffer,
                           event_times=config.keeps_times):
            _write_frames(sink, frames, since)
        return
    foot = f.footer
    repack = (kept < foot.e_rec_start[sel + 1] - foot.e_rec_start[sel]) & (foot.codecs()[sel] != Codec.NONE)
    cuts = np.r_[0, np.flatnonzero(repack[1:] != repack[:-1]) + 1, len(sel)]
    for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
        if repack[a]:
            for frames in pack(f, sel[a:b], kept[a:b], base, buf, keep, config.compression, config.entry_bytes,
                               sink.raw_buffer, event_times=config.keeps_times):
                _write_frames(sink, frames, since)
        else:
            _copy_entries(f, sel[a:b], base, buf, keep, since, sink, config.keeps_times)


def _copy_entries(f: LedgerFile, sel: npt.NDArray[Any], base: int, buf: bytes | memoryview, keep: npt.NDArray[np.bool_],
                  since: npt.NDArray[np.int64] | None, sink: _PartSink, event_times: bool) -> None:
    """Copy the kept records of entries ``sel`` (all checked, all in ``buf`` read from
    ``base``; the partly kept ones stored uncompressed) in one batch: whole frames where
    every record survives, otherwise new frames of the surviving records' bytes (see
    :func:`_frames_blob`); ``event_times``: with each record's event time."""
    foot = f.footer
    plan = copy_plan(keep, foot.e_rec_start, sel, foot.col("e_offset")[sel].astype(np.int64) - base,
                     foot.col("e_length")[sel].astype(np.int64), foot.col("r_offset"), foot.col("r_size"))
    rec, kept, lengths = plan.rec, plan.kept, plan.lengths
    # every record copied is one well-formed record where the footer puts it (frames are
    # checked already, but a footer can still move a boundary between two records); a
    # compressed entry copied whole, its stored bytes unchanged, is first proven to
    # decompress to exactly what its footer says (docs/compaction.md)
    codecs = foot.codecs()[sel]
    stored = plan.whole & (codecs != Codec.NONE)
    if stored.any():
        f.check_kept(buf, base, sel[~stored], kept[~stored], rec[~np.repeat(stored, kept)])
        f.check_entries(buf, base, sel[stored], sink.raw_buffer)
    else:
        f.check_kept(buf, base, sel, kept, rec)
    frame_at = np.zeros(len(sel) + 1, dtype=np.int64)  # where each output frame starts, and the end
    np.cumsum(lengths, out=frame_at[1:])
    blob = _frames_blob(buf, plan, frame_at, sink.batch_buffer())
    ledgers, entries, r_batch = record_ids(f, sel, kept, rec, plan.in_entry)
    cols = {"r_hash_hi": foot.col("r_hash_hi")[rec], "r_hash_lo": foot.col("r_hash_lo")[rec],
            "r_flags": foot.col("r_flags")[rec], "r_offset": plan.new_off, "r_size": foot.col("r_size")[rec]}
    raw = np.where(plan.whole, foot.raw_lengths()[sel], lengths - FRAME_HEADER.size)
    events = copied_event_times(f, buf, base, sel, kept, rec, sink.raw_buffer) if event_times else None
    _write_frames(sink, Frames(blob, frame_at, kept, foot.col("e_publish")[sel], codecs, raw, cols, ledgers, entries,
                               r_batch, rec, events, foot.record_publish()[rec] if event_times else None), since)
    sink.batch_done()


def _write_frames(sink: _PartSink, fr: Frames, since: npt.NDArray[np.int64] | None) -> None:
    """Hand frames and their records' columns and original ids to the parts, rolling to
    a new part whenever one is full (``since``: per record of the ledger read, when a
    kept tombstone was first kept)."""
    n = len(fr.frame_at) - 1
    lengths = np.diff(fr.frame_at)
    n_rec = len(fr.rec)
    kept = fr.counts
    ledgers = np.broadcast_to(np.asarray(fr.ledgers, dtype=np.uint64), (n_rec,))
    entries = np.asarray(fr.entries, dtype=np.uint64)
    r_since = since[fr.rec] if since is not None else np.zeros(n_rec, dtype=np.int64)
    rb = np.concatenate([[0], np.cumsum(kept)])
    i0 = 0
    while i0 < n:
        # as many entries as the current part has room for (at least one)
        w = sink.writer()
        room = sink.max_part_bytes - w.estimated_size
        # what each entry adds to the part, its footer rows included
        cost = np.cumsum(lengths[i0:] + w.footer_bytes_per_entry + kept[i0:] * w.footer_bytes_per_record)
        if cost[0] > room and w.n_entries:
            sink.close()  # the next entry does not fit: it starts the next part
            continue
        i1 = i0 + max(1, int(np.searchsorted(cost, room, side="right")))
        a, b = int(rb[i0]), int(rb[i1])
        w.add_frames(fr.blob[int(fr.frame_at[i0]):int(fr.frame_at[i1])], lengths[i0:i1], kept[i0:i1],
                     fr.publish[i0:i1], {k: v[a:b] for k, v in fr.cols.items()}, codecs=fr.codecs[i0:i1],
                     raw_lengths=fr.raw_lengths[i0:i1], ledgers=ledgers[a:b], entry_ids=entries[a:b],
                     batch=fr.batches[a:b], delete_since=r_since[a:b],
                     events=None if fr.events is None else fr.events[a:b],
                     record_publish=None if fr.record_publish is None else fr.record_publish[a:b])
        sink.note_ids(MessageId(int(ledgers[a]), int(entries[a]), int(fr.batches[a])),
                      MessageId(int(ledgers[b - 1]), int(entries[b - 1]), int(fr.batches[b - 1])))
        i0 = i1


def _frames_blob(buf: bytes | memoryview, plan: CopyPlan, frame_at: npt.NDArray[np.int64],
                 scratch: Scratch) -> memoryview:
    """The output frames of a batch of entries, back to back: a whole entry's frame as
    read, or a new header and the runs of surviving bytes of a partly kept one.

    Everything is gathered from ``buf`` in one pass (a rebuilt frame's header is first
    copied from the old one, as a placeholder), then the rebuilt frames' checksums are
    taken over their new payloads and their headers written in place."""
    blob = gather_ranges(buf, plan.starts, plan.ends, scratch)
    rebuilt = np.flatnonzero(~plan.whole)
    if len(rebuilt):
        at = frame_at[rebuilt]
        heads = np.empty((len(rebuilt), 3), dtype="<u4")
        heads[:, 0] = plan.lengths[rebuilt] - FRAME_HEADER.size
        heads[:, 1] = crc32c_ranges(blob, at + FRAME_HEADER.size, frame_at[rebuilt + 1])
        heads[:, 2] = plan.kept[rebuilt]
        out = np.frombuffer(blob, dtype=np.uint8)
        out[at[:, None] + np.arange(FRAME_HEADER.size)] = heads.view(np.uint8).reshape(-1, FRAME_HEADER.size)
    return blob
