"""Shale: an external log compactor for keyed topics on object storage.

The public entry points:

* :class:`TopicWriter` appends records to a topic;
* :class:`reader.TopicReader` and :class:`reader.TableView` read it, in full or compacted;
* :class:`compactor.Compactor` compacts it.
"""

from shale.producer import ProduceResult, SealedLedger, TopicWriter

__version__ = "0.1.0"

__all__ = ["ProduceResult", "SealedLedger", "TopicWriter", "__version__"]
