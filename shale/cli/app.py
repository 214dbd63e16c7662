"""Running a command: parse, refuse what cannot work, call the command, and map whatever
it raises to one line and an exit code (:mod:`shale.cli.errors`); an interrupt to one
line and 130 (:mod:`shale.runtime.interrupts`)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Callable
from typing import Final, TextIO

from shale.cli.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, exit_code_of
from shale.ledger.errors import InvalidURIError, ShaleError, error_line
from shale.ledger.masking import mask_secrets
from shale.ledger.values import dataclass
from shale.runtime import interrupts

__all__ = ["Streams", "run_command"]


@dataclass(frozen=True, slots=True)
class Streams:
    """Where a command writes: its output, and its errors and warnings."""

    out: TextIO
    err: TextIO


Parser = argparse.ArgumentParser


def run_command(argv: list[str] | None, parser: Parser | Callable[[], Parser] | None = None,
                out: TextIO | None = None, err: TextIO | None = None, *, prog: str = "shale") -> int:
    """Parse ``argv`` (the process's own when None) and run the chosen command.  ``parser``
    is ``shale``'s by default; it may be a function that builds it, so that an interrupt
    while the commands load is handled too.  Without ``argv`` the command is the process's
    own, which ignores interrupts once its outcome is decided."""
    out = out or sys.stdout
    err = err or sys.stderr
    with interrupts.handled(prog, owner=argv is None):
        try:
            if parser is None:
                from shale.cli.parsing import build_parser

                parser = build_parser
            built = parser if isinstance(parser, argparse.ArgumentParser) else parser()
            return _run(argv, built, Streams(out, err))
        except KeyboardInterrupt as e:
            err.write(f"{prog}: interrupted{': ' + str(e) if str(e) else ''}\n")
            return EXIT_INTERRUPTED
        finally:
            interrupts.outcome_decided()


def _run(argv: list[str] | None, parser: Parser, io: Streams) -> int:
    from shale.cli.parsing import UsageError, parse

    try:
        with contextlib.redirect_stdout(io.out) if io.out is not sys.stdout else contextlib.nullcontext():
            args = parse(parser, argv, os.environ)  # type: ignore[arg-type]  # (a OneLineParser)
    except UsageError as e:
        io.err.write(f"{e}\n")
        return EXIT_USAGE
    except SystemExit as e:  # --help
        return int(e.code or EXIT_OK)
    try:
        check_storage(args)
        code: int = command_function(args.command)(args, io)
        return code
    except BrokenPipeError:
        return EXIT_OK
    except Exception as e:
        # one line, credentials masked, whatever the error
        io.err.write(f"{parser.prog}: error: {mask_secrets(error_line(e))}\n")
        if os.environ.get("SHALE_DEBUG"):
            # every exception of the chain, each text masked (a library's own text may name
            # an endpoint URL with its password)
            import traceback

            io.err.write(mask_secrets(traceback.format_exc()))
        return exit_code_of(e)


def command_function(name: str) -> Callable[[argparse.Namespace, Streams], int]:
    """The function that runs the command ``name`` (imported now)."""
    from shale.cli.commands import COMMAND_TABLE

    module, _, function = COMMAND_TABLE[name].run.partition(":")
    run: Callable[[argparse.Namespace, Streams], int] = getattr(importlib.import_module(module), function)
    return run


#: The settings that name storage a command reads or writes, and whether each names a
#: topic (or a folder of topics) rather than its metadata.
_STORAGE: Final = (("topic", True), ("topics", True), ("all", True), ("prefix", True), ("metadata", False))


def check_storage(args: argparse.Namespace) -> None:
    """Refuse, in one line naming it (exit 2), a URI a command cannot work with: one that
    does not resolve, storage that lives in one process (``memory://``: a command's topics
    outlive it; the Python API keeps it), or a local file given as a topic.  ``compact``'s
    topics are each refused on their own, in their summaries, so that one bad topic does
    not stop the others; in-process storage stops the run."""
    from shale.metadata.layout import refuse_a_file
    from shale.storage import require, resolve

    for dest, is_topic in _STORAGE:
        given = getattr(args, dest, None)
        for uri in ([given] if isinstance(given, str) else given or []):
            try:
                loc = resolve(uri)
            except Exception as e:
                if dest == "topics":
                    continue  # (its run fails, alone)
                if isinstance(e, ShaleError):
                    raise
                # whatever else a URI makes go wrong is still a bad URI
                raise InvalidURIError(f"URI {mask_secrets(uri)!r} cannot be used: {error_line(e)}") from None
            require(loc, "shared_between_processes", "a command",
                    hint=f"{loc.store.scheme}:// storage lives only as long as the process that made it; "
                    "use a folder or s3://")
            if is_topic and dest != "topics":
                refuse_a_file(loc)
