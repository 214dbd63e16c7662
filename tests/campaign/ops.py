"""The operations the campaign's workers run, and how each outcome is counted.

A command runs as its own process (``shale ...``, ``compact ...``); a producer or a reader
through the Python API runs in a thread of the test process.  Every outcome is counted
under ``<operation>.<outcome>``; conflicts, refusals and "nothing to do" are outcomes like
any other.  An exit code or an exception not listed here as an outcome is a failure.
"""

from __future__ import annotations

import json
import random
import re
import threading
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from shale.ledger.errors import ConflictError, ObjectNotFoundError, SnapshotNotFoundError
from shale.ledger.ids import MessageId
from shale.ledger.record import Message
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import EARLIEST, TopicReader
from tests.campaign.model import Model, Rec, from_json_line, message_ids
from tests.campaign.procs import run

__all__ = ["OPERATIONS", "CampaignTopic", "Consumer", "RecordedView", "Round"]

#: (exit code, what stderr says) -> outcome, per command: every other non-zero exit fails
EXPECTED: Final[dict[str, tuple[tuple[int, str, str], ...]]] = {
    "compact": ((3, r"another compactor published epoch \d+ first", "lost-race"),
                (3, r"truncated while this run read it", "truncated-meanwhile"),
                # lost to a change of the state that left its requirements standing (gc
                # trimming the retired list, a snapshot dropped, a truncation's stamp)
                (3, r"compaction state changed while this run wrote", "state-changed"),
                # --rewrite with a key map too small for every key up to the previous horizon
                (2, r"a rewrite weighs every record up to the previous horizon", "refused-rewrite-map-full")),
    "gc": ((3, r"kept changing", "conflict"),),
    "truncate": ((2, r"no compaction has kept", "refused-uncompacted"),
                 (2, r"yet to read", "refused-unread"),
                 (2, r"above the horizon of the\s+retained snapshot", "refused-snapshot"),
                 (3, r"kept changing", "conflict")),
    "rollback": ((2, r"is not retained", "refused-not-retained"),
                 (2, r"is the published view already", "refused-published"),
                 # a truncation dropped the snapshot (--drop-snapshots) once this one had read it:
                 # an outcome only while the snapshot is no longer retained (rollback, below)
                 (2, r"retention removed ledgers", "refused-retention-removed"),
                 (3, r"another compactor published epoch \d+ first", "lost-race"),
                 (3, r"truncated while this run read it", "truncated-meanwhile"),
                 (3, r"kept changing", "conflict")),
    "produce": ((3, r"could not register", "conflict"),),
    # (a subscription has one consumer, and nobody resets it: a commit never conflicts)
}

KEYS: Final = 40


@dataclass
class Consumer:
    """A durable subscription's consumer: folds what it reads into a table."""

    name: str
    compacted: bool
    #: api: read a batch and commit; cli: shale read --subscription --limit; follow: a follower;
    #: browse: a reader of no subscription, reading on from where it stopped (nothing is held for it)
    how: str
    table: dict[str, str] = field(default_factory=dict)
    records: int = 0
    #: browse: where it reads on from (no subscription keeps it)
    position: MessageId | None = None

    def fold(self, msgs: Sequence[Message]) -> None:
        for m in msgs:
            if m.key is None:
                continue
            if m.is_tombstone:
                self.table.pop(m.key.decode(), None)
            else:
                assert m.value is not None
                self.table[m.key.decode()] = m.value.decode()
        self.records += len(msgs)


@dataclass(frozen=True, slots=True)
class RecordedView:
    """An epoch's compacted view as read just after it was published: its horizon and the
    records at or below it (id, unique name)."""

    epoch: int
    horizon: MessageId | None
    below: tuple[tuple[MessageId, str], ...]


@dataclass
class CampaignTopic:
    """What lasts across a topic's rounds."""

    uri: str
    model: Model = field(default_factory=Model)
    consumers: dict[str, Consumer] = field(default_factory=dict)
    views: dict[int, RecordedView] = field(default_factory=dict)
    #: every object ``shale gc`` said it deleted
    gc_deleted: set[str] = field(default_factory=set)
    uids: int = 0
    #: how often a command runs as the installed console script
    console: float = 0.0

    def meta(self) -> TopicMetadata:
        return TopicMetadata.open(self.uri)


