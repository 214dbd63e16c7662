"""What ``compact --print-config`` prints: the effective settings of a run, as one
JSON-ready document with secrets masked, callable from Python.

Each setting comes with its value, its source (``flag``, ``policy``, ``env`` or
``default``: the one precedence rule, :mod:`shale.settings.resolve`) and its variable;
``environment`` holds every variable of the settings model that is no flag
(:data:`shale.settings.VARIABLES`: the stores', the process's) and is set; ``kernels``
says which hot loops this process runs (``native``, the C kernels, or ``numpy``, the
fallbacks).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from shale.ledger.errors import error_line
from shale.ledger.masking import mask_secrets
from shale.settings import VARIABLES, Settings, Value

__all__ = ["effective_config"]


def effective_config(settings: Settings, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``compact``'s resolved ``settings`` as a document, secrets masked.  The policies of
    the topics given are read: with one topic the settings are that topic's; ``policies``
    says, for each topic, the settings its policy sets and which value wins there (a topic
    that cannot be read shows its error).  ``environ``: this process's environment when
    None."""
    from shale.ledger.kernels import KERNELS

    environ = os.environ if environ is None else environ
    policies = {uri: _read_policy(uri, settings.value("metadata")) for uri in settings.value("topics")}
    if len(policies) == 1 and isinstance(only := next(iter(policies.values())), dict):
        settings = settings.with_policy(only)
    return {"settings": {v.setting.option: _shown(v) for v in settings.values()},
            "environment": {v.name: mask_secrets(environ[v.name], v.name) for v in VARIABLES.values()
                            if environ.get(v.name)},
            "kernels": KERNELS,
            "policies": {mask_secrets(uri): {"error": p} if isinstance(p, str) else _set_by(settings, p)
                         for uri, p in policies.items()}}


def _read_policy(uri: str, metadata: str | None) -> dict[str, Any] | str:
    """``uri``'s policy, or why it cannot be read (``--print-config`` never fails for a
    topic it cannot reach)."""
    from shale.metadata.topic import TopicMetadata

    try:
        return TopicMetadata.open(uri, metadata).load_policy().to_json()
    except Exception as e:
        return error_line(e)


def _set_by(settings: Settings, policy: dict[str, Any]) -> dict[str, Any]:
    """The settings ``policy`` sets, each with the value that wins for its topic."""
    own = settings.with_policy(policy)
    return {v.setting.option: _shown(own[name]) for name, v in settings.items()
            if v.setting.policy and v.setting.py_name in policy}


def _shown(v: Value) -> dict[str, Any]:
    kind, name = v.setting.kind, v.setting.variable
    value = [kind.to_json(x) for x in v.value] if isinstance(v.value, list) else (
        None if v.value is None else kind.to_json(v.value))
    return {"value": _masked(value, name), "source": str(v.source), "variable": name}


def _masked(value: Any, name: str) -> Any:
    if isinstance(value, str):
        return mask_secrets(value, name)
    if isinstance(value, list):
        return [_masked(x, name) for x in value]
    return value
