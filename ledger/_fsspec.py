"""Any other fsspec filesystem (gs://, az://, abfs://, ...) for ledger data.

fsspec offers no portable compare-and-swap, so these stores refuse
:meth:`put_if_match`; keep the metadata on S3 or a local folder with ``--metadata``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from ledger.errors import (
    AlreadyExistsError,
    InvalidURIError,
    ObjectNotFoundError,
    StorageError,
    UnsupportedOperationError,
)
from ledger.storage import ObjectInfo, ObjectStore, ObjectWriter

__all__ = ["FsspecStore", "fsspec_factory"]


def _mtime(info: dict[str, Any]) -> float:
    """The object's modification time; "now" when the filesystem does not say.

    Garbage collection deletes unreferenced objects only when they are old, so an
    unknown age must count as young, never as infinitely old.
    """
    for name in ("mtime", "LastModified", "last_modified", "updated", "modified", "created", "creation_time"):
        value = info.get(name)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return time.time()


class _FsspecWriter(ObjectWriter):
    def __init__(self, store: FsspecStore, key: str) -> None:
        self._store, self._key, self._buf = store, key, bytearray()
        self._done = False

    def write(self, data: bytes | bytearray | memoryview, /) -> int:
        self._buf += data
        return len(data)

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._store.put(self._key, bytes(self._buf))

    def abort(self) -> None:
        self._done = True


class FsspecStore(ObjectStore):
    """An fsspec filesystem rooted at ``scheme://netloc``."""

    def __init__(self, fs: Any, scheme: str, netloc: str) -> None:
        self.fs, self.scheme, self.netloc = fs, scheme, netloc

    def _p(self, key: str) -> str:
        return f"{self.netloc}/{key}" if self.netloc else key

    def url(self, key: str) -> str:
        return f"{self.scheme}://{self._p(key)}"

    def _wrap(self, key: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except FileNotFoundError:
            raise ObjectNotFoundError(f"{self.url(key)}: no such object") from None
        except FileExistsError:
            raise AlreadyExistsError(f"{self.url(key)}: already exists") from None
        except (NotImplementedError, ValueError) as e:
            raise UnsupportedOperationError(f"{self.url(key)}: {e}") from e
        except OSError as e:
            raise StorageError(f"{self.url(key)}: {type(e).__name__}: {e}") from e

    def get(self, key: str) -> bytes:
        return bytes(self._wrap(key, lambda: self.fs.cat_file(self._p(key))))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return bytes(self._wrap(key, lambda: self.fs.cat_file(self._p(key), start=start, end=end)))

    def stat(self, key: str) -> ObjectInfo:
        info = self._wrap(key, lambda: self.fs.info(self._p(key)))
        if info.get("type") == "directory":
            raise ObjectNotFoundError(f"{self.url(key)}: is a folder, not an object")
        return ObjectInfo(key, int(info.get("size") or 0), _mtime(info))

    def put(self, key: str, data: bytes, *, durable: bool = True) -> None:
        self._wrap(key, lambda: self.fs.pipe_file(self._p(key), data))

    def open_writer(self, key: str) -> ObjectWriter:
        return _FsspecWriter(self, key)

    def get_with_token(self, key: str) -> tuple[bytes, str]:
        raise UnsupportedOperationError(
            f"{self.url(key)}: {self.scheme}:// has no compare-and-swap through fsspec; "
            "keep the metadata on s3:// or a local folder (--metadata)"
        )

    def put_if_absent(self, key: str, data: bytes) -> str:
        def create() -> str:
            with self.fs.open(self._p(key), "xb") as f:
                f.write(data)
            return ""
        result: str = self._wrap(key, create)
        return result

    def put_if_match(self, key: str, data: bytes, token: str) -> str:
        self.get_with_token(key)
        raise AssertionError("unreachable")

    def delete(self, key: str) -> None:
        try:
            self._wrap(key, lambda: self.fs.rm_file(self._p(key)))
        except ObjectNotFoundError:
            pass

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        root = self._p(prefix.rstrip("/"))
        try:
            found = self.fs.find(root, detail=True)
        except FileNotFoundError:
            return
        head = f"{self.netloc}/" if self.netloc else ""
        for path in sorted(found):
            info = found[path]
            key = path.lstrip("/")[len(head.lstrip("/")):] if head else path.lstrip("/")
            yield ObjectInfo(key, int(info.get("size") or 0), _mtime(info))


def fsspec_factory(scheme: str) -> Callable[[str], ObjectStore]:
    """A factory for ``scheme`` if fsspec knows it, else an :class:`InvalidURIError`."""
    import fsspec

    if scheme not in fsspec.available_protocols():
        raise InvalidURIError(f"unknown URI scheme {scheme!r}")

    def factory(netloc: str) -> ObjectStore:
        try:
            fs = fsspec.filesystem(scheme)
        except ImportError as e:
            raise UnsupportedOperationError(f"{scheme}:// needs an extra package: {e}") from e
        return FsspecStore(fs, scheme, netloc)

    return factory