@dataclass
class Round:
    """One round's shared state: counts, failures, what was read, the producers' progress."""

    topic: CampaignTopic
    seed: str
    #: produce operations in the round (the others wait for a share of them)
    produce_ops: int
    counts: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    seen: list[tuple[str, list[Message]]] = field(default_factory=list)
    produced: int = 0
    producers_done: threading.Event = field(default_factory=threading.Event)
    _cond: threading.Condition = field(default_factory=threading.Condition)

    @property
    def uri(self) -> str:
        return self.topic.uri

    def count(self, what: str, n: int = 1) -> None:
        with self._cond:
            self.counts[what] += n

    def fail(self, what: str) -> None:
        with self._cond:
            self.failures.append(what)

    def saw(self, what: str, msgs: list[Message]) -> None:
        with self._cond:
            self.seen.append((what, msgs))

    def next_uid(self) -> str:
        """A name no record of the topic has had."""
        with self._cond:
            self.topic.uids += 1
            return f"r{self.topic.uids}"

    def gc_deleted(self, names: Sequence[str]) -> None:
        with self._cond:
            self.topic.gc_deleted.update(names)

    def one_produced(self) -> None:
        with self._cond:
            self.produced += 1
            self._cond.notify_all()

    def producers_ended(self) -> None:
        with self._cond:
            self.producers_done.set()
            self._cond.notify_all()

    def wait_produced(self, n: int) -> None:
        """Until ``n`` produce operations have ended (by work done, not time)."""
        with self._cond:
            self._cond.wait_for(lambda: self.produced >= min(n, self.produce_ops) or self.producers_done.is_set())


def cli(rnd: Round, command: str, *args: str, input: str | None = None,
        rng: random.Random | None = None) -> tuple[str, Any]:
    """Run a command; its outcome (``ok`` for exit 0, else as :data:`EXPECTED` names it)
    and its last JSON line (None when it printed none).  A failure is recorded."""
    script = "compact" if command == "compact" else "shale"
    argv = args if command == "compact" else (command, *args)
    p = run(*argv, input=input, script=script, console=rng is not None and rng.random() < rnd.topic.console)
    if p.returncode == 0:
        lines = p.stdout.strip().splitlines()
        try:
            return "ok", json.loads(lines[-1]) if lines else None
        except json.JSONDecodeError:
            return "ok", None
    said_all = p.stderr + p.stdout  # (with --json, a run's message is in its JSON line)
    for code, said, outcome in EXPECTED.get(command, ()):
        if p.returncode == code and re.search(said, said_all):
            return outcome, None
    said = said_all.strip()
    if p.returncode < 0 and len(said) > 4000:  # killed by a signal: the crash dump starts with the thread that crashed
        said = f"{said[:3000]}\n[...]\n{said[-1000:]}"
    rnd.fail(f"{script} {' '.join(argv)}: exit {p.returncode}: {said[-4000:]}")
    return f"exit-{p.returncode}", None


def guarded(rnd: Round, what: str, op: Callable[[], None]) -> None:
    """Run ``op``; a conflict is an outcome, any other exception a failure."""
    try:
        op()
    except ConflictError:
        rnd.count(f"{what}.conflict")
    except Exception:
        rnd.count(f"{what}.error")
        rnd.fail(f"{what}: {traceback.format_exc()}")


# ------------------------------------------------------------------ producing

def _rows(rnd: Round, rng: random.Random, n: int) -> list[tuple[str, str | None, str | None]]:
    """``n`` records to produce: (unique name, key, value); some tombstones, a few keyless."""
    rows = []
    for _ in range(n):
        uid = rnd.next_uid()
        x = rng.random()
        key = None if x < 0.03 else f"k{min(int(rng.expovariate(1 / 12)), KEYS - 1):02d}"
        value = None if key is not None and x > 0.85 else f"v-{uid}"
        rows.append((uid, key, value))
    return rows


def _recs(rows: Sequence[tuple[str, str | None, str | None]], ids: Sequence[MessageId]) -> list[Rec]:
    return [Rec(i, uid, key, value) for i, (uid, key, value) in zip(ids, rows, strict=True)]


def produce_cli(rnd: Round, rng: random.Random) -> None:
    """``shale produce`` of one ledger."""
    rows = _rows(rnd, rng, rng.randint(5, 60))
    batch = rng.choice((1, 3, 8, 1000))
    lines = "".join(json.dumps({"key": k, "value": v, "properties": {"u": u}}) + "\n" for u, k, v in rows)
    outcome, out = cli(rnd, "produce", rnd.uri, "--json", "--batch-size", str(batch), "--max-ledger-records",
                       str(len(rows)), "--compression", rng.choice(("none", "lz4", "zstd")), input=lines, rng=rng)
    rnd.count(f"produce.{outcome}")
    if outcome != "ok":
        return
    assert out is not None and out["ledgers"] == 1, out
    ids = message_ids(MessageId.parse(out["first_id"]).ledger, len(rows), batch)
    if str(ids[-1]) != out["last_id"]:
        rnd.fail(f"produce: {len(rows)} records in entries of {batch} end at {out['last_id']}, not {ids[-1]}")
    rnd.topic.model.add(_recs(rows, ids))


