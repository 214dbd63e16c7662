"""The object-store interface: one small ABC every backend implements.

Every backend stores immutable-ish objects under string keys and offers the two
conditional writes the metadata store is built on:

* :meth:`ObjectStore.put_if_absent` — create only (S3 ``If-None-Match: *``);
* :meth:`ObjectStore.put_if_match` — compare-and-swap on an opaque token (S3 ``If-Match``).

What a backend can do is declared by class-level flags (:data:`CAPABILITIES`), which
callers check up front with :func:`require`.  Backends are chosen by URI scheme in
:mod:`shale.storage.registry`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Final

from shale.ledger.errors import AlreadyExistsError, InvalidInputError, InvalidURIError, UnsupportedOperationError
from shale.ledger.masking import mask_secrets
from shale.ledger.values import dataclass

__all__ = [
    "CAPABILITIES",
    "Location",
    "ObjectInfo",
    "ObjectStore",
    "ObjectWriter",
    "mask_uri",
    "require",
    "validate_key_part",
]


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a listing or a stat tells about one object."""

    key: str
    size: int
    mtime: float  # seconds since the epoch, as the store reports it
    token: str = ""  # the compare-and-swap token when the listing knows it


class ObjectWriter(ABC):
    """A streaming upload; nothing is visible under the key until :meth:`close`."""

    @abstractmethod
    def write(self, data: bytes | bytearray | memoryview, /) -> int:
        """Buffer or send ``data``; return its length."""

    @abstractmethod
    def close(self) -> None:
        """Finish the upload and make the object visible."""

    @abstractmethod
    def abort(self) -> None:
        """Give up: discard whatever was sent.  Safe to call more than once."""

    def __enter__(self) -> ObjectWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class ObjectStore(ABC):
    """A flat key space of objects (a bucket, a folder tree, a dict)."""

    scheme: str = ""
    #: The bucket or host this store serves ("" for the local file system): with
    #: :attr:`scheme` it names the storage, so that two topics with the same path on two
    #: buckets or hosts are never taken for one (a shared ``--metadata`` folder keys each
    #: topic's documents by scheme, authority and path).
    authority: str = ""

    # What a store can do is declared here, once, so that callers refuse early and say
    # why (see :func:`require`) instead of failing half-way through a run.  Backends
    # override the flags that differ; the table in :data:`CAPABILITIES` names them.

    #: Whether :meth:`put_if_absent`, :meth:`put_if_match` and :meth:`get_with_token`
    #: work: create-only and compare-and-swap on a token, atomic against every other
    #: writer.  The metadata store is built on them.  A store without them refuses all
    #: three with :class:`UnsupportedOperationError`.
    supports_conditional_writes: bool = True
    #: Whether a forked process may use this very store object, and this process then
    #: sees what the child wrote; pass two's worker processes need it.
    process_safe: bool = True
    #: Whether other processes, and other machines, that open the same URI see the same
    #: objects (a local folder: those on this machine, or wherever it is mounted).
    #: Spark's executors are other processes and need it.
    shared_between_processes: bool = True
    #: Whether a read is CPU work in this process (a local folder, memory) rather than
    #: a request answered with latency: then reading more objects at once than there are
    #: CPUs only adds threads that contend.
    reads_are_local: bool = False

    @abstractmethod
    def url(self, key: str) -> str:
        """The full URI of ``key``, for messages (never includes credentials)."""

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The whole object; :class:`~shale.ledger.errors.ObjectNotFoundError` if missing."""

    @abstractmethod
    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the object (shorter only at the object's end)."""

    def get_view(self, key: str, start: int, end: int) -> bytes | memoryview:
        """Bytes ``[start, end)`` as :meth:`get_range` returns them, or a read-only view
        sharing memory with the backend (a mapped file) where that saves copying a big
        read."""
        return self.get_range(key, start, end)

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Several ranges of one object; backends may fetch them in parallel."""
        return [self.get_range(key, s, e) for s, e in ranges]

    def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        """The last ``length`` bytes (or the whole object if smaller) and the object's size."""
        size = self.stat(key).size
        start = max(0, size - length)
        return self.get_range(key, start, size), size

    @abstractmethod
    def stat(self, key: str) -> ObjectInfo:
        """Size, modification time and token; :class:`~shale.ledger.errors.ObjectNotFoundError` if missing."""

    def exists(self, key: str) -> bool:
        from shale.ledger.errors import ObjectNotFoundError

        try:
            self.stat(key)
        except ObjectNotFoundError:
            return False
        return True

    @abstractmethod
    def put(self, key: str, data: bytes, *, durable: bool = True) -> None:
        """Write the object, replacing any previous one, atomically.

        ``durable=False`` allows a store to skip waiting for the object to reach stable
        storage (a local folder then does not sync it), for objects that only matter while
        their writer lives: a machine crash may lose such an object or leave it empty, but
        never half replaced.  Object stores write every object durably anyway."""

    @abstractmethod
    def open_writer(self, key: str) -> ObjectWriter:
        """Stream a (possibly large) object; visible only after ``close()``."""

    def open_writer_if_absent(self, key: str) -> ObjectWriter:
        """A streamed write that creates ``key`` only if nothing has the key when it is
        closed: ``close()`` raises :class:`AlreadyExistsError` (and leaves what stands
        there as it is) when the key was taken meanwhile.

        Stores with conditional writes make the check and the write one step (a local
        folder links the finished file into place, S3 completes with ``If-None-Match: *``);
        this default, for stores without them, looks before it starts and at the end, so
        an object that appears in between may be replaced."""
        if self.exists(key):
            raise AlreadyExistsError(f"{self.url(key)}: already exists")
        return _LookingWriter(self, key, self.open_writer(key))

    @abstractmethod
    def get_with_token(self, key: str) -> tuple[bytes, str]:
        """The object and the token :meth:`put_if_match` compares against."""

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> str:
        """Create the object only if no object has the key; return its token.

        Raises :class:`AlreadyExistsError` when the key is taken.
        """

    @abstractmethod
    def put_if_match(self, key: str, data: bytes, token: str) -> str:
        """Replace the object only if its token is still ``token``; return the new token.

        Raises :class:`~shale.ledger.errors.ConflictError` when the object changed (or vanished).
        """

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; a missing object is not an error."""

    @abstractmethod
    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object under the folder ``prefix`` (recursively), in key order: byte order
        of whole keys, or, on a store keeping real folders (SeaweedFS's S3 gateway), folder
        by folder, each folder's objects where its name falls.  Callers never rely on
        the order across folders."""

    def now_ms(self, prefix: str) -> int:
        """The store's own current time, in milliseconds since the epoch, as it would stamp
        an object written under ``prefix`` now.

        Ages of objects (``ObjectInfo.mtime``) are judged against this, never against this
        machine's clock, so a skewed local clock cannot make an object look old.  The
        default writes a small marker object under ``prefix``, reads its modification
        time back and removes it; stores that can tell the time without writing override
        it."""
        import uuid

        from shale.ledger.errors import ShaleError

        key = f"{prefix.rstrip('/')}/.shale-clock-{uuid.uuid4().hex[:12]}" if prefix else \
            f".shale-clock-{uuid.uuid4().hex[:12]}"
        self.put(key, b"", durable=False)
        try:
            return int(self.stat(key).mtime * 1000)
        finally:
            try:
                self.delete(key)
            except ShaleError:
                pass  # a leftover marker is a hidden, empty object that nothing reads

    def without_credentials(self) -> ObjectStore:
        """This store as a process that must use an identity of its own would open it: the
        same objects, without the credentials it was given (what the Spark engine ships
        when told not to forward credentials).  A store that holds none is returned as it
        is."""
        return self

    def remove_empty_folder(self, prefix: str) -> None:
        """Remove the folder ``prefix`` if nothing is left in it (a compaction run's folder
        once its objects are deleted).  Object stores keep no folders: the default does
        nothing; a store with real folders removes an empty one, never anything else."""
        return None

    def unfinished_writes(self, prefix: str) -> Iterator[ObjectInfo]:
        """Writes under ``prefix`` that were started and never finished or aborted — a
        killed writer's temporary file, an incomplete multipart upload.  ``mtime`` is
        when the write started.  Stores without such leftovers list none."""
        return iter(())

    def discard_write(self, info: ObjectInfo) -> None:
        """Remove one leftover listed by :meth:`unfinished_writes`."""
        raise UnsupportedOperationError(f"{self.url(info.key)}: this store has no unfinished writes")


