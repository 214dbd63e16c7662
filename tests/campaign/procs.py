"""Commands as processes of their own, without paying Python's start-up for each.

A command run by the campaign is a real process: :func:`run` forks it from a
``multiprocessing`` fork server that imported Shale once (a process with no other thread,
so a fork never copies a lock some thread held), and the child runs the console script's
own entry point (:func:`shale.cli.main`, :func:`shale.cli.compact_main`) with its standard
streams on files, and exits with its exit code.  Only the interpreter's start and the
imports are skipped: at a few seconds of CPU a command on a loaded 2-core machine, they
would be most of the campaign.  ``console=True`` runs the installed console script instead
(:func:`tests.conftest.run_cli`).
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
from multiprocessing.connection import wait
from multiprocessing.context import ForkServerContext
from pathlib import Path

__all__ = ["run"]

_LOCK = threading.RLock()
_CONTEXT: list[ForkServerContext] = []


def _context() -> ForkServerContext:
    with _LOCK:
        if not _CONTEXT:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(["tests.campaign._server"])
            _CONTEXT.append(ctx)
        return _CONTEXT[0]


def _child(script: str, args: list[str], env: dict[str, str], folder: str) -> None:
    """The command, in the forked child: the caller's environment, its standard streams on
    files in ``folder``."""
    os.environ.clear()
    os.environ.update(env)
    for fd, name, mode in ((0, "in", os.O_RDONLY), (1, "out", os.O_WRONLY), (2, "err", os.O_WRONLY)):
        f = os.open(os.path.join(folder, name), mode)
        os.dup2(f, fd)
        os.close(f)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 (multiprocessing set it to /dev/null)
    faulthandler.enable()  # a crash says where (as PYTHONFAULTHANDLER does for the console scripts)
    from shale.cli import compact_main, main

    code = compact_main(args) if script == "compact" else main(args)
    sys.stdout.flush()
    sys.stderr.flush()
    Path(folder, "code").write_text(str(code))  # (see run: the exit status may be lost on the way)
    sys.exit(code)


def run(*args: str, script: str = "shale", input: str | None = None,
        console: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``script args...`` as a process of its own; what it printed and its exit code."""
    if console:
        from tests.conftest import run_cli

        return run_cli(*args, input=input, script=script, env={"PYTHONFAULTHANDLER": "1"})
    with tempfile.TemporaryDirectory(prefix="shale-cmd-") as folder:
        Path(folder, "in").write_text(input or "", encoding="utf-8")
        Path(folder, "out").touch()
        Path(folder, "err").touch()
        p = _context().Process(target=_child, args=(script, list(args), dict(os.environ), folder))
        # multiprocessing reads a child's exit status in whichever thread polls first (a
        # start() polls every child), and a second reader then finds none: 255.  So
        # starting and joining go one thread at a time, and waiting for the end outside.
        with _LOCK:
            p.start()
        wait([p.sentinel])
        with _LOCK:
            p.join()
        out = Path(folder, "out").read_text(encoding="utf-8", errors="replace")
        err = Path(folder, "err").read_text(encoding="utf-8", errors="replace")
        said = Path(folder, "code")
        code = int(said.read_text()) if said.exists() else p.exitcode if p.exitcode is not None else -1
    return subprocess.CompletedProcess([script, *args], code, out, err)
