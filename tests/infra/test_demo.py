"""``scripts/demo.sh --s3``: the demo on a real S3-compatible store (SeaweedFS) that the script
starts itself and stops when it ends, however it ends.

The script runs from the tree in the test's own environment (``SHALE_NO_VENV=1``: it makes
and installs nothing, and runs the ``python``, ``shale`` and ``compact`` of this
interpreter's environment, which holds the ``seaweedfs`` extra).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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


def test_demo_on_s3_stops_seaweedfs_when_interrupted(tmp_path: Path) -> None:
    data = tmp_path / "demo"
    proc = subprocess.Popen(["bash", str(DEMO), "--s3", str(data)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=_env(), start_new_session=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # SeaweedFS is up once the demo produces into it
            if line.startswith("== produce"):
                break
        else:
            raise AssertionError("the demo ended before it produced anything")
        assert any("weed" in c for c in _processes_naming(tmp_path))
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal: the whole foreground group
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    assert _processes_naming(tmp_path) == []
