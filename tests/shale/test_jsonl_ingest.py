"""``shale produce`` of JSON lines through the C scanner and the bulk append, against the
line-by-line path (``shale.cli.produce._append_lines``): for any input, the same records
stored byte for byte and the same error, naming the same line, with the same records
appended before it.  scripts/sanitize.sh runs this file against a sanitized build."""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shale import jsonl_ingest
from shale.cli.produce import _append_lines
from shale.jsonlines import MAX_JSON_DEPTH
from shale.ledger.errors import InvalidInputError
from shale.ledger.record import EVENT_TIME_MAX_MS, EVENT_TIME_MIN_MS
from shale.producer import TopicWriter
from shale.reader import TopicReader
from tests.conftest import run_cli_here
from tests.needs import c_extension, needs

pytestmark = needs(c_extension(jsonl_ingest._native, "ledger/_jsonl.c"))

Stored = list[tuple[bytes | None, bytes | None, dict[str, str], int | None]]


class Trickle(io.RawIOBase):
    """``data`` in reads of ``step`` bytes at most, from a stream whose descriptor (an empty
    pipe) says that no more input is there yet: lines written slowly into a pipe."""

    def __init__(self, data: bytes, step: int) -> None:
        self.data, self.step, self.at = data, step, 0
        self.pipe = os.pipe()

    def read1(self, n: int = -1) -> bytes:
        got = self.data[self.at:self.at + min(n if n >= 0 else self.step, self.step)]
        self.at += len(got)
        return got

    def fileno(self) -> int:
        return self.pipe[0]

    def close(self) -> None:
        if not self.closed:
            for fd in self.pipe:
                os.close(fd)
        super().close()


def produce(data: bytes, columnar: bool, max_record_bytes: int, chunk_bytes: int = 1 << 20, trickle: int = 0
            ) -> tuple[Stored, str | None, int]:
    """What a run over ``data`` stores, the error it ends with, and the records it appended."""
    with tempfile.TemporaryDirectory(prefix="shale-jsonl-") as folder:
        w = TopicWriter(f"{folder}/t", max_record_bytes=max_record_bytes, batch_size=7, max_ledger_records=50)
        error = None
        try:
            if columnar and trickle:
                with Trickle(data, trickle) as stream:
                    jsonl_ingest.produce_lines(w, stream, "in.jsonl", chunk_bytes=chunk_bytes)
            elif columnar:
                jsonl_ingest.produce_lines(w, io.BytesIO(data), "in.jsonl", chunk_bytes=chunk_bytes)
            else:
                _append_lines(w, io.BytesIO(data), "in.jsonl", None)
        except InvalidInputError as e:
            error = str(e)
        appended = w.close().records
        stored = [(m.key, m.value, dict(m.properties), m.event_time) for m in TopicReader(f"{folder}/t")]
    return stored, error, appended


def same(data: bytes, max_record_bytes: int = 1 << 20, chunk_bytes: int = 1 << 20, trickle: int = 0
         ) -> tuple[Stored, str | None]:
    old = produce(data, False, max_record_bytes)
    new = produce(data, True, max_record_bytes, chunk_bytes, trickle)
    assert new == old
    return old[0], old[1]


# ------------------------------------------------------------------ strategies

_text = st.text(st.characters(codec="utf-8"), max_size=6) | st.sampled_from(
    ["", "é", "\u2028", "\x00", "\"\\/", "😀", "\t\n\r\b\f", "k" * 40, "\udc00", "a\ud800", "\ud83d\ude00",
     "\udbff\udfff", "\ud800\ud800"])
_json: Any = st.recursive(
    st.none() | st.booleans() | st.integers(-10**30, 10**30) | st.floats(allow_nan=False, allow_infinity=False)
    | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3), max_leaves=8)
_event = st.integers(EVENT_TIME_MIN_MS - 2, EVENT_TIME_MIN_MS + 2) \
    | st.integers(EVENT_TIME_MAX_MS - 2, EVENT_TIME_MAX_MS + 2) | st.integers(-10**20, 10**20) \
    | st.sampled_from([0, -0.0, 1.0, 1.5, "1", True, None])
_field_values = {
    "key": _text | st.none() | st.sampled_from([1, [], {}]),
    "value": _text | st.none() | _json,
    "properties": st.dictionaries(_text, _text, max_size=20) | st.none()
    | st.dictionaries(_text, _json, max_size=2),
    "event_time": _event,
    "key_b64": st.sampled_from(["", "YQ==", "not base64", None]),
    "value_b64": st.sampled_from(["", "YWI=", "!", None]),
    "other": st.just(1),
}

