"""Bounded produce latency: ``shale produce --linger DURATION`` (the ``max-ledger-age``
policy; Kafka's ``linger.ms``, Pulsar's batching delay).

A ledger is sealed when it is full (``max-ledger-records``, ``max-ledger-bytes``) or at
the end of the input; with a linger it is also sealed once its oldest record has waited
that long, so that a follower sees every record within the linger plus its own poll
interval however slowly the input comes.  The writer seals when an append finds the
linger past (:meth:`TopicWriter.seal_if_due <shale.producer.writer.TopicWriter.seal_if_due>`);
``shale produce`` also waits for more input at most until then
(:mod:`shale.producer.pipe`).  Each seal is one object and one compare-and-swap of the
ledger list: a linger of 200 ms on a topic fed a record a second makes a ledger a record.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Linger"]


class Linger:
    """How long the oldest record not sealed yet may still wait (``max_age_ms`` 0: for
    ever, sealed only by size and at the end)."""

    __slots__ = ("_clock", "max_age_ms", "since")

    def __init__(self, max_age_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_ms = max_age_ms
        self._clock = clock
        #: when the oldest record not sealed yet came (None: every record is sealed)
        self.since: float | None = None

    def pending(self) -> None:
        """A record came that is not sealed yet."""
        if self.since is None:
            self.since = self._clock()

    def sealed(self) -> None:
        """Everything that came is sealed."""
        self.since = None

    def due(self) -> float | None:
        """Seconds until what waits must be sealed (0: now; None: nothing waits, or no linger)."""
        if self.since is None or self.max_age_ms <= 0:
            return None
        return max(0.0, self.since + self.max_age_ms / 1000 - self._clock())
