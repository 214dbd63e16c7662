"""The store conformance suite (:mod:`shale.testing.storage`, shipped for plugin authors)
run on every built-in backend: memory, a local folder, S3 on a real moto server over
HTTP and on a real SeaweedFS server (whose conditional writes are atomic of their own:
its races run unserialised), and the generic fsspec adapter over fsspec's own memory and local filesystems.
The tests of URIs, names, resolving and plugins, which need no one store, close the file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shale.ledger.errors import InvalidURIError, UnsupportedOperationError
from shale.storage import Location, ObjectStore, require, resolve
from shale.testing.storage import StoreConformance
from tests.conftest import SEAWEEDFS_BUCKET

# ------------------------------------------------------------------------ backends

class TestMemoryStore(StoreConformance):
    flags = {"supports_conditional_writes": True, "process_safe": False,
             "shared_between_processes": False, "reads_are_local": True}
    leaves_unfinished_writes = False

    @pytest.fixture
    def store(self) -> ObjectStore:
        return resolve(f"memory://test-{uuid.uuid4().hex[:12]}").store


class TestLocalStore(StoreConformance):
    flags = {"supports_conditional_writes": True, "process_safe": True,
             "shared_between_processes": True, "reads_are_local": True}

    @pytest.fixture
    def store(self) -> ObjectStore:
        return resolve("/").store

    @pytest.fixture
    def prefix(self, tmp_path: Path) -> str:
        return resolve(str(tmp_path / "root")).prefix

    def test_only_durable_puts_sync(self, loc: Location, monkeypatch: pytest.MonkeyPatch) -> None:
        """A local folder skips the sync of a ``durable=False`` put, which is all it may skip."""
        import os

        synced: list[int] = []
        real_fsync = os.fsync

        def fsync(fd: int) -> None:
            synced.append(fd)
            real_fsync(fd)

        monkeypatch.setattr(os, "fsync", fsync)
        s, k = loc.store, loc.key("a/run/_run.json")
        s.put(k, b'{"beat": 1}', durable=False)
        s.put(k, b'{"beat": 2}', durable=False)
        assert synced == []
        s.put(k, b'{"beat": 3}')
        assert len(synced) == 1  # a durable put syncs


@pytest.mark.s3
class TestS3Store(StoreConformance):
    flags = {"supports_conditional_writes": True, "process_safe": True,
             "shared_between_processes": True, "reads_are_local": False}

    @pytest.fixture
    def store(self, s3_bucket: str) -> ObjectStore:
        return resolve(f"s3://{s3_bucket}/root").store


@pytest.mark.seaweedfs
class TestSeaweedFSStore(StoreConformance):
    flags = TestS3Store.flags
    lists_folder_by_folder = True

    @pytest.fixture
    def store(self, seaweedfs_env: object) -> ObjectStore:
        return resolve(f"s3://{SEAWEEDFS_BUCKET}").store

    @pytest.fixture
    def prefix(self) -> str:
        return f"{uuid.uuid4().hex[:12]}/root"


class TestFsspecMemoryStore(StoreConformance):
    """fsspec's own in-memory filesystem through the generic adapter (``memory://``
    URIs open Shale's own memory store, so the adapter is built directly)."""

    flags = {"supports_conditional_writes": False, "process_safe": False,
             "shared_between_processes": False, "reads_are_local": True}
    leaves_unfinished_writes = False

    @pytest.fixture
    def store(self) -> Iterator[ObjectStore]:
        import fsspec

        from shale.storage._fsspec import FsspecStore

        fs = fsspec.filesystem("memory")
        netloc = f"conformance-{uuid.uuid4().hex[:12]}"
        yield FsspecStore(fs, "fsspecmem", netloc)
        if fs.exists(netloc):
            fs.rm(netloc, recursive=True)  # every instance shares one dict

    def test_the_refusal_says_where_metadata_can_live(self, loc: Location) -> None:
        loc.store.put(loc.key("a"), b"x")
        with pytest.raises(UnsupportedOperationError, match=r"compare-and-swap.*--metadata"):
            loc.store.get_with_token(loc.key("a"))


class TestFsspecLocalStore(StoreConformance):
    """fsspec's local filesystem through the generic adapter: a filesystem with real
    folders, as SFTP or HDFS would be."""

    flags = {"supports_conditional_writes": False, "process_safe": True,
             "shared_between_processes": True, "reads_are_local": True}
    leaves_unfinished_writes = False

    @pytest.fixture
    def store(self, tmp_path: Path) -> ObjectStore:
        import fsspec

        from shale.storage._fsspec import FsspecStore

        return FsspecStore(fsspec.filesystem("file"), "fsspecfile", str(tmp_path))


# ----------------------------------------------------------- URIs, names, resolving

def test_resolved_stores_declare_their_capabilities(tmp_path: Path) -> None:
    """The Spark engine and the metadata store judge a store by its flags alone."""
    mem, local = resolve("memory://caps/t").store, resolve(str(tmp_path)).store
    assert not mem.shared_between_processes and not mem.process_safe
    assert local.shared_between_processes and local.process_safe and local.supports_conditional_writes
    with pytest.raises(UnsupportedOperationError, match=r"^memory://caps/t: the Spark engine needs objects"):
        require(resolve("memory://caps/t"), "shared_between_processes", "the Spark engine")


@pytest.mark.parametrize("uri", [
    "s3://bucket/a/../b", "memory://x/a/../../etc", "/tmp/a/../b", "s3://bucket/a\x00b", "s3:///nobucket",
    "", "s3://bucket/t?x=1", "nosuchscheme://x/y", "s3:/bucket/x", "s3:bucket", "s3a:/bucket/x",
])
def test_bad_uris_are_refused(uri: str) -> None:
    with pytest.raises(InvalidURIError):
        resolve(uri)


def test_unsafe_object_names_are_refused() -> None:
    loc = resolve("memory://names/root")
    for bad in ("..", "a/../b", "x\ny", ""):
        with pytest.raises(InvalidURIError):
            loc.key(bad)


PLUGIN = '''
from shale.storage._memory import MemoryStore

def open_store(netloc):
    store = MemoryStore("plugin-" + netloc)
    store.opened_by_plugin = True
    return store
'''


def _with_plugin(tmp_path: Path, code: str, value: str = "shale_test_plugin:open_store") -> dict[str, str]:
    """A folder holding a plugin module and a distribution that declares it under the
    ``shale.storage`` entry-point group, for scheme ``plugged``."""
    (tmp_path / "shale_test_plugin.py").write_text(code)
    info = tmp_path / "shale_test_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: shale-test-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[shale.storage]\nplugged = {value}\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(tmp_path), os.environ.get("PYTHONPATH"))))}


def test_a_backend_registers_through_the_entry_point_group(tmp_path: Path) -> None:
    probe = ("from shale.storage import resolve\n"
             "loc = resolve('plugged://host/topics/t')\n"
             "loc.store.put(loc.key('a'), b'x')\n"
             "print(type(loc.store).__name__, loc.store.opened_by_plugin, loc.uri, loc.store.get(loc.key('a')))\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                          env=_with_plugin(tmp_path, PLUGIN), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["MemoryStore", "True", "plugged://host/topics/t", "b'x'"]


def test_a_broken_plugin_is_named_in_one_line(tmp_path: Path) -> None:
    env = _with_plugin(tmp_path, "raise ImportError('needs libfoo')\n")
    shale = str(Path(sys.executable).parent / "shale")
    proc = subprocess.run([shale, "status", "plugged://host/topics/t"], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "plugged://" in line and "shale_test_plugin:open_store" in line and "needs libfoo" in line
