"""What a topic's Iceberg table holds now, read from the table itself.

Each commit is decided against the table as it is, not against what Shale believes it
wrote: the message ids of every data file's rows (its ``ledger``, ``entry`` and ``batch``
columns, a few bytes a row once compressed) less the rows its position-delete files
remove.  A commit that failed, one another writer made, a table rolled back by hand: the
next commit starts from what is there.

Message ids never change (compaction included), and a view holds at most one live record
per key, so the rows to delete are those whose ids the new view no longer holds, and the
rows to add those whose ids the table lacks (:class:`IdKeys`: ids as values that sort and
compare as the ids do).
"""

from __future__ import annotations

from dataclasses import field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from shale.ledger.values import dataclass

if TYPE_CHECKING:
    from pyiceberg.io import FileIO
    from pyiceberg.manifest import DataFile, ManifestFile
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

__all__ = ["DataFileState", "IdColumns", "IdKeys", "TableState", "read_state"]

#: A message id as one sortable, comparable value: ledger, entry, batch, big-endian.
_ID = np.dtype([("l", ">u8"), ("e", ">u8"), ("b", ">u4")])
#: Message ids as columns: ledgers, entries, batch indexes.
IdColumns = tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], npt.NDArray[np.uint64]]


class IdKeys:
    """Message ids as single values that sort and compare as the ids do: one 64-bit
    number each when every id given to :meth:`fitting` fits in 64 bits between them (the
    ledger's, the entry's and the batch index's bits side by side: the usual case, and
    several times faster to sort), else 20-byte strings."""

    def __init__(self, entry_bits: int, batch_bits: int, packed: bool) -> None:
        self._e, self._b, self._packed = entry_bits, batch_bits, packed

    @classmethod
    def fitting(cls, columns: list[IdColumns]) -> IdKeys:
        bits = [max((int(c[i].max()) for c in columns if len(c[i])), default=0).bit_length() for i in range(3)]
        return cls(bits[1], bits[2], sum(bits) <= 64)

    def __call__(self, ids: IdColumns) -> npt.NDArray[Any]:
        ledger, entry, batch = (c if c.dtype == np.uint64 else np.asarray(c, dtype=np.uint64) for c in ids)
        if self._packed:
            return (ledger << np.uint64(self._e + self._b)) | (entry << np.uint64(self._b)) | batch
        out = np.empty(len(ledger), dtype=_ID)
        out["l"], out["e"], out["b"] = ledger, entry, batch
        return out.view("S20").reshape(-1)


@dataclass(slots=True)
class DataFileState:
    """One live data file: its manifest entry's file, the ids of its rows in file order,
    and which of its rows the table's position deletes remove."""

    file: DataFile
    ids: IdColumns
    deleted: npt.NDArray[np.bool_]

    @property
    def path(self) -> str:
        return str(self.file.file_path)

    @property
    def live(self) -> int:
        return int(len(self.deleted) - np.count_nonzero(self.deleted))


@dataclass(slots=True)
class TableState:
    """The table's current snapshot (None: none yet), its live data files and its
    position-delete files, each with the data files it names."""

    snapshot: Snapshot | None
    data: list[DataFileState] = field(default_factory=list)
    deletes: list[tuple[DataFile, frozenset[str]]] = field(default_factory=list)
    manifests: list[ManifestFile] = field(default_factory=list)

    @property
    def epoch(self) -> int | None:
        """The Shale epoch the snapshot holds (None: none, or not written by Shale)."""
        return snapshot_epoch(self.snapshot)

    @property
    def rows(self) -> int:
        return sum(d.live for d in self.data)

    @property
    def bytes(self) -> int:
        return sum(int(d.file.file_size_in_bytes) for d in self.data) + \
            sum(int(f.file_size_in_bytes) for f, _ in self.deletes)

    def live_ids(self, keys: IdKeys) -> npt.NDArray[Any]:
        """The ids of every live row as ``keys`` makes them, in no particular order."""
        parts = [keys(d.ids)[~d.deleted] for d in self.data]
        return np.concatenate(parts) if parts else keys((np.empty(0, np.uint64),) * 3)


def snapshot_epoch(snapshot: Snapshot | None) -> int | None:
    """The ``shale.epoch`` of a snapshot's summary (None: none)."""
    if snapshot is None or snapshot.summary is None:
        return None
    text = snapshot.summary.additional_properties.get("shale.epoch")
    return int(text) if text is not None and text.isdigit() else None


def read_state(table: Table) -> TableState:
    """The table's current snapshot, read (see the module)."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return TableState(None)
    io = table.io
    manifests = snapshot.manifests(io)
    data: list[DataFile] = []
    delete_files: list[DataFile] = []
    from pyiceberg.manifest import DataFileContent

    for manifest in manifests:
        for entry in manifest.fetch_manifest_entry(io, discard_deleted=True):
            f = entry.data_file
            if f.content == DataFileContent.DATA:
                data.append(f)
            elif f.content == DataFileContent.POSITION_DELETES:
                delete_files.append(f)
            else:  # equality deletes: never Shale's
                from shale.ledger.errors import InvalidInputError

                raise InvalidInputError(f"{f.file_path} holds equality deletes: the table was not written by Shale")
    positions, deletes = _read_deletes(io, delete_files)
    states = []
    for f in sorted(data, key=lambda f: str(f.file_path)):
        ids = _read_ids(io, str(f.file_path))
        gone = np.zeros(len(ids[0]), dtype=np.bool_)
        for pos in positions.get(str(f.file_path), ()):
            gone[pos[pos < len(gone)]] = True
        states.append(DataFileState(f, ids, gone))
    return TableState(snapshot, states, deletes, list(manifests))


def _read_ids(io: FileIO, path: str) -> IdColumns:
    import pyarrow.parquet as pq

    with io.new_input(path).open() as f:
        t = pq.read_table(f, columns=["ledger", "entry", "batch"])
    # (longs that are never negative: their bits are the unsigned ids, viewed without a copy)
    ledger, entry, batch = (t.column(c).to_numpy().view(np.uint64) for c in ("ledger", "entry", "batch"))
    return ledger, entry, batch


def _read_deletes(io: FileIO, files: list[DataFile]
                  ) -> tuple[dict[str, list[npt.NDArray[np.int64]]], list[tuple[DataFile, frozenset[str]]]]:
    """Every position delete, by the data file it removes rows of, and each delete file
    with the data files it names."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    positions: dict[str, list[npt.NDArray[np.int64]]] = {}
    named = []
    for f in files:
        with io.new_input(str(f.file_path)).open() as fo:
            t = pq.read_table(fo, columns=["file_path", "pos"])
        paths = t.column("file_path")
        names = frozenset(str(p) for p in pc.unique(paths).to_pylist())
        for name in names:
            rows = t.filter(pc.equal(paths, name)).column("pos").to_numpy()
            positions.setdefault(name, []).append(np.asarray(rows, dtype=np.int64))
        named.append((f, names))
    return positions, named
