"""Time travel and change reads from the command line (in this process): ``get --as-of``,
``export --as-of`` (records and ``--table``), ``changes`` and ``export --changes-from`` in
every format, each equal to the Python API; bad points are one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from shale.cli.errors import EXIT_NOT_FOUND, EXIT_USAGE
from shale.ledger.ids import MessageId
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from shale.reader.changes import changes
from shale.reader.latest import table_messages
from tests.conftest import run_cli_here


def _produce(uri: str, round_: int, n: int = 40) -> None:
    with TopicWriter(uri, max_ledger_records=25, batch_size=4) as w:
        for i in range(n):
            w.append(f"k{(i * 3 + round_) % 17}", None if i % 9 == 4 else f"r{round_}-{i}")


@pytest.fixture
def topic(tmp_path: Path) -> str:
    """Two compactions kept readable, and records above the second one's horizon."""
    uri = str(tmp_path / "t")
    _produce(uri, 0)
    assert run_cli_here("config", uri, "--set", "snapshot-retention=3").returncode == 0
    for round_ in (1, 2):
        assert run_cli_here("--delete-retention", "0s", uri, script="compact").returncode == 0
        _produce(uri, round_)
    return uri


def _lines(text: str) -> list[dict[str, object]]:
    return [json.loads(x) for x in text.splitlines()]


def test_get_and_export_as_of_a_point(topic: str, tmp_path: Path) -> None:
    meta = TopicMetadata.open(topic)
    middle = str(list(TopicReader(topic))[50].id)
    for point in ("1", "2", middle):
        table = {m.key.decode(): m for m in table_messages(meta, as_of=point)}  # type: ignore[arg-type,union-attr]
        for key in ("k0", "k1", "k5"):
            r = run_cli_here("get", topic, key, "--as-of", point)
            if key in table:
                assert r.returncode == 0 and json.loads(r.stdout)["id"] == str(table[key].id), (point, key)
            else:
                assert r.returncode == EXIT_NOT_FOUND and f"as of {point}" in r.stderr, (point, key, r.stderr)
        out = tmp_path / f"table-{point.replace(':', '_')}.parquet"
        assert run_cli_here("export", topic, str(out), "--table", "--as-of", point).returncode == 0
        assert pq.read_table(out).column("key").to_pylist() == [k.encode() for k in table]
        records = tmp_path / f"records-{point.replace(':', '_')}.jsonl"
        r = run_cli_here("export", topic, str(records), "--as-of", point, "--json")
        label = f"id {point}" if ":" in point else f"epoch {point}"
        assert r.returncode == 0 and json.loads(r.stdout)["what"] == f"compacted view as of {label}", r.stdout
        with TopicReader(topic, as_of=point) as reader:  # type: ignore[arg-type]
            assert [x["id"] for x in _lines(records.read_text())] == [str(m.id) for m in reader.read()]
    # nothing above the point: the last id exported as of an id is that id or below it
    assert all(MessageId.parse(str(x["id"])) <= MessageId.parse(middle) for x in _lines(records.read_text()))


def test_changes_and_their_export_equal_the_api(topic: str, tmp_path: Path) -> None:
    for args, since, until in ((("--from", "1", "--to", "2"), "1", "2"), (("--from", "1"), "1", None)):
        r = run_cli_here("changes", topic, *args)
        assert r.returncode == 0, r.stderr
        want = list(changes(topic, since, until))
        got = _lines(r.stdout)
        assert [(x["op"], x["key"], x.get("id")) for x in got] == [
            (c.op, c.key.decode(), None if c.message is None else str(c.message.id)) for c in want]
        assert {x["op"] for x in got} == {"upsert", "delete"} and all(
            set(x) == {"op", "key"} for x in got if x["op"] == "delete")
        extra = ("--changes-to", until) if until else ()
        for fmt in ("parquet", "arrow", "jsonl"):
            out = tmp_path / f"changes-{since}-{until}.{fmt}"
            r = run_cli_here("export", topic, str(out), "--changes-from", since, *extra, "--format", fmt)
            assert r.returncode == 0, r.stderr
            if fmt == "jsonl":
                assert _lines(out.read_text()) == got
                continue
            import pyarrow as pa

            t = pq.read_table(out) if fmt == "parquet" else pa.ipc.open_file(str(out)).read_all()
            assert t.column("op").to_pylist() == [x["op"] for x in got]
            assert [k.decode() for k in t.column("key").to_pylist()] == [x["key"] for x in got]


def test_bad_points_are_one_line_and_exit_2(topic: str, tmp_path: Path) -> None:
    cases = [(("changes", topic), "--from"), (("changes", topic, "--from", ""), "--from: an empty point"),
             (("changes", topic, "--from", "9"), "epoch 9 is not retained"),
             (("changes", topic, "--from", "1", "--to", "01"), "without leading zeros"),
             (("get", topic, "k1", "--as-of", "9223372036854775808"), "--as-of: epoch 9223372036854775808 is out"),
             (("export", topic, str(tmp_path / "x.parquet"), "--changes-to", "1"), "goes with --changes-from"),
             (("export", topic, str(tmp_path / "x.parquet"), "--changes-from", "1", "--table"), "takes no --table"),
             (("read", topic, "--as-of", "99999999999999999999ms"), "milliseconds since 1970")]
    for args, needle in cases:
        r = run_cli_here(*args)
        assert r.returncode == EXIT_USAGE, (args, r.stdout, r.stderr)
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and needle in r.stderr, (args, r.stderr)
    assert not (tmp_path / "x.parquet").exists()
