"""Shale: an external log compactor for keyed topics on object storage.

The public entry points:

* :class:`TopicWriter` appends records to a topic;
* :class:`shale.reader.TopicReader` and :class:`shale.reader.TableView` read it, in full or compacted;
* :class:`shale.compactor.Compactor` compacts it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shale.producer import ProduceResult, SealedLedger, TopicWriter

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Imported on first use, so that the ``shale`` command can set up the process
    # (see shale.cli) before NumPy is imported.
    if name in ("ProduceResult", "SealedLedger", "TopicWriter"):
        from shale import producer

        return getattr(producer, name)
    raise AttributeError(f"module 'shale' has no attribute {name!r}")

__all__ = ["ProduceResult", "SealedLedger", "TopicWriter", "__version__"]
