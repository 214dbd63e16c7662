"""A ledger's records decoded as messages, holding one entry at a time, or less.

An entry decompresses to 256 MiB at most and holds records of 64 MiB at most; a reader
holds the entry and the record it gives, never a Python object per record of the entry
beside them.  An entry bigger than what a reader may hold at once (``hold_bytes``; at
most :data:`WHOLE_ENTRY_BYTES`) is never read with its neighbours: its stored bytes are
read in ranged reads of ``chunk_bytes``, decompressed as they are read
(:mod:`shale.ledger.stream`: zstd in its frame's window, an entry stored as it is straight
from the reads) and decoded twice, first to check it, then a record at a time.  An lz4
block cannot be read in pieces: one bigger than ``hold_bytes``, than its biggest record
and than :data:`LZ4_WHOLE_BYTES` is refused (:func:`refuse_unholdable`), naming the entry
and the bound that would read it.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt

from shale.ledger.codecs import Codec
from shale.ledger.errors import InvalidInputError
from shale.ledger.ids import MessageId
from shale.ledger.record import DEFAULT_MAX_RECORD_BYTES, Message, decode_record, decode_records
from shale.ledger.stream import PayloadStream

if TYPE_CHECKING:
    from shale.ledger.reader import LedgerFile

__all__ = ["DEFAULT_HOLD_BYTES", "LZ4_WHOLE_BYTES", "WHOLE_ENTRY_BYTES", "Fields", "big_entry_records",
           "check_big_entry", "entry_records", "entry_spans", "messages_at", "messages_in", "refuse_unholdable"]

#: An entry of at most this many bytes (decompressed) is decoded all at once; a bigger
#: one a record at a time.
WHOLE_ENTRY_BYTES: Final = 8 * 1024 * 1024
#: What a reader may hold decompressed at once unless told (``--max-batch-bytes``'s default).
DEFAULT_HOLD_BYTES: Final = 16 << 20
#: An lz4 block this big is read whole whatever the bound (the most an entry of the
#: writer's holds by default: ``TopicWriter``'s ``max_entry_bytes``).
LZ4_WHOLE_BYTES: Final = 1 << 20
#: A record's fields: key, value, properties, publish time, event time.
Fields = tuple[bytes | None, bytes | None, Mapping[str, str], int, int | None]


def entry_records(f: LedgerFile, buf: bytes | memoryview, base: int, e: int, count: int, where: str,
                  max_record_bytes: int) -> Iterable[Fields]:
    """The ``count`` records of entry ``e`` of ``f`` (its frame in ``buf``, read from ``base``),
    all decoded (and so checked) before the first is given: an entry whose records do not
    match its footer must fail before a reader sees one of them with a wrong id.  For an
    entry of at most :data:`WHOLE_ENTRY_BYTES`: a bigger one is read on its own
    (:func:`big_entry_records`)."""
    position = int(f.footer.col("e_offset")[e])
    return list(decode_records(f.entry_payload(buf, base, e), count=count, where=where, path=f.url,
                               position=position, max_record_bytes=max_record_bytes))


def check_big_entry(f: LedgerFile, e: int, count: int, where: str, max_record_bytes: int,
                    chunk_bytes: int) -> list[int]:
    """Every record of entry ``e`` of ``f`` (``count`` of them) decoded, and its whole frame
    checked, its payload read as a stream from ranged reads of ``chunk_bytes`` and let go
    as it is read; where each record ends.  The check :func:`big_entry_records` makes before
    it gives the entry's first record."""
    position = int(f.footer.col("e_offset")[e])
    check = f.entry_stream(e, f.stored_payload(e, chunk_bytes))
    ends: list[int] = []
    collections.deque(decode_records(check, count=count, where=where, path=f.url, position=position,
                                     max_record_bytes=max_record_bytes, ends=ends), maxlen=0)
    check.finish()
    return ends