class _LookingWriter(ObjectWriter):
    """:meth:`ObjectStore.open_writer_if_absent` on a store without conditional writes:
    looks again before it finishes."""

    def __init__(self, store: ObjectStore, key: str, inner: ObjectWriter) -> None:
        self._store, self._key, self._inner = store, key, inner

    def write(self, data: bytes | bytearray | memoryview, /) -> int:
        return self._inner.write(data)

    def close(self) -> None:
        if self._store.exists(self._key):
            self._inner.abort()
            raise AlreadyExistsError(f"{self._store.url(self._key)}: already exists")
        self._inner.close()

    def abort(self) -> None:
        self._inner.abort()


#: The capability flags of :class:`ObjectStore`, each with what it means in a message.
CAPABILITIES: Final[dict[str, str]] = {
    "supports_conditional_writes": "conditional writes (create-only and compare-and-swap)",
    "process_safe": "use from forked processes",
    "shared_between_processes": "objects that other processes and machines can see",
    "reads_are_local": "reads served in this process",
}


def require(store: ObjectStore | Location, capability: str, what: str, *, hint: str = "") -> None:
    """Refuse, with one clear line, to use ``store`` (or the folder ``store``) for
    ``what`` when it does not declare ``capability``, one of :data:`CAPABILITIES`.

    ``require(meta, "supports_conditional_writes", "a topic's metadata")`` raises
    :class:`UnsupportedOperationError` on an fsspec store; ``hint`` is appended to
    say what to do instead."""
    if capability not in CAPABILITIES:
        raise InvalidInputError(f"unknown store capability {capability!r}; one of {', '.join(CAPABILITIES)}")
    where, obj = (store.uri, store.store) if isinstance(store, Location) else (store.url(""), store)
    if getattr(obj, capability):
        return
    message = f"{where}: {what} needs {CAPABILITIES[capability]}, which {obj.scheme}:// storage does not offer"
    raise UnsupportedOperationError(f"{message}; {hint}" if hint else message)


