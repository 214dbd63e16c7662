"""Tags: names for retained compacted views (Iceberg's and Paimon's tags), and the listing
of the retained views (``shale snapshots``, and the snapshot lines of ``shale status``).

A tag names the epoch of a retained view in ``compaction.json`` (``tags``: name → epoch;
a view may carry several).  A tagged view is kept whatever ``snapshot-retention`` and
``snapshot-retention-age`` say: every publish keeps it as a snapshot
(:func:`~shale.maintenance.snapshots.kept_snapshots`), so garbage collection never deletes
an object it reads (they are among the state's retained objects) and retention keeps the
ledgers above its horizon, as for any retained snapshot.  Removing the tag changes
nothing else at once: the view falls under the retention again at the next publish (a
compaction or a rollback), whose retention — the topic's policy, or the run's flag —
decides, as when the count is lowered.  ``truncate --drop-snapshots`` never drops a
tagged view: its tag is removed first, on purpose.

Tagging and untagging are one compare-and-swap on ``compaction.json`` each
(:meth:`~shale.metadata.topic.TopicMetadata.update_compaction`, read again on a
conflict).  A compaction that publishes meanwhile carries every tag of the state it
replaces; one that planned before a tag landed loses its own publish (exit 3, safe to
run again) rather than publish without it; and a tag on an epoch a concurrent publish has
just dropped is refused.

A tag is a name ``--as-of`` takes (:func:`~shale.metadata.snapshots.epoch_of_tag`), and
``shale rollback --to-tag`` too; ``shale rollback --to-time`` takes the view current at a
time (:func:`epoch_at`).
"""

from __future__ import annotations

from dataclasses import field, replace
from typing import Any

from shale.ledger.errors import InvalidInputError, SnapshotNotFoundError
from shale.ledger.values import dataclass
from shale.metadata.schema import MAX_TAGS
from shale.metadata.snapshots import check_tag, epoch_of_tag, retained_text
from shale.metadata.state import CompactionState, Snapshot
from shale.metadata.topic import COMPACTION_DOC, TopicMetadata
from shale.settings.units import count, format_time

__all__ = ["TagChange", "ViewList", "epoch_at", "list_views", "tag_view", "untag_view", "utc_time", "view_lines",
           "view_rows"]


def utc_time(ms: int | None) -> str:
    """``ms`` (since 1970) as ``YYYY-MM-DD HH:MM:SS`` in UTC; ``-`` for none."""
    if not ms:
        return "-"
    return format_time(ms)


def _row(view: Snapshot, tags: tuple[str, ...], published: bool) -> dict[str, Any]:
    return {"epoch": view.epoch, "horizon": str(view.horizon) if view.horizon else None,
            "compacted_ms": view.compacted_ms or None, "replaced_ms": view.replaced_ms or None, "keys": view.keys,
            "tombstones": view.tombstones, "records": view.records, "bytes": view.bytes, "parts": len(view.parts),
            "order": view.order.order, "key_ttl_ms": view.order.key_ttl_ms, "tags": list(tags),
            "published": published}


def view_rows(state: CompactionState, *, published: bool = True) -> list[dict[str, Any]]:
    """The retained views, oldest first, as JSON: each snapshot (``compacted_ms``: when it
    was published; ``replaced_ms``: when a newer view replaced it), then, with
    ``published``, the published view; each with the tags naming it."""
    rows = [_row(s, state.tags_of(s.epoch), False) for s in state.snapshots]
    if published and state.epoch:
        rows.append(_row(state.as_snapshot(0), state.tags_of(state.epoch), True))
    return rows


def view_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A line per view of :func:`view_rows`, oldest first."""
    lines = []
    for r in rows:
        head = "published" if r["published"] else "snapshot "
        replaced = "" if r["published"] else f"replaced {utc_time(r['replaced_ms'])} UTC, "
        tags = f", tagged {', '.join(r['tags'])}" if r.get("tags") else ""
        lines.append(f"{head} epoch {r['epoch']}: horizon {r['horizon']}, compacted {utc_time(r['compacted_ms'])} UTC, "
                     f"{replaced}{count(r['keys'], 'key')}, {count(r['records'], 'live record')}, "
                     f"{count(r['bytes'], 'byte')}, {r['order']} order{tags}")
    return lines


@dataclass(frozen=True, slots=True)
class ViewList:
    """``shale snapshots T``: the topic's retained views and its tags."""

    topic: str
    epoch: int
    rows: tuple[dict[str, Any], ...]
    tags: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "epoch": self.epoch, "views": list(self.rows), "tags": dict(self.tags)}

    def human(self) -> str:
        if not self.rows:
            return f"{self.topic}: no compacted view: the topic was never compacted"
        return "\n".join(view_lines(list(self.rows)))


def list_views(meta: TopicMetadata) -> ViewList:
    """The topic's retained views, oldest first, with their tags."""
    state = meta.load_compaction()
    return ViewList(meta.uri, state.epoch, tuple(view_rows(state)), dict(sorted(state.tags.items())))


# ------------------------------------------------------------------------ tag, untag


