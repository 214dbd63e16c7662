"""The snapshot producer Shale commits through (pyiceberg's machinery, imported by the
first commit only: :mod:`shale.iceberg.commit` says what it does and why)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyiceberg.manifest import (
    DataFile,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriterV2,
)
from pyiceberg.table.snapshots import SnapshotSummaryCollector, Summary, update_snapshot_summaries
from pyiceberg.table.update import UpdateTableMetadata
from pyiceberg.table.update.snapshot import _SnapshotProducer

__all__ = ["ShaleSnapshot"]


class _DeleteManifestWriter(ManifestWriterV2):
    """A v2 manifest of delete files (pyiceberg writes data manifests only)."""

    def content(self) -> Any:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class ShaleSnapshot(_SnapshotProducer):  # type: ignore[type-arg]
    """One snapshot: data files added (a data manifest), position-delete files added (a
    delete manifest), the parent's manifests kept unless they name a removed file."""

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
        if parent is None:
            raise ValueError(f"the parent snapshot {self._parent_snapshot_id} is not in the table's metadata")
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

    def _summary(self, snapshot_properties: Mapping[str, str] = {}) -> Summary:
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
