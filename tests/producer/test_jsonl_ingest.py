"""``shale produce`` of JSON lines through the C scanner and the bulk append, against the
line-by-line path (``shale.producer.jsonl_ingest.append_lines``): for any input, the same records
stored byte for byte and the same error, naming the same line, with the same records
appended before it.  scripts/sanitize.sh runs this file against a sanitized build."""

from __future__ import annotations

import io
import json
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shale.ledger.errors import InvalidInputError
from shale.ledger.record import EVENT_TIME_MAX_MS, EVENT_TIME_MIN_MS
from shale.producer import TopicWriter, jsonl_ingest
from shale.producer.jsonl_ingest import append_lines as _append_lines
from shale.producer.jsonlines import MAX_JSON_DEPTH
from shale.reader import TopicReader
from shale.storage import resolve
from tests.conftest import run_cli_here
from tests.needs import c_extension, needs

pytestmark = [pytest.mark.kernels, needs(c_extension(jsonl_ingest._native, "ledger/_jsonl.c"))]

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


def produce(data: bytes, columnar: bool, max_record_bytes: int, chunk_bytes: int = 1 << 20, trickle: int = 0,
            *, memory: bool = False) -> tuple[Stored, str | None, int]:
    """What a run over ``data`` stores, the error it ends with, and the records it appended
    (``memory``: into a topic in memory, a run in a millisecond or two, for the tests
    that make hundreds)."""
    if memory:
        topic = resolve(f"memory://shale-jsonl-{uuid.uuid4().hex[:12]}/t")
        try:
            return _produce_into(topic.uri, data, columnar, max_record_bytes, chunk_bytes, trickle)
        finally:
            for info in list(topic.store.list(f"{topic.prefix}/")):
                topic.store.delete(info.key)
    with tempfile.TemporaryDirectory(prefix="shale-jsonl-") as folder:
        return _produce_into(f"{folder}/t", data, columnar, max_record_bytes, chunk_bytes, trickle)


def _produce_into(uri: str, data: bytes, columnar: bool, max_record_bytes: int, chunk_bytes: int, trickle: int
                  ) -> tuple[Stored, str | None, int]:
    w = TopicWriter(uri, max_record_bytes=max_record_bytes, batch_size=7, max_ledger_records=50)
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
    stored = [(m.key, m.value, dict(m.properties), m.event_time) for m in TopicReader(uri)]
    return stored, error, appended


def same(data: bytes, max_record_bytes: int = 1 << 20, chunk_bytes: int = 1 << 20, trickle: int = 0, *,
         memory: bool = False) -> tuple[Stored, str | None]:
    old = produce(data, False, max_record_bytes, memory=memory)
    new = produce(data, True, max_record_bytes, chunk_bytes, trickle, memory=memory)
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
    import shale.producer.jsonlines

    calls = []
    real = shale.producer.jsonlines.parse_record_line
    monkeypatch.setattr(shale.producer.jsonlines, "parse_record_line", lambda *a: calls.append(a) or real(*a))
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
    import shale.producer.jsonlines

    calls = []
    real = shale.producer.jsonlines.parse_record_line
    monkeypatch.setattr(shale.producer.jsonlines, "parse_record_line", lambda *a: calls.append(a[1]) or real(*a))
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


# ------------------------------------------------------------- raw bytes, class by class
# Each line below is made of raw bytes (never through json.dumps), so that what Python's
# strict UTF-8 decoder and JSON parser refuse reaches the scanner as it would from a file.

