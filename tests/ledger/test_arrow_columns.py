"""``arrow_columns`` (``ledger/_kernels.c`` and its NumPy fallback) writes the same Arrow
buffers byte for byte, holding what msgpack decodes record by record; both name the same
first bad record (malformed, or flags that do not say what it holds); and the C kernel
never reads outside the records (run under the sanitizers by ``scripts/sanitize.sh``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.ledger import kernels
from shale.ledger.arrow_columns import ArrowColumns, _arrow_columns_python, arrow_columns
from shale.ledger.format import FLAG_HAS_KEY, FLAG_TOMBSTONE
from shale.ledger.record import Record, decode_records, encode_record
from tests.ledger.test_record_columns import records

pytestmark = pytest.mark.kernels  # (scripts/sanitize.sh runs these under ASan and UBSan)

NATIVE = kernels._native


class Layout:
    """Entries laid out as frames (a header's room, then the payload) after a gap, with
    the footer columns of their records and a choice of them."""

    def __init__(self, entries: list[list[Record]], gap: bytes, keep: list[list[bool]], payload_only: bool) -> None:
        self.recs = [r for e in entries for r in e]
        out = bytearray(gap)
        frames, offsets, sizes = [], [], []
        self.parts: list[bytes] = []  # each entry alone: its frame (or payload only)
        for e in entries:
            frames.append(len(out) - (12 if payload_only else 0))
            if not payload_only:
                out += b"\xee" * 12
            at = 0
            own = len(out)
            for r in e:
                data = encode_record(r)
                offsets.append(at)
                sizes.append(len(data))
                out += data
                at += len(data)
            self.parts.append(bytes(out[own - (0 if payload_only else 12):]))
        self.part_frames = np.full(len(entries), -12 if payload_only else 0, dtype=np.int64)
        self.buf = bytes(out)
        self.frames = np.array(frames, dtype=np.int64)
        self.offsets = np.array(offsets, dtype=np.uint32)
        self.sizes = np.array(sizes, dtype=np.uint32)
        self.flags = np.array([(FLAG_HAS_KEY if r.key is not None else 0) | (FLAG_TOMBSTONE if not r.value else 0)
                               for r in self.recs], dtype=np.uint8)
        chosen, kept, first = [], [], 0
        for e, k in zip(entries, keep, strict=True):
            picked = [first + i for i, take in enumerate(k[:len(e)]) if take]
            chosen += picked
            kept.append(len(picked))
            first += len(e)
        self.rec = np.array(chosen, dtype=np.int64)
        self.kept = np.array(kept, dtype=np.int64)

    def run(self, native: bool, flags: npt.NDArray[np.uint8] | None = None, buf: bytes | None = None,
            split: bool = False) -> tuple[int, ArrowColumns | None]:
        data: Any = self.buf if buf is None else buf
        frames = self.frames
        if split:  # each entry in a buffer of its own
            data, frames = tuple(self.parts), self.part_frames
        args = (data, frames, self.kept, self.rec, self.offsets, self.sizes, self.flags if flags is None else flags,
                bytearray)
        if native:
            return arrow_columns(*args)
        return _arrow_columns_python(*args)


def both(lay: Layout, **kw: Any) -> tuple[int, ArrowColumns | None]:
    """The fallback's answer, and the C kernel's, which must be the same byte for byte."""
    bad, cols = lay.run(False, **kw)
    if NATIVE is not None:
        nbad, ncols = lay.run(True, **kw)
        assert nbad == bad
        assert (ncols is None) == (cols is None)
        if cols is not None and ncols is not None:
            for name, a, b in zip(cols._fields, cols, ncols, strict=True):
                assert (a is None) == (b is None), name
                assert a is None or bytes(a) == bytes(b), name
    return bad, cols


def rows(cols: ArrowColumns, n: int) -> list[tuple[object, ...]]:
    """The records the buffers hold, as decode_records gives them."""
    def i64(b: Any) -> npt.NDArray[np.int64]:
        return np.frombuffer(bytes(b), dtype=np.int64)

    def i32(b: Any) -> npt.NDArray[np.int32]:
        return np.frombuffer(bytes(b), dtype=np.int32)

    def valid(bits: Any, i: int) -> bool:
        return bits is None or bool(bytes(bits)[i // 8] >> (i % 8) & 1)

    def span(offs: npt.NDArray[Any], data: Any, i: int) -> bytes:
        return bytes(data)[int(offs[i]):int(offs[i + 1])]

    ko, vo, po = i64(cols.key_offsets), i64(cols.value_offsets), i32(cols.prop_offsets)
    no, to = i32(cols.name_offsets), i32(cols.text_offsets)
    publish, event = i64(cols.publish), i64(cols.event)
    tomb = bytes(cols.tombstone)
    out = []
    for i in range(n):
        key = span(ko, cols.key_data, i) if valid(cols.key_valid, i) else None
        value = span(vo, cols.value_data, i) if valid(cols.value_valid, i) else None
        props = {span(no, cols.name_data, p).decode(): span(to, cols.text_data, p).decode()
                 for p in range(int(po[i]), int(po[i + 1]))}
        ev = int(event[i]) if valid(cols.event_valid, i) else None
        assert bool(tomb[i // 8] >> (i % 8) & 1) == (key is not None and not value)
        out.append((key, value, props, int(publish[i]), ev))
    assert (cols.key_nulls, cols.value_nulls, cols.event_nulls) == (
        sum(r[0] is None for r in out), sum(r[1] is None for r in out), sum(r[4] is None for r in out))
    return out


entries = st.lists(st.lists(records, min_size=1, max_size=6), max_size=5)
keeps = st.lists(st.lists(st.booleans(), min_size=6, max_size=6), min_size=5, max_size=5)


@settings(max_examples=300, deadline=None)
@given(entries, st.binary(max_size=3), keeps, st.booleans(), st.booleans())
def test_buffers_hold_what_msgpack_decodes(ents: list[list[Record]], gap: bytes, keep: list[list[bool]],
                                           payload_only: bool, split: bool) -> None:
    lay = Layout(ents, gap, keep[:len(ents)], payload_only and (split or len(ents) == 1))
    bad, cols = both(lay, split=split)
    assert bad == -1 and cols is not None
    if split:  # the same buffers as from the entries side by side in one
        whole = both(Layout(ents, gap, keep[:len(ents)], False))[1]
        assert whole is not None
        assert all(a is None if b is None else bytes(a) == bytes(b) for a, b in zip(cols, whole, strict=True))
    payload = b"".join(encode_record(r) for r in lay.recs)
    every = [(k, v, dict(p), pt, et) for k, v, p, pt, et in decode_records(payload, len(lay.recs), where="t")]
    assert rows(cols, len(lay.rec)) == [every[i] for i in lay.rec.tolist()]


@settings(max_examples=300, deadline=None)
@given(entries.filter(lambda e: sum(map(len, e)) > 0), st.data())
def test_the_first_bad_record_is_named_alike(ents: list[list[Record]], data: st.DataObject) -> None:
    lay = Layout(ents, b"", [[True] * 6] * len(ents), False)
    n = len(lay.rec)
    flags, buf = lay.flags.copy(), bytearray(lay.buf)
    for _ in range(data.draw(st.integers(1, 3))):
        if data.draw(st.booleans()):  # a footer flag that says otherwise
            flags[data.draw(st.integers(0, n - 1))] ^= data.draw(st.sampled_from([FLAG_HAS_KEY, FLAG_TOMBSTONE]))
        else:  # a damaged byte
            buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
    bad, cols = both(lay, flags=flags, buf=bytes(buf))
    want = -1
    for i, r in enumerate(lay.rec.tolist()):
        start = int(lay.frames[np.searchsorted(np.cumsum(lay.kept), i, side="right")]) + 12 + int(lay.offsets[r])
        problem = kernels.record_problem(bytes(buf[start:start + int(lay.sizes[r])]), int(flags[r]))
        if problem:
            want = i
            break
    assert bad == want
    assert (cols is None) == (bad >= 0)


def test_a_record_past_its_own_entrys_buffer_raises() -> None:
    lay = Layout([[Record(b"k", b"v")], [Record(b"j", b"w")]], b"", [[True] * 6] * 2, False)
    sizes = lay.sizes.copy()
    sizes[0] += 3  # (inside the buffer of both entries side by side, not inside its own)
    for native in (True, False):
        with pytest.raises(ValueError):
            lay.sizes, keep = sizes, lay.sizes
            try:
                lay.run(native, split=True)
            finally:
                lay.sizes = keep
    parts = (lay.parts[0],)  # one buffer for two entries
    for fn in (arrow_columns, _arrow_columns_python):
        with pytest.raises(ValueError):
            fn(parts, lay.part_frames, lay.kept, lay.rec, lay.offsets, lay.sizes, lay.flags, bytearray)


def test_indexes_and_ranges_that_do_not_fit_raise() -> None:
    lay = Layout([[Record(b"k", b"v"), Record(None, None)]], b"", [[True] * 6], False)
    good = (lay.frames, lay.kept, lay.rec, lay.offsets, lay.sizes, lay.flags)
    for i, wrong in ((0, np.array([-13])), (0, np.array([len(lay.buf)])), (1, np.array([3])), (2, np.array([0, 2])),
                     (3, np.array([1, 99], dtype=np.uint32)), (4, np.array([2, 99], dtype=np.uint32))):
        args = list(good)
        args[i] = wrong
        for fn in (arrow_columns, _arrow_columns_python):
            with pytest.raises(ValueError):
                fn(lay.buf, *args, bytearray)  # type: ignore[operator]
