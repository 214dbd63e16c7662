"""One Iceberg snapshot from the files a commit wrote: new data files, new position-delete
files, and the files it removes (data files rewritten, delete files merged).

pyiceberg's own ``upsert``, ``delete`` and ``overwrite`` rewrite every data file a change
touches (copy-on-write) and it writes no position deletes, so Shale makes the snapshot
itself, through pyiceberg's snapshot machinery (:class:`_ShaleSnapshot`, a snapshot
producer): the new data files in a data manifest, the new delete files in a delete
manifest, every manifest of the parent kept as it is unless it names a removed file (then
written again, the removed ones marked deleted), one manifest list, one catalog commit
whose requirement is that the branch still points at the parent.

A commit that finds the table changed since it read it is not retried blindly:
pyiceberg's retry would apply deletes worked out against a snapshot that is no longer
current.  :func:`commit_snapshot` raises :class:`~shale.ledger.errors.ConflictError`, and
the caller reads the table again and decides anew (:mod:`shale.iceberg.sync`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from shale.ledger.errors import ConflictError

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile, ManifestFile
    from pyiceberg.table import Table

__all__ = ["commit_snapshot"]


def _producer_class() -> Any:
    """The snapshot producer, made on first use (pyiceberg is optional)."""
    from pyiceberg.manifest import (
        ManifestContent,
        ManifestEntry,
        ManifestEntryStatus,
        ManifestWriterV2,
    )
    from pyiceberg.table.snapshots import SnapshotSummaryCollector, Summary, update_snapshot_summaries
    from pyiceberg.table.update import UpdateTableMetadata
    from pyiceberg.table.update.snapshot import _SnapshotProducer

    class _DeleteManifestWriter(ManifestWriterV2):  # type: ignore[misc]
        """A v2 manifest of delete files (pyiceberg writes data manifests only)."""

        def content(self) -> Any:
            return ManifestContent.DELETES

        @property
        def _meta(self) -> dict[str, str]:
            return {**super()._meta, "content": "deletes"}

    class _ShaleSnapshot(_SnapshotProducer):  # type: ignore[misc,type-arg]
        def __init__(self, operation: Any, transaction: Any, io: Any, delete_files: list[DataFile],
                     removed: frozenset[str], properties: Mapping[str, str]) -> None:
            super().__init__(operation, transaction, io, snapshot_properties=dict(properties))
            self._new_deletes = delete_files
            self._removed = removed
            self._removed_files: list[DataFile] = []

        def _writer(self, content: Any) -> Any:
            spec = self._transaction.table_metadata.spec()
            cls = _DeleteManifestWriter if content == ManifestContent.DELETES else ManifestWriterV2
            return cls(spec, self.schema(), self.new_manifest_output(), self._snapshot_id, self._compression)

        def _existing_manifests(self) -> list[ManifestFile]:
            if self._parent_snapshot_id is None:
                return []
            parent = self._transaction.table_metadata.snapshot_by_id(self._parent_snapshot_id)
            out = []
            for manifest in parent.manifests(io=self._io):
                entries = manifest.fetch_manifest_entry(io=self._io, discard_deleted=True)
                gone = [e for e in entries if e.data_file.file_path in self._removed]
                if not gone:
                    if entries:
                        out.append(manifest)
                    continue
                self._removed_files.extend(e.data_file for e in gone)
                with self._writer(manifest.content) as writer:
                    for e in entries:
                        if e.data_file.file_path in self._removed:
                            writer.delete(e)
                        else:
                            writer.existing(e)
                out.append(writer.to_manifest_file())
            return out

        def _deleted_entries(self) -> list[ManifestEntry]:
            return []  # (marked deleted in the manifests they were in: _existing_manifests)

        def _process_manifests(self, manifests: list[ManifestFile]) -> list[ManifestFile]:
            if not self._new_deletes:
                return manifests
            with self._writer(ManifestContent.DELETES) as writer:
                for f in self._new_deletes:
                    writer.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=self._snapshot_id,
                                                       data_file=f))
            return [*manifests, writer.to_manifest_file()]

        def _summary(self, snapshot_properties: Mapping[str, str] = {}) -> Summary:  # noqa: B006
            meta = self._transaction.table_metadata
            ssc = SnapshotSummaryCollector()
            for f in [*self._added_data_files, *self._new_deletes]:
                ssc.add_file(f, partition_spec=meta.spec(), schema=meta.schema())
            for f in self._removed_files:
                ssc.remove_file(f, partition_spec=meta.specs()[f.spec_id], schema=meta.schema())
            parent = meta.snapshot_by_id(self._parent_snapshot_id) if self._parent_snapshot_id is not None else None
            return update_snapshot_summaries(
                summary=Summary(operation=self._operation, **ssc.build(), **snapshot_properties),
                previous_summary=parent.summary if parent is not None else None)

        def commit(self) -> None:
            # Not registered for pyiceberg's retry: a conflict is decided again by the caller.
            UpdateTableMetadata.commit(self)

    return _ShaleSnapshot


_PRODUCER: Any = None


def commit_snapshot(table: Table, data_files: list[DataFile], delete_files: list[DataFile],
                    removed: frozenset[str], properties: Mapping[str, str]) -> Table:
    """Commit one snapshot adding ``data_files`` and ``delete_files`` and removing the
    files at the paths ``removed``, its summary carrying ``properties``; the table as
    committed.  :class:`~shale.ledger.errors.ConflictError` when the table changed since
    ``table`` was read (nothing of this commit is then in it)."""
    global _PRODUCER
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.table.snapshots import Operation

    if _PRODUCER is None:
        _PRODUCER = _producer_class()
    if removed or delete_files:
        operation = Operation.OVERWRITE if data_files else Operation.DELETE
    else:
        operation = Operation.APPEND
    txn = table.transaction()
    producer = _PRODUCER(operation, txn, table.io, delete_files, removed, properties)
    for f in data_files:
        producer.append_data_file(f)
    try:
        producer.commit()
        committed: Table = txn.commit_transaction()
    except CommitFailedException as e:
        producer._clean_all_uncommitted()
        raise ConflictError(f"the Iceberg table changed while a commit was made: {e}") from e
    return committed
