"""Garbage collection: delete what no published state needs any more.

* Retired compacted ledgers: removed from the published state with a compare-and-swap
  first, then deleted — but only once their ``retired_ms`` is older than the grace
  period, because readers that opened the older state may still be reading them.
* Orphans: run folders under ``compacted/`` that no state refers to (a crashed or
  beaten compactor), ledger objects under ``ledgers/`` that were never registered (a
  crashed or beaten producer, a distributed write's task that outlived its job) or that
  a truncation removed from the topic, a distributed write's folder under ``staging/``,
  and dictionaries under ``dictionaries/`` that were never registered (a failed
  ``shale dictionary --train``), once everything in them is older than the orphan grace
  (and, for truncated ledgers, the last truncation is too).

Nothing a published state refers to is ever deleted.
"""

from __future__ import annotations

import re
from dataclasses import field, replace
from typing import Final

from shale.ledger.errors import ConflictError
from shale.ledger.values import dataclass
from shale.metadata.handle import Topic, opened
from shale.metadata.layout import (
    COMPACTED_DIR,
    DICTIONARY_DIR,
    LEDGER_DIR,
    STAGING_DIR,
    is_compacted_object,
    is_dictionary_name,
    is_ledger_object,
    is_staging_object,
    run_dir_of,
    write_dir_of,
)
from shale.metadata.state import CompactionState, RetiredSet
from shale.metadata.topic import TopicMetadata
from shale.settings import SETTINGS
from shale.settings.kinds import Duration
from shale.settings.units import count

__all__ = ["COMPACTED_DIR", "GcReport", "collect_garbage", "run_dir_of"]

_ORPHAN_GRACE: Final = SETTINGS["orphan-grace"].kind
#: Writers give up on an upload older than a third of this before publishing it, and
#: garbage collection never treats anything younger as an orphan (the settings model's
#: least ``--orphan-grace``).
MIN_ORPHAN_GRACE_MS: Final[int] = _ORPHAN_GRACE.least if isinstance(_ORPHAN_GRACE, Duration) else 0

# A local folder's write in progress: ``.shale-tmp-<nonce>-<name>`` beside its object.
_LOCAL_TMP: Final = re.compile(r"\.shale-tmp-[0-9a-f]{12}-(.+)")


def _written_name(rel: str) -> str:
    """The object an unfinished write was writing (a temporary file names it)."""
    head, _, base = rel.rpartition("/")
    m = _LOCAL_TMP.fullmatch(base)
    return f"{head}/{m.group(1)}" if m and head else (m.group(1) if m else rel)


@dataclass(slots=True)
class GcReport:
    """What a collection deleted (or, in a dry run, would delete)."""

    topic: str
    retired_deleted: list[str] = field(default_factory=list)
    orphans_deleted: list[str] = field(default_factory=list)
    retired_waiting: int = 0
    dry_run: bool = False

    def to_json(self) -> dict[str, object]:
        return {"topic": self.topic, "dry_run": self.dry_run,
                "retired_deleted": len(self.retired_deleted), "orphans_deleted": len(self.orphans_deleted),
                "retired_waiting": self.retired_waiting,
                "deleted": sorted(self.retired_deleted + self.orphans_deleted)}

    def human(self) -> str:
        """One line for a person, then the objects, one a line."""
        gone = sorted(self.retired_deleted + self.orphans_deleted)
        verb = "would delete" if self.dry_run else "deleted"
        head = (f"{self.topic}: {verb} {count(len(self.retired_deleted), 'retired object')} and "
                f"{count(len(self.orphans_deleted), 'leftover')}; {count(self.retired_waiting, 'retired object')} "
                "still within the grace period")
        return "\n".join([head, *(f"  {name}" for name in gone)])


