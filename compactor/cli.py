"""The ``compact`` console script's entry point (``shale.compactor.cli:main``): the command
itself is :func:`shale.cli.compact_main`."""

from __future__ import annotations

import sys

try:  # a Ctrl-C while the command's modules load ends it as at any other time: one line, 130
    from shale.cli import build_compact_parser, compact_main
except KeyboardInterrupt:
    sys.stderr.write("compact: interrupted\n")
    raise SystemExit(130) from None

__all__ = ["build_compact_parser", "main"]

main = compact_main

if __name__ == "__main__":
    sys.exit(main())