#: byte sequences that are not UTF-8, one of every kind (Unicode's table 3-7 is what
#: Python's strict decoder takes)
NOT_UTF8 = {
    "continuation 80 alone": b"\x80", "continuation BF alone": b"\xbf", "continuations alone": b"\x80\x80\xbf",
    "C3 cut": b"\xc3", "E2 cut": b"\xe2", "E2 82 cut": b"\xe2\x82", "F0 cut": b"\xf0", "F0 9F 98 cut": b"\xf0\x9f\x98",
    "C3 then ASCII": b"\xc3A", "E2 82 then ASCII": b"\xe2\x82A", "F0 9F 98 then ASCII": b"\xf0\x9f\x98A",
    "E2 then a continuation too many": b"\xe2\x82\xac\x80",
    "overlong C0 80 (NUL)": b"\xc0\x80", "overlong C0 A2 (a quote)": b"\xc0\xa2",
    "overlong C1 9C (a backslash)": b"\xc1\x9c", "overlong C1 BF": b"\xc1\xbf", "overlong E0 80 80": b"\xe0\x80\x80",
    "overlong E0 80 A2": b"\xe0\x80\xa2",
    "overlong E0 9F BF": b"\xe0\x9f\xbf", "overlong F0 80 80 80": b"\xf0\x80\x80\x80",
    "overlong F0 8F BF BF": b"\xf0\x8f\xbf\xbf",
    "surrogate ED A0 80": b"\xed\xa0\x80", "surrogate ED AF BF": b"\xed\xaf\xbf", "surrogate ED B0 80": b"\xed\xb0\x80",
    "surrogate ED BF BF": b"\xed\xbf\xbf", "surrogate pair as CESU-8": b"\xed\xa0\xbd\xed\xb8\x80",
    "above U+10FFFF F4 90 80 80": b"\xf4\x90\x80\x80", "above U+10FFFF F4 BF BF BF": b"\xf4\xbf\xbf\xbf",
    "F5 80 80 80": b"\xf5\x80\x80\x80", "F7 BF BF BF": b"\xf7\xbf\xbf\xbf", "F8 (5 bytes)": b"\xf8\x88\x80\x80\x80",
    "FC (6 bytes)": b"\xfc\x84\x80\x80\x80\x80", "FE": b"\xfe", "FF": b"\xff",
}
#: valid UTF-8 at the edge of every range the above lie beside: stored byte for byte
UTF8_EDGES = [b"\x7f", b"\xc2\x80", b"\xc2\xa0", b"\xdf\xbf", b"\xe0\xa0\x80", b"\xe0\xbf\xbf", b"\xe1\x80\x80",
              b"\xe2\x80\xa8", b"\xec\xbf\xbf", b"\xed\x80\x80", b"\xed\x9f\xbf", b"\xee\x80\x80", b"\xef\xbf\xbf",
              b"\xf0\x90\x80\x80", b"\xf0\xbf\xbf\xbf", b"\xf1\x80\x80\x80", b"\xf3\xbf\xbf\xbf", b"\xf4\x80\x80\x80",
              b"\xf4\x8f\xbf\xbf"]
#: control bytes: never allowed raw inside a string; outside one only tab and CR are JSON whitespace
CONTROL = [bytes([c]) for c in (0x00, 0x01, 0x08, 0x09, 0x0B, 0x0C, 0x0D, 0x1B, 0x1F)]
#: \u escapes of half a surrogate pair: alone, or followed by anything but the other half
HALF_PAIRS = [rb"\uD800", rb"\udbff", rb"\uDC00", rb"\uDFFF", rb"\uD800\u0041", rb"\uD800\uD800", rb"\uDC00\uD800",
              rb"\uD800\n", rb"\uD800x", rb"\uD80", rb"\uD800\u", rb"\uDBFF\uE000"]
