"""``scripts/demo.sh --s3``: the demo on a real S3-compatible store (SeaweedFS) that the script
starts itself and stops when it ends, however it ends.

The script runs from the tree in the test's own environment (``SHALE_NO_VENV=1``: it makes
and installs nothing, and runs the ``python``, ``shale`` and ``compact`` of this
interpreter's environment, which holds the ``seaweedfs`` extra).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "scripts" / "demo.sh"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["SHALE_NO_VENV"] = "1"
    return env


def _processes_naming(folder: Path) -> list[str]:
    """The command lines of the processes that name ``folder`` (SeaweedFS's data folder is
    under it, and its server and ``weed`` name it in their arguments)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        if str(folder) in cmdline:
            found.append(f"{proc.name}: {cmdline}")
    return found


def test_demo_on_s3_compacts_reads_back_verifies_and_stops_seaweedfs(tmp_path: Path) -> None:
    data = tmp_path / "demo"
    proc = subprocess.run(["bash", str(DEMO), "--s3", str(data)], capture_output=True, text=True,
                          env=_env(), timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, f"{out}\n{proc.stderr}"
    assert "s3://demo/users: compacted to horizon" in out
    # the compacted view read back: three records of the sample topic
    lines = out.splitlines()
    first = lines.index("== the compacted view, first 3 records")
    records = [json.loads(line) for line in lines[first + 1:first + 4]]
    assert all(r["key"].startswith("user-") and r["value"] for r in records)
    assert "s3://demo/users: ok: horizon" in out
    assert "missing 0, extra 0, stale 0" in out
    # SeaweedFS kept its data under the demo's folder, and is gone
    assert (data / "seaweedfs" / "weed.log").is_file()
    assert _processes_naming(tmp_path) == []


def _stop_leftovers(folder: Path) -> None:
    """After a failure: SIGTERM whatever still names ``folder`` (a server stops its weed)."""
    for found in _processes_naming(folder):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(found.split(":", 1)[0]), signal.SIGTERM)


#: Stand-ins for the demo's commands: each says it started and sleeps (``shale``, fed by
#: the sample records, first takes a byte of them, so the pipe is flowing).
_STAND_INS = {"compact": 'echo "compact: started"\nexec sleep 600\n',
              "shale": 'head -c 1 >/dev/null\necho "shale: started"\nexec sleep 600\n'}


def _demo_waiting_in_compact(tmp_path: Path, command: str = "compact") -> tuple[subprocess.Popen[str], list[str]]:
    """``demo.sh --s3`` started in a process group of its own, once it waits for its first
    ``compact`` (or ``shale``, the first being the ``produce`` fed by the sample records):
    a stand-in that says so and sleeps, so that a signal finds the script waiting for a
    command, as Ctrl-C does in a long step (not between two commands)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / command).write_text(f"#!/bin/sh\n{_STAND_INS[command]}")
    (bin_dir / command).chmod(0o755)
    env = _env()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    proc = subprocess.Popen(["bash", str(DEMO), "--s3", str(tmp_path / "demo")], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    seen: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(f"{command}: started"):
            break
    else:
        proc.wait(timeout=60)
        raise AssertionError(f"the demo ended before it ran {command}: {''.join(seen)}")
    running = _processes_naming(tmp_path / "demo")
    assert any("weed" in c for c in running), running
    return proc, seen


def test_demo_on_s3_stops_seaweedfs_when_interrupted(tmp_path: Path) -> None:
    proc, seen = _demo_waiting_in_compact(tmp_path)
    try:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal: the whole foreground group
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            _stop_leftovers(tmp_path / "demo")
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, f"{''.join(seen)}{out}"
    assert _processes_naming(tmp_path / "demo") == [], f"{''.join(seen)}{out}"


def test_ctrl_c_while_the_demo_produces_prints_no_traceback(tmp_path: Path) -> None:
    """Ctrl-C reaches the sample records' writer too, in the middle of a write to a pipe
    whose reader is going: the demo ends with 130 and one line, no Python traceback nor a
    broken pipe's complaint."""
    proc, seen = _demo_waiting_in_compact(tmp_path, "shale")
    try:
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            _stop_leftovers(tmp_path / "demo")
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, f"{''.join(seen)}{out}"
    for word in ("Traceback", "Error", "Exception", "lost sys.stderr"):
        assert word not in out, out
    assert _processes_naming(tmp_path / "demo") == [], f"{''.join(seen)}{out}"


def test_demo_help_says_how_to_run_it_and_does_nothing_else(tmp_path: Path) -> None:
    for flag in ("--help", "-h"):
        r = subprocess.run(["bash", str(DEMO), flag], capture_output=True, text=True, env=_env(), timeout=60,
                           cwd=tmp_path)
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert r.stdout.startswith("usage: scripts/demo.sh [--s3] [DIR]\n") and "--s3" in r.stdout
    for args in (["--bogus"], ["a", "b"], ["--s3", "--nope"]):
        r = subprocess.run(["bash", str(DEMO), *args], capture_output=True, text=True, env=_env(), timeout=60,
                           cwd=tmp_path)
        assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
        assert "scripts/demo.sh --help" in r.stderr
    assert list(tmp_path.iterdir()) == [] and not (ROOT / "--help").exists() and not (ROOT / "-h").exists()


def test_seaweedfs_stops_when_the_demo_is_killed_outright(tmp_path: Path) -> None:
    """SIGKILL leaves the script no trap to run: the server notices that its parent is gone."""
    proc, _ = _demo_waiting_in_compact(tmp_path)
    try:
        proc.kill()
        proc.wait(timeout=60)
        deadline = time.monotonic() + 120  # generous: only a server that never stops fails
        while _processes_naming(tmp_path / "demo") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _processes_naming(tmp_path / "demo") == []
    finally:
        _stop_leftovers(tmp_path / "demo")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the stand-in compact, left behind by the killed shell
