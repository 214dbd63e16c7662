"""The local store follows no symbolic link and opens only regular files (DESIGN.md,
invariant 7): a topic whose folders or objects were replaced by links, FIFOs or folders
is refused clearly, never read through, listed through or deleted through; and the
errors of the disk itself (full, read-only, permission) name the object."""

from __future__ import annotations

import errno
import os
import re
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shale.cli.errors import exit_code_of
from shale.compactor import CompactionConfig, Compactor, collect_garbage
from shale.ledger.errors import NotAnObjectError, ObjectNotFoundError, StorageError, StoragePermissionError
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.storage import Location, ObjectInfo, resolve
from shale.storage._local import LocalStore
from tests.needs import missing, without_root_privileges

ROOT = Path(__file__).resolve().parents[2]
LONG_AGO = time.time() - 400 * 86_400


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return Path(os.path.realpath(tmp_path))  # keys never pass through a link, even /tmp's


@pytest.fixture
def loc(base: Path) -> Location:
    (base / "t").mkdir()
    loc = resolve(str(base / "t"))
    assert isinstance(loc.store, LocalStore)
    return loc


def _files(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` (not following links) and its content."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# Unrelated files, some named as a topic names its own objects (as if the link led into
# another topic's folder), some in a sub-folder, one like an unfinished write.
_STRANGERS = ("precious.ledger", "notes.txt", "sub/deep.ledger", "00000000000000000999-0123456789ab.ledger",
              "000000000099-0123456789ab/part-00000.ledger", ".shale-tmp-0123456789ab-x.ledger",
              ".shale-tmp-0123456789ab-00000000000000000998-0123456789ab.ledger")


def _outside(base: Path, name: str) -> Path:
    """A folder outside the topic holding :data:`_STRANGERS`, aged far past any grace."""
    out = base / name
    for rel in _STRANGERS:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(f"keep {rel}".encode())
        os.utime(out / rel, (LONG_AGO, LONG_AGO))
    return out


def _promptly(fn: Callable[[], Any], seconds: float = 10) -> BaseException | None:
    """Run ``fn`` in a thread; the exception it raised, or None.  Fails if it hangs (a
    read of a FIFO waits for a writer for ever)."""
    got: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
            got.append(None)
        except BaseException as e:
            got.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        pytest.fail(f"{fn} hung for {seconds} s")
    return got[0]


@pytest.fixture
def fifo(loc: Location, base: Path) -> Iterator[Path]:
    """A FIFO where an object should be.  Afterwards any reader still blocked on it is
    released (a writer opens and closes it), so a failing test cannot hang the session."""
    folder = base / "t" / "ledgers"
    folder.mkdir()
    path = folder / "00000000000000000001-0123456789ab.ledger"
    os.mkfifo(path)
    yield path
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return  # no reader waiting
    os.close(fd)


# --------------------------------------------------------------------- linked folders

def test_gc_never_deletes_through_linked_folders(base: Path) -> None:
    """The adversarial review's case: a topic's ledgers/ and compacted/ moved elsewhere and
    linked back, unrelated old files put next to them: gc lists and deletes none of it."""
    uri = str(base / "t")
    with TopicWriter(uri, max_ledger_records=100) as w:
        for i in range(400):
            w.append(f"k{i % 50}", f"v{i}")
    assert Compactor(uri, CompactionConfig()).run().status == "compacted"
    targets = {}
    for folder in ("ledgers", "compacted"):
        target = base / "elsewhere" / folder
        target.parent.mkdir(exist_ok=True)
        os.rename(base / "t" / folder, target)
        os.symlink(target, base / "t" / folder)
        _outside(base / "elsewhere", folder)  # unrelated files next to the topic's own
        targets[folder] = _files(target)
    meta = TopicMetadata.open(uri)
    grace = CompactionConfig().orphan_grace_ms
    report = collect_garbage(meta, now_ms=int(time.time() * 1000) + 100 * grace, grace_ms=0, orphan_grace_ms=grace)
    assert report.orphans_deleted == [] and report.retired_deleted == []
    for folder, files in targets.items():
        assert _files(base / "elsewhere" / folder) == files


@pytest.mark.parametrize("folder", ["ledgers", "compacted"])
def test_a_linked_folder_is_neither_listed_nor_read_nor_deleted_through(loc: Location, base: Path,
                                                                         folder: str) -> None:
    s = loc.store
    s.put(loc.key("_meta/topic.json"), b"{}")
    out = _outside(base, "outside")
    before = _files(out)
    os.symlink(out, base / "t" / folder)
    assert list(s.list(loc.key(folder))) == []
    assert list(s.list(loc.key(folder) + "/")) == []
    assert list(s.unfinished_writes(loc.key(folder))) == []
    assert [o.key for o in s.list(loc.prefix)] == [loc.key("_meta/topic.json")]  # the link is not entered
    assert list(s.unfinished_writes(loc.prefix)) == []
    for rel in ("precious.ledger", "sub/deep.ledger"):
        key = loc.key(f"{folder}/{rel}")
        with pytest.raises(NotAnObjectError, match=f"/t/{folder}: is a symbolic link") as e:
            s.delete(key)
        assert exit_code_of(e.value) == 4
        for read in (s.get, s.stat, s.get_with_token, lambda k: s.get_range(k, 0, 4),
                     lambda k: s.get_view(k, 0, 1 << 21), lambda k: s.get_tail(k, 4)):
            with pytest.raises(NotAnObjectError, match="symbolic link"):
                read(key)
    with pytest.raises(NotAnObjectError):
        s.discard_write(ObjectInfo(loc.key(f"{folder}/.shale-tmp-0123456789ab-x.ledger"), 0, LONG_AGO))
    assert _files(out) == before


def test_writes_through_a_linked_folder_create_nothing(loc: Location, base: Path) -> None:
    s = loc.store
    out = base / "outside"
    out.mkdir()
    (out / "doc.json").write_bytes(b"v1")
    os.symlink(out, base / "t" / "compacted")
    token = LocalStore().get_with_token(str(out / "doc.json").lstrip("/"))[1]  # not through the link
    writes: list[Callable[[], Any]] = [
        lambda: s.put(loc.key("compacted/obj"), b"x"),
        lambda: s.put(loc.key("compacted/new/obj"), b"x", durable=False),
        lambda: s.open_writer(loc.key("compacted/run/part-00000.ledger")),
        lambda: s.put_if_absent(loc.key("compacted/doc2.json"), b"x"),
        lambda: s.put_if_match(loc.key("compacted/doc.json"), b"v2", token),
    ]
    for write in writes:
        with pytest.raises(NotAnObjectError, match="/t/compacted: is a symbolic link"):
            write()
    assert _files(out) == {"doc.json": b"v1"}
    assert os.listdir(out) == ["doc.json"]  # no folder, no lock file, no temporary file


def test_a_link_on_the_way_is_named(loc: Location, base: Path) -> None:
    """A link deeper in the path: the folder that is a link is the one named."""
    s = loc.store
    out = _outside(base, "outside")
    (base / "t" / "compacted").mkdir()
    os.symlink(out, base / "t" / "compacted" / "run")
    with pytest.raises(NotAnObjectError, match=r"/t/compacted/run: is a symbolic link; the local store follows no"):
        s.get(loc.key("compacted/run/sub/deep.ledger"))
    s.put(loc.key("compacted/other/part"), b"p")
    assert [o.key for o in s.list(loc.key("compacted"))] == [loc.key("compacted/other/part")]


# ------------------------------------------------------------- what is not an object

def test_a_linked_object_is_not_listed_nor_read(loc: Location, base: Path) -> None:
    s = loc.store
    (base / "t" / "ledgers").mkdir()
    secret = base / "secret.txt"
    secret.write_bytes(b"not the topic's")
    os.symlink("/dev/zero", base / "t" / "ledgers" / "zero.ledger")
    os.symlink(secret, base / "t" / "ledgers" / "secret.ledger")
    s.put(loc.key("ledgers/real.ledger"), b"r")
    assert [o.key for o in s.list(loc.key("ledgers"))] == [loc.key("ledgers/real.ledger")]
    for name in ("zero.ledger", "secret.ledger"):
        key = loc.key(f"ledgers/{name}")
        # all bounded reads: a whole read of /dev/zero is tried in a separate process
        for read in (s.stat, lambda k: s.get_range(k, 0, 4), lambda k: s.get_view(k, 0, 1 << 21)):
            with pytest.raises(NotAnObjectError, match=f"/t/ledgers/{name}: is a symbolic link"):
                read(key)
    with pytest.raises(NotAnObjectError):
        s.get(loc.key("ledgers/secret.ledger"))
    s.delete(loc.key("ledgers/secret.ledger"))  # removes the link itself, never its target
    assert secret.read_bytes() == b"not the topic's"


def test_a_link_to_dev_zero_is_refused_without_reading_it(base: Path) -> None:
    """A whole read (get, get_tail, get_with_token) of a link to /dev/zero would fill the
    memory: run it in a process whose memory is capped."""
    os.symlink("/dev/zero", base / "zero.ledger")
    key = str(base / "zero.ledger").lstrip("/")
    code = textwrap.dedent(f"""
        import resource
        from shale.storage._local import LocalStore
        from shale.ledger.errors import NotAnObjectError
        used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (used + (1 << 30), used + (1 << 30)))
        s = LocalStore()
        for read in (s.get, lambda k: s.get_tail(k, 10), s.get_with_token):
            try:
                read({key!r})
            except NotAnObjectError as e:
                print("refused:", e)
            else:
                print("READ")
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == [f"refused: /{key}: is a symbolic link; the local store follows no links"] * 3


@pytest.mark.timeout(60)
def test_a_fifo_is_refused_promptly_and_not_listed(loc: Location, fifo: Path) -> None:
    s = loc.store
    key = str(fifo).lstrip("/")
    reads: list[Callable[[], Any]] = [lambda: s.get(key), lambda: s.get_tail(key, 100), lambda: s.stat(key),
                                      lambda: s.get_range(key, 0, 10), lambda: s.get_view(key, 0, 1 << 21),
                                      lambda: s.get_with_token(key)]
    for read in reads:
        e = _promptly(read)
        assert isinstance(e, NotAnObjectError), e
        assert str(e) == f"{fifo}: is a FIFO, not a regular file" and exit_code_of(e) == 4
    assert list(s.list(loc.key("ledgers"))) == []
    assert list(s.unfinished_writes(loc.key("ledgers"))) == []


@pytest.mark.timeout(60)
def test_compare_and_swap_never_opens_a_fifo(loc: Location, fifo: Path) -> None:
    e = _promptly(lambda: loc.store.put_if_match(str(fifo).lstrip("/"), b"x", "token"))
    assert isinstance(e, NotAnObjectError), e
    assert fifo.is_fifo()


def test_a_device_is_refused_without_being_opened(loc: Location, base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening a device can have effects (a tape rewinds): it is refused from its lstat."""
    (base / "t" / "ledgers").mkdir()
    path = base / "t" / "ledgers" / "dev.ledger"
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # what /dev/zero is
    except PermissionError:
        missing("making a device node needs CAP_MKNOD (run the tests as root)")
    real_open = os.open

    def guard(name: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        # (never really opened, even by a regression: a read of it would fill the memory)
        assert not str(name).endswith("dev.ledger"), "the device was opened"
        return real_open(name, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", guard)
    key = str(path).lstrip("/")
    for read in (loc.store.stat, loc.store.get, lambda k: loc.store.get_tail(k, 10), loc.store.get_with_token):
        with pytest.raises(NotAnObjectError, match=f"^{path}: is a character device, not a regular file$"):
            read(key)
    assert list(loc.store.list(loc.key("ledgers"))) == []


def test_a_folder_or_a_file_where_they_do_not_belong(loc: Location, base: Path) -> None:
    s = loc.store
    (base / "t" / "ledgers" / "1.ledger").mkdir(parents=True)
    key = loc.key("ledgers/1.ledger")
    for op in (s.get, s.stat, s.delete, lambda k: s.get_tail(k, 1), lambda k: s.put(k, b"x")):
        with pytest.raises(NotAnObjectError, match=f"^{base}/t/ledgers/1.ledger: is a folder, not an object$"):
            op(key)
    assert (base / "t" / "ledgers" / "1.ledger").is_dir()
    s.put(loc.key("plain"), b"p")
    with pytest.raises(NotAnObjectError, match=f"^{base}/t/plain: is a regular file, not a folder$"):
        s.get(loc.key("plain/below"))
    with pytest.raises(NotAnObjectError):
        s.put(loc.key("plain/below"), b"x")
    assert list(s.list(loc.key("plain"))) == []  # a prefix that is an object holds nothing
    with pytest.raises(ObjectNotFoundError, match="no such object"):
        s.get(loc.key("missing/below"))


# ------------------------------------------------------------------- the disk's errors

#: Each operation named on the command line, on the key after it, in a store of the local
#: folder first named: what it raised, printed as ``<class> <exit code> <is a
#: PermissionError> <message>``, or ``done``.
_OPERATIONS = textwrap.dedent("""
    import sys
    from shale.cli.errors import exit_code_of
    from shale.storage import resolve
    store = resolve(sys.argv[1]).store
    ops = {"get": store.get, "put": lambda k: store.put(k, b"x"),
           "put_if_absent": lambda k: store.put_if_absent(k, b"x")}
    for op, key in zip(sys.argv[2::2], sys.argv[3::2]):
        try:
            ops[op](key)
            print("done")
        except Exception as e:
            print(type(e).__name__, exit_code_of(e), isinstance(e, PermissionError), e)
""")


def test_an_unreadable_object_and_an_unwritable_folder_are_permission_errors(loc: Location, base: Path) -> None:
    """Modes really refusing: the operations run in a process without root's power over
    files (tests/needs.py), so the disk itself says EACCES, whoever runs the tests."""
    loc.store.put(loc.key("doc"), b"secret")
    loc.store.put(loc.key("ledgers/old"), b"kept")
    os.chmod(base / "t" / "doc", 0)
    os.chmod(base / "t" / "ledgers", 0o555)
    args = ["get", loc.key("doc"), "put", loc.key("ledgers/new"), "put_if_absent", loc.key("ledgers/new"),
            "get", loc.key("ledgers/old")]
    r = subprocess.run(without_root_privileges([sys.executable, "-c", _OPERATIONS, str(base / "t"), *args]),
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == [f"StoragePermissionError 2 True {base}/t/doc: permission denied",
                                     f"StoragePermissionError 2 True {base}/t/ledgers/new: permission denied",
                                     f"StoragePermissionError 2 True {base}/t/ledgers/new: permission denied",
                                     "done"]
    assert os.listdir(base / "t" / "ledgers") == ["old"]  # no temporary file left behind


@pytest.mark.parametrize("refused", ["doc", "ledgers"])
def test_permission_denied_is_a_usage_error(loc: Location, monkeypatch: pytest.MonkeyPatch, refused: str) -> None:
    """What a chmod 000 object or folder gives (the refusal simulated, in this process:
    every operation, the temporary file's creation included); the message names the
    object either way."""
    key = loc.key("ledgers/doc")
    loc.store.put(key, b"secret")
    real_open = os.open

    def refuse(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if path == refused or (refused == "doc" and str(path).startswith(".shale-tmp-")):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    for op in (loc.store.get, lambda k: loc.store.put(k, b"x"), lambda k: loc.store.put_if_absent(k + "2", b"x")):
        with pytest.raises(StoragePermissionError, match=r"/t/ledgers/doc2?: permission denied$") as e:
            op(key)
        assert exit_code_of(e.value) == 2 and isinstance(e.value, PermissionError)


_DISK_ERRORS = [(errno.ENOSPC, "no space left on the device (disk full)"),
                (errno.EDQUOT, "no space left on the device (disk full)"),
                (errno.EROFS, "read-only file system"), (errno.EIO, os.strerror(errno.EIO))]


@pytest.mark.parametrize(("code", "says"), _DISK_ERRORS)
def test_a_full_disk_names_the_object_not_the_temporary_file(loc: Location, base: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              code: int, says: str) -> None:
    """ENOSPC and friends surface at the sync (delayed allocation) or at a write; either
    way the message names the object, and no temporary file is left."""
    def fail(*args: Any) -> None:
        raise OSError(code, os.strerror(code))

    key = loc.key("compacted/run/part-00000.ledger")
    want = "^" + re.escape(f"{base}/t/compacted/run/part-00000.ledger: {says}") + "$"
    with monkeypatch.context() as m:
        m.setattr(os, "fsync", fail)
        with pytest.raises(StorageError, match=want) as e:
            loc.store.put(key, b"x" * 100)
        assert exit_code_of(e.value) == 1 and ".shale-tmp-" not in str(e.value)
        with pytest.raises(StorageError, match=want), loc.store.open_writer(key) as w:
            w.write(b"y" * (3 << 20))
    with monkeypatch.context() as m:
        m.setattr(os, "write", fail)
        with pytest.raises(StorageError, match=want):
            loc.store.put_if_absent(key, b"z" * 100)
    assert os.listdir(base / "t" / "compacted" / "run") == []  # no temporary file left
    assert not loc.store.exists(key)


def test_creating_the_temporary_file_on_a_full_disk_names_the_object(loc: Location, base: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Out of inodes: creating the temporary file itself fails."""
    real_open = os.open

    def full(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path).startswith(".shale-tmp-"):
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", full)
    for op in (lambda k: loc.store.put(k, b"x"), loc.store.open_writer):
        with pytest.raises(StorageError, match=f"^{base}/t/doc: no space left on the device \\(disk full\\)$"):
            op(loc.key("doc"))
