"""A reader never skips in silence what retention removed before it read it.

A plain reader (or ``shale read --follow``) that falls behind while ``compact``,
``truncate`` and ``gc`` remove the ledgers it had yet to read meets a *gap*: by default
it stops with :class:`GapError` (exit code 6) naming the range; ``on_gap="skip"`` goes on
past it and says so; ``on_gap="compacted"`` reads the range from the compacted view.
``earliest`` on a topic truncated long ago is no gap, nor is a removed ledger the reader
had read to its end; a compacted reader stays exact.  Local folder and S3 (moto)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shale.cli.errors import exit_code_of
from shale.compactor import CompactionConfig, Compactor, collect_garbage
from shale.ledger.errors import GapError, ObjectNotFoundError
from shale.ledger.ids import MessageId
from shale.ledger.record import Message
from shale.maintenance.retention import truncate
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from shale.reader.gaps import Gap
from tests.conftest import ROOT, local_spark, run_cli
from tests.needs import need_module
from tests.tamper import edit

KEYS = 7


def _produce(uri: str, first: int, n: int, keys: int = KEYS) -> None:
    """Records ``first..first+n`` (keys ``k<i % keys>``, values ``v<i>``) in ledgers of 10
    records, two entries of 5 each: ids ``L:0:0 .. L:1:4``."""
    with TopicWriter(uri, max_ledger_records=10, batch_size=5) as w:
        for i in range(first, first + n):
            w.append(f"k{i % keys}", f"v{i}")


def _collect(uri: str) -> None:
    """``shale gc`` once the orphan grace has passed: the removed ledgers' objects go."""
    meta = TopicMetadata.open(uri)
    grace = CompactionConfig().orphan_grace_ms
    report = collect_garbage(meta, now_ms=meta.now_ms() + grace + 60_000, grace_ms=0, orphan_grace_ms=grace)
    assert any(o.startswith("ledgers/") for o in report.orphans_deleted), report.to_json()


def _remove_through(uri: str, before: int, *, collect: bool = True) -> None:
    """Compact, remove the ledgers below ``before`` (all compacted) and, with ``collect``,
    delete their objects."""
    assert Compactor(uri, CompactionConfig()).run().status == "compacted"
    truncate(TopicMetadata.open(uri), before)
    if collect:
        _collect(uri)


def _view(uri: str, records: list[Message], first: MessageId, end: MessageId) -> list[Message]:
    """What the compacted view holds with ids in ``[first, end)``: the latest record of
    each key as of the horizon, when it lies there."""
    horizon = TopicMetadata.open(uri).load_compaction().horizon
    assert horizon is not None
    latest: dict[bytes | None, Message] = {}
    for m in records:
        if m.id <= horizon:
            latest[m.key] = m
    return sorted((m for m in latest.values() if first <= m.id < end), key=lambda m: m.id)


def _ids(messages: list[Message]) -> list[str]:
    return [str(m.id) for m in messages]


# ------------------------------------------------------------------- the reproduction


@pytest.mark.parametrize("on_gap", ["error", "skip", "compacted"])
def test_a_paused_follower_meets_the_gap(disk_topic_uri: str, on_gap: Any) -> None:
    """It read into ledger 2; ledgers 4-8 came, 1-7 went (their objects too) while it was
    paused: nothing from 2:0:3 on is ever skipped without a word."""
    uri = disk_topic_uri
    _produce(uri, 0, 30)  # ledgers 1-3
    heard: list[Gap] = []
    r = TopicReader(uri, follow=True, poll_interval=0.01, on_gap=on_gap, gap_listener=heard.append)
    got = r.read(13)
    paused_at = r.position
    assert str(paused_at) == "2:0:3"
    _produce(uri, 30, 40)  # ledgers 4-7
    _produce(uri, 70, 10, keys=3)  # ledger 8: keys k0-k2 again; compacted with the rest, but stays
    everything = TopicReader(uri).read()
    _remove_through(uri, 8)
    _produce(uri, 80, 10)  # ledger 9
    new = [m for m in TopicReader(uri).read()]
    assert _ids(new) == [f"{lg}:{e}:{b}" for lg in (8, 9) for e in (0, 1) for b in range(5)]
    if on_gap == "error":
        with pytest.raises(GapError) as e:
            r.read()
        assert exit_code_of(e.value) == 6 and e.value.first == "2:0:3"
        assert "records 2:0:3 to 7:… were removed (retention) before this reader read them" in str(e.value)
        assert "goes on at 8:0:0" in str(e.value)
        assert r.position == paused_at and not heard
        with pytest.raises(GapError):  # and again: it never moves past the gap by itself
            r.read_next(timeout=0)
        return
    got += r.read()
    (gap,) = heard
    assert (str(gap.first), gap.through, gap.how) == ("2:0:3", 7, "skipped" if on_gap == "skip" else on_gap)
    substitute = [] if on_gap == "skip" else _view(uri, everything, paused_at, MessageId(8, 0, 0))
    assert _ids(got) == _ids(everything[:13] + substitute + new)
    assert [m.value for m in got] == [m.value for m in everything[:13] + substitute + new]
    if on_gap == "compacted":  # k3-k6 last written in ledger 7; k0-k2's latest are ledger 8's, read as they are
        assert sorted(m.key for m in substitute) == [b"k3", b"k4", b"k5", b"k6"]
    assert r.read() == [] and len(heard) == 1  # crossed once


