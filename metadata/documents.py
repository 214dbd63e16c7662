"""Versioned JSON documents with compare-and-swap, on any :class:`~shale.storage.ObjectStore`.

A document is one object holding ``{"version": n, "writer": ..., "value": {...}}``.
``create`` is a create-only write (S3 ``If-None-Match: *``, a hard link on a local
folder); ``replace`` re-checks the version and then swaps on the store's token (S3
``If-Match: <etag>``, an ``flock``-guarded rename locally).  The version grows by one
with every write and the writer nonce makes every body unique, so a token can never
come back (no ABA) and a retried write can recognise itself.  ``update`` is the one
read-modify-compare-and-swap loop that retries on conflict; every such change of a
document goes through it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol, Self, TypeVar

from shale.ledger.errors import (
    AlreadyExistsError,
    ConflictError,
    ObjectNotFoundError,
    StateUnknownError,
    StorageError,
    TransientStorageError,
)
from shale.ledger.values import dataclass
from shale.metadata.schema import decode_envelope
from shale.storage import Location, validate_key_part
from shale.storage.retry import ConflictPolicy

__all__ = ["Document", "DocumentStore", "Versioned"]


class Document(Protocol):
    """A document's value as a caller reads it (a topic's ledger list, its compaction
    state, its policy, or a plain :class:`Versioned`): what :meth:`DocumentStore.update`
    needs of it."""

    @property
    def version(self) -> int:
        """The version it was read at (0: there was no document)."""

    @property
    def token(self) -> str:
        """The store's token of what was read ("" when unknown)."""

    def to_json(self) -> dict[str, Any]:
        """The value to write."""

    def with_version(self, version: int, token: str) -> Self:
        """The same value at another version and token (as written)."""


D = TypeVar("D", bound=Document)


@dataclass(frozen=True, slots=True)
class Versioned:
    """A document's value as read, with the version and token a replace needs."""

    value: dict[str, Any]
    version: int
    token: str
    updated_ms: int = 0

    @staticmethod
    def load(doc: Versioned | None) -> Versioned:
        """``doc``, or an empty value at version 0 when there is no document (the
        ``load`` of :meth:`DocumentStore.update` for plain values)."""
        return Versioned({}, 0, "") if doc is None else doc

    def to_json(self) -> dict[str, Any]:
        return self.value

    def with_version(self, version: int, token: str) -> Versioned:
        return replace(self, version=version, token=token)


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

    def update(self, name: str, change: Callable[[D], D | None], *, load: Callable[[Versioned | None], D],
               current: D | None = None, policy: ConflictPolicy | None = None, what: str = "",
               on_unknown: Callable[[StorageError], None] | None = None) -> D:
        """Read ``name``, apply ``change``, compare-and-swap; on a conflict, all again.

        Each attempt reads the document and turns it into a value with ``load`` (given
        ``None`` when there is no document), or starts from ``current`` on the first
        attempt when the caller holds a copy, calls ``change`` on it and writes what it
        returns with one compare-and-swap: a create when the value read is at version 0,
        else a replace of that version.  ``change`` returning ``None`` writes nothing.

        A conflict (the swap lost, or ``change`` raised :class:`ConflictError`) starts a
        new attempt, which reads the document again, under ``policy`` (a
        :class:`~shale.storage.retry.ConflictPolicy`: jittered exponential waits, bounded
        attempts, a log line naming ``what`` before each wait); when the attempts run out
        the last conflict is raised.  ``change`` must therefore give the right answer when
        called again on a newer value.  Anything else it raises ends the update.

        A write whose outcome is unknown (:class:`StateUnknownError`, or a
        :class:`TransientStorageError` left when the store's own retries ran out) is
        raised as it is: the caller must read again before it decides anything.  Given
        ``on_unknown``, that is called with the error instead and the attempt counts as a
        conflict: ``change``, called on the value read again, must then tell from it
        whether the earlier write landed.

        Returns the value written, at its new version and token, or the value read when
        ``change`` wrote nothing.
        """
        for attempt in (policy or ConflictPolicy()).loop(what or self.url(name)):
            with attempt:
                state = current if current is not None and attempt.number == 1 else \
                    load(self.read(name))
                new = change(state)
                if new is None:
                    return state
                try:
                    if state.version == 0:
                        v = self.create(name, new.to_json())
                    else:
                        v = self.replace(name, new.to_json(), state.version, token=state.token or None)
                except (StateUnknownError, TransientStorageError) as e:
                    if on_unknown is None:
                        raise
                    on_unknown(e)
                    raise ConflictError(f"{self.url(name)}: a write's outcome is unknown; reading it again") from e
                return new.with_version(v.version, v.token)
        raise AssertionError("unreachable")  # tenacity reraises on the last attempt

    def _conflict(self, name: str, expected: int, current: Versioned | None) -> ConflictError:
        found = current.version if current else None
        return ConflictError(f"{self.url(name)}: expected version {expected}, found "
                             f"{'no document' if found is None else f'version {found}'}",
                             expected=expected, found=found)
