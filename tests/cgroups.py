"""Run a command under a memory limit, in a cgroup (v1) made for it, as a Kubernetes
memory limit would: the kernel kills it (SIGKILL) when what it holds, anonymous memory
and the file pages it cannot give back, outgrows the limit.  Clean page cache counts
too but is reclaimed first, so the parent-side peak RSS (``ru_maxrss``) says how close
the command came.

Needs root and the cgroup v1 memory controller mounted at /sys/fs/cgroup/memory
(:func:`cgroup_unavailable` says why not: a test marked with it through
:func:`tests.needs.needs` is skipped then, but fails in CI)."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

MEMORY_ROOT = Path("/sys/fs/cgroup/memory")


@dataclass(frozen=True, slots=True)
class LimitedRun:
    """How a command ran under the limit."""

    exit_code: int  # the exit status, or minus the signal that ended it
    peak_rss: int  # bytes: the largest resident set of the command and its children (ru_maxrss)
    failcnt: int  # times the cgroup's usage hit the limit (the kernel reclaimed then)
    oom_kills: int  # processes the kernel killed for memory (-1: the kernel does not say)
    stdout: str
    stderr: str

    @property
    def oom_killed(self) -> bool:
        return self.oom_kills > 0 or self.exit_code == -signal.SIGKILL


@functools.cache
def cgroup_unavailable() -> str:
    """Why a memory cgroup cannot be made here ("" when it can; asked once)."""
    if os.geteuid() != 0:
        return "making a memory cgroup needs root"
    if not (MEMORY_ROOT / "memory.limit_in_bytes").exists():
        return f"no cgroup v1 memory controller at {MEMORY_ROOT}"
    probe = MEMORY_ROOT / f"shale-probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as e:
        return f"cannot make a memory cgroup: {e}"
    return ""


#: Runs a command and writes its peak resident set size (kB) and exit code to a file.  A
#: process counts the pages of the one it was forked from in its own peak, even after
#: it execs: the command is started from this small process, not from the test's.
_MEASURE = ("import os, subprocess, sys; c = subprocess.Popen(sys.argv[2:]); _, s, u = os.wait4(c.pid, 0); "
            "open(sys.argv[1], 'w').write(f'{u.ru_maxrss} {os.waitstatus_to_exitcode(s)}')")


def run_limited(argv: list[str], limit: int, env: dict[str, str] | None = None,
                cwd: str | None = None) -> LimitedRun:
    """Run ``argv`` in a new memory cgroup limited to ``limit`` bytes (swap included, so
    nothing escapes to swap), wait for it and remove the cgroup."""
    group = MEMORY_ROOT / f"shale-test-{uuid.uuid4().hex[:12]}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(limit))
        with contextlib.suppress(FileNotFoundError):  # (no swap accounting: nothing to limit)
            (group / "memory.memsw.limit_in_bytes").write_text(str(limit))
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "peak"
            # the shell moves itself into the group, then becomes the measuring process:
            # everything the command allocates, and every process it forks, is charged
            # to the group
            wrapper = ["/bin/sh", "-c", f'echo $$ > {group / "cgroup.procs"} && exec "$@"', "sh",
                       sys.executable, "-c", _MEASURE, str(report), *argv]
            done = subprocess.run(wrapper, env=env, cwd=cwd, capture_output=True, text=True)
            peak_kb, code = (map(int, report.read_text().split()) if report.exists()
                             else (0, done.returncode))
        failcnt = int((group / "memory.failcnt").read_text())
        oom = {k: int(v) for k, v in (line.split() for line in (group / "memory.oom_control").read_text().splitlines())}
        return LimitedRun(code, peak_kb * 1024, failcnt, oom.get("oom_kill", -1), done.stdout, done.stderr)
    finally:
        _remove(group)


def _remove(group: Path) -> None:
    """Remove the cgroup once the processes in it are gone."""
    procs = (group / "cgroup.procs").read_text().split() if group.exists() else []
    for pid in procs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)  # (only what this test started is in it)
    for _ in range(100):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)
    group.rmdir()
