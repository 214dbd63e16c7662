"""The command line's parsers, made from the settings model (:mod:`shale.settings`).

Every setting a command takes becomes its flag (or positional argument), with the
setting's help, default and ``SHALE_*`` variable in ``--help``.  Parsing takes only what
the command line gave (a flag not given is left out); :func:`parse` then hands that and
the environment to the one resolver (:func:`shale.settings.resolve`), which fills in
variables and defaults and records where each value came from.  The library is
argparse's: its help, its one-line errors (:class:`OneLineParser`), and nothing else to
learn for a new command.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any, Final, NoReturn

from shale.cli.commands import COMMAND_TABLE, EXIT_CODES
from shale.ledger.errors import InvalidInputError
from shale.ledger.masking import mask_secrets
from shale.settings import COMMANDS, POLICY_SETTINGS, Setting, Settings, resolve, settings_for

__all__ = ["OneLineParser", "UsageError", "build_compact_parser", "build_parser", "parse", "precedence_help"]

_LONG_WORD: Final = re.compile(r"[^\s'\"]{201,}")


class UsageError(Exception):
    """Bad usage, as the one line the command prints (exit code 2)."""


def _columns() -> int:
    """The terminal's width as :func:`shutil.get_terminal_size` gives it (``COLUMNS``, else
    the terminal of standard output, else 80)."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's formatter given the width it would find itself: argparse makes one for every
    flag a parser is given, and finds the width through :mod:`shutil`, which imports
    :mod:`bz2` and :mod:`lzma` (six modules, two of them compiled libraries) into every command."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position, _columns() - 2 if width is None else width)


