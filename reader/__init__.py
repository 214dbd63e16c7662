"""The consumer library: read a topic in full or through its compacted view.

The names below are imported on first use, so that one of them (``shale get``'s lookup)
does not load the others (the table view's Arrow and thread pool)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shale.reader.lookup import Lookup, lookup
    from shale.reader.table import Listener, TableView
    from shale.reader.topic_reader import EARLIEST, LATEST, Position, TopicReader, parse_position

__all__ = ["EARLIEST", "LATEST", "Listener", "Lookup", "Position", "TableView", "TopicReader", "lookup",
           "parse_position"]

_HOMES = {"Lookup": "lookup", "lookup": "lookup", "Listener": "table", "TableView": "table",
          **dict.fromkeys(("EARLIEST", "LATEST", "Position", "TopicReader", "parse_position"), "topic_reader")}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'shale.reader' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"shale.reader.{home}"), name)
    globals()[name] = value
    return value
