"""Every record the campaign produced, in a plain dict, and what each view of the topic
must be according to it.

Each record carries a property ``u`` naming it uniquely, so a record read back is matched
to the record produced by its id and by that name: an id that moved, a record read twice
or under another id, a value changed, all show.

A compacted view with horizon ``H`` (DESIGN.md, invariant 2) is, at or below ``H``, the
latest record of every key among the records at or below ``H`` — a value always, a
tombstone only while it is kept (delete retention, or held for a subscription), never a
keyless record (``retain-null-key`` is off) — in id order, then every record above ``H``
exactly once, in order.  Tombstones at or after the least position of the active
subscriptions must be there (``compactor/hold.py``): positions only move forward, so every
run that built the view planned with a floor at or below today's.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from shale.ledger.ids import MessageId
from shale.ledger.record import Message

__all__ = ["Model", "Rec", "from_json_line", "message_ids"]


@dataclass(frozen=True, slots=True)
class Rec:
    """One record produced: its id, its unique name, its key and value (None: a tombstone
    when keyed)."""

    id: MessageId
    uid: str
    key: str | None
    value: str | None

    @property
    def tombstone(self) -> bool:
        return self.key is not None and self.value is None


def message_ids(ledger: int, records: int, batch: int) -> list[MessageId]:
    """The ids of a ledger's records when a writer cuts an entry every ``batch`` records
    (as ``TopicWriter`` and ``shale produce`` do with ``batch_size``, small records)."""
    return [MessageId(ledger, i // batch, i % batch) for i in range(records)]


def from_json_line(line: str) -> Message:
    """A record as ``shale read`` prints it, as a :class:`Message`."""
    import base64

    d = json.loads(line)
    key = None if d["key"] is None else d["key"].encode()
    if "value_b64" in d:
        value: bytes | None = base64.b64decode(d["value_b64"])
    else:
        value = None if d["value"] is None else str(d["value"]).encode()
    return Message(MessageId.parse(d["id"]), key, value, dict(d.get("properties") or {}), d["publish_time"],
                   d.get("event_time"))


@dataclass
class Model:
    """The records produced so far, by id (filled by the producers' threads)."""

    records: dict[MessageId, Rec] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, recs: Iterable[Rec]) -> None:
        with self._lock:
            for r in recs:
                if r.id in self.records:
                    raise AssertionError(f"two records produced with id {r.id}: {self.records[r.id]} and {r}")
                self.records[r.id] = r

    def ordered(self) -> list[Rec]:
        with self._lock:
            return [self.records[i] for i in sorted(self.records)]

    def table(self) -> dict[str, str]:
        """The latest value of every live key."""
        latest: dict[str, str | None] = {}
        for r in self.ordered():
            if r.key is not None:
                latest[r.key] = r.value
        return {k: v for k, v in latest.items() if v is not None}

    def latest_at_or_below(self, horizon: MessageId | None) -> dict[str, Rec]:
        """The latest record of every key among those at or below ``horizon``."""
        latest: dict[str, Rec] = {}
        if horizon is None:
            return latest
        for r in self.ordered():
            if r.id > horizon:
                break
            if r.key is not None:
                latest[r.key] = r
        return latest

    def above(self, horizon: MessageId | None) -> list[Rec]:
        return [r for r in self.ordered() if horizon is None or r.id > horizon]

    # ------------------------------------------------------------------ checks

    def mismatches(self, msgs: Sequence[Message], what: str) -> list[str]:
        """Records read that are not the record produced with that id, or out of order."""
        problems = []
        last: MessageId | None = None
        for m in msgs:
            if last is not None and m.id <= last:
                problems.append(f"{what}: id {m.id} after {last} (out of order or twice)")
            last = m.id
            rec = self.records.get(m.id)
            if rec is None:
                problems.append(f"{what}: {m.id} was never produced ({m.properties.get('u')!r})")
            elif not _same(rec, m):
                problems.append(f"{what}: {m.id} reads {_shown(m)}, produced {rec}")
            if len(problems) > 5:
                break
        return problems

    def check_view(self, msgs: Sequence[Message], horizon: MessageId | None, floor: MessageId | None,
                   what: str, *, since: bool = True) -> list[str]:
        """What is wrong with ``msgs`` as the compacted view at ``horizon``, with the
        active subscriptions' least position ``floor`` (module docstring); with
        ``since=False``, the view alone (nothing above its horizon: a read as of it)."""
        problems = self.mismatches(msgs, what)
        below = [m for m in msgs if horizon is not None and m.id <= horizon]
        latest = self.latest_at_or_below(horizon)
        want = sorted(r.id for r in latest.values() if not r.tombstone)
        got = [m.id for m in below if not m.is_tombstone]
        if got != want:
            problems.append(f"{what}: at or below {horizon}, values {_diff(got, want)}")
        kept = {m.id for m in below if m.is_tombstone}
        latest_tombs = {r.id for r in latest.values() if r.tombstone}
        if kept - latest_tombs:
            problems.append(f"{what}: superseded tombstones kept: {sorted(map(str, kept - latest_tombs))[:5]}")
        held = {t for t in latest_tombs if floor is not None and t >= floor}
        if held - kept:
            problems.append(f"{what}: tombstones at or after the subscriptions' floor {floor} were dropped: "
                            f"{sorted(map(str, held - kept))[:5]}")
        got_above = [m.id for m in msgs if horizon is None or m.id > horizon]
        want_above = [r.id for r in self.above(horizon)] if since else []
        if got_above != want_above:
            problems.append(f"{what}: above {horizon}, {_diff(got_above, want_above)}")
        return problems


def _same(rec: Rec, m: Message) -> bool:
    if m.properties.get("u") != rec.uid or (m.key.decode() if m.key is not None else None) != rec.key:
        return False
    if rec.tombstone:
        return m.is_tombstone
    return m.value is not None and m.value.decode() == rec.value


def _shown(m: Message) -> str:
    return f"{m.key!r}={m.value!r} {dict(m.properties)}"


def _diff(got: Sequence[MessageId], want: Sequence[MessageId]) -> str:
    """How ``got`` differs from ``want`` (ids), in a few words."""
    g, w = set(got), set(want)
    dup = len(got) - len(g)
    parts = [f"{len(got)} read, {len(want)} expected"]
    if w - g:
        parts.append(f"missing {sorted(map(str, w - g))[:5]}")
    if g - w:
        parts.append(f"extra {sorted(map(str, g - w))[:5]}")
    if dup:
        parts.append(f"{dup} read twice")
    if not (w - g or g - w or dup):
        parts.append("out of order")
    return "; ".join(parts)
