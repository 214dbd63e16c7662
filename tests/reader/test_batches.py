"""The batch form of a read (:meth:`TopicReader.message_batches`, :meth:`TopicReader.read_batches`,
:class:`~shale.reader.MessageBatch`): batches hold the messages a message-by-message read
gives, the reader stands after each batch (and each row: ``after``) where it stands
after the same message, a limit is exact, a gap is met as :meth:`TopicReader.read` meets
it; and ``shale read`` prints the same bytes in batches as message by message (the golden
comparison of tests/golden.py runs for every read in this process)."""

from __future__ import annotations

import io
import json
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shale.compactor import CompactionConfig, Compactor
from shale.ledger.errors import GapError
from shale.ledger.ids import MessageId
from shale.ledger.record import Record
from shale.producer import TopicWriter
from shale.producer.jsonlines import batch_lines, message_line
from shale.reader import MessageBatch, TopicReader
from tests import golden
from tests.conftest import run_cli_here
from tests.needs import need_module

pa = need_module("pyarrow")


def _produce(uri: str, seed: int, n: int, codec: str = "zstd") -> None:
    rnd = random.Random(seed)
    with TopicWriter(uri, batch_size=rnd.randrange(2, 9), max_ledger_records=23, compression=codec) as w:
        for i in range(n):
            key = None if rnd.random() < 0.05 else f"k{rnd.randrange(40)}".encode()
            value = None if rnd.random() < 0.1 else rnd.randbytes(rnd.randrange(0, 12)) if rnd.random() < 0.3 \
                else f"v{seed}-{i}".encode()
            w.send(Record(key, value, {f"p{j}": "é\n" * j for j in range(rnd.randrange(3))}, 1000 + i))


def _topic(uri: str) -> None:
    """Ledgers of 23 records, compacted twice (a part kept with a deletion vector), and a tail."""
    _produce(uri, 1, 200)
    Compactor(uri, CompactionConfig(delete_retention_ms=0)).run()
    _produce(uri, 2, 90, "lz4")
    Compactor(uri, CompactionConfig(delete_retention_ms=0, reuse_min_bytes=0, reuse_min_live=0.0)).run()
    _produce(uri, 3, 60, "none")


def _positions(uri: str, compacted: bool) -> dict[MessageId, MessageId]:
    """Where a message-by-message reader stands after each message."""
    r = TopicReader(uri, read_compacted=compacted)
    out = {}
    for m in r:
        out[m.id] = r.position
    return out


@pytest.mark.parametrize("compacted", [False, True])
def test_batches_hold_the_messages_and_stand_where_messages_do(tmp_path: Path, compacted: bool) -> None:
    uri = str(tmp_path / "t")
    _topic(uri)
    want = TopicReader(uri, read_compacted=compacted).read()
    after = _positions(uri, compacted)
    r = TopicReader(uri, read_compacted=compacted)
    got = []
    for batch in r.message_batches(rows=4):
        assert isinstance(batch, MessageBatch) and 0 < len(batch) <= 4
        messages = batch.messages()
        assert r.position == after[messages[-1].id]  # handed out: the position is past it
        assert [batch.after(i) for i in range(len(batch))] == [after[m.id] for m in messages]
        got += messages
    assert got == want
    assert r.read() == [] and r.read_batches() == []


@pytest.mark.parametrize("compacted", [False, True])
def test_read_batches_takes_exactly_the_limit_and_goes_on_from_there(tmp_path: Path, compacted: bool) -> None:
    uri = str(tmp_path / "t")
    _topic(uri)
    want = TopicReader(uri, read_compacted=compacted).read()
    after = _positions(uri, compacted)
    r = TopicReader(uri, read_compacted=compacted)
    got = []
    for limit in (1, 7, 30, 3):
        batches = r.read_batches(limit, rows=5)
        taken = [m for b in batches for m in b.messages()]
        assert len(taken) == limit
        assert r.position == after[taken[-1].id]
        got += taken
    rest = r.read_batches()
    got += [m for b in rest for m in b.messages()]
    assert got == want
    # the Arrow records of a batch are the records of its messages
    assert pa.Table.from_batches([b.records for b in rest]).num_rows == len(want) - 41


