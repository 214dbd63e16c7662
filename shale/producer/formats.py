"""The input formats of ``shale produce``, told apart by the input file's name (a module
of its own, without NumPy: the command picks the format before it imports the writer)."""

from __future__ import annotations

import os
from typing import Final

__all__ = ["FORMATS", "format_of"]

#: What ``shale produce --format`` reads.
FORMATS: Final = ("jsonl", "parquet", "arrow", "csv")

_BY_SUFFIX: Final = {".parquet": "parquet", ".pq": "parquet", ".arrow": "arrow", ".feather": "arrow",
                     ".ipc": "arrow", ".arrows": "arrow", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl",
                     ".ndjson": "jsonl"}

def format_of(path: str | None) -> str:
    """The input format a file name suggests (JSON lines when it suggests none)."""
    if not path or path == "-":
        return "jsonl"
    return _BY_SUFFIX.get(os.path.splitext(path)[1].lower(), "jsonl")
