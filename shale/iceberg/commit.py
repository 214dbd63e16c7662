"""One Iceberg snapshot from the files a commit wrote: new data files, new position-delete
files, and the files it removes (data files rewritten, delete files merged).

pyiceberg's own ``upsert``, ``delete`` and ``overwrite`` rewrite every data file a change
touches (copy-on-write) and it writes no position deletes, so Shale makes the snapshot
itself, through pyiceberg's snapshot machinery (:class:`~shale.iceberg._producer.ShaleSnapshot`, a
snapshot producer): the new data files in a data manifest, the new delete files in a delete
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
from typing import TYPE_CHECKING

from shale.ledger.errors import ConflictError

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

__all__ = ["commit_snapshot"]


def commit_snapshot(table: Table, data_files: list[DataFile], delete_files: list[DataFile],
                    removed: frozenset[str], properties: Mapping[str, str]) -> Table:
    """Commit one snapshot adding ``data_files`` and ``delete_files`` and removing the
    files at the paths ``removed``, its summary carrying ``properties``; the table as
    committed.  :class:`~shale.ledger.errors.ConflictError` when the table changed since
    ``table`` was read (nothing of this commit is then in it)."""
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.table.snapshots import Operation

    from shale.iceberg._producer import ShaleSnapshot

    if removed or delete_files:
        operation = Operation.OVERWRITE if data_files else Operation.DELETE
    else:
        operation = Operation.APPEND
    txn = table.transaction()
    producer = ShaleSnapshot(operation, txn, table.io, delete_files, removed, properties)
    for f in data_files:
        producer.append_data_file(f)
    try:
        producer.commit()
        committed: Table = txn.commit_transaction()
    except CommitFailedException as e:
        producer._clean_all_uncommitted()
        raise ConflictError(f"the Iceberg table changed while a commit was made: {e}") from e
    return committed
