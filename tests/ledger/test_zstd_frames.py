"""Small zstd entries decompressed together (:mod:`shale.ledger.zstd_frames`): the batch
takes exactly what the one-by-one path would accept, with the same bytes, and leaves
everything else to it."""

from __future__ import annotations

import io
import struct
from typing import Any

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.ledger import reader as reader_module
from shale.ledger.codecs import (
    DEFAULT_COMPRESSION,
    Codec,
    Compression,
    Dictionary,
    DictionarySource,
    compress,
    decompress,
    dictionary_source,
)
from shale.ledger.errors import CorruptLedgerError
from shale.ledger.format import KIND_ORIGINAL
from shale.ledger.kernels import Scratch
from shale.ledger.reader import LedgerFile
from shale.ledger.record import Record
from shale.ledger.writer import LedgerWriter, encode_entry
from shale.ledger.zstd_frames import decompress_zstd_each, decompress_zstd_into, plain_zstd_frames
from shale.storage import resolve


def _zstd(raw: bytes, **kw: Any) -> bytes:
    kw.setdefault("write_content_size", True)
    kw.setdefault("write_checksum", True)
    return zstandard.ZstdCompressor(level=1, **kw).compress(raw)


def _with_window(raw: bytes) -> bytes:
    """A frame of ``raw`` with a window descriptor and an eight-byte content size (not
    single-segment), as another zstd writer may make."""
    frame = _zstd(raw, write_content_size=False)
    fhd = frame[4]
    assert fhd & 0xE3 == 0
    return frame[:4] + bytes([fhd | 0xC0]) + frame[5:6] + struct.pack("<Q", len(raw)) + frame[6:]


def _rle(raw: bytes) -> bytes:
    """A frame of one RLE block (``raw`` of up to 255 bytes, all its first byte), as zstd
    may write a run of one byte: single-segment, a one-byte content size, no checksum."""
    n = min(len(raw), 255)
    return (struct.pack("<I", 0xFD2FB528) + bytes([0x20, n]) + (1 | 1 << 1 | n << 3).to_bytes(3, "little")
            + raw[:1])


def _naming_dictionary(frame: bytes) -> bytes:
    """``frame`` with a one-byte dictionary id (7) in its header."""
    return frame[:4] + bytes([frame[4] | 1]) + frame[5:6] + b"\x07" + frame[6:] if frame[4] & 0x20 == 0 else \
        frame[:4] + bytes([frame[4] | 1]) + b"\x07" + frame[5:]


#: name -> the stored bytes made of a payload and its healthy frame
VARIANTS: dict[str, Any] = {
    "healthy": lambda raw, fr: fr,
    "without content checksum": lambda raw, fr: _zstd(raw, write_checksum=False),
    "window descriptor, eight-byte size": lambda raw, fr: _with_window(raw),
    "one RLE block": lambda raw, fr: _rle(raw),
    "no content size": lambda raw, fr: _zstd(raw, write_content_size=False),
    "declares one byte more": lambda raw, fr: _zstd(raw + b"x"),
    "bytes after the frame": lambda raw, fr: fr + b"\0" * 3,
    "a second frame after it": lambda raw, fr: fr + _zstd(b"more"),
    "a skippable frame after it": lambda raw, fr: fr + struct.pack("<II", 0x184D2A50, 4) + b"abcd",
    "truncated": lambda raw, fr: fr[:-1],
    "checksum changed": lambda raw, fr: fr[:-1] + bytes([fr[-1] ^ 1]),
    "a body byte changed": lambda raw, fr: fr[:len(fr) // 2] + bytes([fr[len(fr) // 2] ^ 0x5A]) + fr[len(fr) // 2 + 1:],
    "names a dictionary": lambda raw, fr: _naming_dictionary(fr),
    "not a frame": lambda raw, fr: raw,
    "empty": lambda raw, fr: b"",
}
#: the variants that are healthy frames
TAKEN = ("healthy", "without content checksum", "window descriptor, eight-byte size", "one RLE block")


def _reference(stored: bytes, n: int) -> bytes | None:
    try:
        return bytes(decompress(stored, Codec.ZSTD, n, "test"))
    except CorruptLedgerError:
        return None


def _batch(stored: list[bytes], sizes: list[int], dictionaries: DictionarySource | None = None
           ) -> tuple[np.ndarray, bytes, np.ndarray]:
    """The frames back to back (with a gap between, as frame headers make), batch-decompressed."""
    buf = bytearray()
    starts, ends = [], []
    for s in stored:
        buf += b"\xee" * 12
        starts.append(len(buf))
        buf += s
        ends.append(len(buf))
    raw = np.array(sizes, dtype=np.int64)
    at = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(raw + 5, out=at[1:])
    out = Scratch().take(int(at[-1]))
    done = decompress_zstd_into(bytes(buf), np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64), raw,
                                out, at[:-1], dictionaries=dictionaries)
    return done, bytes(out), at


