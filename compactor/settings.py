"""Settings from flags and from ``SHALE_*`` environment variables; flags win.

Every flag of every command has a variable: ``SHALE_`` and the flag's name upper-cased
with dashes as underscores (``--max-topics`` is ``SHALE_MAX_TOPICS``, ``--all`` is
``SHALE_ALL``).  A list of positional URIs is ``SHALE_<NAME>`` (``SHALE_TOPICS``,
separated by spaces or newlines), switches take ``1/true/yes/on`` or ``0/false/no/off``,
and a repeatable flag takes one value per line (``SHALE_SPARK_CONF``: ``KEY=VALUE``
lines).  An empty variable counts as unset.  ``--print-config`` is a flag only: set in a
ConfigMap it would turn every scheduled run into a silent no-op.  A CronJob can thus
keep all its settings in a ConfigMap and run ``compact`` with no arguments.

The variables are read by ConfigArgParse (its ``auto_env_var_prefix``), which also lists
each flag's variable in ``--help``.  :class:`SettingsParser` adds what it does not do:
every variable is checked before the run, and a bad one is named in one line; and each
parse records where every value came from (flag, env or default) as :class:`Setting`s,
which ``--print-config`` shows and error messages use to name what the user gave.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import configargparse

from shale.ledger.codecs import Compression
from shale.ledger.masking import mask_secrets

__all__ = ["ENV_PREFIX", "Setting", "SettingsParser", "env_name", "mask_secrets", "print_config", "settings_of",
           "source_name"]

ENV_PREFIX: Final = "SHALE_"
PRINT_CONFIG_VARIABLE: Final = "SHALE_PRINT_CONFIG"
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})
#: Settings that are not flags but shape a run: shown by --print-config (secrets masked).
_ENVIRONMENT: Final = ("AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
                       "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                       "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "GOOGLE_APPLICATION_CREDENTIALS", "SHALE_DEBUG",
                       "SHALE_KERNELS")


@dataclass(frozen=True, slots=True)
class Setting:
    """One effective setting: its flag, value and where the value came from."""

    dest: str
    flag: str
    variable: str
    value: Any
    source: str  # "flag", "env" or "default"


def env_name(action: argparse.Action) -> str:
    """``--max-topics`` → ``SHALE_MAX_TOPICS``; a positional → ``SHALE_<DEST>``."""
    longs = [s for s in action.option_strings if s.startswith("--")]
    name = longs[0][2:] if longs else action.dest
    return ENV_PREFIX + name.upper().replace("-", "_")


def _flag(action: argparse.Action) -> str:
    longs = [s for s in action.option_strings if s.startswith("--")]
    return longs[0] if longs else action.metavar if isinstance(action.metavar, str) else action.dest


def _given(action: argparse.Action, argv: Sequence[str]) -> bool:
    # Abbreviated flags are off (allow_abbrev=False), so a flag given is spelt in full.
    opts = action.option_strings
    return any(a in opts or a.split("=", 1)[0] in opts for a in argv if a.startswith("-"))


if TYPE_CHECKING:
    _Parser = argparse.ArgumentParser  # ConfigArgParse's parser is one, with no type hints of its own
else:
    _Parser = configargparse.ArgumentParser


class SettingsParser(_Parser):
    """An argument parser whose every flag also reads its ``SHALE_*`` variable (flags win),
    and which records each setting's source on the namespace (:func:`settings_of`).
    Sub-commands made with :meth:`add_subparsers` are of the same class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("auto_env_var_prefix", ENV_PREFIX)
        # A flag is spelt in full: an abbreviation would be unknown to the source rules.
        kwargs.setdefault("allow_abbrev", False)
        self._settable: list[argparse.Action] = []
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        return self._record(super().add_argument(*args, **kwargs))

    def add_argument_group(self, *args: Any, **kwargs: Any) -> Any:
        return self._recording(super().add_argument_group(*args, **kwargs))

    def add_mutually_exclusive_group(self, **kwargs: Any) -> Any:
        return self._recording(super().add_mutually_exclusive_group(**kwargs))

    def _recording(self, group: Any) -> Any:
        """``group`` whose arguments are recorded as this parser's own."""
        add: Callable[..., argparse.Action] = group.add_argument

        def add_and_record(*a: Any, **kw: Any) -> argparse.Action:
            return self._record(add(*a, **kw))

        group.add_argument = add_and_record
        return group

    def _record(self, action: argparse.Action) -> argparse.Action:
        if action.dest not in ("help", argparse.SUPPRESS) and action.default is not argparse.SUPPRESS:
            self._settable.append(action)
            if action.option_strings:
                action.env_var = env_name(action)  # type: ignore[attr-defined]
        return action

    def parse_known_args(  # type: ignore[override]  # ConfigArgParse adds arguments to argparse's
            self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None,
            config_file_contents: str | None = None, env_vars: Mapping[str, str] = os.environ,
            ignore_help_args: bool = False) -> tuple[argparse.Namespace, list[str]]:
        argv = list(sys.argv[1:] if args is None else args)
        variables = self._variables(env_vars)
        ns, rest = super().parse_known_args(argv, namespace, config_file_contents,  # type: ignore[call-overload]
                                            variables, ignore_help_args)
        mine = self._settings(ns, argv, variables, env_vars)
        # a sub-command's parser ran first and left its settings on the namespace
        ns._settings = [*mine, *getattr(ns, "_settings", [])]
        return ns, rest

    def _variables(self, environ: Mapping[str, str]) -> dict[str, str]:
        """This parser's variables that are set, checked, in the form ConfigArgParse reads."""
        if environ.get(PRINT_CONFIG_VARIABLE, "").strip():
            self.error(f"{PRINT_CONFIG_VARIABLE} is refused: --print-config is a flag only (set in the "
                       "environment it would turn every run into a no-op)")
        found = {}
        for action in self._settable:
            name = env_name(action)
            text = environ.get(name, "")
            if action.option_strings and text.strip():
                found[name] = self._checked(action, name, text)
        return found

    def _checked(self, action: argparse.Action, name: str, text: str) -> str:
        try:
            if action.nargs == 0:
                word = text.strip().lower()
                if word not in _TRUE | _FALSE:
                    raise argparse.ArgumentTypeError(f"{text!r} is not a switch (1/true/yes/on or 0/false/no/off)")
                return word
            if isinstance(action.default, list):  # repeatable: one value per line
                items = [line.strip() for line in text.splitlines() if line.strip()]
                for item in items:
                    _convert(action, item)
                return json.dumps(items)
            _convert(action, text.strip())
            return text.strip()
        except (argparse.ArgumentTypeError, ValueError, TypeError) as e:
            self.error(f"environment variable {name}: {e}")

    def _settings(self, ns: argparse.Namespace, argv: list[str], variables: Mapping[str, str],
                  environ: Mapping[str, str]) -> list[Setting]:
        out = []
        for action in self._settable:
            name = env_name(action)
            value = getattr(ns, action.dest, None)
            if action.option_strings:
                source = "flag" if _given(action, argv) else "env" if name in variables else "default"
            elif value not in (None, []):
                source = "flag"
            elif action.nargs == "*" and environ.get(name, "").strip():
                value, source = environ[name].split(), "env"  # e.g. SHALE_TOPICS
                setattr(ns, action.dest, value)
            else:
                source = "default"
            out.append(Setting(action.dest, _flag(action), name, value, source))
        return out


