"""Readers hold no more than ``--max-batch-bytes`` of an entry bigger than that.

An entry bigger than what a reader may hold at once is read on its own, in ranged reads
of its stored bytes, and decompressed as it is read (zstd) or read straight from them
(stored as it is), by every path: Arrow batches (``export``, ``to_arrow``, ``read
--table`` through them), plain messages (``read``, ``TableView``) and messages picked by
record (``read --table``, ``get``).  An lz4 block, which is decompressed whole, bigger
than the bound, than its biggest record and than 1 MiB is refused in one line naming the
entry and the bound that would read it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shale.ledger.errors import CorruptLedgerError, InvalidInputError
from shale.ledger.reader import LedgerFile
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader.arrow import BatchReader
from tests import objects, tamper
from tests.conftest import run_cli_here

MiB = 1 << 20
RECORDS, RECORD = 128, 64 << 10  # one entry of 8 MiB


def value(i: int, size: int = RECORD) -> bytes:
    return (b"%06d" % i * (size // 6 + 1))[:size]


def produce(uri: str, codec: str, records: int = RECORDS, size: int = RECORD) -> None:
    """One entry of ``records`` records of ``size`` bytes, a key each."""
    with TopicWriter(uri, compression=codec, batch_size=records, max_entry_bytes=256 * MiB,
                     max_ledger_bytes=1 << 40) as w:
        for i in range(records):
            w.append(f"key-{i:04d}", value(i, size))


class _Recording:
    """A store whose reads are recorded (their sizes), everything else its own."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.reads = inner, [0]

    def get_view(self, key: str, start: int, end: int) -> bytes | memoryview:
        got = self.inner.get_view(key, start, end)
        self.reads.append(len(got))
        return got  # type: ignore[no-any-return]

    def get_range(self, key: str, start: int, end: int) -> bytes:
        got = self.inner.get_range(key, start, end)
        self.reads.append(len(got))
        return got  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _opened(uri: str) -> tuple[LedgerFile, _Recording]:
    meta = TopicMetadata.open(uri)
    store = _Recording(meta.topic.store)
    f = LedgerFile.open(store, meta.topic.key(meta.load_topic().ledgers[0].object))  # type: ignore[arg-type]
    store.reads = [0]  # (the footer's read is the open's)
    return f, store


@pytest.mark.parametrize("codec", ["zstd", "none"])
def test_every_read_path_reads_a_big_entry_in_pieces(tmp_path: Path, codec: str) -> None:
    """An entry of 8 MiB read with a bound of 1 MiB: no read of more than 256 KiB (the
    reads' size), by Arrow batches, messages and messages picked by record, and every
    record as it was written."""
    uri = str(tmp_path / "t")
    produce(uri, codec)
    f, store = _opened(uri)
    assert f.n_entries == 1 and int(f.footer.raw_lengths()[0]) > 8 * MiB
    piece = 256 << 10
    with BatchReader(2, max_batch_bytes=MiB, chunk_bytes=piece) as reader:
        got = [v for b in reader.batches(f, np.arange(RECORDS)) for v in b.column("value").to_pylist()]
    assert got == [value(i) for i in range(RECORDS)]
    assert max(store.reads) <= piece
    store.reads = [0]
    assert [m.value for m in f.messages(chunk_bytes=piece, hold_bytes=MiB)] == [value(i) for i in range(RECORDS)]
    assert max(store.reads) <= piece
    store.reads = [0]
    picked = np.array([3, 60, 127])
    assert [m.value for m in f.messages_at(picked, chunk_bytes=piece, hold_bytes=MiB)] == [value(3), value(60),
                                                                                          value(127)]
    assert max(store.reads) <= piece


def test_a_big_entry_stored_as_it_is_is_checked_as_it_is_read(tmp_path: Path) -> None:
    """Its checksum, taken over the pieces, is checked before the last record is given:
    a byte changed in the last record fails every read path, naming the entry."""
    uri = str(tmp_path / "t")
    produce(uri, "none")
    name = TopicMetadata.open(uri).load_topic().ledgers[0].object
    data = bytearray(tamper.read_raw(uri, name))
    p = objects.parse(bytes(data))
    at = int(p.cols["e_offset"][0]) + int(p.cols["e_length"][0]) - 100  # (inside the last record's value)
    data[at] ^= 1
    tamper.write_raw(uri, name, bytes(data))
    f, _ = _opened(uri)
    with pytest.raises(CorruptLedgerError, match=r"entry 1:0 at byte \d+: checksum mismatch"):
        list(f.messages(chunk_bytes=256 << 10, hold_bytes=MiB))
    with pytest.raises(CorruptLedgerError, match="checksum mismatch"), \
            BatchReader(2, max_batch_bytes=MiB, chunk_bytes=256 << 10) as reader:
        list(reader.batches(f, np.arange(RECORDS)))
    r = run_cli_here("read", uri, "--max-batch-bytes", "1MiB")
    assert r.returncode == 4 and name in r.stderr and "checksum mismatch" in r.stderr, r.stderr


def test_an_lz4_block_bigger_than_the_bound_is_refused_naming_the_bound_that_reads_it(tmp_path: Path) -> None:
    """An entry of 4 records of 8 MiB stored as an lz4 block: 32 MiB held whole, refused
    under 16 MiB by every command that reads it (one line, before anything is
    written), read under the bound the refusal names; an lz4 entry of one record bigger
    than the bound is that record, and is read."""
    uri = str(tmp_path / "t")
    produce(uri, "lz4", records=4, size=8 * MiB)
    f, _ = _opened(uri)
    least = -(-int(f.footer.raw_lengths()[0]) >> 20)
    out = tmp_path / "x.parquet"
    for args in (("read", uri), ("read", uri, "--table"), ("read", uri, "--compacted"), ("export", uri, str(out)),
                 ("export", uri, str(out), "--table")):
        r = run_cli_here(*args, "--max-batch-bytes", "16MiB")
        assert r.returncode == 2, (args, r.stderr)
        line = r.stderr.strip()
        assert len(line.splitlines()) == 1 and name_of(uri) in line and "entry 1:0" in line, line
        assert f"give at least {least}MiB" in line and "Traceback" not in line, line
        assert not out.exists() and r.stdout == ""
    with pytest.raises(InvalidInputError, match="lz4 block"):
        list(f.messages())
    r = run_cli_here("read", uri, "--max-batch-bytes", f"{least}MiB")
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["key"] for line in r.stdout.splitlines()] == [f"key-{i:04d}" for i in range(4)]
    one = str(tmp_path / "one")
    produce(one, "lz4", records=1, size=24 * MiB)
    r = run_cli_here("read", one, "--max-batch-bytes", "16MiB")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 1, r.stderr


def name_of(uri: str) -> str:
    return TopicMetadata.open(uri).load_topic().ledgers[0].object
