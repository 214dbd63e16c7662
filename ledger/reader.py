"""Reading one ledger object: its footer index, checked frames, decoded messages."""

from __future__ import annotations

import contextlib
import functools
import mmap
from collections.abc import Callable, Iterator
from typing import Final

import numpy as np
import numpy.typing as npt

from shale.ledger.codecs import Codec, DictionarySource, decompress
from shale.ledger.errors import CorruptLedgerError
from shale.ledger.events import check_event_times
from shale.ledger.format import (
    FRAME_HEADER,
    HEADER_SIZE,
    KIND_COMPACTED,
    KIND_ORIGINAL,
    Footer,
    checksum,
    decode_footer,
    decode_header,
    decode_trailer,
)
from shale.ledger.ids import MessageId
from shale.ledger.kernels import Scratch, check_frames, check_kept, check_records, gather_ranges, record_problem
from shale.ledger.messages import DEFAULT_HOLD_BYTES, messages_at, messages_in
from shale.ledger.objects import ObjectSource
from shale.ledger.record import DEFAULT_MAX_RECORD_BYTES, Message
from shale.ledger.stream import PayloadStream, StoredPayload
from shale.ledger.zstd_frames import decompress_zstd_each, decompress_zstd_into

__all__ = ["DEFAULT_CHUNK_BYTES", "RAW_BATCH_BYTES", "LedgerFile"]

#: Size of the ranged reads used to stream entries (big sequential reads are cheap).
DEFAULT_CHUNK_BYTES: Final = 8 * 1024 * 1024
_TAIL_BYTES: Final = 256 * 1024
#: Decompressed bytes held at once when checking or copying the records of many entries.
RAW_BATCH_BYTES: Final = 64 * 1024 * 1024
#: Records whose keys are hashed again at once (their decoded columns take ~100 bytes each).
_KEY_BLOCK: Final = 1 << 18
_NO_LIMIT: Final = 1 << 62
#: Fewer zstd entries than this are decompressed one by one (reading headers together
#: pays from a few on).
_MIN_BATCHED_FRAMES: Final = 4


