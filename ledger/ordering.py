"""Which record of a key is its latest, and when a key expires: a topic's order.

Every reader of "the latest value" and both compaction engines take these rules from here.

* **Offset order** (the default, Kafka's and Pulsar's): the record written last wins.
* **Event-time order**: the record with the greatest *time* wins, a later position
  breaking ties.  A record's time is the event time its producer gave it; a record
  without one counts as its **publish time**, the publish time of the entry it was first
  written in (what the footers keep for every record, so that nothing is decoded to
  decide).  A tombstone takes part like any record, with its own time.
* **Key expiry** (``key_ttl_ms`` > 0): a key whose winning record's time is older than
  ``now - key_ttl_ms`` is gone, as if deleted; the time is the one that orders (event
  order) or the publish time (offset order).  Since the winner is the newest record of
  its key by that same time, no older record of the key can come back once it expired.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from shale.ledger.values import dataclass

# NumPy is imported where times are compared, not here: a topic's metadata holds its order,
# and reading the metadata alone (``shale config``, ``shale gc``) needs no NumPy.
if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from shale.ledger.format import Footer
    from shale.ledger.reader import LedgerFile

__all__ = ["EVENT_TIME", "OFFSET", "ORDERS", "TopicOrder", "decoded_times"]

OFFSET: Final = "offset"
EVENT_TIME: Final = "event-time"
#: The orders a topic may have, as its policy and ``compact --order`` name them.
ORDERS: Final = (OFFSET, EVENT_TIME)

if TYPE_CHECKING:
    I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class TopicOrder:
    """How a topic decides its latest records: ``order`` (:data:`ORDERS`) and
    ``key_ttl_ms`` (0: keys never expire)."""

    order: str = OFFSET
    key_ttl_ms: int = 0

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise ValueError(f"unknown order {self.order!r}")
        if self.key_ttl_ms < 0:
            raise ValueError("a key TTL cannot be negative")

    @property
    def by_event_time(self) -> bool:
        return self.order == EVENT_TIME

    @property
    def needs_times(self) -> bool:
        """Whether deciding needs each record's time (event order, or keys that expire)."""
        return self.by_event_time or self.key_ttl_ms > 0

    @property
    def is_default(self) -> bool:
        return self.order == OFFSET and self.key_ttl_ms == 0

    def times(self, footer: Footer, start: int = 0, stop: int | None = None) -> I64 | None:
        """The time of records ``[start, stop)`` of an object: under event order the one
        that orders them, otherwise their publish time (what ages them).  ``None`` when the
        footer does not give event times (a compacted part written by a run that did not
        keep them, or format 1 and 2): :func:`decoded_times` then says."""
        import numpy as np

        from shale.ledger.format import NO_EVENT_TIME

        stop = footer.n_records if stop is None else stop
        if not self.by_event_time:
            return footer.record_publish()[start:stop]
        events = footer.event_times()
        if events is None:
            return None
        got = events[start:stop]
        missing = got == NO_EVENT_TIME
        if not missing.any():
            return np.asarray(got, dtype=np.int64)  # every record has one: no publish times needed
        return np.where(missing, footer.record_publish()[start:stop], got)

    def expired(self, times: I64, now_ms: int) -> npt.NDArray[np.bool_]:
        """Which of these times (of keys' winning records) are past the key TTL at ``now_ms``."""
        import numpy as np

        if self.key_ttl_ms <= 0:
            return np.zeros(len(times), dtype=bool)
        return np.asarray(times, dtype=np.int64) < now_ms - self.key_ttl_ms

    def expired_at(self, time_ms: int, now_ms: int) -> bool:
        """:meth:`expired` for one time."""
        return self.key_ttl_ms > 0 and time_ms < now_ms - self.key_ttl_ms

    def to_json(self) -> dict[str, object]:
        """What a published state records (nothing for the default)."""
        out: dict[str, object] = {}
        if self.order != OFFSET:
            out["order"] = self.order
        if self.key_ttl_ms:
            out["key_ttl_ms"] = self.key_ttl_ms
        return out

    def describe(self) -> str:
        ttl = f", keys expire {self.key_ttl_ms} ms after their latest record" if self.key_ttl_ms else ""
        return f"{self.order} order{ttl}"


def combine(events: I64, publish: I64) -> I64:
    """Event times where records have one, their publish time where not."""
    import numpy as np

    from shale.ledger.format import NO_EVENT_TIME

    events = np.asarray(events, dtype=np.int64)
    return np.where(events == NO_EVENT_TIME, np.asarray(publish, dtype=np.int64), events)


def record_time(event_time: int | None, entry_publish: int) -> int:
    """One record's time under event order (:func:`combine` for one record)."""
    return entry_publish if event_time is None else event_time


def decoded_times(f: LedgerFile, order: TopicOrder, start: int = 0, stop: int | None = None,
                  raw_bytes: int = 0) -> I64:
    """:meth:`TopicOrder.times` of records ``[start, stop)`` of ``f``, decoding the event
    times where its footer does not give them (reading those entries, at most
    ``raw_bytes`` decompressed at once when given: :func:`~shale.ledger.events.read_event_times`)."""
    from shale.ledger.events import read_event_times

    got = order.times(f.footer, start, stop)
    if got is not None:
        return got
    stop = f.n_records if stop is None else stop
    events = read_event_times(f, start, stop, raw_bytes) if raw_bytes else read_event_times(f, start, stop)
    return combine(events, f.footer.record_publish()[start:stop])
