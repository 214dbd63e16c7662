"""Shale's compactor: plan, pass one, pass two, publish, garbage collection."""

from compactor.config import CompactionConfig
from compactor.durations import format_duration, parse_duration
from compactor.gc import GcReport, collect_garbage
from compactor.job import Compactor
from compactor.summary import RunSummary

__all__ = [
    "CompactionConfig",
    "Compactor",
    "GcReport",
    "RunSummary",
    "collect_garbage",
    "format_duration",
    "parse_duration",
]