@pytest.mark.parametrize("how", ["iterate", "read", "read_next", "has_message_available", "iter_batches",
                                 "follow"])
def test_every_way_of_reading_stops_at_the_gap(tmp_path: Path, how: str) -> None:
    """The reader had listed ledgers 1-3 and read ledger 1; 2 and 3 were removed but their
    objects are still there (the orphan grace), so it reads them; 4-7 it never listed."""
    if how == "iter_batches":
        need_module("pyarrow")
    uri = str(tmp_path / "t")
    _produce(uri, 0, 30)
    r = TopicReader(uri, poll_interval=0.01)
    assert len(r.read(10)) == 10 and str(r.position) == "2:0:0"  # ledger 1 read to its end
    _produce(uri, 30, 40)
    _remove_through(uri, 8, collect=False)
    _produce(uri, 70, 5)
    got: list[str] = []
    with pytest.raises(GapError) as e:
        if how == "iterate":
            got.extend(str(m.id) for m in r)
        elif how == "read":
            while batch := r.read(7):
                got.extend(_ids(batch))
        elif how == "read_next":
            while (m := r.read_next(timeout=0)) is not None:
                got.append(str(m.id))
        elif how == "has_message_available":
            while r.has_message_available():
                m = r.read_next(timeout=0)
                assert m is not None
                got.append(str(m.id))
        elif how == "iter_batches":
            for b in r.iter_batches():
                got.extend(f"{x}:{y}:{z}" for x, y, z in zip(*(b[c].to_pylist() for c in ("ledger", "entry", "batch")),
                                                              strict=True))
        else:
            r.follow = True
            for m in r:
                got.append(str(m.id))
    assert got == [f"{lg}:{e}:{b}" for lg in (2, 3) for e in (0, 1) for b in range(5)]
    assert e.value.first == "4:0:0" and "records 4:0:0 to 7:…" in str(e.value)
    with pytest.raises(GapError):
        r.has_message_available()
    r.seek(MessageId(8, 0, 0))  # moved on by hand: no gap any more
    assert len(r.read()) == 5


@pytest.mark.parametrize("on_gap", ["error", "skip", "compacted"])
def test_a_reader_mid_ledger_when_its_ledger_is_collected(disk_topic_uri: str, on_gap: Any) -> None:
    """Reading an entry at a time, it stands in ledger 2's first entry when ledgers 1-3
    are removed and their objects deleted: the next entry's read finds no object, and the
    topic no longer lists the ledger."""
    uri = disk_topic_uri
    _produce(uri, 0, 30)
    everything = TopicReader(uri).read()
    heard: list[Gap] = []
    r = TopicReader(uri, chunk_bytes=1, on_gap=on_gap, gap_listener=heard.append)
    it = iter(r)
    got = [next(it) for _ in range(13)]  # the generator holds ledger 2's first entry
    _remove_through(uri, 4)
    _produce(uri, 30, 10)
    got += [next(it), next(it)]  # the rest of the entry it holds
    assert str(r.position) == "2:0:5"
    if on_gap == "error":
        with pytest.raises(GapError) as e:
            next(it)
        assert e.value.first == "2:0:5" and "records 2:0:5 to 3:…" in str(e.value)
        return
    got += list(it)
    (gap,) = heard
    assert (str(gap.first), gap.through) == ("2:0:5", 3)
    substitute = [] if on_gap == "skip" else _view(uri, everything, MessageId(2, 0, 5), MessageId(4, 0, 0))
    assert _ids(got) == _ids(everything[:15] + substitute) + [f"4:{e}:{b}" for e in (0, 1) for b in range(5)]


