"""Building ledger objects: entries are appended, then the footer and trailer seal it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from shale.ledger.codecs import NO_COMPRESSION, Buffer, Codec, Compression, compress
from shale.ledger.errors import InvalidInputError, RecordTooLargeError
from shale.ledger.format import (
    COLUMNS,
    FLAG_HAS_KEY,
    FLAG_TOMBSTONE,
    FORMAT_VERSION,
    FRAME_HEADER,
    HEADER_SIZE,
    KIND_COMPACTED,
    KIND_ORIGINAL,
    NO_EVENT_TIME,
    TRAILER_SIZE,
    Trailer,
    checksum,
    columns_of,
    decode_trailer,
    encode_footer,
    encode_header,
    encode_trailer,
)
from shale.ledger.record import DEFAULT_MAX_RECORD_BYTES, Record, encode_record, key_hash
from shale.ledger.values import dataclass

__all__ = ["EncodedEntry", "LedgerWriter", "Sink", "encode_entry", "relabel_ledger"]


class Sink(Protocol):
    """Where a :class:`LedgerWriter` puts its bytes (a file, a buffer, an upload)."""

    def write(self, data: bytes | bytearray | memoryview, /) -> int | None: ...


@dataclass(frozen=True, slots=True, eq=False)
class EncodedEntry:
    """One entry's payload and the footer columns of its records."""

    payload: bytes | memoryview
    r_offset: npt.NDArray[np.uint32]
    r_size: npt.NDArray[np.uint32]
    r_hash_hi: npt.NDArray[np.uint64]
    r_hash_lo: npt.NDArray[np.uint64]
    r_flags: npt.NDArray[np.uint8]
    publish_time: int
    #: each record's event time, :data:`NO_EVENT_TIME` where it has none; ``None``: no
    #: record has one
    r_event: npt.NDArray[np.int64] | None = None

    @property
    def n_records(self) -> int:
        return len(self.r_offset)


