"""What a commit changes: the difference between the Iceberg table as it is and the view of
the epoch it is brought to.

Message ids never change (compaction included) and a view holds at most one live record
per key, so the table of an epoch is the set of ids of its view's live records with a key
and a value: the rows to delete are those whose ids the new table lacks, the records to
add those whose ids the table lacks.  Two ways to find them:

* **From the two views** (:func:`~shale.reader.changes.view_difference`), when the table
  holds a retained epoch and neither epoch has a key TTL: only the parts the views do not
  share, and their deletion vectors, are read, so an epoch that changed 1 % of the keys
  costs about 1 % of the table (beside reading the table's id columns to place the
  deletes).  What the table holds is checked against what the view of its epoch says it
  should: every row to delete must be a live row of the table, and the rows left must be
  as many as the new epoch's live keys; otherwise the second way decides.
* **From the whole table** (:func:`~shale.reader.latest.plan_latest` as of the epoch,
  footers only): every id of the new table against every live row.

Then, file by file: a data file left without live rows is dropped, one whose deleted
fraction passes the threshold is rewritten (its live rows copied to a new file, it
dropped), the others get their new deletes in one position-delete file; a delete file
naming only dropped files is dropped too, and past :data:`MAX_DELETE_FILES` live ones they
are merged into one.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from shale.iceberg.state import IdColumns, IdKeys, TableState
from shale.ledger.values import dataclass
from shale.metadata.topic import TopicMetadata
from shale.reader.latest import Chosen, plan_latest

__all__ = ["MAX_DELETE_FILES", "Diff", "decide"]

#: Live position-delete files past which they are merged into one.
MAX_DELETE_FILES: Final = 16


@dataclass(slots=True)
class Diff:
    """What a commit writes: the view's records to add, the positions to delete by data
    file, the data files to rewrite (the positions of their rows kept), the paths of the
    files dropped, the live rows deleted, and the rows of the table after it."""

    added: list[Chosen] = field(default_factory=list)
    deletes: dict[str, npt.NDArray[np.int64]] = field(default_factory=dict)
    rewrites: list[tuple[str, npt.NDArray[np.int64]]] = field(default_factory=list)
    removed: set[str] = field(default_factory=set)
    deleted_rows: int = 0
    rows: int = 0
    how: str = "table"


def decide(meta: TopicMetadata, current: TableState, epoch: int, fraction: float) -> Diff:
    """The difference between ``current`` and the table of ``epoch`` (see the module);
    ``fraction``: the deleted fraction past which a data file is rewritten."""
    gone: list[npt.NDArray[np.bool_]] | None = None
    if current.epoch is not None:
        found = _by_views(meta, current, current.epoch, epoch)
        if found is not None:
            diff, gone = found
    if gone is None:
        diff, gone = _by_table(meta, current, epoch)
    _place(diff, current, gone, fraction)
    return diff


def _by_views(meta: TopicMetadata, current: TableState, since: int, epoch: int
              ) -> tuple[Diff, list[npt.NDArray[np.bool_]]] | None:
    """The difference from the two views, checked against the table (None: it cannot be
    found so, or the table is not what the view of its epoch says)."""
    from shale.reader.changes import view_difference

    state = meta.load_compaction()
    if since not in state.retained_epochs:
        return None
    found = view_difference(meta, since, epoch)
    view = state.at_epoch(epoch)
    if found is None or view is None:
        return None
    added, _, removed = found
    columns: IdColumns = (removed[:, 0], removed[:, 1], removed[:, 2])
    keys = IdKeys.fitting([columns] + [d.ids for d in current.data])
    wanted_gone = keys(columns)
    wanted_gone.sort()
    gone, hits = [], 0
    for d in current.data:
        ids = keys(d.ids)
        order = None if _rising(ids) else np.argsort(ids, kind="stable")
        at = _positions(ids if order is None else ids[order], wanted_gone)
        at = at if order is None else order[at]
        mask = np.zeros(len(ids), dtype=np.bool_)
        mask[at] = True
        mask &= ~d.deleted
        hits += int(np.count_nonzero(mask))
        gone.append(mask)
    rows = current.rows - hits + sum(len(c.records) for c in added)
    if hits != len(wanted_gone) or rows != view.keys:
        return None
    return Diff(added=list(added), deleted_rows=hits, rows=rows, how="views"), gone


def _by_table(meta: TopicMetadata, current: TableState, epoch: int) -> tuple[Diff, list[npt.NDArray[np.bool_]]]:
    """The difference from the whole table of ``epoch`` against every live row."""
    plan = plan_latest(meta, as_of=epoch)
    columns: list[IdColumns] = [c.segment.open(meta).record_id_columns(c.records) for c in plan.chosen]
    keys = IdKeys.fitting(columns + [d.ids for d in current.data])
    chosen = [(c, keys(ids)) for c, ids in zip(plan.chosen, columns, strict=True)]
    del columns
    wanted = np.concatenate([ids for _, ids in chosen]) if chosen else keys((np.empty(0, np.uint64),) * 3)
    wanted.sort()
    have = current.live_ids(keys)
    have.sort()
    diff = Diff(rows=plan.rows)
    for c, ids in chosen:
        keep = ~_member(ids, have)
        if keep.any():
            diff.added.append(Chosen(c.segment, c.records[keep]))
    gone = [~d.deleted & ~_member(keys(d.ids), wanted) for d in current.data]
    diff.deleted_rows = sum(int(np.count_nonzero(g)) for g in gone)
    return diff, gone


def _place(diff: Diff, current: TableState, gone: list[npt.NDArray[np.bool_]], fraction: float) -> None:
    """The rows to delete, file by file: dropped, rewritten or deleted (see the module)."""
    for d, g in zip(current.data, gone, strict=True):
        after = d.deleted | g
        if after.all():
            diff.removed.add(d.path)
        elif np.count_nonzero(after) > fraction * len(after):
            diff.rewrites.append((d.path, np.flatnonzero(~after)))
            diff.removed.add(d.path)
        elif g.any():
            diff.deletes[d.path] = np.flatnonzero(g)
    live_deletes = [(f, names) for f, names in current.deletes if not names <= diff.removed]
    diff.removed |= {str(f.file_path) for f, names in current.deletes if names <= diff.removed}
    if len(live_deletes) + bool(diff.deletes) > MAX_DELETE_FILES:
        diff.removed |= {str(f.file_path) for f, _ in live_deletes}
        for d in current.data:
            if d.path not in diff.removed and d.deleted.any():
                extra = diff.deletes.get(d.path, np.empty(0, dtype=np.int64))
                diff.deletes[d.path] = np.union1d(np.flatnonzero(d.deleted), extra)


def _rising(ids: npt.NDArray[Any]) -> bool:
    return bool(len(ids) < 2 or np.all(ids[1:] >= ids[:-1]))


def _positions(sorted_ids: npt.NDArray[Any], among: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    """Where each of ``among`` that ``sorted_ids`` holds is in it."""
    if not len(sorted_ids) or not len(among):
        return np.empty(0, dtype=np.int64)
    at = np.searchsorted(sorted_ids, among)
    inside = at < len(sorted_ids)
    at = at[inside]
    return np.asarray(at[sorted_ids[at] == among[inside]], dtype=np.int64)


def _member(ids: npt.NDArray[Any], among_sorted: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
    """Whether each of ``ids`` is in ``among_sorted`` (sorted)."""
    if not len(among_sorted):
        return np.zeros(len(ids), dtype=np.bool_)
    at = np.searchsorted(among_sorted, ids)
    at[at == len(among_sorted)] = 0
    return np.asarray(among_sorted[at] == ids, dtype=np.bool_)
