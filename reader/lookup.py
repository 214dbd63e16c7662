"""Point lookup: the latest record of one key, reading only what can hold it.

Every ledger and compacted part carries the 128-bit hash of each record's key in its
footer.  A lookup reads the footers of the objects of the compacted view
(:class:`~shale.metadata.view.TopicView`) newest first: the ledgers above the horizon and,
if the key is not there, the compacted parts; it then reads only the entries whose
records' hashes match, and compares the keys themselves (a hash match alone is never
taken for the key).  Nothing else of the topic is read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from shale.ledger.reader import LedgerFile
from shale.ledger.record import Message, key_hash
from shale.metadata.topic import TopicMetadata
from shale.metadata.view import Segment, TopicView

__all__ = ["Lookup", "lookup"]


@dataclass(frozen=True, slots=True)
class Lookup:
    """The answer to a lookup: the key's latest message (None if the key has none, or its
    latest is a tombstone), and what was read to find it."""

    key: bytes
    message: Message | None
    footers_read: int
    entries_read: int

    @property
    def value(self) -> bytes | None:
        return None if self.message is None or self.message.is_tombstone else self.message.value


def _matches(f: LedgerFile, hi: int, lo: int) -> Iterator[int]:
    """Indexes of the records whose key hash is ``(hi, lo)``, newest first."""
    his, los = f.footer.col("r_hash_hi"), f.footer.col("r_hash_lo")
    found = np.flatnonzero((his == np.uint64(hi)) & (los == np.uint64(lo)))
    return (int(i) for i in found[::-1])


def lookup(meta: TopicMetadata, key: bytes) -> Lookup:
    """The latest record of ``key`` in the compacted view plus the tail above the horizon
    (the same answer a compacted read would end on)."""
    hi, lo = key_hash(key)
    footers = entries = 0
    # newest first: the tail's ledgers, then the compacted parts (at most one live record
    # per key); the first match found is the latest
    segments = [s for s in TopicView.load(meta).segments() if isinstance(s, Segment)]
    for segment in reversed(segments):
        f = segment.open(meta)
        footers += 1
        first = segment.span(f)[0]
        gone = segment.deleted(meta, f.n_records)
        for i in _matches(f, hi, lo):
            if gone is not None and gone[i]:
                continue
            if i < first:
                break  # at or below the horizon: the compacted view answers for it
            entries += 1
            m = next(f.messages(i, i + 1))
            if m.key == key:
                return Lookup(key, m, footers, entries)
    return Lookup(key, None, footers, entries)
