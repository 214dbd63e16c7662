"""Holding a ``compact`` process just before it publishes, until the test opens a gate.

Races between processes are forced, not hoped for: a test starts ``compact`` through
:func:`start_held_compact`, waits until each process has reached the gate (or ended
without reaching it), then opens the gate — or kills the processes there.  The gate is
a folder: a held process creates ``<pid>.ready`` in it and waits for ``go`` to appear.
The hold is installed in the process from outside (the command itself is run unchanged),
by wrapping :meth:`shale.compactor.job.Compactor._publish` (:func:`start_held` wraps
another function: ``shale rollback``'s swap, say).
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

_HELD = """
import importlib, os, runpy, sys, time
from pathlib import Path

gate = Path(os.environ["SHALE_TEST_GATE"])
at = int(os.environ.get("SHALE_TEST_HOLD_AT", "0"))  # hold only the call with this number (0: every call)
calls = [0]
module, _, name = os.environ["SHALE_TEST_HOLD"].partition(":")
owner = importlib.import_module(module)
*path, name = name.split(".")
for step in path:
    owner = getattr(owner, step)
original = getattr(owner, name)

def held(*args, **kwargs):
    calls[0] += 1
    if at and calls[0] != at:
        return original(*args, **kwargs)
    (gate / f"{os.getpid()}.ready").touch()
    while not (gate / "go").exists():
        time.sleep(0.005)
    return original(*args, **kwargs)

setattr(owner, name, held)
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
    return start_held(gate, "compact", "shale.compactor.job:Compactor._publish", *args, output=output,
                      new_session=new_session)


def start_held(gate: Gate, script: str, hold: str, *args: str, output: int = subprocess.PIPE,
               new_session: bool = False, at_call: int = 0) -> subprocess.Popen[str]:
    """The console script ``script`` with ``args``, held at ``gate`` whenever it calls
    ``hold`` (``module:attribute``, e.g. ``shale.maintenance.snapshots:_swapped``), or only
    at its ``at_call``-th call (from 1; 0: every call)."""
    exe = Path(sys.executable).parent / script
    return subprocess.Popen([sys.executable, "-c", _HELD, str(exe), *args],
                            env={**os.environ, "SHALE_TEST_GATE": str(gate.folder), "SHALE_TEST_HOLD": hold,
                                 "SHALE_TEST_HOLD_AT": str(at_call)},
                            text=True, stdout=output, stderr=output, start_new_session=new_session)
