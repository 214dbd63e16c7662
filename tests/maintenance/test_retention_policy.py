"""A topic's own retention (its policy's ``retention`` and ``retention-bytes``) holds
whatever compaction does: ``compact`` applies it after every run — compacted, nothing to
do, or skipped on its dirty ratio — and ``shale truncate --policy`` applies it alone.  It
never removes what the horizon, an active subscription or a retained (or tagged) snapshot
holds, and says which one holds what, as ``truncate --older-than`` does when nothing
would go."""

from __future__ import annotations

import json
import time
from pathlib import Path

from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from tests.conftest import run_cli_here

DAY = 86_400.0


def produce(topic: str, ledgers: int, *, days_ago: float = 0.0, first: int = 0) -> None:
    """``ledgers`` ledgers of ten records, published ``days_ago`` days ago."""
    t = time.time() - days_ago * DAY
    with TopicWriter(topic, max_ledger_records=10, clock=lambda: t) as w:
        for i in range(first, first + ledgers * 10):
            w.append(f"k{i % 7}", f"v{i}")


def ids(topic: str) -> list[int]:
    return [lg.id for lg in TopicMetadata.open(topic).load_topic().ledgers]


def cli(*args: str) -> str:
    r = run_cli_here(*args)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_compact_applies_the_retention_when_it_has_nothing_to_do_or_skips(tmp_path: Path) -> None:
    idle, skipped = str(tmp_path / "idle"), str(tmp_path / "skipped")
    for topic in (idle, skipped):
        produce(topic, 3, days_ago=2)
        cli("compact", topic)
        cli("config", topic, "--set", "retention=1d")
    # nothing new: nothing to do, and the two-day-old ledgers go all the same
    got = json.loads(cli("compact", idle, "--json"))
    assert got["status"] == "nothing-to-do" and ids(idle) == [], got
    assert got["retention_removed"] == 3 and "retention removed 3 ledgers below the horizon" in got["message"]
    # a little new: skipped on the dirty ratio (the shipped ConfigMap sets 0.5), and they go too
    cli("config", skipped, "--set", "min-dirty-ratio=0.9")
    produce(skipped, 1, first=30)
    got = json.loads(cli("compact", skipped, "--json"))
    assert got["status"] == "skipped" and ids(skipped) == [4], got  # ledger 4 is above the horizon: kept
    assert got["retention_removed"] == 3


def test_truncate_policy_applies_the_retention_alone_and_names_what_holds_ledgers(tmp_path: Path) -> None:
    topic = str(tmp_path / "t")
    produce(topic, 3, days_ago=3)  # ledgers 1-3
    cli("compact", topic)  # epoch 1: horizon at the end of ledger 3
    cli("config", topic, "--set", "snapshot-retention=2")
    produce(topic, 2, days_ago=2, first=30)  # ledgers 4-5
    cli("compact", topic)  # epoch 2; epoch 1 is retained, and reads ledgers 4-5 above its horizon
    cli("subscriptions", topic, "--create", "billing", "--to", "2:0:0")
    # no retention in the policy: nothing to apply
    r = run_cli_here("truncate", topic, "--policy")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "sets no retention" in r.stderr, r.stderr
    cli("config", topic, "--set", "retention=1d")
    got = json.loads(cli("truncate", topic, "--policy", "--dry-run", "--json"))
    assert got["removed"] == [1] and got["dry_run"]
    assert got["held_back"] == {"ledgers": 4, "from_ledger": 2,
                                "by": [{"kind": "subscription", "name": "billing", "at": "2:0:0"}]}
    text = cli("truncate", topic, "--policy")
    assert text == (f"{topic}: removed 1 ledger (1), 10 records, {_size(text)} bytes; 4 more ledgers are past the "
                    "rule but kept, from ledger 2 on: held back by subscription 'billing' (at 2:0:0: it has yet to "
                    "read them)\n")
    assert ids(topic) == [2, 3, 4, 5]
    # the subscription gone, the retained snapshot of epoch 1 holds ledgers 4-5; tagged, its tag does
    cli("subscriptions", topic, "--delete", "billing")
    got = json.loads(cli("truncate", topic, "--policy", "--dry-run", "--json"))
    assert got["removed"] == [2, 3] and got["held_back"]["by"] == [{"kind": "snapshot", "name": "1", "at": "3:0:9"}]
    cli("snapshots", topic, "--tag", "before-migration", "--epoch", "1")
    got = json.loads(cli("truncate", topic, "--policy", "--json"))
    horizon = got["held_back"]["by"][0]["at"]
    assert got["removed"] == [2, 3] and got["held_back"] == {
        "ledgers": 2, "from_ledger": 4, "by": [{"kind": "tag", "name": "before-migration", "at": horizon}]}
    assert horizon == "3:0:9"
    # a rule by hand that removes nothing says what holds the ledgers it would let go
    text = cli("truncate", topic, "--older-than", "1d", "--dry-run")
    assert text == (f"{topic}: no ledger to remove by --older-than 1d; nothing would go; 2 more ledgers are past "
                    "the rule but kept, from ledger 4 on: held back by the tagged snapshot 'before-migration' (its "
                    "records above the horizon 3:0:9)\n")
    # and compact, which has nothing to do, says so in its summary
    out = cli("compact", topic)
    assert out.startswith(f"{topic}: nothing-to-do: no records above the horizon; retention: 2 more ledgers are "
                          "past the rule but kept, from ledger 4 on: held back by the tagged snapshot"), out
    cli("snapshots", topic, "--untag", "before-migration")
    cli("config", topic, "--set", "snapshot-retention=1")
    produce(topic, 1, first=50)
    cli("compact", topic)  # drops the snapshot of epoch 1; the policy's retention then removes 4-5
    assert ids(topic) == [6]


def _size(line: str) -> str:
    return line.split(" records, ")[1].split(" bytes")[0]
