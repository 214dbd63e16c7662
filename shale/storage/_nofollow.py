"""Opening files and folders without ever following a symbolic link (the local store's
descriptor-level helpers).

Every folder is opened one component at a time from ``/`` with ``O_NOFOLLOW``, every
file relative to its folder's descriptor, and only regular files are taken for objects:
a link, a FIFO, a device or a folder where an object should be is refused before it is
opened.  OS errors are translated here, naming the object's path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator

from shale.ledger.errors import NotAnObjectError, ObjectNotFoundError, ShaleError, StorageError, StoragePermissionError

_OPEN_ATTEMPTS = 8  # an object replaced between its lstat and its open is looked at again
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: should a FIFO be swapped in between the check and the open, the open
# returns at once instead of waiting for a writer (it is then refused by its fstat).
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_LINK_MESSAGE = "is a symbolic link; the local store follows no links"
_FOLDER_MESSAGE = "is a folder, not an object"
_DISK_FULL = "no space left on the device (disk full)"


_KINDS = {stat.S_IFLNK: "a symbolic link", stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO",
          stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFREG: "a regular file"}


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "an unknown kind of file")


def _require_regular(mode: int, path: str) -> None:
    """Refuse whatever is not a regular file, from its lstat, before it is ever opened."""
    if not stat.S_ISREG(mode):
        says = {stat.S_IFLNK: _LINK_MESSAGE, stat.S_IFDIR: _FOLDER_MESSAGE}.get(
            stat.S_IFMT(mode), f"is {_kind(mode)}, not a regular file")
        raise NotAnObjectError(f"{path}: {says}")


_ERRNO_MESSAGES: dict[int, tuple[type[StorageError], str]] = {
    errno.ENOENT: (ObjectNotFoundError, "no such object"), errno.ELOOP: (NotAnObjectError, _LINK_MESSAGE),
    errno.EISDIR: (NotAnObjectError, _FOLDER_MESSAGE),
    errno.ENOTDIR: (NotAnObjectError, "a folder on its way is not a folder"),
    errno.EACCES: (StoragePermissionError, "permission denied"),
    errno.EPERM: (StoragePermissionError, "permission denied"),
    errno.ENOSPC: (StorageError, _DISK_FULL), errno.EDQUOT: (StorageError, _DISK_FULL),
    errno.EROFS: (StorageError, "read-only file system"),
}


def _translate(e: OSError, path: str) -> StorageError:
    """The Shale error for ``e`` met while working on the object at ``path`` (never the
    temporary file's name: the operator knows the object, not our scratch names)."""
    cls, says = _ERRNO_MESSAGES.get(e.errno or 0, (StorageError, e.strerror or str(e)))
    return cls(f"{path}: {says}")


@contextlib.contextmanager
def _errors(path: str) -> Iterator[None]:
    try:
        yield
    except ShaleError:
        raise  # already says what happened (and AlreadyExistsError is an OSError too)
    except OSError as e:
        raise _translate(e, path) from e


# ------------------------------------------------------------- opening without links

def _not_a_folder(parent: int, name: str, where: str, cause: OSError) -> OSError:
    """Why ``name`` (at ``where``) could not be opened as a folder: the folder itself is
    named, since it, not the object below it, is what somebody replaced."""
    try:
        mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
    except FileNotFoundError as gone:
        return gone  # removed meanwhile: then the object is simply missing
    if stat.S_ISLNK(mode):
        return NotAnObjectError(f"{where}: {_LINK_MESSAGE}")
    if stat.S_ISDIR(mode):
        return cause  # put back meanwhile; too unusual to retry
    return NotAnObjectError(f"{where}: is {_kind(mode)}, not a folder")


def _open_dir(path: str, *, create: bool = False) -> int:
    """A descriptor of the folder ``path`` (absolute), opened one component at a time from
    ``/`` without following any link; missing folders are made when ``create``.  Raises
    FileNotFoundError when missing, NotAnObjectError when a component is not a folder."""
    fd = os.open("/", _DIR_FLAGS)
    where = ""
    try:
        for name in path.split("/"):
            if not name or name == ".":
                continue
            where += "/" + name
            try:
                try:
                    sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    with contextlib.suppress(FileExistsError):  # another writer made it first
                        os.mkdir(name, 0o777, dir_fd=fd)
                    sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise _not_a_folder(fd, name, where, e) from None
            # (an interrupt between two steps may leak a descriptor, never close one twice)
            old, fd = fd, sub
            os.close(old)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def _folder(path: str, *, create: bool = False) -> Iterator[int]:
    fd = _open_dir(path, create=create)
    try:
        yield fd
    finally:
        os.close(fd)


def _open_regular(dir_fd: int, name: str, path: str) -> tuple[int, os.stat_result]:
    """A read descriptor of the regular file ``name`` and its fstat.  Its lstat is
    checked first, so a FIFO or a device is never opened (opening a tape rewinds it); the
    fstat of what was opened must then be the same file, which closes the race."""
    for _ in range(_OPEN_ATTEMPTS):
        before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        _require_regular(before.st_mode, path)
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
        try:
            st = os.fstat(fd)
            _require_regular(st.st_mode, path)
        except BaseException:
            os.close(fd)
            raise
        if (st.st_dev, st.st_ino) == (before.st_dev, before.st_ino):
            return fd, st
        os.close(fd)  # replaced by a new version between the two: look again
    raise StorageError(f"{path}: kept being replaced while it was opened")


@contextlib.contextmanager
def _reading(path: str) -> Iterator[tuple[int, os.stat_result]]:
    folder, name = os.path.split(path)
    with _folder(folder) as dir_fd:
        fd, st = _open_regular(dir_fd, name, path)
    try:
        yield fd, st
    finally:
        os.close(fd)


def _pread(fd: int, start: int, n: int) -> bytes:
    parts = []  # one read but for very big ranges (a single read stops short of 2 GiB)
    while n > 0 and (got := os.pread(fd, n, start)):
        parts.append(got)
        start, n = start + len(got), n - len(got)
    return b"".join(parts)  # (one part is returned as it is, not copied)


def _read_all(fd: int) -> bytes:
    with open(fd, "rb", buffering=0, closefd=False) as f:
        return f.readall()


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]


def _unlink(dir_fd: int, name: str, path: str) -> None:
    """Remove the entry ``name`` itself (a link is removed, never what it points at)."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass  # deleting what is not there is fine
    except IsADirectoryError:
        raise NotAnObjectError(f"{path}: {_FOLDER_MESSAGE}") from None
    except PermissionError:
        # POSIX lets unlink() of a folder fail with EPERM rather than EISDIR.
        if stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            raise NotAnObjectError(f"{path}: {_FOLDER_MESSAGE}") from None
        raise