@pytest.mark.parametrize("on_gap", ["error", "skip"])
@pytest.mark.parametrize("before", [4, 8])
def test_a_refreshed_reader_still_reads_the_removed_ledgers_it_had_listed(tmp_path: Path, on_gap: Any,
                                                                          before: int) -> None:
    """It listed ledgers 1-3 and read into ledger 2; ledgers 4-7 came, and retention removed
    those below ``before`` (1-3: all it had listed, or 1-7), their objects still there (the
    orphan grace); ``refresh`` then took the new list.  The rest of ledgers 2 and 3 is
    still read from their objects, and only what it never listed (4-7) is a gap: no record
    it had listed vanishes, nor is it left out of the gap."""
    uri = str(tmp_path / "t")
    _produce(uri, 0, 30)
    heard: list[Gap] = []
    r = TopicReader(uri, on_gap=on_gap, gap_listener=heard.append)
    got = r.read(12)
    assert str(r.position) == "2:0:2"
    _produce(uri, 30, 40)
    everything = TopicReader(uri).read()
    _remove_through(uri, before, collect=False)
    _produce(uri, 70, 5)
    r.refresh()
    assert [lg.id for lg in r.topic.ledgers] == [*range(before, 8), 8]
    listed, kept = everything[12:30], everything[10 * (before - 1):]  # 18 records of ledgers 2 and 3
    new = [f"8:0:{b}" for b in range(5)]
    if before == 4:  # nothing it had not listed was removed: no gap
        assert _ids(r.read()) == _ids(listed + kept) + new and not heard
        return
    if on_gap == "error":
        assert _ids(r.read()) == _ids(listed)
        with pytest.raises(GapError) as e:
            r.read()
        assert e.value.first == "4:0:0" and "records 4:0:0 to 7:…" in str(e.value)
        return
    got += r.read()
    (gap,) = heard
    assert (str(gap.first), gap.through, gap.how) == ("4:0:0", 7, "skipped")
    assert _ids(got) == _ids(everything[:30]) + new


def test_a_missing_object_that_retention_did_not_remove_is_no_gap(tmp_path: Path) -> None:
    """Neither a registered ledger's object gone, nor a ledger dropped from the list by a
    hand edit (``removed_through`` unchanged) is taken for retention: both are errors."""
    uri = str(tmp_path / "t")
    _produce(uri, 0, 30)
    lg = TopicMetadata.open(uri).load_topic().ledgers[1]
    (tmp_path / "t" / lg.object).unlink()
    with pytest.raises(ObjectNotFoundError) as e:
        TopicReader(uri, on_gap="skip").read()
    assert not isinstance(e.value, GapError)
    r = TopicReader(uri, on_gap="skip")
    assert len(r.read(10)) == 10
    edit(uri, "topic.json", lambda d: d["value"]["ledgers"].pop(1))
    with pytest.raises(ObjectNotFoundError) as e:
        r.read()
    assert not isinstance(e.value, GapError)


# --------------------------------------------------------------------------- no gap


