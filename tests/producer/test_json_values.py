"""JSON values stored byte for byte, strict JSON out, deep nesting refused with its line,
and event times every reader of an export holds, at every way in."""

from __future__ import annotations

import base64
import datetime
import json
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pytest

from shale.ledger.errors import InvalidInputError
from shale.ledger.record import EVENT_TIME_MAX_MS, EVENT_TIME_MIN_MS, Record
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.producer.jsonlines import MAX_JSON_DEPTH
from shale.reader import TopicReader
from tests.conftest import run_cli_here
from tests.needs import need_module

EXAMPLE = (b'{"price":19.99000000000000021316282072803,"id":12345678901234567890123456789.0,'
           b'"amount":1e400,"dup":1,"dup":2}')
RANGE = f"{EVENT_TIME_MIN_MS} to {EVENT_TIME_MAX_MS} ms"


class _Line(msgspec.Struct):
    """An output line with its value's JSON text as printed."""

    value: msgspec.Raw = msgspec.Raw(b"")


def strict(line: str) -> Any:
    """``line`` parsed by two strict parsers (no NaN or Infinity, nothing but RFC 8259)."""
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    doc = json.loads(line, parse_constant=refuse)
    assert msgspec.json.decode(line) is not None or doc is None
    assert isinstance(doc, dict)
    return doc


def printed_value(line: str) -> bytes:
    """The text of the line's ``value``, exactly as printed."""
    return bytes(msgspec.json.decode(line, type=_Line).value)


def lines_of(p: subprocess.CompletedProcess[str]) -> list[str]:
    assert p.returncode == 0, p.stderr
    assert p.stdout.endswith("\n") or not p.stdout
    return p.stdout.split("\n")[:-1]  # (not splitlines: U+2028 inside a string ends no line)


def one_line_error(p: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    assert p.returncode == code, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr and p.stderr.count("\n") == 1, p.stderr
    for n in needles:
        assert n in p.stderr, (n, p.stderr)
    return p.stderr


def stored(topic: str) -> list[tuple[bytes | None, bytes | None]]:
    return [(m.key, m.value) for m in TopicReader(topic)]


# ------------------------------------------------------------- byte for byte

# JSON objects and arrays as a producer's line gives them: each is stored as this text
GIVEN = [
    EXAMPLE,
    b'{ "spaced" : [ 1 , 2.50 , -0 , 1E+2 , 1e-400 ] ,\t"tab" : true }',
    b'{"esc":"\\u00e9\\n\\"\\\\\\/\\ud83d\\ude00","raw":"\xc3\xa9\xe2\x80\xa8"}',
    b'[{"dup":1,"dup":{"dup":[]}},{},[],null,false,"",' + b"9" * 4300 + b"]",
    b'{"big":' + b"1" * 300 + b'.5,"int":-123456789012345678901234567890}',
    b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH,
]


def test_json_values_are_stored_and_printed_byte_for_byte(disk_topic_uri: str) -> None:
    lines = b"".join(b'{"key":"k%d","value":%s}\n' % (i, v) for i, v in enumerate(GIVEN))
    p = run_cli_here("produce", disk_topic_uri, input=lines.decode())
    assert p.returncode == 0, p.stderr
    assert stored(disk_topic_uri) == [(b"k%d" % i, v) for i, v in enumerate(GIVEN)]
    # read, get and export (text): each value is a JSON string of its exact text
    for line, want in zip(lines_of(run_cli_here("read", disk_topic_uri)), GIVEN, strict=True):
        assert strict(line)["value"].encode() == want
    r = run_cli_here("get", disk_topic_uri, "k0")
    assert strict(r.stdout)["value"].encode() == EXAMPLE, r.stderr
    out = f"{disk_topic_uri}-export.jsonl"
    assert run_cli_here("export", disk_topic_uri, out, "--format", "jsonl").returncode == 0
    from shale.storage import resolve

    target = resolve(out)
    exported = target.store.get(target.prefix).decode().split("\n")[:-1]
    assert [strict(x)["value"].encode() for x in exported] == GIVEN
    # --value-format json: embedded as its exact text where every strict parser reads it;
    # the example's 1e400 is beyond 64-bit floats (msgspec refuses it): a string of its text
    for line, want in zip(lines_of(run_cli_here("read", disk_topic_uri, "--value-format", "json")), GIVEN, strict=True):
        doc = strict(line)
        if b"1e400" in want:
            assert doc["value"].encode() == want
        else:
            assert printed_value(line) == want
    r = run_cli_here("get", disk_topic_uri, "k1", "--value-format", "json")
    assert printed_value(r.stdout) == GIVEN[1] and strict(r.stdout)["value"]["spaced"][1] == 2.5


def test_a_string_value_and_binary_values_keep_their_meaning(tmp_path: Path) -> None:
    topic = str(tmp_path / "t")
    text = "é \" \\ \n \u2028 😀 {not json}"
    raw = b"\x00\xff{"
    docs = [{"key": "a", "value": text}, {"key_b64": base64.b64encode(b"\xfe\x00").decode(),
                                         "value_b64": base64.b64encode(raw).decode()},
            {"key": "c", "value": None}, {"key": "d", "value": ""}, {"key": "e"},
            {"key": "f", "value": "x", "properties": {"p": "é", "q": ""}, "event_time": -5}]
    p = run_cli_here("produce", topic, input="".join(json.dumps(d) + "\n" for d in docs))
    assert p.returncode == 0, p.stderr
    got = list(TopicReader(topic))
    assert [(m.key, m.value) for m in got] == [(b"a", text.encode()), (b"\xfe\x00", raw), (b"c", None),
                                               (b"d", b""), (b"e", None), (b"f", b"x")]
    assert dict(got[5].properties) == {"p": "é", "q": ""} and got[5].event_time == -5


# ------------------------------------------------------------- strict output

# values a producer may store through the API, and how --value-format json prints them:
# "doc" embedded as its text, "text" a JSON string of its text, "b64" value_b64
HOSTILE: list[tuple[bytes, str]] = [
    (b"NaN", "text"), (b"Infinity", "text"), (b"-Infinity", "text"), (b'{"a": NaN}', "text"),
    (b"[Infinity, 1]", "text"), (b"1e400", "text"), (b'{"x": -1e999}', "text"), (b"9" * 4301, "text"),
    (b'"\\ud800"', "text"), (b'["\\udc00x"]', "text"), (b'{"a":1,}', "text"), (b"[1 2]", "text"),
    (b"{'a': 1}", "text"), (b'"\x01"', "text"), (b"plain words", "text"), (b"[" * 100_000, "text"),
    (b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1), "text"), (b'{"a":1} {"b":2}', "text"),
    (b"\xef\xbb\xbf{}", "text"),
    (b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH, "doc"), (b'{"dup":1,"dup":2}', "doc"), (b"123", "doc"),
    (b'"quoted"', "doc"), (b"true", "doc"), (b"null", "doc"), (b'{"s":"\xe2\x80\xa8\\u2029"}', "doc"),
    (b"  [1, 2]  ", "doc"), (b"0.1000000000000000055511151231257827", "doc"),
    (b"\xff\xfe", "b64"), (b'{"a":"\xff"}', "b64"),
]


