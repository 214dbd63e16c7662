"""The conformance suite every object-store backend must pass: Shale's own, and a plugin's.

:class:`StoreConformance` holds every behaviour of the :class:`~shale.storage.ObjectStore`
interface.  A backend's test module subclasses it and provides the ``store`` fixture
(and ``prefix``, a fresh empty folder, when the store's root is shared between tests)
and the capability flags the store must declare::

    import pytest
    from shale.testing.storage import StoreConformance

    class TestMyStore(StoreConformance):
        flags = {"supports_conditional_writes": True, "process_safe": True,
                 "shared_between_processes": True, "reads_are_local": False}

        @pytest.fixture
        def store(self):
            return MyStore("test-bucket")

A test of something a store may lack skips by the store's declared capability flag,
never by its class, so a new backend is checked by writing one subclass.  Shale's own
backends run it in ``tests/storage/test_storage_conformance.py``.  Needs pytest.
"""

from __future__ import annotations

import multiprocessing
import pickle
import random
import threading
import time
from typing import ClassVar

import pytest

from shale.ledger.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidInputError,
    ObjectNotFoundError,
    UnsupportedOperationError,
)
from shale.storage import CAPABILITIES, Location, ObjectStore, require

__all__ = ["StoreConformance", "needs"]

MiB = 1 << 20


def needs(store: ObjectStore, capability: str) -> None:
    """Skip the running test unless ``store`` declares ``capability``."""
    if not getattr(store, capability):
        pytest.skip(f"{type(store).__name__} declares {capability} = False")