#: and escapes that are valid (a pair is stored as its 4-byte UTF-8)
ESCAPES = [*HALF_PAIRS, rb"\uD800\uDC00", rb"\uDBFF\uDFFF", rb"\ud83d\ude00", rb"\u0000", rb"\u00e9", rb"\uFFFF"]
#: where the bytes go inside a string of a record line
IN_STRINGS = {
    "key": b'{"key":"a%sb","value":"v"}',
    "key, before its quote": b'{"key":"a%s","value":"v"}',
    "value": b'{"key":"k","value":"%s"}',
    "name in an object value": b'{"key":"k","value":{"n%s":1}}',
    "string in an array value": b'{"key":"k","value":[1,{"n":"%s"}]}',
    "property name": b'{"key":"k","properties":{"p%s":"v"}}',
    "property value": b'{"key":"k","properties":{"a":"b","p":"v%s"}}',
    "field name": b'{"key":"k","value%s":"v"}',
}
#: where they go outside strings (and a string cut by the line's end)
OUTSIDE_STRINGS = {
    "between fields": b'{"key":"k",%s"value":"v"}',
    "between a name and its value": b'{"key":"k","value":%s"v"}',
    "in an array value": b'{"key":"k","value":[1%s,2]}',
    "before the record": b'%s{"key":"k"}',
    "after the record": b'{"key":"k","value":"v"}%s',
    "a string cut by the line's end": b'{"key":"k","value":"v%s',
}
PLACES = {**IN_STRINGS, **OUTSIDE_STRINGS}


def _every_raw_line() -> list[bytes]:
    seqs = [*NOT_UTF8.values(), *UTF8_EDGES, *CONTROL]
    return [place % seq for place in PLACES.values() for seq in seqs] + [
        place % esc for place in IN_STRINGS.values() for esc in ESCAPES]


def _as_python_parses(line: bytes) -> Any:
    """The record the line-by-line path makes of ``line`` (as line 1, with its line end),
    or its error message."""
    try:
        return jsonl_ingest._parse(line + b"\n", "in.jsonl:1", 1 << 20)
    except InvalidInputError as e:
        return str(e)


def test_the_scanner_takes_no_line_the_python_path_refuses_and_stores_what_it_would() -> None:
    """Every raw line at once through the C scanner alone (microseconds): a line it takes
    holds the record the line-by-line path makes of it, and no line that is not UTF-8, or
    holds a raw control byte or half a surrogate pair in a string, is taken; the valid
    sequences at each range's edges are taken, byte for byte."""
    lines = _every_raw_line()
    chunk = jsonl_ingest._scan(b"\n".join(lines) + b"\n")
    assert chunk.lines == len(lines)
    taken = chunk.line.tolist()
    assert sorted(taken + chunk.flagged[:, 0].tolist()) == list(range(1, len(lines) + 1))  # each line one or the other
    cols = jsonl_ingest._merged(chunk, len(taken), [], [])
    for row, n in enumerate(taken):
        record = jsonl_ingest._record(cols, row)
        python = _as_python_parses(lines[n - 1])
        assert (record.key, record.value, record.properties, record.event_time) == python, lines[n - 1]
    took = {lines[n - 1] for n in taken}
    for name, seq in NOT_UTF8.items():
        assert not {place % seq for place in PLACES.values()} & took, name
    for c in CONTROL:
        assert not {place % c for place in IN_STRINGS.values()} & took, c
    for esc in HALF_PAIRS:
        assert not {place % esc for place in IN_STRINGS.values()} & took, esc
    for place in ("key", "value", "property value"):  # the edges, and pairs, taken as they are
        for seq in UTF8_EDGES + [rb"\uD800\uDC00", rb"\uDBFF\uDFFF"]:
            assert IN_STRINGS[place] % seq in took, (place, seq)
    assert _as_python_parses(IN_STRINGS["value"] % rb"\uD800\uDC00") == (b"k", b"\xf0\x90\x80\x80", {}, None)


@pytest.mark.parametrize("place", list(PLACES), ids=str)
def test_raw_bytes_are_stored_or_refused_as_the_line_by_line_path(place: str) -> None:
    """Each raw line through ``shale produce``'s scanner and through the line-by-line path:
    the lines the latter takes, all in one input, stored alike; each line it refuses,
    alone and (every fifth) as the fourth of five, refused alike: the same error naming
    the same line, the same records appended before it."""
    escapes = ESCAPES if place in IN_STRINGS else []
    lines = [PLACES[place] % seq for seq in [*NOT_UTF8.values(), *UTF8_EDGES, *CONTROL, *escapes]]
    taken = [line for line in lines if not isinstance(_as_python_parses(line), str)]
    stored, error = same(b"\n".join(taken) + b"\n", chunk_bytes=100, memory=True)
    assert error is None and len(stored) == len(taken)
    good = b'{"key":"g","value":"\\u00e9"}\n'
    for i, line in enumerate(line for line in lines if line not in taken):
        assert same(line + b"\n", memory=True) == ([], _as_python_parses(line)), line
        if i % 5 == 0:
            stored, error = same(good * 3 + line + b"\n" + good, chunk_bytes=len(good) * 2, memory=True)
            assert error is not None and error.startswith("in.jsonl:4: ") and len(stored) == 3, (line, error)
    for seq in NOT_UTF8.values():
        assert _as_python_parses(PLACES[place] % seq) == "in.jsonl:1: not valid UTF-8"


