"""The installed distribution claims one top-level import name, ``shale``.

The repository keeps the folders the design names at its top level (``ledger/``,
``metadata/``, ``compactor/``, ``reader/``); ``shale/`` links to them, so the wheel, the
editable install, mypy, import-linter and pytest all see one package tree,
``shale.ledger``, ``shale.compactor`` and so on. These tests build the wheel as a user's pip
would and install it into a bare folder.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERIC = ("ledger", "metadata", "compactor", "reader")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # No build isolation: the build requirements are in the dev extra, so no network.
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                           "--wheel-dir", str(out), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (built,) = out.glob("shale-*.whl")
    return built


def test_the_wheel_holds_only_the_shale_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/", 1)[0] for name in names}
    assert tops == {"shale", next(t for t in tops if t.endswith(".dist-info"))}
    for package in GENERIC:
        assert f"shale/{package}/__init__.py" in names
    assert any(n.startswith("shale/ledger/_kernels") and n.endswith(".so") for n in names)
    assert "shale/py.typed" in names
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "compact = shale.compactor.cli:main" in entry_points
    assert "shale = shale.cli:main" in entry_points


def test_installed_wheel_imports_as_shale_and_claims_no_generic_name(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                           "--target", str(target), str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in target.iterdir() if not p.name.endswith(".dist-info") and p.name != "bin") == [
        "shale"]
    probe = (
        "import importlib.util, shale.compactor.cli, shale.ledger.kernels as k, shale.reader\n"
        f"print(k.KERNELS, [importlib.util.find_spec(n) is not None for n in {GENERIC!r}])\n"
    )
    # -S: no .pth file runs, so the editable install's finder is not there; the path is the
    # bare install, then site-packages for the dependencies, and not the repository.
    path = [str(target), *site.getsitepackages()]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-S", "-c", f"import sys; sys.path[:0] = {path!r}\n" + probe],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["native", "[False,", "False,", "False,", "False]"]
