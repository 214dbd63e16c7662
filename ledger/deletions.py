"""Deletion vectors: which records of a compacted part are no longer live.

An incremental compaction keeps a previous part whose records are still mostly live
instead of copying it again, and publishes beside it a small object listing the record
indexes (within the part) that newer data superseded or whose tombstones expired —
the way Delta Lake's deletion vectors work.  Readers and later runs skip those records.

Layout (little-endian)::

    magic "SHALEDV\\0" (8) | version u16 | reserved u16 | count u32 | records u32
    | count x u32 record index, strictly ascending | crc32c u32 of everything before
"""

from __future__ import annotations

import struct
from typing import Final

import numpy as np
import numpy.typing as npt

from shale.ledger.errors import CorruptLedgerError, UnsupportedVersionError
from shale.ledger.format import checksum
from shale.ledger.objects import ObjectSource

__all__ = ["DELETIONS_VERSION", "decode_deletions", "encode_deletions", "read_deletions"]

_MAGIC: Final = b"SHALEDV\0"
DELETIONS_VERSION: Final = 1
_HEAD: Final = struct.Struct("<8sHHII")
#: Deletion vectors are small next to their part; this bounds what a reader allocates.
MAX_INDEXES: Final = 1 << 31


def encode_deletions(indexes: npt.NDArray[np.integer], records: int) -> bytes:
    """The deletion vector of a part of ``records`` records."""
    idx = np.asarray(indexes, dtype="<u4")
    body = _HEAD.pack(_MAGIC, DELETIONS_VERSION, 0, len(idx), records) + idx.tobytes()
    return body + struct.pack("<I", checksum(body))


def decode_deletions(data: bytes, records: int, where: str) -> npt.NDArray[np.bool_]:
    """A mask over the part's records, True where deleted.  Checks everything."""
    if len(data) < _HEAD.size + 4:
        raise CorruptLedgerError(f"{where}: deletion vector truncated ({len(data)} bytes)", path=where, position=0)
    magic, version, _, count, n = _HEAD.unpack_from(data)
    if magic != _MAGIC:
        raise CorruptLedgerError(f"{where}: not a deletion vector (bad magic at byte 0)", path=where, position=0)
    if version != DELETIONS_VERSION:
        raise UnsupportedVersionError(f"{where}: deletion vector version {version} is not supported "
                                      f"(this build reads {DELETIONS_VERSION})", path=where, position=8)
    if len(data) != _HEAD.size + 4 * count + 4:
        raise CorruptLedgerError(f"{where}: deletion vector of {count} records has {len(data)} bytes",
                                 path=where, position=_HEAD.size)
    (crc,) = struct.unpack_from("<I", data, len(data) - 4)
    if checksum(data[:-4]) != crc:
        raise CorruptLedgerError(f"{where}: deletion vector checksum mismatch", path=where, position=len(data) - 4)
    if n != records:
        raise CorruptLedgerError(f"{where}: deletion vector is for a part of {n} records, not {records}",
                                 path=where, position=16)
    idx = np.frombuffer(data, dtype="<u4", count=count, offset=_HEAD.size).astype(np.int64)
    if count and (idx[-1] >= records or np.any(idx[1:] <= idx[:-1])):
        raise CorruptLedgerError(f"{where}: deletion vector indexes out of order or out of range",
                                 path=where, position=_HEAD.size)
    mask = np.zeros(records, dtype=bool)
    mask[idx] = True
    return mask


def read_deletions(store: ObjectSource, key: str, records: int) -> npt.NDArray[np.bool_]:
    """Read and check the deletion vector at ``key`` of a part of ``records`` records."""
    return decode_deletions(store.get(key), records, store.url(key))
