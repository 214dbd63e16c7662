"""scripts/_venv.sh reinstalls (and so rebuilds the C kernels) whenever anything the build
compiles changes: its hash (scripts/_install_hash.sh) covers pyproject.toml, setup.py and
every C source and header, a new one included."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _hash(root: Path) -> str:
    return subprocess.run(["bash", "-c", 'set -euo pipefail; source "$1"; install_hash "$2"', "-",
                           str(ROOT / "scripts" / "_install_hash.sh"), str(root)],
                          capture_output=True, text=True, check=True).stdout.strip()


def _built_from() -> list[str]:
    """pyproject.toml, each extension's sources, and every header in its include folders."""
    extensions = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["ext-modules"]
    files = {"pyproject.toml"}
    for ext in extensions:
        files.update(ext["sources"])
        for folder in ext.get("include-dirs", []):
            files.update(p.relative_to(ROOT).as_posix() for p in (ROOT / folder).rglob("*.h"))
    return sorted(files)


def test_venv_script_hashes_with_install_hash() -> None:
    script = (ROOT / "scripts" / "_venv.sh").read_text()
    assert 'source "$ROOT/scripts/_install_hash.sh"' in script
    assert 'hash="$(install_hash "$ROOT")"' in script


def test_any_change_to_what_the_build_compiles_changes_the_hash(tmp_path: Path) -> None:
    files = _built_from()
    assert {"ledger/_kernels.c", "ledger/_encoder.c", "ledger/vendor/xxhash.h"} <= set(files)
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / name, tmp_path / name)
    base = _hash(tmp_path)
    for name in files:
        original = (tmp_path / name).read_bytes()
        (tmp_path / name).write_bytes(original + b"\n")
        assert _hash(tmp_path) != base, f"a change to {name} leaves the install hash as it was"
        (tmp_path / name).write_bytes(original)
    assert _hash(tmp_path) == base
    # a new source or header, and a setup.py, count too
    for new in ("ledger/_new.c", "ledger/vendor/new.h", "setup.py"):
        (tmp_path / new).write_text("")
        assert _hash(tmp_path) != base, f"a new {new} leaves the install hash as it was"
        (tmp_path / new).unlink()
