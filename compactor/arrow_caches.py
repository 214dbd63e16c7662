"""The Arrow caches of the parts a run wrote (policy ``arrow-cache``): each part read back
and decoded once more, its rows written beside it (:mod:`shale.ledger.arrow_cache`), before
the run publishes — so a published part that has a cache has it complete, and the state
names it with its part (garbage collection, snapshots and rollback keep and delete the two
together).  Parts kept in place keep the cache they had, if any."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from shale.compactor.pass_two import PassTwoResult
from shale.ledger.arrow_cache import write_cache
from shale.ledger.format import KIND_COMPACTED
from shale.ledger.reader import LedgerFile
from shale.metadata.layout import arrow_cache_name
from shale.metadata.topic import TopicMetadata
from shale.storage import ObjectWriter

__all__ = ["write_arrow_caches"]


class _Counted:
    """An upload as the file pyarrow writes to: it asks where it stands."""

    def __init__(self, upload: ObjectWriter) -> None:
        self.upload, self.at, self.closed = upload, 0, False

    def write(self, data: bytes | bytearray | memoryview) -> int:
        n = self.upload.write(data)
        self.at += n
        return n

    def tell(self) -> int:
        return self.at

    def flush(self) -> None:
        pass  # (the upload sends what it holds when closed)


def write_arrow_caches(meta: TopicMetadata, out: PassTwoResult, run_dir: str,
                       on_object: Callable[[str], None]) -> int:
    """Write the cache of every part of ``out`` this run wrote (under ``run_dir``), naming
    it in ``out``'s parts; each is told to ``on_object`` before it is written (a failed
    run removes it).  The bytes written."""
    loc = meta.topic
    written = 0
    for i, part in enumerate(out.parts):
        if not part.object.startswith(f"{run_dir}/") or part.arrow_cache is not None:
            continue  # (kept in place from an earlier run)
        name = arrow_cache_name(part.object)
        on_object(name)
        f = LedgerFile.open(loc.store, loc.key(part.object), ledger_id=part.ledger_id, kind=KIND_COMPACTED,
                            dictionaries=meta.dictionaries)
        with loc.store.open_writer(loc.key(name)) as upload:
            sink = _Counted(upload)
            write_cache(f, sink)
        written += sink.at
        out.parts[i] = replace(part, arrow_cache=name)
    return written
