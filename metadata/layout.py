"""Where a topic's objects live, and the exact names Shale gives them.

::

    <topic>/_meta/topic.json                                  ledger list
    <topic>/_meta/compaction.json                             compaction state
    <topic>/ledgers/<id:020d>-<nonce>.ledger                  original ledgers
    <topic>/compacted/<epoch:012d>-<nonce>/part-....ledger    compacted parts of one run
    <topic>/compacted/<epoch:012d>-<nonce>/part-....arrow     a part's Arrow cache (policy arrow-cache)
    <topic>/compacted/<epoch:012d>-<nonce>/deletions-....bin  deletion vectors of parts kept in place
    <topic>/compacted/<epoch:012d>-<nonce>/_run.json          a running compaction's heartbeat
    <topic>/dictionaries/<id:010d>-<nonce>.zdict               trained zstd dictionaries
    <topic>/staging/<write>/task-<partition:06d>-<nonce>.json  a distributed write's task, staging
    <topic>/staging/<write>/_done.json                         that write was committed or aborted

Garbage collection deletes only objects whose names match these patterns exactly (and
never a registered dictionary: entries compressed with one may outlive every ledger
written with it, copied into compacted parts), so nothing else under a topic's folder —
another topic nested in it, a file somebody put there — is ever taken for a leftover;
metadata documents naming anything else are refused before they are acted on.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Final

from shale.ledger.errors import InvalidInputError

if TYPE_CHECKING:
    from shale.storage import Location

__all__ = [
    "COMPACTED_DIR",
    "DICTIONARY_DIR",
    "HEARTBEAT_NAME",
    "LEDGER_DIR",
    "META_DIR",
    "STAGING_DIR",
    "UNREGISTERED_MAX_AGE_MS",
    "arrow_cache_name",
    "dictionary_object_name",
    "is_compacted_object",
    "is_dictionary_name",
    "is_dictionary_object",
    "is_ledger_object",
    "is_run_dir",
    "is_staging_object",
    "ledger_id_of",
    "ledger_name_parts",
    "ledger_object_name",
    "refuse_a_file",
    "run_dir_of",
    "staging_done_name",
    "staging_task_name",
    "staging_task_of",
    "write_dir_of",
]

META_DIR: Final = "_meta"
LEDGER_DIR: Final = "ledgers"
COMPACTED_DIR: Final = "compacted"
HEARTBEAT_NAME: Final = "_run.json"
DICTIONARY_DIR: Final = "dictionaries"
STAGING_DIR: Final = "staging"
_DONE_NAME: Final = "_done.json"

#: An object uploaded for registration and older than this (by the store's clock) is
#: not registered any more but written again under a new name: garbage collection takes
#: unregistered objects older than its orphan grace (at least three times this) for
#: leftovers, and must never race their registration.
UNREGISTERED_MAX_AGE_MS: Final = 300_000

_NONCE: Final = "[0-9a-f]{12}"
_LEDGER: Final = re.compile(rf"{LEDGER_DIR}/(\d{{20}})-({_NONCE})\.ledger")
_RUN: Final = rf"{COMPACTED_DIR}/\d{{12,20}}-{_NONCE}"
_DICTIONARY: Final = re.compile(rf"{DICTIONARY_DIR}/(\d{{10}})-{_NONCE}\.zdict")
_RUN_DIR: Final = re.compile(_RUN)
_WRITE: Final = rf"{STAGING_DIR}/{_NONCE}"
_STAGING: Final = re.compile(rf"({_WRITE})/(?:task-(\d{{6,10}})-({_NONCE})\.json|{re.escape(_DONE_NAME)})")
# part-NNNNN (one process), part-GGGGG-NNNNN (pass-two workers), part-TTTTTT-NNNNN (Spark tasks)
_COMPACTED: Final = re.compile(
    rf"{_RUN}/(?:part-\d{{5,6}}(?:-\d{{5}})?\.(?:ledger|arrow)|deletions-\d{{5,6}}(?:-\d{{5}})?\.bin|{re.escape(HEARTBEAT_NAME)})")


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


def ledger_name_parts(name: str) -> tuple[int, str] | None:
    """The ledger id and the nonce an original ledger object's name carries (``None``
    for other names)."""
    m = _LEDGER.fullmatch(name)
    return (int(m.group(1)), m.group(2)) if m else None


def dictionary_object_name(dictionary_id: int, nonce: str) -> str:
    """The name of a trained dictionary's object, relative to the topic's folder."""
    return f"{DICTIONARY_DIR}/{dictionary_id:010d}-{nonce}.zdict"


def is_dictionary_object(name: str, dictionary_id: int) -> bool:
    """Whether ``name`` is named as Shale names dictionary ``dictionary_id``'s object."""
    m = _DICTIONARY.fullmatch(name)
    return m is not None and int(m.group(1)) == dictionary_id


def is_dictionary_name(name: str) -> bool:
    """Whether ``name`` is named as Shale names a dictionary's object (of any id)."""
    return _DICTIONARY.fullmatch(name) is not None


def is_compacted_object(name: str) -> bool:
    """Whether ``name`` is named as a compaction run names what it writes: parts, their
    Arrow caches, deletion vectors and its heartbeat, directly in its run folder."""
    return _COMPACTED.fullmatch(name) is not None


def arrow_cache_name(part: str) -> str:
    """The name of the Arrow cache of the compacted part ``part``, beside it
    (``…/part-00000.ledger`` → ``…/part-00000.arrow``: :mod:`shale.ledger.arrow_cache`)."""
    return part.removesuffix(".ledger") + ".arrow"


def is_run_dir(name: str) -> bool:
    """Whether ``name`` is a compaction run's folder (``compacted/<epoch>-<nonce>``)."""
    return _RUN_DIR.fullmatch(name) is not None


def run_dir_of(obj: str) -> str:
    """``compacted/<run>/part-00000.ledger`` → ``compacted/<run>``."""
    return "/".join(obj.split("/")[:2])


def staging_task_name(write: str, partition: int, nonce: str) -> str:
    """The record a distributed write's task (``partition``, its attempt's ``nonce``)
    leaves before it stages anything: the ledgers it stages are named with that nonce."""
    return f"{STAGING_DIR}/{write}/task-{partition:06d}-{nonce}.json"


def staging_done_name(write: str) -> str:
    """The marker of a distributed write that was committed or aborted."""
    return f"{STAGING_DIR}/{write}/{_DONE_NAME}"


def is_staging_object(name: str) -> bool:
    """Whether ``name`` is named as a distributed write names what it keeps under
    ``staging/``: its tasks' records and its marker, directly in its folder."""
    return _STAGING.fullmatch(name) is not None


def staging_task_of(name: str) -> tuple[int, str] | None:
    """The partition and nonce a task's record names (``None`` for other names)."""
    m = _STAGING.fullmatch(name)
    return (int(m.group(2)), m.group(3)) if m and m.group(2) else None


def write_dir_of(name: str) -> str:
    """``staging/<write>/task-….json`` → ``staging/<write>``."""
    return "/".join(name.split("/")[:2])


def refuse_a_file(loc: Location) -> None:
    """Refuse a local file named as a topic, or as a folder of topics: what was given is
    wrong (bad input), not the data found there."""
    if loc.store.scheme == "file" and os.path.exists(loc.uri) and not os.path.isdir(loc.uri):
        raise InvalidInputError(f"{loc.uri}: is a file, not a topic (a topic is a folder holding _meta/topic.json)")
