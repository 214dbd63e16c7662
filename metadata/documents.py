"""Versioned JSON documents with compare-and-swap, on any :class:`~ledger.ObjectStore`.

A document is one object holding ``{"version": n, "writer": ..., "value": {...}}``.
``create`` is a create-only write (S3 ``If-None-Match: *``, a hard link on a local
folder); ``replace`` re-checks the version and then swaps on the store's token (S3
``If-Match: <etag>``, an ``flock``-guarded rename locally).  The version grows by one
with every write and the writer nonce makes every body unique, so a token can never
come back (no ABA) and a retried write can recognise itself.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from shale.ledger.errors import AlreadyExistsError, ConflictError, ObjectNotFoundError
from shale.metadata.schema import decode_envelope
from shale.storage import Location, validate_key_part

__all__ = ["DocumentStore", "Versioned"]


@dataclass(frozen=True, slots=True)
class Versioned:
    """A document's value as read, with the version and token a replace needs."""

    value: dict[str, Any]
    version: int
    token: str
    updated_ms: int = 0


class DocumentStore:
    """Named, versioned documents under one folder."""

    def __init__(self, location: Location) -> None:
        self.location = location
        self._writer = uuid.uuid4().hex

    def _key(self, name: str) -> str:
        return self.location.key(validate_key_part(name, "document name"))

    def url(self, name: str) -> str:
        return self.location.store.url(self._key(name))

    def _encode(self, value: dict[str, Any], version: int) -> bytes:
        body = {"version": version, "updated_ms": int(time.time() * 1000),
                "writer": self._writer, "value": value}
        return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()

    def _decode(self, name: str, data: bytes, token: str) -> Versioned:
        body = decode_envelope(data, self.url(name))
        return Versioned(body.value, body.version, token, body.updated_ms)

    def read(self, name: str) -> Versioned | None:
        """The current value and version, or ``None`` if the document does not exist."""
        try:
            data, token = self.location.store.get_with_token(self._key(name))
        except ObjectNotFoundError:
            return None
        return self._decode(name, data, token)

    def create(self, name: str, value: dict[str, Any]) -> Versioned:
        """Create version 1; :class:`AlreadyExistsError` if the document exists."""
        data = self._encode(value, 1)
        try:
            token = self.location.store.put_if_absent(self._key(name), data)
        except AlreadyExistsError:
            current = self.read(name)
            found = current.version if current else None
            raise AlreadyExistsError(
                f"{self.url(name)}: expected no document, found version {found}",
                expected=0, found=found) from None
        return Versioned(value, 1, token)

    def replace(self, name: str, value: dict[str, Any], expected_version: int, *,
                token: str | None = None) -> Versioned:
        """Write ``value`` as version ``expected_version + 1`` if the document is still at
        ``expected_version``; else :class:`ConflictError` ("expected version 7, found 8").

        ``token`` (from the :class:`Versioned` that was read) saves a re-read.
        """
        if token is None:
            current = self.read(name)
            if current is None or current.version != expected_version:
                raise self._conflict(name, expected_version, current)
            token = current.token
        data = self._encode(value, expected_version + 1)
        try:
            new_token = self.location.store.put_if_match(self._key(name), data, token)
        except ConflictError:
            raise self._conflict(name, expected_version, self.read(name)) from None
        return Versioned(value, expected_version + 1, new_token)

    def write(self, name: str, value: dict[str, Any], expected: Versioned | None) -> Versioned:
        """Create (``expected is None``) or replace ``expected``'s version."""
        if expected is None:
            return self.create(name, value)
        return self.replace(name, value, expected.version, token=expected.token)

    def _conflict(self, name: str, expected: int, current: Versioned | None) -> ConflictError:
        found = current.version if current else None
        return ConflictError(f"{self.url(name)}: expected version {expected}, found "
                             f"{'no document' if found is None else f'version {found}'}",
                             expected=expected, found=found)