def collect_garbage(topic: Topic | TopicMetadata, *, now_ms: int | None = None, grace_ms: int,
                    orphan_grace_ms: int, dry_run: bool = False, attempts: int = 10) -> GcReport:
    """Delete retired compacted ledgers past ``grace_ms`` and orphans past ``orphan_grace_ms``.

    Ages are judged by the store's clock (``now_ms`` defaults to
    :meth:`TopicMetadata.now_ms`), as the objects' modification times are the store's.
    The compaction state the topic's handle holds is where unreferencing starts (a
    compare-and-swap: one that changed since is read again); what decides whether an
    object is an orphan is read again after the listing that found it, and kept."""
    t = opened(topic)
    meta = t.meta
    from shale.ledger.errors import InvalidInputError

    if grace_ms < 0:
        raise InvalidInputError("grace must not be negative")
    if orphan_grace_ms < MIN_ORPHAN_GRACE_MS:
        # Producers and compactors publish within a third of this after uploading.
        raise InvalidInputError(f"orphan grace must be at least {MIN_ORPHAN_GRACE_MS // 60_000} minutes")
    report = GcReport(meta.uri, dry_run=dry_run)
    if now_ms is None:
        now_ms = meta.now_ms()

    state = _unreference_retired(t, report, now_ms, grace_ms, dry_run, attempts)
    report.orphans_deleted = _orphans(t, state, now_ms, orphan_grace_ms, dry_run)
    if not dry_run:
        # a run's folder emptied by this collection goes too (a local folder would keep it)
        for run in sorted({run_dir_of(o) for o in report.retired_deleted + report.orphans_deleted
                           if is_compacted_object(_written_name(o.removesuffix(" (unfinished write)")))}):
            meta.topic.store.remove_empty_folder(meta.topic.key(run))
    return report


def _unreference_retired(t: Topic, report: GcReport, now_ms: int, grace_ms: int, dry_run: bool,
                         attempts: int) -> CompactionState:
    """Remove the retired sets past their grace from the state (one compare-and-swap),
    then delete their objects; the state as it then stands.  A state that kept changing
    for every attempt leaves them for the next collection."""
    meta = t.meta
    loc, store = meta.topic, meta.topic.store
    due: tuple[RetiredSet, ...] = ()

    def unreferenced(state: CompactionState) -> CompactionState | None:
        nonlocal due
        due = tuple(r for r in state.retired if now_ms - r.retired_ms >= grace_ms)
        report.retired_waiting = sum(len(r.objects) for r in state.retired) - sum(len(r.objects) for r in due)
        if not due or dry_run:
            report.retired_deleted = [o for r in due for o in r.objects]
            return None
        # Unreference first, delete second: a crash in between leaves orphans,
        # never a published state that points at a deleted object.
        return replace(state, retired=tuple(r for r in state.retired if r not in due))

    try:
        state = meta.update_compaction(unreferenced, current=t.compaction, attempts=attempts,
                                       what="garbage collection")
    except ConflictError:
        return t.read_compaction()
    t.keep(state)
    if not due or dry_run:
        return state
    published = state.referenced_objects()
    for r in due:
        for obj in r.objects:
            # (the state's schema already refuses anything else; checked again here,
            # where deleting happens)
            if is_compacted_object(obj) and obj not in published:
                store.delete(loc.key(obj))
                report.retired_deleted.append(obj)
    return state


def _orphans(t: Topic, state: CompactionState, now_ms: int, grace_ms: int, dry_run: bool) -> list[str]:
    """Leftovers: only objects named as this topic names what it writes, directly in its
    own folders (another topic nested in them, or a stranger's file, is never one)."""
    meta = t.meta
    deleted = _orphaned_parts(t, state, now_ms, grace_ms, dry_run)
    deleted += _finished_writes(meta, now_ms, grace_ms, dry_run)
    deleted += _unfinished_writes(meta, now_ms, grace_ms, dry_run)
    deleted += _unregistered_dictionaries(t, now_ms, grace_ms, dry_run)
    deleted += _unregistered_ledgers(t, now_ms, grace_ms, dry_run)
    return deleted


def _orphaned_parts(t: Topic, state: CompactionState, now_ms: int, grace_ms: int, dry_run: bool) -> list[str]:
    """Compacted objects no state names: whole runs that never got published, and the
    parts of a published run that no state names any more."""
    loc, store = t.meta.topic, t.meta.topic.store
    runs: dict[str, list[tuple[str, float]]] = {}
    for info in store.list(loc.key(COMPACTED_DIR)):
        rel = loc.relative(info.key)
        if is_compacted_object(rel):
            runs.setdefault(run_dir_of(rel), []).append((rel, info.mtime))
    # Re-read: a run published after the first read must not look orphaned.
    fresh = t.read_compaction()
    referenced = state.referenced_objects() | fresh.referenced_objects()
    referenced_runs = {run_dir_of(o) for o in referenced}
    doomed: list[str] = []
    for run, objs in sorted(runs.items()):
        if run in referenced_runs:
            # A published run's folder is never written again, but a part kept in place
            # can keep it referenced for ever: collect what no state names in it.
            doomed += [rel for rel, mtime in objs if rel not in referenced and now_ms - mtime * 1000 >= grace_ms]
        elif now_ms - max(m for _, m in objs) * 1000 >= grace_ms:  # else it may belong to a compaction still running
            doomed += [rel for rel, _ in objs]
    if not dry_run:
        for rel in doomed:
            store.delete(loc.key(rel))
    return doomed