def test_value_format_json_prints_strict_json_whatever_the_value(disk_topic_uri: str) -> None:
    with TopicWriter(disk_topic_uri) as w:
        for i, (value, _) in enumerate(HOSTILE):
            w.append(f"k{i}", value, {"p": "\u2028"}, event_time=i)
        w.append("multi", b'{\r\n  "a": [1,\n 2.50]\n}\n')
    read = lines_of(run_cli_here("read", disk_topic_uri, "--value-format", "json"))
    assert len(read) == len(HOSTILE) + 1
    for line, (value, how) in zip(read, HOSTILE, strict=False):
        doc = strict(line)
        if how == "doc":
            assert printed_value(line) == value.strip(), line[:200]
        elif how == "text":
            assert doc["value"] == value.decode(), line[:200]
        else:
            assert "value" not in doc and base64.b64decode(doc["value_b64"]) == value
    # a document on several lines is printed on one: its line breaks become spaces
    assert printed_value(read[-1]) == b'{    "a": [1,  2.50] }'
    # the same through get, and in text through read and export
    for i in (0, 5, 15, 20, 28):
        r = run_cli_here("get", disk_topic_uri, f"k{i}", "--value-format", "json")
        assert r.stdout.count("\n") == 1 and strict(r.stdout)["key"] == f"k{i}", r.stderr
    for line in lines_of(run_cli_here("read", disk_topic_uri)):
        strict(line)
    out = f"{disk_topic_uri}-all.jsonl"
    assert run_cli_here("export", disk_topic_uri, out, "--format", "jsonl").returncode == 0
    from shale.storage import resolve

    target = resolve(out)
    exported = target.store.get(target.prefix).decode().split("\n")
    assert exported[-1] == "" and len(exported) == len(HOSTILE) + 2
    for line in exported[:-1]:
        strict(line)


# ------------------------------------------------------------------ nesting


