"""Topic policies as people name them (``shale config``).

``shale config URI --set delete-retention=7d`` names a setting as its ``compact`` flag
does (without the dashes in front), takes the same values (durations, sizes, ratios,
true/false; :data:`shale.settings.POLICY_SETTINGS` says which settings a policy may hold)
and stores it in the topic's policy (:mod:`shale.metadata.policy`).  The policy takes its
place in the one precedence rule (:mod:`shale.settings.resolve`):

    a run's flag > the topic's policy > a SHALE_* variable > the default
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from shale.ledger.codecs import parse_compression
from shale.ledger.errors import InvalidInputError, InvalidURIError
from shale.metadata.dictionaries import resolve_compression
from shale.metadata.policy import TopicPolicy, check_setting
from shale.metadata.topic import TopicMetadata
from shale.settings import POLICY_SETTINGS, Setting

__all__ = ["check_workable", "create_topic", "parse_assignments", "policy_text"]


def _setting(name: str) -> Setting:
    s = POLICY_SETTINGS.get(name.strip())
    if s is None:
        raise InvalidInputError(f"unknown policy setting {name.strip()!r}; one of {', '.join(POLICY_SETTINGS)}")
    return s


def parse_assignments(sets: Iterable[str], unsets: Iterable[str]) -> tuple[dict[str, Any], list[str]]:
    """``--set NAME=VALUE`` and ``--unset NAME`` as the policy document's fields."""
    changes: dict[str, Any] = {}
    for item in sets:
        name, sep, text = item.partition("=")
        if not sep:
            raise InvalidInputError(f"--set {item!r}: use NAME=VALUE, e.g. delete-retention=7d")
        s = _setting(name)
        try:
            changes[s.py_name] = s.kind.to_doc(s.kind.parse(text.strip()))
            check_setting(s.name, s.py_name, changes[s.py_name])
        except InvalidInputError as e:
            raise InvalidInputError(f"--set {s.name}: {str(e).removeprefix(s.name + ': ')}") from None
    removed = [_setting(name).py_name for name in unsets]
    if set(changes) & set(removed):
        raise InvalidInputError("a setting cannot be both set and unset")
    return changes, removed


def check_workable(meta: TopicMetadata, changes: Mapping[str, Any]) -> None:
    """Refuse, before anything is written, a setting the topic could not work with: one
    that would make every later produce and compaction fail (``zstd-dict`` on a topic that
    has no trained dictionary)."""
    if changes.get("compression") is not None:
        try:
            resolve_compression(meta, parse_compression(changes["compression"]))
        except InvalidInputError as e:
            raise InvalidInputError(f"--set {POLICY_SETTINGS['compression'].name}: {e}") from None


def policy_text(policy: TopicPolicy) -> dict[str, str]:
    """The policy's settings as people write them (``delete-retention: 7d``)."""
    values = policy.to_json()
    return {s.name: s.kind.show(s.kind.from_doc(values[s.py_name]))
            for s in POLICY_SETTINGS.values() if s.py_name in values}


def create_topic(meta: TopicMetadata, changes: Mapping[str, Any]) -> TopicPolicy:
    """Create the empty topic ``meta`` describes with the policy fields ``changes``
    (``shale create``), and return its policy.  Everything is checked before anything is
    written: the settings, that no topic is there already, that it would not lie inside
    another topic or around one.  The policy is written before the topic, so that no
    producer or compaction ever sees the topic without it (a crash in between leaves a
    policy that creating the topic again completes)."""
    if meta.exists():
        raise InvalidInputError(f"{meta.uri}: a topic exists there already (shale config {meta.uri} --set ... "
                                "changes its policy)")
    nested = meta.nesting()
    if nested:
        raise InvalidURIError(f"cannot create a topic at {meta.uri}: {nested}")
    check_workable(meta, changes)
    policy = meta.update_policy(changes) if changes else meta.load_policy()
    meta.create_topic()
    return policy
