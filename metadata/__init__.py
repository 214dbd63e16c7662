"""Shale's metadata store: versioned documents with compare-and-swap, and the topic
ledger list and compaction state kept in them."""

from metadata.documents import DocumentStore, Versioned
from metadata.layout import META_DIR
from metadata.state import CompactedPart, CompactionState, LedgerInfo, RetiredSet, TopicState
from metadata.topic import COMPACTION_DOC, TOPIC_DOC, TopicMetadata, topic_locations

__all__ = [
    "COMPACTION_DOC",
    "META_DIR",
    "TOPIC_DOC",
    "CompactedPart",
    "CompactionState",
    "DocumentStore",
    "LedgerInfo",
    "RetiredSet",
    "TopicMetadata",
    "TopicState",
    "Versioned",
    "topic_locations",
]