@pytest.mark.parametrize("third", [
    "[" * 100_000 + "]" * 100_000,
    '{"key":"x","value":' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"key":"x","value":' + '{"a":' * 100_000 + "1" + "}" * 100_001,
    '{"key":"x","value":' + "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1) + "}",
    '{"key":"x","value":"v","other":' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"key":"x","value":"v","properties":' + '{"a":' * 100_000 + '"b"' + "}" * 100_001,
    '{"key":"x","value":' + "[" * 100_000,
])
def test_a_line_nested_too_deep_is_refused_with_its_number(tmp_path: Path, third: str) -> None:
    topic = str(tmp_path / "t")
    text = '{"key":"a","value":"1"}\n{"key":"b","value":"2"}\n' + third + '\n{"key":"c","value":"3"}\n'
    p = run_cli_here("produce", topic, input=text)
    line = one_line_error(p, 2, "<stdin>:3", "2 earlier records were appended, last id 1:0:1")
    assert "Recursion" not in line and "recursion" not in line
    assert stored(topic) == [(b"a", b"1"), (b"b", b"2")]
    assert len(TopicMetadata.open(topic).load_topic().ledgers) == 1


def test_a_value_nested_as_deep_as_allowed_is_kept(tmp_path: Path) -> None:
    topic = str(tmp_path / "t")
    deep = '{"a":' * MAX_JSON_DEPTH + "1" + "}" * MAX_JSON_DEPTH
    p = run_cli_here("produce", topic, input='{"key":"x","value":' + deep + "}\n")
    assert p.returncode == 0, p.stderr
    assert stored(topic) == [(b"x", deep.encode())]
    (line,) = lines_of(run_cli_here("read", topic, "--value-format", "json"))
    assert printed_value(line) == deep.encode()
    strict(line)


@pytest.mark.parametrize("bad, needle", [
    ('{"key":"b","value":NaN}', "NaN"),
    ('{"key":"b","value":{"a":Infinity}}', "Infinity"),
    ('{"key":"b","value":{"a":-Infinity}}', "Infinity"),
    ('{"key":"b","value":{"a":"\\ud800"}}', "surrogate"),
    ('{"key":"\\udc00x","value":"1"}', "surrogate"),
    ('{"key":"b","value":{"a":1,}}', "not valid JSON"),
    ('{"key":"b","value":5}', "'value'"),
    ('{"key":"b","value":true}', "'value'"),
    ('{"key":"b","value":"1","colour":"red","size":2}', "unknown fields colour, size"),
    ('{"key":"b","key_b64":"YQ==","value":"1"}', "key_b64"),
    ('{"key":"b","value":{"a":1},"value_b64":"YQ=="}', "value_b64"),
    ('{"key":"b","value":"1","properties":{"p":{"q":"r"}}}', "'properties'"),
    ('{"key":"b","value":"1","event_time":"5"}', "'event_time'"),
    ('{"key":"b","value":"1","event_time":5.0}', "'event_time'"),
    ('{"key":"b","value":"1","event_time":true}', "'event_time'"),
    ('{"key":["b"],"value":"1"}', "'key'"),
    ('"just a string"', "JSON object"),
])
def test_the_rest_of_the_line_is_checked_as_strictly(tmp_path: Path, bad: str, needle: str) -> None:
    topic = str(tmp_path / "t")
    p = run_cli_here("produce", topic, input='{"key":"a","value":"1"}\n' + bad + '\n{"key":"c","value":"3"}\n')
    one_line_error(p, 2, "<stdin>:2", needle, "1 earlier record was appended")
    assert stored(topic) == [(b"a", b"1")]


# -------------------------------------------------------------- event times


@pytest.mark.parametrize("event_time", [EVENT_TIME_MIN_MS - 1, EVENT_TIME_MAX_MS + 1, (1 << 63) - 1, -(1 << 63),
                                        1 << 63, 10 ** 30])
def test_an_event_time_no_reader_holds_is_refused_in_json_lines(tmp_path: Path, event_time: int) -> None:
    topic = str(tmp_path / "t")
    p = run_cli_here("produce", topic, input=f'{{"key":"a","value":"1","event_time":{EVENT_TIME_MAX_MS}}}\n'
                     f'{{"key":"b","value":"2","event_time":{event_time}}}\n')
    one_line_error(p, 2, "<stdin>:2", "event_time", RANGE, "1 earlier record was appended")
    assert [m.event_time for m in TopicReader(topic)] == [EVENT_TIME_MAX_MS]


@pytest.mark.parametrize("event_time", [EVENT_TIME_MIN_MS - 1, EVENT_TIME_MAX_MS + 1, (1 << 63) - 1, -(1 << 63)])
def test_an_event_time_no_reader_holds_is_refused_by_the_writer(tmp_path: Path, event_time: int) -> None:
    topic = str(tmp_path / "t")
    with TopicWriter(topic) as w:
        w.append("a", "1", event_time=EVENT_TIME_MIN_MS)
        with pytest.raises(InvalidInputError, match=RANGE):
            w.append("b", "2", event_time=event_time)
        with pytest.raises(InvalidInputError, match=RANGE):
            w.send(Record(b"b", b"2", {}, 1, event_time))
        with pytest.raises(InvalidInputError, match="publish time"):
            w.send(Record(b"b", b"2", {}, EVENT_TIME_MAX_MS + 1, None))
        with pytest.raises(InvalidInputError, match=r"column 'when', row 2: event time -?\d+ is outside " + RANGE):
            w.append_batch({"key": ["c", "d", "e"], "value": ["3", "4", "5"], "when": [0, None, event_time]},
                           event_time="when")
        w.append("f", "6", event_time=EVENT_TIME_MAX_MS)
    assert [(m.key, m.event_time) for m in TopicReader(topic)] == [(b"a", EVENT_TIME_MIN_MS),
                                                                   (b"f", EVENT_TIME_MAX_MS)]


def test_an_event_time_no_reader_holds_is_refused_in_arrow_columns(tmp_path: Path) -> None:
    pa = need_module("pyarrow")
    topic = str(tmp_path / "t")
    cases = [
        (pa.array([0, EVENT_TIME_MAX_MS + 1], pa.int64()), 1),
        (pa.array([EVENT_TIME_MIN_MS - 1, 0], pa.int64()), 0),
        (pa.array([0, None, (1 << 63) - 1], pa.int64()), 2),
        (pa.array([0, 253_402_300_800], pa.timestamp("s")), 1),                    # year 10000
        (pa.array([0, EVENT_TIME_MIN_MS * 1000 - 1], pa.timestamp("us", "UTC")), 1),
    ]
    with TopicWriter(topic) as w:
        for times, row in cases:
            table = pa.table({"key": ["a"] * len(times), "value": ["1"] * len(times), "t": times})
            with pytest.raises(InvalidInputError, match=rf"column 't', row {row}: event time .*{RANGE}"):
                w.append_batch(table, event_time="t")
        edges = pa.array([EVENT_TIME_MIN_MS, EVENT_TIME_MAX_MS], pa.timestamp("ms"))
        assert w.append_batch(pa.table({"key": ["lo", "hi"], "value": ["1", "2"], "t": edges}), event_time="t") == 2
    assert [m.event_time for m in TopicReader(topic)] == [EVENT_TIME_MIN_MS, EVENT_TIME_MAX_MS]


def test_an_event_time_no_reader_holds_is_refused_in_an_input_file(tmp_path: Path) -> None:
    pa = need_module("pyarrow")
    pq = need_module("pyarrow.parquet")
    topic = str(tmp_path / "t")
    src = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"key": ["a", "b", "c"], "value": ["1", "2", "3"],
                             "at": pa.array([1, 2, -(1 << 62)], pa.int64())}), src)
    p = run_cli_here("produce", topic, "--input", str(src), "--event-time-field", "at")
    one_line_error(p, 2, str(src), "column 'at', row 2", RANGE, "nothing was appended")
    assert stored(topic) == []


