"""``shale verify --scrub``: read every byte of a topic and check it (BookKeeper checks each
entry's digest on read; Ceph scrubs placement groups in the background).

Compaction and plain verification read only what they need: an entry whose records were
all superseded is never read again, so its corruption would go unnoticed until a reader
of the full topic meets it.  A scrub reads every frame of every original ledger and every
compacted part, checks each frame's checksum, decompresses every compressed entry (one
frame or block and nothing after it, of the footer's size, its content checksum when it
has one), checks each record against its footer and hashes its key again against the
footer's key hash (so entries that decode to other keys than were written, through a
changed dictionary, say, are caught even in frames without a content checksum) and its
event time against the footer's (format version 3, where the footer gives them), and
reports every damaged object (it does not stop at the first), at a bounded read rate so
that it can run beside producers and readers.

Damage is what a reader would refuse as corrupt (exit 4), or an object the topic names
that is missing.  A store that refuses access, or fails, is not damage: the scrub stops
with that error (a permission error exits 2), having judged nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from typing import Any

import numpy as np

from shale.ledger.errors import CORRUPTION, ObjectNotFoundError, ShaleError, error_line
from shale.ledger.format import KIND_COMPACTED, KIND_ORIGINAL
from shale.ledger.kernels import Scratch
from shale.ledger.reader import LedgerFile
from shale.ledger.values import dataclass
from shale.metadata.topic import TopicMetadata
from shale.runtime.throttle import Throttle
from shale.settings.units import count

__all__ = ["ScrubReport", "scrub_topic"]

#: Called after each chunk with the bytes checked so far and the total to check.
Progress = Callable[[int, int], None]


@dataclass(slots=True)
class ScrubReport:
    """What a scrub read and the objects it found damaged."""

    topic: str
    objects: int = 0
    entries: int = 0
    records: int = 0
    #: the stored size of every object read whole (its frames and its footer), as the
    #: progress display and ``shale status`` count bytes
    bytes_checked: int = 0
    #: objects the topic stopped referring to while the scrub ran (collected, truncated)
    gone: int = 0
    damaged: list[dict[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.damaged

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "ok": self.ok, "objects": self.objects, "entries": self.entries,
                "records": self.records, "bytes_checked": self.bytes_checked, "gone": self.gone,
                "damaged": self.damaged}

    def human(self) -> str:
        head = (f"{self.topic}: scrub {'ok' if self.ok else 'found DAMAGE'}: {count(self.objects, 'object')}, "
                f"{count(self.entries, 'entry')}, {count(self.records, 'record')}, "
                f"{count(self.bytes_checked, 'byte')} checked")
        return "\n".join([head, *(f"  damaged {d['object']}: {d['error']}" for d in self.damaged)])


def scrub_topic(meta: TopicMetadata, *, max_bytes_per_s: int = 0, progress: Progress | None = None) -> ScrubReport:
    """Read and check every frame and record of ``meta``'s topic."""
    topic, state = meta.load_topic(), meta.load_compaction()
    objects = [(lg.object, lg.id, KIND_ORIGINAL, lg.bytes) for lg in topic.ledgers]
    objects += [(p.object, state.part_ledger_id(p), KIND_COMPACTED, p.bytes) for p in state.parts]
    # what retained snapshots read too (a part kept in place is named by several views: checked once)
    retained = {p.object: (p.object, snap.epoch if p.ledger_id is None else p.ledger_id, KIND_COMPACTED, p.bytes)
                for snap in state.snapshots for p in snap.parts}
    objects += [o for name, o in retained.items() if all(p.object != name for p in state.parts)]
    total = sum(size for *_, size in objects)
    report = ScrubReport(meta.uri)
    throttle = Throttle(max_bytes_per_s)
    done = 0
    for name, ledger_id, kind, size in objects:
        report.objects += 1
        try:
            _scrub_object(meta, name, ledger_id, kind, report, throttle)
            report.bytes_checked += size
        except ObjectNotFoundError as e:
            # retired and collected, or truncated, while the scrub ran: gone, not damaged
            if _still_referenced(meta, name):
                report.damaged.append({"object": name, "error": error_line(e)})
            else:
                report.gone += 1
        except ShaleError as e:
            if not isinstance(e, CORRUPTION):
                raise  # permission denied, the store failing: not the object's damage
            report.damaged.append({"object": name, "error": error_line(e)})
        done += size
        if progress is not None:
            progress(done, total)
    return report


def _still_referenced(meta: TopicMetadata, name: str) -> bool:
    topic, state = meta.load_topic(), meta.load_compaction()
    return any(lg.object == name for lg in topic.ledgers) or name in state.retained_objects()


def _scrub_object(meta: TopicMetadata, name: str, ledger_id: int | None, kind: int, report: ScrubReport,
                  throttle: Throttle) -> None:
    loc = meta.topic
    f = LedgerFile.open(loc.store, loc.key(name), ledger_id=ledger_id, kind=kind, dictionaries=meta.dictionaries)
    starts = f.footer.e_rec_start
    scratch = Scratch()  # where entries are decompressed, reused
    for c0, c1 in f.chunks(0, f.n_entries):
        base, buf = f.read_frames(c0, c1)
        f.check_frames(buf, base, c0, c1)
        f.check_entries(buf, base, np.arange(c0, c1, dtype=np.int64), scratch, key_hashes=True, event_times=True)
        report.entries += c1 - c0
        report.records += int(starts[c1] - starts[c0])
        throttle(len(buf))
