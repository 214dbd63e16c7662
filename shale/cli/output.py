"""The one renderer: every command prints its result as text for a person or, with
``--json``, as one line of JSON (:func:`emit`).  The words come from the results
themselves (``human()``), counted in :func:`shale.settings.units.count`'s way: ``1
record``, ``2,000 records``."""

from __future__ import annotations

import json
from typing import Any, Protocol, TextIO

__all__ = ["Result", "emit", "print_json"]


class Result(Protocol):
    """What a command prints: a JSON document, or a text for a person."""

    def to_json(self) -> Any: ...

    def human(self) -> str: ...


def print_json(doc: Any, out: TextIO) -> None:
    """``doc`` as one line of strict JSON."""
    out.write(json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n")


def emit(result: Result, out: TextIO, as_json: bool) -> None:
    """``result`` as one JSON line (``--json``) or as its text."""
    if as_json:
        print_json(result.to_json(), out)
    else:
        out.write(result.human() + "\n")
