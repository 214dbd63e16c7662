"""What every command shares: a parser whose usage errors are one line, and the runner
that maps any error to one line and an exit code (``shale`` and ``compact`` alike)."""

from __future__ import annotations

import argparse
import os
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Final, NoReturn, TextIO

from shale.compactor import interrupts
from shale.compactor.settings import SettingsParser
from shale.compactor.units import parse_duration, parse_size
from shale.ledger.codecs import DEFAULT_COMPRESSION, Compression, parse_compression
from shale.ledger.errors import InvalidInputError, ShaleError, error_line, exit_code_of
from shale.ledger.masking import mask_secrets
from shale.storage import require, resolve

__all__ = ["COMPRESSION_HELP", "METADATA_HELP", "MIN_RATE", "OneLineParser", "add_topic_arguments",
           "compression_arg", "duration_arg", "positive_size_arg", "rate_arg", "run_command", "size_arg"]

METADATA_HELP = "where the topic's metadata lives (default: TOPIC_URI/_meta)"


def add_topic_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of a command about one topic: its URI, and ``--metadata``."""
    p.add_argument("topic", metavar="TOPIC_URI",
                   help="topic folder: a local path, file://, s3://bucket/prefix, memory://...")
    p.add_argument("--metadata", metavar="URI", default=None, help=METADATA_HELP)


def size_arg(text: str) -> int:
    """A size flag's value (``64MiB``, ``1GB``: :func:`~shale.compactor.units.parse_size`)."""
    try:
        return parse_size(text)
    except InvalidInputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def positive_size_arg(text: str) -> int:
    """A size of at least one byte."""
    value = size_arg(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1 byte")
    return value


#: The lowest byte rate a throttle flag takes: below it a run of any size would take days
#: (8 MiB, one ranged read, takes two minutes at this rate).
MIN_RATE: Final = 64 << 10


def rate_arg(text: str) -> int:
    """A byte rate per second: 0 (no limit), or at least :data:`MIN_RATE`."""
    value = size_arg(text)
    if 0 < value < MIN_RATE:
        raise argparse.ArgumentTypeError(f"{text!r} is below the lowest rate, 64KiB per second (0: no limit)")
    return value


def duration_arg(text: str) -> int:
    """A duration flag's value in milliseconds (``30s``, ``1h30m``, ``PT1H``:
    :func:`~shale.compactor.units.parse_duration`)."""
    try:
        return parse_duration(text)
    except InvalidInputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def compression_arg(text: str) -> Compression:
    """A compression flag's value (``none``, ``lz4``, ``zstd``, ``zstd:3``, ``zstd-dict``)."""
    try:
        return parse_compression(text)
    except InvalidInputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


#: The help of every --compression flag.
COMPRESSION_HELP = ("none, lz4, zstd (level 1), zstd:LEVEL (1-22), or zstd-dict[:LEVEL] (zstd with the topic's "
                    "newest trained dictionary: shale dictionary --train); default: the topic's compression policy, "
                    f"else {DEFAULT_COMPRESSION}")


class OneLineParser(SettingsParser):
    """Usage errors are one line on stderr (and exit code 2), like every other error; every
    flag also reads its ``SHALE_*`` variable (:class:`~shale.compactor.settings.SettingsParser`)."""

    def error(self, message: str) -> NoReturn:
        # a value thousands of characters long (a pasted id, a number of 5,000 digits) is cut short
        message = _LONG_WORD.sub(lambda m: m.group(0)[:197] + "...", mask_secrets(message))
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


_LONG_WORD: Final = re.compile(r"[^\s'\"]{201,}")


#: The arguments that name storage a command reads or writes.
_STORAGE_ARGUMENTS: Final = ("topic", "topics", "all_prefix", "prefix", "metadata")


def refuse_in_process_storage(args: argparse.Namespace) -> None:
    """A command's topics outlive it: storage that lives in one process (``memory://``)
    is refused in one line (exit 2); the Python API keeps it."""
    for dest in _STORAGE_ARGUMENTS:
        given = getattr(args, dest, None)
        for uri in ([given] if isinstance(given, str) else given or []):
            try:
                loc = resolve(uri)
            except ShaleError:
                continue  # the command itself says what is wrong with it, where it should
            require(loc, "shared_between_processes", "a command",
                    hint=f"{loc.store.scheme}:// storage lives only as long as the process that made it; "
                    "use a folder or s3://")


def run_command(argv: Sequence[str] | None, parser: argparse.ArgumentParser | Callable[[], argparse.ArgumentParser],
                out: TextIO | None = None, err: TextIO | None = None, *, prog: str = "") -> int:
    """Parse ``argv`` and run the chosen command; map errors to one line and an exit code,
    and an interrupt to one line and 130 (:mod:`~shale.compactor.interrupts`).  ``parser``
    may be a function that builds it, so that an interrupt while it imports the commands
    is handled too; ``prog`` names the command until it is built.  Without ``argv`` the
    command is the process's own, which ignores interrupts once its outcome is decided."""
    out = out or sys.stdout
    err = err or sys.stderr
    name = prog or getattr(parser, "prog", "") or "shale"
    with interrupts.handled(name, owner=argv is None):
        try:
            return _run(argv, parser if isinstance(parser, argparse.ArgumentParser) else parser(), out, err)
        except KeyboardInterrupt as e:
            err.write(f"{name}: interrupted{': ' + str(e) if str(e) else ''}\n")
            return interrupts.EXIT_INTERRUPTED
        finally:
            interrupts.outcome_decided()


def _run(argv: Sequence[str] | None, parser: argparse.ArgumentParser, out: TextIO, err: TextIO) -> int:
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or bad usage (2)
        return int(e.code or 0)
    try:
        refuse_in_process_storage(args)
        code: int = args.func(args, out)
        return code
    except BrokenPipeError:
        return 0
    except Exception as e:
        # one line, credentials masked, whatever the error
        err.write(f"{parser.prog}: error: {mask_secrets(error_line(e))}\n")
        if os.environ.get("SHALE_DEBUG"):
            # every exception of the chain, each text masked (a library's own text may name
            # an endpoint URL with its password)
            err.write(mask_secrets(traceback.format_exc()))
        return exit_code_of(e)
