"""Arrow in: ``TopicWriter.append_batch`` and ``shale produce --format parquet|arrow|csv``,
record for record against the same records appended one by one, and the C encoder byte
for byte against ``encode_entry``."""

from __future__ import annotations

import datetime
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shale.ledger import encoder
from shale.ledger.encoder import Properties, RecordColumns, VarColumn, encode_columns
from shale.ledger.errors import InvalidInputError, RecordTooLargeError
from shale.ledger.ids import MessageId
from shale.ledger.record import Message
from shale.ledger.writer import encode_entry
from shale.producer import TopicWriter
from shale.reader import TopicReader
from tests.conftest import run_cli_here
from tests.needs import need_c_extension, need_module

pa = need_module("pyarrow")
pq = need_module("pyarrow.parquet")
T0 = 1_700_000_000_000
# lengths at each msgpack size-class boundary (fixstr 31/32, 8-bit 255/256, 16-bit 65535/65536)
EDGES = [0, 1, 15, 16, 31, 32, 255, 256, 65535, 65536]


def _var(rows: list[bytes | None]) -> VarColumn:
    lens = [0 if r is None else len(r) for r in rows]
    off = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lens, out=off[1:])
    valid = np.array([r is not None for r in rows], np.uint8)
    return VarColumn(off, b"".join(r or b"" for r in rows), None if valid.all() else valid)


def _random_columns(rnd: random.Random, n: int) -> RecordColumns:
    def blob() -> bytes | None:
        if rnd.random() < 0.1:
            return None
        return rnd.randbytes(rnd.choice(EDGES) if rnd.random() < 0.2 else rnd.randrange(40))

    names: list[bytes | None] = []
    values: list[bytes | None] = []
    pair_off = [0]
    for _ in range(n):
        for k in range(rnd.choice([0, 0, 1, 3, 16, 17, 40])):
            names.append(f"p{k}".encode() * rnd.choice([1, 10]))
            values.append("é".encode() * rnd.choice([0, 1, 20, 200]))
        pair_off.append(len(names))
    ints = [0, 1, 127, 128, 255, 256, 65535, 65536, (1 << 32) - 1, 1 << 32, -1, -32, -33, -128, -129, -32768,
            -32769, -(1 << 31), -(1 << 31) - 1, (1 << 63) - 1, -(1 << 63)]
    event = np.array([rnd.choice(ints) if rnd.random() < 0.5 else rnd.randrange(-T0, T0) for _ in range(n)],
                     np.int64)
    props_valid = np.array([rnd.random() < 0.9 for _ in range(n)], np.uint8)
    return RecordColumns(_var([blob() for _ in range(n)]), _var([blob() for _ in range(n)]),
                         Properties(np.array(pair_off, np.int64), _var(names), _var(values), props_valid),
                         event, np.array([rnd.random() < 0.8 for _ in range(n)], np.uint8))


@pytest.mark.kernels
@pytest.mark.parametrize("seed", range(4))
def test_encoder_matches_encode_entry_byte_for_byte(seed: int) -> None:
    rnd = random.Random(seed)
    cols = _random_columns(rnd, 300)
    for publish in (0, 127, 70_000, T0, (1 << 63) - 1):
        ref = encode_entry(list(cols.records(publish)))
        for got in (encode_columns(cols, publish, 1 << 26), encoder._encode_python(cols, publish, 1 << 26)):
            assert not isinstance(got, encoder.Refused)
            assert bytes(got.payload) == ref.payload
            assert np.array_equal(got.offsets, ref.r_offset) and np.array_equal(got.sizes, ref.r_size)
            assert np.array_equal(got.hash_hi, ref.r_hash_hi) and np.array_equal(got.hash_lo, ref.r_hash_lo)
            assert np.array_equal(got.flags, ref.r_flags)


@pytest.mark.kernels
def test_encoder_names_the_first_record_over_the_limit() -> None:
    cols = RecordColumns(_var([b"a", b"b", b"c"]), _var([b"x" * 10, b"y" * 100, b"z" * 1000]))
    assert encode_columns(cols, T0, 100) == encoder.Refused("size", 1)
    assert encoder._encode_python(cols, T0, 100) == encoder.Refused("size", 1)


