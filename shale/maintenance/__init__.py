"""Keeping topics: everything done to a topic besides the compaction run itself.

Garbage collection (:mod:`~shale.maintenance.gc`), retention (:mod:`~shale.maintenance.retention`),
snapshots, rollback and tags (:mod:`~shale.maintenance.snapshots`, :mod:`~shale.maintenance.tags`),
scrubbing and verifying (:mod:`~shale.maintenance.scrub`, :mod:`~shale.maintenance.verify`),
durable subscriptions and their lag (:mod:`~shale.maintenance.subscriptions`), training zstd
dictionaries (:mod:`~shale.maintenance.dictionary`), policies as people name them
(:mod:`~shale.maintenance.policies`), listing topics (:mod:`~shale.maintenance.listing`) and
a topic's status (:mod:`~shale.maintenance.status`).
"""

__all__: list[str] = []
