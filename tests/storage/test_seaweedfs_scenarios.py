"""One topic's life on a real S3-compatible store, through the commands, on SeaweedFS and
on moto alike: produce, compact, read, get, export, verify, gc and truncate, each
checked by what it leaves (the latest value of every key, the objects on the store)."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest

from shale.compactor import collect_garbage
from shale.metadata.topic import TopicMetadata
from shale.storage import resolve
from tests.conftest import make_root, run_cli_here

KEYS = 300
HOUR_MS = 3_600_000


@pytest.fixture(params=[pytest.param("s3", marks=pytest.mark.s3),
                        pytest.param("seaweedfs", marks=pytest.mark.seaweedfs)])
def topic(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return f"{make_root(str(request.param), request, tmp_path)}/topics/users"


def produce_rounds(uri: str, rounds: int) -> dict[str, str | None]:
    """``rounds`` runs of ``shale produce``, each a ledger of updates and some deletes;
    the latest value of every key."""
    rnd, latest = random.Random(4), dict[str, str | None]()
    for r in range(rounds):
        lines = []
        for i in range(1_000):
            key = f"user-{rnd.randrange(KEYS)}"
            value = None if rnd.random() < 0.1 else f"v{r}-{i}"
            lines.append(json.dumps({"key": key, "value": value}))
            latest[key] = value
        p = run_cli_here("produce", uri, "--json", input="\n".join(lines) + "\n")
        assert p.returncode == 0, p.stderr
    return latest


def table(uri: str) -> dict[str, str]:
    p = run_cli_here("read", uri, "--table")
    assert p.returncode == 0, p.stderr
    return {r["key"]: r["value"] for r in map(json.loads, p.stdout.splitlines())}


def ledger_objects(uri: str) -> list[str]:
    meta = TopicMetadata.open(uri)
    return sorted(meta.topic.relative(o.key) for o in meta.topic.store.list(meta.topic.key("ledgers") + "/"))


def test_a_topic_through_every_command(topic: str) -> None:
    latest = produce_rounds(topic, 3)
    live = {k: v for k, v in latest.items() if v}
    assert len(ledger_objects(topic)) == 3

    p = run_cli_here(topic, "--json", "--delete-retention", "0s", script="compact")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.splitlines()[-1])["status"] == "compacted"
    assert table(topic) == live

    key, value = next(iter(live.items()))
    p = run_cli_here("get", topic, key)
    assert p.returncode == 0 and json.loads(p.stdout)["value"] == value, p.stderr
    gone = next(k for k, v in latest.items() if v is None)
    assert run_cli_here("get", topic, gone).returncode == 5

    # export to the same store, read back through it
    out = f"{topic.rsplit('/topics/', 1)[0]}/exports/users.parquet"
    p = run_cli_here("export", topic, out, "--table")
    assert p.returncode == 0, p.stderr
    import pyarrow.parquet as pq

    loc = resolve(out.rsplit("/", 1)[0])
    rows = pq.read_table(io.BytesIO(loc.store.get(loc.key("users.parquet")))).to_pylist()
    assert {r["key"].decode(): r["value"].decode() for r in rows} == live

    p = run_cli_here("verify", topic, "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["ok"], p.stdout + p.stderr

    # more records, compacted again: the first run's part is retired, and collected
    latest.update(produce_rounds(topic, 1))
    live = {k: v for k, v in latest.items() if v}
    assert run_cli_here(topic, "--delete-retention", "0s", script="compact").returncode == 0
    p = run_cli_here("gc", topic, "--grace", "0s", "--json")
    assert p.returncode == 0, p.stderr
    gc = json.loads(p.stdout)  # retired within the store clock's second (S3's Date), it may wait
    assert gc["retired_deleted"] + gc["retired_waiting"] == 1, p.stdout
    meta = TopicMetadata.open(topic)
    collect_garbage(meta, now_ms=meta.topic.store.now_ms(meta.topic.prefix) + HOUR_MS, grace_ms=0,
                    orphan_grace_ms=HOUR_MS // 2)
    published = {part.object for part in meta.load_compaction().parts}
    assert {meta.topic.relative(o.key) for o in meta.topic.store.list(meta.topic.key("compacted") + "/")} == published
    assert table(topic) == live

    # one more ledger above the horizon; truncate the four below it
    latest.update(produce_rounds(topic, 1))
    p = run_cli_here("truncate", topic, "--before-ledger", "5", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["removed"] == [1, 2, 3, 4]
    assert [lg.id for lg in TopicMetadata.open(topic).load_topic().ledgers] == [5]
    assert table(topic) == {k: v for k, v in latest.items() if v}
    p = run_cli_here("verify", topic, "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["ok"], p.stdout + p.stderr
