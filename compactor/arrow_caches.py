"""The Arrow caches of the parts a run wrote (policy ``arrow-cache``): each part read back
and decoded once more, its rows written beside it (:mod:`shale.ledger.arrow_cache`), before
the run publishes — so a published part that has a cache has it complete, and the state
names it with its part (garbage collection, snapshots and rollback keep and delete the two
together).  Parts kept in place keep the cache they had, if any."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from shale.compactor.pass_two import PassTwoResult
from shale.ledger.arrow_cache import write_cache
from shale.ledger.format import KIND_COMPACTED
from shale.ledger.reader import LedgerFile
from shale.metadata.layout import arrow_cache_name
from shale.metadata.state import CompactedPart
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
    run removes it).  Two parts at a time: one's upload (a local file is synced) goes on
    while the next is decoded.  The bytes written."""
    todo = [i for i, p in enumerate(out.parts) if p.object.startswith(f"{run_dir}/") and p.arrow_cache is None]
    for i in todo:  # (parts kept in place from an earlier run keep theirs, or none)
        on_object(arrow_cache_name(out.parts[i].object))
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="shale-cache") as pool:
        sizes = list(pool.map(lambda i: _write_one(meta, out.parts[i]), todo))
    for i in todo:
        out.parts[i] = replace(out.parts[i], arrow_cache=arrow_cache_name(out.parts[i].object))
    return sum(sizes)


def _write_one(meta: TopicMetadata, part: CompactedPart) -> int:
    """The cache of ``part`` written beside it; its bytes."""
    loc = meta.topic
    f = LedgerFile.open(loc.store, loc.key(part.object), ledger_id=part.ledger_id, kind=KIND_COMPACTED,
                        dictionaries=meta.dictionaries)
    with loc.store.open_writer(loc.key(arrow_cache_name(part.object))) as upload:
        sink = _Counted(upload)
        write_cache(f, sink)
    return sink.at