@dataclass(frozen=True, slots=True)
class TagChange:
    """What ``--tag`` or ``--untag`` did."""

    topic: str
    action: str  # "tag" or "untag"
    tag: str
    epoch: int
    #: False when the tag already named that epoch (nothing was written)
    changed: bool
    #: the topic's tags afterwards
    tags: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "action": self.action, "tag": self.tag, "epoch": self.epoch,
                "changed": self.changed, "tags": dict(self.tags)}

    def human(self) -> str:
        if self.action == "tag":
            done = "tagged" if self.changed else "already tagged"
            return (f"{self.topic}: {done} the view of epoch {self.epoch} {self.tag!r}; it is kept until the tag is "
                    "removed")
        others = sorted(n for n, e in self.tags.items() if e == self.epoch)
        after = (f"it is still tagged {', '.join(others)}" if others else
                 "it falls under the snapshot retention again at the next publish")
        return f"{self.topic}: removed the tag {self.tag!r} from the view of epoch {self.epoch}; {after}"


def tag_view(meta: TopicMetadata, name: str, epoch: int | None = None) -> TagChange:
    """Tag the retained view of ``epoch`` (default: the epoch published when the state is
    first read) ``name``, with one compare-and-swap.  Refused for a bad name
    (:class:`~shale.ledger.errors.InvalidInputError`), an epoch that is not retained — or
    no longer is, a publish having dropped it meanwhile
    (:class:`~shale.ledger.errors.SnapshotNotFoundError`) —, and a name that tags another
    epoch already.  Tagging the epoch the name already tags writes nothing."""
    check_tag(name)
    where = meta.docs.url(COMPACTION_DOC)
    first = meta.load_compaction()
    if epoch is None and not first.epoch:
        raise SnapshotNotFoundError(f"{where}: the topic was never compacted: no view to tag")
    chosen = first.epoch if epoch is None else epoch
    seen, changed = False, True

    def tagged(state: CompactionState) -> CompactionState | None:
        nonlocal seen, changed
        if chosen < 1 or state.at_epoch(chosen) is None:
            gone = " any more (a publish dropped it meanwhile)" if seen else ""
            raise SnapshotNotFoundError(f"{where}: epoch {chosen} is not retained{gone} (retained: "
                                        f"{retained_text(state)}); nothing was tagged")
        seen = True
        held = state.tags.get(name)
        changed = held != chosen
        if held is not None and held != chosen:
            raise InvalidInputError(f"{meta.uri}: the tag {name!r} names epoch {held} already: remove it first "
                                    f"(shale snapshots {meta.uri} --untag {name}); nothing was tagged")
        if not changed:
            return None
        if len(state.tags) >= MAX_TAGS:
            raise InvalidInputError(f"{meta.uri}: the topic has {MAX_TAGS} tags, the most it may: remove one first")
        return replace(state, tags={**state.tags, name: chosen})

    state = meta.update_compaction(tagged, current=first, what=f"tagging a view {name!r}")
    return TagChange(meta.uri, "tag", name, chosen, changed, dict(sorted(state.tags.items())))


def untag_view(meta: TopicMetadata, name: str) -> TagChange:
    """Remove the tag ``name``, with one compare-and-swap
    (:class:`~shale.ledger.errors.SnapshotNotFoundError` when no view is tagged so).  Its
    view stays until the next publish, which applies the snapshot retention to it."""
    check_tag(name)
    where = meta.docs.url(COMPACTION_DOC)
    epoch = 0

    def untagged(state: CompactionState) -> CompactionState:
        nonlocal epoch
        epoch = epoch_of_tag(state, name, where)
        return replace(state, tags={n: e for n, e in state.tags.items() if n != name})

    state = meta.update_compaction(untagged, what=f"removing the tag {name!r}")
    return TagChange(meta.uri, "untag", name, epoch, True, dict(sorted(state.tags.items())))


# ------------------------------------------------------------------------ by time


def epoch_at(state: CompactionState, ms: int, where: str) -> int:
    """The epoch of the view current at ``ms`` (since 1970): the newest retained view
    published at or before it; :class:`~shale.ledger.errors.SnapshotNotFoundError`, naming
    the earliest retained view's time, when no retained view was published by then."""
    views = [(s.epoch, s.compacted_ms) for s in state.snapshots]
    views += [(state.epoch, state.compacted_ms)] if state.epoch else []
    published = [e for e, when in views if when <= ms]
    if published:
        return published[-1]
    if not views:
        raise SnapshotNotFoundError(f"{where}: no retained view was published by {_iso(ms)}: the topic was never "
                                    "compacted")
    epoch, first = min(views, key=lambda v: v[1])
    raise SnapshotNotFoundError(f"{where}: no retained view was published by {_iso(ms)}: the earliest retained, epoch "
                                f"{epoch}, was published {_iso(first)}")


def _iso(ms: int) -> str:
    """``ms`` in ISO 8601 with its milliseconds: rollback by time tells 19.999 from 20.000."""
    text = format_time(ms, style="iso")
    return f"{text[:-1]}.{ms % 1000:03d}Z" if text[:1].isdigit() else text
