"""The ``compact`` console script's entry point (``shale.compactor.cli:main``): the command
itself is :func:`shale.cli.compact_main`.  Importing this module imports nothing heavy (no
NumPy): the command sets up its process first."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

try:  # a Ctrl-C while the command's modules load ends it as at any other time: one line, 130
    from shale.cli import compact_main
except KeyboardInterrupt:
    sys.stderr.write("compact: interrupted\n")
    raise SystemExit(130) from None

if TYPE_CHECKING:
    from shale.cli import build_compact_parser

__all__ = ["build_compact_parser", "main"]

main = compact_main


def __getattr__(name: str) -> Any:
    # the command's parser, for in-process use (tests, embedding), loaded on first use
    if name == "build_compact_parser":
        from shale import cli

        return cli.build_compact_parser
    raise AttributeError(f"module 'shale.compactor.cli' has no attribute {name!r}")


if __name__ == "__main__":
    sys.exit(main())
