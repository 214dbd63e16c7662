"""Where ``shale export`` writes, and what it refuses to write over.

OUT is one of:

* ``-`` (also ``/dev/stdout``, ``/dev/fd/1``, ``/proc/self/fd/1``): the process's
  standard output (file descriptor 1), streamed; Parquet and Arrow are refused on a
  terminal;
* a local path: a regular file in a folder that exists (none is created);
* any other URI a store resolves (``s3://bucket/key``): one object.

Refused before anything is read or written, in one line naming OUT (exit 2):

* an OUT inside a topic: under the source topic's folder or its ``--metadata`` folder,
  under any folder holding a ``_meta/topic.json`` (every folder above OUT is looked at:
  a few stats locally, a HEAD request each on a store), or named as a topic's own
  objects are (a ``_meta`` folder, ``ledgers/<id>-<nonce>.ledger``, a compaction run's
  objects, a trained dictionary, Shale's hidden ``.shale-`` files);
* an OUT that exists, unless ``overwrite``; and whatever is not a regular file even
  then: a symbolic link (never written through), a folder (or, on a store, a prefix
  with objects under it), a FIFO, a socket, a device.

Without ``overwrite`` nothing that appears at OUT while the export runs is replaced: a
local file is hard-linked into place (which fails if the name is taken), an S3 object
is created with ``If-None-Match: *``.  With it, only a regular file is replaced, by a
rename (the file's old content is never written into).

A local export writes a hidden temporary ``.shale-export-<12 hex digits>.tmp`` in OUT's
folder, and holds an exclusive ``flock`` on it until it is renamed into place or
removed.  A killed export cannot remove it; so before it writes, every export removes
the files of OUT's folder named that way whose lock it can take (their writer is dead)
and nothing else.  On S3 a failed export aborts its multipart upload; one killed
outright leaves an incomplete upload, invisible and never read, that a bucket lifecycle
rule (``AbortIncompleteMultipartUpload``) removes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import sys
import urllib.parse
import uuid
from typing import Final

from shale.ledger.errors import (
    AlreadyExistsError,
    BucketNotFoundError,
    InvalidInputError,
    NotAnObjectError,
    ObjectNotFoundError,
    OutputExistsError,
    ShaleError,
    StorageError,
    StoragePermissionError,
    TransientStorageError,
    error_line,
)
from shale.metadata.layout import (
    COMPACTED_DIR,
    DICTIONARY_DIR,
    META_DIR,
    is_compacted_object,
    is_ledger_object,
    is_run_dir,
)
from shale.metadata.topic import TopicMetadata
from shale.storage import Location, ObjectStore, ObjectWriter, resolve

__all__ = ["STDOUT_NAMES", "Output", "is_stdout", "open_output", "temporary_name"]

#: The OUTs that mean standard output.
STDOUT_NAMES: Final = frozenset({"-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"})

_MARKER: Final = f"{META_DIR}/topic.json"  # what makes a folder a topic's
_DICTIONARY: Final = re.compile(rf"{DICTIONARY_DIR}/\d{{10}}-[0-9a-f]{{12}}\.zdict")
_TEMPORARY: Final = re.compile(r"\.shale-export-[0-9a-f]{12}\.tmp")
_BUFFER_BYTES: Final = 1 << 20
_NEW_FILE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a leftover never waits, should a FIFO have been swapped in
_PEEK_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_KINDS: Final = {stat.S_IFLNK: "a symbolic link (export never writes through a link)",
                 stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
                 stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}
_ONLY_FILES: Final = "export writes only a new regular file, or with --overwrite replaces one"


def temporary_name() -> str:
    """A new name for a local export's temporary file (hidden, never an object's)."""
    return f".shale-export-{uuid.uuid4().hex[:12]}.tmp"


def is_stdout(out_uri: str) -> bool:
    """Whether OUT names standard output."""
    return out_uri in STDOUT_NAMES or out_uri.removeprefix("file://") in STDOUT_NAMES - {"-"}


class Output(ObjectWriter):
    """Where an export's bytes go: nothing is visible at :attr:`uri` until :meth:`close`
    (standard output aside), and :meth:`abort` leaves nothing behind."""

    #: OUT as messages and the export's result name it ("-" for standard output).
    uri: str = ""


def open_output(out_uri: str, source: TopicMetadata, *, overwrite: bool = False, binary: bool = True) -> Output:
    """Check OUT (see the module) and open it for writing; ``binary``: the bytes are not
    text (refused on a terminal)."""
    if is_stdout(out_uri):
        return _Stdout(binary)
    scheme = urllib.parse.urlsplit(out_uri).scheme.lower()
    if scheme in ("", "file"):
        return _open_local(out_uri, source, overwrite)
    return _open_store(out_uri, source, overwrite)


# ------------------------------------------------------------------- the checks

def _refuse_the_source(out: str, key: str, source: TopicMetadata, store: ObjectStore) -> None:
    """Refuse a ``key`` (on ``store``) inside the source topic or its metadata."""
    places: list[tuple[Location, str]] = [(source.topic, f"inside the topic {source.uri}"),
                                          (source.meta, f"inside the metadata of the topic {source.uri}")]
    if source.metadata_uri is not None:
        places.append((resolve(source.metadata_uri), f"inside the metadata folder {source.metadata_uri}"))
    for loc, where in places:
        if _same_store(loc.store, store) and (not loc.prefix or key == loc.prefix or
                                              key.startswith(loc.prefix + "/")):
            raise InvalidInputError(f"{out}: is {where}; export never writes into a topic")


def _refuse_topic_names(out: str, key: str) -> None:
    """Refuse a ``key`` named as a topic's objects are (where no topic says so)."""
    parts = key.split("/")
    if any(p.startswith(".shale-") for p in parts) or META_DIR in parts[:-1]:
        raise InvalidInputError(f"{out}: is named as Shale names a topic's own objects; export never writes into "
                                "a topic's layout")
    for i in range(len(parts)):
        rest = "/".join(parts[i:])
        if (is_ledger_object(rest) or is_compacted_object(rest) or _DICTIONARY.fullmatch(rest)
                or (parts[i] == COMPACTED_DIR and is_run_dir("/".join(parts[i:i + 2])))):
            raise InvalidInputError(f"{out}: is named as Shale names a topic's own objects ({rest}); export "
                                    "never writes into a topic's layout")