@pytest.mark.kernels
@pytest.mark.parametrize("pairs", [2, 33, 200])
def test_encoder_refuses_a_property_named_twice(pairs: int) -> None:
    names = [f"n{k}".encode() for k in range(pairs - 1)] + [b"n0"]
    props = Properties(np.array([0, 0, pairs], np.int64), _var(names), _var([b"v"] * pairs))
    cols = RecordColumns(_var([b"a", b"b"]), _var([b"1", b"2"]), props)
    assert encode_columns(cols, T0, 1 << 20) == encoder.Refused("duplicate", 1)
    assert encoder._encode_python(cols, T0, 1 << 20) == encoder.Refused("duplicate", 1)


@pytest.mark.kernels
def test_encoder_refuses_offsets_outside_the_data() -> None:
    need_c_extension(encoder._native, "ledger/_encoder.c")
    bad = RecordColumns(VarColumn(np.array([0, 5, 99], np.int64), b"abcdef"), _var([b"x", b"y"]))
    with pytest.raises(ValueError, match="outside"):
        encode_columns(bad, T0, 1 << 20)
    falling = RecordColumns(VarColumn(np.array([0, 5, 2], np.int64), b"abcdef"), _var([b"x", b"y"]))
    with pytest.raises(ValueError, match="fall"):
        encode_columns(falling, T0, 1 << 20)


# ---------------------------------------------------------------------- append_batch


def _records(n: int, seed: int) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    rows = []
    for i in range(n):
        rows.append({
            "key": None if rnd.random() < 0.05 else f"k{rnd.randrange(200)}",
            "value": (None if rnd.random() < 0.05 else "" if rnd.random() < 0.03
                      else f"v{seed}-{i}-" + "x" * rnd.randrange(70)),
            "props": None if rnd.random() < 0.5 else {f"p{j}": "é" * j for j in range(rnd.randrange(4))},
            "event": None if rnd.random() < 0.3 else T0 + 1000 * i,
        })
    return rows


def _table(rows: list[dict[str, Any]]) -> Any:
    return pa.table({
        "key": pa.array([r["key"] for r in rows], pa.string()),
        "value": pa.array([None if r["value"] is None else r["value"].encode() for r in rows], pa.binary()),
        "props": pa.array([None if r["props"] is None else list(r["props"].items()) for r in rows],
                          pa.map_(pa.string(), pa.string())),
        "event": pa.array([None if r["event"] is None else datetime.datetime.fromtimestamp(r["event"] / 1000,
                                                                                          datetime.UTC)
                           for r in rows], pa.timestamp("us", tz="UTC")),
    })


def _fields(m: Message) -> tuple[Any, ...]:
    return (m.id, m.key, m.value, dict(m.properties), m.event_time, m.is_tombstone)


@pytest.mark.parametrize("codec", ["zstd", "none"])
def test_append_batch_equals_appending_one_by_one(topic_uri: str, codec: str) -> None:
    rows = _records(2500, 1)
    table = _table(rows)
    with TopicWriter(topic_uri + "-one", batch_size=37, max_ledger_records=1000, compression=codec) as one:
        for r in rows:
            one.append(r["key"], None if r["value"] is None else r["value"].encode(), r["props"], r["event"])
    with TopicWriter(topic_uri, batch_size=37, max_ledger_records=1000, compression=codec) as bulk:
        assert bulk.append_batch(table, properties="props", event_time="event") == len(rows)
    assert bulk.result.records == one.result.records == len(rows)
    assert bulk.result.tombstones == one.result.tombstones and bulk.result.keyless == one.result.keyless
    assert len(bulk.result.ledgers) == len(one.result.ledgers) == 3
    want = [_fields(m) for m in TopicReader(topic_uri + "-one")]
    got = [_fields(m) for m in TopicReader(topic_uri)]
    assert got == want
    # the same entries: ids run 0..36 within every entry
    assert max(m.id.batch for m in TopicReader(topic_uri)) == 36
    # a table of two chunks: an entry never spans two record batches, the records are the same
    chunked = pa.concat_tables([table.slice(0, 700), table.slice(700)])
    with TopicWriter(topic_uri + "-chunked", batch_size=37, max_ledger_records=1000, compression=codec) as w:
        w.append_batch(chunked, properties="props", event_time="event")
    assert [f[1:] for f in (_fields(m) for m in TopicReader(topic_uri + "-chunked"))] == [f[1:] for f in want]
    assert MessageId(1, 19, 0) in {m.id for m in TopicReader(topic_uri + "-chunked")}


