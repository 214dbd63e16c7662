"""Holding a ``compact`` process just before it publishes, until the test opens a gate.

Races between processes are forced, not hoped for: a test starts ``compact`` through
:func:`start_held_compact`, waits until each process has reached the gate (or ended
without reaching it), then opens the gate — or kills the processes there.  The gate is
a folder: a held process creates ``<pid>.ready`` in it and waits for ``go`` to appear.
The hold is installed in the process from outside (the command itself is run unchanged),
by wrapping :meth:`shale.compactor.job.Compactor._publish`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

#: Waits for processes are bounded by this; reached only when something is broken.
GUARD_S = 300

_HELD_COMPACT = """
import os, runpy, sys, time
from pathlib import Path

from shale.compactor.job import Compactor

gate = Path(os.environ["SHALE_TEST_GATE"])
publish = Compactor._publish

def held(self, *args, **kwargs):
    (gate / f"{os.getpid()}.ready").touch()
    while not (gate / "go").exists():
        time.sleep(0.005)
    return publish(self, *args, **kwargs)

Compactor._publish = held
exe = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(exe, run_name="__main__")
"""


class Gate:
    """A gate in ``folder`` (created here) that held processes wait at."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True)
        self.folder = folder

    def reached(self, proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> bool:
        return (self.folder / f"{proc.pid}.ready").exists()

    def wait(self, procs: Sequence[subprocess.Popen[str] | subprocess.Popen[bytes]]) -> list[bool]:
        """Wait until every process has reached the gate or ended; which reached it."""
        deadline = time.monotonic() + GUARD_S
        while not all(self.reached(p) or p.poll() is not None for p in procs):
            assert time.monotonic() < deadline, "no process reached the gate"
            time.sleep(0.01)  # how often to look, not how long anything takes
        return [self.reached(p) for p in procs]

    def open(self) -> None:
        (self.folder / "go").touch()


def start_held_compact(gate: Gate, *args: str, output: int = subprocess.PIPE,
                       new_session: bool = False) -> subprocess.Popen[str]:
    """The ``compact`` console script with ``args``, held at ``gate`` before it publishes;
    its standard output and error go to ``output``."""
    exe = Path(sys.executable).parent / "compact"
    return subprocess.Popen([sys.executable, "-c", _HELD_COMPACT, str(exe), *args],
                            env={**os.environ, "SHALE_TEST_GATE": str(gate.folder)}, text=True,
                            stdout=output, stderr=output, start_new_session=new_session)