def test_earliest_after_an_old_truncation_is_no_gap_but_an_old_id_is(disk_topic_uri: str, tmp_path: Path) -> None:
    uri = disk_topic_uri
    _produce(uri, 0, 50)  # ledgers 1-5
    opened_before = TopicReader(uri)  # earliest, nothing read yet
    at_latest = TopicReader(uri, start="latest")
    _remove_through(uri, 4)
    left = [f"{lg}:{e}:{b}" for lg in (4, 5) for e in (0, 1) for b in range(5)]
    assert _ids(TopicReader(uri).read()) == left
    assert _ids(opened_before.read()) == left
    assert at_latest.read() == []
    _produce(uri, 50, 10)
    assert _ids(at_latest.read()) == [f"6:{e}:{b}" for e in (0, 1) for b in range(5)]
    r = run_cli("read", uri)
    assert r.returncode == 0 and r.stderr == "" and len(r.stdout.splitlines()) == 30, r.stderr
    r = run_cli("read", uri, "--start", "2:0:0")
    assert r.returncode == 6 and r.stdout == "", r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith("shale: error: ") and "records 2:0:0 to 3:…" in line and "goes on at 4:0:0" in line
    r = run_cli("read", uri, "--start", "2:0:0", "--on-gap", "skip")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 30
    assert r.stderr.startswith("shale: warning: ") and "records 2:0:0 to 3:…" in r.stderr
    r = run_cli("export", uri, str(tmp_path / "out.jsonl"), "--start", "2:0:0")
    assert r.returncode == 6 and "records 2:0:0 to 3:…" in r.stderr, r.stderr


def test_a_removed_ledger_read_to_its_end_is_no_gap(disk_topic_uri: str) -> None:
    uri = disk_topic_uri
    _produce(uri, 0, 30)
    r = TopicReader(uri, on_gap="error")
    assert len(r.read(30)) == 30
    resumed_at = r.position
    assert str(resumed_at) == "4:0:0"  # past ledger 3, which retention may remove
    _remove_through(uri, 4)
    _produce(uri, 30, 10)
    assert _ids(r.read()) == [f"4:{e}:{b}" for e in (0, 1) for b in range(5)]
    assert len(TopicReader(uri, start=resumed_at).read()) == 10  # a saved position resumes exactly


def test_a_compacted_follower_stays_exact(disk_topic_uri: str) -> None:
    uri = disk_topic_uri
    _produce(uri, 0, 30)
    r = TopicReader(uri, read_compacted=True, follow=True, poll_interval=0.01)
    got = r.read(13)
    paused_at = r.position
    _produce(uri, 30, 40)
    everything = TopicReader(uri).read()
    _remove_through(uri, 8)
    _produce(uri, 70, 20)
    got += r.read()
    new = [f"{lg}:{e}:{b}" for lg in (8, 9) for e in (0, 1) for b in range(5)]
    view = _view(uri, everything, paused_at, MessageId(8, 0, 0))
    assert _ids(got) == _ids(everything[:13] + view) + new


def test_records_removed_above_the_horizon_are_a_gap_for_a_compacted_reader_too(tmp_path: Path) -> None:
    """``truncate --allow-uncompacted`` removed records no compacted view holds."""
    uri = str(tmp_path / "t")
    _produce(uri, 0, 20)
    assert Compactor(uri, CompactionConfig()).run().status == "compacted"
    _produce(uri, 20, 20)  # ledgers 3-4, above the horizon
    r = TopicReader(uri, read_compacted=True)
    assert len(r.read()) == KEYS + 20
    _produce(uri, 40, 20)  # ledgers 5-6
    truncate(TopicMetadata.open(uri), 6, allow_uncompacted=True)
    with pytest.raises(GapError) as e:
        r.read()
    assert "records 5:0:0 to 5:…" in str(e.value) and "no compacted view holds them" in str(e.value)
    heard: list[Gap] = []
    r.on_gap, r.gap_listener = "skip", heard.append
    assert _ids(r.read()) == [f"6:{e}:{b}" for e in (0, 1) for b in range(5)]
    assert heard[0].how == "skipped"


# ------------------------------------------------------------------ shale read --follow


