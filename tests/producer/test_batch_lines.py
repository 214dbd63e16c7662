"""``shale read``'s lines written from Arrow batches: ``json_lines`` (``ledger/_kernels.c``)
and :func:`shale.producer.jsonlines.batch_lines` around it give, byte for byte, what
``message_line`` makes of each message, for hostile keys, values and properties (text
that is not UTF-8, control characters, U+2028, surrogates' bytes, names given twice,
values bigger than a block, JSON documents and near-documents) in every value format;
the rows the kernel hands to the Python path are exactly those it cannot decide; without
the kernel the lines are the same.  The kernel never reads outside the buffers it is
given (run under the sanitizers by ``scripts/sanitize.sh``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from shale.ledger import kernels
from shale.producer.jsonlines import batch_lines, json_document, message_line
from shale.reader.arrow import schema
from shale.reader.batches import batch_messages
from tests.needs import c_extension, need_module, needs

pa = need_module("pyarrow")

pytestmark = pytest.mark.kernels  # (scripts/sanitize.sh runs these under ASan and UBSan)
NATIVE = kernels._native
needs_native = needs(c_extension(NATIVE, "ledger/_kernels.c"))
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
#: bytes no strict UTF-8 decoder takes: a surrogate, an overlong form, past U+10FFFF, cut short, a lone continuation
NOT_UTF8 = [b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xc0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80", b"\xff"]
SPECIAL = ["\u2028", "\u2029", "\x7f", '"', "\\", "\x00", "\x1f", "\n", "\r", "\t", "\b", "\f", "\U0001f600", "é"]

texts = st.text(st.characters(min_codepoint=0, exclude_categories=("Cs",)) | st.sampled_from(SPECIAL), max_size=30)
raw = st.one_of(texts.map(lambda t: t.encode("utf-8")), st.binary(max_size=40),
                st.tuples(texts, st.sampled_from(NOT_UTF8), texts).map(lambda p: (p[0] + "|").encode() + p[1]
                                                                        + p[2].encode()))


def json_values() -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers(-(10 ** 30), 10 ** 30) | texts | st.floats(
        allow_nan=False, allow_infinity=False)
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner,
                                                                                             max_size=4),
                        max_leaves=12)


def dumped(value: Any, indent: int | None, ascii_only: bool) -> bytes:
    return json.dumps(value, indent=indent, ensure_ascii=ascii_only).encode("utf-8")


NEAR_JSON = [b"NaN", b"Infinity", b"1e400", b"-1e400", b"1e-400", b"[1,]", b'{"a":1,}', b'"\\ud800"',
             b'"\\ud800\\udc00"', b'"\\udc00"', b"01", b"1.", b".5", b"-", b"+1", b"tru", b"nul", b" ", b"\t[\n]\r ",
             b"1 2", b"\xef\xbb\xbf{}", b'"a\x01"', b"[" * 600 + b"]" * 600, b"[" * 499 + b"]" * 499,
             b"[" * 501 + b"]" * 501, b"1" * 19, b"1" * 18, b"1" * 5000, b"1.5e308", b"2e308", b"0.1e-300",
             b'{"a":[1,{"b":null}],"c":"\\u00e9\\n"}', b"\x0b1", b"[1]\x00", b'"\\x"', b'"\\/"', b"-0", b"0e5"]

documents = st.one_of(st.builds(dumped, json_values(), st.sampled_from([None, 0, 2]), st.booleans()),
                      st.sampled_from(NEAR_JSON),
                      st.tuples(st.builds(dumped, json_values(), st.just(None), st.booleans()),
                                st.integers(0, 40), st.sampled_from([b"", b",", b"]", b"}", b'"', b"\n", b"x"]))
                      .map(lambda t: t[0][:t[1]] + t[2] + t[0][t[1] + 1:]))
properties = st.lists(st.tuples(texts, texts), max_size=5) | st.lists(
    st.tuples(st.sampled_from(["a", "b", "ä"]), texts), min_size=2, max_size=6)  # names given twice


@st.composite
def rows(draw: st.DrawFn) -> dict[str, Any]:
    value = draw(st.none() | st.just(b"") | raw | documents | st.binary(min_size=2000, max_size=3000))
    return {"id": (draw(st.integers(0, (1 << 64) - 1)), draw(st.integers(0, (1 << 64) - 1)),
                   draw(st.integers(0, (1 << 32) - 1))),
            "key": draw(st.none() | st.just(b"") | raw), "value": value, "properties": draw(properties),
            "publish": draw(st.integers(I64_MIN, I64_MAX)), "event": draw(st.none() | st.integers(I64_MIN, I64_MAX))}


def record_batch(items: list[dict[str, Any]]) -> Any:
    """The rows as a record batch of :mod:`shale.reader.arrow`'s columns."""
    ts = pa.timestamp("ms", tz="UTC")
    return pa.RecordBatch.from_arrays([
        pa.array([r["id"][0] for r in items], pa.uint64()), pa.array([r["id"][1] for r in items], pa.uint64()),
        pa.array([r["id"][2] for r in items], pa.uint32()),
        pa.array([r["key"] for r in items], pa.large_binary()),
        pa.array([r["value"] for r in items], pa.large_binary()),
        pa.array([r["properties"] for r in items], pa.map_(pa.string(), pa.string())),
        pa.array([r["publish"] for r in items], pa.int64()).view(ts),
        pa.array([r["event"] for r in items], pa.int64()).view(ts),
        pa.array([r["key"] is not None and not r["value"] for r in items], pa.bool_())], schema=schema())


def want_lines(batch: Any, value_format: str) -> bytes:
    return "".join(message_line(m, value_format) + "\n" for m in batch_messages(batch)).encode("utf-8")