_SPECIAL = [
    b"", b"   ", b"\t\r", b"\x0b\x1c", b"\xc2\xa0", b"\xe3\x80\x80", b"\xff", b"\xc3(", b"\xed\xa0\x80",
    b'{"key":"a\\ud800","value":"b"}', b'{"key":"a\\udc00\\ud800","value":"b"}',
    b'{"key":"\\ud83d\\ude00","value":"\\u00e9\\u0000"}', b'{"key":"\\udc00","value":"b"}',
    b'{"key":"a","value":"\\uDFFF"}', b'{"key":"a","properties":{"\\ud800":"x"}}', b'{"key":"\\uD800\\u0041"}',
    b'{"key":"a","value":"b\\x"}',
    b'{"key":"a","key":"b","value":"v"}', b'{"key":"a","properties":{"p":"1","p":"2"}}',
    b'{"k\\u0065y":"a","value":"v"}', b'{"key":"a","value":' + b"[" * 70 + b"]" * 70 + b"}",
    b'{"key":"a","value":' + b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH + b"}",
    b'{"key":"a","value":' + b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1) + b"}",
    b'{"key":"a","value":[' + b"9" * 5000 + b"]}", b'{"key":"a","value":[1e400,-0,0.5E-3,01]}',
    b'{"key":"a","value":[1.]}', b'{"key":"a","value":[-]}', b'{"key":"a","value":[NaN]}',
    b'{"key":"a","value":{"d":1,"d":2}}', b'{"key":"a","value":{"a":1,}}', b'{"key":"a","value":[tru]}',
    b'{"key":"a","value":"x"} x', b'{"key":"a","value":"x"}\r', b' {"key":"a"} ', b"{}", b"[]", b"null", b"1",
    b'{"key":"a","event_time":-0}', b'{"key":"a","event_time":1e3}', b'{"key":"a","event_time":007}',
    b'{"key":"a","event_time":' + str(EVENT_TIME_MAX_MS + 1).encode() + b"}",
    b'{"key":"a","event_time":99999999999999999999999}', b'{"key":"a","value":"tab\there"}',
    b'{"key": null, "value": null, "properties": null, "event_time": null}', b'{"key":"a","value":""}',
    b'{"key":"","value":{}}', b'{"key":"a","value":"' + b"x" * 3000 + b'"}',
    b'{"key":"a","properties":{' + b",".join(b'"p%d":"v"' % i for i in range(40)) + b"}}",
]


@st.composite
def _record_line(draw: st.DrawFn) -> bytes:
    names = draw(st.lists(st.sampled_from(list(_field_values)), max_size=5))
    doc = {n: draw(_field_values[n]) for n in names}
    text = json.dumps(doc, ensure_ascii=draw(st.booleans()),
                      separators=draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,\t", " : ")])))
    raw = text.encode("utf-8", "surrogatepass")
    if draw(st.integers(0, 5)) == 0:  # a byte changed, dropped or added
        at = draw(st.integers(0, len(raw)))
        byte = bytes([draw(st.sampled_from(b' "\\{}[],:0-.eu\x00\x80\xc3\xff\r\n'))])
        raw = raw[:at] + draw(st.sampled_from([byte, b""])) + raw[at + draw(st.integers(0, 1)):]
    return raw


_line = _record_line() | st.sampled_from(_SPECIAL)


@st.composite
def _input(draw: st.DrawFn) -> bytes:
    lines = draw(st.lists(_line, max_size=12))
    ends = [draw(st.sampled_from([b"\n", b"\n", b"\r\n"])) for _ in lines]
    data = b"".join(line + end for line, end in zip(lines, ends, strict=True))
    return data[:-1] if data and draw(st.booleans()) else data  # the last line without its end, or not


# ------------------------------------------------------------------------ tests


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_input(), st.sampled_from([1 << 20, 300, 120]), st.sampled_from([1, 7, 64, 1 << 20]),
       st.sampled_from([0, 0, 1, 5, 50]))
@example(b'{"key":"a","value":"b"}\n\xff\n{"key":"c","value":"d"}\n', 1 << 20, 1 << 20, 0)
@example(b'{"key":"a","value":"' + b"x" * 400 + b'"}\n', 300, 1 << 20, 0)
def test_columns_store_and_refuse_as_the_line_by_line_path(data: bytes, max_record_bytes: int,
                                                           chunk_bytes: int, trickle: int) -> None:
    same(data, max_record_bytes, chunk_bytes, trickle)