def _same_store(a: ObjectStore, b: ObjectStore) -> bool:
    return a.scheme == b.scheme and a.authority == b.authority


def _inside(out: str, topic_url: str) -> InvalidInputError:
    return InvalidInputError(f"{out}: is inside the topic {topic_url} (it holds {_MARKER}); export never writes "
                             "into a topic")


def _ancestors(key: str) -> list[str]:
    """The folders above ``key``, nearest first, the store's root ("") last."""
    parts = key.split("/")[:-1]
    return ["/".join(parts[:i]) for i in range(len(parts), -1, -1)]


# ------------------------------------------------------------------- a store

def _open_store(out: str, source: TopicMetadata, overwrite: bool) -> Output:
    if out.endswith("/"):
        raise InvalidInputError(f"{out}: names a folder; name the object to write")
    loc = resolve(out)
    if not loc.prefix:
        raise InvalidInputError(f"{out}: name the object to write, not a bucket or root")
    store, key = loc.store, loc.prefix
    _refuse_the_source(loc.uri, key, source, store)
    for folder in _ancestors(key):  # one HEAD request a folder: at most the key's depth
        marker = f"{folder}/{_MARKER}" if folder else _MARKER
        if _seen(store, marker):
            raise _inside(loc.uri, store.url(folder))
    _refuse_topic_names(loc.uri, key)
    if not overwrite and _seen(store, key):
        raise OutputExistsError(f"{loc.uri}: already exists; pass --overwrite to replace it")
    if _seen(store, key, folder=True):
        raise OutputExistsError(f"{loc.uri}: is a folder (objects lie under it); {_ONLY_FILES}")
    writer = store.open_writer(key) if overwrite else store.open_writer_if_absent(key)
    return _StoreOutput(loc.uri, writer)