def test_exported_extreme_event_times_read_everywhere(tmp_path: Path) -> None:
    """The earliest and latest event times a producer accepts, exported as Parquet and
    Arrow: DuckDB, pyarrow, Polars and pandas all read them, as the same instants."""
    pa = need_module("pyarrow")
    pq = need_module("pyarrow.parquet")
    duckdb = need_module("duckdb")
    pl = need_module("polars")
    pd = need_module("pandas")
    topic = str(tmp_path / "t")
    p = run_cli_here("produce", topic, input=f'{{"key":"lo","value":"1","event_time":{EVENT_TIME_MIN_MS}}}\n'
                     f'{{"key":"hi","value":"2","event_time":{EVENT_TIME_MAX_MS}}}\n')
    assert p.returncode == 0, p.stderr
    utc = datetime.UTC
    want = [datetime.datetime(1, 1, 1, tzinfo=utc), datetime.datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=utc)]
    parquet, arrow = tmp_path / "out.parquet", tmp_path / "out.arrow"
    for out in (parquet, arrow):
        assert run_cli_here("export", topic, str(out)).returncode == 0

    def instants(times: Any) -> list[datetime.datetime]:
        return [t.astimezone(utc) for t in times]

    assert pq.read_table(parquet).column("event_time").to_pylist() == want
    assert pa.ipc.open_file(str(arrow)).read_all().column("event_time").to_pylist() == want
    assert instants(pl.read_parquet(parquet)["event_time"].to_list()) == want
    assert instants(pl.read_ipc(arrow)["event_time"].to_list()) == want
    assert instants(t.to_pydatetime() for t in pd.read_parquet(parquet)["event_time"]) == want
    assert instants(t.to_pydatetime() for t in pd.read_feather(arrow)["event_time"]) == want
    got = duckdb.sql(f"SELECT event_time FROM read_parquet('{parquet}') ORDER BY event_time").fetchall()
    assert instants(t for (t,) in got) == want


