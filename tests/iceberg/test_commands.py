"""The Iceberg table through the command line: ``shale export --format iceberg`` and every
``compact`` of a topic whose policy names a table; bad input said in one line with the
right exit code, the topic untouched; a failed table commit never undoes or blocks the
compaction and is caught up at the next run; the SQL catalog on PostgreSQL and a
warehouse on S3 (SeaweedFS), each end to end once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shale.iceberg.state import snapshot_epoch
from tests.conftest import run_cli_here
from tests.iceberg.conftest import Topic, load_table
from tests.iceberg.readers import duckdb_rows, polars_rows, pyiceberg_rows, view_rows
from tests.needs import need_module, without_root_privileges

need_module("pyiceberg")
need_module("pyarrow")


def shale(*args: str, privileged: bool = True) -> subprocess.CompletedProcess[str]:
    """The command, in this process (pyiceberg imported once), or as a process without
    root's power over files."""
    if privileged:
        return run_cli_here(*args)
    argv = [sys.executable, "-m", "shale.cli", *args]
    return subprocess.run(without_root_privileges(argv), capture_output=True, text=True, timeout=300)


def topic_files(topic: Topic) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in Path(topic.uri).rglob("*") if p.is_file()}


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_export_makes_the_table_then_adds_no_snapshot(topic: Topic, tmp_path: Path) -> None:
    topic.produce(300)
    topic.compact()
    args = ("export", topic.uri, "--format", "iceberg", "--catalog", str(tmp_path / "cat.db"), "--iceberg-table",
            "ns.t", "--iceberg-value-format", "text", "--json")
    first = shale(*args)
    assert first.returncode == 0, first.stderr
    again = shale(*args[:-3], "--json")  # (the value format: as the table keeps it)
    assert again.returncode == 0, again.stderr
    a, b = json.loads(first.stdout), json.loads(again.stdout)
    assert (a["status"], b["status"], a["epoch"]) == ("committed", "current", 1)
    table = load_table(str(tmp_path / "cat.db"), "ns.t")
    assert len(table.metadata.snapshots) == 1
    assert table.current_snapshot().summary.additional_properties["shale.horizon"] == a["horizon"]
    assert pyiceberg_rows(table) == view_rows(topic.uri, 1, True)


def _foreign_table(catalog: str) -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    from shale.iceberg.catalog import IcebergTarget, open_catalog

    cat = open_catalog(IcebergTarget(catalog, "ns.other"))
    cat.create_namespace("ns")
    cat.create_table(("ns", "other"), schema=Schema(NestedField(1, "id", LongType(), required=True)))


@pytest.mark.parametrize("case", ["foreign schema", "another topic", "unreachable", "REST unreachable",
                                  "read-only catalog",
                                  "warehouse not writable", "warehouse inside the topic", "bad name"])
def test_bad_input_is_one_line_and_leaves_the_topic_alone(case: str, topic: Topic, tmp_path: Path) -> None:
    topic.produce(200)
    topic.compact()
    catalog, table, extra, privileged = str(tmp_path / "cat.db"), "ns.t", [], True
    if case == "foreign schema":
        _foreign_table(catalog)
        table = "ns.other"
    elif case == "another topic":
        other = Topic(tmp_path / "other")
        other.produce(10)
        other.compact()
        assert shale("export", other.uri, "--format", "iceberg", "--catalog", catalog, "--iceberg-table",
                     table).returncode == 0
    elif case == "unreachable":
        catalog = "postgresql://shale@127.0.0.1:9/nothing"
        extra = ["--warehouse", str(tmp_path / "wh")]
    elif case == "REST unreachable":  # (its properties passed through, the secret never shown)
        catalog, extra = "http://127.0.0.1:9/catalog", ["--iceberg-property", "credential=me:s3cret"]
    elif case == "read-only catalog":
        assert shale("export", topic.uri, "--format", "iceberg", "--catalog", catalog, "--iceberg-table",
                     "ns.first").returncode == 0
        catalog = f"sqlite:///file:{catalog}?mode=ro&uri=true"
        extra = ["--warehouse", str(tmp_path / "warehouse")]
    elif case == "warehouse not writable":
        (tmp_path / "wh").mkdir(mode=0o555)
        extra, privileged = ["--warehouse", str(tmp_path / "wh")], False
    elif case == "warehouse inside the topic":
        extra = ["--warehouse", topic.uri + "/iceberg"]
    else:
        table = "no-namespace"
    before = topic_files(topic)
    done = shale("export", topic.uri, "--format", "iceberg", "--catalog", catalog, "--iceberg-table", table, *extra,
                 privileged=privileged)
    line = one_line(done)
    assert done.returncode == (1 if "unreachable" in case else 2), line
    assert "s3cret" not in line
    said = {"foreign schema": "is not a Shale table", "another topic": "holds the topic", "unreachable": "could not "
            "be reached", "REST unreachable": "could not be reached", "read-only catalog": "readonly database",
            "warehouse not writable": "Permission denied", "warehouse inside the topic": "lies inside the topic",
            "bad name": "bad Iceberg table name"}[case]
    assert said in line, line
    assert line.startswith("shale: error: ") and "Error:" not in line.split("error: ", 1)[1][:40]
    assert topic_files(topic) == before


