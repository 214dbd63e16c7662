"""Shale's metadata store: versioned documents with compare-and-swap, and the topic
ledger list and compaction state kept in them."""

from shale.metadata.documents import DocumentStore, Versioned
from shale.metadata.layout import META_DIR
from shale.metadata.state import CompactedPart, CompactionState, LedgerInfo, RetiredSet, Snapshot, TopicState
from shale.metadata.topic import COMPACTION_DOC, TOPIC_DOC, TopicMetadata, topic_locations

__all__ = [
    "COMPACTION_DOC",
    "META_DIR",
    "TOPIC_DOC",
    "CompactedPart",
    "CompactionState",
    "DocumentStore",
    "LedgerInfo",
    "RetiredSet",
    "Snapshot",
    "TopicMetadata",
    "TopicState",
    "Versioned",
    "topic_locations",
]
