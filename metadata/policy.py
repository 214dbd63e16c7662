"""A topic's own policy: the settings ``compact`` applies to this topic unless a run's flag
says otherwise (Kafka's topic-level configs, Pulsar's topic policies).

It lives in a document of its own, ``_meta/policy.json``, so that changing it never
conflicts with producers (``topic.json``) or compactors (``compaction.json``); it is
changed with compare-and-swap like both.  A setting the policy leaves out falls back to
the run's variable, then to the default.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any, Final

import msgspec

from shale.ledger.codecs import Compression, parse_compression
from shale.ledger.errors import InvalidInputError, InvalidMetadataError
from shale.ledger.ordering import OFFSET, TopicOrder
from shale.ledger.values import dataclass
from shale.metadata.schema import schema_error
from shale.settings import POLICY_SETTINGS
from shale.settings.units import MAX_BYTES, MAX_MILLIS

__all__ = ["MAX_BYTES", "MAX_MILLIS", "POLICY_DOC", "PolicyDoc", "TopicPolicy", "check_setting"]

POLICY_DOC: Final = "policy.json"

#: The settings a topic may fix for itself, one field each (None: not set), made from the
#: settings a policy may hold (:data:`shale.settings.POLICY_SETTINGS`): their names and
#: the ranges of their values are the flags' own.
PolicyDoc: Final = msgspec.defstruct(
    "PolicyDoc", [(s.py_name, s.kind.doc_type | None, None) for s in POLICY_SETTINGS.values()],
    frozen=True, forbid_unknown_fields=True, omit_defaults=True, module=__name__)


def check_setting(name: str, field: str, value: Any) -> None:
    """Refuse, as bad input naming ``name`` (the setting as people write it), a value the
    policy document's ``field`` cannot hold: checked before anything is written, so that a
    bad value is never blamed on the document."""
    if field not in PolicyDoc.__struct_fields__:
        raise InvalidInputError(f"unknown policy setting {name!r}")
    try:
        doc = msgspec.convert({field: value}, PolicyDoc, strict=True)
    except msgspec.ValidationError as e:
        raise InvalidInputError(f"{name}: {value!r} is out of range ({_why(e)})") from None
    if field == "compression" and getattr(doc, "compression", None) is not None:
        parse_compression(doc.compression)  # type: ignore[attr-defined]  # (a field made from the settings)


def _why(e: msgspec.ValidationError) -> str:
    # msgspec names the field by its document path ("at `$.retention_ms`"): the caller names it
    return str(e).split(" - at `", 1)[0].strip()


@dataclass(frozen=True, slots=True)
class TopicPolicy:
    """A topic's policy as read, with the version it is changed from."""

    values: msgspec.Struct = field(default_factory=PolicyDoc)
    version: int = 0
    token: str = ""

    def with_version(self, version: int, token: str) -> TopicPolicy:
        return TopicPolicy(self.values, version, token)

    def to_json(self) -> dict[str, Any]:
        """The settings that are set (a field left out is not set)."""
        doc: dict[str, Any] = msgspec.to_builtins(self.values)
        return doc

    @classmethod
    def from_json(cls, value: dict[str, Any], version: int, token: str, where: str) -> TopicPolicy:
        try:
            doc = msgspec.convert(value, PolicyDoc, strict=True)
        except msgspec.ValidationError as e:
            raise schema_error(where, e) from None
        if (codec := getattr(doc, "compression", None)) is not None:
            try:
                parse_compression(codec)
            except InvalidInputError as e:
                raise InvalidMetadataError(f"{where}: field compression: {e}") from None
        return cls(doc, version, token)

    def get(self, field: str) -> Any:
        """The value of the policy document's ``field`` (``retention_ms``), None when not set."""
        return getattr(self.values, field, None)

    @property
    def compression(self) -> Compression | None:
        """The topic's compression, if its policy sets one."""
        codec = self.get("compression")
        return None if codec is None else parse_compression(codec)

    @property
    def order(self) -> TopicOrder:
        """The order and key TTL the policy sets (the default for what it leaves out)."""
        return TopicOrder(self.get("order") or OFFSET, self.get("key_ttl_ms") or 0)
