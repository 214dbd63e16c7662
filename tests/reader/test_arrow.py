"""Topics as Arrow data: ``TopicReader.iter_batches``/``to_arrow``, ``TableView.to_arrow``,
and ``shale export`` read back by DuckDB, Polars and pyarrow, record for record against
the reader's own messages."""

from __future__ import annotations

import datetime
import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shale.compactor import CompactionConfig, Compactor
from shale.ledger import kernels
from shale.ledger.codecs import parse_compression
from shale.ledger.ids import MessageId
from shale.ledger.record import Message, Record
from shale.producer import TopicWriter
from shale.reader import TableView, TopicReader
from tests.conftest import run_cli_here
from tests.needs import need_module

pa = need_module("pyarrow")
T0 = 1_700_000_000_000


def _produce(uri: str, seed: int, n: int, codec: str) -> None:
    rnd = random.Random(seed)
    with TopicWriter(uri, batch_size=rnd.randrange(3, 40), max_ledger_records=300, compression=codec) as w:
        for i in range(n):
            key = None if rnd.random() < 0.05 else f"k{rnd.randrange(120)}".encode()
            value = (None if rnd.random() < 0.08 else
                     rnd.randbytes(rnd.randrange(0, 40)) if rnd.random() < 0.3 else f"v{seed}-{i}".encode())
            props = {f"p{j}": "é" * j for j in range(rnd.randrange(3))}
            w.send(Record(key, value, props, T0 + i, rnd.choice([None, -5, T0 + 7 * i])))


def _topic(uri: str) -> None:
    _produce(uri, 1, 900, "zstd")
    Compactor(uri, CompactionConfig(delete_retention_ms=3_600_000, retain_null_key=True)).run()
    _produce(uri, 2, 500, "lz4")
    Compactor(uri, CompactionConfig(delete_retention_ms=3_600_000, reuse_min_bytes=0)).run()
    _produce(uri, 3, 250, "none")


def _rows_of(messages: list[Message]) -> list[dict[str, Any]]:
    def ts(ms: int | None) -> Any:
        return None if ms is None else datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)

    return [{"ledger": m.id.ledger, "entry": m.id.entry, "batch": m.id.batch, "key": m.key, "value": m.value,
             "properties": sorted(m.properties.items()), "publish_time": ts(m.publish_time),
             "event_time": ts(m.event_time), "tombstone": m.is_tombstone} for m in messages]


def _rows_of_table(table: Any) -> list[dict[str, Any]]:
    rows = table.to_pylist()
    for r in rows:
        r["properties"] = sorted(r["properties"])
    return rows


@pytest.mark.parametrize("compacted", [False, True])
def test_batches_are_the_messages_record_for_record(topic_uri: str, compacted: bool) -> None:
    _topic(topic_uri)
    want = TopicReader(topic_uri, read_compacted=compacted).read()
    reader = TopicReader(topic_uri, read_compacted=compacted)
    batches = list(reader.iter_batches(rows=37))
    assert all(0 < b.num_rows <= 37 for b in batches)
    table = pa.Table.from_batches(batches)
    assert _rows_of_table(table) == _rows_of(want)
    assert reader.read() == []  # the position moved past everything read
    # from a position in the middle, and the ids as text
    middle = want[len(want) // 2].id
    part = TopicReader(topic_uri, read_compacted=compacted, start=middle).to_arrow(id_text=True)
    assert part["id"].to_pylist() == [str(m.id) for m in want if m.id >= middle]


def test_the_fallback_decodes_as_the_kernel_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = str(tmp_path / "t")
    _topic(uri)
    native = TopicReader(uri, read_compacted=True).to_arrow()
    monkeypatch.setattr(kernels, "_native", None)
    assert TopicReader(uri, read_compacted=True).to_arrow().equals(native)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 1 << 16), st.lists(st.sampled_from(["zstd", "lz4", "none"]), min_size=1, max_size=3),
       st.sampled_from([300, 4 << 10, 16 << 20]))
def test_random_views_decode_alike_in_c_and_numpy(tmp_path_factory: pytest.TempPathFactory, seed: int,
                                                  codecs: list[str], max_batch_bytes: int) -> None:
    """Compacted views of random rounds (null keys and values, empty values, properties,
    entries stored with each codec, parts kept with deletion vectors) read as Arrow by the
    C kernel and by the NumPy fallback, in batches small enough that entries are read
    whole, one at a time and as streams: the same table, holding the reader's messages."""
    uri = str(tmp_path_factory.mktemp("view") / "t")
    for i, codec in enumerate(codecs):
        _produce(uri, seed + i, 150, codec)
        Compactor(uri, CompactionConfig(delete_retention_ms=3_600_000, retain_null_key=True, reuse_min_bytes=0,
                                        reuse_min_live=0.0, compression=parse_compression(codec))).run()
    native = TopicReader(uri, read_compacted=True).to_arrow(max_batch_bytes=max_batch_bytes)
    assert _rows_of_table(native) == _rows_of(TopicReader(uri, read_compacted=True).read())
    with pytest.MonkeyPatch.context() as m:
        m.setattr(kernels, "_native", None)
        assert TopicReader(uri, read_compacted=True).to_arrow(max_batch_bytes=max_batch_bytes).equals(native)


