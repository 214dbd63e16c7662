"""The files a commit writes into the table's data folder: Parquet data files, rolled at
a target size, and Parquet position-delete files (Iceberg v2).

Both go through pyiceberg's Parquet writer, so their column statistics (the bounds a
reader prunes by, a delete file's ``file_path`` bounds included) are the ones every
Iceberg reader expects.  Every file written is remembered (:class:`FileWriter`'s ``written``) so
that a commit that does not land removes them: nothing is left that no snapshot names.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

__all__ = ["DELETE_SCHEMA_FIELDS", "TARGET_FILE_BYTES", "FileWriter"]

#: Arrow bytes a data file holds before the next is begun (Parquet's, compressed, are
#: a few times fewer): small enough that rewriting one whose rows were mostly deleted is
#: cheap, big enough that a 2-million-key view is a handful of files.
TARGET_FILE_BYTES: Final = 128 << 20
#: The reserved field ids of a position-delete file's columns (the Iceberg spec's).
DELETE_SCHEMA_FIELDS: Final = ((2147483546, "file_path"), (2147483545, "pos"))


def _delete_schema() -> Any:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    return Schema(NestedField(2147483546, "file_path", StringType(), required=True),
                  NestedField(2147483545, "pos", LongType(), required=True))


class FileWriter:
    """Writes a commit's files under ``table``'s data location (see the module)."""

    def __init__(self, table: Table, target_bytes: int = TARGET_FILE_BYTES) -> None:
        from pyiceberg.table.locations import load_location_provider

        self._table = table
        self._io = table.io
        self._meta = table.metadata
        self._locations = load_location_provider(table.metadata.location, table.metadata.properties)
        self._target = target_bytes
        self._uuid = uuid.uuid4()
        self._count = 0
        self.written: list[str] = []

    def _new_path(self, kind: str) -> str:
        self._count += 1
        return str(self._locations.new_data_location(f"{kind}-{self._uuid}-{self._count:05d}.parquet"))

    def _data_file(self, path: str, size: int, stats: Any, content: Any) -> DataFile:
        from pyiceberg.manifest import DataFile, FileFormat
        from pyiceberg.typedef import Record

        return DataFile.from_args(content=content, file_path=path, file_format=FileFormat.PARQUET,
                                  partition=Record(), file_size_in_bytes=size, sort_order_id=None,
                                  spec_id=self._meta.default_spec_id, equality_ids=None, key_metadata=None,
                                  **stats.to_serialized_dict())

    def data_files(self, tables: Iterable[pa.Table]) -> list[DataFile]:
        """``tables`` (rows in the table's Arrow schema) as data files of about the target
        size each, in the order given."""
        from pyiceberg.io.pyarrow import ParquetFormatModel
        from pyiceberg.manifest import DataFileContent

        out: list[DataFile] = []
        writer: Any = None
        held = 0
        path = ""
        output: Any = None
        schema = self._meta.schema()
        for t in tables:
            if not t.num_rows:
                continue
            if writer is None:
                path = self._new_path("data")
                self.written.append(path)
                output = self._io.new_output(path)
                writer = ParquetFormatModel().create_writer(output, schema, self._meta.properties)
                held = 0
            writer.write(t)
            held += t.nbytes
            if held >= self._target:
                out.append(self._finish(path, output, writer, DataFileContent.DATA))
                writer = None
        if writer is not None:
            out.append(self._finish(path, output, writer, DataFileContent.DATA))
        return out

    def _finish(self, path: str, output: Any, writer: Any, content: Any) -> DataFile:
        stats = writer.close()  # (the file's size is known once it is closed)
        return self._data_file(path, len(output), stats, content)

    def delete_file(self, deletes: dict[str, npt.NDArray[np.int64]]) -> DataFile | None:
        """One position-delete file removing, of each data file named, the rows at the
        positions given (None: nothing to delete).  Rows are sorted by path, then position,
        as the spec requires."""
        import pyarrow as pa
        from pyiceberg.io.pyarrow import ParquetFormatModel, schema_to_pyarrow
        from pyiceberg.manifest import DataFileContent

        deletes = {p: v for p, v in deletes.items() if len(v)}
        if not deletes:
            return None
        paths = sorted(deletes)
        schema = _delete_schema()
        arrow = schema_to_pyarrow(schema)
        table = pa.Table.from_arrays(
            [pa.array(np.repeat(np.array(paths, dtype=object), [len(deletes[p]) for p in paths]), pa.large_string()),
             pa.array(np.concatenate([np.sort(deletes[p]) for p in paths]).astype(np.int64))], schema=arrow)
        path = self._new_path("deletes")
        self.written.append(path)
        output = self._io.new_output(path)
        writer = ParquetFormatModel().create_writer(output, schema, {})
        writer.write(table)
        return self._finish(path, output, writer, DataFileContent.POSITION_DELETES)

    def remove_written(self) -> None:
        """Remove every file written (a commit that did not land): best effort."""
        for path in self.written:
            try:
                self._io.delete(path)
            except Exception:  # a file that cannot be removed is an orphan, never read
                pass
        self.written.clear()
