"""Topics as Arrow data: record batches decoded a whole entry at a time
(:mod:`shale.ledger.arrow_batches`), or read from a compacted part's Arrow cache
(:mod:`shale.ledger.arrow_cache`) where the view has one that matches its part.

An entry is decompressed once and its records decoded straight into the buffers of Arrow
arrays by one C call; no Python object is made per record.  The columns are those of
:func:`~shale.ledger.arrow_batches.schema`, described there.

pyarrow is an optional dependency: ``pip install 'shale[arrow]'``.
"""

from __future__ import annotations

from types import ModuleType

from shale.ledger.arrow_batches import (
    DEFAULT_BATCH_ROWS,
    DEFAULT_MAX_BATCH_BYTES,
    MAX_DECODE_THREADS,
    ROW_BYTES,
    BatchReader,
    record_bytes,
    require_pyarrow,
    schema,
)
from shale.ledger.errors import InvalidInputError

__all__ = ["DEFAULT_BATCH_ROWS", "DEFAULT_MAX_BATCH_BYTES", "MAX_DECODE_THREADS", "ROW_BYTES", "BatchReader",
           "decode_threads", "record_bytes", "require", "require_pyarrow", "schema"]


def decode_threads() -> int:
    """Threads a reader decodes batches on: one per CPU this process may use, as the
    compactor counts them (:func:`~shale.runtime.cpus.available_cpus`: its affinity, capped
    by a cgroup v2 CPU quota as a container's CPU limit sets it), at most
    :data:`MAX_DECODE_THREADS`."""
    from shale.runtime.cpus import available_cpus

    return min(available_cpus(), MAX_DECODE_THREADS)


def require(name: str) -> ModuleType:
    """An optional library (pandas, polars), or a one-line error saying how to install it."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        raise InvalidInputError(f"this needs {name}: pip install {name}") from None