def _convert(action: argparse.Action, text: str) -> None:
    value = action.type(text) if callable(action.type) else text
    if action.choices is not None and value not in action.choices:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(map(str, action.choices))}")


def settings_of(args: argparse.Namespace) -> list[Setting]:
    """Every setting of the command that parsed ``args``, with its source."""
    settings: list[Setting] = getattr(args, "_settings", [])
    return settings


def source_name(args: argparse.Namespace, dest: str) -> str:
    """How the user gave ``dest``: its flag, or its variable when it came from the environment."""
    for s in settings_of(args):
        if s.dest == dest:
            return str(s.variable if s.source == "env" else s.flag)
    return dest


def _show(value: Any, name: str) -> Any:
    if isinstance(value, str):
        return mask_secrets(value, name)
    if isinstance(value, list | tuple):
        return [_show(v, name) for v in value]
    if isinstance(value, Compression):
        return str(value)
    return value


def print_config(settings: list[Setting], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The effective settings as a JSON-ready document, secrets masked."""
    environ = os.environ if environ is None else environ
    from shale.ledger.kernels import KERNELS

    # which hot loops this process runs: "native" (the C kernels) or "numpy" (fallbacks)
    doc: dict[str, Any] = {"settings": {}, "environment": {}, "kernels": KERNELS}
    for s in settings:
        value = s.value
        if s.dest == "spark_conf":
            value = [mask_secrets(f"{k}={v}") for k, v in value]
        doc["settings"][s.flag] = {"value": _show(value, s.variable), "source": s.source,
                                   "variable": s.variable}
    for name in _ENVIRONMENT:
        if environ.get(name):
            doc["environment"][name] = mask_secrets(environ[name], name)
    return doc