def test_a_gap_is_met_as_read_meets_it(tmp_path: Path) -> None:
    """Ledgers the readers listed are read while their objects last; those registered and
    removed since are a gap: both forms return what comes before it, then raise."""
    uri = str(tmp_path / "t")
    _produce(uri, 4, 100)  # ledgers 1-5
    r, m = TopicReader(uri), TopicReader(uri)
    assert len(r.read_batches(10)) and len(m.read(10)) == 10
    assert r.position == m.position
    _produce(uri, 5, 60)  # ledgers 6-8, which neither reader listed
    assert run_cli_here("truncate", uri, "--before-ledger", "8", "--allow-uncompacted").returncode == 0
    before = [x for b in r.read_batches() for x in b.messages()]
    assert before and before == m.read() and r.position == m.position
    with pytest.raises(GapError) as batches_error:
        r.read_batches()
    with pytest.raises(GapError) as messages_error:
        m.read()
    assert str(batches_error.value) == str(messages_error.value)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.none() | st.binary(max_size=20), st.none() | st.binary(max_size=300),
                          st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=3)), min_size=1,
                max_size=40),
       st.sampled_from(["none", "lz4", "zstd"]), st.sampled_from(["text", "json"]))
def test_lines_of_a_topics_batches_are_its_messages_lines(tmp_path_factory: pytest.TempPathFactory,
                                                          records: list[tuple[bytes | None, bytes | None,
                                                                              dict[str, str]]],
                                                          codec: str, value_format: str) -> None:
    uri = str(tmp_path_factory.mktemp("lines") / "t")
    with TopicWriter(uri, batch_size=3, compression=codec) as w:
        for key, value, props in records:
            w.send(Record(key, value, props, 5))
    messages = TopicReader(uri).read()
    batches = TopicReader(uri).read_batches()
    assert [m for b in batches for m in b.messages()] == messages
    got = b"".join(bytes(block) for b in batches for block, _ in batch_lines(b.records, value_format))
    assert got == "".join(message_line(m, value_format) + "\n" for m in messages).encode("utf-8")


def test_shale_read_is_compared_both_ways(tmp_path: Path) -> None:
    """The golden comparison runs (tests/golden.py): reads of every kind, small and big."""
    uri = str(tmp_path / "t")
    _topic(uri)
    before = golden.COMPARED[0]
    for argv in ([], ["--compacted"], ["--table"], ["--start", "3:0:0"], ["--limit", "17"], ["--table", "--limit", "5"],
                 ["--value-format", "json"], ["--as-of", "2"], ["--as-of", "9:0:3"], ["--from-snapshot", "2"]):
        out = run_cli_here("read", uri, *argv)
        assert out.returncode == 0, (argv, out.stderr)
        assert all(json.loads(line)["id"] for line in out.stdout.splitlines())
    assert golden.COMPARED[0] == before + 10


@pytest.mark.parametrize("compacted", [False, True])
def test_a_follower_in_batches_prints_what_there_is_then_what_comes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   compacted: bool) -> None:
    """``shale read --follow`` through the Arrow path (every read in batches here): the
    records there are, flushed before it waits, then those produced while it waits, each
    line what the messages' path prints for it (a follower is not in the golden comparison:
    it waits)."""
    import shale.reader.batches as batches
    from shale.cli import build_parser, run_command

    monkeypatch.setattr(batches, "BATCH_READ_RECORDS", 0)
    given: list[int] = []
    real = TopicReader.message_batches

    def message_batches(self: TopicReader, *args: Any, **kwargs: Any) -> Iterator[MessageBatch]:
        for b in real(self, *args, **kwargs):
            given.append(len(b))
            yield b

    monkeypatch.setattr(TopicReader, "message_batches", message_batches)
    uri = str(tmp_path / "t")
    _topic(uri)
    there = len(TopicReader(uri, read_compacted=compacted).read())
    printed = threading.Event()

    class Out(io.StringIO):
        def flush(self) -> None:
            super().flush()
            if self.getvalue().count("\n") >= there:
                printed.set()

    def produce_when_printed() -> None:
        printed.wait(120)  # (only so that a broken follower cannot hang the run: asserted below)
        seen.append(printed.is_set())
        _produce(uri, 4, 30)

    seen: list[bool] = []
    producer = threading.Thread(target=produce_when_printed, daemon=True)
    producer.start()
    out, err = Out(), io.StringIO()
    argv = ["read", uri, "--follow", "--poll-interval", "10ms", "--limit", str(there + 30)]
    code = run_command([*argv, "--compacted"] if compacted else argv, build_parser(), out=out, err=err)
    producer.join()
    assert (code, err.getvalue(), seen) == (0, "", [True])
    want = [message_line(m) for m in TopicReader(uri, read_compacted=compacted).read()]
    assert len(want) == there + 30
    assert out.getvalue().splitlines() == want
    assert sum(given) == there + 30  # every line came from a batch
