"""Every error Shale raises derives from :class:`ShaleError`.

Errors also inherit the matching builtin so callers can catch them generically
(``except FileNotFoundError`` catches a missing ledger object).  What a command exits
with for each is the command line's business (:mod:`shale.cli.errors`), not theirs.
"""

from __future__ import annotations

import errno
from typing import Any, Final

from shale.ledger.masking import mask_secrets

__all__ = [
    "CORRUPTION",
    "AlreadyExistsError",
    "ConflictError",
    "CorruptLedgerError",
    "GapError",
    "InUseError",
    "InvalidInputError",
    "InvalidMetadataError",
    "InvalidURIError",
    "NotAnObjectError",
    "ObjectNotFoundError",
    "OutputExistsError",
    "ProducerFencedError",
    "RecordTooLargeError",
    "ShaleError",
    "SnapshotNotFoundError",
    "StateUnknownError",
    "StorageError",
    "StoragePermissionError",
    "TopicNotFoundError",
    "TransientStorageError",
    "UnsupportedOperationError",
    "UnsupportedVersionError",
    "error_detail",
    "error_from_detail",
    "error_line",
    "mid_sentence",
]

class ShaleError(Exception):
    """Root of every error Shale raises on purpose.

    Its text never holds a secret: credentials in URIs and secret-looking ``NAME=VALUE``
    pairs are masked as the error is made (:func:`~shale.ledger.masking.mask_secrets`),
    whatever text a caller or a translated library error gave it."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(mask_secrets(a) if isinstance(a, str) else a for a in args))


class InvalidInputError(ShaleError, ValueError):
    """A caller passed something unusable: a bad flag value, a bad record, a bad id."""


class InvalidURIError(InvalidInputError):
    """A topic or metadata URI is malformed, unsafe, or names an unknown scheme."""


class SnapshotNotFoundError(InvalidInputError, LookupError):
    """A read as of an epoch or a time, or a rollback, named a compacted view that is not
    retained (the message lists those that are)."""


class RecordTooLargeError(InvalidInputError):
    """A record or entry exceeds the configured maximum size."""


class StorageError(ShaleError, OSError):
    """Storage failed in a way that is neither transient nor a conflict."""


class StoragePermissionError(StorageError, PermissionError):
    """The store refused access (a file's permissions, an access-denied answer): a matter
    of how Shale is run, not of the data."""


class NotAnObjectError(StorageError):
    """Where an object should be there is something else: a folder, a symbolic link, a
    FIFO, a device.  A local store opens only regular files inside its root and never
    follows a link, so a topic tampered with this way is refused like corrupt data."""


class TransientStorageError(StorageError):
    """A storage request failed in a way that is worth retrying (5xx, throttling, reset)."""


class StateUnknownError(StorageError):
    """A conditional write may or may not have happened (the connection dropped, or a
    retry found the object changed).

    Distinct from :class:`ConflictError`: the caller must re-read before deciding, and
    must never delete what it wrote on the assumption that it lost.
    """


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """An object that should exist is missing."""


class BucketNotFoundError(StorageError):
    """The bucket (or container) a URI names does not exist.  Not an
    :class:`ObjectNotFoundError`: a missing bucket is never taken for a missing topic."""


class TopicNotFoundError(ObjectNotFoundError):
    """No topic exists at the given URI."""


class UnsupportedOperationError(StorageError):
    """The storage backend cannot do what was asked (e.g. compare-and-swap)."""


class ConflictError(ShaleError):
    """A compare-and-swap lost: somebody else changed the document first.

    ``expected`` and ``found`` are the versions involved when they are known.
    """

    def __init__(self, message: str, *, expected: int | None = None, found: int | None = None):
        super().__init__(message)
        self.expected = expected
        self.found = found


class AlreadyExistsError(ConflictError, FileExistsError):
    """A create-if-absent found the object already there."""


class ProducerFencedError(ShaleError, RuntimeError):
    """Another writer with the same producer id registered the records this writer was
    about to register (two writers share an id): nothing of this ledger is registered.
    Not retried as a conflict: running the produce again skips what the other appended."""


class InUseError(ShaleError):
    """Refused because something live holds what was to be changed (a reader holding a
    subscription, by its heartbeat): run again once it has stopped, or force it.  Not a
    :class:`ConflictError`, which a compare-and-swap loop retries at once."""


class CorruptLedgerError(ShaleError, ValueError):
    """A ledger object fails validation: bad magic, bad checksum, truncated, inconsistent.

    The message names the object and the byte position or entry involved.
    """

    def __init__(self, message: str, *, path: str = "", position: int | None = None):
        super().__init__(message)
        self.path = path
        self.position = position


class InvalidMetadataError(ShaleError, ValueError):
    """A metadata document breaks its schema or its invariants (a wrong type, ledger ids
    out of order, overlapping parts, a retired object that is still registered ...).

    The message names the document and the field; nothing is acted on.
    """


class OutputExistsError(InvalidInputError, FileExistsError):
    """A command would write over something that exists where it was told to write
    (an export's output without ``--overwrite``)."""


class GapError(ShaleError):
    """Records a reader had not read yet are gone (retention removed their ledgers):
    going on would skip them in silence.  ``first`` and ``last`` name the range lost
    (message id texts, ``last`` empty when unknown)."""

    def __init__(self, message: str, *, first: str = "", last: str = ""):
        super().__init__(message)
        self.first = first
        self.last = last


class UnsupportedVersionError(CorruptLedgerError):
    """An object was written in a format version this build cannot read."""


#: The errors that say the data found is wrong (a corrupt object, a metadata document
#: that breaks its schema, something else where an object should be), as opposed to
#: what the caller gave or how storage behaved.
CORRUPTION: Final = (CorruptLedgerError, InvalidMetadataError, NotAnObjectError)


def error_detail(e: ShaleError) -> dict[str, Any]:
    """What another process needs to raise the same error again (a pickle of a Shale
    error would lose its keyword fields): its class and the classes it derives from,
    by name, so that an error this module does not define comes back as its nearest
    ancestor that it does."""
    return {"type": type(e).__name__, "types": [c.__name__ for c in type(e).__mro__], "message": str(e),
            "path": getattr(e, "path", ""), "position": getattr(e, "position", None)}


def error_from_detail(detail: dict[str, Any]) -> ShaleError:
    """The error :func:`error_detail` described, as its own class where this module has
    it, else as the nearest one it derives from."""
    names = [str(n) for n in detail.get("types") or [detail.get("type", "")]]
    cls = next((c for n in names if isinstance(c := globals().get(n), type) and issubclass(c, ShaleError)),
               ShaleError)
    message = str(detail.get("message", "a worker failed"))
    if issubclass(cls, CorruptLedgerError):
        return cls(message, path=str(detail.get("path") or ""), position=detail.get("position"))
    return cls(message)


_OS_REASONS: dict[int, str] = {
    errno.ENOSPC: "no space left on the device (disk full)",
    errno.EDQUOT: "disk quota exceeded",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "read-only file system",
    errno.EMFILE: "too many open files",
    errno.ENOMEM: "out of memory",
}


def error_line(e: BaseException) -> str:
    """One line saying what went wrong, for a person: a Shale error's own message; for
    anything else the cause in words, with the file it concerns when known, and the
    Python class only for what nothing here foresaw (a bug to report)."""
    if isinstance(e, ShaleError):
        return str(e) or type(e).__name__
    if isinstance(e, OSError) and e.errno in _OS_REASONS:
        where = e.filename if isinstance(e.filename, str) else ""
        return mask_secrets(f"{where}: {_OS_REASONS[e.errno]}" if where else _OS_REASONS[e.errno])
    if isinstance(e, MemoryError):
        return "out of memory"
    if isinstance(e, RecursionError):
        return "input nested too deeply"
    detail = " ".join(str(e).split())
    return mask_secrets(f"unexpected error: {type(e).__name__}{': ' + detail if detail else ''}")



def mid_sentence(text: str) -> str:
    """``text`` (a library's message, which starts a sentence) as the rest of one of ours:
    its first letter lowered, unless its first word is an acronym or a name that keeps
    its capitals (``JSON is malformed``, ``UTF-8``)."""
    first = text.split(maxsplit=1)[0] if text.strip() else ""
    if not first[:1].isupper() or any(c.isupper() for c in first[1:]):
        return text
    return text[:1].lower() + text[1:]