class OneLineParser(argparse.ArgumentParser):
    """Usage errors are one line naming the command's ``--help``, like every other error;
    flags are spelt in full (an abbreviation would make where a value came from unsure)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)
        self.commands: dict[str, OneLineParser] = {}

    def error(self, message: str) -> NoReturn:
        # a value thousands of characters long (a pasted id, a number of 5,000 digits) is cut short
        message = _LONG_WORD.sub(lambda m: m.group(0)[:197] + "...", mask_secrets(message))
        raise UsageError(f"{self.prog}: error: {message} (see {self.prog} --help)")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        ns, extras = self.parse_known_args(_joined(sys.argv[1:] if args is None else args), namespace)
        if extras:  # named by the command they were given to: its --help is the one to read
            self.chosen(ns).error(f"unrecognized arguments: {' '.join(extras)}")
        return ns

    def chosen(self, ns: argparse.Namespace) -> OneLineParser:
        """The parser of the command ``ns`` is for (a sub-command's, or this one)."""
        return self.commands.get(getattr(ns, "command", ""), self)


#: A value that starts with a dash and a digit: a time before now (``-1h``), a negative count.
_DASHED: Final = re.compile(r"-[0-9]")


def _joined(args: Sequence[str]) -> list[str]:
    """``args`` with a long flag's value that starts with ``-`` and a digit joined to it
    (``--to -1h`` as ``--to=-1h``), which argparse would take for a flag of its own."""
    args = list(args)
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return out + args[i:]
        if a.startswith("--") and "=" not in a and i + 1 < len(args) and _DASHED.match(args[i + 1]):
            out.append(f"{a}={args[i + 1]}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def precedence_help(command: str) -> str:
    """What ``--help`` says about where ``command``'s settings come from."""
    policy = any(s.policy for s in settings_for(command))
    order = ("a run's flag > the topic's policy (shale config) > a SHALE_* variable > the default" if policy
             else "a flag > its SHALE_* variable > the default")
    return ("settings:\n  every flag can be set by a variable instead: SHALE_ and the flag's name in capitals with\n"
            "  underscores, named beside each flag; switches take 1/true/yes/on or 0/false/no/off, and a\n"
            "  repeatable flag's variable one value a line. An empty variable counts as unset.\n"
            f"  precedence: {order}")


def _epilog(command: str) -> str:
    parts = [f"exit codes:\n{COMMAND_TABLE[command].exit_codes}", precedence_help(command)]
    if command in ("config", "create"):
        width = max(map(len, POLICY_SETTINGS))
        parts.insert(0, "policy settings (--set NAME=VALUE):\n" + "\n".join(
            textwrap.fill(s.help, 88, initial_indent=f"  {s.name.ljust(width)}  ", subsequent_indent=" " * (width + 4))
            for s in POLICY_SETTINGS.values()))
    return "\n\n".join(parts)


def _convert(s: Setting) -> Any:
    def convert(text: str) -> Any:
        try:
            return s.kind.parse(text)
        except InvalidInputError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    convert.__name__ = s.kind.metavar.lower()
    return convert


def _help(s: Setting, command: str) -> str:
    text = s.help_of(command)
    default = s.default_shown()
    if default is not None:
        text += f" (default: {default})"
    if s.env:
        text += f" [env var: {s.variable}]"
    return text.replace("%", "%%")


def add_settings(p: argparse.ArgumentParser, command: str) -> None:
    """Add every setting ``command`` takes to ``p``, as the model says.  A setting not
    given is left off the namespace: :func:`parse` gives it its value."""
    for s in settings_for(command):
        kw: dict[str, Any] = {"help": _help(s, command), "default": argparse.SUPPRESS, "dest": s.dest}
        if s.positional:
            del kw["dest"]
            nargs = "*" if s.many else "?" if s.optional else None
            p.add_argument(s.dest, metavar=s.positional, type=_convert(s), nargs=nargs,
                           **{**kw, "default": argparse.SUPPRESS if s.many else None})
        elif s.kind.switch:
            p.add_argument(s.option, *s.aliases, action="store_true", **kw)
        else:
            p.add_argument(s.option, *s.aliases, type=_convert(s), metavar=s.metavar or s.kind.placeholder(),
                           action="append" if s.many else "store", **kw)


def build_compact_parser(prog: str = "compact") -> OneLineParser:
    """The ``compact`` command's parser."""
    c = COMMAND_TABLE["compact"]
    p = OneLineParser(prog=prog, description=c.description, epilog=_epilog("compact"))
    add_settings(p, "compact")
    p.set_defaults(command="compact")
    return p


def build_parser(only: str | None = None) -> OneLineParser:
    """The ``shale`` command's parser, with every command.  Given ``only``, the parser of
    ``argv`` whose first argument is ``only``: that command alone gets its flags, the
    others their names and summaries (all ``shale --help`` shows of them), so that running
    one command does not build a dozen parsers first."""
    p = OneLineParser(prog="shale", description="Shale: compact keyed topics stored as ledger objects on object "
                      "storage.", epilog=f"exit codes:\n{EXIT_CODES}\n\n{precedence_help('compact')}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=OneLineParser)
    for name in COMMANDS:
        c = COMMAND_TABLE[name]
        if only is not None and name != only:
            p.commands[name] = sub.add_parser(name, help=c.summary)
            continue
        cp = sub.add_parser(name, help=c.summary, description=c.description, epilog=_epilog(name))
        add_settings(cp, name)
        p.commands[name] = cp
    return p


def parse(parser: OneLineParser, argv: Sequence[str] | None, environ: Mapping[str, str]) -> argparse.Namespace:
    """``argv`` parsed and every setting resolved (flag > variable > default; a topic's
    policy comes later, where the topic is opened).  The namespace holds each setting's
    value by its identifier, and ``settings``: each with its source."""
    ns = parser.parse_args(argv)
    command: str = ns.command
    chosen = parser.chosen(ns)
    given = {s.name: getattr(ns, s.dest) for s in settings_for(command) if getattr(ns, s.dest, None) is not None}
    try:
        settings = resolve(command, given, environ)
    except InvalidInputError as e:
        chosen.error(str(e))
    return namespace_of(settings, chosen.prog)


def namespace_of(settings: Settings, prog: str) -> argparse.Namespace:
    """The settings' values by identifier (``args.max_topics``), and the settings."""
    return argparse.Namespace(command=settings.command, prog=prog, settings=settings,
                              **{v.setting.dest: v.value for v in settings.values()})
