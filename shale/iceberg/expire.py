"""Iceberg snapshots follow Shale's: a snapshot whose epoch the topic no longer retains
(``snapshot-retention``, ``snapshot-retention-age``, tags) is expired, and the files only
expired snapshots read are removed.

A snapshot is expired once it was replaced at least ``grace_ms`` ago (the gc grace a
compaction run has: a query that began on it has that long to finish), never the current
one, never one a branch or tag of the table points at.  The files removed are those the
expired snapshots read (their manifest lists, manifests, data and delete files) and no kept
snapshot reads: a kept snapshot never loses a file.  Old ``metadata.json`` files are
removed by the catalog's commit itself (``write.metadata.delete-after-commit.enabled``).

Files no snapshot names that a commit left behind (a writer killed between writing its
files and committing them) are removed by :func:`remove_orphans` once they are older than
the orphan grace, which a live writer never takes that long to pass: only files of the
table's own ``data`` and ``metadata`` folders (never below them, where a table named inside
this one would keep its own), and only the kinds of file a commit writes.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from shale.iceberg.state import snapshot_epoch
from shale.metadata.state import CompactionState

if TYPE_CHECKING:
    from pyiceberg.io import FileIO
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

__all__ = ["expire_snapshots", "files_of", "remove_orphans"]

#: What a commit writes: data and delete files, manifests and manifest lists, metadata.
_KINDS = (".parquet", ".avro", ".metadata.json")


def files_of(io: FileIO, snapshot: Snapshot) -> set[str]:
    """Every file a read of ``snapshot`` opens: its manifest list, its manifests, and the
    data and delete files they hold live."""
    out = {snapshot.manifest_list}
    for manifest in snapshot.manifests(io):
        out.add(manifest.manifest_path)
        out.update(e.data_file.file_path for e in manifest.fetch_manifest_entry(io, discard_deleted=True))
    return out


def _expirable(table: Table, state: CompactionState, now_ms: int, grace_ms: int) -> list[Snapshot]:
    """The snapshots to expire (see the module)."""
    meta = table.metadata
    current = table.current_snapshot()
    kept_epochs = set(state.retained_epochs) | set(state.tags.values())
    pinned = {ref.snapshot_id for ref in meta.refs.values()}
    snapshots = sorted(meta.snapshots, key=lambda s: (s.sequence_number or 0, s.timestamp_ms))
    out = []
    for s, after in itertools.pairwise(snapshots):
        if (current is not None and s.snapshot_id == current.snapshot_id) or s.snapshot_id in pinned:
            continue
        if snapshot_epoch(s) in kept_epochs:
            continue
        if now_ms - after.timestamp_ms >= grace_ms:
            out.append(s)
    return out


def expire_snapshots(table: Table, state: CompactionState, *, grace_ms: int, now_ms: int | None = None
                     ) -> tuple[int, int]:
    """Expire what :func:`_expirable` finds and remove the files only it read: how many
    snapshots were expired and files removed."""
    import time

    now = int(time.time() * 1000) if now_ms is None else now_ms
    gone = _expirable(table, state, now, grace_ms)
    if not gone:
        return 0, 0
    io = table.io
    ids = {s.snapshot_id for s in gone}
    kept: set[str] = set()
    for s in table.metadata.snapshots:
        if s.snapshot_id not in ids:
            kept |= files_of(io, s)
    dropped: set[str] = set()
    for s in gone:
        dropped |= files_of(io, s)
    table.maintenance.expire_snapshots().by_ids(sorted(ids)).commit()
    removed = 0
    for path in sorted(dropped - kept):
        try:
            io.delete(path)
            removed += 1
        except FileNotFoundError:
            pass
    return len(gone), removed


def remove_orphans(table: Table, *, grace_ms: int, now_ms: int | None = None) -> int:
    """Remove the files of the table's ``data`` and ``metadata`` folders that no snapshot
    and no kept metadata file names, older than ``grace_ms`` (see the module): how many."""
    import time

    from pyarrow.fs import FileSelector, FileType

    io = table.io
    locate, fs_of = getattr(io, "parse_location", None), getattr(io, "fs_by_scheme", None)
    if locate is None or fs_of is None:  # (a FileIO that cannot list: nothing is removed)
        return 0
    now = int(time.time() * 1000) if now_ms is None else now_ms
    named = {str(table.metadata_location), *(str(e.metadata_file) for e in table.metadata.metadata_log)}
    for s in table.metadata.snapshots:
        named |= files_of(io, s)
    keep = {locate(p)[2] for p in named}
    scheme, netloc, root = locate(table.location())
    fs = fs_of(scheme, netloc)
    removed = 0
    for folder in ("data", "metadata"):
        for info in fs.get_file_info(FileSelector(f"{root.rstrip('/')}/{folder}", allow_not_found=True)):
            if info.type != FileType.File or info.path in keep or not info.path.endswith(_KINDS):
                continue
            if info.mtime is None or now - int(info.mtime.timestamp() * 1000) < grace_ms:
                continue
            fs.delete_file(info.path)
            removed += 1
    return removed
