"""Where a topic's objects live, and the exact names Shale gives them.

::

    <topic>/_meta/topic.json                                  ledger list
    <topic>/_meta/compaction.json                             compaction state
    <topic>/ledgers/<id:020d>-<nonce>.ledger                  original ledgers
    <topic>/compacted/<epoch:012d>-<nonce>/part-....ledger    compacted parts of one run
    <topic>/compacted/<epoch:012d>-<nonce>/deletions-NNNNN.bin
    <topic>/compacted/<epoch:012d>-<nonce>/_run.json          a running compaction's heartbeat

Garbage collection deletes only objects whose names match these patterns exactly, so
nothing else under a topic's folder — another topic nested in it, a file somebody put
there — is ever taken for a leftover; metadata documents naming anything else are
refused before they are acted on.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "COMPACTED_DIR",
    "HEARTBEAT_NAME",
    "LEDGER_DIR",
    "META_DIR",
    "is_compacted_object",
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

_NONCE: Final = "[0-9a-f]{12}"
_LEDGER: Final = re.compile(rf"{LEDGER_DIR}/(\d{{20}})-{_NONCE}\.ledger")
_RUN: Final = rf"{COMPACTED_DIR}/\d{{12,20}}-{_NONCE}"
_RUN_DIR: Final = re.compile(_RUN)
# part-NNNNN (one process), part-GGGGG-NNNNN (pass-two workers), part-TTTTTT-NNNNN (Spark tasks)
_COMPACTED: Final = re.compile(
    rf"{_RUN}/(?:part-\d{{5,6}}(?:-\d{{5}})?\.ledger|deletions-\d{{5}}\.bin|{re.escape(HEARTBEAT_NAME)})")


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