def _follower(uri: str, *flags: str) -> subprocess.Popen[str]:
    exe = Path(sys.executable).parent / "shale"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "shale.cli"]
    return subprocess.Popen([*cmd, "read", uri, "--follow", "--poll-interval", "10ms", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env=os.environ.copy())


@pytest.mark.parametrize("on_gap", ["error", "skip", "compacted"])
def test_shale_read_follow_paused_across_retention(disk_topic_uri: str, on_gap: str) -> None:
    uri = disk_topic_uri
    _produce(uri, 0, 30)  # ledgers 1-3
    # skip: ledgers 8-9 after the 30; compacted: first the latest values of k0-k6, all in
    # ledger 7.  --limit ends it there by itself (no Ctrl-C landing at a random moment).
    expected = {"error": 30, "skip": 50, "compacted": 57}[on_gap]
    p = _follower(uri, *(() if on_gap == "error" else ("--limit", str(expected), "--on-gap", on_gap)))
    try:
        assert p.stdout is not None
        lines = [p.stdout.readline() for _ in range(30)]  # all it could read: it now waits for more
        p.send_signal(signal.SIGSTOP)
        assert os.WIFSTOPPED(os.waitpid(p.pid, os.WUNTRACED)[1])  # stopped before anything is produced
        _produce(uri, 30, 40)  # ledgers 4-7, produced, compacted, removed and collected meanwhile
        everything = TopicReader(uri).read()
        _remove_through(uri, 8)
        _produce(uri, 70, 20)  # ledgers 8-9
        p.send_signal(signal.SIGCONT)
        out, err = p.communicate(timeout=120)  # it stops by itself: at the gap, or at the limit
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    lines += out.splitlines(keepends=True)
    ids = [json.loads(x)["id"] for x in lines]
    assert ids[:30] == _ids(everything[:30])
    if on_gap == "error":
        assert p.returncode == 6 and len(lines) == 30, (out, err)  # the error is error (default), exit 6
        (line,) = err.splitlines()
        assert line.startswith("shale: error: ") and "records 4:0:0 to 7:… were removed" in line, err
        return
    view = [] if on_gap != "compacted" else _view(uri, everything, MessageId(4, 0, 0), MessageId(8, 0, 0))
    assert p.returncode == 0 and len(lines) == expected, (out, err)
    assert ids[30:] == _ids(view) + [f"{lg}:{e}:{b}" for lg in (8, 9) for e in (0, 1) for b in range(5)]
    assert [json.loads(x)["value"] for x in lines[30:30 + len(view)]] == [(m.value or b"").decode() for m in view]
    (warning,) = err.splitlines()
    assert warning.startswith("shale: warning: ") and "records 4:0:0 to 7:…" in warning, err


def test_read_help_lists_exit_code_6() -> None:
    r = run_cli("read", "--help")
    assert r.returncode == 0 and "  6  records it had yet to read were removed by retention (see --on-gap)" in r.stdout
    assert "--on-gap {error,skip,compacted}" in r.stdout


# ---------------------------------------------------------------- a Spark stream


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    need_module("pyspark")
    need_module("pyarrow")
    import shale.spark

    session = local_spark(fresh=True)  # (started anew: this module registers the data source)
    shale.spark.register(session)
    yield session


@pytest.mark.slow
def test_a_spark_stream_fails_on_data_loss_unless_told(spark: Any, tmp_path: Path) -> None:
    """A query stopped after ledgers 1-3; 4-7 came and went before it ran again."""
    uri, out, ck = str(tmp_path / "t"), tmp_path / "out", tmp_path / "ck"
    _produce(uri, 0, 30)

    def run(checkpoint: Path = ck, **options: str) -> None:
        q = (spark.readStream.format("shale").options(**options).load(uri).writeStream.format("parquet")
             .option("path", str(out)).option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
             .start())
        q.awaitTermination()

    def read_out() -> list[str]:
        rows = spark.read.parquet(str(out)).select("ledger", "entry", "batch").collect()
        return sorted((f"{r.ledger}:{r.entry}:{r.batch}" for r in rows), key=MessageId.parse)

    run()
    assert read_out() == _ids(TopicReader(uri).read())
    _produce(uri, 30, 40)
    _remove_through(uri, 8)
    _produce(uri, 70, 20)
    with pytest.raises(Exception, match=r"records 4:0:0 to 7:… were removed \(retention\)") as e:
        run()
    assert "failOnDataLoss=false" in str(e.value)
    run(failOnDataLoss="false")
    assert read_out() == [f"{lg}:{e}:{b}" for lg in (1, 2, 3, 8, 9) for e in (0, 1) for b in range(5)]
    with pytest.raises(Exception, match=r"records 2:0:0 to 7:…"):  # a start id below what is left
        run(tmp_path / "ck2", start="2:0:0")
