"""Conformance of the versioned-document metadata store on every backend, including
races of threads and of processes where exactly one writer wins each version."""

from __future__ import annotations

import multiprocessing
import threading

import pytest

from shale.ledger.errors import AlreadyExistsError, ConflictError
from shale.metadata.documents import DocumentStore
from shale.storage import resolve


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