def _seen(store: ObjectStore, key: str, *, folder: bool = False) -> bool:
    """Whether an object stands at ``key`` (``folder``: whether objects lie under it).
    What this identity may not read or list (an access-denied answer, which S3 also
    gives for a missing object without ``s3:ListBucket``) is not seen."""
    try:
        if folder:
            return next(iter(store.list(key)), None) is not None
        store.stat(key)
    except (ObjectNotFoundError, BucketNotFoundError):
        return False
    except NotAnObjectError:
        return True
    except TransientStorageError:
        raise
    except StorageError as e:
        if isinstance(e, StoragePermissionError) or "access denied" in str(e):
            return False
        raise
    return True


class _StoreOutput(Output):
    def __init__(self, uri: str, writer: ObjectWriter) -> None:
        self.uri, self._writer = uri, writer

    def write(self, data: bytes | bytearray | memoryview, /) -> int:
        return self._writer.write(data)

    def close(self) -> None:
        try:
            self._writer.close()
        except AlreadyExistsError:
            raise _appeared(self.uri) from None

    def abort(self) -> None:
        self._writer.abort()


def _appeared(out: str) -> OutputExistsError:
    return OutputExistsError(f"{out}: appeared while the export was written and was left as it is; pass "
                             "--overwrite to replace it")


# ------------------------------------------------------------------- standard output

class _Stdout(Output):
    """File descriptor 1, written through a buffer of its own (nothing Python's
    ``sys.stdout`` buffers is left to flush after a broken pipe)."""

    def __init__(self, binary: bool) -> None:
        self.uri = "-"
        try:
            os.fstat(1)
        except OSError:
            raise InvalidInputError("-: standard output is closed") from None
        if binary and os.isatty(1):
            raise InvalidInputError("-: standard output is a terminal; redirect it to a file or a pipe, or name "
                                    "OUT (or use --format jsonl)")
        sys.stdout.flush()
        self._buf = bytearray()

    def write(self, data: bytes | bytearray | memoryview, /) -> int:
        n = memoryview(data).nbytes
        self._buf += data
        if len(self._buf) >= _BUFFER_BYTES:
            self._flush()
        return n

    def _flush(self) -> None:
        view, self._buf = memoryview(self._buf), bytearray()
        while view:
            view = view[os.write(1, view):]

    def close(self) -> None:
        self._flush()

    def abort(self) -> None:
        self._buf = bytearray()


# ------------------------------------------------------------------- a local file

def _open_local(out: str, source: TopicMetadata, overwrite: bool) -> Output:
    resolve(out)  # the same checks of the text as for a topic (no "..", no control character, no host)
    path = urllib.parse.urlsplit(out).path if out.lower().startswith("file:") else out
    folder, name = os.path.split(os.path.expanduser(path))
    if name in ("", ".", ".."):
        raise InvalidInputError(f"{out}: names a folder; name the file to write")
    # The operator's own folder may pass through links (as a topic's path may); the name
    # itself is never followed.
    folder = os.path.realpath(folder or ".")
    shown = os.path.join(folder, name)
    key = shown.lstrip("/")
    _refuse_the_source(shown, key, source, resolve(folder).store)
    for above in _ancestors(key):
        if _lexists(f"/{above}/{_MARKER}" if above else f"/{_MARKER}", shown):
            raise _inside(shown, f"/{above}")
    _refuse_topic_names(shown, key)
    try:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ObjectNotFoundError(f"{shown}: the folder {folder} does not exist; export creates no folder") from None
    except NotADirectoryError:
        raise InvalidInputError(f"{shown}: {folder} is not a folder") from None
    except OSError as e:
        raise _os_error(e, shown) from e
    try:
        _check_local_kind(dir_fd, name, shown, overwrite)
        _remove_dead_temporaries(dir_fd)
        return _LocalOutput(shown, name, dir_fd, overwrite)
    except BaseException:
        os.close(dir_fd)
        raise


