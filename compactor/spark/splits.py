"""The driver's side of the Spark engine's planning, from summaries only.

Before pass one the driver knows each slice of the plan by what the metadata says of its
object (key, size, records): :func:`slice_specs` turns them into whole-slice specs the
map tasks read.  The map tasks read the footers and report where each slice may be cut;
the reduce tasks report how many records of each previous part survive.
:func:`plan_writes` turns those reports into pass two's splits and tasks, and decides
which previous parts are kept in place, by the same rules as the local engine.  The
driver's memory grows with the number of objects and splits, never with records.
Nothing here imports PySpark.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import field, replace

import numpy as np

from shale.compactor.config import CompactionConfig
from shale.compactor.pass_two import Fate, choose_reuse, slice_fate
from shale.compactor.plan import Plan
from shale.compactor.spark.shuffle import Kind
from shale.compactor.spark.tasks import SplitSpec, TaskContext, group_splits
from shale.compactor.spark.writes import WriteContext
from shale.ledger.errors import CorruptLedgerError
from shale.ledger.values import dataclass
from shale.metadata.state import CompactedPart

__all__ = ["Reports", "plan_writes", "slice_specs"]


def slice_specs(plan: Plan) -> list[SplitSpec]:
    """One spec per slice of the plan, in run order; ``bytes`` estimated from the
    object's size (the footer says exactly, and only the map task reads it)."""
    out: list[SplitSpec] = []
    base = 0
    for i, s in enumerate(plan.slices):
        ref = s.object
        deletions = plan.location.key(s.part.deletions) if s.part is not None and s.part.deletions else None
        out.append(SplitSpec(ref.key, ref.ledger_id, ref.kind, s.start, s.stop, base, s.data_bytes(), deletions,
                             ref.records, previous=i < len(plan.compacted)))
        base += s.records
    return out


@dataclass(slots=True)
class Reports:
    """What pass one's tasks reported: per slice (map) and in total (reduce)."""

    slices: int
    cuts: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)
    records: int = 0
    keyless: int = 0
    keyless_of: dict[int, int] = field(default_factory=dict)
    footer_bytes: int = 0
    keys: int = 0
    tombstones: int = 0
    dropped: int = 0
    expired: int = 0  # live keys past the key TTL
    held: int = 0  # tombstones kept past their retention for subscriptions
    kept: int = 0
    most_keys: int = 0  # of one reduce task
    most_candidates: int = 0  # of one reduce task
    candidates: int = 0  # sent through the shuffle, by every map task
    live: dict[int, int] = field(default_factory=dict)  # previous part's slice -> keyed records kept

    def add(self, kind: int, raw: bytes) -> None:
        d = json.loads(raw)
        if kind == Kind.MAP_REPORT:
            i = int(d["slice"])
            if i in self.cuts:
                return  # a map task run twice (a lost executor): reported once
            self.cuts[i] = [(int(a), int(b), int(n)) for a, b, n in d["cuts"]]
            self.records += int(d["records"])
            self.keyless += int(d["keyless"])
            self.keyless_of[i] = int(d["keyless"])
            self.footer_bytes += int(d["footer_bytes"])
            self.candidates += int(d.get("candidates", 0))
            settled = d.get("settled")
            if settled:  # a previous part's records its map task decided itself
                self.keys += int(settled["keys"])
                self.tombstones += int(settled["tombstones"])
                self.dropped += int(settled["dropped"])
                self.expired += int(settled["expired"])
                self.held += int(settled.get("held", 0))
                self.kept += int(settled["kept"])
                self.live[i] = self.live.get(i, 0) + int(settled["kept"])
        elif kind == Kind.STATS:
            self.keys += int(d["keys"])
            self.tombstones += int(d["tombstones"])
            self.dropped += int(d["dropped"])
            self.expired += int(d["expired"])
            self.held += int(d.get("held", 0))
            self.kept += int(d["kept"])
            self.most_keys = max(self.most_keys, int(d["keys"]))
            self.most_candidates = max(self.most_candidates, int(d["candidates"]))
            for i, n in d["live"].items():
                self.live[int(i)] = self.live.get(int(i), 0) + int(n)

    @classmethod
    def gather(cls, slices: int, reports: Iterable[tuple[int, bytes]]) -> Reports:
        """The reports of ``(kind, JSON)`` rows; every slice must have one."""
        out = cls(slices)
        for kind, raw in reports:
            out.add(kind, raw)
        missing = [i for i in range(slices) if i not in out.cuts]
        if missing:
            raise CorruptLedgerError(f"pass one did not report on {len(missing)} of {slices} slices")
        return out


def plan_writes(ctx: TaskContext, plan: Plan, reports: Reports, config: CompactionConfig) -> WriteContext:
    """Pass two's splits and tasks, from the map reports; previous parts mostly live are
    kept in place (one split each, written as a deletion vector) as the local engine
    keeps them."""
    fates = [Fate.COPY] * len(plan.slices)
    for i, s in enumerate(plan.compacted):
        live = reports.live.get(i, 0) + (reports.keyless_of.get(i, 0) if config.retain_null_key else 0)
        fates[i] = slice_fate(s, live, config)
    reuse = choose_reuse(fates)
    splits: list[SplitSpec] = []
    in_place: list[CompactedPart | None] = []
    for i, (sp, s) in enumerate(zip(ctx.slices, plan.slices, strict=True)):
        if reuse[i]:
            assert s.part is not None
            # nothing to copy: it costs its task no bytes
            splits.append(replace(sp, bytes=0))
            in_place.append(replace(s.part, ledger_id=plan.previous.part_ledger_id(s.part)))
            continue
        for a, b, n in reports.cuts[i]:
            splits.append(replace(sp, start=a, stop=b, base=sp.base + a - sp.start, bytes=n))
            in_place.append(None)
    tasks = group_splits(splits, ctx.split_bytes, ctx.split_records)
    return WriteContext(ctx, tuple(splits), np.array([sp.base for sp in splits], dtype=np.int64), tuple(tasks),
                        tuple(in_place))
