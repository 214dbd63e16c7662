"""Ledgers written by many tasks and registered together, or not at all.

A distributed write (Spark's ``df.write.format("shale")``) cannot register each task's
ledgers as the task seals them: a task that fails halfway, or runs twice, would leave
part of the job registered.  Instead each task writes with a :class:`StagingWriter`,
which seals and uploads ledgers exactly as :class:`~shale.producer.TopicWriter` does but
registers nothing and returns what it uploaded (:class:`StagedLedger`\\ s); the job's
driver then registers every staged ledger of the tasks that finished with one
compare-and-swap (:func:`register_staged`), or deletes them (:func:`discard_staged`).

Task ``p`` labels its ledgers ``base + p * LABEL_STRIDE + i``, ``base`` being the id after
the last ledger when the job started: labels never collide between tasks, and when no
other writer appended meanwhile they are final, so registering moves no byte.  A job's
ledger ids therefore leave gaps, as Pulsar's do (ids need only rise).  When another
writer did take ids meanwhile, the staged ledgers are re-labelled (read, re-labelled,
written under a new name) before they are registered.

A task may outlive its job: Spark cancels the tasks still running when a job fails, but
a task's Python code can run on after the driver aborted (or committed without it).  So
each task attempt, before it uploads anything, leaves a record under the write's own
folder (``staging/<write>/task-<partition>-<nonce>.json``) and names every ledger it
stages with that ``nonce``; the driver, committing or aborting, first leaves the write's
marker (``staging/<write>/_done.json``), then deletes every staged ledger of the tasks
it did not register, found through their records.  A task checks for the marker after
each upload and, finding it, deletes what it staged.  One of the two always sees the
other's object (each writes its own before it reads the other's), so no task's ledger
outlives the job, unless the task's process dies between its upload and its check:
garbage collection takes such a ledger, and the write's folder, past the orphan grace.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, Final

from shale.ledger.errors import ConflictError, InvalidInputError, ObjectNotFoundError
from shale.ledger.values import dataclass
from shale.ledger.writer import relabel_ledger
from shale.metadata.layout import (
    LEDGER_DIR,
    STAGING_DIR,
    ledger_name_parts,
    ledger_object_name,
    staging_done_name,
    staging_task_name,
    staging_task_of,
)
from shale.metadata.state import LedgerInfo, TopicState
from shale.metadata.topic import TopicMetadata
from shale.producer.writer import UNREGISTERED_MAX_AGE_S, TopicWriter
from shale.storage import ObjectStore

__all__ = ["LABEL_STRIDE", "StagedLedger", "StagingWriter", "discard_staged", "finish_write", "new_write_id",
           "register_staged"]

#: Ledger labels each task may use (a task writing more ledgers than this fails).
LABEL_STRIDE: Final = 1 << 16


@dataclass(frozen=True, slots=True)
class StagedLedger:
    """A sealed, uploaded, unregistered ledger: its registration-to-be, and the task
    (``partition``) that wrote it."""

    partition: int
    info: dict[str, Any]

    @property
    def ledger(self) -> LedgerInfo:
        return LedgerInfo(**self.info)


def new_write_id() -> str:
    """A fresh id for one distributed write (its folder under ``staging/``)."""
    return uuid.uuid4().hex[:12]


class StagingWriter(TopicWriter):
    """A :class:`TopicWriter` that uploads sealed ledgers without registering them;
    :attr:`staged` lists them.  ``base`` is the first label of the job, ``partition`` this
    task's number, ``write`` the write's id (:func:`new_write_id`): with one, the task
    leaves its record before its first upload, and after each upload deletes what it
    staged and fails if the write was already committed or aborted."""

    def __init__(self, topic_uri: str, *, base: int, partition: int, write: str | None = None,
                 **kwargs: Any) -> None:
        if partition < 0 or base < 1:
            raise InvalidInputError("a staging writer needs a partition >= 0 and a base label >= 1")
        super().__init__(topic_uri, **kwargs)
        self._first_label = base + partition * LABEL_STRIDE
        self.partition = partition
        self.write = write
        self.nonce = uuid.uuid4().hex[:12]  # this attempt's: in the name of every ledger it stages
        self._recorded = False
        self.staged: list[StagedLedger] = []

    def _next_label(self) -> int:
        if len(self.staged) >= LABEL_STRIDE:
            raise InvalidInputError(f"a task may write at most {LABEL_STRIDE} ledgers: repartition the data")
        return self._first_label + len(self.staged)

    def _seal(self) -> None:
        ledger, buf = self._ledger, self._buf
        if ledger is None or buf is None:
            return
        ledger.finish()
        data = buf.getvalue()
        loc = self.meta.topic
        if self.write is not None and not self._recorded:
            record = {"partition": self.partition, "nonce": self.nonce, "first_label": self._first_label}
            loc.store.put(loc.key(staging_task_name(self.write, self.partition, self.nonce)),
                          json.dumps(record).encode())
            self._recorded = True
        name = ledger_object_name(ledger.ledger_id, self.nonce)
        loc.store.put(loc.key(name), data)
        info = LedgerInfo(ledger.ledger_id, name, ledger.n_entries, ledger.n_records, len(data), self._first_publish,
                          self._last_publish, int(self._clock() * 1000), len(data) + ledger.bytes_saved)
        self.staged.append(StagedLedger(self.partition, info.to_json()))
        self._ledger = self._buf = None
        if self.write is not None and loc.store.exists(loc.key(staging_done_name(self.write))):
            n = len(self.staged)
            self.discard()
            raise ConflictError(f"{self.meta.uri}: partition {self.partition}: the write was committed or aborted "
                                f"before this task finished; the {n} ledger{'' if n == 1 else 's'} it staged "
                                "were deleted")

    def discard(self) -> None:
        """Delete what this writer uploaded (a failed task cleans up after itself)."""
        self._batch = []
        self._compressing.discard()
        self._ledger = self._buf = None
        discard_staged(self.meta, self.staged)
        self.staged = []


def _unique(staged: Iterable[StagedLedger]) -> list[StagedLedger]:
    """One task's ledgers once, in label order (a duplicate task report is dropped)."""
    by_label: dict[int, StagedLedger] = {}
    for s in staged:
        by_label.setdefault(s.ledger.id, s)
    return [by_label[k] for k in sorted(by_label)]


