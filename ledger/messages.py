"""A ledger's records decoded as messages, holding one entry at a time, or less.

An entry decompresses to 256 MiB at most and holds records of 64 MiB at most; a reader
holds the entry and the record it gives, never a Python object per record of the entry
beside them: a big entry is decoded twice (first to check it, then a record at a time),
and one compressed with zstd is read as a stream (:mod:`shale.ledger.stream`) rather
than decompressed whole.
"""

from __future__ import annotations

import collections
import functools
import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt

from shale.ledger.ids import MessageId
from shale.ledger.record import DEFAULT_MAX_RECORD_BYTES, Message, decode_record, decode_records
from shale.ledger.stream import PayloadStream, stream_for

if TYPE_CHECKING:
    from shale.ledger.reader import LedgerFile

__all__ = ["WHOLE_ENTRY_BYTES", "Fields", "entry_records", "messages_at"]

#: An entry of at most this many bytes (decompressed) is decoded all at once; a bigger
#: one a record at a time.
WHOLE_ENTRY_BYTES: Final = 8 * 1024 * 1024
#: A record's fields: key, value, properties, publish time, event time.
Fields = tuple[bytes | None, bytes | None, Mapping[str, str], int, int | None]


def entry_records(f: LedgerFile, buf: bytes | memoryview, base: int, e: int, count: int, where: str,
                  max_record_bytes: int) -> Iterable[Fields]:
    """The ``count`` records of entry ``e`` of ``f`` (its frame in ``buf``, read from ``base``),
    all checked before the first is given: an entry whose records do not match its
    footer must fail before a reader sees one of them with a wrong id.  A small entry is
    decoded whole; a big one twice (first to check it, keeping none of its records, then
    one record at a time), so that no more than one of its records is held beside it,
    and, when compressed with zstd, decompressed as it is read rather than held."""
    position = int(f.footer.col("e_offset")[e])
    decode = functools.partial(decode_records, count=count, where=where, path=f.url, position=position,
                               max_record_bytes=max_record_bytes)
    raw = int(f.footer.raw_lengths()[e])
    ends: list[int] = []
    if stream_for(int(f.footer.codecs()[e]), raw, WHOLE_ENTRY_BYTES):
        check = f.payload_stream(buf, base, e)
        collections.deque(decode(check, ends=ends), maxlen=0)
        check.finish()
        stream = f.payload_stream(buf, base, e)
        return (decode_record(stream.take(n), where=where, path=f.url, max_record_bytes=max_record_bytes,
                              position=position) for n in np.diff(ends, prepend=0).tolist())
    payload = f.entry_payload(buf, base, e)
    if raw <= WHOLE_ENTRY_BYTES:
        return list(decode(payload))
    collections.deque(decode(payload, ends=ends), maxlen=0)
    view = memoryview(payload)
    return (decode_record(view[a:b], where=where, path=f.url, max_record_bytes=max_record_bytes,
                          position=position) for a, b in itertools.pairwise([0, *ends]))



def messages_at(f: LedgerFile, records: npt.NDArray[np.int64], *, chunk_bytes: int,
                max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> Iterator[Message]:
    """The messages of ``records`` of ``f`` (indexes, rising), reading the entries that hold them
    in ranged reads of about ``chunk_bytes``, each record decoded where its footer
    places it, one at a time.  A small entry is decompressed whole and its records
    checked all at once (in C, no object per record) before the first is given; a big
    one compressed with zstd is decompressed as it is read, each record checked as it
    comes, and the whole frame before the last is given.  Memory follows the entry or
    less, never its records."""
    if not len(records):
        return
    foot = f.footer
    entry_of = foot.entry_of(records)
    firsts = np.flatnonzero(np.r_[True, entry_of[1:] != entry_of[:-1]])  # each entry's first record
    stops = np.r_[firsts[1:], len(records)]
    entries = entry_of[firsts]
    ledgers, entry_ids = foot.record_ledgers(records), foot.record_entries(records)
    batches = f.batch_indexes
    offsets, sizes = foot.col("r_offset"), foot.col("r_size")
    i = 0
    for c0, c1 in f.chunks(int(entries[0]), int(entries[-1]) + 1, chunk_bytes):
        if entries[i] >= c1:
            continue  # (none of its entries holds a record asked for)
        base, buf = f.read_frames(c0, c1)
        while i < len(entries) and entries[i] < c1:
            e, a, b = int(entries[i]), int(firsts[i]), int(stops[i])
            i += 1
            recs = records[a:b]
            where = f.entry_where(e)
            position = int(foot.col("e_offset")[e])
            ids = zip(ledgers[a:b].tolist(), entry_ids[a:b].tolist(), batches[recs].tolist(), strict=True)
            if stream_for(int(foot.codecs()[e]), int(foot.raw_lengths()[e]), WHOLE_ENTRY_BYTES):
                fields = _streamed_records(f, f.payload_stream(buf, base, e), e, recs, where,
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
