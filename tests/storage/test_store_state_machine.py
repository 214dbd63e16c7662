"""A Hypothesis state machine that checks an object store against a plain dict.

Plain and conditional writes, deletes, streamed writes (closed or aborted), whole and
ranged reads, stats and listings of folders at several levels are interleaved at random
on one fresh folder, and every answer is compared with a model: a dict from key to
bytes, plus what the model knows of tokens.  A token taken from a read or returned by a
conditional write is *current* until the object is written or deleted by any means,
then *stale*: ``put_if_match`` with the current token must succeed, with a stale one (or
on a missing object) must raise :class:`ConflictError` and change nothing.

Every write stores distinct bytes (a serial number ends them), as the metadata store's
documents do (their version only grows): a local folder's token is a hash of the
content, which would otherwise let a stale token match again (ABA).

Keys come from a small set with two folder levels, ``.`` sorting just before ``/``, so
listings are checked for key order and for where a folder ends.  No key is also a
folder: on a local disk one name cannot be both.

It runs on memory, a local folder and S3 on a real moto server (few examples: HTTP).
Run long by hand with ``SHALE_LONG_TESTS=1``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from typing import ClassVar

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from shale.ledger.errors import AlreadyExistsError, ConflictError, ObjectNotFoundError
from shale.storage import ObjectStore, resolve

LONG = os.environ.get("SHALE_LONG_TESTS") == "1"

KEYS = ("0", "1", "p.x", "p/0", "p/1", "p/p.x", "p/q/0", "p/q/1", "q/0")
# folders, a key (an object lists nothing below it) and a folder never written
PREFIXES = ("", "p", "p/", "p/q", "q", "p/p.x", "r")

keys = st.sampled_from(KEYS)
payloads = st.one_of(st.binary(max_size=12), st.binary(min_size=40, max_size=90))


class StoreMachine(RuleBasedStateMachine):
    """One store's folder against ``model``; see the module's docstring."""

    def __init__(self, store: ObjectStore, prefix: str, cleanup: Callable[[], None] = lambda: None) -> None:
        super().__init__()
        self.store, self.prefix, self.cleanup = store, prefix, cleanup
        self.model: dict[str, bytes] = {}
        self.current: dict[str, str] = {}  # the token of the object as it is now, when known
        self.stale: list[tuple[str, str]] = []  # (key, token) of versions since replaced or deleted
        self.serial = 0

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}"

    def data(self, payload: bytes) -> bytes:
        self.serial += 1
        return payload + b"#%d" % self.serial

    def changed(self, rel: str) -> None:
        """The object under ``rel`` was replaced or deleted: its token is stale now."""
        token = self.current.pop(rel, None)
        if token is not None:
            self.stale.append((rel, token))

    def pick(self, choice: st.DataObject) -> str:
        """A key, most often one that holds an object (reads of missing keys are cheap
        to find and say little)."""
        existing = sorted(self.model)
        return choice.draw(st.one_of(st.sampled_from(existing), keys) if existing else keys, label="key")

    # ---------------------------------------------------------------------- writes

    @rule(choice=st.data(), payload=payloads, durable=st.booleans())
    def put(self, choice: st.DataObject, payload: bytes, durable: bool) -> None:
        rel, data = self.pick(choice), self.data(payload)
        self.store.put(self.key(rel), data, durable=durable)
        self.changed(rel)
        self.model[rel] = data

    @rule(choice=st.data(), payload=payloads, pieces=st.integers(1, 3), abort=st.booleans())
    def stream(self, choice: st.DataObject, payload: bytes, pieces: int, abort: bool) -> None:
        rel, data = self.pick(choice), self.data(payload)
        w = self.store.open_writer(self.key(rel))
        step = max(1, -(-len(data) // pieces))
        for i in range(0, len(data), step):
            w.write(data[i:i + step])
        if abort:
            w.abort()
            return
        w.close()
        self.changed(rel)
        self.model[rel] = data

    @rule(rel=keys, payload=payloads)
    def put_if_absent(self, rel: str, payload: bytes) -> None:
        data = self.data(payload)
        if rel in self.model:
            with pytest.raises(AlreadyExistsError):
                self.store.put_if_absent(self.key(rel), data)
            return
        self.current[rel] = self.store.put_if_absent(self.key(rel), data)
        self.model[rel] = data

    @precondition(lambda self: self.current)
    @rule(choice=st.data(), payload=payloads)
    def put_if_match_current(self, choice: st.DataObject, payload: bytes) -> None:
        rel = choice.draw(st.sampled_from(sorted(self.current)), label="key with a known token")
        data = self.data(payload)
        token = self.store.put_if_match(self.key(rel), data, self.current[rel])
        self.changed(rel)
        self.current[rel] = token
        self.model[rel] = data

    @precondition(lambda self: self.stale)
    @rule(choice=st.data(), other=st.one_of(st.none(), keys), payload=payloads)
    def put_if_match_stale(self, choice: st.DataObject, other: str | None, payload: bytes) -> None:
        """A stale token, on its own key or (``other``) another, never matches, whether
        an object is there or not."""
        rel, token = choice.draw(st.sampled_from(self.stale), label="stale token")
        rel = other or rel
        with pytest.raises(ConflictError):
            self.store.put_if_match(self.key(rel), self.data(payload), token)
        self.check_get(rel)

    @rule(choice=st.data(), payload=payloads)
    def put_if_match_unknown(self, choice: st.DataObject, payload: bytes) -> None:
        """A token the store never issued never matches."""
        rel = self.pick(choice)
        with pytest.raises(ConflictError):
            self.store.put_if_match(self.key(rel), self.data(payload), f'"{uuid.uuid4().hex}"')
        self.check_get(rel)

    @rule(choice=st.data())
    def delete(self, choice: st.DataObject) -> None:
        rel = self.pick(choice)
        self.store.delete(self.key(rel))
        self.changed(rel)
        self.model.pop(rel, None)

    # ----------------------------------------------------------------------- reads

    def check_get(self, rel: str) -> None:
        if rel in self.model:
            assert self.store.get(self.key(rel)) == self.model[rel]
        else:
            with pytest.raises(ObjectNotFoundError):
                self.store.get(self.key(rel))

    @rule(choice=st.data())
    def get(self, choice: st.DataObject) -> None:
        self.check_get(self.pick(choice))

    @rule(choice=st.data())
    def get_with_token(self, choice: st.DataObject) -> None:
        rel = self.pick(choice)
        if rel not in self.model:
            with pytest.raises(ObjectNotFoundError):
                self.store.get_with_token(self.key(rel))
            return
        data, token = self.store.get_with_token(self.key(rel))
        assert data == self.model[rel]
        assert (rel, token) not in self.stale
        if rel in self.current:
            assert token == self.current[rel]
        self.current[rel] = token

    @rule(choice=st.data())
    def get_range(self, choice: st.DataObject) -> None:
        rel = self.pick(choice)
        size = len(self.model.get(rel, b""))
        start = choice.draw(st.integers(0, size + 4), label="start")
        end = choice.draw(st.integers(0, size + 4), label="end")
        if rel not in self.model:
            if end <= start:
                # S3 answers an empty range without asking whether the object exists
                try:
                    assert self.store.get_range(self.key(rel), start, end) == b""
                except ObjectNotFoundError:
                    pass
                return
            with pytest.raises(ObjectNotFoundError):
                self.store.get_range(self.key(rel), start, end)
            return
        expected = self.model[rel][start:end]
        assert self.store.get_range(self.key(rel), start, end) == expected
        assert bytes(self.store.get_view(self.key(rel), start, end)) == expected

    @rule(choice=st.data(), length=st.integers(1, 100))
    def get_tail(self, choice: st.DataObject, length: int) -> None:
        rel = self.pick(choice)
        if rel not in self.model:
            with pytest.raises(ObjectNotFoundError):
                self.store.get_tail(self.key(rel), length)
            return
        data = self.model[rel]
        assert self.store.get_tail(self.key(rel), length) == (data[-length:], len(data))

    @rule(choice=st.data())
    def stat(self, choice: st.DataObject) -> None:
        rel = self.pick(choice)
        if rel not in self.model:
            with pytest.raises(ObjectNotFoundError):
                self.store.stat(self.key(rel))
            assert not self.store.exists(self.key(rel))
            return
        info = self.store.stat(self.key(rel))
        assert (info.key, info.size) == (self.key(rel), len(self.model[rel]))
        assert self.store.exists(self.key(rel))
        if info.token and rel in self.current:
            assert info.token == self.current[rel]

    @rule()
    def list(self) -> None:
        """Every folder of :data:`PREFIXES` at once: a folder's end shows only when both
        sides of it hold objects."""
        for folder in PREFIXES:
            where = self.key(folder) if folder else self.prefix
            head = folder.rstrip("/") + "/" if folder else ""
            expected = [(self.key(k), len(v)) for k, v in sorted(self.model.items()) if k.startswith(head)]
            assert [(o.key, o.size) for o in self.store.list(where)] == expected, folder

    def teardown(self) -> None:
        self.cleanup()


def _settings(examples: int) -> settings:
    return settings(max_examples=examples, stateful_step_count=50 if LONG else 20, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


class MemoryStoreMachine(StoreMachine):
    def __init__(self) -> None:
        super().__init__(resolve(f"memory://machine-{uuid.uuid4().hex[:12]}").store, "t")


class LocalStoreMachine(StoreMachine):
    def __init__(self) -> None:
        folder = tempfile.mkdtemp(prefix="shale-store-machine-")
        loc = resolve(os.path.join(folder, "t"))
        super().__init__(loc.store, loc.prefix, lambda: shutil.rmtree(folder, ignore_errors=True))


class S3StoreMachine(StoreMachine):
    bucket: ClassVar[str] = ""  # set by the test, from the moto fixture

    def __init__(self) -> None:
        super().__init__(resolve(f"s3://{self.bucket}").store, f"machine-{uuid.uuid4().hex[:12]}")


def test_memory_store_matches_the_model() -> None:
    run_state_machine_as_test(MemoryStoreMachine, settings=_settings(300 if LONG else 25))


def test_local_store_matches_the_model() -> None:
    run_state_machine_as_test(LocalStoreMachine, settings=_settings(300 if LONG else 25))


@pytest.mark.s3
def test_s3_store_matches_the_model(s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(S3StoreMachine, "bucket", s3_bucket)
    run_state_machine_as_test(S3StoreMachine, settings=_settings(60 if LONG else 10))