class LedgerFile:
    """An opened ledger object: the footer is in memory, entries are read on demand."""

    def __init__(self, store: ObjectSource, key: str, footer: Footer, size: int,
                 footer_bytes: int = 0, dictionaries: DictionarySource | None = None) -> None:
        self.store = store
        self.key = key
        self.footer = footer
        self.size = size
        #: the topic's zstd dictionaries, for entries compressed with one
        self.dictionaries = dictionaries
        #: bytes fetched to open the object (trailer + footer), for I/O accounting
        self.footer_bytes = footer_bytes
        self._header_checked = False
        #: the footer's checksum as the trailer gives it (checked against the footer when opened; 0: not opened so)
        self.footer_crc = 0
        #: the key of this compacted part's Arrow cache, where the view that opened it names one
        #: (:mod:`shale.ledger.arrow_cache`): Arrow batches are read from there
        self.arrow_cache: str | None = None
        #: the mapped file the footer's columns are views of (a local object's big footer), else None
        self._mapped: mmap.mmap | None = None
        self._ledgers: npt.NDArray[np.uint64] | None = None
        self._entries: npt.NDArray[np.uint64] | None = None
        self._batches: npt.NDArray[np.uint32] | None = None
        self._events: npt.NDArray[np.int64] | None = None

    @classmethod
    def open(cls, store: ObjectSource, key: str, *, ledger_id: int | None = None,
             kind: int | None = None, dictionaries: DictionarySource | None = None) -> LedgerFile:
        """Read and check the trailer and footer of ``key`` (one ranged read when small).

        ``ledger_id`` and ``kind``, when given, must match what the object says it is:
        an object registered under the wrong id would otherwise yield wrong message ids.
        ``dictionaries``: the topic's, for entries compressed with a dictionary.
        """
        where = store.url(key)
        tail, size = store.get_tail(key, _TAIL_BYTES)
        trailer = decode_trailer(tail, size, where)
        if (ledger_id is not None and trailer.ledger_id != ledger_id) or (kind is not None and trailer.kind != kind):
            raise CorruptLedgerError(
                f"{where}: object is ledger {trailer.ledger_id} of kind {trailer.kind}, registered as ledger "
                f"{ledger_id} of kind {kind}", path=where, position=size - len(tail))
        tail_start = size - len(tail)
        footer_bytes: bytes | memoryview
        if trailer.footer_offset >= tail_start:
            rel = trailer.footer_offset - tail_start
            footer_bytes = tail[rel:rel + trailer.footer_length]
        else:
            footer_bytes = store.get_view(key, trailer.footer_offset,
                                          trailer.footer_offset + trailer.footer_length)
            if len(footer_bytes) != trailer.footer_length:
                raise CorruptLedgerError(f"{where}: truncated footer at byte {trailer.footer_offset}",
                                         path=where, position=trailer.footer_offset)
        footer = decode_footer(footer_bytes, trailer, where)
        fetched = len(tail) + (0 if trailer.footer_offset >= tail_start else trailer.footer_length)
        f = cls(store, key, footer, size, fetched, dictionaries)
        f.footer_crc = trailer.footer_crc
        if isinstance(footer_bytes, memoryview) and isinstance(footer_bytes.obj, mmap.mmap):
            f._mapped = footer_bytes.obj
            f.release_pages()  # checking it read every page; the run reads them again a few at a time
        if tail_start == 0:
            f._check_header(tail)
        return f

    @property
    def footer_mapped(self) -> bool:
        """Whether the footer's columns are views of a mapped file (whose pages
        :meth:`release_pages` gives back), rather than bytes held in memory."""
        return self._mapped is not None

    def release_pages(self) -> None:
        """Drop the pages of a mapped footer from this process's memory.  Its columns stay
        valid: a page touched again is mapped again from the page cache (or the file), so
        memory holds only the footer pages read since the last release, not every footer
        a run has opened."""
        if self._mapped is not None:
            with contextlib.suppress(OSError, ValueError):  # (a closed map: nothing is held)
                self._mapped.madvise(mmap.MADV_DONTNEED)

    def _check_header(self, data: bytes | memoryview) -> None:
        header = decode_header(data[:HEADER_SIZE], self.url)
        if (header.ledger_id != self.footer.ledger_id or header.kind != self.footer.kind
                or header.version != self.footer.version):
            raise CorruptLedgerError(f"{self.url}: header and trailer disagree", path=self.url, position=0)
        self._header_checked = True

    @property
    def url(self) -> str:
        return self.store.url(self.key)

    @property
    def ledger_id(self) -> int:
        return self.footer.ledger_id

    @property
    def n_entries(self) -> int:
        return self.footer.n_entries

    @property
    def n_records(self) -> int:
        return self.footer.n_records

    @property
    def entry_ledgers(self) -> npt.NDArray[np.uint64]:
        if self._ledgers is None:
            self._ledgers = self.footer.entry_ledgers()
        return self._ledgers

    @property
    def entry_ids(self) -> npt.NDArray[np.uint64]:
        if self._entries is None:
            self._entries = self.footer.entry_ids()
        return self._entries

    @property
    def batch_indexes(self) -> npt.NDArray[np.uint32]:
        if self._batches is None:
            self._batches = self.footer.batch_indexes()
        return self._batches

    def event_times(self) -> npt.NDArray[np.int64] | None:
        """Each record's event time, ``NO_EVENT_TIME`` where it has none, by the footer
        (:meth:`~shale.ledger.format.Footer.event_times`); ``None`` when the footer does
        not say (format versions 1 and 2, compacted parts written without them)."""
        if self._events is None:
            self._events = self.footer.event_times()
        return self._events

    def _batch_of(self, index: int, entry: int) -> int:
        # in an original ledger a record's batch index is its place in its entry: no need
        # to work out every record's (which costs a pass over the footer)
        if self.footer.kind == KIND_ORIGINAL:
            return index - int(self.footer.e_rec_start[entry])
        return int(self.batch_indexes[index])

    def record_id(self, index: int) -> MessageId:
        foot = self.footer
        if foot.ids_per_record:
            return MessageId(int(foot.cols["r_ledger"][index]), int(foot.cols["r_entry"][index]),
                             int(foot.cols["r_batch"][index]))
        entry = int(foot.entry_of(index))
        return MessageId(int(self.entry_ledgers[entry]), int(self.entry_ids[entry]), self._batch_of(index, entry))

    def record_ids(self, records: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
        """The ids of ``records`` (record indexes, rising) as rows ``(ledger, entry, batch)``."""
        return np.stack(self.record_id_columns(records), axis=1)

    def record_id_columns(self, records: npt.NDArray[np.int64]
                          ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
        """The ledgers, entries and batch indexes of ``records`` (record indexes, rising)."""
        foot = self.footer
        if foot.ids_per_record and len(records) and int(records[-1]) - int(records[0]) == len(records) - 1:
            # a run of records (rising, as they always are here): copied, not gathered
            run = slice(int(records[0]), int(records[-1]) + 1)
            return (np.array(foot.cols["r_ledger"][run], dtype=np.uint64),
                    np.array(foot.cols["r_entry"][run], dtype=np.uint64),
                    np.array(self.batch_indexes[run], dtype=np.uint64))
        if foot.kind == KIND_COMPACTED:
            batches = self.batch_indexes[records]
            entries = foot.record_entries(records)
        elif len(records) and int(records[-1]) - int(records[0]) == len(records) - 1:
            # a run of an original ledger: each entry's id repeated over its records, and
            # the batch indexes sliced, rather than a search per record
            a, b = int(records[0]), int(records[-1]) + 1
            first, last = int(foot.entry_of(a)), int(foot.entry_of(b - 1))
            counts = np.diff(np.clip(foot.e_rec_start[first:last + 2], a, b)).astype(np.int64)
            entries = np.repeat(np.arange(first, last + 1, dtype=np.uint64), counts)
            batches = self.batch_indexes[a:b]
        else:  # (the entry of each record once: a batch index is its place in its entry)
            entry = foot.entry_of(records)
            batches = records - foot.e_rec_start[entry]
            entries = np.asarray(entry, dtype=np.uint64)
        return foot.record_ledgers(records), entries, np.asarray(batches, dtype=np.uint64)

    def first_id(self) -> MessageId | None:
        return self.record_id(0) if self.n_records else None

    def last_id(self) -> MessageId | None:
        return self.record_id(self.n_records - 1) if self.n_records else None

    def find(self, mid: MessageId) -> int:
        """Index of the first record whose id is ``>= mid`` (``n_records`` if none)."""
        foot = self.footer
        if foot.ids_per_record:
            return self._find_record(mid)
        ledgers, entries = self.entry_ledgers, self.entry_ids
        lo = int(np.searchsorted(ledgers, np.uint64(mid.ledger), side="left"))
        hi = int(np.searchsorted(ledgers, np.uint64(mid.ledger), side="right"))
        if lo == hi:
            return int(foot.e_rec_start[lo])
        e = lo + int(np.searchsorted(entries[lo:hi], np.uint64(mid.entry), side="left"))
        if e == hi or int(entries[e]) != mid.entry:
            return int(foot.e_rec_start[e])
        start, stop = int(foot.e_rec_start[e]), int(foot.e_rec_start[e + 1])
        if foot.kind == KIND_ORIGINAL:  # batch indexes are 0, 1, ... within the entry
            return min(start + mid.batch, stop)
        return start + int(np.searchsorted(self.batch_indexes[start:stop], np.uint32(mid.batch), side="left"))

    def _find_record(self, mid: MessageId) -> int:
        """:meth:`find` over ids kept per record (they rise strictly: the footer was checked)."""
        cols = self.footer.cols
        ledgers, entries, batches = cols["r_ledger"], cols["r_entry"], cols["r_batch"]
        lo = int(np.searchsorted(ledgers, np.uint64(mid.ledger), side="left"))
        hi = int(np.searchsorted(ledgers, np.uint64(mid.ledger), side="right"))
        a = lo + int(np.searchsorted(entries[lo:hi], np.uint64(mid.entry), side="left"))
        b = lo + int(np.searchsorted(entries[lo:hi], np.uint64(mid.entry), side="right"))
        return a + int(np.searchsorted(batches[a:b], np.uint32(mid.batch), side="left"))

    def read_frames(self, first: int, stop: int) -> tuple[int, bytes | memoryview]:
        """Raw bytes of entries ``first..stop-1`` in one ranged read, with their start
        offset (a view of a mapped file for big local reads)."""
        offs, lens = self.footer.col("e_offset"), self.footer.col("e_length")
        start = int(offs[first])
        end = int(offs[stop - 1]) + int(lens[stop - 1])
        if first == 0 and not self._header_checked:
            # Objects too big for the tail read get their header checked with the first
            # entries, in the same request.
            raw = self.store.get_view(self.key, 0, end)
            self._check_header(raw[:HEADER_SIZE])
            data = raw[start:]
        else:
            data = self.store.get_view(self.key, start, end)
        if len(data) != end - start:
            raise CorruptLedgerError(
                f"{self.url}: truncated: entries {first}..{stop - 1} need bytes {start}..{end}, "
                f"object ends at {start + len(data)}",
                path=self.url, position=start + len(data))
        return start, data

    def frame_payload(self, buf: bytes | memoryview, base: int, entry: int) -> memoryview:
        """Check entry ``entry``'s frame inside ``buf`` (read from ``base``); return its payload."""
        offset = int(self.footer.col("e_offset")[entry])
        length = int(self.footer.col("e_length")[entry])
        view = memoryview(buf)[offset - base: offset - base + length]
        n_expected = int(self.footer.e_rec_start[entry + 1] - self.footer.e_rec_start[entry])
        plen, crc, n = FRAME_HEADER.unpack_from(view, 0)
        payload = view[FRAME_HEADER.size:]
        if plen != len(payload) or n != n_expected:
            raise CorruptLedgerError(
                f"{self.url}: entry {self._entry_name(entry)} at byte {offset}: frame header disagrees "
                "with the footer", path=self.url, position=offset)
        if checksum(payload) != crc:
            raise CorruptLedgerError(
                f"{self.url}: entry {self._entry_name(entry)} at byte {offset}: checksum mismatch",
                path=self.url, position=offset)
        return payload

    def check_frames(self, buf: bytes | memoryview, base: int, first: int, stop: int) -> None:
        """Check the frames of entries ``first..stop-1`` inside ``buf`` (read from
        ``base``) all at once; the first bad one raises as :meth:`frame_payload` would."""
        if stop <= first:
            return
        foot = self.footer
        offs = foot.col("e_offset")[first:stop].astype(np.int64) - base
        lens = foot.col("e_length")[first:stop].astype(np.int64)
        if int(offs[0]) < 0 or int(offs[-1] + lens[-1]) > len(buf):
            raise CorruptLedgerError(f"{self.url}: entries {first}..{stop - 1} lie outside the bytes read",
                                     path=self.url, position=base)
        counts = np.diff(foot.e_rec_start[first:stop + 1])
        bad = check_frames(buf, offs, lens, counts)
        if bad >= 0:
            self.frame_payload(buf, base, first + bad)  # raises, naming the entry and what is wrong
            raise CorruptLedgerError(f"{self.url}: entry {self._entry_name(first + bad)}: bad frame",
                                     path=self.url, position=int(offs[bad]) + base)

    def entry_payload(self, buf: bytes | memoryview, base: int, entry: int) -> bytes | bytearray | memoryview:
        """:meth:`frame_payload`, decompressed where the entry is stored compressed (its
        size checked against the footer's)."""
        stored = self.frame_payload(buf, base, entry)
        codec = int(self.footer.codecs()[entry])
        if codec == Codec.NONE:
            return stored
        return decompress(stored, codec, int(self.footer.raw_lengths()[entry]),
                          f"{self.url}: entry {self._entry_name(entry)}", path=self.url,
                          position=int(self.footer.col("e_offset")[entry]), dictionaries=self.dictionaries)

    def stored_payload(self, entry: int, piece: int,
                       read: Callable[[int, int], bytes | memoryview] | None = None) -> StoredPayload:
        """Entry ``entry``'s frame read in ranged reads of at most ``piece`` bytes, never
        held whole (:class:`~shale.ledger.stream.StoredPayload`: its header checked now,
        its checksum once read); ``read(start, end)`` reads the object, when not the store."""
        foot = self.footer
        if entry == 0 and not self._header_checked:
            self._check_header(self.store.get_view(self.key, 0, HEADER_SIZE))
        count = int(foot.e_rec_start[entry + 1] - foot.e_rec_start[entry])
        return StoredPayload(read or functools.partial(self.store.get_view, self.key),
                             int(foot.col("e_offset")[entry]), int(foot.col("e_length")[entry]), count, piece,
                             self.entry_where(entry), self.url)

    def entry_stream(self, entry: int, stored: StoredPayload) -> PayloadStream:
        """Entry ``entry``'s payload read as a stream from ``stored`` (:meth:`stored_payload`):
        neither its stored bytes nor, unless it is an lz4 block, its payload held whole."""
        return PayloadStream(stored, int(self.footer.codecs()[entry]), int(self.footer.raw_lengths()[entry]),
                             self.entry_where(entry), path=self.url, position=int(self.footer.col("e_offset")[entry]),
                             dictionaries=self.dictionaries)

    def payloads(self, buf: bytes | memoryview, base: int,
                 sel: npt.NDArray[np.int64]) -> tuple[bytes | bytearray | memoryview, ...]:
        """The payloads of entries ``sel`` (their frames checked, inside ``buf`` read from
        ``base``), one buffer each: a view of ``buf`` for an entry stored as it is, else
        decompressed (its size checked against the footer's), where :meth:`raw_frames`
        would copy them side by side."""
        foot = self.footer
        offs = foot.col("e_offset")[sel].astype(np.int64) - base
        ends = offs + foot.col("e_length")[sel].astype(np.int64)
        codecs, raw = foot.codecs()[sel], foot.raw_lengths()[sel].astype(np.int64)
        view, url = memoryview(buf), self.url
        out: list[bytes | bytearray | memoryview] = [view[o + FRAME_HEADER.size:end]
                                                     for o, end in zip(offs.tolist(), ends.tolist(), strict=True)]
        # Small zstd entries all at once (their headers checked together, the library called
        # once); whatever that leaves, and every other codec, one by one below.
        slow = codecs != Codec.NONE
        z = np.flatnonzero(codecs == Codec.ZSTD)
        if len(z) >= _MIN_BATCHED_FRAMES:
            done, got = decompress_zstd_each(buf, offs[z] + FRAME_HEADER.size, ends[z], raw[z])
            for k in np.flatnonzero(done).tolist():
                out[int(z[k])] = got[k]
            slow[z[done]] = False
        for i in np.flatnonzero(slow).tolist():
            out[i] = decompress(out[i], int(codecs[i]), int(raw[i]), functools.partial(self.entry_where, int(sel[i])),
                                path=url, position=base + int(offs[i]), dictionaries=self.dictionaries)
        return tuple(out)

    def raw_frames(self, buf: bytes | memoryview, base: int, sel: npt.NDArray[np.int64],
                   scratch: Scratch | None = None) -> tuple[bytes | bytearray | memoryview, npt.NDArray[np.int64]]:
        """Entries ``sel`` (their frames checked, inside ``buf`` read from ``base``) laid
        out as if stored uncompressed: a buffer holding, for each, a frame header's room
        followed by its payload as the footer's record offsets address it, and where each
        starts.  Without compressed entries among them this is ``buf`` itself; otherwise
        each compressed payload is decompressed once, into ``scratch`` when given (then
        valid until its next use; the caller bounds the bytes: :meth:`raw_batches`)."""
        foot = self.footer
        offs = foot.col("e_offset")[sel].astype(np.int64) - base
        codecs = foot.codecs()[sel]
        if not codecs.any():
            return buf, offs
        raw = foot.raw_lengths()[sel]
        ends = offs + foot.col("e_length")[sel].astype(np.int64)
        at = np.zeros(len(sel) + 1, dtype=np.int64)
        np.cumsum(raw + FRAME_HEADER.size, out=at[1:])
        # reused from batch to batch: fresh pages would cost more than the copy into them
        out = (scratch or Scratch()).take(int(at[-1]))
        view, url = memoryview(buf), self.url
        # Small zstd entries all at once (their headers checked together); whatever that
        # leaves, and every other codec, one by one below.
        slow = np.ones(len(sel), dtype=bool)
        for codec, dictionaries in ((Codec.ZSTD, None), (Codec.ZSTD_DICT, self.dictionaries)):
            z = np.flatnonzero(codecs == codec)
            if len(z) >= _MIN_BATCHED_FRAMES and (codec == Codec.ZSTD or dictionaries is not None):
                slow[z] = ~decompress_zstd_into(buf, offs[z] + FRAME_HEADER.size, ends[z], raw[z].astype(np.int64),
                                                out, at[z] + FRAME_HEADER.size, dictionaries=dictionaries)
        rest = np.flatnonzero(slow)
        for i, codec, o, end, a, n in zip(rest.tolist(), codecs[rest].tolist(), offs[rest].tolist(),
                                          ends[rest].tolist(), at[rest].tolist(), raw[rest].tolist(), strict=True):
            stored = view[o + FRAME_HEADER.size:end]
            a += FRAME_HEADER.size
            if codec == Codec.NONE:
                out[a:a + n] = stored
            else:
                out[a:a + n] = decompress(stored, codec, n, functools.partial(self.entry_where, int(sel[i])),
                                          path=url, position=base + o, dictionaries=self.dictionaries)
        return out, at[:-1]

    def entry_where(self, entry: int) -> str:
        """The object and entry, as errors name them."""
        return f"{self.url}: entry {self._entry_name(entry)}"

    def raw_batches(self, sel: npt.NDArray[np.int64], limit: int = RAW_BATCH_BYTES) -> Iterator[npt.NDArray[np.int64]]:
        """``sel`` in consecutive pieces whose payloads, decompressed, come to about
        ``limit`` bytes at most (one entry at least)."""
        if not len(sel):
            return
        ends = np.cumsum(self.footer.raw_lengths()[sel] + FRAME_HEADER.size)
        i = 0
        while i < len(sel):
            j = max(i + 1, int(np.searchsorted(ends, (ends[i - 1] if i else 0) + limit, side="right")))
            yield sel[i:j]
            i = j

    def check_records_in(self, buf: bytes | memoryview, base: int, first: int, stop: int) -> None:
        """Check every record of entries ``first..stop-1`` (frames checked, inside ``buf``
        read from ``base``) as :meth:`check_kept` does, decompressing what is compressed."""
        self.check_entries(buf, base, np.arange(first, stop, dtype=np.int64))

    def check_entries(self, buf: bytes | memoryview, base: int, sel: npt.NDArray[np.int64],
                      scratch: Scratch | None = None, *, key_hashes: bool = False, event_times: bool = False
                      ) -> None:
        """Prove entries ``sel`` (ascending, frames checked, inside ``buf`` read from
        ``base``) decodable: each compressed one decompresses, as :func:`decompress` checks
        (one frame or block and nothing after it, the footer's size, the frame's content
        checksum when it has one), and every record of each is exactly one well-formed
        record where its footer puts it (:meth:`check_kept`).  At most about
        :data:`RAW_BATCH_BYTES` are decompressed at a time, into ``scratch`` when given.

        ``key_hashes``: also hash every record's key again and compare with the footer's
        hash, so that records that decompress to other keys than were written (a
        dictionary changed under frames without a content checksum, a footer lying about
        its hashes) are caught.  ``event_times``: also decode every record's event time
        and compare it with its footer's, where the footer gives them."""
        for piece, raw, frames in self.decompressed(buf, base, sel, scratch):
            counts, records = self._all_records(piece)
            self.check_kept(raw, base, piece, counts, records, frames=frames)
            if key_hashes:
                self._check_key_hashes(raw, piece, counts, records, frames)
            if event_times:
                check_event_times(self, raw, frames, counts, records)

    def _check_key_hashes(self, raw: bytes | bytearray | memoryview, sel: npt.NDArray[np.int64],
                          counts: npt.NDArray[np.int64], records: npt.NDArray[np.int64],
                          frames: npt.NDArray[np.int64]) -> None:
        """Each of ``records`` (all those of entries ``sel``, checked records, in ``raw``
        where ``frames`` say) has the key hash its footer gives."""
        from shale.ledger.encoder import EncodedColumns, RecordColumns, VarColumn, encode_columns

        foot = self.footer
        at = np.repeat(frames + FRAME_HEADER.size, counts) + foot.col("r_offset")[records].astype(np.int64)
        data = np.frombuffer(raw, dtype=np.uint8)
        for a in range(0, len(records), _KEY_BLOCK):  # (arrays bounded by records, not bytes)
            b = min(a + _KEY_BLOCK, len(records))
            key_at, lengths, has_key = _keys_of(data, at[a:b])
            offsets = np.zeros(b - a + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            keys = gather_ranges(raw, key_at, key_at + lengths)
            # the producer's own encoder hashes them (XXH3-128, in C where it is built):
            # values left empty, the records it encodes are thrown away
            enc = encode_columns(RecordColumns(VarColumn(offsets, keys, has_key.astype(np.uint8)),
                                               VarColumn(np.zeros(b - a + 1, dtype=np.int64), b"")),
                                 0, _NO_LIMIT)
            if not isinstance(enc, EncodedColumns):
                raise CorruptLedgerError(f"{self.url}: a key of records {a}..{b - 1} cannot be hashed", path=self.url)
            r = records[a:b]
            wrong = np.flatnonzero((enc.hash_hi != foot.col("r_hash_hi")[r])
                                   | (enc.hash_lo != foot.col("r_hash_lo")[r]))
            if len(wrong):
                index = int(r[wrong[0]])
                e = int(foot.entry_of(index))
                raise CorruptLedgerError(
                    f"{self.url}: entry {self._entry_name(e)}, record {self._batch_of(index, e)}: its key does not "
                    "hash to the key hash its footer gives (the entry decodes to another key than was written)",
                    path=self.url, position=int(foot.col("e_offset")[e]))

    def decompressed(self, buf: bytes | memoryview, base: int, sel: npt.NDArray[np.int64],
                     scratch: Scratch | None = None
                     ) -> Iterator[tuple[npt.NDArray[np.int64], bytes | bytearray | memoryview, npt.NDArray[np.int64]]]:
        """Entries ``sel`` (frames checked, inside ``buf`` read from ``base``) in pieces of
        about :data:`RAW_BATCH_BYTES` decompressed: each piece with :meth:`raw_frames`'
        buffer and frame starts (the buffer is ``scratch``, when given, reused from piece
        to piece: valid until the next one)."""
        for piece in self.raw_batches(sel):
            raw, frames = self.raw_frames(buf, base, piece, scratch)
            yield piece, raw, frames

    def _all_records(self, sel: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """How many records each entry of ``sel`` holds, and their indexes, in order."""
        starts = self.footer.e_rec_start
        first = starts[sel].astype(np.int64)
        counts = starts[sel + 1].astype(np.int64) - first
        total = int(counts.sum())
        # the index of each record: its entry's first, plus its place in the entry
        at = np.repeat(first - (np.cumsum(counts) - counts), counts)
        return counts, at + np.arange(total, dtype=np.int64)

    def check_kept(self, buf: bytes | bytearray | memoryview, base: int, sel: npt.NDArray[np.int64],
                   kept: npt.NDArray[np.int64], records: npt.NDArray[np.int64],
                   frames: npt.NDArray[np.int64] | None = None) -> None:
        """Check that each of ``records`` (indexes into this ledger, in order: ``kept[i]``
        of them from entry ``sel[i]``, whose frames lie in ``buf`` read from ``base`` and
        are checked already) is exactly one well-formed record at the offset and of the
        size its footer gives, with the flags its footer gives.  ``frames``: where each
        entry's frame starts in ``buf`` when that is not its place in the object (a
        buffer from :meth:`raw_frames`).

        A footer may tile its entries exactly and still lie about where one record ends
        and the next begins; whoever copies records by the footer (compaction) must check
        this, or it would publish records nobody can read."""
        foot = self.footer
        at = foot.col("e_offset")[sel].astype(np.int64) - base if frames is None else frames
        bad = check_kept(buf, at, kept, records, foot.col("r_offset"), foot.col("r_size"), foot.col("r_flags"))
        if bad >= 0:
            entry = int(foot.entry_of(records[bad]))
            self._bad_record(buf, int(at[np.searchsorted(sel, entry)]), int(records[bad]), entry,
                             stored=frames is None, base=base)

    def check_payload(self, payload: bytes | bytearray | memoryview, entry: int, records: npt.NDArray[np.int64],
                      starts: npt.NDArray[np.int64] | None = None) -> None:
        """:meth:`check_kept` for ``records`` of ``entry``, whose payload (decompressed: from
        :meth:`entry_payload`) is ``payload``; ``starts``: where each record starts in
        ``payload`` when that is not its offset (a payload's pieces, read as a stream)."""
        foot = self.footer
        offsets = foot.col("r_offset")[records].astype(np.int64)
        at = offsets if starts is None else starts
        bad = check_records(payload, at, foot.col("r_size")[records].astype(np.int64), foot.col("r_flags")[records])
        if bad >= 0:
            stored = starts is None and int(foot.codecs()[entry]) == Codec.NONE  # (named by its byte in the object)
            base = int(foot.col("e_offset")[entry]) + FRAME_HEADER.size if stored else 0
            frame = int(at[bad] - offsets[bad]) - FRAME_HEADER.size
            self._bad_record(payload, frame, int(records[bad]), entry, stored=stored, base=base)

    def _bad_record(self, buf: bytes | bytearray | memoryview, frame: int, r: int, e: int, *, stored: bool,
                    base: int) -> None:
        foot = self.footer
        at = frame + FRAME_HEADER.size + int(foot.col("r_offset")[r])
        size = int(foot.col("r_size")[r])
        why = record_problem(memoryview(buf)[at:at + size], int(foot.col("r_flags")[r])) or "malformed"
        compressed = int(foot.codecs()[e]) != Codec.NONE
        where = (f"at byte {int(foot.col('r_offset')[r])} of its decompressed payload" if compressed or not stored
                 else f"at byte {base + at}")
        position = int(foot.col("e_offset")[e]) if compressed or not stored else base + at
        raise CorruptLedgerError(
            f"{self.url}: entry {self._entry_name(e)}, record {self._batch_of(r, e)} {where} "
            f"({size} bytes by the footer): {why}", path=self.url, position=position)

    def _entry_name(self, entry: int) -> str:
        return f"{int(self.entry_ledgers[entry])}:{int(self.entry_ids[entry])}"

    def chunks(self, first_entry: int, stop_entry: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES, *,
               raw_bytes: int = 0, records: int = 0) -> Iterator[tuple[int, int]]:
        """Split entries ``[first_entry, stop_entry)`` into runs of about ``chunk_bytes``
        (and, when given, of at most ``raw_bytes`` decompressed and ``records`` records,
        but never less than one entry)."""
        offs = self.footer.col("e_offset")
        raw_ends = np.cumsum(self.footer.raw_lengths()[first_entry:stop_entry], dtype=np.int64) if raw_bytes else None
        rec_start = self.footer.e_rec_start
        i = first_entry
        while i < stop_entry:
            limit = int(offs[i]) + chunk_bytes
            j = int(np.searchsorted(offs[i:stop_entry], np.uint64(limit), side="left")) + i
            if raw_ends is not None:
                before = int(raw_ends[i - first_entry - 1]) if i > first_entry else 0
                j = min(j, int(np.searchsorted(raw_ends, before + raw_bytes, side="right")) + first_entry)
            if records:
                j = min(j, int(np.searchsorted(rec_start, rec_start[i] + records, side="right")) - 1)
            j = max(j, i + 1)
            yield i, j
            i = j

    def messages(self, start_record: int = 0, stop_record: int | None = None, *,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
                 hold_bytes: int = DEFAULT_HOLD_BYTES) -> Iterator[Message]:
        """Decode records ``[start_record, stop_record)`` in order, checking every entry;
        ``hold_bytes``: the most held decompressed at once
        (:func:`shale.ledger.messages.messages_in`)."""
        stop_record = self.n_records if stop_record is None else min(stop_record, self.n_records)
        return messages_in(self, start_record, stop_record, chunk_bytes=chunk_bytes,
                           max_record_bytes=max_record_bytes, hold_bytes=hold_bytes)

    def messages_at(self, records: npt.NDArray[np.int64], *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
                    hold_bytes: int = DEFAULT_HOLD_BYTES) -> Iterator[Message]:
        """The messages of ``records`` (indexes, rising), each decoded where its footer
        places it: :func:`shale.ledger.messages.messages_at`."""
        return messages_at(self, records, chunk_bytes=chunk_bytes, max_record_bytes=max_record_bytes,
                           hold_bytes=hold_bytes)


def _keys_of(data: npt.NDArray[np.uint8], at: npt.NDArray[np.int64]
             ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Where the key of each record starting at ``at`` in ``data`` begins, its length (0
    for none) and whether it has one.  Only for records already checked to be well formed
    (:meth:`LedgerFile.check_kept`): a msgpack array (fixarray, array 16 or array 32)
    whose first element is nil or bin 8, 16 or 32."""
    head = data[at]
    k = at + np.where(head == 0xDC, 3, np.where(head == 0xDD, 5, 1))
    kind = data[k]
    has_key = kind != 0xC0
    width = np.select([kind == 0xC4, kind == 0xC5, kind == 0xC6], [1, 2, 4], 0)
    length = np.zeros(len(at), dtype=np.int64)
    for i in range(4):  # big-endian length, up to 4 bytes
        more = width > i
        length[more] = (length[more] << 8) | data[k[more] + 1 + i]
    return k + 1 + width, length, has_key
