"""Where a topic's objects live, and the exact names Shale gives them.

::

    <topic>/_meta/topic.json                                  ledger list
    <topic>/_meta/compaction.json                             compaction state
    <topic>/ledgers/<id:020d>-<nonce>.ledger                  original ledgers
    <topic>/compacted/<epoch:012d>-<nonce>/part-....ledger    compacted parts of one run
    <topic>/compacted/<epoch:012d>-<nonce>/deletions-....bin  deletion vectors of parts kept in place
    <topic>/compacted/<epoch:012d>-<nonce>/_run.json          a running compaction's heartbeat
    <topic>/dictionaries/<id:010d>-<nonce>.zdict               trained zstd dictionaries

Garbage collection deletes only objects whose names match the ledger and compaction
patterns exactly (never a dictionary: entries compressed with one may outlive every
ledger written with it, copied into compacted parts), so
nothing else under a topic's folder — another topic nested in it, a file somebody put
there — is ever taken for a leftover; metadata documents naming anything else are
refused before they are acted on.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "COMPACTED_DIR",
    "DICTIONARY_DIR",
    "HEARTBEAT_NAME",
    "LEDGER_DIR",
    "META_DIR",
    "dictionary_object_name",
    "is_compacted_object",
    "is_dictionary_object",
    "is_ledger_object",
    "is_run_dir",
    "ledger_id_of",
    "ledger_object_name",
    "run_dir_of",
]

META_DIR: Final = "_meta"
LEDGER_DIR: Final = "ledgers"
COMPACTED_DIR: Final = "compacted"
HEARTBEAT_NAME: Final = "_run.json"
DICTIONARY_DIR: Final = "dictionaries"

_NONCE: Final = "[0-9a-f]{12}"
_LEDGER: Final = re.compile(rf"{LEDGER_DIR}/(\d{{20}})-{_NONCE}\.ledger")
_RUN: Final = rf"{COMPACTED_DIR}/\d{{12,20}}-{_NONCE}"
_DICTIONARY: Final = re.compile(rf"{DICTIONARY_DIR}/(\d{{10}})-{_NONCE}\.zdict")
_RUN_DIR: Final = re.compile(_RUN)
# part-NNNNN (one process), part-GGGGG-NNNNN (pass-two workers), part-TTTTTT-NNNNN (Spark tasks)
_COMPACTED: Final = re.compile(
    rf"{_RUN}/(?:part-\d{{5,6}}(?:-\d{{5}})?\.ledger|deletions-\d{{5,6}}(?:-\d{{5}})?\.bin|{re.escape(HEARTBEAT_NAME)})")


def ledger_object_name(ledger_id: int, nonce: str) -> str:
    """The name of an original ledger object, relative to the topic's folder."""
    return f"{LEDGER_DIR}/{ledger_id:020d}-{nonce}.ledger"


def is_ledger_object(name: str) -> bool:
    """Whether ``name`` (relative to the topic's folder) is named as Shale names an
    original ledger object."""
    return _LEDGER.fullmatch(name) is not None


def ledger_id_of(name: str) -> int | None:
    """The ledger id an original ledger object's name carries (``None`` for other names)."""
    m = _LEDGER.fullmatch(name)
    return int(m.group(1)) if m else None


def dictionary_object_name(dictionary_id: int, nonce: str) -> str:
    """The name of a trained dictionary's object, relative to the topic's folder."""
    return f"{DICTIONARY_DIR}/{dictionary_id:010d}-{nonce}.zdict"


def is_dictionary_object(name: str, dictionary_id: int) -> bool:
    """Whether ``name`` is named as Shale names dictionary ``dictionary_id``'s object."""
    m = _DICTIONARY.fullmatch(name)
    return m is not None and int(m.group(1)) == dictionary_id


def is_compacted_object(name: str) -> bool:
    """Whether ``name`` is named as a compaction run names what it writes: parts,
    deletion vectors and its heartbeat, directly in its run folder."""
    return _COMPACTED.fullmatch(name) is not None


def is_run_dir(name: str) -> bool:
    """Whether ``name`` is a compaction run's folder (``compacted/<epoch>-<nonce>``)."""
    return _RUN_DIR.fullmatch(name) is not None


def run_dir_of(obj: str) -> str:
    """``compacted/<run>/part-00000.ledger`` → ``compacted/<run>``."""
    return "/".join(obj.split("/")[:2])
