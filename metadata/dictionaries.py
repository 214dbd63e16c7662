"""A topic's trained zstd dictionaries: registered in ``topic.json``, each stored once as
an object of its own (``dictionaries/<id>-<nonce>.zdict``), never deleted once registered.

Small records compress poorly one entry at a time; a dictionary trained on a sample of the
topic's records lets zstd start every entry from what such records look like.  Producers
and compactions compress with the newest one when the topic's compression is
``zstd-dict``; a frame names the dictionary it needs, so entries compressed with older
ones stay readable.  A dictionary read back is checked before use: its object's size,
CRC32C and SHA-256 against what ``topic.json`` registered (registrations made before the
SHA-256 was recorded have only the size and CRC32C), zstd's magic, and its id.  A
registered dictionary whose object is missing is a damaged topic, like a missing ledger.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING

from shale.ledger.codecs import Codec, Compression, Dictionary
from shale.ledger.errors import (
    ConflictError,
    CorruptLedgerError,
    InvalidInputError,
    ObjectNotFoundError,
    TopicNotFoundError,
)
from shale.metadata.layout import UNREGISTERED_MAX_AGE_MS, dictionary_object_name
from shale.metadata.state import DictionaryInfo, TopicState

if TYPE_CHECKING:
    from shale.metadata.topic import TopicMetadata

__all__ = ["DictionaryCache", "register_dictionary", "resolve_compression"]


class DictionaryCache:
    """The topic's dictionaries by id, each read and checked once (a
    :data:`~shale.ledger.codecs.DictionarySource`)."""

    def __init__(self, meta: TopicMetadata) -> None:
        self._meta = meta
        self._known: dict[int, Dictionary] = {}
        self._lock = threading.Lock()

    def __call__(self, dictionary_id: int) -> Dictionary:
        with self._lock:
            got = self._known.get(dictionary_id)
            if got is None:
                got = self._known[dictionary_id] = self._load(dictionary_id)
            return got

    def _load(self, dictionary_id: int) -> Dictionary:
        import hashlib  # (here and below: a topic's metadata is read without OpenSSL and NumPy)

        from shale.ledger.kernels import crc32c

        meta = self._meta
        info = next((d for d in meta.load_topic().dictionaries if d.id == dictionary_id), None)
        if info is None:
            raise CorruptLedgerError(f"{meta.uri}: no dictionary {dictionary_id} is registered in topic.json")
        store, key = meta.topic.store, meta.topic.key(info.object)
        where = store.url(key)
        try:
            data = store.get(key)
        except ObjectNotFoundError as e:
            # registered, so entries may need it: the topic is damaged (a permission
            # error or a failing store is said as it is)
            raise CorruptLedgerError(f"{where}: dictionary {dictionary_id} is registered in topic.json and its "
                                     "object is missing (no such object)", path=where) from e
        if len(data) != info.bytes or crc32c(data) != info.crc32c:
            raise CorruptLedgerError(f"{where}: the dictionary's bytes changed since it was registered "
                                     f"({len(data)} bytes, {info.bytes} registered; CRC32C "
                                     f"{'same' if crc32c(data) == info.crc32c else 'different'})", path=where)
        if info.sha256 is not None and hashlib.sha256(data).hexdigest() != info.sha256:
            raise CorruptLedgerError(f"{where}: the dictionary's bytes changed since it was registered (same size "
                                     "and CRC32C, another SHA-256)", path=where)
        return Dictionary.load(data, where, expect_id=dictionary_id)

    def newest(self) -> Dictionary | None:
        """The newest registered dictionary (what new entries are compressed with)."""
        try:
            dictionaries = self._meta.load_topic().dictionaries
        except TopicNotFoundError:
            return None  # (a topic about to be created has none)
        return self(dictionaries[-1].id) if dictionaries else None

    def all(self) -> tuple[Dictionary, ...]:
        """Every registered dictionary (for processes that cannot read the topic's
        metadata themselves)."""
        return tuple(self(d.id) for d in self._meta.load_topic().dictionaries)


def register_dictionary(meta: TopicMetadata, dictionary: Dictionary, attempts: int = 20) -> DictionaryInfo:
    """Store ``dictionary`` (create-only, under a name no other writer uses) and add it to
    the topic's ``topic.json`` with compare-and-swap; it becomes the newest."""
    import hashlib

    from shale.ledger.kernels import crc32c

    store = meta.topic.store
    name = dictionary_object_name(dictionary.id, uuid.uuid4().hex[:12])
    # (a unique name: nobody else writes it, and a failed registration leaves an object
    # nothing refers to, which garbage collection takes past the orphan grace)
    store.put(meta.topic.key(name), dictionary.data)
    uploaded = time.monotonic()
    info = DictionaryInfo(dictionary.id, name, len(dictionary.data), meta.now_ms(), crc32c(dictionary.data),
                          hashlib.sha256(dictionary.data).hexdigest())

    def registered(current: TopicState) -> TopicState:
        nonlocal name, uploaded, info
        if any(d.id == dictionary.id for d in current.dictionaries):
            raise InvalidInputError(f"{meta.uri}: dictionary {dictionary.id} is registered already")
        if time.monotonic() - uploaded > UNREGISTERED_MAX_AGE_MS / 1000:
            # garbage collection may take an unregistered object this old for a
            # leftover: register a fresh copy instead
            old, name = name, dictionary_object_name(dictionary.id, uuid.uuid4().hex[:12])
            store.put(meta.topic.key(name), dictionary.data)
            uploaded = time.monotonic()
            info = replace(info, object=name)
            with contextlib.suppress(ObjectNotFoundError):
                store.delete(meta.topic.key(old))
        return replace(current, dictionaries=(*current.dictionaries, info))

    try:
        meta.update_topic(registered, attempts=attempts, what="registering a dictionary")
    except ConflictError as e:
        raise ConflictError(f"{meta.uri}: the topic kept changing; the dictionary was not registered ({e})") from e
    return info


def resolve_compression(meta: TopicMetadata, compression: Compression) -> Compression:
    """``compression`` ready to write with: ``zstd-dict`` given the topic's newest
    dictionary (refused, in words, when the topic has none)."""
    if not compression.needs_dictionary:
        return compression
    newest = meta.dictionaries.newest()
    if newest is None:
        raise InvalidInputError(f"{meta.uri}: compression {compression} needs a trained dictionary and the topic has "
                                f"none: train one with `shale dictionary {meta.uri} --train`")
    return Compression(Codec.ZSTD_DICT, compression.level, newest)