# --------------------------------------------------------------------------- URIs

_CONTROL: Final = {chr(c) for c in range(32)} | {"\x7f"}
#: Credentials hidden in a text (``s3://KEY:SECRET@b/t`` becomes ``s3://****@b/t``,
#: ``http://user:pw@host`` becomes ``http://user:****@host``, presigned URLs lose their
#: signatures): one function for every text Shale shows (:mod:`shale.ledger.masking`).
mask_uri: Final = mask_secrets


def validate_key_part(part: str, what: str) -> str:
    """Refuse names that could escape a topic's root or confuse a store."""
    if not part or part in (".", "..") or "/" in part or "\\" in part or any(c in _CONTROL for c in part):
        raise InvalidURIError(f"unsafe {what} {part!r}")
    return part


@dataclass(frozen=True, slots=True)
class Location:
    """A folder on some store: the root of a topic or of its metadata."""

    store: ObjectStore
    prefix: str  # no leading or trailing slash; "" is the store's root
    uri: str

    def key(self, *parts: str) -> str:
        """The key of ``parts`` below this folder; each part is checked for safety."""
        for p in parts:
            for seg in p.split("/"):
                validate_key_part(seg, "object name")
        tail = "/".join(parts)
        return f"{self.prefix}/{tail}" if self.prefix else tail

    def child(self, name: str) -> Location:
        key = self.key(name)
        return Location(self.store, key, f"{self.uri.rstrip('/')}/{name}")

    def relative(self, key: str) -> str:
        """``key`` relative to this folder (the inverse of :meth:`key`)."""
        head = f"{self.prefix}/" if self.prefix else ""
        if not key.startswith(head):
            raise InvalidURIError(f"object {key!r} is outside {self.uri}")
        return key[len(head):]