class StoreConformance:
    """The behaviour every backend shares.  Subclasses provide ``store`` and ``prefix``."""

    #: The capability flags the store must declare (every name in CAPABILITIES).
    flags: ClassVar[dict[str, bool]]
    #: Whether a writer dropped mid-write leaves something ``unfinished_writes`` lists
    #: (stores that buffer a write in this process until it is closed leave nothing).
    leaves_unfinished_writes: ClassVar[bool] = True
    #: Whether ``list`` walks folder by folder, a folder's objects where its name falls
    #: (``d/a/b`` before ``d/a.b``), as an S3-compatible store keeping real folders does
    #: (SeaweedFS), rather than in byte order of whole keys.  Shale relies on neither.
    lists_folder_by_folder: ClassVar[bool] = False

    @pytest.fixture
    def store(self) -> ObjectStore:
        raise NotImplementedError("a backend's subclass provides the store")

    @pytest.fixture
    def prefix(self) -> str:
        return "root"

    @pytest.fixture
    def loc(self, store: ObjectStore, prefix: str) -> Location:
        return Location(store, prefix, store.url(prefix))

    def in_listing_order(self, keys: list[str]) -> list[str]:
        """``keys`` in the order the store lists them."""
        return sorted(keys, key=lambda k: k.split("/")) if self.lists_folder_by_folder else sorted(keys)

    # ------------------------------------------------------------------ capabilities

    def test_declared_capabilities(self, store: ObjectStore) -> None:
        declared = {name: getattr(store, name) for name in CAPABILITIES}
        assert declared == self.flags
        assert all(type(v) is bool for v in declared.values())
        # a forked child's writes are seen by its parent only if the objects are shared
        assert store.shared_between_processes or not store.process_safe

    def test_require_refuses_exactly_what_is_not_declared(self, loc: Location) -> None:
        for name in CAPABILITIES:
            if getattr(loc.store, name):
                require(loc, name, "this test")
                require(loc.store, name, "this test")
            else:
                with pytest.raises(UnsupportedOperationError, match=f"^{loc.uri}: this test needs "):
                    require(loc, name, "this test", hint="try elsewhere")
        with pytest.raises(InvalidInputError, match="unknown store capability"):
            require(loc, "flies", "this test")

    def test_conditional_writes_refused_when_not_declared(self, loc: Location) -> None:
        s, k = loc.store, loc.key("doc")
        if s.supports_conditional_writes:
            pytest.skip("the store declares conditional writes")
        with pytest.raises(UnsupportedOperationError):
            s.put_if_absent(k, b"one")
        assert not s.exists(k)
        s.put(k, b"one")
        with pytest.raises(UnsupportedOperationError):
            s.get_with_token(k)
        with pytest.raises(UnsupportedOperationError):
            s.put_if_absent(k, b"two")
        with pytest.raises(UnsupportedOperationError):
            s.put_if_match(k, b"two", "")
        assert s.get(k) == b"one"

    def test_a_pickled_store_reaches_the_same_objects(self, loc: Location) -> None:
        """A store travels to another process (a Spark task, a worker) as its pickle: the
        store it unpickles to in this process reaches the same objects."""
        loc.store.put(loc.key("pickled"), b"before")
        copy = pickle.loads(pickle.dumps(loc))
        assert copy.uri == loc.uri and copy.store.get(copy.key("pickled")) == b"before"
        copy.store.put(copy.key("pickled"), b"after")
        assert loc.store.get(loc.key("pickled")) == b"after"

    def test_a_forked_child_writes_what_the_parent_reads(self, loc: Location) -> None:
        needs(loc.store, "process_safe")
        s, k = loc.store, loc.key("from-child")
        s.put(loc.key("before-fork"), b"parent")

        def child() -> None:
            assert s.get(loc.key("before-fork")) == b"parent"
            s.put(k, b"child")

        p = multiprocessing.get_context("fork").Process(target=child)
        p.start()
        p.join(60)
        assert p.exitcode == 0
        assert s.get(k) == b"child"

    # ------------------------------------------------------------------------ reads

    def test_put_get_range_tail_stat(self, loc: Location) -> None:
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
        assert s.get_ranges(k, []) == []
        s.put(k, b"replaced")
        assert s.get(k) == b"replaced"
        assert s.stat(k).size == 8

    def test_range_edges(self, loc: Location) -> None:
        s, k, empty = loc.store, loc.key("edges"), loc.key("empty")
        data = b"0123456789"
        s.put(k, data)
        for start, end in [(0, 0), (3, 3), (10, 10), (10, 20), (12, 30), (5, 2), (0, 10), (0, 11), (9, 10)]:
            assert s.get_range(k, start, end) == data[start:end], (start, end)
            assert bytes(s.get_view(k, start, end)) == data[start:end], (start, end)
        assert s.get_tail(k, 1) == (b"9", 10)
        assert s.get_tail(k, 10) == (data, 10)
        s.put(empty, b"")
        assert s.get(empty) == b""
        assert s.stat(empty).size == 0
        assert s.get_range(empty, 0, 5) == b""
        assert s.get_tail(empty, 8) == (b"", 0)
        assert [(o.key, o.size) for o in s.list(loc.prefix)] == [(k, 10), (empty, 0)]

    def test_get_view_is_a_stable_copy_of_the_range(self, loc: Location) -> None:
        """A view (a mapped file on a local folder) equals ``get_range`` and does not
        change when the object is replaced or deleted afterwards."""
        s, k = loc.store, loc.key("view")
        data = random.Random(7).randbytes(2 * MiB + 123)
        s.put(k, data)
        small = s.get_view(k, 100, 200)
        big = s.get_view(k, 5, 2 * MiB + 100)
        past_end = s.get_view(k, MiB, 4 * MiB)
        assert bytes(small) == data[100:200]
        assert bytes(big) == data[5:2 * MiB + 100]
        assert bytes(past_end) == data[MiB:]
        s.put(k, b"other")
        s.delete(k)
        assert bytes(big) == data[5:2 * MiB + 100]
        assert bytes(past_end) == data[MiB:]

    def test_stat_and_listing_agree(self, loc: Location) -> None:
        s = loc.store
        before = s.now_ms(loc.prefix)
        for name, size in [("s/one", 1), ("s/two", 300), ("s/three", 0)]:
            s.put(loc.key(name), b"x" * size)
        listed = {o.key: o for o in s.list(loc.key("s"))}
        assert sorted(listed) == sorted(loc.key(n) for n in ("s/one", "s/two", "s/three"))
        for key, o in listed.items():
            st = s.stat(key)
            assert (st.key, st.size) == (key, o.size)
            # stores stamp to the second at worst (S3's Date and LastModified)
            assert before - 2_000 <= st.mtime * 1000 <= s.now_ms(loc.prefix) + 2_000
            if st.token and s.supports_conditional_writes:
                assert st.token == s.get_with_token(key)[1]

    def test_missing_objects(self, loc: Location) -> None:
        s, k = loc.store, loc.key("nope")
        with pytest.raises(ObjectNotFoundError, match="nope"):
            s.get(k)
        with pytest.raises(FileNotFoundError):
            s.stat(k)
        with pytest.raises(ObjectNotFoundError):
            s.get_range(k, 0, 1)
        with pytest.raises(ObjectNotFoundError):
            s.get_view(k, 0, 1)
        with pytest.raises(ObjectNotFoundError):
            s.get_tail(k, 10)
        with pytest.raises(ObjectNotFoundError):
            s.get(loc.key("no/such/folder/obj"))
        assert not s.exists(k)
        s.delete(k)  # deleting what is not there is fine
        s.delete(loc.key("no/such/folder/obj"))
        if s.supports_conditional_writes:
            with pytest.raises(ObjectNotFoundError):
                s.get_with_token(k)

    # ----------------------------------------------------------------------- writes

    def test_put_not_durable_is_still_whole_and_replaces(self, loc: Location) -> None:
        """``durable=False`` (the run's heartbeat) writes and replaces like any put."""
        s, k = loc.store, loc.key("a/run/_run.json")
        s.put(k, b'{"beat": 1}', durable=False)
        assert s.get(k) == b'{"beat": 1}'
        s.put(k, b'{"beat": 2}', durable=False)
        assert s.get(k) == b'{"beat": 2}'
        assert [o.key for o in s.list(loc.key("a/run") + "/")] == [k]  # no temporary file left

    def test_keys_with_unusual_safe_characters(self, loc: Location) -> None:
        s = loc.store
        names = ["k=v/a b+c.json", "ünï/cödé-☃", "x/%41%2F", "y/a~b,c;d@e!f(g)"]
        for n in names:
            s.put(loc.key(n), n.encode())
        for n in names:
            assert s.get(loc.key(n)) == n.encode()
        assert [o.key for o in s.list(loc.prefix)] == self.in_listing_order([loc.key(n) for n in names])

    def test_streaming_writer_visible_only_after_close(self, loc: Location) -> None:
        s, k = loc.store, loc.key("big")
        chunk = b"x" * MiB
        w = s.open_writer(k)
        for _ in range(3):
            assert w.write(chunk) == MiB
        assert not s.exists(k)
        w.close()
        assert s.stat(k).size == 3 * MiB
        w2 = s.open_writer(loc.key("aborted"))
        w2.write(b"partial")
        w2.abort()
        w2.abort()  # safe to call more than once
        assert not s.exists(loc.key("aborted"))

    def test_streaming_writer_details(self, loc: Location) -> None:
        """Any bytes-like data; a replaced object stays readable until the new one is
        closed; close twice, or abort after close, changes nothing; an exception inside
        ``with`` aborts."""
        s, k = loc.store, loc.key("w/obj")
        s.put(k, b"old")
        with s.open_writer(k) as w:
            assert w.write(bytearray(b"ab")) == 2
            assert w.write(memoryview(b"--cd--")[2:4]) == 2
            assert w.write(b"") == 0
            assert s.get(k) == b"old"
        assert s.get(k) == b"abcd"
        w.close()
        w.abort()
        assert s.get(k) == b"abcd"

        class Boom(Exception):
            pass

        with pytest.raises(Boom), s.open_writer(loc.key("w/failed")) as w:
            w.write(b"half")
            raise Boom
        assert not s.exists(loc.key("w/failed"))
        with s.open_writer(loc.key("w/empty")):
            pass
        assert s.get(loc.key("w/empty")) == b""
        assert [o.key for o in s.list(loc.key("w"))] == [loc.key("w/empty"), k]

    def test_streamed_write_of_several_parts(self, loc: Location) -> None:
        """Past one multipart part on S3 (16 MiB), in pieces that straddle the boundary."""
        s, k = loc.store, loc.key("parts/big")
        rnd = random.Random(3)
        piece = rnd.randbytes(3 * MiB + 17)
        with s.open_writer(k) as w:
            for _ in range(6):
                w.write(piece)
        data = piece * 6
        assert s.stat(k).size == len(data)
        edge = 16 * MiB
        assert s.get_range(k, edge - 5, edge + 5) == data[edge - 5:edge + 5]
        assert s.get_tail(k, 100) == (data[-100:], len(data))
        assert s.get(k) == data

    def test_streamed_create_only_write_replaces_nothing(self, loc: Location) -> None:
        """``open_writer_if_absent`` creates the object, and refuses (AlreadyExistsError,
        what stands there kept, nothing left unfinished) when the key is taken before it
        starts or while it is written, small or past one multipart part."""
        s, k = loc.store, loc.key("once/obj")
        with s.open_writer_if_absent(k) as w:
            w.write(b"first")
        assert s.get(k) == b"first"
        with pytest.raises(AlreadyExistsError), s.open_writer_if_absent(k) as w:
            w.write(b"second")
        assert s.get(k) == b"first"
        for size in (5, 17 * MiB):
            taken = loc.key(f"race/{size}")
            w = s.open_writer_if_absent(taken)
            w.write(b"z" * size)
            s.put(taken, b"meanwhile")
            with pytest.raises(AlreadyExistsError):
                w.close()
            assert s.get(taken) == b"meanwhile"
        assert [o.key for o in s.list(loc.key("race"))] == [loc.key(f"race/{n}") for n in sorted(("5", "17825792"))]
        assert list(s.unfinished_writes(loc.key("race"))) == []

    def test_unfinished_writes_are_listed_and_discarded(self, loc: Location) -> None:
        """A writer killed mid-write (never closed nor aborted) leaves something only
        ``unfinished_writes`` sees; ``discard_write`` removes it."""
        s = loc.store
        w = s.open_writer(loc.key("run/part-1"))
        w.write(b"x" * (17 * MiB))  # past one multipart part on S3
        done = s.open_writer(loc.key("run/part-0"))
        done.write(b"y")
        done.close()
        leftovers = list(s.unfinished_writes(loc.key("run")))
        if not self.leaves_unfinished_writes:
            assert leftovers == []  # the write lives in this process until it is closed
            w.abort()
            assert [o.key for o in s.list(loc.key("run"))] == [loc.key("run/part-0")]
            return
        assert len(leftovers) == 1 and "part-1" in leftovers[0].key
        assert [o.key for o in s.list(loc.key("run"))] == [loc.key("run/part-0")]  # never in a listing
        assert list(s.unfinished_writes(loc.key("elsewhere"))) == []
        s.discard_write(leftovers[0])
        assert list(s.unfinished_writes(loc.key("run"))) == []
        assert s.get(loc.key("run/part-0")) == b"y"
        w.abort()  # the writer's own clean-up after a discard is harmless

    # ------------------------------------------------------------ listing, deleting

    def test_list_and_delete(self, loc: Location) -> None:
        s = loc.store
        keys = [loc.key(p) for p in ("d/x", "d/y/z", "d/y/w", "e/q")]
        for k in keys:
            s.put(k, k.encode())
        listed = [o.key for o in s.list(loc.key("d"))]
        assert listed == sorted(keys[:3])
        s.delete(keys[1])
        assert [o.key for o in s.list(loc.key("d"))] == sorted([keys[0], keys[2]])
        assert list(s.list(loc.key("none"))) == []
        s.delete(keys[1])  # twice is fine
        assert s.get(keys[2]) == keys[2].encode()

    def test_list_is_recursive_in_key_order_and_bounded_by_the_folder(self, loc: Location) -> None:
        s = loc.store
        # '.' < '/' < '0': byte order of whole keys, not a folder-by-folder walk
        inside = ["d/a.b", "d/a/b", "d/a/c/d", "d/a0", "d/b", "d/z/z/z/z"]
        outside = ["dx/q", "d.txt", "c/d/a", "e"]
        names = inside + outside
        random.Random(1).shuffle(names)
        for n in names:
            s.put(loc.key(n), n.encode())
        expected = self.in_listing_order([loc.key(n) for n in inside])
        assert [o.key for o in s.list(loc.key("d"))] == expected
        assert [o.key for o in s.list(loc.key("d") + "/")] == expected
        assert [o.key for o in s.list(loc.key("d/a"))] == [loc.key("d/a/b"), loc.key("d/a/c/d")]
        assert [o.key for o in s.list(loc.prefix)] == self.in_listing_order([loc.key(n) for n in names])
        # a key names an object, not a folder: listing it lists nothing
        assert list(s.list(loc.key("d/b"))) == []
        assert list(s.list(loc.key("d/a/c/d"))) == []
        assert {o.key: o.size for o in s.list(loc.key("d"))} == {loc.key(n): len(n) for n in inside}

    def test_now_ms_is_the_store_clock_and_leaves_nothing(self, loc: Location) -> None:
        s = loc.store
        s.put(loc.key("c/x"), b"x")
        now = s.now_ms(loc.key("c"))
        assert abs(now - time.time() * 1000) < 60_000  # the store runs on this machine
        assert abs(now - s.stat(loc.key("c/x")).mtime * 1000) < 5_000
        assert s.now_ms(loc.key("c/new/folder")) >= now - 1_000
        assert [o.key for o in s.list(loc.key("c"))] == [loc.key("c/x")]
        assert list(s.unfinished_writes(loc.key("c"))) == []

    # ---------------------------------------------------------- conditional writes

    def test_put_if_absent(self, loc: Location) -> None:
        needs(loc.store, "supports_conditional_writes")
        s, k = loc.store, loc.key("doc")
        token = s.put_if_absent(k, b"one")
        assert s.get(k) == b"one"
        with pytest.raises(AlreadyExistsError):
            s.put_if_absent(k, b"two")
        with pytest.raises(ConflictError):  # an AlreadyExistsError is a conflict
            s.put_if_absent(k, b"two")
        assert s.get(k) == b"one"
        data, tok = s.get_with_token(k)
        assert data == b"one" and tok == token
        s.delete(k)
        t2 = s.put_if_absent(k, b"three")  # free again once deleted
        assert s.get_with_token(k) == (b"three", t2)
        nested = loc.key("new/folder/doc")
        t3 = s.put_if_absent(nested, b"")
        assert s.get_with_token(nested) == (b"", t3)

    def test_put_if_match(self, loc: Location) -> None:
        needs(loc.store, "supports_conditional_writes")
        s, k = loc.store, loc.key("doc")
        t1 = s.put_if_absent(k, b"v1")
        t2 = s.put_if_match(k, b"v2", t1)
        assert s.get_with_token(k) == (b"v2", t2)
        with pytest.raises(ConflictError):
            s.put_if_match(k, b"v3", t1)  # stale token
        assert s.get(k) == b"v2"
        s.put_if_match(k, b"v3", t2)
        with pytest.raises(ConflictError):
            s.put_if_match(loc.key("missing"), b"x", t2)
        assert not s.exists(loc.key("missing"))

    def test_plain_put_and_delete_invalidate_a_token(self, loc: Location) -> None:
        needs(loc.store, "supports_conditional_writes")
        s, k = loc.store, loc.key("doc")
        t1 = s.put_if_absent(k, b"v1")
        s.put(k, b"v2 written without a condition")
        with pytest.raises(ConflictError):
            s.put_if_match(k, b"v3", t1)
        _, t2 = s.get_with_token(k)
        s.delete(k)
        with pytest.raises(ConflictError):
            s.put_if_match(k, b"v3", t2)  # a vanished object is a conflict, not a creation
        assert not s.exists(k)

    def test_an_empty_token_matches_nothing(self, loc: Location) -> None:
        """``ObjectInfo.token`` is "" where a listing does not know it: passed on, it
        must never turn a compare-and-swap into a plain write."""
        needs(loc.store, "supports_conditional_writes")
        s, k = loc.store, loc.key("doc")
        s.put_if_absent(k, b"precious")
        with pytest.raises(ConflictError):
            s.put_if_match(k, b"clobbered", "")
        assert s.get(k) == b"precious"
        with pytest.raises(ConflictError):
            s.put_if_match(loc.key("absent"), b"created", "")
        assert not s.exists(loc.key("absent"))

    def test_create_race_has_one_winner(self, loc: Location) -> None:
        needs(loc.store, "supports_conditional_writes")
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

    def test_swap_race_has_one_winner(self, loc: Location) -> None:
        needs(loc.store, "supports_conditional_writes")
        s, k = loc.store, loc.key("swap")
        token = s.put_if_absent(k, b"start")
        wins: list[tuple[int, str]] = []
        barrier = threading.Barrier(8)

        def attempt(i: int) -> None:
            barrier.wait()
            try:
                wins.append((i, s.put_if_match(k, f"writer {i}".encode(), token)))
            except ConflictError:
                pass

        threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(wins) == 1
        (i, new_token), = wins
        assert s.get_with_token(k) == (f"writer {i}".encode(), new_token)