def got_lines(batch: Any, value_format: str, block_bytes: int = 1 << 20) -> bytes:
    out, rows_given = [], 0
    for block, n in batch_lines(batch, value_format, block_bytes=block_bytes):
        out.append(bytes(block))
        rows_given += n
    assert rows_given == batch.num_rows
    return b"".join(out)


def undecidable(row: dict[str, Any], value_format: str) -> bool:
    """Whether the kernel hands the row to the Python path (the module's docstring)."""
    names = [n for n, _ in row["properties"]]
    if len(names) != len(set(names)) or len(names) > 64:
        return True
    value = row["value"]
    if value_format != "json" or not value:
        return False
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return bool(NATIVE.json_document(value) == 2)


@needs_native
@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(rows(), min_size=1, max_size=12), st.sampled_from(["text", "json"]),
       st.sampled_from([64, 700, 1 << 20]))
def test_the_kernels_lines_are_message_lines(monkeypatch: pytest.MonkeyPatch, items: list[dict[str, Any]],
                                             value_format: str, block_bytes: int) -> None:
    import shale.producer.jsonlines as jsonlines

    batch = record_batch(items)
    handed: list[int] = []
    python_blocks = jsonlines._python_blocks

    def spy(b: Any, start: int, stop: int, fmt: str, size: int) -> Any:
        handed.extend(range(start, stop))
        return python_blocks(b, start, stop, fmt, size)

    with monkeypatch.context() as m:
        m.setattr(jsonlines, "_python_blocks", spy)
        got = got_lines(batch, value_format, block_bytes)
    assert got == want_lines(batch, value_format)
    assert handed == [i for i, r in enumerate(items) if undecidable(r, value_format)]
    with monkeypatch.context() as m:
        m.setattr(kernels, "_native", None)  # the fallback: the same bytes
        assert got_lines(batch, value_format, block_bytes) == got


@needs_native
@settings(max_examples=400, deadline=None)
@given(documents | raw)
def test_the_kernel_judges_documents_as_msgspec_does(text: bytes) -> None:
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        assume(False)
    verdict = NATIVE.json_document(text)
    doc = json_document(text)
    assert verdict in (0, 1, 2)
    if verdict == 0:
        assert doc is not None
    elif verdict == 1:
        assert doc is None


@needs_native
def test_the_kernel_decides_what_is_plain() -> None:
    """Documents and junk of every kind are decided in C (the Python path is for the edges)."""
    for doc in (b"{}", b" [1, -2.5e3, true, false, null, \"x\\u00e9\"]\n", b'{"a": {"b": [[], {}]}}', b"0", b"-0.0",
                b'"\\/\\b\\f\\n\\r\\t\\"\\\\"', b"123456789012345678", b"[" * 500 + b"]" * 500):
        assert NATIVE.json_document(doc) == 0, doc
        assert json_document(doc) is not None
    for junk in (b"hello", b"NaN", b"[1,]", b"{,}", b"01", b"1.", b"", b" ", b'"\x01"', b"\xef\xbb\xbf1", b"[1] x"):
        assert NATIVE.json_document(junk) == 1, junk
        assert json_document(junk) is None
    for edge in (b"1e400", b'"\\ud800"', b"1" * 19, b"[" * 501 + b"]" * 501):
        assert NATIVE.json_document(edge) == 2, edge


def test_lines_of_plain_rows_a_long_value_and_a_sliced_batch() -> None:
    items = [{"id": (1, 2, 3), "key": b"k\xff", "value": b"v" * 5000, "properties": [("a", "b\u2028")],
              "publish": 5, "event": None},
             {"id": (4, 5, 6), "key": None, "value": None, "properties": [], "publish": -1, "event": -7},
             {"id": (7, 8, 9), "key": b"", "value": b"", "properties": [], "publish": 0, "event": 0}]
    batch = record_batch(items)
    assert got_lines(batch, "text", 256) == want_lines(batch, "text")
    assert want_lines(batch, "text").splitlines()[1] == (b'{"id":"4:5:6","key":null,"value":null,"properties":{},'
                                                         b'"publish_time":-1,"event_time":-7}')
    tail = batch.slice(1, 2)  # (not at its start: the Python path prints it)
    assert got_lines(tail, "json") == want_lines(tail, "json")


@needs_native
def test_the_kernel_refuses_buffers_that_do_not_fit() -> None:
    from shale.producer.jsonlines import _kernel_columns

    batch = record_batch([{"id": (1, 1, 1), "key": b"abc", "value": b"xyz", "properties": [("n", "t")],
                           "publish": 1, "event": None}])
    columns = _kernel_columns(batch)
    assert columns is not None
    out = bytearray(4096)
    written, row, status, _ = NATIVE.json_lines(columns, 0, 1, False, out)
    assert (row, status) == (1, 0) and bytes(out[:written]) == want_lines(batch, "text")
    bad_offsets = pa.py_buffer((0).to_bytes(8, "little") + (99).to_bytes(8, "little"))
    for i, bad in ((4, bad_offsets), (7, bad_offsets), (10, pa.py_buffer(b"\0\0\0\0\x63\0\0\0")),
                   (0, pa.py_buffer(b"")), (9, pa.py_buffer(b"\0\0\0\0"))):
        cols = list(columns)
        cols[i] = bad
        with pytest.raises(ValueError):
            NATIVE.json_lines(tuple(cols), 0, 1, False, out)
    with pytest.raises(ValueError):
        NATIVE.json_lines(columns, 0, 2, False, out)
    written, row, status, need = NATIVE.json_lines(columns, 0, 1, False, bytearray(10))
    assert (written, row, status) == (0, 0, 2) and need > 10