def _unfinished_writes(meta: TopicMetadata, now_ms: int, grace_ms: int, dry_run: bool) -> list[str]:
    """Writes a killed writer never finished (temporary files, multipart uploads): no
    state can name them, so only their age (and their name) matters."""
    loc, store = meta.topic, meta.topic.store
    deleted = []
    for folder, ours in ((COMPACTED_DIR, is_compacted_object), (LEDGER_DIR, is_ledger_object),
                         (STAGING_DIR, is_staging_object), (DICTIONARY_DIR, is_dictionary_name)):
        for info in list(store.unfinished_writes(loc.key(folder))):
            rel = loc.relative(info.key)
            if not ours(_written_name(rel)) or now_ms - info.mtime * 1000 < grace_ms:
                continue
            if not dry_run:
                store.discard_write(info)
            deleted.append(f"{rel} (unfinished write)")
    return deleted


def _unregistered_ledgers(t: Topic, now_ms: int, grace_ms: int, dry_run: bool) -> list[str]:
    """Ledger objects ``topic.json`` does not register, older than the orphan grace; none
    while a truncation is younger than the grace."""
    loc, store = t.meta.topic, t.meta.topic.store
    topic = t.read_topic()
    if now_ms - topic.truncated_ms < grace_ms:
        return []  # readers may still be reading the ledgers a truncation just removed
    registered = {lg.object for lg in topic.ledgers}
    deleted = []
    for info in store.list(loc.key(LEDGER_DIR)):
        rel = loc.relative(info.key)
        if not is_ledger_object(rel) or rel in registered or now_ms - info.mtime * 1000 < grace_ms:
            continue
        if not dry_run:
            store.delete(info.key)
        deleted.append(rel)
    return deleted


def _finished_writes(meta: TopicMetadata, now_ms: int, grace_ms: int, dry_run: bool) -> list[str]:
    """Distributed writes' folders under ``staging/`` (their tasks' records and their
    marker) whose every object is older than the orphan grace.  The records are read
    only when the write ends, to find what tasks the driver never heard from staged: a
    write still running that long after its last task started may lose them, and its end
    then leaves those tasks' ledgers to be collected as unregistered ones."""
    loc, store = meta.topic, meta.topic.store
    writes: dict[str, list[tuple[str, float]]] = {}
    for info in store.list(loc.key(STAGING_DIR)):
        rel = loc.relative(info.key)
        if is_staging_object(rel):
            writes.setdefault(write_dir_of(rel), []).append((rel, info.mtime))
    deleted = []
    for _, objs in sorted(writes.items()):
        if now_ms - max(m for _, m in objs) * 1000 < grace_ms:
            continue
        for rel, _ in sorted(objs):
            if not dry_run:
                store.delete(loc.key(rel))
            deleted.append(rel)
    return deleted


def _unregistered_dictionaries(t: Topic, now_ms: int, grace_ms: int, dry_run: bool) -> list[str]:
    """Dictionary objects ``topic.json`` does not register (a training whose
    registration failed), older than the orphan grace.  A registration never takes an
    object that old (it writes the dictionary again), and a registered dictionary is
    never removed from ``topic.json``, so none of these can be needed."""
    loc, store = t.meta.topic, t.meta.topic.store
    found = [(loc.relative(info.key), info) for info in store.list(loc.key(DICTIONARY_DIR))]
    old = [(rel, info) for rel, info in found if is_dictionary_name(rel) and now_ms - info.mtime * 1000 >= grace_ms]
    if not old:
        return []
    registered = {d.object for d in t.read_topic().dictionaries}  # read after the listing
    deleted = []
    for rel, info in sorted(old, key=lambda x: x[0]):
        if rel in registered:
            continue
        if not dry_run:
            store.delete(info.key)
        deleted.append(rel)
    return deleted
