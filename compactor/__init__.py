"""Shale's compactor: plan, pass one, pass two, publish, garbage collection.

The names below are imported on first use, so that a module of the package (the
``compact`` command's) can be imported without loading the whole compactor first: the
command then handles a Ctrl-C that comes while its modules load.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shale.compactor.config import CompactionConfig
    from shale.compactor.gc import GcReport, collect_garbage
    from shale.compactor.job import Compactor
    from shale.compactor.run_many import RunEvent, compact_topics
    from shale.compactor.summary import RunSummary
    from shale.compactor.units import format_duration, format_size, parse_duration, parse_size

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

_HOMES = {"CompactionConfig": "config", "GcReport": "gc", "collect_garbage": "gc", "Compactor": "job",
          "RunEvent": "run_many", "compact_topics": "run_many", "RunSummary": "summary", "format_duration": "units",
          "format_size": "units", "parse_duration": "units", "parse_size": "units"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'shale.compactor' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"shale.compactor.{home}"), name)
    globals()[name] = value
    return value
