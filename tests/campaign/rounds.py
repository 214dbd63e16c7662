"""A topic's rounds: what each round runs (drawn from its seed), the workers run at once,
the checks after, a summary line per round.

Work is counted, never timed: each worker runs a fixed number of operations, and every
worker but the producers starts each of its operations once the producers have ended a
number of theirs drawn from the seed, so operations spread over the round by the work
done, not by the clock.

A round's seed is ``<campaign seed>/<topic>/<round>``: everything a round chooses comes
from it (a round's threads interleave as the machine runs them, which no seed fixes).  A
failure names the seeds and how to run that topic's rounds again.
"""

from __future__ import annotations

import random
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from shale.metadata.subscriptions import Subscriptions
from tests.campaign.checks import check_round
from tests.campaign.ops import OPERATIONS, CampaignTopic, Consumer, Round, consume, follow
from tests.campaign.procs import run

__all__ = ["Scale", "run_topic"]

#: the consumers of a topic: (how it reads, compacted or plain)
CONSUMERS: Final = (("api", True), ("cli", False), ("follow", True), ("api", False), ("cli", True),
                    ("follow", False), ("browse", True))


@dataclass(frozen=True, slots=True)
class Scale:
    """How much a campaign does."""

    rounds: int
    producers: int
    produce_ops: int
    #: at most this many compactors at once (each round draws 1 to it)
    compactors: int
    compact_ops: int
    consumers: int
    consume_ops: int
    #: workers of rollback, truncate and gc each, and their operations
    others: int
    other_ops: int
    #: how often a command runs as the installed console script (else forked: :mod:`tests.campaign.procs`)
    console: float = 0.0
    #: workers running shale status and shale subscriptions (other_ops each)
    inspectors: int = 0


@dataclass(frozen=True, slots=True)
class Worker:
    name: str
    #: production a worker waits for before each operation (none for producers)
    waits: tuple[int, ...]
    run: Callable[[Round, random.Random], None]


def new_topic(uri: str, rng: random.Random, scale: Scale) -> CampaignTopic:
    """A topic with a snapshot retention of 2 to 4 and its subscriptions, all at the start."""
    topic = CampaignTopic(uri)
    meta = topic.meta()
    meta.create_topic()
    settings = [f"snapshot-retention={rng.randint(2, 4)}"]
    if rng.random() < 0.3:  # and retention after every publish, of all it may remove
        settings.append("retention=1ms")
    p = run("config", uri, *(a for s in settings for a in ("--set", s)))
    assert p.returncode == 0, p.stderr
    topic.console = scale.console
    for i, (how, compacted) in enumerate(CONSUMERS[:scale.consumers]):
        name = f"{'reader' if how == 'browse' else 'sub'}-{i}-{how}-{'compacted' if compacted else 'plain'}"
        if how != "browse":
            Subscriptions(meta).create(name)
        topic.consumers[name] = Consumer(name, compacted, how)
    return topic


def _plan(rnd: Round, rng: random.Random, scale: Scale) -> list[Worker]:
    """The round's workers, each with its operations."""
    total = scale.producers * scale.produce_ops

    def waits(n: int) -> tuple[int, ...]:
        return tuple(sorted(rng.randint(0, total) for _ in range(n)))

    workers = [Worker(f"producer-{i}", (0,) * scale.produce_ops,
                      OPERATIONS[rng.choice(("produce-cli", "produce-api"))]) for i in range(scale.producers)]
    workers += [Worker(f"compactor-{i}", waits(scale.compact_ops), OPERATIONS["compact"])
                for i in range(rng.randint(1, scale.compactors))]
    for kind in ("rollback", "truncate", "gc"):
        workers += [Worker(f"{kind}-{i}", waits(scale.other_ops), OPERATIONS[kind]) for i in range(scale.others)]
    workers += [Worker(f"inspect-{i}", waits(scale.other_ops), OPERATIONS["inspect"]) for i in range(scale.inspectors)]
    for c in rnd.topic.consumers.values():
        if c.how == "follow":
            workers.append(Worker(c.name, waits(1), lambda r, g, c=c: follow(r, g, c)))
        else:
            workers.append(Worker(c.name, waits(scale.consume_ops), lambda r, g, c=c: consume(r, g, c)))
    return workers


def _work(rnd: Round, w: Worker, rng: random.Random, start: threading.Barrier) -> None:
    start.wait()
    producer = w.name.startswith("producer")
    for wait in w.waits:
        if not producer:
            rnd.wait_produced(wait)
        try:
            w.run(rnd, rng)
        except Exception:
            rnd.count(f"{w.name.split('-')[0]}.error")
            rnd.fail(f"{w.name}: {traceback.format_exc()}")
        if producer:
            rnd.one_produced()


def run_round(topic: CampaignTopic, seed: str, scale: Scale) -> Round:
    """One round: every worker at once, then the checks."""
    rng = random.Random(seed)
    rnd = Round(topic, seed, produce_ops=scale.producers * scale.produce_ops)
    workers = _plan(rnd, rng, scale)
    start = threading.Barrier(len(workers))
    threads = [threading.Thread(target=_work, args=(rnd, w, random.Random(f"{seed}/{w.name}"), start),
                                name=w.name, daemon=True) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        if t.name.startswith("producer"):
            t.join()
    rnd.producers_ended()
    for t in threads:
        t.join()
    check_round(rnd)
    return rnd


def summary(rnd: Round, index: int) -> str:
    counts = ", ".join(f"{k}={v}" for k, v in sorted(rnd.counts.items()))
    try:
        state, ledgers = rnd.topic.meta().load_compaction(), rnd.topic.meta().load_topic()
    except Exception as e:
        return f"round {index} seed {rnd.seed}: {counts}; {len(rnd.topic.model.records)} records; ({e})"
    return (f"round {index} seed {rnd.seed}: {counts}; {len(rnd.topic.model.records)} records, ledgers "
            f"{ledgers.ledgers[0].id if ledgers.ledgers else '-'}..{ledgers.last_ledger_id}, epoch {state.epoch}, "
            f"horizon {state.horizon}, retained {list(state.retained_epochs)}")


def run_topic(uri: str, seed: str, scale: Scale, say: Callable[[str], None]) -> list[Round]:
    """A topic's rounds (seed ``seed``: ``<campaign seed>/<topic>``); fails, naming the
    round's seed, at the first round whose checks fail."""
    topic = new_topic(uri, random.Random(seed), scale)
    rounds = []
    for i in range(scale.rounds):
        rnd = run_round(topic, f"{seed}/{i}", scale)
        rounds.append(rnd)
        say(summary(rnd, i))
        if rnd.failures:
            shown = "\n".join(f"  - {f}" for f in rnd.failures[:20])
            more = f"\n  ... and {len(rnd.failures) - 20} more" if len(rnd.failures) > 20 else ""
            raise AssertionError(f"round {i} of topic seed {seed} (round seed {rnd.seed}) failed "
                                 f"{len(rnd.failures)} checks:\n{shown}{more}\n{summary(rnd, i)}")
    return rounds
