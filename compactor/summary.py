"""What a run reports: one JSON line (``--json``) or one human line (Kafka's stats line)."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import field, fields
from typing import Any, Final

from shale.ledger.values import dataclass
from shale.settings.units import count

__all__ = ["STATUSES", "FleetSummary", "RunStatus", "RunSummary"]


class RunStatus(enum.StrEnum):
    """How a run ended (the ``status`` of its summary; text in JSON and metrics)."""

    COMPACTED = "compacted"
    NOTHING_TO_DO = "nothing-to-do"
    SKIPPED = "skipped"  # dirty ratio below --min-dirty-ratio
    CONFLICT = "conflict"  # lost the publish race; nothing published, output removed
    DRY_RUN = "dry-run"
    ERROR = "error"


STATUSES: Final = tuple(RunStatus)


@dataclass(slots=True)
class RunSummary:
    """The outcome and figures of one compaction run."""

    topic: str
    status: RunStatus = RunStatus.ERROR
    engine: str = "local"
    epoch: int | None = None
    horizon: str | None = None
    previous_horizon: str | None = None
    compacted_ledger: str | None = None
    parts: int = 0
    ledgers_read: int = 0
    records_read: int = 0
    bytes_read: int = 0  # footers (pass one) and entries (pass two)
    entry_bytes_read: int = 0  # of those, pass two's reads of entries
    records_written: int = 0
    records_reused: int = 0  # live records of previous parts kept in place (not copied)
    bytes_written: int = 0
    #: stored bytes of what the new parts replace in the compacted view: the ledgers' share
    #: up to the new horizon (by records) and the previous parts not kept in place
    bytes_replaced: int = 0
    keys: int = 0
    tombstones_kept: int = 0
    tombstones_dropped: int = 0
    #: of the tombstones kept, those past the delete retention that active subscriptions
    #: have yet to read (held until max-tombstone-hold)
    tombstones_held: int = 0
    keyless_dropped: int = 0
    keyless_kept: int = 0
    keys_expired: int = 0  # live keys dropped past the key TTL
    held_back_records: int = 0
    deferred_records: int = 0  # above the horizon because the key map was full (partial cleaning)
    map_keys: int = 0
    map_bytes: int = 0
    dirty_ratio: float = 0.0
    retired_deleted: int = 0
    orphans_deleted: int = 0
    #: ledgers the topic's retention removed after the run (whatever it found to do)
    retention_removed: int = 0
    durations: dict[str, float] = field(default_factory=dict)
    message: str = ""
    error: str | None = None
    #: what failed, when the status is ``error`` (not in the JSON: ``error`` says it in words)
    failure: BaseException | None = field(default=None, repr=False, compare=False)
    #: the topic's Iceberg table after the run, when its policy names one: what bringing it
    #: to the published epoch did, or its error (shale.iceberg.follow)
    iceberg: dict[str, Any] | None = None
    #: what failed bringing the table up to date (the compaction stands; not in the JSON)
    iceberg_failure: BaseException | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """Whether the run did what it was asked: compacted, had nothing to do, was
        skipped by its dirty ratio, or planned a dry run."""
        return self.status not in (RunStatus.ERROR, RunStatus.CONFLICT)

    def finish(self, status: RunStatus, message: str = "") -> RunSummary:
        self.status = RunStatus(status)
        self.message = message
        return self

    def to_json(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("failure", "iceberg_failure")}
        if d["iceberg"] is None:
            del d["iceberg"]
        d["durations"] = {k: round(v, 4) for k, v in self.durations.items()}
        d["dirty_ratio"] = round(self.dirty_ratio, 6)
        if d["error"] is None:
            del d["error"]
        return d

    def human(self) -> str:
        """One line, like Kafka's cleaner stats line."""
        if self.status == "error":
            return f"{self.topic}: failed: {self.error}"
        if self.status in ("nothing-to-do", "skipped", "conflict"):
            return f"{self.topic}: {self.status}: {self.message}"
        dry = self.status == "dry-run"
        kept = self.records_written + self.records_reused
        smaller = 100.0 * (1 - kept / self.records_read) if self.records_read else 0.0
        was = f"was {self.previous_horizon}" if self.previous_horizon else "the first compaction"
        sources = count(self.ledgers_read, "ledger") + (" and the previous compacted ledger"
                                                        if self.previous_horizon else "")
        t = self.durations
        phases = ", ".join(f"{k.replace('_', ' ')} {v:.2f}s" for k, v in t.items() if k != "total")
        return (f"{self.topic}: {'would compact' if dry else 'compacted'} to horizon {self.horizon} ({was}), "
                f"epoch {self.epoch}: {self._read(dry)} from {sources}, {self._kept(dry, kept)}, "
                f"{smaller:.1f}% fewer records; {count(self.keys, 'key')}, tombstones kept {self.tombstones_kept:,} "
                + (f"({self.tombstones_held:,} held for subscriptions) " if self.tombstones_held else "")
                + f"dropped {self.tombstones_dropped:,}, keyless dropped {self.keyless_dropped:,}"
                + (f", keys expired {self.keys_expired:,}" if self.keys_expired else "") + "; "
                f"{t.get('total', 0.0):.2f}s ({phases})" + (f"; {self.message}" if self.message else ""))

    def _read(self, dry: bool) -> str:
        # what was read, saying what each figure counts: a dry run reads only footers
        footers = (self.bytes_read - self.entry_bytes_read) / 1e6
        if dry:
            return (f"read the footers of {count(self.records_read, 'record')} ({footers:.1f} MB of footers; a run "
                    "also reads the entries of the records it keeps)")
        return (f"read {count(self.records_read, 'record')} ({footers:.1f} MB of footers and "
                f"{self.entry_bytes_read / 1e6:.1f} MB of entries)")

    def _kept(self, dry: bool, kept: int) -> str:
        # the records kept, as pass two's progress counts them: written anew or kept in place
        if dry:
            return f"would keep {count(kept, 'record')}"
        reused = f", {self.records_reused:,} kept in place" if self.records_reused else ""
        return (f"kept {count(kept, 'record')}: wrote {self.records_written:,} ({self.bytes_written / 1e6:.1f} MB) "
                f"in {count(self.parts, 'part')}{reused}")


