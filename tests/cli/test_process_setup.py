"""The commands and the compactor set up their process before NumPy is imported: one
BLAS thread (Shale never calls BLAS; spinning BLAS threads would take a core from a run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads through /proc")


def _threads_after(module: str, **env: str) -> tuple[int, str]:
    """Threads of a fresh interpreter once ``module`` is imported, and the BLAS setting it ends with."""
    clean = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    code = (f"import os, {module}, numpy; "
            "print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'))")
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    return int(out[0]), out[1]


def _blas_threads_by_default() -> int:
    """Threads NumPy alone starts on this machine (1 where OpenBLAS runs single-threaded anyway)."""
    return _threads_after("json")[0]


@pytest.mark.parametrize("module", ["shale.compactor", "shale.compactor.cli", "shale.cli"])
def test_entry_points_keep_numpy_to_one_thread(module: str) -> None:
    threads, setting = _threads_after(module)
    assert (threads, setting) == (1, "1")


def test_a_setting_from_the_environment_is_kept() -> None:
    threads, setting = _threads_after("shale.compactor", OPENBLAS_NUM_THREADS="2")
    assert setting == "2"
    if (os.cpu_count() or 1) > 1:
        assert threads == 2  # OpenBLAS started the threads it was told to


def test_the_producer_library_leaves_numpy_alone() -> None:
    # TopicWriter is imported by applications that may use BLAS themselves.
    threads, setting = _threads_after("shale")
    assert setting == "None"
    assert threads == _blas_threads_by_default()


def test_the_producer_is_still_importable_from_the_package() -> None:
    import shale
    from shale.producer import TopicWriter

    assert shale.TopicWriter is TopicWriter
    with pytest.raises(AttributeError):
        _ = shale.NoSuchThing  # type: ignore[attr-defined]
