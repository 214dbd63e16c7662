"""In-process backend (``memory://name/...``) for tests and examples.

Every ``memory://name`` in one process shares the same objects, like a bucket.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from shale.ledger.errors import AlreadyExistsError, ConflictError, ObjectNotFoundError
from shale.ledger.values import dataclass
from shale.storage.base import ObjectInfo, ObjectStore, ObjectWriter
from shale.storage.registry import register_backend

__all__ = ["MemoryStore"]


@dataclass(frozen=True, slots=True)
class _Obj:
    data: bytes
    mtime: float
    token: str


class _MemoryWriter(ObjectWriter):
    def __init__(self, store: MemoryStore, key: str, *, if_absent: bool = False) -> None:
        self._store, self._key, self._parts = store, key, bytearray()
        self._done = False
        self._if_absent = if_absent

    def write(self, data: bytes | bytearray | memoryview, /) -> int:
        self._parts += data
        return len(data)

    def close(self) -> None:
        if not self._done:
            self._done = True
            if self._if_absent:
                self._store.put_if_absent(self._key, bytes(self._parts))
            else:
                self._store.put(self._key, bytes(self._parts))

    def abort(self) -> None:
        self._done = True


class MemoryStore(ObjectStore):
    """A dict of objects guarded by one lock."""

    scheme = "memory"
    supports_conditional_writes = True
    process_safe = False  # a child process would write into its own copy
    shared_between_processes = False  # the objects live in this process only
    reads_are_local = True

    def __init__(self, name: str) -> None:
        self.name = self.authority = name
        self._objects: dict[str, _Obj] = {}
        self._lock = threading.Lock()
        self._counter = 0

    def __reduce__(self) -> tuple[object, ...]:
        # The objects live in one process: unpickled, this is the store of the same name
        # in the receiving process (this very store, in this process).
        return (_factory, (self.name,))

    def _new(self, data: bytes) -> _Obj:
        self._counter += 1
        return _Obj(bytes(data), time.time(), f"{self._counter}")

    def url(self, key: str) -> str:
        return f"memory://{self.name}/{key}"

    def _obj(self, key: str) -> _Obj:
        try:
            return self._objects[key]
        except KeyError:
            raise ObjectNotFoundError(f"{self.url(key)}: no such object") from None

    def get(self, key: str) -> bytes:
        return self._obj(key).data

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self._obj(key).data[start:end]

    def stat(self, key: str) -> ObjectInfo:
        o = self._obj(key)
        return ObjectInfo(key, len(o.data), o.mtime, o.token)

    def put(self, key: str, data: bytes, *, durable: bool = True) -> None:
        with self._lock:
            self._objects[key] = self._new(data)

    def open_writer(self, key: str) -> ObjectWriter:
        return _MemoryWriter(self, key)

    def open_writer_if_absent(self, key: str) -> ObjectWriter:
        return _MemoryWriter(self, key, if_absent=True)

    def get_with_token(self, key: str) -> tuple[bytes, str]:
        o = self._obj(key)
        return o.data, o.token

    def put_if_absent(self, key: str, data: bytes) -> str:
        with self._lock:
            if key in self._objects:
                raise AlreadyExistsError(f"{self.url(key)}: already exists")
            o = self._objects[key] = self._new(data)
            return o.token

    def put_if_match(self, key: str, data: bytes, token: str) -> str:
        with self._lock:
            cur = self._objects.get(key)
            if cur is None or cur.token != token:
                raise ConflictError(f"{self.url(key)}: changed since it was read")
            o = self._objects[key] = self._new(data)
            return o.token

    def now_ms(self, prefix: str) -> int:
        return int(time.time() * 1000)  # objects are stamped with this process's clock

    def delete(self, key: str) -> None:
        with self._lock:
            self._objects.pop(key, None)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        head = prefix.rstrip("/") + "/" if prefix else ""
        with self._lock:
            items = sorted((k, o) for k, o in self._objects.items() if k.startswith(head))
        for k, o in items:
            yield ObjectInfo(k, len(o.data), o.mtime, o.token)



_STORES: dict[str, MemoryStore] = {}
_STORES_LOCK = threading.Lock()


def _factory(netloc: str) -> MemoryStore:
    with _STORES_LOCK:
        return _STORES.setdefault(netloc, MemoryStore(netloc))


register_backend("memory", _factory)
