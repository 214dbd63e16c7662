"""Many small zstd entries decompressed at once, with every check one by one makes.

Decompressing an entry one call at a time (:func:`~shale.ledger.codecs.decompress`) reads
its frame's header, checks it against the footer, finds a decompressor and decompresses:
for an entry of a few KiB the checks and calls around the library cost more than zstd
itself.  Here the headers of a batch of frames are read at once with NumPy and checked
against the footer (the frame declares the footer's size, names a dictionary exactly
when stored as ``zstd-dict``, and is one block that ends exactly where the stored bytes
end), then each frame that passes is handed straight to the decompressor (of its
dictionary), which checks its content checksum and its size.  Anything else — a frame
of several blocks, one whose header disagrees, a dictionary the topic cannot give, a
frame the library refuses — is left to the one-by-one path, which
decompresses it or raises the error naming what is wrong: this path never decides that
an entry is bad, only that it is good.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from shale.ledger.codecs import Buffer, DictionarySource, zstd_decompressor
from shale.ledger.errors import ShaleError

__all__ = ["decompress_zstd_each", "decompress_zstd_into", "plain_zstd_frames"]

_MAGIC: Final = 0xFD2FB528
#: Size of the frame-content-size field by its flag (flag 0: one byte when the frame is a
#: single segment, else none — then the frame declares no size and is left alone).
_FCS_BYTES: Final = np.array([0, 2, 4, 8], dtype=np.int64)
#: Size of the dictionary id's field by its flag.
_DID_BYTES: Final = np.array([0, 1, 2, 4], dtype=np.int64)
_BLOCK_RLE: Final = 1
_BLOCK_RESERVED: Final = 3


def _le(data: npt.NDArray[np.uint8], at: npt.NDArray[np.int64], width: int) -> npt.NDArray[np.uint64]:
    """Little-endian unsigned integers of ``width`` bytes at ``at`` (indexes clipped to
    ``data``: a field read past the frame only ever fails the size check that follows)."""
    top = len(data) - 1
    out = np.zeros(len(at), dtype=np.uint64)
    for k in range(width):
        out |= data[np.minimum(at + k, top)].astype(np.uint64) << np.uint64(8 * k)
    return out


def plain_zstd_frames(data: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64],
                      raw_lengths: npt.NDArray[np.int64], *, with_dictionary: bool = False
                      ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.uint64]]:
    """Which of the stored payloads ``data[starts[i]:ends[i]]`` are, by their headers, a
    zstd frame that declares ``raw_lengths[i]`` bytes of content and is one block (the
    last) ending exactly at ``ends[i]``, its content checksum included when it has one;
    and that names a dictionary exactly when ``with_dictionary`` (``zstd-dict``).  Also
    the dictionary each names (0: none).  A frame that fails is not thereby bad: it is
    one to decompress one by one."""
    n = len(starts)
    if not n or not len(data):
        return np.zeros(n, dtype=bool), np.zeros(n, dtype=np.uint64)
    size = ends - starts
    magic = _le(data, starts, 4)
    fhd = _le(data, starts + 4, 1).astype(np.int64)
    single = (fhd >> 5) & 1
    fcs_flag = fhd >> 6
    fcs_bytes = np.where((fcs_flag == 0) & (single == 1), 1, _FCS_BYTES[fcs_flag])
    did_bytes = _DID_BYTES[fhd & 3]
    did_at = starts + 5 + (1 - single)  # after the window descriptor, present unless single-segment
    dictionary = np.zeros(n, dtype=np.uint64)
    for width in (1, 2, 4):
        w = did_bytes == width
        if w.any():
            dictionary[w] = _le(data, did_at[w], width)
    named = dictionary != 0
    # the reserved bit clear, a content size declared
    ok = (magic == _MAGIC) & (((fhd >> 3) & 1) == 0) & (fcs_bytes > 0) & (size >= 9)
    ok &= named if with_dictionary else ~named
    fcs_at = did_at + did_bytes
    declared = np.zeros(n, dtype=np.uint64)
    for width in (1, 2, 4, 8):
        w = fcs_bytes == width
        if w.any():
            declared[w] = _le(data, fcs_at[w], width)
    declared[fcs_bytes == 2] += np.uint64(256)  # (a two-byte size counts from 256)
    ok &= declared == raw_lengths.astype(np.uint64)
    block_at = fcs_at + fcs_bytes
    block = _le(data, block_at, 3).astype(np.int64)
    kind = (block >> 1) & 3
    body = np.where(kind == _BLOCK_RLE, 1, block >> 3)
    frame_end = block_at + 3 + body + 4 * ((fhd >> 2) & 1)
    ok &= ((block & 1) == 1) & (kind != _BLOCK_RESERVED) & (frame_end == ends)
    return np.asarray(ok, dtype=bool), dictionary


def decompress_zstd_into(buf: Buffer, starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64],
                         raw_lengths: npt.NDArray[np.int64], out: memoryview, out_at: npt.NDArray[np.int64],
                         *, dictionaries: DictionarySource | None = None) -> npt.NDArray[np.bool_]:
    """Decompress each zstd payload ``buf[starts[i]:ends[i]]`` that
    :func:`plain_zstd_frames` passes into ``out[out_at[i]:out_at[i] + raw_lengths[i]]``;
    return which were (each checked: its content checksum, when it has one, and its
    size).  With ``dictionaries`` the payloads are ``zstd-dict`` ones, each decompressed
    with the topic's dictionary its frame names.  The others are the caller's to
    decompress one by one (:func:`~shale.ledger.codecs.decompress`), which raises the
    error that names what is wrong with one that is."""
    import zstandard

    data = np.frombuffer(buf, dtype=np.uint8)
    done, named = plain_zstd_frames(data, starts, ends, raw_lengths, with_dictionary=dictionaries is not None)
    contexts = {0: zstd_decompressor()} if dictionaries is None else {}
    if dictionaries is not None:
        for did in sorted(set(named[done].tolist())):
            try:
                contexts[did] = zstd_decompressor(dictionaries(did))
            except ShaleError:
                done &= named != did  # (one by one says what is wrong with it)
    view = memoryview(buf)
    pick = np.flatnonzero(done)
    for i, a, b, n, at, did in zip(pick.tolist(), starts[pick].tolist(), ends[pick].tolist(),
                                   raw_lengths[pick].tolist(), out_at[pick].tolist(), named[pick].tolist(),
                                   strict=True):
        try:
            got = contexts[did].decompress(view[a:b], max_output_size=n, allow_extra_data=False)
        except zstandard.ZstdError:
            done[i] = False  # the one-by-one path says why
            continue
        if len(got) != n:
            done[i] = False
            continue
        out[at:at + n] = got
    return done


def decompress_zstd_each(buf: Buffer, starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64],
                         raw_lengths: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.bool_], list[Buffer]]:
    """Decompress the zstd payloads ``buf[starts[i]:ends[i]]`` (without a dictionary) that
    :func:`plain_zstd_frames` passes, in one call to the library (which leaves the
    interpreter lock and checks each one's content checksum and size): which were, and
    each one's payload, in order (an empty buffer for those that were not).  Should the
    library refuse any of them, none is: the one-by-one path
    (:func:`~shale.ledger.codecs.decompress`) says what is wrong."""
    import zstandard

    n = len(starts)
    done, _ = plain_zstd_frames(np.frombuffer(buf, dtype=np.uint8), starts, ends, raw_lengths)
    pick = np.flatnonzero(done)
    out: list[Buffer] = [b""] * n
    if not len(pick):
        return done, out
    segments = np.empty((len(pick), 2), dtype=np.uint64)
    segments[:, 0] = starts[pick]
    segments[:, 1] = ends[pick] - starts[pick]
    try:
        got = zstd_decompressor().multi_decompress_to_buffer(
            zstandard.BufferWithSegments(buf, segments.tobytes()),
            decompressed_sizes=raw_lengths[pick].astype(np.uint64).tobytes())
    except zstandard.ZstdError:
        return np.zeros(n, dtype=np.bool_), out
    for k, i in enumerate(pick.tolist()):
        out[i] = got[k]
    return done, out
