"""The commands and the compactor set up their process before NumPy is imported: one
BLAS thread (Shale never calls BLAS; spinning BLAS threads would take a core from a run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.needs import needs

ROOT = Path(__file__).resolve().parents[2]

pytestmark = needs(lambda: None if Path("/proc/self/task").is_dir() else "no /proc/self/task (Linux) to count threads")


def _threads_after(code: str, **env: str) -> tuple[int, str]:
    """Threads of a fresh interpreter once ``code`` ran and NumPy is imported, and the BLAS
    setting it ends with."""
    clean = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    code = (f"import os, sys\n{code}\nimport numpy\n"
            "print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'))")
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.splitlines()[-1].split()
    return int(out[0]), out[1]


def _blas_threads_by_default() -> int:
    """Threads NumPy alone starts on this machine (1 where OpenBLAS runs single-threaded anyway)."""
    return _threads_after("import json")[0]


# What the console scripts run (pyproject.toml [project.scripts]): their main(), as the
# installed script calls it.
COMMANDS = ["shale.cli", "shale.compactor.cli"]


@pytest.mark.parametrize("module", COMMANDS)
def test_the_commands_keep_numpy_to_one_thread(module: str) -> None:
    threads, setting = _threads_after(f"from {module} import main\nmain(['--help'])")
    assert (threads, setting) == (1, "1")


def test_a_setting_from_the_environment_is_kept() -> None:
    threads, setting = _threads_after("from shale.compactor.cli import main\nmain(['--help'])",
                                      OPENBLAS_NUM_THREADS="2")
    assert setting == "2"
    if (os.cpu_count() or 1) > 1:
        assert threads == 2  # OpenBLAS started the threads it was told to


@pytest.mark.parametrize("module", ["shale", "shale.compactor", *COMMANDS])
def test_importing_shale_leaves_numpy_alone(module: str) -> None:
    # Applications that embed Shale (the producer, the reader, the compactor's API) may
    # use BLAS themselves: only a command, as it starts, chooses for its process.
    threads, setting = _threads_after(f"import {module}")
    assert setting == "None"
    assert threads == _blas_threads_by_default()


def test_the_producer_is_still_importable_from_the_package() -> None:
    import shale
    from shale.producer import TopicWriter

    assert shale.TopicWriter is TopicWriter
    with pytest.raises(AttributeError):
        _ = shale.NoSuchThing  # type: ignore[attr-defined]
