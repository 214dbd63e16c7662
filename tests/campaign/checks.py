"""What is checked once a round's workers have all ended (nothing else runs then).

* Every record any worker read during the round is the record produced under that id.
* The original ledgers left hold exactly the records produced into them, in order.
* Nothing lost: the compacted view is what the model says (:meth:`Model.check_view`), and
  ``shale read --table`` is the model's table.
* No subscribed consumer misses a delete: each subscription's consumer, reading on from
  its committed position as it reads (plain or compacted), ends with the model's table —
  every tombstone of a key it had seen after its position reaches it.
* Every retained snapshot reads as published: ``as of`` each retained epoch, the records at
  or below its horizon are those read when it was published, what the model says, and
  nothing above it; read ``from`` it (what a rollback to it would publish), the same
  records, then every record above its horizon.
* Objects: every object a published state or the ledger list names exists; nothing under
  ``compacted/`` is left that no state names; ``shale gc`` never deleted an object still
  named; ``shale verify --scrub`` decodes every frame of every object and finds the view
  matching the ledgers.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable

from shale.ledger.ids import MIN_ID, MessageId
from shale.metadata.layout import ledger_id_of
from shale.metadata.state import CompactionState, TopicState
from shale.metadata.subscriptions import Subscriptions
from shale.metadata.topic import TopicMetadata
from shale.reader import EARLIEST, TopicReader
from tests.campaign.model import from_json_line
from tests.campaign.ops import CampaignTopic, Consumer, Round
from tests.campaign.procs import run

__all__ = ["check_round"]


def check_round(rnd: Round) -> None:
    """Every check of the module docstring; problems (an exception too) go to ``rnd.failures``."""
    topic = rnd.topic
    meta = topic.meta()
    try:
        state, ledgers = meta.load_compaction(), meta.load_topic()
        floor = min((s.position for s in Subscriptions(meta).list()), default=None)
    except Exception:
        rnd.failures.append(f"reading the topic's metadata: {traceback.format_exc()}")
        return
    checks: list[tuple[str, Callable[[], list[str]]]] = [
        ("reads during the round", lambda: [p for what, msgs in rnd.seen
                                            for p in topic.model.mismatches(msgs, f"read during the round ({what})")]),
        ("the ledgers left", lambda: _ledgers(topic, ledgers)),
        ("the compacted view", lambda: _compacted(topic, floor)),
        ("shale read --table", lambda: _table(topic)),
        *((f"subscription {c.name}", lambda c=c: _consumer(topic, meta, c)) for c in topic.consumers.values()
          if c.how != "browse"),
        *((f"as of epoch {e}", lambda e=e: _as_of(topic, e, floor)) for e in state.retained_epochs),
        ("the objects", lambda: _objects(topic, meta, state, ledgers)),
        ("shale verify --scrub", lambda: _verify(topic)),
    ]
    for what, check in checks:
        try:
            rnd.failures += check()
        except Exception:
            rnd.failures.append(f"checking {what}: {traceback.format_exc()}")
    rnd.count("checks.epochs-read-as-of", len(state.retained_epochs))


def _compacted(topic: CampaignTopic, floor: MessageId | None) -> list[str]:
    with TopicReader(topic.uri, read_compacted=True) as r:
        return topic.model.check_view(r.read(), r.compaction.horizon, floor,
                                      f"compacted view of epoch {r.compaction.epoch}")


def _verify(topic: CampaignTopic) -> list[str]:
    p = run("verify", topic.uri, "--scrub", "--json")
    return [] if p.returncode == 0 else [f"shale verify --scrub: exit {p.returncode}: {p.stdout[-2000:]} "
                                         f"{p.stderr[-2000:]}"]


def _ledgers(topic: CampaignTopic, ledgers: TopicState) -> list[str]:
    """The ledgers left, read plain: exactly the records produced into them, in order."""
    with TopicReader(topic.uri) as r:
        got = r.read()
    left = {lg.id for lg in ledgers.ledgers}
    want = [rec.id for rec in topic.model.ordered() if rec.id.ledger in left]
    problems = topic.model.mismatches(got, "plain read of the ledgers left")
    if [m.id for m in got] != want:
        problems.append(f"plain read of the ledgers left: {len(got)} records, {len(want)} produced into them")
    return problems


def _table(topic: CampaignTopic) -> list[str]:
    """``shale read --table``: the model's table."""
    p = run("read", topic.uri, "--table")
    if p.returncode != 0:
        return [f"shale read --table: exit {p.returncode}: {p.stderr.strip()[-2000:]}"]
    got = {m.key.decode(): (m.value or b"").decode() for m in map(from_json_line, p.stdout.splitlines())
           if m.key is not None}
    return [] if got == topic.model.table() else [f"shale read --table: {_table_diff(got, topic.model.table())}"]


