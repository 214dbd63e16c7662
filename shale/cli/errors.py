"""Exit codes: what a command ends with for each outcome and each class of error.

They live here, with the command line, not on the errors: the library raises errors that
say what went wrong (:mod:`shale.ledger.errors`), and only a command turns them into a
number for a scheduler.  The rule: what the command was given (flags, variables, values,
URIs, records, its access rights) is wrong: 2; the data it found is wrong: 4; storage
failed on its own: 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from shale.ledger.errors import (
    CORRUPTION,
    BucketNotFoundError,
    ConflictError,
    GapError,
    InUseError,
    InvalidInputError,
    ObjectNotFoundError,
    ProducerFencedError,
    StoragePermissionError,
    UnsupportedOperationError,
)

__all__ = ["EXIT_CONFLICT", "EXIT_CORRUPT", "EXIT_FAILURE", "EXIT_GAP", "EXIT_INTERRUPTED", "EXIT_MISMATCH",
           "EXIT_NOT_FOUND", "EXIT_OK", "EXIT_SOME_FAILED", "EXIT_USAGE", "exit_code_of", "run_exit_code", "worst"]

EXIT_OK: Final = 0
#: Unexpected, or storage that failed on its own (unreachable, an I/O error, a full disk).
EXIT_FAILURE: Final = 1
#: Bad usage or input: a flag, variable, value, URI, record or id; access refused.
EXIT_USAGE: Final = 2
#: Lost a compare-and-swap race: another writer or compactor won; safe to run again.  Also
#: a change refused while a live reader holds what it changes (run again once it stops).
EXIT_CONFLICT: Final = 3
#: Corrupt data: an object failed its checks, a metadata document broke its schema.
EXIT_CORRUPT: Final = 4
#: ``shale verify``: the compacted view differs from the one recomputed.
EXIT_MISMATCH: Final = 5
#: ``shale get``: the key has no value (as ``verify`` uses 5 for a mismatch).
EXIT_NOT_FOUND: Final = 5
#: A reader's next records were removed (retention) before it read them.
EXIT_GAP: Final = 6
#: ``compact`` of several topics: some failed, the others did what was asked (each topic's
#: own code is in its summary).  A scheduler need not run the others again for them.
EXIT_SOME_FAILED: Final = 7
#: Interrupted (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED: Final = 130

#: Error classes and their exit codes, most specific first (the first that matches wins).
_CODES: Final[tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], int], ...]] = (
    (GapError, EXIT_GAP),
    (CORRUPTION, EXIT_CORRUPT),
    ((ConflictError, InUseError, ProducerFencedError), EXIT_CONFLICT),
    (InvalidInputError, EXIT_USAGE),
    # how the command is run, not the data: a file's permissions, S3's access denied
    ((StoragePermissionError, PermissionError), EXIT_USAGE),
    # a missing topic, object or bucket, or storage that cannot do what was asked of it
    ((ObjectNotFoundError, BucketNotFoundError, UnsupportedOperationError), EXIT_USAGE),
)

#: Worst first when several topics' runs end differently: corrupt, unexpected, usage, lost race.
_SEVERITY: Final = {EXIT_OK: 0, EXIT_CONFLICT: 1, EXIT_USAGE: 2, EXIT_FAILURE: 3, EXIT_CORRUPT: 4}


def exit_code_of(e: BaseException) -> int:
    """The exit code a command ends with for ``e``."""
    if isinstance(e, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return next((code for classes, code in _CODES if isinstance(e, classes)), EXIT_FAILURE)


def run_exit_code(codes: Sequence[int]) -> int:
    """The exit code of a run of several topics whose own codes are ``codes``: 0 when every
    one did what was asked, the worst of them when every one failed (a run of one topic
    ends as that topic), else :data:`EXIT_SOME_FAILED`: the others completed."""
    failed = [c for c in codes if c != EXIT_OK]
    if not failed:
        return EXIT_OK
    return worst(failed) if len(failed) == len(codes) else EXIT_SOME_FAILED


def worst(codes: Iterable[int]) -> int:
    """The exit code of several topics' runs: the worst outcome (4, then 1, 2, 3)."""
    out = EXIT_OK
    for code in codes:
        if _SEVERITY.get(code, 3) > _SEVERITY.get(out, 3):
            out = code
    return out
