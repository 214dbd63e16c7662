"""Local-folder backend.

Objects are regular files under ``/``.  Writes go to a hidden temporary file that is
then renamed (replace) or hard-linked (create-only) into place, so no reader ever sees a
half-written file.  Compare-and-swap holds an ``flock`` on a sidecar lock file, which
makes it atomic against other processes on the same machine.

The store follows no symbolic link, anywhere: every folder is opened one component at a
time from ``/`` with ``O_NOFOLLOW`` and every file relative to its folder's descriptor,
and only regular files are objects (a FIFO, a device, a folder or a link where an object
should be is refused before it is opened).  The operator's own path may pass through
links; :func:`shale.storage.resolve` resolves it once, before it becomes a key.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import stat
import uuid
from collections.abc import Iterator

import xxhash

from shale.ledger.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidInputError,
    NotAnObjectError,
    StorageError,
)
from shale.storage._nofollow import (
    _DIR_FLAGS,
    _errors,
    _folder,
    _open_dir,
    _open_regular,
    _pread,
    _read_all,
    _reading,
    _require_regular,
    _translate,
    _unlink,
    _write_all,
)
from shale.storage.base import ObjectInfo, ObjectStore, ObjectWriter
from shale.storage.registry import register_backend

__all__ = ["LocalStore"]

_HIDDEN = ".shale-"
_TMP = _HIDDEN + "tmp-"  # a write in progress (or left by a killed writer)
_MAP_MIN_BYTES = 1 << 20  # reads this big are mapped rather than copied
_WRITEBACK_BYTES = 1 << 20  # a streamed write starts writeback of every this many bytes

_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def start_writeback(fd: int, offset: int, nbytes: int) -> bool:
    """:func:`shale.ledger.kernels.start_writeback`, imported when first needed: the
    kernels load NumPy, which a command that reads only metadata never needs."""
    from shale.ledger.kernels import start_writeback as kernel

    return kernel(fd, offset, nbytes)


def _token(data: bytes) -> str:
    # Documents carry a version that only grows, so a content hash cannot repeat (no ABA).
    return xxhash.xxh3_128_hexdigest(data)


# ------------------------------------------------------------------ errors, in one place

def _tmp_name(name: str) -> str:
    return f"{_TMP}{uuid.uuid4().hex[:12]}-{name}"


@contextlib.contextmanager
def _locked(dir_fd: int, folder: str, name: str) -> Iterator[None]:
    """Hold an flock on the sidecar lock file of ``name`` (created if needed; never a
    link or a FIFO)."""
    lock = f"{_HIDDEN}lock-{name}"
    where = f"{folder.rstrip('/')}/{lock}"
    with contextlib.suppress(FileNotFoundError):
        _require_regular(os.stat(lock, dir_fd=dir_fd, follow_symlinks=False).st_mode, where)
    fd = os.open(lock, _LOCK_FLAGS, 0o644, dir_fd=dir_fd)
    try:
        _require_regular(os.fstat(fd).st_mode, where)
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _scan(dir_fd: int, folder: str, temporary: bool, found: list[ObjectInfo]) -> None:
    """Append the regular files below ``dir_fd`` (``folder``); never enters a link."""
    subfolders: list[str] = []
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            wanted = entry.name.startswith(_TMP) if temporary else not entry.name.startswith(_HIDDEN)
            try:
                if entry.is_dir(follow_symlinks=False):
                    subfolders.append(entry.name)
                # links, FIFOs, sockets and devices are never objects: never listed, so
                # nothing reads or deletes through them
                elif wanted and entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode):
                        found.append(ObjectInfo(f"{folder}/{entry.name}".lstrip("/"), st.st_size, st.st_mtime))
            except FileNotFoundError:
                continue  # removed while listed
    for name in subfolders:
        try:
            sub = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError as e:
            # gone, replaced by a link, or unreadable (lost+found): skipped, as os.walk did
            if e.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.EACCES):
                continue
            raise
        try:
            _scan(sub, f"{folder}/{name}", temporary, found)
        finally:
            os.close(sub)


# ------------------------------------------------------------------------- the store

class _LocalWriter(ObjectWriter):
    """Writes a temporary file in the target's folder (held open as ``dir_fd``, which
    this writer owns), renamed over the target by :meth:`close` (``replace``), or else
    hard-linked into place, which fails if the name is taken."""

    def __init__(self, path: str, dir_fd: int, *, sync: bool = True, replace: bool = True) -> None:
        self._path = path
        self._replace = replace
        self._dir: int | None = dir_fd
        self._name = os.path.basename(path)
        self._tmp = _tmp_name(self._name)
        self._sync = sync
        self._done = False
        self._written = 0
        self._kicked = 0  # bytes whose writeback to disk has been started
        try:
            fd = os.open(self._tmp, _CREATE_FLAGS, 0o666, dir_fd=dir_fd)
        except BaseException:
            self._close_dir()
            raise
        self._f = os.fdopen(fd, "wb")

    def write(self, data: bytes | bytearray | memoryview, /) -> int:
        try:
            n = self._f.write(data)
            self._written += n
            if self._sync and self._written - self._kicked >= _WRITEBACK_BYTES:
                # Start writing to disk what is written so far, without waiting: the sync at
                # close then has only the tail left.
                self._f.flush()
                start_writeback(self._f.fileno(), self._kicked, self._written - self._kicked)
                self._kicked = self._written
        except OSError as e:
            raise _translate(e, self._path) from e
        return n

    def close(self) -> None:
        if self._done:
            return
        try:
            with _errors(self._path):
                self._f.flush()
                if self._sync:
                    os.fsync(self._f.fileno())
                self._f.close()
                if self._replace:
                    os.replace(self._tmp, self._name, src_dir_fd=self._dir, dst_dir_fd=self._dir)
                else:
                    LocalStore._link(self._dir, self._tmp, self._name, self._path)
                    os.unlink(self._tmp, dir_fd=self._dir)
        except BaseException:
            self.abort()  # a full disk leaves no temporary file behind
            raise
        self._done = True
        self._close_dir()

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        with contextlib.suppress(OSError):
            self._f.close()
        with contextlib.suppress(OSError):
            os.unlink(self._tmp, dir_fd=self._dir)
        self._close_dir()

    def _close_dir(self) -> None:
        if self._dir is not None:
            os.close(self._dir)
            self._dir = None

    def __del__(self) -> None:
        # A writer dropped without close or abort (a killed task) leaves its temporary
        # file for gc, but not its folder's descriptor.
        try:
            self._close_dir()
        except Exception:  # (at interpreter exit, modules may be gone)
            pass


class LocalStore(ObjectStore):
    """Regular files on the local filesystem; keys are absolute paths without the leading
    slash.  No symbolic link is ever followed and only regular files are objects."""

    scheme = "file"
    reads_are_local = True

    def __reduce__(self) -> tuple[object, ...]:
        # One local store per process: another process gets its own (it needs no options).
        return (_local_store, ())

    def _path(self, key: str) -> str:
        return "/" + key

    def url(self, key: str) -> str:
        return self._path(key)

    def get(self, key: str) -> bytes:
        """The whole object; NotAnObjectError if it is not a regular file."""
        path = self._path(key)
        with _errors(path), _reading(path) as (fd, _):
            return _read_all(fd)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``, shorter only at the object's end."""
        path = self._path(key)
        with _errors(path), _reading(path) as (fd, st):
            return _pread(fd, start, max(0, min(end, st.st_size) - start))

    def get_view(self, key: str, start: int, end: int) -> bytes | memoryview:
        """Bytes ``[start, end)``; a big range is a read-only view of the mapped file."""
        # Big reads map the file instead of copying it: objects are never changed in
        # place (writes replace whole files), so a mapping stays valid as long as it is
        # used, even after the file is deleted.
        if end - start < _MAP_MIN_BYTES:
            return self.get_range(key, start, end)
        path = self._path(key)
        with _errors(path), _reading(path) as (fd, st):
            end = min(end, st.st_size)
            if end - start < _MAP_MIN_BYTES:
                return _pread(fd, start, max(0, end - start))
            at = start - start % mmap.ALLOCATIONGRANULARITY
            mapped = mmap.mmap(fd, end - at, access=mmap.ACCESS_READ, offset=at)
        if hasattr(mmap, "MADV_POPULATE_READ"):
            # one call maps every page (the data is read anyway), instead of a fault per page
            with contextlib.suppress(OSError):
                mapped.madvise(mmap.MADV_POPULATE_READ)
        return memoryview(mapped)[start - at:]

    def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        """The last ``length`` bytes (all if smaller) and the object's size."""
        path = self._path(key)
        with _errors(path), _reading(path) as (fd, st):
            start = max(0, st.st_size - length)
            return _pread(fd, start, st.st_size - start), st.st_size

    def stat(self, key: str) -> ObjectInfo:
        """Size and modification time, from the entry itself (a link is refused)."""
        path = self._path(key)
        folder, name = os.path.split(path)
        with _errors(path), _folder(folder) as dir_fd:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            _require_regular(st.st_mode, path)
        return ObjectInfo(key, st.st_size, st.st_mtime)

    def _writer(self, key: str, *, sync: bool, replace: bool = True) -> _LocalWriter:
        path = self._path(key)
        with _errors(path):
            return _LocalWriter(path, _open_dir(os.path.dirname(path), create=True), sync=sync, replace=replace)

    def put(self, key: str, data: bytes, *, durable: bool = True) -> None:
        """Write the object atomically (synced to disk unless ``durable=False``)."""
        with self._writer(key, sync=durable) as w:
            w.write(data)

    def open_writer(self, key: str) -> ObjectWriter:
        """A streamed write, visible under ``key`` only once closed."""
        return self._writer(key, sync=True)

    def open_writer_if_absent(self, key: str) -> ObjectWriter:
        """A streamed write hard-linked into place by ``close()``: AlreadyExistsError, and
        nothing replaced, if the name was taken meanwhile."""
        return self._writer(key, sync=True, replace=False)

    def get_with_token(self, key: str) -> tuple[bytes, str]:
        """The object and its content hash, the token compare-and-swap checks."""
        data = self.get(key)
        return data, _token(data)

    def put_if_absent(self, key: str, data: bytes) -> str:
        """Create the object only if nothing has its name (AlreadyExistsError)."""
        path = self._path(key)
        folder, name = os.path.split(path)
        tmp = _tmp_name(name)
        with _errors(path), _folder(folder, create=True) as dir_fd:
            fd = os.open(tmp, _CREATE_FLAGS, 0o666, dir_fd=dir_fd)
            try:
                try:
                    _write_all(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                self._link(dir_fd, tmp, name, path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=dir_fd)
        return _token(data)

    @staticmethod
    def _link(dir_fd: int | None, tmp: str, name: str, path: str) -> None:
        try:
            # link() fails if the target exists and publishes the complete file at once.
            os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        except FileExistsError:
            raise AlreadyExistsError(f"{path}: already exists") from None
        except OSError as e:
            if e.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise StorageError(f"{path}: this filesystem has no hard links") from e
            raise

    def put_if_match(self, key: str, data: bytes, token: str) -> str:
        """Replace the object only if its token is still ``token`` (ConflictError)."""
        path = self._path(key)
        folder, name = os.path.split(path)
        with _errors(path):
            try:
                with _folder(folder) as dir_fd, _locked(dir_fd, folder, name):
                    self._swap(dir_fd, name, path, data, token)
            except FileNotFoundError:
                raise ConflictError(f"{path}: does not exist") from None
        return _token(data)

    @staticmethod
    def _swap(dir_fd: int, name: str, path: str, data: bytes, token: str) -> None:
        """Under the lock: compare the current object with ``token``, then replace it."""
        try:
            fd, _ = _open_regular(dir_fd, name, path)
        except FileNotFoundError:
            raise ConflictError(f"{path}: vanished") from None
        try:
            current = _read_all(fd)
        finally:
            os.close(fd)
        if _token(current) != token:
            raise ConflictError(f"{path}: changed since it was read")
        with _LocalWriter(path, os.dup(dir_fd)) as w:
            w.write(data)

    def delete(self, key: str) -> None:
        """Remove the object; missing is fine, a folder is refused (NotAnObjectError)."""
        # The sidecar lock file stays: removing it could let two processes lock
        # different inodes for the same key.
        self._remove(self._path(key))

    def _remove(self, path: str) -> None:
        folder, name = os.path.split(path)
        with _errors(path), contextlib.suppress(FileNotFoundError), _folder(folder) as dir_fd:
            _unlink(dir_fd, name, path)

    def remove_empty_folder(self, prefix: str) -> None:
        """Remove the folder ``prefix`` if it is empty; anything else (a folder with
        something in it, a link, a file, nothing) is left as it is."""
        path = self._path(prefix.rstrip("/"))
        parent, name = os.path.split(path)
        with contextlib.suppress(FileNotFoundError, NotAnObjectError), _errors(path), _folder(parent) as dir_fd:
            try:
                os.rmdir(name, dir_fd=dir_fd)  # (never through a link: rmdir of a link fails)
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.ENOENT):
                    raise

    def _walk(self, prefix: str, temporary: bool) -> list[ObjectInfo]:
        """Regular files under ``prefix`` in key order: objects, or (``temporary``) the
        temporary files of writes that were never finished.  A prefix that is missing,
        or is (or passes through) a link, lists nothing: nothing is deleted through it."""
        root = self._path(prefix.rstrip("/"))
        found: list[ObjectInfo] = []
        with _errors(root), contextlib.suppress(FileNotFoundError, NotAnObjectError), _folder(root) as dir_fd:
            _scan(dir_fd, root.rstrip("/"), temporary, found)
        found.sort(key=lambda o: o.key)
        return found

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every regular file under ``prefix`` (links are neither listed nor entered)."""
        yield from self._walk(prefix, temporary=False)

    def unfinished_writes(self, prefix: str) -> Iterator[ObjectInfo]:
        """Temporary files of writes never finished under ``prefix``."""
        yield from self._walk(prefix, temporary=True)

    def discard_write(self, info: ObjectInfo) -> None:
        """Remove one temporary file listed by :meth:`unfinished_writes`."""
        if not os.path.basename(info.key).startswith(_TMP):
            raise InvalidInputError(f"{info.key!r} is not an unfinished write")
        self._remove(self._path(info.key))


_STORE = LocalStore()


def _local_store() -> LocalStore:
    """This process's local store."""
    return _STORE


register_backend("file", lambda netloc: _STORE)