def test_table_view_as_arrow_is_the_table_view(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    _topic(uri)
    view = TableView(uri)
    table = view.to_arrow()
    assert dict(zip(table["key"].to_pylist(), table["value"].to_pylist(), strict=True)) == {
        k: v for k, v in view.items()}
    assert _rows_of_table(table) == _rows_of(list(view.messages()))
    # records published after the last refresh are not in it until the next one
    with TopicWriter(uri) as w:
        w.append("brand-new", "x")
    assert b"brand-new" not in view.to_arrow()["key"].to_pylist()
    view.refresh()
    assert b"brand-new" in view.to_arrow()["key"].to_pylist()
    assert len(view.to_pandas()) == len(view) and view.to_polars().height == len(view)


def test_text_columns_and_their_refusal(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    with TopicWriter(uri) as w:
        w.append("a", "plain text")
        w.append("b", "ünïcödé")
    table = TopicReader(uri).to_arrow(utf8=True)
    assert table.schema.field("key").type == pa.large_string()
    assert table["value"].to_pylist() == ["plain text", "ünïcödé"]
    with TopicWriter(uri) as w:
        w.append("c", b"\xff\xfe")
    with pytest.raises(Exception, match=r"record 2:0:0: the value is not valid UTF-8"):
        TopicReader(uri).to_arrow(utf8=True)


def test_export_is_read_back_by_duckdb_polars_and_pyarrow(disk_topic_uri: str, tmp_path: Path) -> None:
    duckdb = need_module("duckdb")
    polars = need_module("polars")
    import pyarrow.parquet as pq

    uri = disk_topic_uri
    _topic(uri)
    view = TopicReader(uri, read_compacted=True).read()
    out = str(tmp_path / "view.parquet")
    r = run_cli_here("export", uri, out, "--compacted", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["rows"] == len(view)
    assert _rows_of_table(pq.read_table(out)) == _rows_of(view)
    keys = duckdb.sql(f"SELECT key FROM '{out}' ORDER BY ledger, entry, batch").fetchall()
    assert [k for (k,) in keys] == [m.key for m in view]
    assert polars.read_parquet(out).height == len(view)
    # the table (the latest value of every live key) queried by DuckDB
    table_out = str(tmp_path / "table.parquet")
    assert run_cli_here("export", uri, table_out, "--table").returncode == 0
    got = dict(duckdb.sql(f"SELECT key, value FROM '{table_out}'").fetchall())
    assert got == dict(TableView(uri).items())
    # Arrow IPC and JSON lines
    assert run_cli_here("export", uri, str(tmp_path / "all.arrow")).returncode == 0
    ipc = pa.ipc.open_file(str(tmp_path / "all.arrow")).read_all()
    assert _rows_of_table(ipc) == _rows_of(TopicReader(uri).read())
    assert run_cli_here("export", uri, str(tmp_path / "all.jsonl"), "--start", "2:0:0").returncode == 0
    lines = (tmp_path / "all.jsonl").read_text().splitlines()
    assert [json.loads(x)["id"] for x in lines] == [str(m.id) for m in TopicReader(uri, start=MessageId(2, 0, 0))]


def test_export_to_s3_appears_whole_or_not_at_all(s3_bucket: str, tmp_path: Path) -> None:
    import boto3
    import pyarrow.parquet as pq

    uri = str(tmp_path / "t")
    _topic(uri)
    out = f"s3://{s3_bucket}/exports/view.parquet"
    r = run_cli_here("export", uri, out, "--compacted")
    assert r.returncode == 0, r.stderr
    client = boto3.client("s3", region_name="us-east-1")
    body = client.get_object(Bucket=s3_bucket, Key="exports/view.parquet")["Body"].read()
    local = tmp_path / "back.parquet"
    local.write_bytes(body)
    assert _rows_of_table(pq.read_table(local)) == _rows_of(TopicReader(uri, read_compacted=True).read())
    # a failed export (a value that is not text) leaves nothing under its name
    with TopicWriter(uri) as w:
        w.append("bad", b"\xff")
    r = run_cli_here("export", uri, f"s3://{s3_bucket}/exports/failed.parquet", "--utf8")
    assert r.returncode == 2 and "not valid UTF-8" in r.stderr and len(r.stderr.splitlines()) == 1
    listed = client.list_objects_v2(Bucket=s3_bucket, Prefix="exports/").get("Contents", [])
    assert [o["Key"] for o in listed] == ["exports/view.parquet"]


def test_export_as_text_for_a_sql_query(tmp_path: Path) -> None:
    duckdb = need_module("duckdb")
    uri = str(tmp_path / "users")
    with TopicWriter(uri) as w:
        for i in range(300):
            w.append(f"user-{i % 50}", json.dumps({"email": f"u{i % 50}@example.com", "seq": i}))
    Compactor(uri).run()
    out = str(tmp_path / "users.parquet")
    assert run_cli_here("export", uri, out, "--table", "--utf8").returncode == 0
    rows = duckdb.sql(f"SELECT key, value->>'email', (value->>'seq')::INT FROM '{out}' ORDER BY key LIMIT 2").fetchall()
    assert rows == [("user-0", "u0@example.com", 250), ("user-1", "u1@example.com", 251)]


def test_export_usage_errors_are_one_line(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    _produce(uri, 1, 20, "zstd")
    r = run_cli_here("export", uri, str(tmp_path / "x.parquet"), "--table", "--start", "1:0:3")
    assert r.returncode == 2 and "--table exports every key" in r.stderr
    r = run_cli_here("export", str(tmp_path / "missing"), str(tmp_path / "x.parquet"))
    assert r.returncode == 2 and "no topic" in r.stderr
    r = run_cli_here("export", uri, str(tmp_path / "x.parquet"), "--format", "csv")
    assert r.returncode == 2 and "csv" in r.stderr
    assert not (tmp_path / "x.parquet").exists()

