"""Without a compiler a user silently got the NumPy fallbacks, at many times the CPU: now
the first fallback to load says so in one line naming every extension not built (nothing
when ``SHALE_KERNELS=numpy`` asks for them), and the CI run (scripts/test.sh) stops before
testing the fallbacks in the kernels' place (scripts/check_native.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# An interpreter in which the named extensions cannot be imported, as where they were not built.
_BLOCK = """
import importlib.abc, sys
BLOCKED = {blocked!r}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}")
sys.meta_path.insert(0, Block())
"""


def _run(blocked: list[str], code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    full = _BLOCK.format(blocked=[f"shale.ledger.{b}" for b in blocked]) + code
    environ = {k: v for k, v in os.environ.items() if k != "SHALE_KERNELS"}
    return subprocess.run([sys.executable, "-c", full], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**environ, **(env or {})})


_USE_ALL = ("import shale.ledger.kernels as k, shale.ledger.encoder as e, shale.producer.jsonl_ingest as j\n"
            "print(k.KERNELS, e.ENCODER, j.SCANNER)")


@pytest.mark.parametrize("blocked", [["_kernels"], ["_kernels", "_encoder", "_jsonl"], ["_jsonl"]])
def test_one_line_names_what_was_not_built(blocked: list[str]) -> None:
    res = _run(blocked, _USE_ALL)
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("shale: warning: the C extension")
    for name in ("_kernels", "_encoder", "_jsonl"):
        assert (f"{name} (ledger/{name}.c)" in lines[0]) == (name in blocked)
    assert res.stdout.split() == ["numpy" if "_kernels" in blocked else "native",
                                  "python" if "_encoder" in blocked else "native",
                                  "python" if "_jsonl" in blocked else "native"]


def test_the_fallbacks_asked_for_say_nothing() -> None:
    res = _run([], _USE_ALL, {"SHALE_KERNELS": "numpy"})
    assert (res.returncode, res.stderr, res.stdout.split()) == (0, "", ["numpy", "python", "python"])
    built = _run([], _USE_ALL)
    assert (built.returncode, built.stderr, built.stdout.split()) == (0, "", ["native"] * 3)


def test_the_ci_run_fails_when_an_extension_fell_back() -> None:
    check = "import runpy\nrunpy.run_path('scripts/check_native.py', run_name='__main__')\n"
    res = _run(["_encoder"], check)
    assert res.returncode == 1
    assert "scripts/check_native.py: not built" in res.stderr
    assert "shale.ledger._encoder (ledger/_encoder.c" in res.stderr
    assert _run([], check).returncode == 0
    steps = (ROOT / "scripts" / "test.sh").read_text()
    assert "python scripts/check_native.py" in steps.split("exec python -m pytest")[0]
