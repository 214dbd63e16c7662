"""What every command shares: a parser whose usage errors are one line, and the runner
that maps any error to one line and an exit code (``shale`` and ``compact`` alike)."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn, TextIO

from shale.compactor.settings import SettingsParser
from shale.ledger.errors import error_line, exit_code_of
from shale.ledger.storage import mask_uri

__all__ = ["METADATA_HELP", "OneLineParser", "add_topic_arguments", "run_command"]

METADATA_HELP = "where the topic's metadata lives (default: TOPIC_URI/_meta)"


def add_topic_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of a command about one topic: its URI, and ``--metadata``."""
    p.add_argument("topic", metavar="TOPIC_URI",
                   help="topic folder: a local path, file://, s3://bucket/prefix, memory://...")
    p.add_argument("--metadata", metavar="URI", default=None, help=METADATA_HELP)


class OneLineParser(SettingsParser):
    """Usage errors are one line on stderr (and exit code 2), like every other error; every
    flag also reads its ``SHALE_*`` variable (:class:`~shale.compactor.settings.SettingsParser`)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def run_command(argv: Sequence[str] | None, parser: argparse.ArgumentParser,
                out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Parse ``argv`` and run the chosen command; map errors to one line and an exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or bad usage (2)
        return int(e.code or 0)
    try:
        code: int = args.func(args, out)
        return code
    except KeyboardInterrupt:
        err.write(f"{parser.prog}: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:
        # one line, credentials masked, whatever the error
        err.write(f"{parser.prog}: error: {mask_uri(error_line(e))}\n")
        if os.environ.get("SHALE_DEBUG"):
            traceback.print_exc(file=err)
        return exit_code_of(e)