def _lexists(path: str, shown: str) -> bool:
    try:
        os.stat(path, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as e:
        raise _os_error(e, shown) from e
    return True


def _check_local_kind(dir_fd: int, name: str, shown: str, overwrite: bool) -> None:
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise _os_error(e, shown) from e
    if not stat.S_ISREG(mode):
        kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
        raise OutputExistsError(f"{shown}: is {kind}; {_ONLY_FILES}")
    if not overwrite:
        raise OutputExistsError(f"{shown}: already exists; pass --overwrite to replace it")


def _os_error(e: OSError, shown: str) -> ShaleError:
    """``e`` as one line naming OUT (never the temporary file)."""
    reason = error_line(OSError(e.errno, e.strerror))
    if reason.startswith("unexpected error") and e.strerror:
        reason = e.strerror.lower()  # an OS error has its own words
    if e.errno in (errno.EACCES, errno.EPERM):
        return StoragePermissionError(f"{shown}: {reason}")
    if e.errno == errno.ENAMETOOLONG:
        return InvalidInputError(f"{shown}: {reason}")
    return StorageError(f"{shown}: {reason}")


def _remove_dead_temporaries(dir_fd: int) -> None:
    """Remove the temporaries of killed exports from the folder: the regular files named
    as :func:`temporary_name` names them whose lock can be taken."""
    with os.scandir(dir_fd) as entries:
        names = [e.name for e in entries if _TEMPORARY.fullmatch(e.name)]
    for name in names:
        try:
            before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if not stat.S_ISREG(before.st_mode):
                continue
            fd = os.open(name, _PEEK_FLAGS, dir_fd=dir_fd)
        except OSError:
            continue  # gone meanwhile, or not ours to open
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by a live export: BlockingIOError
            now = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                os.unlink(name, dir_fd=dir_fd)
        except OSError:
            continue  # alive, no locks on this file system, or not ours to remove
        finally:
            os.close(fd)


class _LocalOutput(Output):
    """A temporary file in OUT's folder (``dir_fd``, owned), locked while it lives,
    linked (or, with ``overwrite``, renamed) into place by :meth:`close`."""

    def __init__(self, shown: str, name: str, dir_fd: int, overwrite: bool) -> None:
        self.uri, self._name, self._dir, self._overwrite = shown, name, dir_fd, overwrite
        self._done = False
        self._tmp, fd = self._create()
        self._f = os.fdopen(fd, "wb", buffering=_BUFFER_BYTES)

    def _create(self) -> tuple[str, int]:
        for _ in range(8):
            tmp = temporary_name()
            try:
                fd = os.open(tmp, _NEW_FILE_FLAGS, 0o666, dir_fd=self._dir)
            except OSError as e:
                raise _os_error(e, self.uri) from e
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)  # another export's clean-up took it for a leftover: it removes it
                continue
            except OSError:
                pass  # no locks here: then no clean-up can take the lock, and none removes it
            if os.fstat(fd).st_nlink > 0:
                return tmp, fd
            os.close(fd)  # removed by a clean-up before it was locked
        raise StorageError(f"{self.uri}: its temporary file kept being removed by other exports")

    def write(self, data: bytes | bytearray | memoryview, /) -> int:
        try:
            return self._f.write(data)
        except OSError as e:
            raise _os_error(e, self.uri) from e

    def close(self) -> None:
        if self._done:
            return
        try:
            self._f.flush()
            os.fsync(self._f.fileno())
            if self._overwrite:
                self._replace()
            else:
                self._link()
        except ShaleError:  # (OutputExistsError is an OSError too)
            self.abort()
            raise
        except OSError as e:
            self.abort()
            raise _os_error(e, self.uri) from e
        except BaseException:
            self.abort()
            raise
        self._done = True
        self._f.close()  # releases the lock
        os.close(self._dir)

    def _replace(self) -> None:
        # Looked at again just before the rename: whatever stands there now must still be
        # a regular file (or nothing).
        _check_local_kind(self._dir, self._name, self.uri, overwrite=True)
        os.replace(self._tmp, self._name, src_dir_fd=self._dir, dst_dir_fd=self._dir)

    def _link(self) -> None:
        try:
            os.link(self._tmp, self._name, src_dir_fd=self._dir, dst_dir_fd=self._dir, follow_symlinks=False)
        except FileExistsError:
            raise _appeared(self.uri) from None
        except OSError as e:
            if e.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise StorageError(f"{self.uri}: this file system has no hard links, so the export cannot make "
                                   "sure it replaces nothing; pass --overwrite") from e
            raise
        with contextlib.suppress(OSError):  # published; a temporary left unlocked goes with the next export
            os.unlink(self._tmp, dir_fd=self._dir)

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        with contextlib.suppress(OSError):
            os.unlink(self._tmp, dir_fd=self._dir)
        with contextlib.suppress(OSError):
            self._f.close()
        os.close(self._dir)