@pytest.mark.parametrize("line", _SPECIAL)
def test_each_edge_case_alone_and_after_good_lines(line: bytes) -> None:
    good = b'{"key":"k","value":{"n":1},"properties":{"p":"q"},"event_time":5}\n'
    same(line + b"\n")
    same(good * 3 + line + b"\n" + good, chunk_bytes=len(good) * 2)


def test_a_bad_line_keeps_the_records_before_it_and_names_its_line() -> None:
    good = b'{"key":"k%d","value":"\\"v\\"","properties":{"source":"demo"}}\n'
    data = b"".join(good % i for i in range(40)) + b'{"key":"x","value":1}\n' + good % 99
    stored, error = same(data, chunk_bytes=100)
    assert error == "in.jsonl:41: 'value' must be a string, a JSON object or array, or null"
    assert [r[0] for r in stored] == [b"k%d" % i for i in range(40)]
    assert stored[0][1:] == (b'"v"', {"source": "demo"}, None)


def test_a_record_over_the_limit_is_refused_with_its_line_and_the_same_words() -> None:
    data = b'{"key":"a","value":"small"}\n\n{"key":"b","value":"' + b"x" * 500 + b'"}\n{"key":"c"}\n'
    stored, error = same(data, max_record_bytes=300, chunk_bytes=10)
    assert error is not None and error.startswith("in.jsonl:3: record of ") and "maximum of 300 bytes" in error
    assert stored == [(b"a", b"small", {}, None)]


def test_common_lines_never_reach_the_python_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    import shale.jsonlines

    calls = []
    real = shale.jsonlines.parse_record_line
    monkeypatch.setattr(shale.jsonlines, "parse_record_line", lambda *a: calls.append(a) or real(*a))
    lines = [json.dumps({"key": f"user-{i}", "value": json.dumps({"email": f"u{i}@example.com", "seq": i}),
                         "properties": {"source": "demo"}, "event_time": 1_700_000_000_000 + i}) for i in range(300)]
    lines += [json.dumps({"key": None, "value": f"heartbeat {i}"}) for i in range(3)]
    lines += [json.dumps({"key": "gone", "value": None}), json.dumps({"key": "é", "value": {"a": [1, 2.5e-3]}})]
    data = ("\n".join(lines) + "\n").encode()
    stored, error, appended = produce(data, True, 1 << 20, chunk_bytes=4096)
    assert not calls
    monkeypatch.undo()
    assert produce(data, False, 1 << 20) == (stored, error, appended)
    assert error is None and appended == len(stored) == len(lines)
    assert stored[0] == (b"user-0", b'{"email": "u0@example.com", "seq": 0}', {"source": "demo"}, 1_700_000_000_000)


def test_shale_produce_reads_common_lines_as_columns_and_names_a_bad_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shale.jsonlines

    calls = []
    real = shale.jsonlines.parse_record_line
    monkeypatch.setattr(shale.jsonlines, "parse_record_line", lambda *a: calls.append(a[1]) or real(*a))
    source = tmp_path / "in.jsonl"
    good = [json.dumps({"key": f"k{i}", "value": {"n": i}, "properties": {"p": "q"}}) for i in range(30)]
    source.write_text("\n".join([*good, '{"key":"k","value":"a\\ud800"}', *good]) + "\n")
    p = run_cli_here("produce", str(tmp_path / "t"), "--input", str(source), "--max-ledger-records", "7")
    assert p.returncode == 2 and p.stderr == (
        f"shale: error: {source}:31: not valid JSON: a \\u escape is half of a surrogate pair (not valid Unicode) "
        "(30 earlier records were appended, last id 5:0:1)\n")
    assert calls == [f"{source}:31"]  # the one line the scanner left to the Python parser
    assert [(m.key, m.value) for m in TopicReader(str(tmp_path / "t"))] == [
        (f"k{i}".encode(), b'{"n": %d}' % i) for i in range(30)]


def test_lines_piped_slowly_still_make_whole_entries(tmp_path: Path) -> None:
    lines = b"".join(b'{"key":"k%d","value":"v%d","event_time":%d}\n' % (i, i, i) for i in range(95))
    w = TopicWriter(str(tmp_path / "t"), batch_size=10, max_ledger_records=40)
    with Trickle(lines, 30) as stream:  # a line or two at a time
        assert jsonl_ingest.produce_lines(w, stream, "-") == 95
    result = w.close()
    assert [(lg.records, lg.entries) for lg in result.ledgers] == [(40, 4), (40, 4), (15, 2)]
    assert [(m.key, m.event_time) for m in TopicReader(str(tmp_path / "t"))] == [
        (b"k%d" % i, i) for i in range(95)]
