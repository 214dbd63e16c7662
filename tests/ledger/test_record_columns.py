"""``record_columns`` (``ledger/_kernels.c`` and its plain-Python fallback) decodes records
into columns exactly as msgpack decodes them one by one, refuses what ``check_records``
refuses (naming the first bad record), and never reads outside a record (run under the
sanitizers by ``scripts/sanitize.sh``)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.ledger import kernels
from shale.ledger.record import Record, decode_records, encode_record

pytestmark = pytest.mark.kernels  # (scripts/sanitize.sh runs these under ASan and UBSan)

NATIVE = kernels._native
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1

records = st.builds(
    Record,
    key=st.none() | st.binary(max_size=40),
    value=st.none() | st.binary(max_size=300),
    properties=st.dictionaries(st.text(max_size=20), st.text(max_size=20), max_size=4),
    publish_time=st.integers(0, I64_MAX),
    event_time=st.none() | st.integers(I64_MIN, I64_MAX),
)


def layout(recs: list[Record], gap: bytes) -> tuple[bytes, npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    encoded = [encode_record(r) for r in recs]
    sizes = np.array([len(e) for e in encoded], dtype=np.int64)
    starts = len(gap) + np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) if len(recs) else sizes
    return gap + b"".join(encoded) + gap, starts, sizes


def decoded(buf: bytes, cols: kernels.RecordColumns) -> list[tuple[object, ...]]:
    """The records the columns describe, as decode_records gives them."""
    out = []
    p = 0
    for i in range(len(cols.key_at)):
        def span(at: int, n: int) -> bytes | None:
            return None if n < 0 else buf[at:at + n]
        props = {}
        for _ in range(int(cols.pairs[i])):
            name = buf[int(cols.name_at[p]):int(cols.name_at[p]) + int(cols.name_len[p])].decode()
            props[name] = buf[int(cols.pval_at[p]):int(cols.pval_at[p]) + int(cols.pval_len[p])].decode()
            p += 1
        key = span(int(cols.key_at[i]), int(cols.key_len[i]))
        value = span(int(cols.value_at[i]), int(cols.value_len[i]))
        out.append((key, value, props, int(cols.publish[i]), int(cols.event[i]) if cols.has_event[i] else None))
    assert p == len(cols.name_at)
    return out


def both(buf: bytes, s: npt.NDArray[np.int64], z: npt.NDArray[np.int64]) -> tuple[int, kernels.RecordColumns | None]:
    """The fallback's answer, and the C kernel's, which must be the same."""
    bad, cols = kernels._record_columns_python(buf, s, z)
    if NATIVE is not None:
        nbad, ncols = kernels.record_columns(buf, s, z)
        assert nbad == bad
        assert (ncols is None) == (cols is None)
        if cols is not None and ncols is not None:
            for name, a, b in zip(cols._fields, cols, ncols, strict=True):
                assert np.array_equal(a, b), name
    return bad, cols


@settings(max_examples=300, deadline=None)
@given(st.lists(records, max_size=10), st.binary(max_size=3))
def test_columns_are_what_msgpack_decodes(recs: list[Record], gap: bytes) -> None:
    buf, s, z = layout(recs, gap)
    bad, cols = both(buf, s, z)
    assert bad == -1 and cols is not None
    payload = buf[len(gap):len(buf) - len(gap)]
    want = [(k, v, dict(p), pt, et) for k, v, p, pt, et in decode_records(payload, len(recs), where="t")]
    assert decoded(buf, cols) == want


@settings(max_examples=300, deadline=None)
@given(st.lists(records, min_size=1, max_size=6), st.data())
def test_a_damaged_record_is_named_as_check_records_names_it(recs: list[Record], data: st.DataObject) -> None:
    buf, s, z = layout(recs, b"")
    raw = bytearray(buf)
    at = data.draw(st.integers(0, len(raw) - 1))
    raw[at] = data.draw(st.integers(0, 255))
    bad, cols = both(bytes(raw), s, z)
    # the first record that is not one record (check_records' verdict, flags aside: the
    # flags are the footer's, which record_columns is not given)
    problems = [kernels.record_problem(bytes(raw[a:a + n]), 0) for a, n in zip(s.tolist(), z.tolist(), strict=True)]
    structural = [i for i, p in enumerate(problems) if p and not p.startswith("flags")]
    assert bad == (structural[0] if structural else -1)
    assert (cols is None) == (bad >= 0)


def test_ranges_outside_the_buffer_raise() -> None:
    buf = layout([Record(b"k", b"v")], b"")[0]
    for starts, sizes in (([0], [len(buf) + 1]), ([-1], [2]), ([len(buf)], [1])):
        with pytest.raises(ValueError):
            kernels.record_columns(buf, np.array(starts, dtype=np.int64), np.array(sizes, dtype=np.int64))
        with pytest.raises(ValueError):
            kernels._record_columns_python(buf, np.array(starts, dtype=np.int64), np.array(sizes, dtype=np.int64))
    with pytest.raises(ValueError):
        kernels.record_columns(buf, np.array([0, 1], dtype=np.int64), np.array([1], dtype=np.int64))


def test_no_records_and_integer_edges() -> None:
    bad, cols = both(b"", np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert bad == -1 and cols is not None and len(cols.key_at) == 0 and len(cols.name_at) == 0
    edges = [Record(b"k", b"v", {}, t, e) for t, e in
             ((0, I64_MIN), (127, -32), (128, -33), (255, -128), (256, -129), (65535, -32768), (65536, -32769),
              ((1 << 32) - 1, -(1 << 31)), (1 << 32, -(1 << 31) - 1), (I64_MAX, I64_MAX))]
    buf, s, z = layout(edges, b"\0")
    bad, cols = both(buf, s, z)
    assert cols is not None
    assert cols.publish.tolist() == [r.publish_time for r in edges]
    assert cols.event.tolist() == [r.event_time for r in edges]
