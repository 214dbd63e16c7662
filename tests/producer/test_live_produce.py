"""Live produce: ``shale produce --linger`` (the ``max-ledger-age`` policy) seals what it
has in time, so a follower sees each record fed through a pipe within the linger plus
its poll interval; ``--producer-id`` makes a retried produce skip what it already
appended, whenever the earlier run died (after sealing, before registering included).

No wall clock is asserted: a record counts as seen in time when the follower prints it
before the next one is written; a generous guard only keeps a broken build from hanging."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

import pytest

from shale.ledger.errors import ProducerFencedError
from shale.maintenance.retention import truncate
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.producer.linger import Linger
from shale.reader import TopicReader
from tests.conftest import run_cli, run_cli_here
from tests.gates import GUARD_S, Gate, start_held

DAY_MS = 86_400_000


def _shale(*args: str, stdin: int | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([str(Path(sys.executable).parent / "shale"), *args], stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)


def _lines(stream: IO[str]) -> queue.Queue[str]:
    """The lines of ``stream``, read on a thread of their own as they come."""
    got: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stream:
            got.put(line)
        got.put("")  # the end

    threading.Thread(target=pump, daemon=True).start()
    return got


def _next_line(got: queue.Queue[str], *procs: subprocess.Popen[str]) -> str:
    """The next line, waiting at most the guard (and no longer than the processes live)."""
    for _ in range(int(GUARD_S / 0.1)):
        try:
            return got.get(timeout=0.1)
        except queue.Empty:
            dead = [p for p in procs if p.poll() is not None]
            assert not dead, f"exited {dead[0].returncode}: {dead[0].stderr.read() if dead[0].stderr else ''}"
    raise AssertionError("nothing came within the guard")


@pytest.mark.parametrize("how", ["flag", "policy"])
def test_a_follower_sees_each_record_of_a_live_pipe_before_the_next_is_written(how: str, tmp_path: Path) -> None:
    topic = str(tmp_path / "live")
    policy = ("--set", "max-ledger-age=200ms") if how == "policy" else ()
    assert run_cli_here("create", topic, *policy).returncode == 0
    follower = _shale("read", topic, "--follow", "--poll-interval", "200ms")
    producer = _shale("produce", topic, *(("--linger", "200ms") if how == "flag" else ()), stdin=subprocess.PIPE)
    assert producer.stdin is not None and follower.stdout is not None
    seen = _lines(follower.stdout)
    try:
        for i in range(5):
            producer.stdin.write(json.dumps({"key": f"k{i}", "value": f"v{i}"}) + "\n")
            producer.stdin.flush()
            line = _next_line(seen, producer, follower)  # before the next record is written
            assert (json.loads(line)["key"], json.loads(line)["value"]) == (f"k{i}", f"v{i}")
        producer.stdin.close()  # the end of the input: what is left is sealed, and it ends
        producer.wait(timeout=GUARD_S)
        assert producer.stdout is not None and producer.stderr is not None
        out, err = producer.stdout.read(), producer.stderr.read()
        assert producer.returncode == 0, err
        assert "appended 5 records" in out and "in 5 ledgers" in out, out  # each sealed alone, by the linger
    finally:
        for p in (producer, follower):
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
                p.wait(timeout=GUARD_S)
    assert follower.returncode == 0


def test_the_linger_counts_from_the_oldest_record_not_sealed(tmp_path: Path) -> None:
    """Sealed once the oldest record waiting has waited the linger: by the append that
    finds it so, or by ``seal_if_due``; the next record waits from when it comes."""
    now = [100.0]
    topic = str(tmp_path / "t")
    TopicWriter(topic).close()
    TopicMetadata.open(topic).update_policy({"max_ledger_age_ms": 1000})
    with TopicWriter(topic) as w:
        assert w.linger.max_age_ms == 1000  # the topic's policy
        w.linger = Linger(1000, clock=lambda: now[0])
        assert w.linger_due() is None  # nothing waits
        w.append("a", "1")
        now[0] += 0.6
        w.append("b", "2")
        assert w.linger_due() == pytest.approx(0.4) and not w.result.ledgers
        now[0] += 0.4
        w.seal_if_due()
        assert [lg.records for lg in w.result.ledgers] == [2] and w.linger_due() is None
        w.append("c", "3")
        now[0] += 0.9
        w.append_batch({"key": ["d", "e"], "value": ["4", "5"]})
        assert len(w.result.ledgers) == 1 and w.linger_due() == pytest.approx(0.1)
        now[0] += 0.1
        w.append("f", "6")  # past c's linger: sealed with it
        assert [lg.records for lg in w.result.ledgers] == [2, 4]
    assert [lg.records for lg in w.result.ledgers] == [2, 4]  # (nothing left to seal)
    with TopicWriter(topic, max_ledger_age_ms=0) as w:
        assert w.linger.max_age_ms == 0 and w.linger_due() is None  # the argument wins over the policy


def _keys(topic: str) -> list[str]:
    return [m.key.decode() for m in TopicReader(topic)]


def test_a_retried_produce_skips_what_a_run_killed_between_sealing_and_registering_appended(tmp_path: Path) -> None:
    topic, data = str(tmp_path / "t"), tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"key": f"k{i:02d}", "value": f"v{i}"}) + "\n" for i in range(12)))
    args = ("produce", topic, "--input", str(data), "--producer-id", "in.jsonl@2026-11-28", "--max-ledger-records",
            "5", "--batch-size", "5")
    # killed once its second ledger is uploaded, before it is registered (and the first registered)
    gate = Gate(tmp_path / "gate")
    proc = start_held(gate, "shale", "shale.producer.writer:LedgerInfo", *args, at_call=2)
    try:
        assert gate.wait([proc]) == [True], proc.communicate()
        uploaded = sorted(p.name for p in (tmp_path / "t" / "ledgers").iterdir())
        assert len(uploaded) == 2  # the second is uploaded: sealed, not registered
    finally:
        proc.kill()
        proc.wait()
    assert _keys(topic) == [f"k{i:02d}" for i in range(5)]
    # the retry appends the rest, once
    r = run_cli(*args, "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert (got["records"], got["skipped"], got["producer"]) == (7, 5, "in.jsonl@2026-11-28")
    assert _keys(topic) == [f"k{i:02d}" for i in range(12)]
    # and again: nothing
    r = run_cli_here(*args)
    assert r.returncode == 0 and r.stdout == (f"{topic}: nothing appended; skipped the first 12 records, appended "
                                              "before by producer 'in.jsonl@2026-11-28'\n"), r.stdout
    # without the id, a retry appends them all again (what the id is for)
    assert run_cli_here(*args[:4]).returncode == 0 and len(_keys(topic)) == 24


def test_two_writers_with_one_producer_id_register_one_copy(tmp_path: Path) -> None:
    topic = str(tmp_path / "t")
    first, second = TopicWriter(topic, producer_id="p"), TopicWriter(topic, producer_id="p")
    for w in (first, second):
        for i in range(5):
            w.append(f"k{i}", f"v{i}")
    first.close()
    with pytest.raises(ProducerFencedError, match="another writer with this id registered records 0 to 4 first"):
        second.flush()
    assert _keys(topic) == [f"k{i}" for i in range(5)]
    r = run_cli_here("produce", topic, "--producer-id", "p",
                     input="".join(json.dumps({"key": f"k{i}", "value": "v"}) + "\n" for i in range(8)))
    assert r.returncode == 0 and "appended 3 records" in r.stdout and "skipped the first 5" in r.stdout, r.stdout
    assert _keys(topic) == [f"k{i}" for i in range(8)]


def test_a_producer_id_is_kept_for_its_expiry_and_through_truncations(tmp_path: Path) -> None:
    topic = str(tmp_path / "t")
    t0 = 1_700_000_000.0

    def produce(pid: str, n: int, t: float, **kw: int) -> int:
        with TopicWriter(topic, producer_id=pid, clock=lambda: t, max_ledger_records=2, **kw) as w:
            for i in range(n):
                w.append(f"{pid}-{i}", "v")
        return w.result.skipped

    assert produce("a", 4, t0) == 0
    assert produce("a", 4, t0 + 1) == 4  # a retry: every record skipped
    meta = TopicMetadata.open(topic)
    truncate(meta, 3, allow_uncompacted=True)  # the ledger list rewritten: the marks stay
    assert meta.load_topic().producers["a"].next == 4
    assert produce("a", 4, t0 + 2, producer_expiry_ms=DAY_MS) == 4
    # past the expiry the id is forgotten: everything is appended again
    assert produce("a", 4, t0 + DAY_MS / 1000 + 2, producer_expiry_ms=DAY_MS) == 0
    # and a mark past its expiry is dropped by the next registration of any producer
    assert produce("b", 1, t0 + 3 * DAY_MS / 1000, producer_expiry_ms=DAY_MS) == 0
    assert set(meta.load_topic().producers) == {"b"}
    # the document says what each producer registered, and refuses a mark past the last ledger
    doc = json.loads((tmp_path / "t" / "_meta" / "topic.json").read_text())
    last = meta.load_topic().last_ledger_id
    assert doc["value"]["producers"]["b"] == {"next": 1, "ledger": last, "at_ms": int((t0 + 3 * DAY_MS / 1000) * 1000)}
    r = run_cli_here("produce", topic, "--producer-id", "no spaces", input="")
    assert r.returncode == 2 and "producer id 'no spaces'" in r.stderr, r.stderr


def test_produce_help_names_the_linger_and_the_producer_id() -> None:
    r = run_cli_here("produce", "--help")
    text = " ".join(r.stdout.split())
    assert "--linger" in text and "[env var: SHALE_MAX_LEDGER_AGE]" in text
    assert "--producer-id ID" in text and "skipped by position, not by content" in text