def produce_api(rnd: Round, rng: random.Random) -> None:
    """A ``TopicWriter`` of one or two ledgers."""
    rows = _rows(rnd, rng, rng.randint(5, 80))
    batch = rng.choice((1, 2, 5, 1000))
    per_ledger = len(rows) if rng.random() < 0.6 else (len(rows) + 1) // 2
    w = TopicWriter(rnd.uri, batch_size=batch, max_ledger_records=per_ledger,
                    compression=rng.choice(("none", "lz4", "zstd")))
    try:
        for uid, key, value in rows:
            w.append(key, value, {"u": uid})
        w.close()
        rnd.count("produce.ok")
    except ConflictError:
        rnd.count("produce.conflict")
    done = 0
    for lg in w.result.ledgers:  # sealed ones only: a conflict leaves the rest unregistered
        ids = message_ids(lg.id, lg.records, batch)
        if ids[-1] != lg.last_id:
            rnd.fail(f"produce: {lg.records} records in entries of {batch} end at {lg.last_id}, not {ids[-1]}")
        rnd.topic.model.add(_recs(rows[done:done + lg.records], ids))
        done += lg.records


# ------------------------------------------------------------------ compaction and the rest

def record_view(rnd: Round, epoch: int) -> None:
    """Read epoch ``epoch``'s view as of it, just published, and keep what lies at or below
    its horizon (another publish may have dropped it already: counted)."""
    try:
        with TopicReader(rnd.uri, as_of=epoch) as r:
            msgs = r.read()
            horizon = r.compaction.horizon
    except (SnapshotNotFoundError, ObjectNotFoundError):
        if epoch in rnd.topic.meta().load_compaction().retained_epochs:
            raise
        rnd.count("view.dropped-before-recorded")
        return
    rnd.saw(f"as of epoch {epoch}", msgs)
    below = tuple((m.id, m.properties.get("u", "")) for m in msgs if horizon is not None and m.id <= horizon)
    rnd.topic.views[epoch] = RecordedView(epoch, horizon, below)
    rnd.count("view.recorded")


def compact(rnd: Round, rng: random.Random) -> None:
    args = [rnd.uri, "--json", "--delete-retention", rng.choice(("0s", "0s", "1h")), "--workers",
            rng.choice(("1", "2")), "--gc-grace", rng.choice(("0s", "5m"))]
    if rng.random() < 0.2:
        args.append("--no-gc")
    if rng.random() < 0.25:  # a key map too small for the new keys: compact up to where they fit
        args += ["--max-map-bytes", str(24 * rng.randint(3, 30))]
    if rng.random() < 0.05:
        args.append("--rewrite")
    outcome, out = cli(rnd, "compact", *args, rng=rng)
    if outcome == "ok" and out is not None:
        outcome = out["status"]
        if "retention removed" in (out.get("message") or ""):  # (the topic's retention policy, after the publish)
            rnd.count("compact.then-retention-removed")
    rnd.count(f"compact.{outcome}")
    if outcome == "compacted" and out is not None:
        guarded(rnd, "view", lambda: record_view(rnd, int(out["epoch"])))


def rollback(rnd: Round, rng: random.Random) -> None:
    state = rnd.topic.meta().load_compaction()
    if not state.epoch:
        rnd.count("rollback.no-epoch-yet")
        return
    others = [e for e in state.retained_epochs if e != state.epoch]
    target = rng.choice(others) if others and rng.random() < 0.85 else rng.randint(1, state.epoch)
    outcome, out = cli(rnd, "rollback", rnd.uri, "--to-epoch", str(target), "--json", rng=rng)
    if outcome == "refused-retention-removed" and target in rnd.topic.meta().load_compaction().retained_epochs:
        rnd.fail(f"rollback --to-epoch {target}: refused for what retention removed, and epoch {target} is "
                 "still retained: retention removed records above a retained snapshot's horizon")
    rnd.count(f"rollback.{outcome}")
    if outcome == "ok" and out is not None:
        guarded(rnd, "view", lambda: record_view(rnd, int(out["epoch"])))


