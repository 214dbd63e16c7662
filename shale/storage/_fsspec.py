"""Any other fsspec filesystem (gs://, az://, abfs://, ...) for ledger data.

fsspec offers no portable compare-and-swap, so these stores declare no conditional
writes and refuse them all; keep the metadata on S3 or a local folder with ``--metadata``.
"""

from __future__ import annotations

import contextlib
import gc
import posixpath
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from shale.ledger.errors import (
    AlreadyExistsError,
    InvalidURIError,
    ObjectNotFoundError,
    StorageError,
    StoragePermissionError,
    UnsupportedOperationError,
)
from shale.ledger.masking import masked_cause
from shale.storage.base import ObjectInfo, ObjectStore, ObjectWriter
from shale.storage.options import StorageOptions

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

    supports_conditional_writes = False

    def __init__(self, fs: Any, scheme: str, netloc: str) -> None:
        self.fs, self.scheme, self.netloc, self.authority = fs, scheme, netloc, netloc
        protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
        # fsspec's memory filesystem is a dict in this process, like memory://
        in_process = "memory" in protocols
        self.shared_between_processes = not in_process
        # an asynchronous filesystem (gcs, azure, http) refuses to be used across a fork
        self.process_safe = not in_process and not getattr(fs, "async_impl", False)
        self.reads_are_local = in_process or bool(getattr(fs, "local_file", False))

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
            err: StorageError = UnsupportedOperationError(f"{self.url(key)}: {e}")
            failure: Exception = e
        except PermissionError as e:  # how the command is run, not the data
            err, failure = StoragePermissionError(f"{self.url(key)}: permission denied"), e
        except OSError as e:
            err, failure = StorageError(f"{self.url(key)}: {type(e).__name__}: {e}"), e
        # raised here, not in the except block: a library's text naming a URL with its
        # password must not stay behind as the error's context
        err.__cause__ = masked_cause(failure)
        raise err

    def get(self, key: str) -> bytes:
        return bytes(self._wrap(key, lambda: self.fs.cat_file(self._p(key))))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        # a local file reads to its end for an end before the start: an empty range is asked as such
        end = max(start, end)
        return bytes(self._wrap(key, lambda: self.fs.cat_file(self._p(key), start=start, end=end)))

    def stat(self, key: str) -> ObjectInfo:
        info = self._wrap(key, lambda: self.fs.info(self._p(key)))
        if info.get("type") == "directory":
            raise ObjectNotFoundError(f"{self.url(key)}: is a folder, not an object")
        return ObjectInfo(key, int(info.get("size") or 0), _mtime(info))

    def put(self, key: str, data: bytes, *, durable: bool = True) -> None:
        path = self._p(key)

        def write() -> None:
            try:
                self.fs.pipe_file(path, data)
            except FileNotFoundError:
                # a filesystem with real folders (a local disk, SFTP, HDFS) needs the
                # object's folder first; object stores have none and never get here
                self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
                self.fs.pipe_file(path, data)
        self._wrap(key, write)

    def open_writer(self, key: str) -> ObjectWriter:
        return _FsspecWriter(self, key)

    def _no_conditional_writes(self, key: str) -> UnsupportedOperationError:
        return UnsupportedOperationError(
            f"{self.url(key)}: {self.scheme}:// has no compare-and-swap through fsspec; "
            "keep the metadata on s3:// or a local folder (--metadata)"
        )

    # Create-only is refused too: fsspec's "xb" mode is not atomic on most filesystems,
    # and the token it would return could not be compared against anyway.
    def get_with_token(self, key: str) -> tuple[bytes, str]:
        raise self._no_conditional_writes(key)

    def put_if_absent(self, key: str, data: bytes) -> str:
        raise self._no_conditional_writes(key)

    def put_if_match(self, key: str, data: bytes, token: str) -> str:
        raise self._no_conditional_writes(key)

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
        folder = prefix.rstrip("/") + "/" if prefix.rstrip("/") else ""
        for path in sorted(found):
            info = found[path]
            key = path.lstrip("/")[len(head.lstrip("/")):] if head else path.lstrip("/")
            # find() of an object's own path returns the object; a folder listing does not
            if key.startswith(folder):
                yield ObjectInfo(key, int(info.get("size") or 0), _mtime(info))


def fsspec_factory(scheme: str) -> Callable[[str, StorageOptions], ObjectStore]:
    """A factory for ``scheme`` if fsspec knows it, else an :class:`InvalidURIError`.  The
    filesystem gets the options' fsspec storage options for ``scheme`` (fsspec adds its own
    configuration to them); a store pickles as its filesystem does, with them."""
    import fsspec

    if scheme not in fsspec.available_protocols():
        raise InvalidURIError(f"unknown URI scheme {scheme!r}")

    def factory(netloc: str, options: StorageOptions) -> ObjectStore:
        with _quiet_finalizers() as failed:
            try:
                fs = fsspec.filesystem(scheme, **options.fsspec_options(scheme))
            except ImportError as e:
                raise UnsupportedOperationError(f"{scheme}:// needs an extra package: {e}") from e
            except Exception as e:  # a filesystem that needs what a URI does not give (ftp://'s host, ...)
                # (a library's own words, without the Python names in them)
                why = str(e) if isinstance(e, OSError | ValueError) else "it needs settings a URI does not give"
                failed.append(True)
            else:
                return FsspecStore(fs, scheme, netloc)
        raise InvalidURIError(f"{scheme}:// storage cannot be opened from a URI alone ({why}); Shale reads and "
                              "writes s3:// and local folders, and fsspec filesystems that need no settings")

    return factory


@contextlib.contextmanager
def _quiet_finalizers() -> Iterator[list[bool]]:
    """A filesystem whose making failed (the block says so in the list it is given) is let
    go within the block, and what its finalizer says about being half made (fsspec's FTP
    one raises) kept off standard error."""
    hook = sys.unraisablehook
    sys.unraisablehook = lambda _: None
    failed: list[bool] = []
    try:
        yield failed
    finally:
        if failed:
            gc.collect()  # (one held in a reference cycle goes now, not at some later collection)
        sys.unraisablehook = hook
