"""What the format reads objects from: :class:`ObjectSource`, the part of a store's
interface that reading a ledger needs.

Every store of :mod:`shale.storage` satisfies it; the format names only this protocol,
so that it depends on no store.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["ObjectSource"]


class ObjectSource(Protocol):
    """Whole and ranged reads of immutable objects under string keys."""

    def url(self, key: str) -> str:
        """The full URI of ``key``, for messages."""

    def get(self, key: str) -> bytes:
        """The whole object; :class:`~shale.ledger.errors.ObjectNotFoundError` if missing."""

    def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        """The last ``length`` bytes (or the whole object if smaller) and the object's size."""

    def get_view(self, key: str, start: int, end: int) -> bytes | memoryview:
        """Bytes ``[start, end)`` (shorter only at the object's end), perhaps a read-only view."""
