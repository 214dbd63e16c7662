"""``shale produce``'s pipeline: input read into reused buffers, entries compressed while
the next chunk is read and scanned.  Each test forces the overlap it checks (a gate holds
the compression threads) rather than hoping the threads interleave."""

from __future__ import annotations

import io
import os
import random
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from shale.ledger.errors import InvalidInputError
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter, ahead, compressing, jsonl_ingest
from shale.producer.jsonl_ingest import append_lines
from shale.producer.pipe import chunks, pieces
from shale.reader import TopicReader
from tests.gates import Gate, start_held
from tests.needs import c_extension, needs

GUARD_S = 60  # reached only when something is broken
pytestmark = pytest.mark.kernels  # (the scanner and the encoder run in most of these)


def _lines(rng: random.Random, n: int) -> bytes:
    out = []
    for _ in range(n):
        value = "v" * rng.choice([0, 3, 40, 300, 5000])  # some lines longer than a piece
        out.append(b'{"key": "k%d", "value": "%s"}\n' % (rng.randrange(50), value.encode()))
    return b"".join(out)


@pytest.mark.parametrize("seed", range(6))
def test_pieces_cut_where_chunks_cut_and_stay_whole_until_buffers_come_round(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    data = _lines(rng, 300) + (b'{"key": "last"}' if seed % 2 else b"")  # the last line with or without its end
    size = rng.choice([64, 1000, 4096, 1 << 16])
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    want = list(chunks(io.BytesIO(data), None, size))
    for opened in (lambda: io.BytesIO(data), lambda: path.open("rb"), lambda: path.open("rb", buffering=0)):
        with opened() as stream:
            got: list[memoryview] = []
            copies: list[bytes] = []
            for piece in pieces(stream, None, size, buffers=3):
                got.append(piece)
                copies.append(bytes(piece))
                # the piece before is still as it was read (two more are needed to overwrite it)
                assert len(got) < 2 or bytes(got[-2]) == copies[-2]
        assert copies == want
        assert b"".join(copies) == data


def test_pieces_of_a_stream_without_a_buffer_to_read_into() -> None:
    class Reads(io.RawIOBase):  # read1 only: its readinto is not implemented
        def __init__(self, data: bytes) -> None:
            self.data = data

        def read1(self, n: int = -1) -> bytes:
            got, self.data = self.data[:max(n, 0)], self.data[max(n, 0):]
            return got

    data = _lines(random.Random(9), 100)
    got = pieces(Reads(data), None, 500)  # type: ignore[arg-type]  # (an IO of the typing's, not of io's)
    assert [bytes(p) for p in got] == list(chunks(io.BytesIO(data), None, 500))


class _Held:
    """Holds every compression task until :meth:`open`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.gate = threading.Event()
        task = compressing._task

        def held(*args: Any) -> Any:
            assert self.gate.wait(GUARD_S), "the gate was never opened"
            return task(*args)

        monkeypatch.setattr(compressing, "_task", held)

    def open(self) -> None:
        self.gate.set()


def test_append_batch_returns_while_its_entries_compress_and_they_keep_their_order(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    held = _Held(monkeypatch)
    uri = str(tmp_path / "t")
    w = TopicWriter(uri, batch_size=10, max_ledger_records=70, compression="zstd")
    w._compressing._threads = 2  # (as on a machine of two cores, whatever this one has)
    first = {"key": [f"a{i}" for i in range(45)], "value": [f"x{i}" for i in range(45)]}
    assert w.append_batch(first) == 45  # returned with its entries held by the gate
    assert w.ledger_records == 45 and w.result.records == 0
    held.open()
    w.append("b", "one by one")  # after the entries before it
    w.append_batch({"key": [f"c{i}" for i in range(60)], "value": [f"y{i}" for i in range(60)]})
    assert [lg.records for lg in w.result.ledgers] == [70]  # a batch that fills a ledger seals it before it returns
    result = w.close()
    assert result.records == 106
    got = [(m.key, m.value) for m in TopicReader(uri)]
    want = ([(f"a{i}".encode(), f"x{i}".encode()) for i in range(45)] + [(b"b", b"one by one")]
            + [(f"c{i}".encode(), f"y{i}".encode()) for i in range(60)])
    assert got == want
    assert [lg.records for lg in w.result.ledgers] == [70, 36]  # never more than a ledger's records


@needs(c_extension(jsonl_ingest._native, "ledger/_jsonl.c"))
def test_a_bad_line_in_the_second_chunk_while_the_first_is_compressed(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    good = b"".join(b'{"key": "k%d", "value": "v%d"}\n' % (i, i) for i in range(200))
    data = good + good[:300] + b'{"key": "bad", "value": tru}\n' + good
    bad_line = 200 + good[:300].count(b"\n") + 1
    expected_error = None
    with TopicWriter(str(tmp_path / "lines"), batch_size=7, max_ledger_records=50) as w:
        with pytest.raises(InvalidInputError) as by_line:
            append_lines(w, io.BytesIO(data), "in.jsonl")
        expected_error = str(by_line.value)
    assert f"in.jsonl:{bad_line}:" in expected_error
    held = _Held(monkeypatch)
    # (a ledger of more records than the input: a batch that fills a ledger waits for its entries)
    w = TopicWriter(str(tmp_path / "columns"), batch_size=7, max_ledger_records=1000)
    w._compressing._threads = 2
    with pytest.raises(InvalidInputError) as by_columns:
        jsonl_ingest.produce_lines(w, io.BytesIO(data), "in.jsonl", chunk_bytes=len(good))
    assert w._compressing.records >= 200  # the first chunk was still being compressed
    held.open()
    assert str(by_columns.value) == expected_error
    assert w.close().records == 200 + good[:300].count(b"\n")
    lines = [(m.key, m.value) for m in TopicReader(str(tmp_path / "lines"))]
    assert [(m.key, m.value) for m in TopicReader(str(tmp_path / "columns"))] == lines


@needs(c_extension(jsonl_ingest._native, "ledger/_jsonl.c"))
def test_a_file_given_by_name_on_stdin_and_through_a_pipe_make_the_same_topic(tmp_path: Path) -> None:
    data = _lines(random.Random(3), 3000)
    source = tmp_path / "in.jsonl"
    source.write_bytes(data)
    topics = [tmp_path / name for name in ("named", "stdin", "pipe")]
    run = [sys.executable, "-m", "shale.cli", "produce", "--batch-size", "64", "--max-ledger-records", "1000"]
    subprocess.run([*run, str(topics[0]), "--input", str(source)], check=True, capture_output=True)
    with source.open("rb") as stdin:
        subprocess.run([*run, str(topics[1])], stdin=stdin, check=True, capture_output=True)
    subprocess.run([*run, str(topics[2])], input=data, check=True, capture_output=True)
    named, stdin_, piped = ([(str(m.id), m.key, m.value, m.properties) for m in TopicReader(str(t))]
                            for t in topics)
    assert len(named) == 3000 and named == stdin_  # ids too: a regular file is read alike either way
    assert [r[1:] for r in piped] == [r[1:] for r in named]


@needs(c_extension(jsonl_ingest._native, "ledger/_jsonl.c"))
@pytest.mark.parametrize("bad", [False, True])
def test_a_file_scanned_ahead_stores_and_refuses_as_the_stream_read_here(tmp_path: Path, bad: bool) -> None:
    rng = random.Random(5)
    data = _lines(rng, 2000)
    if bad:  # in the third chunk, the two before it scanned ahead and appended
        cut = data.index(b"\n", 2 * len(data) // 3) + 1
        data = data[:cut] + b'{"key": "k", "value": "v", "key": "twice"}\n{"key": 7}\n' + data[cut:]
    source = tmp_path / "in.jsonl"
    source.write_bytes(data)
    got = []
    for way in ("ahead", "stream"):
        w = TopicWriter(str(tmp_path / way), batch_size=9, max_ledger_records=400)
        with source.open("rb") as f:
            stream = ahead.scan_ahead(f, len(data) // 5) if way == "ahead" else f
            assert isinstance(stream, ahead.Ahead) == (way == "ahead")
            error = None
            try:
                jsonl_ingest.produce_lines(w, stream, "in.jsonl", chunk_bytes=len(data) // 5)
            except InvalidInputError as e:
                error = str(e)
            finally:
                if isinstance(stream, ahead.Ahead):
                    stream.close()
        w.close()
        got.append((error, [(str(m.id), m.key, m.value) for m in TopicReader(str(tmp_path / way))]))
    assert got[0] == got[1]
    assert (got[0][0] is not None) == bad and len(got[0][1]) >= 1000


@needs(c_extension(jsonl_ingest._native, "ledger/_jsonl.c"))
def test_closing_a_file_scanned_ahead_stops_its_thread_however_far_it_got(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(_lines(random.Random(6), 5000))
    with source.open("rb") as f:
        scanned = ahead.scan_ahead(f, 4096)
        assert isinstance(scanned, ahead.Ahead)
        next(iter(scanned))  # the thread goes on until AHEAD chunks wait: it is then stopped while waiting
        scanned.close()
        assert not scanned._thread.is_alive()
        assert scanned.rewound().read() == source.read_bytes()  # (what the line-by-line path reads then)


def test_only_a_regular_file_is_scanned_ahead(tmp_path: Path) -> None:
    r, w = os.pipe()
    with os.fdopen(r, "rb") as pipe, os.fdopen(w, "wb"):
        assert ahead.scan_ahead(pipe, 4096) is pipe
    data = io.BytesIO(b'{"key": "k"}\n')
    assert ahead.scan_ahead(data, 4096) is data


@needs(c_extension(jsonl_ingest._native, "ledger/_jsonl.c"))
def test_ctrl_c_while_a_file_is_scanned_ahead_keeps_and_names_what_was_appended(tmp_path: Path) -> None:
    lines = [b'{"key": "k%d", "value": "%s"}\n' % (i, b"v" * 100) for i in range(200_000)]  # (6 chunks)
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(lines))
    gate = Gate(tmp_path / "gate")
    uri = str(tmp_path / "t")
    # held while it seals its second ledger, with chunks scanned ahead waiting; interrupted there
    p = start_held(gate, "shale", "shale.producer.writer:TopicWriter._seal", "produce", uri, "--input", str(source),
                   "--max-ledger-records", "20000", at_call=2)
    assert gate.wait([p]) == [True]
    p.send_signal(signal.SIGINT)
    gate.open()
    out, err = p.communicate(timeout=GUARD_S)
    assert p.returncode == 130 and out == "", err
    said = re.fullmatch(r"shale: interrupted: ([\d,]+) records were appended in (\d+) ledgers, last id (\S+)\n", err)
    assert said is not None, err
    read = list(TopicReader(uri))
    assert 40_000 <= len(read) < 200_000  # stopped after the held seal, before the end of the file
    assert (int(said[1].replace(",", "")), int(said[2]), said[3]) == (len(read), len(TopicMetadata.open(uri)
                                                                                    .load_topic().ledgers),
                                                                       str(read[-1].id))
    assert [m.key for m in read] == [b"k%d" % i for i in range(len(read))]  # nothing read is lost or reordered
