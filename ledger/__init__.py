"""Shale's ledger format: records, message ids, ledger objects and object storage.

This package is the bottom layer: it imports nothing else of Shale's.
"""

from shale.ledger.errors import (
    AlreadyExistsError,
    ConflictError,
    CorruptLedgerError,
    InvalidInputError,
    InvalidURIError,
    ObjectNotFoundError,
    RecordTooLargeError,
    ShaleError,
    StateUnknownError,
    StorageError,
    TopicNotFoundError,
    TransientStorageError,
    UnsupportedOperationError,
    UnsupportedVersionError,
)
from shale.ledger.format import FLAG_HAS_KEY, FLAG_TOMBSTONE, FORMAT_VERSION, KIND_COMPACTED, KIND_ORIGINAL
from shale.ledger.ids import MAX_ID, MIN_ID, MessageId
from shale.ledger.reader import LedgerFile
from shale.ledger.record import Message, Record, key_hash
from shale.ledger.storage import Location, ObjectInfo, ObjectStore, ObjectWriter, register_backend, resolve
from shale.ledger.writer import EncodedEntry, LedgerWriter, encode_entry, relabel_ledger

__all__ = [
    "FLAG_HAS_KEY",
    "FLAG_TOMBSTONE",
    "FORMAT_VERSION",
    "KIND_COMPACTED",
    "KIND_ORIGINAL",
    "MAX_ID",
    "MIN_ID",
    "AlreadyExistsError",
    "ConflictError",
    "CorruptLedgerError",
    "EncodedEntry",
    "InvalidInputError",
    "InvalidURIError",
    "LedgerFile",
    "LedgerWriter",
    "Location",
    "Message",
    "MessageId",
    "ObjectInfo",
    "ObjectNotFoundError",
    "ObjectStore",
    "ObjectWriter",
    "Record",
    "RecordTooLargeError",
    "ShaleError",
    "StateUnknownError",
    "StorageError",
    "TopicNotFoundError",
    "TransientStorageError",
    "UnsupportedOperationError",
    "UnsupportedVersionError",
    "encode_entry",
    "key_hash",
    "register_backend",
    "relabel_ledger",
    "resolve",
]
