"""Shale's compactor: plan, pass one, pass two, publish, garbage collection.

The names below are imported on first use, so that a module of the package (the
``compact`` command's) can be imported without loading the whole compactor first: the
command then handles a Ctrl-C that comes while its modules load.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shale.compactor.config import CompactionConfig
    from shale.compactor.job import Compactor
    from shale.compactor.run_many import RunEvent, compact_topics
    from shale.compactor.summary import RunSummary
    from shale.compactor.units import format_duration, format_size, parse_duration, parse_size
    from shale.maintenance.gc import GcReport, collect_garbage

__all__ = [
    "CompactionConfig",
    "Compactor",
    "GcReport",
    "RunEvent",
    "RunSummary",
    "collect_garbage",
    "compact_topics",
    "format_duration",
    "format_size",
    "parse_duration",
    "parse_size",
]

_HOMES = {"CompactionConfig": "compactor.config", "GcReport": "maintenance.gc", "collect_garbage": "maintenance.gc",
          "Compactor": "compactor.job", "RunEvent": "compactor.run_many", "compact_topics": "compactor.run_many",
          "RunSummary": "compactor.summary", "format_duration": "compactor.units", "format_size": "compactor.units",
          "parse_duration": "compactor.units", "parse_size": "compactor.units"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'shale.compactor' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"shale.{home}"), name)
    globals()[name] = value
    return value