def big_entry_records(f: LedgerFile, e: int, count: int, where: str, max_record_bytes: int,
                      chunk_bytes: int) -> Iterator[Fields]:
    """:func:`entry_records` for an entry read on its own (see the module): its payload
    read twice as a stream from ranged reads of ``chunk_bytes``, first to check every
    record and the whole frame (:func:`check_big_entry`), then to give them one at a time."""
    position = int(f.footer.col("e_offset")[e])
    ends = check_big_entry(f, e, count, where, max_record_bytes, chunk_bytes)
    stream = f.entry_stream(e, f.stored_payload(e, chunk_bytes))
    for n in np.diff(ends, prepend=0).tolist():
        data = stream.take(n)
        fields = decode_record(data, where=where, path=f.url, max_record_bytes=max_record_bytes, position=position)
        del data
        yield fields
        del fields


def refuse_unholdable(f: LedgerFile, entries: npt.NDArray[np.int64], hold_bytes: int) -> None:
    """Refuse, naming the first, an lz4 entry of ``entries`` bigger than ``hold_bytes``,
    than its biggest record and than :data:`LZ4_WHOLE_BYTES`: an lz4 block is decompressed
    whole, and a reader holds no more than that at once (a record bigger than it, alone;
    and, as a zstd frame's window, the block of an entry the writer makes by default)."""
    foot = f.footer
    if not len(entries):
        return
    raw = foot.raw_lengths()[entries]
    over = np.flatnonzero((foot.codecs()[entries] == Codec.LZ4) & (raw > max(hold_bytes, LZ4_WHOLE_BYTES)))
    sizes, starts = foot.col("r_size"), foot.e_rec_start
    for i in over.tolist():
        e = int(entries[i])
        if int(raw[i]) > int(sizes[int(starts[e]):int(starts[e + 1])].max()):
            need = -(-int(raw[i]) >> 20)
            raise InvalidInputError(
                f"{f.entry_where(e)} is an lz4 block of {int(raw[i]) / (1 << 20):.1f}MiB, which is read whole, and "
                f"--max-batch-bytes (max_batch_bytes) is {hold_bytes / (1 << 20):.1f}MiB; give at least {need}MiB")


def entry_spans(f: LedgerFile, first: int, stop: int, chunk_bytes: int, hold_bytes: int
                ) -> Iterator[tuple[int, int, bool]]:
    """Entries ``[first, stop)`` of ``f`` as a reader reads them: ``(c0, c1, False)`` for a
    ranged read of about ``chunk_bytes`` of small entries, ``(e, e + 1, True)`` for an
    entry bigger than ``hold_bytes`` (or :data:`WHOLE_ENTRY_BYTES`), read on its own."""
    if stop <= first:
        return
    limit = min(hold_bytes, WHOLE_ENTRY_BYTES)
    big = np.flatnonzero(f.footer.raw_lengths()[first:stop] > limit) + first
    start = first
    for edge in [*big.tolist(), stop]:
        if edge > start:
            for c0, c1 in f.chunks(start, edge, chunk_bytes):
                yield c0, c1, False
        if edge < stop:
            yield edge, edge + 1, True
        start = edge + 1


def messages_in(f: LedgerFile, start_record: int, stop_record: int, *, chunk_bytes: int, max_record_bytes: int,
                hold_bytes: int = DEFAULT_HOLD_BYTES) -> Iterator[Message]:
    """Records ``[start_record, stop_record)`` of ``f`` decoded in order, every entry checked
    (:meth:`~shale.ledger.reader.LedgerFile.messages`)."""
    if start_record >= stop_record:
        return
    foot = f.footer
    rec_start = foot.e_rec_start
    first, last = int(foot.entry_of(start_record)), int(foot.entry_of(stop_record - 1))
    refuse_unholdable(f, np.arange(first, last + 1, dtype=np.int64), hold_bytes)
    ledgers, entries, batches = f.entry_ledgers, f.entry_ids, f.batch_indexes
    per_record = foot.ids_per_record
    for c0, c1, big in entry_spans(f, first, last + 1, chunk_bytes, hold_bytes):
        base, buf = (0, b"") if big else f.read_frames(c0, c1)
        for e in range(c0, c1):
            r0 = int(rec_start[e])
            count = int(rec_start[e + 1]) - r0
            where = f.entry_where(e)
            records = (big_entry_records(f, e, count, where, max_record_bytes, chunk_bytes) if big
                       else entry_records(f, buf, base, e, count, where, max_record_bytes))
            if per_record:
                lids = foot.cols["r_ledger"][r0:r0 + count].tolist()
                eids = foot.cols["r_entry"][r0:r0 + count].tolist()
            else:
                lids, eids = [int(ledgers[e])] * count, [int(entries[e])] * count
            for k, (key, value, props, pt, et) in enumerate(records):
                r = r0 + k
                if r < start_record:
                    continue
                if r >= stop_record:
                    return
                yield Message(MessageId(lids[k], eids[k], int(batches[r])), key, value, props, pt, et)
            del records


