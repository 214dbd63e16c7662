"""The one precedence rule, for every setting of every command:

    a run's flag > the topic's policy > a ``SHALE_*`` variable > the default

:func:`resolve` takes what the command line gave and the environment, and returns each
of the command's settings with its value and where the value came from
(:class:`Settings`); :meth:`Settings.with_policy` then lets a topic's policy replace what
did not come from a flag.  Every command, ``--print-config`` and
:func:`~shale.compactor.run_many.compact_topics` use it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from typing import Any

from shale.ledger.errors import InvalidInputError
from shale.ledger.values import dataclass
from shale.settings.model import SETTINGS, Setting, settings_for

__all__ = ["Settings", "Source", "Value", "VariableError", "resolve"]


class Source(enum.StrEnum):
    """Where a setting's value came from."""

    FLAG = "flag"
    POLICY = "policy"
    ENV = "env"
    DEFAULT = "default"


class VariableError(InvalidInputError):
    """A ``SHALE_*`` variable holds a value its setting cannot take (named in the message)."""


@dataclass(frozen=True, slots=True)
class Value:
    """One setting's effective value and where it came from."""

    setting: Setting
    value: Any
    source: Source

    @property
    def given_as(self) -> str:
        """How the user gave it, for messages: its flag, its variable, or the policy key."""
        if self.source is Source.ENV:
            return self.setting.variable
        if self.source is Source.POLICY:
            return f"the topic's policy {self.setting.name}"
        return self.setting.option


class Settings(Mapping[str, Value]):
    """A command's settings, each with its value and source, by name (``max-topics``)."""

    __slots__ = ("_values", "command")

    def __init__(self, command: str, values: Mapping[str, Value]) -> None:
        self.command = command
        self._values = dict(values)

    def __getitem__(self, name: str) -> Value:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Settings({self.command!r}, {{{', '.join(f'{k}={v.value!r}' for k, v in self._values.items())}}})"

    def value(self, name: str) -> Any:
        """The value of the setting ``name``."""
        return self._values[name].value

    def source(self, name: str) -> Source:
        """Where the value of ``name`` came from."""
        return self._values[name].source

    def with_policy(self, policy: Mapping[str, Any]) -> Settings:
        """These settings with a topic's policy applied: ``policy`` (the policy document's
        values, by field) replaces every value that did not come from a flag."""
        values = dict(self._values)
        for name, v in self._values.items():
            s = v.setting
            if s.policy and v.source is not Source.FLAG and policy.get(s.py_name) is not None:
                values[name] = Value(s, s.kind.from_doc(policy[s.py_name]), Source.POLICY)
        return Settings(self.command, values)

    def replace(self, name: str, value: Any, source: Source = Source.FLAG) -> Settings:
        """These settings with ``name`` set to ``value`` (as from ``source``)."""
        return Settings(self.command, {**self._values, name: Value(self._values[name].setting, value, source)})


def resolve(command: str, given: Mapping[str, Any] | None = None,
            environ: Mapping[str, str] | None = None) -> Settings:
    """``command``'s settings: each from ``given`` (what its flags gave, typed, by name or
    field name), else from its ``SHALE_*`` variable in ``environ``, else its default.  A
    topic's policy comes later (:meth:`Settings.with_policy`).  A bad value, a variable
    of a flag-only setting, or a group given twice is :class:`InvalidInputError` naming it."""
    mine = {s.name: s for s in settings_for(command)}
    flags = _given(command, mine, given or {})
    env = environ or {}
    for s in mine.values():
        if not s.env and not s.positional and env.get(s.variable, "").strip():
            raise VariableError(f"{s.variable} is refused: {s.option} is a flag only (set in the environment it "
                                "would turn every run into a no-op)")
    variables = {s.name: _from_variable(s, env[s.variable]) for s in mine.values()
                 if s.env and env.get(s.variable, "").strip()}
    _groups(mine, flags, variables)
    values = {}
    for name, s in mine.items():
        if name in flags:
            values[name] = Value(s, flags[name], Source.FLAG)
        elif name in variables:
            values[name] = Value(s, variables[name], Source.ENV)
        else:
            values[name] = Value(s, [] if s.many and s.default is None else s.default, Source.DEFAULT)
    return Settings(command, values)


def _given(command: str, mine: Mapping[str, Setting], given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` by setting name, each value checked by its kind."""
    out = {}
    fields = {s.py_name: s.name for s in mine.values()}
    for key, value in given.items():
        name = key if key in mine else fields.get(key, key.replace("_", "-"))
        s = mine.get(name)
        if s is None:
            known = SETTINGS.get(name)
            where = f" (it is a setting of {', '.join(sorted(known.commands))})" if known and known.commands else ""
            raise InvalidInputError(f"{command} takes no setting {key!r}{where}")
        if value is None:
            continue
        try:
            out[name] = [s.kind.check(v) for v in value] if s.many else s.kind.check(value)
        except InvalidInputError as e:
            raise InvalidInputError(f"{s.option}: {e}") from None
    return out


def _from_variable(s: Setting, text: str) -> Any:
    try:
        if s.kind.switch:
            return s.kind.parse(text)
        if s.many and s.positional:  # a list of URIs: separated by spaces or newlines
            return [s.kind.parse(t) for t in text.split()]
        if s.many:  # a repeatable flag: one value a line
            return [s.kind.parse(line.strip()) for line in text.splitlines() if line.strip()]
        return s.kind.parse(text.strip())
    except InvalidInputError as e:
        raise VariableError(f"environment variable {s.variable}: {e}") from None


def _groups(mine: Mapping[str, Setting], flags: dict[str, Any], variables: dict[str, Any]) -> None:
    """Settings of one group exclude each other.  A flag of one replaces the variables of
    all (the topics to compact are one setting, given as URIs or ``--all``)."""
    for group in dict.fromkeys(s.group for s in mine.values() if s.group):
        members = [s for s in mine.values() if s.group == group]
        flagged = [s for s in members if s.name in flags]
        if len(flagged) > 1:
            raise InvalidInputError(f"give {flagged[0].option} or {flagged[1].option}, not both")
        if flagged:
            for s in members:
                variables.pop(s.name, None)
            continue
        from_env = [s for s in members if s.name in variables]
        if len(from_env) > 1:
            raise VariableError(f"{from_env[0].variable} and {from_env[1].variable} are both set: set one")
        if not from_env and any(s.required for s in members):
            raise InvalidInputError(f"one of the arguments {' '.join(s.option for s in members)} is required")