def test_append_batch_takes_sliced_views_large_types_and_python_columns(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    keys = pa.array([f"k{i}" for i in range(50)], pa.large_string()).slice(7, 20)
    values = pa.array([f"v{i}".encode() for i in range(50)], pa.binary_view()).slice(3, 20)
    with TopicWriter(uri) as w:
        w.append_batch(pa.record_batch([keys, values], names=["id", "payload"]), key="id", value="payload")
        w.append_batch({"key": ["a", b"b", None], "value": [b"1", "2", None],
                        "properties": [{"x": "y"}, None, {}], "event_time": [5, None, -7]},
                       properties="properties", event_time="event_time")
        w.append(b"last", b"one")
    got = [(m.key, m.value, dict(m.properties), m.event_time) for m in TopicReader(uri)]
    assert got[:20] == [(f"k{i + 7}".encode(), f"v{i + 3}".encode(), {}, None) for i in range(20)]
    assert got[20:] == [(b"a", b"1", {"x": "y"}, 5), (b"b", b"2", {}, None), (None, None, {}, -7),
                        (b"last", b"one", {}, None)]


@pytest.mark.kernels
def test_bad_batches_name_the_column_and_row_and_append_nothing(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    good = pa.table({"key": ["a", "b", "c"], "value": ["1", "2", "3"]})
    with TopicWriter(uri, max_record_bytes=1000) as w:
        w.append_batch(good)
        cases: list[tuple[Any, dict[str, Any], type[Exception], str]] = [
            (pa.table({"k": ["a"], "value": ["1"]}), {}, InvalidInputError, "no column 'key'.*k, value"),
            (pa.table({"key": [1, 2], "value": ["1", "2"]}), {}, InvalidInputError, "column 'key' is int64"),
            (pa.table({"key": ["a", "b", "c"], "value": ["1", "2" * 2000, "3"]}), {}, RecordTooLargeError,
             "column 'value', row 1: 2,000 bytes .* maximum of 1,000"),
            (pa.table({"key": ["a", "b"], "value": ["1", "2"],
                       "p": pa.array([[("x", "y")], [("z", None)]], pa.map_(pa.string(), pa.string()))}),
             {"properties": "p"}, InvalidInputError, "column 'p', row 1: a property value is null"),
            (pa.table({"key": ["a"], "value": ["1"], "p": [3]}), {"properties": "p"}, InvalidInputError,
             "column 'p' is int64, not a map"),
            (pa.table({"key": ["a"], "value": ["1"], "t": [1.5]}), {"event_time": "t"}, InvalidInputError,
             "column 't' is double"),
            ({"key": ["a", 3], "value": ["1", "2"]}, {}, InvalidInputError, "column 'key', row 1: int is not"),
            (pa.table({"key": ["a", "b"], "value": ["1", "2"],
                       "p": pa.array([[], [("x", "1"), ("x", "2")]], pa.map_(pa.string(), pa.string()))}),
             {"properties": "p"}, InvalidInputError, "column 'p', row 1: a property is named twice"),
            ({"key": ["a"], "value": ["1", "2"]}, {}, InvalidInputError, "column 'value' has 2 rows"),
        ]
        for data, kw, exc, pattern in cases:
            with pytest.raises(exc, match=pattern):
                w.append_batch(data, **kw)
        # a big batch whose last row is too big: nothing of it is appended
        big = pa.table({"key": [f"k{i}" for i in range(5000)], "value": ["v"] * 4999 + ["x" * 5000]})
        with pytest.raises(RecordTooLargeError, match="row 4999"):
            w.append_batch(big)
    assert [m.key for m in TopicReader(uri)] == [b"a", b"b", b"c"]
    assert w.result.records == 3


def test_a_sealed_entry_never_exceeds_its_ledger(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    with TopicWriter(uri, batch_size=64, max_ledger_records=100) as w:
        w.append(b"first", b"1")
        w.append_batch({"key": [f"k{i}" for i in range(1000)], "value": ["v"] * 1000})
    assert [lg.records for lg in w.result.ledgers] == [100] * 10 + [1]
    assert len(list(TopicReader(uri))) == 1001


# ------------------------------------------------------------------ shale produce


def _files(tmp_path: Path, n: int) -> dict[str, Path]:
    import pyarrow.csv as pcsv
    import pyarrow.feather as feather

    table = pa.table({"id": [f"k{i % 40}" for i in range(n)], "payload": [f"value-{i}" for i in range(n)],
                      "n": list(range(n))})
    out = {"parquet": tmp_path / "in.parquet", "csv": tmp_path / "in.csv", "arrow": tmp_path / "in.arrow"}
    pq.write_table(table, out["parquet"], row_group_size=1000)
    pcsv.write_csv(table, out["csv"])
    feather.write_feather(table, out["arrow"], chunksize=1000)
    return out


def test_produce_reads_parquet_arrow_and_csv(tmp_path: Path) -> None:
    files = _files(tmp_path, 3000)
    for fmt, path in files.items():
        uri = str(tmp_path / f"topic-{fmt}")
        r = run_cli_here("produce", uri, "--input", str(path), "--key-field", "id", "--value-field", "payload",
                         "--json")
        assert r.returncode == 0, r.stderr
        got = [(m.key, m.value) for m in TopicReader(uri)]
        assert got == [(f"k{i % 40}".encode(), f"value-{i}".encode()) for i in range(3000)], fmt
    # standard input, format named
    uri = str(tmp_path / "topic-stdin")
    with open(files["parquet"], "rb") as f:
        import subprocess
        import sys

        r2 = subprocess.run([sys.executable, "-m", "shale.cli", "produce", uri, "--format", "parquet",
                             "--key-field", "id", "--value-field", "payload"], stdin=f, capture_output=True, text=True)
    assert r2.returncode == 0, r2.stderr
    assert len(list(TopicReader(uri))) == 3000


def test_produce_errors_are_one_line_and_append_nothing(tmp_path: Path) -> None:
    files = _files(tmp_path, 10)
    uri = str(tmp_path / "topic")
    cases = [
        (["--input", str(files["parquet"])], "no column 'key' (its columns: id, payload, n)"),
        (["--input", str(files["csv"]), "--key-field", "nope", "--value-field", "payload"], "'nope'"),
        (["--input", str(files["parquet"]), "--key-field", "n", "--value-field", "payload"], "column 'n' is int64"),
        (["--input", str(files["csv"]), "--format", "arrow"], "not readable as arrow"),
        (["--input", str(files["csv"]), "--format", "jsonl", "--key-field", "id"], "--key-field picks a column"),
    ]
    for args, message in cases:
        r = run_cli_here("produce", uri, *args)
        assert r.returncode == 2, (args, r.stderr)
        assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "Traceback" not in r.stderr
    assert not list(TopicReader(uri)) if (tmp_path / "topic").exists() else True


def test_produce_names_the_file_row_of_a_bad_record(tmp_path: Path) -> None:
    path = tmp_path / "big.parquet"
    values = ["v"] * 2999 + ["x" * 70_000_000]
    pq.write_table(pa.table({"key": [f"k{i}" for i in range(3000)], "value": values}), path, row_group_size=1000)
    uri = str(tmp_path / "topic")
    r = run_cli_here("produce", uri, "--input", str(path))
    assert r.returncode == 2, r.stderr
    assert "column 'value', row 2999: 70,000,000 bytes" in r.stderr, r.stderr
    # the batches before the bad one were sealed and registered whole; the bad one not at all
    assert len(list(TopicReader(uri))) in (0, 2000)
    assert "nothing was appended" in r.stderr or "2000 earlier records were appended" in r.stderr
