"""Shale's ledger format: records, message ids, ledger objects, codecs and kernels; the
error hierarchy and the masking of secrets every error's text goes through.

This package is the bottom layer: it imports nothing else of Shale's.  It reads objects
through :class:`~shale.ledger.objects.ObjectSource`, which every store of
:mod:`shale.storage` satisfies.

The names below are imported on first use, so that a module of the package (the errors,
above all, which every command needs) is imported without NumPy and the codecs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from shale.ledger.objects import ObjectSource
    from shale.ledger.reader import LedgerFile
    from shale.ledger.record import Message, Record, key_hash
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
    "Message",
    "MessageId",
    "ObjectNotFoundError",
    "ObjectSource",
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
    "relabel_ledger",
]

_HOMES = {
    **dict.fromkeys(("AlreadyExistsError", "ConflictError", "CorruptLedgerError", "InvalidInputError",
                     "InvalidURIError", "ObjectNotFoundError", "RecordTooLargeError", "ShaleError",
                     "StateUnknownError", "StorageError", "TopicNotFoundError", "TransientStorageError",
                     "UnsupportedOperationError", "UnsupportedVersionError"), "errors"),
    **dict.fromkeys(("FLAG_HAS_KEY", "FLAG_TOMBSTONE", "FORMAT_VERSION", "KIND_COMPACTED", "KIND_ORIGINAL"), "format"),
    **dict.fromkeys(("MAX_ID", "MIN_ID", "MessageId"), "ids"),
    "ObjectSource": "objects",
    "LedgerFile": "reader",
    **dict.fromkeys(("Message", "Record", "key_hash"), "record"),
    **dict.fromkeys(("EncodedEntry", "LedgerWriter", "encode_entry", "relabel_ledger"), "writer"),
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'shale.ledger' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"shale.ledger.{home}"), name)
    globals()[name] = value
    return value
