"""A topic's own policy: the settings ``compact`` applies to this topic unless a run's flag
says otherwise (Kafka's topic-level configs, Pulsar's topic policies).

It lives in a document of its own, ``_meta/policy.json``, so that changing it never
conflicts with producers (``topic.json``) or compactors (``compaction.json``); it is
changed with compare-and-swap like both.  A setting the policy leaves out falls back to
the run's variable, then to the default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Final

import msgspec

from shale.ledger.codecs import Compression, parse_compression
from shale.ledger.errors import InvalidInputError, InvalidMetadataError

__all__ = ["MAX_BYTES", "MAX_MILLIS", "POLICY_DOC", "PolicyDoc", "TopicPolicy", "check_setting"]

POLICY_DOC: Final = "policy.json"

#: The longest duration and the largest size a setting may hold (about 146 million years
#: and 4 EiB): a sum or difference with a time in milliseconds stays a signed 64-bit integer.
MAX_MILLIS: Final = (1 << 62) - 1
MAX_BYTES: Final = (1 << 62) - 1
Millis = Annotated[int, msgspec.Meta(ge=0, le=MAX_MILLIS)]
Bytes = Annotated[int, msgspec.Meta(ge=0, le=MAX_BYTES)]
Ratio = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


class PolicyDoc(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """The settings a topic may fix for itself; None: not set."""

    delete_retention_ms: Millis | None = None
    min_compaction_lag_ms: Millis | None = None
    max_compaction_lag_ms: Millis | None = None
    min_dirty_ratio: Ratio | None = None
    retain_null_key: bool | None = None
    #: retention below the horizon, applied after each publish: ledgers wholly compacted
    #: and older than this, or beyond the newest ``retention_bytes`` of ledgers, go
    retention_ms: Millis | None = None
    retention_bytes: Bytes | None = None
    #: how producers compress new entries and compactions the entries they write anew
    #: (``none``, ``lz4``, ``zstd:LEVEL``)
    compression: Annotated[str, msgspec.Meta(max_length=16)] | None = None


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
    if field == "compression" and doc.compression is not None:
        parse_compression(doc.compression)


def _why(e: msgspec.ValidationError) -> str:
    # msgspec names the field by its document path ("at `$.retention_ms`"): the caller names it
    return str(e).split(" - at `", 1)[0].strip()


@dataclass(frozen=True, slots=True)
class TopicPolicy:
    """A topic's policy as read, with the version it is changed from."""

    values: PolicyDoc = field(default_factory=PolicyDoc)
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
            raise InvalidMetadataError(f"{where}: {e}") from None
        if doc.compression is not None:
            try:
                parse_compression(doc.compression)
            except InvalidInputError as e:
                raise InvalidMetadataError(f"{where}: field compression: {e}") from None
        return cls(doc, version, token)

    @property
    def compression(self) -> Compression | None:
        """The topic's compression, if its policy sets one."""
        return None if self.values.compression is None else parse_compression(self.values.compression)