def _table_diff(got: dict[str, str], want: dict[str, str]) -> str:
    wrong = sorted(k for k in got.keys() & want.keys() if got[k] != want[k])
    return (f"keys missing {sorted(want.keys() - got.keys())[:5]}, extra (deleted) "
            f"{sorted(got.keys() - want.keys())[:5]}, stale {[(k, got[k], want[k]) for k in wrong[:5]]}")


def _consumer(topic: CampaignTopic, meta: TopicMetadata, c: Consumer) -> list[str]:
    """Subscription ``c`` read on from its committed position (without committing) ends
    with the model's table; every delete of a key it holds reaches it."""
    position = Subscriptions(meta).get(c.name).position
    with TopicReader(topic.uri, read_compacted=c.compacted, start=EARLIEST if position == MIN_ID else position) as r:
        msgs = r.read()
    problems = topic.model.mismatches(msgs, f"subscription {c.name} read on from {position}")
    latest = {rec.key: rec for rec in topic.model.ordered() if rec.key is not None}
    deletes = {m.key.decode() for m in msgs if m.is_tombstone and m.key is not None}
    # a key it holds whose last record is a delete: the delete lies ahead of its position (and
    # reaches it now), or it read past it (and holds the key no more)
    missed = sorted(k for k in c.table if latest[k].tombstone and k not in deletes)
    if missed:
        problems.append(f"subscription {c.name} ({'compacted' if c.compacted else 'plain'}, at {position}) missed "
                        f"the deletes of {[(k, str(latest[k].id)) for k in missed[:5]]}")
    table = dict(c.table)
    for m in msgs:
        if m.key is not None:
            if m.is_tombstone:
                table.pop(m.key.decode(), None)
            else:
                table[m.key.decode()] = (m.value or b"").decode()
    if table != topic.model.table():
        problems.append(f"subscription {c.name} ends with a table that is not the topic's: "
                        f"{_table_diff(table, topic.model.table())}")
    return problems


def _as_of(topic: CampaignTopic, epoch: int, floor: MessageId | None) -> list[str]:
    """The view as of a retained epoch (its records through its horizon, nothing written
    later) and read from it (then everything since): what the model says, and at or below
    its horizon what was read when it was published."""
    with TopicReader(topic.uri, as_of=epoch) as r:
        msgs, horizon = r.read(), r.compaction.horizon
    problems = topic.model.check_view(msgs, horizon, floor, f"as of epoch {epoch}", since=False)
    with TopicReader(topic.uri, from_snapshot=epoch) as r:
        since, from_horizon = r.read(), r.compaction.horizon
    problems += topic.model.check_view(since, from_horizon, floor, f"from snapshot {epoch}")
    if [m.id for m in since if horizon is not None and m.id <= horizon] != [m.id for m in msgs]:
        problems.append(f"from snapshot {epoch}: its view is not what a read as of it gives")
    seen = topic.views.get(epoch)
    if seen is None:
        return problems
    below = tuple((m.id, m.properties.get("u", "")) for m in msgs if horizon is not None and m.id <= horizon)
    if seen.horizon != horizon or seen.below != below:
        problems.append(f"as of epoch {epoch}: horizon {horizon} and {len(below)} records at or below it, read "
                        f"when published: horizon {seen.horizon} and {len(seen.below)} records "
                        f"({'the same ids' if [i for i, _ in below] == [i for i, _ in seen.below] else 'other ids'})")
    return problems


def _objects(topic: CampaignTopic, meta: TopicMetadata, state: CompactionState, ledgers: TopicState) -> list[str]:
    """Every named object exists, nothing unnamed is left under ``compacted/``, no ledger
    object but the registered and the truncated, gc deleted nothing named."""
    loc = meta.topic
    compacted = {loc.relative(o.key) for o in loc.store.list(loc.key("compacted") + "/")}
    ledger_objects = {loc.relative(o.key) for o in loc.store.list(loc.key("ledgers") + "/")}
    named = state.referenced_objects() | {lg.object for lg in ledgers.ledgers}
    problems = []
    missing = named - compacted - ledger_objects
    if missing:
        problems.append(f"objects named by the published state or the ledger list are missing: {sorted(missing)[:5]}")
    left = compacted - state.referenced_objects()
    if left:
        problems.append(f"objects under compacted/ that no state names: {sorted(left)[:5]}")
    stray = {o for o in ledger_objects - named if (ledger_id_of(o) or 0) > ledgers.removed_through}
    if stray:
        problems.append(f"ledger objects neither registered nor truncated: {sorted(stray)[:5]}")
    if topic.gc_deleted & named:
        problems.append(f"shale gc deleted objects still named: {sorted(topic.gc_deleted & named)[:5]}")
    return problems