def test_compact_keeps_the_table_and_a_failure_never_blocks_it(topic: Topic, tmp_path: Path) -> None:
    catalog = str(tmp_path / "cat.db")
    topic.produce(200)
    set_policy = ("config", topic.uri, "--set", "iceberg-table=ns.t", "--set")
    assert shale(*set_policy, "iceberg-catalog=postgresql://shale@127.0.0.1:9/nothing", "--set",
                 f"iceberg-warehouse={tmp_path / 'wh'}").returncode == 0
    failed = shale("compact", topic.uri, "--json")
    assert failed.returncode == 1, failed.stderr  # (the catalog could not be reached: transient)
    summary = json.loads(failed.stdout)
    assert summary["status"] == "compacted" and summary["iceberg"]["status"] == "error"
    assert "could not be reached" in summary["iceberg"]["error"]
    assert topic.meta().load_compaction().epoch == 1  # the compaction stands
    assert shale(*set_policy, f"iceberg-catalog={catalog}", "--set", "iceberg-value-format=text").returncode == 0
    caught_up = shale("compact", topic.uri, "--json")  # nothing to compact: the table catches up
    assert caught_up.returncode == 0, caught_up.stderr
    s = json.loads(caught_up.stdout)
    assert s["status"] == "nothing-to-do" and s["iceberg"]["status"] == "committed" and s["iceberg"]["epoch"] == 1
    topic.produce(50)
    s = json.loads(shale("compact", topic.uri, "--json").stdout)
    assert s["epoch"] == 2 and s["iceberg"]["epoch"] == 2
    table = load_table(catalog, "ns.t", str(tmp_path / "wh"))
    assert snapshot_epoch(table.current_snapshot()) == 2
    assert pyiceberg_rows(table) == view_rows(topic.uri, 2, True)


def test_metrics_say_whether_the_table_is_current() -> None:
    from shale.cli.metrics import build_registry
    from shale.compactor.summary import RunStatus, RunSummary

    def gauges(summary: RunSummary) -> dict[str, Any]:
        reg = build_registry(summary, exit_code=0, now_s=1.0)
        return {s.name: s.value for m in reg.collect() for s in m.samples if "iceberg" in s.name}

    ok = RunSummary("t", status=RunStatus.COMPACTED, iceberg={"epoch": 4, "status": "committed"})
    failed = RunSummary("t", status=RunStatus.COMPACTED, iceberg={"status": "error"},
                        iceberg_failure=ConnectionError("x"))
    assert gauges(ok) == {"shale_compaction_iceberg_ok": 1, "shale_compaction_iceberg_epoch": 4}
    assert gauges(failed) == {"shale_compaction_iceberg_ok": 0}
    assert gauges(RunSummary("t", status=RunStatus.COMPACTED)) == {}


@pytest.mark.slow
def test_postgresql_catalog_end_to_end(postgres: Any, topic: Topic, tmp_path: Path) -> None:
    warehouse = str(tmp_path / "warehouse")
    topic.produce(10)
    assert shale("config", topic.uri, "--set", f"iceberg-catalog={postgres.uri}", "--set", "iceberg-table=shale.t",
                 "--set", f"iceberg-warehouse={warehouse}", "--set", "iceberg-value-format=text").returncode == 0
    for n in (300, 60):
        topic.produce(n, tombstones=0.2)
        done = shale("compact", topic.uri, "--json")
        assert done.returncode == 0 and json.loads(done.stdout)["iceberg"]["status"] == "committed", done.stdout
    table = load_table(postgres.uri, "shale.t", warehouse)
    want = view_rows(topic.uri, 2, True)
    assert pyiceberg_rows(table) == want == polars_rows(table) == duckdb_rows(table.metadata_location)


@pytest.mark.slow
def test_warehouse_on_s3_end_to_end(seaweedfs_env: Any, topic: Topic, tmp_path: Path) -> None:
    from tests.conftest import SEAWEEDFS_BUCKET

    warehouse = f"s3://{SEAWEEDFS_BUCKET}/warehouse-{os.getpid()}-{tmp_path.name}"
    catalog = str(tmp_path / "cat.db")
    for n in (300, 60):
        topic.produce(n, tombstones=0.2)
        topic.compact()
        done = shale("export", topic.uri, "--format", "iceberg", "--catalog", catalog, "--iceberg-table", "shale.t",
                     "--warehouse", warehouse, "--json")
        assert done.returncode == 0, done.stderr
    table = load_table(catalog, "shale.t", warehouse)
    assert table.metadata_location.startswith(warehouse)
    want = view_rows(topic.uri, 2, False)
    env = seaweedfs_env.environment()
    duck = {"s3_endpoint": env["AWS_ENDPOINT_URL"].split("://", 1)[1], "s3_use_ssl": "false",
            "s3_url_style": "path", "s3_access_key_id": env["AWS_ACCESS_KEY_ID"],
            "s3_secret_access_key": env["AWS_SECRET_ACCESS_KEY"], "s3_region": env.get("AWS_REGION", "us-east-1")}
    assert pyiceberg_rows(table) == want == polars_rows(table) == duckdb_rows(table.metadata_location, settings=duck)


def test_the_table_settings_come_as_every_setting_does(topic: Topic, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A flag, else the topic's policy, else a variable: the policy's table wins over a
    variable's, a flag over both."""
    catalog = str(tmp_path / "cat.db")
    topic.produce(50)
    topic.compact()
    assert shale("config", topic.uri, "--set", "iceberg-table=ns.policy").returncode == 0
    monkeypatch.setenv("SHALE_ICEBERG_TABLE", "ns.variable")
    monkeypatch.setenv("SHALE_ICEBERG_CATALOG", catalog)
    assert json.loads(shale("export", topic.uri, "--format", "iceberg", "--json").stdout)["table"] == "ns.policy"
    done = shale("export", topic.uri, "--format", "iceberg", "--iceberg-table", "ns.flag", "--json")
    assert json.loads(done.stdout)["table"] == "ns.flag"