def truncate(rnd: Round, rng: random.Random) -> None:
    topic = rnd.topic.meta().load_topic()
    if not topic.ledgers:
        rnd.count("truncate.no-ledgers")
        return
    if rng.random() < 0.6:
        rule = ["--before-ledger", str(rng.randint(topic.ledgers[0].id, topic.last_ledger_id + 1))]
    else:
        rule = ["--older-than", rng.choice(("0s", "1ms"))]
    if rng.random() < 0.1:  # what retained snapshots hold too, dropping them
        rule.append("--drop-snapshots")
    outcome, out = cli(rnd, "truncate", rnd.uri, "--json", *rule, rng=rng)
    if outcome == "ok" and out is not None:
        outcome = "removed" if out["removed"] else "nothing"
        if out["snapshots_dropped"]:
            rnd.count("truncate.dropped-snapshots")
    rnd.count(f"truncate.{outcome}")


def inspect(rnd: Round, rng: random.Random) -> None:
    """``shale status`` or ``shale subscriptions``: read-only, never anything but exit 0."""
    command = rng.choice(("status", "subscriptions"))
    outcome, _ = cli(rnd, command, rnd.uri, "--json", rng=rng)
    rnd.count(f"{command}.{outcome}")


def gc(rnd: Round, rng: random.Random) -> None:
    outcome, out = cli(rnd, "gc", rnd.uri, "--gc-grace", "0s", "--json", rng=rng)
    if outcome == "ok" and out is not None:
        rnd.gc_deleted(out["deleted"])
        outcome = "deleted" if out["deleted"] else "nothing"
    rnd.count(f"gc.{outcome}")


# ------------------------------------------------------------------ consumers

def consume(rnd: Round, rng: random.Random, c: Consumer) -> None:
    """One batch read as the subscription, folded, then committed."""
    # a small batch, a large one, or all there is (catching up)
    limit = rng.choice((rng.randint(5, 60), rng.randint(100, 600), None))
    if c.how == "browse":
        _browse(rnd, c, limit)
        return
    if c.how == "cli":
        args = [rnd.uri, "--subscription", c.name, *(("--limit", str(limit)) if limit else ()),
                *(("--compacted",) if c.compacted else ())]
        outcome, _ = _cli_read(rnd, c, args)
        rnd.count(f"read.{outcome}")
        return
    with TopicReader(rnd.uri, read_compacted=c.compacted, subscription=c.name) as r:
        msgs = r.read(limit=limit)
        c.fold(msgs)
        rnd.saw(f"subscription {c.name}", msgs)
        r.commit()
    rnd.count("read.ok" if msgs else "read.nothing-new")


def _browse(rnd: Round, c: Consumer, limit: int | None) -> None:
    """A batch of the compacted view from where the last one ended: ids only ever grow."""
    with TopicReader(rnd.uri, read_compacted=c.compacted, start=c.position or EARLIEST) as r:
        msgs = r.read(limit=limit)
        before, c.position = c.position, r.position
    if msgs and before is not None and msgs[0].id < before:
        rnd.fail(f"{c.name}: read on from {before}, the first record was {msgs[0].id}")
    rnd.saw(c.name, msgs)
    rnd.count("browse.ok" if msgs else "browse.nothing-new")


def _cli_read(rnd: Round, c: Consumer, args: list[str]) -> tuple[str, list[Message]]:
    p = run("read", *args)
    msgs = [from_json_line(line) for line in p.stdout.splitlines() if line.strip()]
    c.fold(msgs)  # what it printed was committed, or will be read again: folded either way
    rnd.saw(f"subscription {c.name} (shale read)", msgs)
    if p.returncode == 0:
        return ("ok" if msgs else "nothing-new"), msgs
    rnd.fail(f"shale read {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()[-2000:]}")
    return f"exit-{p.returncode}", msgs


def follow(rnd: Round, rng: random.Random, c: Consumer) -> None:
    """A follower committing as it goes, until the producers are done and it has read
    everything there is (or ``most`` records)."""
    most = rng.randint(100, 1000)
    got: list[Message] = []
    with TopicReader(rnd.uri, read_compacted=c.compacted, subscription=c.name, follow=True, auto_commit=True,
                     poll_interval=0.02) as r:
        while len(got) < most:
            done = rnd.producers_done.is_set()
            m = r.read_next(timeout=0.05)
            if m is not None:
                got.append(m)
                c.fold([m])
            elif done:
                break
    rnd.saw(f"subscription {c.name} (following)", got)
    rnd.count("follow.ok")


#: what each kind of worker runs, one operation at a time
OPERATIONS: Final[dict[str, Callable[[Round, random.Random], None]]] = {
    "produce-cli": produce_cli, "produce-api": produce_api, "compact": compact, "rollback": rollback,
    "truncate": truncate, "gc": gc, "inspect": inspect,
}
