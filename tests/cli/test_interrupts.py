"""Ctrl-C, for real: the console scripts run as processes and get a real SIGINT, sent
once the process is provably where the test wants it (a line it printed, an object it
wrote, a request it made), never after a sleep.

The first interrupt stops a command within moments, removing what it wrote; ``produce``
says what it appended before it; an interrupt while the command's modules load is one
line; and once ``compact`` has printed its outcome an interrupt no longer changes it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from shale.runtime.throttle import Throttle
from tests.conftest import ROOT

#: Far below how long the throttled runs below would take (ten minutes and more), far
#: above what stopping takes on the slowest machine.
BOUND_S = 60


_STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _reap() -> Iterator[None]:
    """A process a failed test left running (one that ignored its interrupt) is killed,
    its pass-two workers with it."""
    yield
    while _STARTED:
        p = _STARTED.pop()
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()


def start(*args: str, script: str = "shale", env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """A console script as a real process in a process group of its own (as a terminal's
    foreground job is), its standard streams piped."""
    exe = Path(sys.executable).parent / script
    cmd = [str(exe), *args] if exe.exists() else [sys.executable, "-m",
                                                   "shale.cli" if script == "shale" else "shale.compactor.cli", *args]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, **(env or {})}, cwd=ROOT, start_new_session=True)
    _STARTED.append(p)
    return p


def interrupt(p: subprocess.Popen[str], group: bool = False) -> None:
    """Ctrl-C: to the whole process group as a terminal sends it, or to the process alone."""
    if group:
        os.killpg(p.pid, signal.SIGINT)
    else:
        p.send_signal(signal.SIGINT)


def wait_for(p: subprocess.Popen[str], found: Callable[[], bool]) -> None:
    """Wait until ``found()`` is true (a file appeared, a ledger was registered), failing
    if the process ends first."""
    while not found():
        assert p.poll() is None, (p.returncode, p.communicate())
        time.sleep(0.02)  # how often to look, not how long anything takes


# ------------------------------------------------------------ a throttled compaction


def _big_topic(uri: str, records: int) -> None:
    """``records`` of 1 KB each, stored uncompressed, every key once: pass two copies them all."""
    with TopicWriter(uri, compression="none", max_ledger_bytes=8 << 20) as w:
        value = "x" * 1000
        for i in range(records):
            w.append(f"k{i:07d}", value)


def _files(folder: Path) -> list[Path]:
    return [f for f in folder.rglob("*") if f.is_file()] if folder.exists() else []


@pytest.mark.parametrize("workers, records, group", [
    (1, 42_000, True),  # one process: 42 MB at 64 KiB/s would take eleven minutes
    (1, 42_000, False),
    (2, 70_000, False),  # forked pass-two workers (more than 64 MiB to copy), told by their parent
])
def test_ctrl_c_stops_a_throttled_compaction_at_once_and_removes_its_output(
        tmp_path: Path, workers: int, records: int, group: bool) -> None:
    uri = str(tmp_path / "t")
    _big_topic(uri, records)
    p = start(uri, "--max-write-bytes-per-second", "64KiB", "--workers", str(workers), script="compact")
    compacted = tmp_path / "t" / "compacted"
    # a part is being written: its writes are waiting on the throttle
    wait_for(p, lambda: any(f.name.startswith(".shale-tmp-") and f.stat().st_size > 0 for f in _files(compacted)))
    interrupt(p, group)
    out, err = p.communicate(timeout=BOUND_S)
    assert p.returncode == 130, (p.returncode, err)
    assert err == "compact: interrupted\n" and out == ""
    assert _files(compacted) == []  # what the run wrote is gone
    assert TopicMetadata.open(uri).load_compaction().version == 0  # and nothing was published


def test_throttle_cancel_ends_a_wait_of_days() -> None:
    t = Throttle(64 << 10)
    done = threading.Event()

    def move() -> None:
        t(10 << 30)  # ten GiB at 64 KiB/s: almost two days
        done.set()

    thread = threading.Thread(target=move, daemon=True)
    thread.start()
    t.cancel()
    assert done.wait(BOUND_S)
    t(10 << 30)  # cancelled: no more waits either


# ------------------------------------------------------------------------- produce


def test_ctrl_c_during_produce_keeps_and_names_what_was_appended(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    p = start("produce", uri, "--max-ledger-records", "2")
    assert p.stdin is not None
    for i in range(5):  # two ledgers sealed, and one record in the third
        p.stdin.write(json.dumps({"key": f"k{i}", "value": f"v{i}"}) + "\n")
    p.stdin.flush()
    meta = TopicMetadata.open(uri)
    wait_for(p, lambda: meta.exists() and len(meta.load_topic().ledgers) == 2)
    interrupt(p)  # while it waits for more input, or reads the fifth record
    out, err = p.communicate(timeout=BOUND_S)
    assert out == ""
    assert p.returncode == 130, err
    # Whether the fifth record was read before the interrupt is the process's business;
    # what it says must be exactly what the topic holds, and nothing read may be lost.
    got = re.fullmatch(r"shale: interrupted: (\d) records were appended in (\d) ledgers, last id (\S+)\n", err)
    assert got is not None, err
    read = list(TopicReader(uri))
    assert [m.value for m in read] == [f"v{i}".encode() for i in range(len(read))] and len(read) in (4, 5)
    assert (int(got[1]), int(got[2]), got[3]) == (len(read), len(meta.load_topic().ledgers), str(read[-1].id))


# ---------------------------------------------------------- while the modules load

_STALL = '''
import os, sys, time
class _Stall:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ.get("STALL_IMPORT_OF"):
            sys.stderr.write("stalled\\n")
            sys.stderr.flush()
            while True:
                time.sleep(3600)  # until interrupted
        return None
sys.meta_path.insert(0, _Stall())
'''


@pytest.mark.parametrize("script, module, run", [
    ("shale", "shale.cli.app", False),  # while the command line's own modules are imported
    ("shale", "shale.settings.model", False),  # while shale's main builds its commands
    ("compact", "shale.settings.model", False),
    ("compact", "numpy", True),  # (imported once a run starts: --help needs no NumPy)
])
def test_ctrl_c_while_the_command_loads_is_one_line(tmp_path: Path, script: str, module: str, run: bool) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(_STALL)
    path = os.pathsep.join(x for x in (str(hooks), os.environ.get("PYTHONPATH", "")) if x)
    p = start(str(tmp_path / "t") if run else "--help", script=script,
              env={"PYTHONPATH": path, "STALL_IMPORT_OF": module})
    assert p.stderr is not None
    assert p.stderr.readline() == "stalled\n"
    interrupt(p)
    out, err = p.communicate(timeout=BOUND_S)
    assert p.returncode == 130, err
    assert err == f"{script}: interrupted\n" and out == ""


# ------------------------------------------------------- after the outcome is printed


class _SlowGateway(BaseHTTPRequestHandler):
    """A Pushgateway that holds each push until the test lets it go."""

    pushed: threading.Event
    answer: threading.Event

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.pushed.set()
        self.answer.wait(BOUND_S)
        self.send_response(200)
        self.end_headers()

    do_PUT = do_POST

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def slow_gateway() -> Iterator[tuple[str, threading.Event, threading.Event]]:
    pushed, answer = threading.Event(), threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("G", (_SlowGateway,), {"pushed": pushed, "answer": answer}))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", pushed, answer
    finally:
        answer.set()
        server.shutdown()
        server.server_close()


def test_an_interrupt_after_the_summary_does_not_change_the_outcome(
        tmp_path: Path, slow_gateway: tuple[str, threading.Event, threading.Event]) -> None:
    url, pushed, answer = slow_gateway
    uri = str(tmp_path / "t")
    with TopicWriter(uri) as w:
        for i in range(100):
            w.append(f"k{i % 10}", f"v{i}")
    p = start(uri, "--json", "--pushgateway", url, script="compact")
    assert pushed.wait(BOUND_S)  # the summary is printed and published; the metrics are on their way
    interrupt(p)
    answer.set()
    out, err = p.communicate(timeout=BOUND_S)
    assert p.returncode == 0, err
    assert json.loads(out)["status"] == "compacted" and err == ""
    assert TopicMetadata.open(uri).load_compaction().version == 1
