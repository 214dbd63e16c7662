"""Conformance of the versioned-document metadata store on every backend, including
races of threads and of processes where exactly one writer wins each version; and
``update``, the one read-modify-compare-and-swap loop, with the callers that use it."""

from __future__ import annotations

import logging
import multiprocessing
import threading
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from shale.ledger.errors import AlreadyExistsError, ConflictError, StateUnknownError, StorageError
from shale.metadata.documents import DocumentStore, Versioned
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.storage import resolve
from shale.storage.retry import Attempt, ConflictPolicy


@pytest.fixture
def docs(root_uri: str) -> DocumentStore:
    return DocumentStore(resolve(root_uri).child("_meta"))


def test_create_read_replace(docs: DocumentStore) -> None:
    assert docs.read("d.json") is None
    v1 = docs.create("d.json", {"n": 1})
    assert v1.version == 1
    r = docs.read("d.json")
    assert r is not None and r.value == {"n": 1} and r.version == 1
    v2 = docs.replace("d.json", {"n": 2}, 1)
    assert v2.version == 2
    r = docs.read("d.json")
    assert r is not None and r.value == {"n": 2} and r.version == 2


def test_conflicts_name_both_versions(docs: DocumentStore) -> None:
    docs.create("d.json", {"n": 1})
    with pytest.raises(AlreadyExistsError, match="found version 1"):
        docs.create("d.json", {"n": 9})
    docs.replace("d.json", {"n": 2}, 1)
    with pytest.raises(ConflictError, match="expected version 1, found version 2") as e:
        docs.replace("d.json", {"n": 3}, 1)
    assert (e.value.expected, e.value.found) == (1, 2)
    r = docs.read("d.json")
    assert r is not None and r.value == {"n": 2}


def test_stale_token_is_a_conflict(docs: DocumentStore) -> None:
    v1 = docs.create("d.json", {"n": 1})
    docs.replace("d.json", {"n": 2}, 1)
    with pytest.raises(ConflictError, match="expected version 1, found version 2"):
        docs.replace("d.json", {"n": 3}, 1, token=v1.token)