def messages_at(f: LedgerFile, records: npt.NDArray[np.int64], *, chunk_bytes: int,
                max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
                hold_bytes: int = DEFAULT_HOLD_BYTES) -> Iterator[Message]:
    """The messages of ``records`` of ``f`` (indexes, rising), reading the entries that hold them
    in ranged reads of about ``chunk_bytes``, each record decoded where its footer
    places it, one at a time.  A small entry is decompressed whole and its records
    checked all at once (in C, no object per record) before the first is given; a big
    one (see the module) is read on its own as a stream, each record checked as it
    comes, and the whole frame before the last is given.  Memory follows the entry or
    less, never its records."""
    if not len(records):
        return
    foot = f.footer
    entry_of = foot.entry_of(records)
    firsts = np.flatnonzero(np.r_[True, entry_of[1:] != entry_of[:-1]])  # each entry's first record
    stops = np.r_[firsts[1:], len(records)]
    entries = entry_of[firsts]
    refuse_unholdable(f, entries, hold_bytes)
    ledgers, entry_ids = foot.record_ledgers(records), foot.record_entries(records)
    batches = f.batch_indexes
    offsets, sizes = foot.col("r_offset"), foot.col("r_size")
    i = 0
    for c0, c1, big in entry_spans(f, int(entries[0]), int(entries[-1]) + 1, chunk_bytes, hold_bytes):
        if entries[i] >= c1:
            continue  # (none of its entries holds a record asked for)
        base, buf = (0, b"") if big else f.read_frames(c0, c1)
        while i < len(entries) and entries[i] < c1:
            e, a, b = int(entries[i]), int(firsts[i]), int(stops[i])
            i += 1
            recs = records[a:b]
            where = f.entry_where(e)
            position = int(foot.col("e_offset")[e])
            ids = zip(ledgers[a:b].tolist(), entry_ids[a:b].tolist(), batches[recs].tolist(), strict=True)
            if big:
                fields = _streamed_records(f, f.entry_stream(e, f.stored_payload(e, chunk_bytes)), e, recs, where,
                                           max_record_bytes)
            else:
                payload = f.entry_payload(buf, base, e)
                f.check_payload(payload, e, recs)
                view = memoryview(payload)
                fields = (decode_record(view[o:o + n], where=where, path=f.url, position=position,
                                        max_record_bytes=max_record_bytes)
                          for o, n in zip(offsets[recs].tolist(), sizes[recs].tolist(), strict=True))
            for (lid, eid, bid), (key, value, props, pt, et) in zip(ids, fields, strict=True):
                yield Message(MessageId(lid, eid, bid), key, value, props, pt, et)
            del fields


def _streamed_records(f: LedgerFile, stream: PayloadStream, e: int, recs: npt.NDArray[np.int64], where: str,
                      max_record_bytes: int) -> Iterator[Fields]:
    """The records ``recs`` of entry ``e`` read from its payload as a stream, each
    checked as it is read; the whole frame is checked before the last is given."""
    foot = f.footer
    at = np.zeros(1, dtype=np.int64)
    for k, (o, n) in enumerate(zip(foot.col("r_offset")[recs].tolist(), foot.col("r_size")[recs].tolist(),
                                   strict=True), 1):
        stream.skip(o - stream.at)
        data = stream.take(n)
        f.check_payload(data, e, recs[k - 1:k], starts=at)
        if k == len(recs):
            stream.finish()
        fields = decode_record(data, where=where, path=f.url, max_record_bytes=max_record_bytes,
                               position=int(foot.col("e_offset")[e]))
        del data  # (its fields are copies: the bytes read go before the record is given)
        yield fields
        del fields