payloads = st.one_of(
    st.binary(min_size=1, max_size=600),  # mostly incompressible: raw blocks
    st.builds(lambda b, k: b * k, st.binary(min_size=1, max_size=8), st.integers(1, 9000)),  # RLE and repeats
    st.builds(lambda n, k: b"".join(b"key-%06d value-%06d;" % (i, i * 7) for i in range(k, k + n)),
              st.integers(1, 3000), st.integers(0, 1000)),  # record-like, 1- to 4-byte content sizes
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(payloads, st.sampled_from(sorted(VARIANTS))), min_size=1, max_size=12))
def test_the_batch_takes_only_what_one_by_one_accepts_with_the_same_bytes(frames: list[tuple[bytes, str]]) -> None:
    frames = [(raw[:1] * min(len(raw), 255) if kind == "one RLE block" else raw, kind) for raw, kind in frames]
    stored = [VARIANTS[kind](raw, _zstd(raw)) for raw, kind in frames]
    sizes = [len(raw) for raw, _ in frames]
    done, out, at = _batch(stored, sizes)
    for i, ((raw, kind), s, n) in enumerate(zip(frames, stored, sizes, strict=True)):
        ref = _reference(s, n)
        if done[i]:
            assert ref is not None, kind  # never accepts what one by one refuses ...
            assert out[at[i]:at[i] + n] == ref == raw  # ... and gives the same bytes
        if kind in TAKEN:
            assert done[i], kind  # the frames writers make are all taken


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(payloads, st.sampled_from(sorted(VARIANTS))), min_size=1, max_size=12))
def test_each_payload_decompressed_in_one_call_is_what_one_by_one_gives(frames: list[tuple[bytes, str]]) -> None:
    """decompress_zstd_each (the Arrow readers' batch): never takes what one by one refuses,
    gives the same bytes, and takes every healthy frame unless the library refused
    another of the call (then none: one by one names it)."""
    frames = [(raw[:1] * min(len(raw), 255) if kind == "one RLE block" else raw, kind) for raw, kind in frames]
    stored = [VARIANTS[kind](raw, _zstd(raw)) for raw, kind in frames]
    buf, starts, ends = bytearray(), [], []
    for s in stored:
        buf += b"\xee" * 12
        starts.append(len(buf))
        buf += s
        ends.append(len(buf))
    sizes = np.array([len(raw) for raw, _ in frames], dtype=np.int64)
    done, out = decompress_zstd_each(bytes(buf), np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64),
                                     sizes)
    refs = [_reference(s, int(n)) for s, n in zip(stored, sizes, strict=True)]
    for i, (raw, kind) in enumerate(frames):
        if done[i]:
            assert refs[i] is not None and bytes(out[i]) == refs[i] == raw, kind
    header_ok, _ = plain_zstd_frames(np.frombuffer(bytes(buf), dtype=np.uint8), np.array(starts, dtype=np.int64),
                                     np.array(ends, dtype=np.int64), sizes)
    if all(refs[i] is not None for i in np.flatnonzero(header_ok).tolist()):
        assert done.tolist() == [kind in TAKEN or bool(header_ok[i]) for i, (_, kind) in enumerate(frames)]
        assert all(kind not in TAKEN or done[i] for i, (_, kind) in enumerate(frames))
    else:
        assert not done.any()


def test_payloads_of_small_entries_come_from_one_call_and_a_bad_one_is_named(monkeypatch: pytest.MonkeyPatch
                                                                             ) -> None:
    f = _ledger(60, 16)
    base, data = f.read_frames(0, f.n_entries)
    sel = np.arange(2, 57, dtype=np.int64)
    calls: list[int] = []

    def counted(*a: Any, **kw: Any) -> Any:
        calls.append(1)
        return decompress(*a, **kw)

    monkeypatch.setattr(reader_module, "decompress", counted)
    got = f.payloads(data, base, sel)
    assert calls == []
    assert [bytes(p) for p in got] == [bytes(f.entry_payload(data, base, e)) for e in sel.tolist()]
    buf = bytearray(data)
    o = int(f.footer.col("e_offset")[17]) - base
    buf[o + int(f.footer.col("e_length")[17]) - 1] ^= 1  # the content checksum's last byte
    with pytest.raises(CorruptLedgerError, match=r"entry 1:17: compressed entry does not decompress with zstd"):
        f.payloads(bytes(buf), base, sel)
    assert calls  # (named by the one-by-one path)


def test_what_the_batch_leaves_is_what_one_by_one_refuses_or_a_frame_of_several_blocks() -> None:
    raw = b"".join(b"record %08d|" % i for i in range(20_000))  # 300 KB: more than one block
    big = _zstd(raw)
    small = _zstd(raw[:5000])
    ok, named = plain_zstd_frames(np.frombuffer(big + small, dtype=np.uint8), np.array([0, len(big)]),
                                  np.array([len(big), len(big) + len(small)]), np.array([len(raw), 5000]))
    assert ok.tolist() == [False, True] and named.tolist() == [0, 0]
    for kind, make in VARIANTS.items():
        payload = raw[:1] * 255 if kind == "one RLE block" else raw[:5000]
        s = make(payload, small)
        done, _, _ = _batch([small, s, small], [5000, len(payload), 5000])
        assert done[0] and done[2], kind
        assert bool(done[1]) == (kind in TAKEN), kind