def encode_entry(records: Sequence[Record], *, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> EncodedEntry:
    """Encode a batch of records into one entry payload."""
    if not records:
        raise InvalidInputError("an entry needs at least one record")
    n = len(records)
    parts: list[bytes] = []
    offsets = np.empty(n, dtype=np.uint32)
    sizes = np.empty(n, dtype=np.uint32)
    hi = np.zeros(n, dtype=np.uint64)
    lo = np.zeros(n, dtype=np.uint64)
    flags = np.zeros(n, dtype=np.uint8)
    events = np.empty(n, dtype=np.int64)
    pos = 0
    publish = 0
    for i, rec in enumerate(records):
        raw = encode_record(rec)
        if len(raw) > max_record_bytes:
            raise RecordTooLargeError(
                f"record of {len(raw)} bytes exceeds the maximum of {max_record_bytes} bytes"
            )
        parts.append(raw)
        offsets[i] = pos
        sizes[i] = len(raw)
        pos += len(raw)
        f = 0
        if rec.key is not None:
            f |= FLAG_HAS_KEY
            hi[i], lo[i] = key_hash(bytes(rec.key))
        if not rec.value:
            f |= FLAG_TOMBSTONE
        flags[i] = f
        events[i] = NO_EVENT_TIME if rec.event_time is None else rec.event_time
        publish = max(publish, rec.publish_time)
    if pos >= 1 << 32:
        raise RecordTooLargeError(f"entry of {pos} bytes exceeds 4 GiB")
    # (records without event times, each stamped with its own publish time, cost nothing)
    return EncodedEntry(b"".join(parts), offsets, sizes, hi, lo, flags, publish,
                        None if np.all(events == NO_EVENT_TIME) else events)


#: Footer column chunks at least this big on average are written without joining them.
_BIG_CHUNK_BYTES = 64 << 10

IdArray = npt.NDArray[np.uint64]


class LedgerWriter:
    """Writes one ledger object (format version 3), entry by entry, into a :class:`Sink`.

    Original ledgers get implicit ids (entry i of ledger L is ``L:i``); compacted parts
    pass the original ``ledger``/``entry``/``batch`` id of every record and tombstone
    ``delete_since`` times with every entry they add.  Entries added with
    :meth:`add_entry` are compressed with ``compression`` (each kept as it is where that
    would not make it smaller); :meth:`add_frames` takes frames already stored.  Each
    record's event time (:data:`NO_EVENT_TIME` where it has none) goes into the footer's
    column ``r_event``: an original ledger leaves it out when no record has one; a
    compacted part holds it exactly when its event times are given with every batch of
    records it adds (a part given none says nothing of them).
    """

    def __init__(self, sink: Sink, *, kind: int, ledger_id: int, created_ms: int,
                 max_entry_bytes: int = 1 << 31, compression: Compression = NO_COMPRESSION) -> None:
        if kind not in (KIND_ORIGINAL, KIND_COMPACTED):
            raise InvalidInputError(f"unknown ledger kind {kind}")
        self._sink = sink
        self.kind = kind
        self.ledger_id = ledger_id
        self.created_ms = created_ms
        self.max_entry_bytes = max_entry_bytes
        self.compression = compression
        self._pos = 0
        self._n_records = 0
        #: payload bytes saved by compression: the object's size uncompressed is its size plus this
        self.bytes_saved = 0
        self._e_rec_start: list[int] = [0]
        self._columns = columns_of(FORMAT_VERSION, kind)
        self._e_scalars: dict[str, list[int]] = {name: [] for name in self._columns if COLUMNS[name][1] == "e"}
        self._r_chunks: dict[str, list[npt.NDArray[Any]]] = {
            name: [] for name in self._columns if COLUMNS[name][1] == "r"}
        #: each record's event time, per entry or batch of frames (``None``: none has one,
        #: or, in a compacted part, not given)
        self._events: list[tuple[int, npt.NDArray[np.int64] | None]] = []
        #: in a compacted part, each record's publish time as its order counts it
        #: (``r_publish``), given with the event times or not at all
        self._publish: list[npt.NDArray[np.int64]] = []
        #: keep ``r_publish`` only when some record lacks an event time (event-time order,
        #: where a record's publish time counts only in place of its event time)
        self.publish_for_untimed_only = False
        self._footer_per_entry = sum(np.dtype(COLUMNS[n][0]).itemsize for n in self._e_scalars) + 8
        # (r_event and r_publish counted: an upper bound)
        self._footer_per_record = sum(np.dtype(COLUMNS[n][0]).itemsize
                                      for n in (*self._r_chunks, "r_event", "r_publish"))
        self._finished = False
        #: bytes written by write_frame_bytes that no add_frames has registered yet
        self._unregistered = 0
        self._write(encode_header(kind, ledger_id, created_ms))

    @property
    def bytes_written(self) -> int:
        return self._pos

    @property
    def n_entries(self) -> int:
        return len(self._e_rec_start) - 1

    @property
    def footer_bytes_per_entry(self) -> int:
        return self._footer_per_entry

    @property
    def footer_bytes_per_record(self) -> int:
        return self._footer_per_record

    @property
    def estimated_size(self) -> int:
        """The object's size if finished now (footer size estimated from its columns)."""
        return (self._pos + 256 + TRAILER_SIZE + self.n_entries * self.footer_bytes_per_entry
                + self._n_records * self.footer_bytes_per_record)

    @property
    def n_records(self) -> int:
        return self._n_records

    @property
    def last_entry_records(self) -> int:
        """How many records the most recent entry holds (0 before the first entry)."""
        if len(self._e_rec_start) < 2:
            return 0
        return self._e_rec_start[-1] - self._e_rec_start[-2]

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        self._sink.write(data)
        self._pos += len(data)

    def _record_ids(self, n: int, ledgers: int | npt.ArrayLike | None, entry_ids: int | npt.ArrayLike | None,
                    batch: npt.NDArray[np.uint32] | None, delete_since: npt.NDArray[np.int64] | None
                    ) -> dict[str, npt.NDArray[Any]]:
        """A compacted part's per-record id columns (an int id applies to every record)."""
        if self.kind != KIND_COMPACTED:
            return {}
        if ledgers is None or entry_ids is None or batch is None or delete_since is None:
            raise InvalidInputError("compacted entries need their original ids")
        return {"r_ledger": np.broadcast_to(np.asarray(ledgers, dtype=np.uint64), (n,)),
                "r_entry": np.broadcast_to(np.asarray(entry_ids, dtype=np.uint64), (n,)),
                "r_batch": batch, "r_delete_since": delete_since}

    def add_entry(self, entry: EncodedEntry, *, ledger: int | npt.ArrayLike | None = None,
                  entry_id: int | npt.ArrayLike | None = None, batch: npt.NDArray[np.uint32] | None = None,
                  delete_since: npt.NDArray[np.int64] | None = None,
                  compressed: tuple[Codec, Buffer] | None = None) -> None:
        """Append an entry built by :func:`encode_entry` (or from raw record slices),
        compressed with the writer's ``compression`` (or as ``compressed`` says, when the
        caller compressed it already, with :func:`~shale.ledger.codecs.compress`).  A
        compacted part gives each record's original id: ``ledger`` and ``entry_id`` (one
        for all, or one per record), ``batch`` and ``delete_since`` (one per record)."""
        if self._finished:
            raise InvalidInputError("ledger already finished")
        codec, stored = compressed or compress(entry.payload, self.compression)
        raw = len(entry.payload)
        header = FRAME_HEADER.pack(len(stored), checksum(stored), entry.n_records)
        length = len(header) + len(stored)
        if length > self.max_entry_bytes:
            raise RecordTooLargeError(f"entry of {length} bytes exceeds the maximum of {self.max_entry_bytes}")
        n = entry.n_records
        rcols: dict[str, npt.NDArray[Any]] = {
            "r_hash_hi": entry.r_hash_hi, "r_hash_lo": entry.r_hash_lo, "r_flags": entry.r_flags,
            "r_offset": entry.r_offset, "r_size": entry.r_size}
        rcols |= self._record_ids(n, ledger, entry_id, batch, delete_since)
        self._add_columns(rcols, n)
        self._add_events(entry.r_event, n)
        self._e_scalars["e_offset"].append(self._pos)
        self._e_scalars["e_length"].append(length)
        self._e_scalars["e_publish"].append(entry.publish_time)
        self._e_scalars["e_codec"].append(int(codec))
        self._e_scalars["e_raw_length"].append(raw)
        self.bytes_saved += raw - len(stored)
        self._write(header)
        self._write(stored)
        self._n_records += n
        self._e_rec_start.append(self._n_records)

    def _add_columns(self, rcols: dict[str, npt.NDArray[Any]], n: int) -> None:
        for name, chunks in self._r_chunks.items():
            col = rcols[name]
            if len(col) != n:
                raise InvalidInputError(f"column {name} has {len(col)} rows for {n} records")
            chunks.append(col)

    def _add_events(self, events: npt.NDArray[np.int64] | None, n: int) -> None:
        if events is not None and len(events) != n:
            raise InvalidInputError(f"{len(events)} event times for {n} records")
        self._events.append((n, events))

    def _event_column(self) -> npt.NDArray[np.int64] | None:
        """The footer's ``r_event`` column, or ``None`` when it is left out: in an original
        ledger when no record has an event time, in a compacted part when none were given."""
        if all(e is None for _, e in self._events):
            return None
        if self.kind == KIND_COMPACTED and any(e is None for _, e in self._events):
            raise InvalidInputError("a compacted part needs the event times of all its records or of none")
        col = np.concatenate([np.full(n, NO_EVENT_TIME, dtype=np.int64) if e is None else e for n, e in self._events])
        return None if self.kind == KIND_ORIGINAL and np.all(col == NO_EVENT_TIME) else col

    def write_frame_bytes(self, data: bytes | bytearray | memoryview) -> None:
        """Write bytes of a frame that the next :meth:`add_frames` (given no ``blob``)
        adds: a frame too big to hold, written as it is read."""
        if self._finished:
            raise InvalidInputError("ledger already finished")
        self._unregistered += len(data)
        self._write(data)

    def add_frames(self, blob: bytes | bytearray | memoryview | None, lengths: npt.NDArray[np.int64],
                   counts: npt.NDArray[np.int64], publish: npt.NDArray[Any], records: dict[str, npt.NDArray[Any]], *,
                   codecs: npt.NDArray[np.uint8] | None = None, raw_lengths: npt.NDArray[np.int64] | None = None,
                   ledgers: npt.ArrayLike | None = None, entry_ids: npt.ArrayLike | None = None,
                   batch: npt.NDArray[np.uint32] | None = None,
                   delete_since: npt.NDArray[np.int64] | None = None,
                   events: npt.NDArray[np.int64] | None = None,
                   record_publish: npt.NDArray[np.int64] | None = None) -> None:
        """Append many complete, checksummed frames at once: ``blob`` is the frames back to
        back (``None``: written already, by :meth:`write_frame_bytes`), ``lengths`` their
        sizes, ``counts`` their record counts, ``codecs`` and ``raw_lengths`` how each
        payload is stored and its size decompressed (default: stored as it is); ``records``
        holds the footer columns of all their records, in order, and a compacted part the
        original id of each (``ledgers``, ``entry_ids``, ``batch``) and ``delete_since``;
        ``events`` each record's event time, :data:`NO_EVENT_TIME` where it has none
        (``None``: none has one, or, in a compacted part, they are not kept);
        ``record_publish``, in a compacted part that keeps event times, the publish time of
        the entry each record was first written in."""
        if self._finished:
            raise InvalidInputError("ledger already finished")
        n_entries, n = len(lengths), int(counts.sum())
        if n_entries == 0:
            return
        if blob is not None and self._unregistered:
            raise InvalidInputError("a frame written by write_frame_bytes must be added before any other")
        size = self._unregistered if blob is None else len(blob)
        if int(lengths.sum()) != size or len(counts) != n_entries or len(publish) != n_entries:
            raise InvalidInputError("frames, lengths, counts and publish times disagree")
        if int(lengths.max()) > self.max_entry_bytes:
            raise RecordTooLargeError(f"entry of {int(lengths.max())} bytes exceeds the maximum of "
                                      f"{self.max_entry_bytes}")
        if codecs is None or raw_lengths is None:
            codecs = np.zeros(n_entries, dtype=np.uint8)
            raw_lengths = lengths - FRAME_HEADER.size
        elif len(codecs) != n_entries or len(raw_lengths) != n_entries:
            raise InvalidInputError("codecs and raw lengths must have one row per frame")
        rcols = dict(records) | self._record_ids(n, ledgers, entry_ids, batch, delete_since)
        self._add_columns(rcols, n)
        self._add_events(None if events is None else np.asarray(events, dtype=np.int64), n)
        if record_publish is not None:
            if self.kind != KIND_COMPACTED or events is None or len(record_publish) != n:
                raise InvalidInputError("record publish times go with the event times of a compacted part's records")
            self._publish.append(np.asarray(record_publish, dtype=np.int64))
        starts = self._pos - self._unregistered + np.concatenate([[0], np.cumsum(lengths)[:-1]])
        self._e_scalars["e_offset"].extend(starts.tolist())
        self._e_scalars["e_length"].extend(lengths.tolist())
        self._e_scalars["e_publish"].extend(np.asarray(publish).tolist())
        self._e_scalars["e_codec"].extend(np.asarray(codecs).tolist())
        self._e_scalars["e_raw_length"].extend(np.asarray(raw_lengths).tolist())
        self.bytes_saved += int(np.asarray(raw_lengths).sum()) - (int(lengths.sum()) - FRAME_HEADER.size * n_entries)
        if blob is not None:
            self._write(blob)
        self._unregistered = 0
        self._e_rec_start.extend((self._n_records + np.cumsum(counts)).tolist())
        self._n_records += n

    def finish(self, meta: dict[str, Any] | None = None) -> int:
        """Write footer and trailer; return the object's total size."""
        if self._finished:
            raise InvalidInputError("ledger already finished")
        if self._unregistered:
            raise InvalidInputError("a frame was written and never added")
        cols: dict[str, npt.NDArray[Any] | list[npt.NDArray[Any]]] = {}
        for name, values in self._e_scalars.items():
            cols[name] = np.asarray(values, dtype=COLUMNS[name][0])
        for name, chunks in self._r_chunks.items():
            # Big chunks (batches of pass two) are written one by one: joining them would
            # copy every column once more.  Small ones (an entry each) are joined, or each
            # would be a write of its own.
            big = sum(c.nbytes for c in chunks) >= _BIG_CHUNK_BYTES * len(chunks)  # (no chunks: an empty column)
            cols[name] = chunks if big else np.concatenate(chunks) if chunks else np.empty(0, COLUMNS[name][0])
        events = self._event_column()
        if events is not None:
            cols["r_event"] = events
            if self._publish and not (self.publish_for_untimed_only and not np.any(events == NO_EVENT_TIME)):
                if sum(len(x) for x in self._publish) != len(events):
                    raise InvalidInputError("a compacted part needs the publish times of all its records or of none")
                cols["r_publish"] = self._publish if len(self._publish) > 1 else self._publish[0]
        footer_offset = self._pos
        crc = 0
        for piece in encode_footer(self.kind, np.asarray(self._e_rec_start, dtype=np.uint64), cols, meta or {}):
            crc = checksum(piece, crc)
            self._write(piece)
        self._write(encode_trailer(Trailer(
            footer_offset, self._pos - footer_offset, self.ledger_id, self.created_ms, crc,
            FORMAT_VERSION, self.kind,
        )))
        self._finished = True
        return self._pos


def relabel_ledger(data: bytes, ledger_id: int) -> bytes:
    """Return a copy of a sealed original ledger object carrying another ledger id.

    Only the header and the trailer name the ledger, so a writer that lost the race for
    an id re-labels its bytes instead of re-encoding every record.
    """
    trailer = decode_trailer(data, len(data), "ledger being relabelled")
    out = bytearray(data)
    out[:HEADER_SIZE] = encode_header(trailer.kind, ledger_id, trailer.created_ms, trailer.version)
    out[-TRAILER_SIZE:] = encode_trailer(Trailer(
        trailer.footer_offset, trailer.footer_length, ledger_id, trailer.created_ms,
        trailer.footer_crc, trailer.version, trailer.kind,
    ))
    return bytes(out)
