"""Snapshots and rollback from the command line (in this process): ``read --as-of``,
``status``, ``rollback``, ``truncate --drop-snapshots`` and the ``snapshot-retention``
policy and flags; bad input is one line and exit 2, a hostile snapshot entry exit 4."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from shale.cli.errors import EXIT_CORRUPT, EXIT_USAGE
from shale.ledger.ids import MessageId
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TableView, TopicReader
from tests.conftest import run_cli_here


def _produce(uri: str, round_: int) -> None:
    with TopicWriter(uri, max_ledger_records=40, batch_size=5) as w:
        for i in range(60):
            w.append(f"k{(i * 7 + round_) % 25}", None if i % 11 == 0 else f"r{round_}-{i}")


@pytest.fixture
def topic(tmp_path: Path) -> str:
    """A topic compacted three times under a policy keeping three views."""
    uri = str(tmp_path / "t")
    _produce(uri, 0)
    assert run_cli_here("config", uri, "--set", "snapshot-retention=3").returncode == 0
    for round_ in range(3):
        _produce(uri, round_ + 1)
        r = run_cli_here("--delete-retention", "0s", uri, script="compact")
        assert r.returncode == 0, r.stderr
    assert TopicMetadata.open(uri).load_compaction().retained_epochs == (1, 2, 3)
    return uri


def _one_line(r: object, code: int, *needles: str) -> None:
    assert r.returncode == code, (r.stdout, r.stderr)  # type: ignore[attr-defined]
    err: str = r.stderr  # type: ignore[attr-defined]
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, (n, err)


def test_read_as_of_an_epoch_a_time_and_as_a_table(topic: str) -> None:
    state = TopicMetadata.open(topic).load_compaction()
    for epoch in (1, 2, 3):
        horizon = state.at_epoch(epoch).horizon  # type: ignore[union-attr]
        for point, flag in ((dict(as_of=epoch), "--as-of"), (dict(from_snapshot=epoch), "--from-snapshot")):
            r = run_cli_here("read", topic, flag, str(epoch))
            assert r.returncode == 0, r.stderr
            with TopicReader(topic, **point) as reader:  # type: ignore[arg-type]
                assert [json.loads(x)["id"] for x in r.stdout.splitlines()] == [str(m.id) for m in reader.read()]
            r = run_cli_here("read", topic, flag, str(epoch), "--table")
            assert r.returncode == 0, r.stderr
            assert {json.loads(x)["key"]: json.loads(x)["value"] for x in r.stdout.splitlines()} == {
                k.decode(): v.decode() for k, v in TableView(topic, **point).items()}  # type: ignore[arg-type]
        # as of an epoch: nothing above its horizon
        ids = [json.loads(x)["id"] for x in run_cli_here("read", topic, "--as-of", str(epoch)).stdout.splitlines()]
        assert ids and all(MessageId.parse(i) <= horizon for i in ids)
    # from epoch 1's snapshot: more records above its horizon than the published view has
    assert len(run_cli_here("read", topic, "--from-snapshot", "1").stdout.splitlines()) > len(
        run_cli_here("read", topic, "--compacted").stdout.splitlines())
    state = TopicMetadata.open(topic).load_compaction()
    when = datetime.datetime.fromtimestamp(state.snapshots[1].compacted_ms / 1000, datetime.UTC)
    by_time = run_cli_here("read", topic, "--as-of", when.isoformat())
    assert by_time.returncode == 0 and by_time.stdout == run_cli_here("read", topic, "--as-of", "2").stdout
    naive = when.replace(tzinfo=None).isoformat()  # a time without a zone is UTC
    assert run_cli_here("read", topic, "--as-of", naive).stdout == by_time.stdout


def test_bad_as_of_is_one_line_and_exit_2(topic: str) -> None:
    _one_line(run_cli_here("read", topic, "--as-of", "the day before"), EXIT_USAGE,
              "--as-of: 'the day before' is not an epoch (a whole number from 1), a time (ISO 8601")
    _one_line(run_cli_here("read", topic, "--as-of", "yesterday"), EXIT_USAGE,  # a name: a tag
              "no compacted view is tagged 'yesterday' (tags: none")
    _one_line(run_cli_here("read", topic, "--as-of", "9", "--table"), EXIT_USAGE,
              "epoch 9 is not retained (retained: epoch 1 (published ", "epoch 3 (published ")
    _one_line(run_cli_here("read", topic, "--as-of", "1", "--from-snapshot", "1"), EXIT_USAGE, "give one")
    _one_line(run_cli_here("read", topic, "--as-of", "1", "--follow"), EXIT_USAGE, "a read as of a point ends there")
    # before any record, with the whole history kept: nothing was there
    r = run_cli_here("read", topic, "--as-of", "1999-01-01")
    assert (r.returncode, r.stdout) == (0, ""), r.stderr
    # once retention removed ledgers, a time before the oldest retained view is refused
    assert run_cli_here("truncate", topic, "--before-ledger", "2").returncode == 0
    oldest = TopicMetadata.open(topic).load_compaction().snapshots[0]
    _one_line(run_cli_here("read", topic, "--as-of", "1999-01-01"), EXIT_USAGE,
              "1999-01-01T00:00:00Z is older than the history kept: the earliest time that can be read is",
              f"(epoch {oldest.epoch}'s view)")
    _one_line(run_cli_here("read", topic, "--as-of", "1:0:0", "--table"), EXIT_USAGE,
              "id 1:0:0 is older than the history kept: the earliest id that can be read is")
    _one_line(run_cli_here("get", topic, "k1", "--as-of", "1999-01-01"), EXIT_USAGE, "older than the history kept")


def test_status_lists_the_retained_snapshots(topic: str) -> None:
    r = run_cli_here("status", topic)
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stdout.splitlines() if x.startswith("snapshot  ")]
    assert [x.split(":")[0] for x in lines] == ["snapshot  epoch 1", "snapshot  epoch 2"]
    assert all("live record" in x and "offset order" in x for x in lines)
    doc = json.loads(run_cli_here("status", topic, "--json").stdout)
    assert [s["epoch"] for s in doc["compaction"]["snapshots"]] == [1, 2]
    assert doc["policy"]["snapshot-retention"] == "3"


def test_rollback_from_the_command_line(topic: str) -> None:
    meta = TopicMetadata.open(topic)
    before = meta.load_compaction()
    dry = run_cli_here("rollback", topic, "--to-epoch", "1", "--dry-run")
    assert dry.returncode == 0 and "would publish the view of epoch 1 as epoch 4" in dry.stdout, dry.stderr
    assert meta.load_compaction() == before
    r = run_cli_here("rollback", topic, "--to-epoch", "1", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["from_epoch"], doc["to_epoch"], doc["epoch"], doc["snapshots"]) == (3, 1, 4, [2, 3])
    assert doc["horizon"] == str(before.snapshots[0].horizon) and doc["note"] is None
    assert run_cli_here("read", topic, "--compacted").stdout == run_cli_here("read", topic, "--from-snapshot",
                                                                               "4").stdout
    _one_line(run_cli_here("rollback", topic, "--to-epoch", "1"), EXIT_USAGE,
              "epoch 1 is not retained (retained: epoch 2 (published ")
    _one_line(run_cli_here("rollback", topic, "--to-epoch", "4"), EXIT_USAGE, "epoch 4 is the published view already")
    _one_line(run_cli_here("rollback", topic), EXIT_USAGE, "--to-epoch")
    _one_line(run_cli_here("rollback", topic, "--to-epoch", "x"), EXIT_USAGE, "'x' is not a whole number")
    _one_line(run_cli_here("rollback", topic + "-missing", "--to-epoch", "1"), EXIT_USAGE, "no topic at")


def test_truncate_keeps_what_a_snapshot_reads_unless_told(topic: str) -> None:
    meta = TopicMetadata.open(topic)
    state = meta.load_compaction()
    assert state.horizon is not None
    past = state.horizon.ledger
    _one_line(run_cli_here("truncate", topic, "--before-ledger", str(past)), EXIT_USAGE,
              "retained snapshots of epoch 1, 2", "--drop-snapshots")
    r = run_cli_here("truncate", topic, "--older-than", "0s", "--json")  # a rule stops before them
    assert r.returncode == 0 and json.loads(r.stdout)["snapshots_dropped"] == [], r.stderr
    r = run_cli_here("truncate", topic, "--before-ledger", str(past), "--drop-snapshots")
    assert r.returncode == 0 and "dropped the retained snapshots of epoch 1, 2" in r.stdout, r.stderr
    assert meta.load_compaction().retained_epochs == (state.epoch,)


def test_snapshot_retention_settings_are_checked(topic: str) -> None:
    for bad in ("snapshot-retention=0", "snapshot-retention=1001", "snapshot-retention-age=soon"):
        _one_line(run_cli_here("config", topic, "--set", bad), EXIT_USAGE, bad.split("=")[0])
    _one_line(run_cli_here("--snapshot-retention", "0", topic, script="compact"), EXIT_USAGE,
              "--snapshot-retention")
    for command in ("compact", "rollback"):
        assert "--snapshot-retention-age" in run_cli_here(command, "--help").stdout


HOSTILE = [
    ("a ledger as a part", {"object": "ledgers/00000000000000000001-0123456789ab.ledger"},
     "snapshots[0].parts[0].object"),
    ("a metadata document as a deletion vector", {"deletions": "_meta/topic.json", "deleted": 1},
     "snapshots[0].parts[0].deletions"),
]


@pytest.mark.parametrize("case, change, field", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_snapshot_entry_is_refused_and_nothing_is_deleted(topic: str, case: str, change: dict[str, object],
                                                                   field: str) -> None:
    path = Path(topic) / "_meta" / "compaction.json"
    doc = json.loads(path.read_text())
    doc["value"]["snapshots"][0]["parts"][0].update(change)
    path.write_text(json.dumps(doc))
    files = {p: p.read_bytes() for p in Path(topic).rglob("*") if p.is_file()}
    for args in (("read", topic, "--as-of", "1"), ("rollback", topic, "--to-epoch", "1"), ("status", topic),
                 ("gc", topic, "--gc-grace", "0s"), ("read", topic, "--compacted")):
        _one_line(run_cli_here(*args), EXIT_CORRUPT, "compaction.json: field " + field)
    assert {p: p.read_bytes() for p in Path(topic).rglob("*") if p.is_file()} == files