def _ledger(entries: int, per_entry: int, dictionary: Dictionary | None = None) -> LedgerFile:
    buf = io.BytesIO()
    compression = DEFAULT_COMPRESSION if dictionary is None else Compression(Codec.ZSTD_DICT, 1, dictionary)
    w = LedgerWriter(buf, kind=KIND_ORIGINAL, ledger_id=1, created_ms=0, compression=compression)
    for e in range(entries):
        w.add_entry(encode_entry([Record(b"k%d" % (e * per_entry + i), b"value %08d" % (e * per_entry + i) * 4)
                                  for i in range(per_entry)]))
    w.finish()
    store = resolve("memory://zstd-frames/x").store
    store.put("l", buf.getvalue())
    return LedgerFile.open(store, "l", dictionaries=None if dictionary is None else dictionary_source((dictionary,)))


@pytest.mark.parametrize("codec", [Codec.ZSTD, Codec.ZSTD_DICT])
def test_small_entries_are_decompressed_together_not_one_call_each(monkeypatch: pytest.MonkeyPatch,
                                                                   codec: Codec) -> None:
    """A batch of entries of 16 records each is decompressed without a call of the
    one-by-one path per entry, and lays out exactly what one by one gives."""
    f = _ledger(200, 16, _dictionary() if codec == Codec.ZSTD_DICT else None)
    assert set(f.footer.codecs().tolist()) == {codec}
    base, data = f.read_frames(0, f.n_entries)
    sel = np.arange(3, 190, 2, dtype=np.int64)
    calls: list[int] = []

    def counted(*a: Any, **kw: Any) -> Any:
        calls.append(1)
        return decompress(*a, **kw)

    monkeypatch.setattr(reader_module, "decompress", counted)
    raw, frames = f.raw_frames(data, base, sel, Scratch())
    assert calls == []
    for e, at in zip(sel.tolist(), frames.tolist(), strict=True):
        n = int(f.footer.raw_lengths()[e])
        assert bytes(raw[at + 12:at + 12 + n]) == bytes(f.entry_payload(data, base, e))
    f.check_entries(data, base, sel)  # and every record of them checks


def test_a_bad_entry_among_small_ones_is_named_as_one_by_one_names_it() -> None:
    f = _ledger(40, 16)
    base, data = f.read_frames(0, f.n_entries)
    buf = bytearray(data)
    e = 17
    o = int(f.footer.col("e_offset")[e]) - base
    n = int(f.footer.col("e_length")[e])
    buf[o + n - 1] ^= 1  # the content checksum's last byte (the frame's CRC32C is not checked here)
    with pytest.raises(CorruptLedgerError, match=r"entry 1:17: compressed entry does not decompress with zstd"):
        f.raw_frames(bytes(buf), base, np.arange(f.n_entries, dtype=np.int64))


def _dictionary() -> Dictionary:
    samples = [b"".join(b'{"id": %d, "name": "user-%d", "status": "active"};' % (i * k, k) for k in range(12))
               for i in range(400)]
    trained = zstandard.train_dictionary(4096, samples)
    return Dictionary.load(trained.as_bytes(), "test dictionary")


def test_zstd_dict_entries_are_decompressed_together_with_the_dictionary_each_names() -> None:
    d = _dictionary()
    raws = [b"".join(b'{"id": %d, "name": "user-%d", "status": "invited"};' % (i, k) for k in range(1 + i % 9))
            for i in range(30)]
    with_dict = Compression(Codec.ZSTD_DICT, 1, d)
    stored = []
    for r in raws:
        codec, s = compress(r, with_dict)
        assert codec == Codec.ZSTD_DICT
        stored.append(bytes(s))
    sizes = [len(r) for r in raws]
    source = dictionary_source((d,))
    done, out, at = _batch(stored, sizes, source)
    assert done.all()
    for i, r in enumerate(raws):
        assert out[at[i]:at[i] + len(r)] == r == bytes(decompress(stored[i], Codec.ZSTD_DICT, len(r), "t",
                                                                  dictionaries=source))
    # a dictionary the topic does not have, a frame that names none, or no dictionaries at
    # all: left to one by one (which says what is wrong)
    done, _, _ = _batch(stored, sizes, dictionary_source(()))
    assert not done.any()
    plain = [_zstd(r) for r in raws]
    done, _, _ = _batch([stored[0], plain[1], stored[2]], sizes[:3], source)
    assert done.tolist() == [True, False, True]
    done, _, _ = _batch(stored[:3], sizes[:3])
    assert not done.any()
    for s, n in ((plain[1], sizes[1]), (stored[0], sizes[0])):
        with pytest.raises(CorruptLedgerError):
            decompress(s, Codec.ZSTD_DICT if s is plain[1] else Codec.ZSTD, n, "t", dictionaries=source)