@dataclass(frozen=True, slots=True)
class FleetSummary:
    """What a run of many topics did (``compact --all``'s last line): how many topics
    ended each way, and which failed (an error, or a lost publish race)."""

    topics: int = 0
    compacted: int = 0
    nothing_to_do: int = 0
    skipped: int = 0
    dry_run: int = 0
    failed: tuple[str, ...] = ()

    @classmethod
    def of(cls, summaries: Sequence[RunSummary]) -> FleetSummary:
        def n(status: RunStatus) -> int:
            return sum(1 for s in summaries if s.status is status)

        return cls(len(summaries), n(RunStatus.COMPACTED), n(RunStatus.NOTHING_TO_DO), n(RunStatus.SKIPPED),
                   n(RunStatus.DRY_RUN), tuple(s.topic for s in summaries if not s.ok))

    def to_json(self, codes: Mapping[str, int] | None = None) -> dict[str, Any]:
        """The counts, and the topics that failed with their exit codes (``codes``, by topic)."""
        return {"topics": self.topics, "compacted": self.compacted, "nothing_to_do": self.nothing_to_do,
                "skipped": self.skipped, "dry_run": self.dry_run, "failed": len(self.failed),
                "failed_topics": [{"topic": t, "exit_code": (codes or {}).get(t)} for t in self.failed]}

    def human(self, codes: Mapping[str, int] | None = None) -> str:
        """One line: the counts, then the topics that failed (with their exit codes)."""
        dry = f", {self.dry_run:,} dry run{'s' if self.dry_run != 1 else ''}" if self.dry_run else ""
        text = (f"{count(self.topics, 'topic')}: {self.compacted:,} compacted, {self.nothing_to_do:,} with nothing to "
                f"do, {self.skipped:,} skipped{dry}, {len(self.failed):,} failed")
        if self.failed:
            text += ": " + ", ".join(t if codes is None or t not in codes else f"{t} (exit {codes[t]})"
                                     for t in self.failed)
        return text
