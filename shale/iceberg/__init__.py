"""The compacted view as an Apache Iceberg table (``pip install 'shale[iceberg]'``).

:func:`sync_table` brings a topic's table to its published epoch, one Iceberg snapshot
per epoch, incrementally (:mod:`shale.iceberg.sync`); :class:`IcebergTarget` names the
catalog, the table and the warehouse (:mod:`shale.iceberg.catalog`).  pyiceberg is
imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shale.iceberg.catalog import IcebergTarget
    from shale.iceberg.sync import SyncResult, sync_table

__all__ = ["IcebergTarget", "SyncResult", "sync_table"]

_HOMES = {"IcebergTarget": "catalog", "SyncResult": "sync", "sync_table": "sync"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'shale.iceberg' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"shale.iceberg.{home}"), name)
    globals()[name] = value
    return value
