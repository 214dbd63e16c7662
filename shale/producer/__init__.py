"""The producer: append records to a topic.

* :class:`TopicWriter` (:mod:`shale.producer.writer`) appends records, one by one or as
  Arrow batches, as sealed and registered ledgers;
* :mod:`shale.producer.columns` checks Arrow or Python columns, :mod:`shale.producer.ingest`
  and :mod:`shale.producer.jsonl_ingest` feed ``shale produce`` from files, and
  :mod:`shale.producer.jsonlines` holds the JSON-lines forms of records;
* :mod:`shale.producer.staging`: ledgers written by many tasks, registered together or
  not at all.

The writer is imported on first use, so that a module of the package (the JSON-lines
forms ``shale read`` prints with) loads without NumPy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shale.producer.writer import ProduceResult, SealedLedger, TopicWriter

__all__ = ["ProduceResult", "SealedLedger", "TopicWriter"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'shale.producer' has no attribute {name!r}")
    from shale.producer import writer

    value = getattr(writer, name)
    globals()[name] = value
    return value
