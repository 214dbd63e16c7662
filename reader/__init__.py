"""The consumer library: read a topic in full or through its compacted view.

The table view and the topic reader are imported on first use, so that a lookup of one
key (``shale get``) does not load them (nor Arrow's glue and its thread pool).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# (imported now: the function shares its module's name, which the import of the module
# would otherwise bind here)
from shale.reader.lookup import Lookup, lookup

if TYPE_CHECKING:
    from shale.reader.batches import MessageBatch
    from shale.reader.table import Listener, TableView
    from shale.reader.topic_reader import EARLIEST, LATEST, Position, TopicReader, parse_position, parse_start

__all__ = ["EARLIEST", "LATEST", "Listener", "Lookup", "MessageBatch", "Position", "TableView", "TopicReader", "lookup",
           "parse_position", "parse_start"]

_HOMES = {"Listener": "table", "TableView": "table", "MessageBatch": "batches",
          **dict.fromkeys(("EARLIEST", "LATEST", "Position", "TopicReader", "parse_position", "parse_start"),
                          "topic_reader")}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'shale.reader' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"shale.reader.{home}"), name)
    globals()[name] = value
    return value