def test_thread_race_one_winner_per_version(docs: DocumentStore) -> None:
    docs.create("d.json", {"winner": None})
    for round_ in range(1, 6):
        wins: list[int] = []
        barrier = threading.Barrier(6)

        def attempt(i: int, version: int = round_, barrier: threading.Barrier = barrier,
                    wins: list[int] = wins) -> None:
            barrier.wait()
            try:
                docs.replace("d.json", {"winner": i}, version)
                wins.append(i)
            except ConflictError:
                pass

        ts = [threading.Thread(target=attempt, args=(i,)) for i in range(6)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert len(wins) == 1, f"round {round_}: winners {wins}"
        r = docs.read("d.json")
        assert r is not None and r.version == round_ + 1 and r.value == {"winner": wins[0]}


def _process_bump(uri: str, n: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    from shale.storage import clear_backend_cache

    clear_backend_cache()
    d = DocumentStore(resolve(uri).child("_meta"))
    wins = 0
    for _ in range(n):
        cur = d.read("c.json")
        assert cur is not None
        try:
            d.replace("c.json", {"n": cur.value["n"] + 1}, cur.version)
            wins += 1
        except ConflictError:
            pass
    out.put(wins)


def test_process_race_counts_every_win_once(disk_topic_uri: str) -> None:
    """Processes race plain compare-and-swaps: the final count equals the number of
    successful swaps, so no two writers ever won the same version."""
    uri = disk_topic_uri
    DocumentStore(resolve(uri).child("_meta")).create("c.json", {"n": 0})
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_process_bump, args=(uri, 15, q)) for _ in range(4)]
    for p in procs:
        p.start()
    wins = sum(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    r = DocumentStore(resolve(uri).child("_meta")).read("c.json")
    assert r is not None
    assert r.value["n"] == wins and r.version == wins + 1
    assert wins >= 15  # at least one writer wins each contested round


# ------------------------------------------------------------------ update(): read, change, swap, again

NO_WAIT = ConflictPolicy(sleep=lambda _s: None)


@pytest.fixture
def mem_docs() -> DocumentStore:
    return DocumentStore(resolve(f"memory://docs-{uuid.uuid4().hex[:12]}/m"))


def _plus(n: int) -> Callable[[Versioned], Versioned]:
    return lambda v: replace(v, value={"n": v.value.get("n", 0) + n})


def test_update_reads_again_after_each_conflict_and_gives_up_after_its_attempts(mem_docs: DocumentStore) -> None:
    docs = mem_docs
    docs.create("d.json", {"n": 0})
    seen: list[int] = []

    def overtaken_twice(v: Versioned) -> Versioned:
        seen.append(v.version)
        if len(seen) <= 2:  # another writer swaps between this read and this swap
            docs.replace("d.json", {"n": v.value["n"] + 100}, v.version)
        return replace(v, value={"n": v.value["n"] + 1})

    got = docs.update("d.json", overtaken_twice, load=Versioned.load, policy=NO_WAIT)
    assert seen == [1, 2, 3] and got.version == 4 and got.value == {"n": 201}
    current = docs.read("d.json")
    assert current is not None and (current.value, current.version, current.token) == ({"n": 201}, 4, got.token)

    seen.clear()

    def always_overtaken(v: Versioned) -> Versioned:
        seen.append(v.version)
        docs.replace("d.json", {"n": -v.version}, v.version)
        return replace(v, value={"n": 0})

    with pytest.raises(ConflictError, match=r"d\.json: expected version 6, found version 7$"):
        docs.update("d.json", always_overtaken, load=Versioned.load,
                    policy=ConflictPolicy(attempts=3, sleep=lambda _s: None))
    assert seen == [4, 5, 6]  # read again for every attempt, no more than three


def test_update_creates_what_is_missing_and_writes_nothing_for_no_change(mem_docs: DocumentStore) -> None:
    docs = mem_docs
    made = docs.update("new.json", _plus(1), load=Versioned.load)
    assert (made.value, made.version) == ({"n": 1}, 1)
    same = docs.update("new.json", lambda v: None, load=Versioned.load)
    current = docs.read("new.json")
    assert current is not None and (same.version, same.token) == (current.version, current.token) == (1, made.token)
    # the first attempt may start from a copy the caller holds; a stale one only costs a conflict
    docs.update("new.json", _plus(1), load=Versioned.load)
    got = docs.update("new.json", _plus(10), load=Versioned.load, current=made, policy=NO_WAIT)
    assert (got.value, got.version) == ({"n": 12}, 3)


def test_an_unknown_outcome_is_raised_unless_the_caller_can_tell_from_a_new_read(
        mem_docs: DocumentStore, monkeypatch: pytest.MonkeyPatch) -> None:
    docs, store = mem_docs, mem_docs.location.store
    docs.create("d.json", {"n": 0})
    real = store.put_if_match
    lost = [True]

    def answer_lost(key: str, data: bytes, token: str) -> str:
        new = real(key, data, token)  # the write lands; its answer does not come back
        if lost:
            lost.pop()
            raise StateUnknownError(f"{store.url(key)}: the connection dropped")
        return new

    monkeypatch.setattr(store, "put_if_match", answer_lost)
    with pytest.raises(StateUnknownError, match="the connection dropped"):
        docs.update("d.json", _plus(1), load=Versioned.load, policy=NO_WAIT)
    current = docs.read("d.json")
    assert current is not None and current.value == {"n": 1}

    lost.append(True)
    seen: list[int] = []
    unknown: list[StorageError] = []

    def once(v: Versioned) -> Versioned | None:
        seen.append(v.value["n"])
        return None if v.value.get("by") == "once" else replace(v, value={"n": v.value["n"] + 1, "by": "once"})

    got = docs.update("d.json", once, load=Versioned.load, policy=NO_WAIT, on_unknown=unknown.append)
    assert seen == [1, 2] and len(unknown) == 1 and got.value == {"n": 2, "by": "once"}


def _overtaken_once(monkeypatch: pytest.MonkeyPatch, name: str, meanwhile: Callable[[], object]) -> None:
    """Run ``meanwhile`` once, between the next read of document ``name`` and its swap."""
    real = DocumentStore.replace
    ran: list[bool] = []

    def replace_after(self: DocumentStore, doc: str, *args: Any, **kwargs: Any) -> Versioned:
        if doc == name and not ran:
            ran.append(True)
            meanwhile()
        return real(self, doc, *args, **kwargs)

    monkeypatch.setattr(DocumentStore, "replace", replace_after)


def _append(uri: str, key: str) -> None:
    with TopicWriter(uri) as w:
        w.append(key, "v")


def test_callers_give_up_as_they_always_did(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A producer that keeps losing says so and leaves no upload behind; a truncation says
    how many attempts it made; a registration whose answer was lost but which landed
    counts once."""
    uri = str(tmp_path / "t")
    _append(uri, "a")
    w = TopicWriter(uri, register_attempts=1)
    w.append("b", "v")
    _overtaken_once(monkeypatch, "topic.json", lambda: _append(uri, "meanwhile"))
    with pytest.raises(ConflictError, match=r": could not register a ledger after 1 attempts; too many writers are "
                                            r"appending to this topic at once$"):
        w.flush()
    meta = TopicMetadata.open(uri)
    registered = {lg.object for lg in meta.load_topic().ledgers}
    assert {p.name for p in (tmp_path / "t" / "ledgers").iterdir()} == {n.split("/")[-1] for n in registered}

    monkeypatch.undo()
    _overtaken_once(monkeypatch, "topic.json", lambda: _append(uri, "meanwhile"))
    with pytest.raises(ConflictError, match=r"the topic kept changing; truncation gave up after 1 attempts \("):
        meta.truncate(2, attempts=1)

    monkeypatch.undo()
    store, lost = meta.topic.store, [True]
    real = type(store).put_if_match

    def answer_lost(self: Any, key: str, data: bytes, token: str) -> str:
        new = real(self, key, data, token)
        if lost and key.endswith("topic.json"):
            lost.pop()
            raise StateUnknownError(f"{key}: the connection dropped")
        return new

    monkeypatch.setattr(type(store), "put_if_match", answer_lost)
    before = len(meta.load_topic().ledgers)
    with TopicWriter(uri) as w2:
        w2.append("c", "v")
    assert not lost and len(w2.result.ledgers) == 1
    ledgers = meta.load_topic().ledgers
    assert len(ledgers) == before + 1 and ledgers[-1].object == w2.result.ledgers[0].object
    assert len(list((tmp_path / "t" / "ledgers").iterdir())) == len(ledgers)


def _swap_loop(policy: ConflictPolicy, new_loop: bool, conflicts: int, error: Exception | None) -> list[object]:
    """What a compare-and-swap loop under ``policy`` did, whose attempts conflict
    ``conflicts`` times (or raise ``error`` at the first): each attempt's number, then
    how it ended."""
    seen: list[object] = []
    try:
        for attempt in (policy.loop("the doc") if new_loop else policy.retrying("the doc")):
            with attempt:
                seen.append(attempt.number if isinstance(attempt, Attempt) else attempt.retry_state.attempt_number)
                if error is not None:
                    raise error
                if len(seen) <= conflicts:
                    raise ConflictError(f"lost at attempt {len(seen)}")
                seen.append("swapped")
                return seen
        seen.append("loop over")
    except Exception as e:
        seen.append(e)
    return seen


@pytest.mark.parametrize("conflicts", [0, 1, 2, 3, 7])
def test_a_swap_loop_makes_the_attempts_waits_and_log_lines_tenacity_made(
        conflicts: int, caplog: pytest.LogCaptureFixture) -> None:
    """The loop's first attempt is made without tenacity: every outcome is the one the
    tenacity loop gives, whether the swap succeeds at once, after conflicts, or never."""
    caplog.set_level(logging.DEBUG, logger="shale")
    outcomes = []
    for new_loop in (False, True):
        caplog.clear()
        waits: list[float] = []
        policy = ConflictPolicy(attempts=4, initial_wait=0.5, max_wait=2.0, sleep=waits.append)
        seen = _swap_loop(policy, new_loop, conflicts, None)
        last = seen[-1]
        outcomes.append((seen[:-1] + [str(last) if isinstance(last, ConflictError) else last], len(waits),
                         [r.getMessage() for r in caplog.records]))
        assert all(0 <= w <= 2.0 for w in waits)
    assert outcomes[0] == outcomes[1]
    tried = min(conflicts + 1, 4)
    assert outcomes[1][0] == [*range(1, tried + 1), "swapped" if conflicts < 4 else "lost at attempt 4"]
    assert outcomes[1][2] == [f"the doc: conflict on attempt {n}, trying again" for n in range(1, tried)]


def test_a_swap_loop_stops_at_an_error_that_is_not_a_conflict() -> None:
    for new_loop in (False, True):
        error = ValueError("not a conflict")
        assert _swap_loop(NO_WAIT, new_loop, 0, error) == [1, error]
