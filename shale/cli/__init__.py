"""The command line: ``shale`` (every command) and ``compact``.

Each command parses its settings (made from :mod:`shale.settings`), calls one library
function and renders what it returns (:mod:`shale.cli.output`); errors become one line
and an exit code (:mod:`shale.cli.errors`).  This module imports nothing heavy, so that a
Ctrl-C while the rest loads is one line and exit code 130 like at any other time.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shale.cli.parsing import OneLineParser

__all__ = ["build_compact_parser", "build_parser", "compact_main", "main", "run_command"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``shale`` console script."""
    return _main("shale", argv, None)


def compact_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``compact`` console script."""
    return _main("compact", argv, "compact")


def _set_up_process() -> None:
    # Shale never calls BLAS, but NumPy's OpenBLAS starts a thread per core when NumPy is
    # imported, and each spins for a while before it sleeps: on a small machine that takes
    # a core from the run (bench/README.md).  One thread, unless the environment says
    # otherwise; set by the commands alone, before anything imports NumPy (the processes
    # the command starts, forked workers and Spark's, inherit it), never by an import.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _main(prog: str, argv: Sequence[str] | None, command: str | None) -> int:
    _set_up_process()
    try:
        from shale.cli.app import run_command
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        return 130

    def parser() -> OneLineParser:
        from shale.cli.parsing import build_compact_parser, build_parser

        if command == "compact":
            return build_compact_parser()
        # the command is the first argument that is not an option (``shale`` itself takes only --help)
        chosen = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), "")
        return build_parser(chosen)

    code = run_command(None if argv is None else list(argv), parser, prog=prog)
    sys.stdout.flush()
    return code if code in range(256) else 1


def __getattr__(name: str) -> Any:
    # run_command and the parsers, for in-process use (tests, embedding), loaded on first use
    if name == "run_command":
        from shale.cli.app import run_command

        return run_command
    if name in ("build_parser", "build_compact_parser"):
        from shale.cli import parsing

        return getattr(parsing, name)
    raise AttributeError(f"module 'shale.cli' has no attribute {name!r}")
