"""Topic policies as people name them, and the one precedence rule:

    a run's flag > the topic's policy > a SHALE_* variable > the default

``shale config URI --set delete-retention=7d`` names a setting as its ``compact`` flag
does (without the dashes in front), takes the same values (durations, sizes, ratios,
true/false) and stores it in the topic's policy (:mod:`shale.metadata.policy`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from shale.compactor.config import CompactionConfig
from shale.compactor.units import format_duration, format_size, parse_duration, parse_size
from shale.ledger.codecs import parse_compression
from shale.ledger.errors import InvalidInputError
from shale.metadata.dictionaries import resolve_compression
from shale.metadata.policy import TopicPolicy, check_setting
from shale.metadata.topic import TopicMetadata

__all__ = ["POLICY_KEYS", "PolicyKey", "apply_policy", "check_workable", "parse_assignments", "policy_text"]

_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InvalidInputError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise InvalidInputError(f"{text!r} must be between 0 and 1")
    return value


def _switch(text: str) -> bool:
    word = text.strip().lower()
    if word not in _TRUE | _FALSE:
        raise InvalidInputError(f"{text!r} is not true or false")
    return word in _TRUE


@dataclass(frozen=True, slots=True)
class PolicyKey:
    """One setting a topic's policy may hold."""

    name: str  # as ``--set`` and the compact flag name it
    field: str  # in the policy document
    parse: Callable[[str], Any]
    show: Callable[[Any], str]
    #: the run setting it stands in for (a ``compact`` flag's dest), if any
    dest: str | None
    help: str
    #: the run setting's value for the document's (when they differ)
    to_config: Callable[[Any], Any] | None = None


POLICY_KEYS: Final[dict[str, PolicyKey]] = {k.name: k for k in (
    PolicyKey("delete-retention", "delete_retention_ms", parse_duration, format_duration, "delete_retention",
              "tombstones stay this long after the first compaction that kept them"),
    PolicyKey("min-compaction-lag", "min_compaction_lag_ms", parse_duration, format_duration, "min_compaction_lag",
              "records younger than this wait for a later run"),
    PolicyKey("max-compaction-lag", "max_compaction_lag_ms", parse_duration, format_duration, "max_compaction_lag",
              "with compact --all: compacted first once its oldest uncompacted record is this old"),
    PolicyKey("min-dirty-ratio", "min_dirty_ratio", _ratio, str, "min_dirty_ratio",
              "skip the run when bytes above the horizon / live bytes is below this"),
    PolicyKey("retain-null-key", "retain_null_key", _switch, lambda v: "true" if v else "false", "retain_null_key",
              "keep records without a key (true) or drop them (false)"),
    PolicyKey("retention", "retention_ms", parse_duration, format_duration, None,
              "after each publish, remove ledgers wholly below the horizon and older than this"),
    PolicyKey("retention-bytes", "retention_bytes", parse_size, format_size, None,
              "after each publish, remove the oldest ledgers below the horizon beyond this many bytes"),
    PolicyKey("compression", "compression", lambda text: str(parse_compression(text)), str, "compression",
              "how produce compresses new entries and compact the entries it writes anew (none, lz4, zstd:LEVEL, "
              "zstd-dict:LEVEL)",
              parse_compression),
)}


def _key(name: str) -> PolicyKey:
    key = POLICY_KEYS.get(name.strip())
    if key is None:
        raise InvalidInputError(f"unknown policy setting {name!r}; one of {', '.join(POLICY_KEYS)}")
    return key


def parse_assignments(sets: Iterable[str], unsets: Iterable[str]) -> tuple[dict[str, Any], list[str]]:
    """``--set NAME=VALUE`` and ``--unset NAME`` as the policy document's fields."""
    changes: dict[str, Any] = {}
    for item in sets:
        name, sep, text = item.partition("=")
        if not sep:
            raise InvalidInputError(f"--set {item!r}: use NAME=VALUE, e.g. delete-retention=7d")
        key = _key(name)
        try:
            changes[key.field] = key.parse(text.strip())
            check_setting(key.name, key.field, changes[key.field])
        except InvalidInputError as e:
            raise InvalidInputError(f"--set {key.name}: {str(e).removeprefix(key.name + ': ')}") from None
    removed = [_key(name).field for name in unsets]
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
            raise InvalidInputError(f"--set {POLICY_KEYS['compression'].name}: {e}") from None


def policy_text(policy: TopicPolicy) -> dict[str, str]:
    """The policy's settings as people write them (``delete-retention: 7d``)."""
    values = policy.to_json()
    return {k.name: k.show(values[k.field]) for k in POLICY_KEYS.values() if k.field in values}


def apply_policy(config: CompactionConfig, policy: TopicPolicy, sources: Mapping[str, str]) -> CompactionConfig:
    """``config`` with the topic's policy applied where the run's flag did not set the
    value (``sources``: a flag's dest -> ``"flag"``, ``"env"`` or ``"default"``)."""
    values = policy.to_json()
    changes: dict[str, Any] = {}
    for key in POLICY_KEYS.values():
        if key.dest is None or key.field not in values or sources.get(key.dest) == "flag":
            continue
        if key.field in {f.name for f in dataclasses.fields(CompactionConfig)}:
            value = values[key.field]
            changes[key.field] = key.to_config(value) if key.to_config is not None else value
    return dataclasses.replace(config, **changes) if changes else config
