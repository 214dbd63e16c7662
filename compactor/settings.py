"""Settings from flags and from ``SHALE_*`` environment variables; flags win.

Every ``compact`` flag has a variable: ``SHALE_`` and the flag's name upper-cased with
dashes as underscores (``--max-topics`` is ``SHALE_MAX_TOPICS``, ``--all`` is
``SHALE_ALL``).  The topic list is ``SHALE_TOPICS`` (separated by spaces or newlines),
switches take ``1/true/yes/on`` or ``0/false/no/off``, and ``SHALE_SPARK_CONF`` holds one
``KEY=VALUE`` per line.  An empty variable counts as unset.  A CronJob can thus keep all
its settings in a ConfigMap and run ``compact`` with no arguments.

How it works: every flag's default is wrapped in :class:`NotGiven`, so after argparse has
run, a value that is still wrapped was not on the command line; :func:`resolve` then
takes the variable if there is one and the plain default otherwise, and records where
each value came from (``--print-config`` shows it).
"""

from __future__ import annotations

import argparse
import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ledger.errors import InvalidInputError
from ledger.storage import mask_uri

__all__ = ["ENV_PREFIX", "NotGiven", "Setting", "env_name", "mask_secrets", "print_config", "resolve",
           "source_name", "wrap_defaults"]

ENV_PREFIX: Final = "SHALE_"
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})
#: Settings that are not flags but shape a run: shown by --print-config (secrets masked).
_ENVIRONMENT: Final = ("AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
                       "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                       "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "GOOGLE_APPLICATION_CREDENTIALS", "SHALE_DEBUG",
                       "SHALE_KERNELS")
_SECRET_NAME: Final = re.compile(r"secret|password|passwd|token|credential|access[._-]?key|session", re.I)
_MASK: Final = "****"


class NotGiven:
    """A flag's default, marked so that a value argparse leaves alone is known not to come
    from the command line."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:  # argparse shows defaults in some messages
        return repr(self.value)


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


def _settable(action: argparse.Action) -> bool:
    return action.dest not in ("help", argparse.SUPPRESS) and action.default is not argparse.SUPPRESS


def wrap_defaults(parser: argparse.ArgumentParser) -> None:
    """Mark every default of ``parser`` as not given (call once, after adding arguments)."""
    actions = [a for a in parser._actions if _settable(a)]
    for a in actions:
        if isinstance(a, argparse._AppendAction):
            # append extends the default in place, so it starts empty and stays a list
            a.default = None
        else:
            a.default = NotGiven(a.default)
    parser.set_defaults(_settings_actions=actions)


def _from_env(action: argparse.Action, name: str, text: str) -> Any:
    try:
        if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
            word = text.strip().lower()
            if word not in _TRUE | _FALSE:
                raise argparse.ArgumentTypeError(f"{text!r} is not a switch (1/true/yes/on or 0/false/no/off)")
            on = word in _TRUE
            return on if isinstance(action, argparse._StoreTrueAction) else not on
        if action.nargs == "*":
            return text.split()
        convert = action.type if callable(action.type) else str
        if isinstance(action, argparse._AppendAction):
            return [convert(line.strip()) for line in text.splitlines() if line.strip()]
        value = convert(text.strip())
        if action.choices is not None and value not in action.choices:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(map(str, action.choices))}")
        return value
    except argparse.ArgumentTypeError as e:
        raise InvalidInputError(f"environment variable {name}: {e}") from None


def resolve(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> list[Setting]:
    """Replace every value not given on the command line by its ``SHALE_*`` variable or
    its default, in place; return every setting with its source.

    The topic list is one setting: topic URIs or ``--all`` on the command line make
    ``SHALE_TOPICS`` and ``SHALE_ALL`` both ignored.
    """
    environ = os.environ if environ is None else environ
    actions: list[argparse.Action] = getattr(args, "_settings_actions", [])
    given = {a.dest for a in actions if not isinstance(getattr(args, a.dest, None), NotGiven | type(None))}
    topic_choice_given = bool({"topics", "all_prefix"} & given)
    settings = []
    for a in actions:
        name = env_name(a)
        current = getattr(args, a.dest, None)
        text = environ.get(name, "")
        if a.dest in given:
            value, source = current, "flag"
        elif text.strip() and not (topic_choice_given and a.dest in ("topics", "all_prefix")):
            value, source = _from_env(a, name, text), "env"
        else:
            value = current.value if isinstance(current, NotGiven) else current
            if value is None and (a.nargs == "*" or isinstance(a, argparse._AppendAction)):
                value = []
            source = "default"
        setattr(args, a.dest, value)
        settings.append(Setting(a.dest, _flag(a), name, value, source))
    args._settings = settings
    return settings


def source_name(args: argparse.Namespace, dest: str) -> str:
    """How the user gave ``dest``: its flag, or its variable when it came from the environment."""
    for s in getattr(args, "_settings", []):
        if s.dest == dest:
            return str(s.variable if s.source == "env" else s.flag)
    return dest


def mask_secrets(value: str, name: str = "") -> str:
    """``value`` with secrets hidden: the whole value when ``name`` sounds like a secret,
    passwords in URIs, and secret-looking query parameters or ``KEY=VALUE`` settings."""
    if name and _SECRET_NAME.search(name):
        return _MASK if value else value
    key, sep, _rest = value.partition("=")
    if sep and "://" not in key and _SECRET_NAME.search(key):
        return f"{key}={_MASK}"
    if "://" in value:
        value = mask_uri(value)  # a text rewrite: safe on URIs no parser accepts
        try:
            u = urllib.parse.urlsplit(value)
            query = urllib.parse.urlencode(
                [(k, _MASK if _SECRET_NAME.search(k) else v) for k, v in urllib.parse.parse_qsl(u.query)], safe="*")
        except ValueError:
            return value
        return urllib.parse.urlunsplit((u.scheme, u.netloc, u.path, query, u.fragment))
    return value


def _show(value: Any, name: str) -> Any:
    if isinstance(value, str):
        return mask_secrets(value, name)
    if isinstance(value, list | tuple):
        return [_show(v, name) for v in value]
    return value


def print_config(settings: list[Setting], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The effective settings as a JSON-ready document, secrets masked."""
    environ = os.environ if environ is None else environ
    from ledger.kernels import KERNELS

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