def register_staged(meta: TopicMetadata, staged: Iterable[StagedLedger], attempts: int = 50) -> TopicState:
    """Register every staged ledger, in label order, with one compare-and-swap.

    A staged object older than :data:`~shale.producer.writer.UNREGISTERED_MAX_AGE_S` is written
    again first (garbage collection may take an unregistered object past its orphan grace
    for a leftover, and must not be racing its registration), and so are all of them when
    another writer took their labels meanwhile.  A staged object already gone fails the
    registration: nothing is registered."""
    todo = [s.ledger for s in _unique(staged)]
    if not todo:
        return meta.load_topic()

    def registered(state: TopicState) -> TopicState:
        nonlocal todo
        if todo[0].id <= state.last_ledger_id:
            todo = [_rewritten(meta, info, state.last_ledger_id + 1 + k) for k, info in enumerate(todo)]
        else:
            todo = [_rewritten(meta, info, info.id) if _too_old(meta, info) else info for info in todo]
        now = int(time.time() * 1000)
        return replace(state, ledgers=(*state.ledgers, *(replace(i, sealed_ms=now) for i in todo)))

    try:
        return meta.update_topic(registered, attempts=attempts, what="registering a write's ledgers")
    except ConflictError as exc:
        raise ConflictError(f"{meta.uri}: could not register the write's ledgers after {attempts} attempts; "
                            "too many writers are appending to this topic at once") from exc


def _too_old(meta: TopicMetadata, info: LedgerInfo) -> bool:
    key = meta.topic.key(info.object)
    try:
        mtime_ms = meta.topic.store.stat(key).mtime * 1000
    except ObjectNotFoundError:
        raise ObjectNotFoundError(f"{meta.topic.store.url(key)}: a staged ledger is gone (taken for a leftover by "
                                  "garbage collection?); nothing was registered: run the write again") from None
    return meta.topic.store.now_ms(meta.topic.key(LEDGER_DIR)) - mtime_ms > UNREGISTERED_MAX_AGE_S * 1000


def _rewritten(meta: TopicMetadata, info: LedgerInfo, lid: int) -> LedgerInfo:
    """A fresh copy of a staged ledger's object labelled ``lid``, under a new name (the
    old object is deleted: nothing registered names it)."""
    store, old = meta.topic.store, meta.topic.key(info.object)
    try:
        data = store.get(old)
    except ObjectNotFoundError:
        raise ObjectNotFoundError(f"{store.url(old)}: a staged ledger is gone (taken for a leftover by garbage "
                                  "collection?); nothing was registered: run the write again") from None
    name = ledger_object_name(lid, uuid.uuid4().hex[:12])
    store.put(meta.topic.key(name), relabel_ledger(data, lid) if lid != info.id else data)
    try:
        store.delete(old)
    except ObjectNotFoundError:
        pass
    return replace(info, id=lid, object=name)


def finish_write(meta: TopicMetadata, write: str, base: int, kept: Iterable[StagedLedger] = ()) -> int:
    """End the distributed write ``write`` (first label ``base``): leave its marker, so
    that its tasks still running delete what they stage, then delete what its tasks
    staged, but for the tasks whose ledgers are ``kept`` (the registered ones: an abort
    keeps none), and the tasks' records.  How many ledgers were deleted.

    Only ledgers named with a task's own nonce and a label of that task's are deleted,
    and never one the topic registers."""
    store, loc = meta.topic.store, meta.topic
    store.put(loc.key(staging_done_name(write)), b"{}")
    kept_nonces = {p[1] for s in kept if (p := ledger_name_parts(s.info["object"])) is not None}
    records = [(info.key, staging_task_of(loc.relative(info.key))) for info in store.list(loc.key(STAGING_DIR, write))]
    # each stray task's nonce, and the labels it may use
    strays = {task[1]: range(base + task[0] * LABEL_STRIDE, base + (task[0] + 1) * LABEL_STRIDE)
              for _, task in records if task is not None and task[1] not in kept_nonces}
    n = 0
    if strays:
        registered = {lg.object for lg in meta.load_topic().ledgers}
        for info in store.list(loc.key(LEDGER_DIR)):
            rel = loc.relative(info.key)
            parts = ledger_name_parts(rel)
            if parts is None or parts[0] not in strays.get(parts[1], ()) or rel in registered:
                continue
            n += _delete(store, info.key)
    for key, task in records:
        if task is not None:
            _delete(store, key)
    return n


def _delete(store: ObjectStore, key: str) -> int:
    try:
        store.delete(key)
        return 1
    except ObjectNotFoundError:
        return 0


def discard_staged(meta: TopicMetadata, staged: Iterable[StagedLedger]) -> int:
    """Delete staged, unregistered ledgers; how many.  A ledger the topic registers is
    never deleted."""
    registered = {lg.object for lg in meta.load_topic().ledgers}
    n = 0
    for s in staged:
        name = s.info["object"]
        if name in registered:
            continue
        try:
            meta.topic.store.delete(meta.topic.key(name))
            n += 1
        except ObjectNotFoundError:
            pass
    return n
