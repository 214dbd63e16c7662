"""One conformance suite for every object-store backend (memory, local folder, S3 on a
real moto server, and the generic fsspec adapter for data operations)."""

from __future__ import annotations

import threading

import pytest

from ledger.errors import AlreadyExistsError, ConflictError, InvalidURIError, ObjectNotFoundError
from ledger.storage import Location, resolve


@pytest.fixture
def loc(root_uri: str) -> Location:
    return resolve(root_uri)


def test_put_get_range_tail_stat(loc: Location) -> None:
    s, k = loc.store, loc.key("a/b/obj")
    data = bytes(range(256)) * 40
    s.put(k, data)
    assert s.get(k) == data
    assert s.get_range(k, 10, 20) == data[10:20]
    assert s.get_range(k, len(data) - 5, len(data) + 100) == data[-5:]
    tail, size = s.get_tail(k, 100)
    assert (tail, size) == (data[-100:], len(data))
    tail, size = s.get_tail(k, 1 << 20)
    assert (tail, size) == (data, len(data))
    assert s.stat(k).size == len(data)
    assert s.get_ranges(k, [(0, 3), (5, 9), (100, 101)]) == [data[0:3], data[5:9], data[100:101]]
    s.put(k, b"replaced")
    assert s.get(k) == b"replaced"


def test_put_not_durable_is_still_whole_and_replaces(loc: Location, monkeypatch: pytest.MonkeyPatch) -> None:
    """``durable=False`` (the run's heartbeat) writes and replaces like any put; a local
    folder then skips the sync, which is all it may skip."""
    import os

    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    s, k = loc.store, loc.key("a/run/_run.json")
    s.put(k, b'{"beat": 1}', durable=False)
    assert s.get(k) == b'{"beat": 1}'
    s.put(k, b'{"beat": 2}', durable=False)
    assert s.get(k) == b'{"beat": 2}'
    assert [o.key for o in s.list(loc.key("a/run") + "/")] == [k]  # no temporary file left
    if loc.store.scheme == "file":
        assert synced == []
        s.put(k, b'{"beat": 3}')
        assert len(synced) == 1  # a durable put syncs


def test_missing_objects(loc: Location) -> None:
    s, k = loc.store, loc.key("nope")
    with pytest.raises(ObjectNotFoundError, match="nope"):
        s.get(k)
    with pytest.raises(FileNotFoundError):
        s.stat(k)
    with pytest.raises(ObjectNotFoundError):
        s.get_range(k, 0, 1)
    assert not s.exists(k)
    s.delete(k)  # deleting what is not there is fine


def test_list_and_delete(loc: Location) -> None:
    s = loc.store
    keys = [loc.key(p) for p in ("d/x", "d/y/z", "d/y/w", "e/q")]
    for k in keys:
        s.put(k, k.encode())
    listed = [o.key for o in s.list(loc.key("d"))]
    assert listed == sorted(keys[:3])
    s.delete(keys[1])
    assert [o.key for o in s.list(loc.key("d"))] == sorted([keys[0], keys[2]])
    assert list(s.list(loc.key("none"))) == []


def test_streaming_writer_visible_only_after_close(loc: Location) -> None:
    s, k = loc.store, loc.key("big")
    chunk = b"x" * (1 << 20)
    w = s.open_writer(k)
    for _ in range(3):
        w.write(chunk)
    assert not s.exists(k)
    w.close()
    assert s.stat(k).size == 3 << 20
    w2 = s.open_writer(loc.key("aborted"))
    w2.write(b"partial")
    w2.abort()
    assert not s.exists(loc.key("aborted"))


def test_unfinished_writes_are_listed_and_discarded(loc: Location, backend: str) -> None:
    """A writer killed mid-write (never closed nor aborted) leaves something only
    ``unfinished_writes`` sees; ``discard_write`` removes it."""
    s = loc.store
    w = s.open_writer(loc.key("run/part-1"))
    w.write(b"x" * (17 << 20))  # past one multipart part on S3
    done = s.open_writer(loc.key("run/part-0"))
    done.write(b"y")
    done.close()
    leftovers = list(s.unfinished_writes(loc.key("run")))
    if backend == "memory":
        assert leftovers == []  # nothing outlives a process there
        w.abort()
        return
    assert len(leftovers) == 1 and "part-1" in leftovers[0].key
    assert [o.key for o in s.list(loc.key("run"))] == [loc.key("run/part-0")]  # never in a listing
    s.discard_write(leftovers[0])
    assert list(s.unfinished_writes(loc.key("run"))) == []
    assert s.get(loc.key("run/part-0")) == b"y"


def test_put_if_absent(loc: Location) -> None:
    s, k = loc.store, loc.key("doc")
    token = s.put_if_absent(k, b"one")
    assert s.get(k) == b"one"
    with pytest.raises(AlreadyExistsError):
        s.put_if_absent(k, b"two")
    assert s.get(k) == b"one"
    data, tok = s.get_with_token(k)
    assert data == b"one" and tok == token


def test_put_if_match(loc: Location) -> None:
    s, k = loc.store, loc.key("doc")
    t1 = s.put_if_absent(k, b"v1")
    t2 = s.put_if_match(k, b"v2", t1)
    assert s.get(k) == b"v2"
    with pytest.raises(ConflictError):
        s.put_if_match(k, b"v3", t1)  # stale token
    assert s.get(k) == b"v2"
    s.put_if_match(k, b"v3", t2)
    with pytest.raises(ConflictError):
        s.put_if_match(loc.key("missing"), b"x", t2)


def test_create_race_has_one_winner(loc: Location) -> None:
    s, k = loc.store, loc.key("race")
    wins: list[int] = []
    barrier = threading.Barrier(8)

    def attempt(i: int) -> None:
        barrier.wait()
        try:
            s.put_if_absent(k, f"writer {i}".encode())
            wins.append(i)
        except AlreadyExistsError:
            pass

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert s.get(k) == f"writer {wins[0]}".encode()


def test_fsspec_adapter_data_operations(tmp_path: object) -> None:
    import fsspec

    from ledger._fsspec import FsspecStore
    from ledger.errors import UnsupportedOperationError

    s = FsspecStore(fsspec.filesystem("memory"), "memory", "conformance")
    s.put("t/a", b"hello world")
    assert s.get("t/a") == b"hello world"
    assert s.get_range("t/a", 6, 11) == b"world"
    assert s.stat("t/a").size == 11
    assert [o.key for o in s.list("t")] == ["t/a"]
    with pytest.raises(UnsupportedOperationError, match="compare-and-swap"):
        s.get_with_token("t/a")
    s.delete("t/a")
    with pytest.raises(ObjectNotFoundError):
        s.get("t/a")


@pytest.mark.parametrize("uri", [
    "s3://bucket/a/../b", "memory://x/a/../../etc", "/tmp/a/../b", "s3://bucket/a\x00b", "s3:///nobucket",
    "", "s3://bucket/t?x=1", "nosuchscheme://x/y",
])
def test_bad_uris_are_refused(uri: str) -> None:
    with pytest.raises(InvalidURIError):
        resolve(uri)


def test_unsafe_object_names_are_refused() -> None:
    loc = resolve("memory://names/root")
    for bad in ("..", "a/../b", "x\ny", ""):
        with pytest.raises(InvalidURIError):
            loc.key(bad)