def test_shale_produce_refuses_invalid_utf8_as_the_python_path_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``shale produce --input`` over files of raw bytes, with the scanner and without it:
    the same exit, the same one-line error naming the line, the same records kept."""
    good = b'{"key":"k%d","value":"\xf4\x8f\xbf\xbf \xed\x9f\xbf","properties":{"p\xc2\x80":"\xe0\xa0\x80"}}\n'
    bad = [IN_STRINGS["key"] % NOT_UTF8["surrogate ED A0 80"], IN_STRINGS["value"] % NOT_UTF8["overlong C0 80 (NUL)"],
           IN_STRINGS["property name"] % NOT_UTF8["overlong C1 BF"],
           IN_STRINGS["property value"] % NOT_UTF8["above U+10FFFF F4 90 80 80"],
           IN_STRINGS["key, before its quote"] % NOT_UTF8["E2 82 cut"], IN_STRINGS["value"] % b"\x00",
           OUTSIDE_STRINGS["a string cut by the line's end"] % NOT_UTF8["F0 9F 98 cut"],
           IN_STRINGS["value"] % rb"\uD800\u0041"]
    for i, line in enumerate(bad):
        source = tmp_path / f"in-{i}.jsonl"
        source.write_bytes(b"".join(good % n for n in range(3)) + line + b"\n" + good % 9)
        got = []
        for scanner in ("native", "python"):
            monkeypatch.setattr(jsonl_ingest, "SCANNER", scanner)
            topic = tmp_path / f"t-{i}-{scanner}"
            p = run_cli_here("produce", str(topic), "--input", str(source))
            got.append((p.returncode, p.stderr.replace(str(topic), "TOPIC"),
                        [(m.key, m.value, dict(m.properties)) for m in TopicReader(str(topic))]))
        assert got[0] == got[1], line
        code, err, stored = got[0]
        assert code == 2 and err.startswith(f"shale: error: {source}:4: ") and err.count("\n") == 1, err
        assert "3 earlier records were appended" in err and len(stored) == 3
        assert stored[0] == (b"k0", "\U0010ffff \ud7ff".encode(), {"p\x80": "\u0800"})


_RAW_PIECES = st.sampled_from([*NOT_UTF8.values(), *UTF8_EDGES, *CONTROL, *ESCAPES, b'"', b"\\", b"a"]) \
    | st.binary(max_size=4)


@st.composite
def _raw_input(draw: st.DrawFn) -> bytes:
    """Lines of record shape with raw bytes (some not UTF-8, some control bytes, some
    escapes) put in a string or between the tokens; most lines are good."""
    lines = []
    for _ in range(draw(st.integers(1, 6))):
        place = draw(st.sampled_from(list(PLACES.values())))
        lines.append(place % b"".join(draw(st.lists(_RAW_PIECES, min_size=1, max_size=3)))
                     if draw(st.integers(0, 2)) == 0 else place % b"x")
    return b"\n".join(lines) + draw(st.sampled_from([b"", b"\n"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_raw_input(), st.sampled_from([1, 40, 1 << 20]))
def test_raw_byte_lines_store_and_refuse_as_the_line_by_line_path(data: bytes, chunk_bytes: int) -> None:
    same(data, chunk_bytes=chunk_bytes, memory=True)
