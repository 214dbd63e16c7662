"""What a test needs from the machine is asked one way (tests/needs.py): missing, the test
is skipped, and under ``CI=true`` failed, with a message naming what is missing and how to
get it.  Every other skip in tests/ is a choice that names the variable making it
(``SHALE_LONG_TESTS``, ``SHALE_KERNELS``); the check below reads every test file for
skips, so one that merely hides a lack cannot come back unnoticed."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.needs import missing, need, need_module, need_program, program

ROOT = Path(__file__).resolve().parent.parent
#: what a skip may be about when it does not go through tests/needs.py: a choice
CHOICES = ("SHALE_LONG_TESTS", "SHALE_KERNELS")
SKIPS = frozenset({"skip", "skipif", "importorskip", "SkipTest"})


def _name(node: ast.AST) -> str:
    """The dotted name ``node`` spells (``pytest.mark.skipif``), or ""."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _name(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def _is_skip(name: str) -> bool:
    """Whether ``name`` is a skip of pytest's or unittest's (``view.skip`` is Shale's own)."""
    owner, _, last = name.rpartition(".")
    return last in SKIPS and owner.split(".")[0] in ("", "pytest", "unittest")


def unchosen_skips(files: list[Path], root: Path = ROOT) -> list[str]:
    """A line per skip in ``files`` whose source names none of :data:`CHOICES`: a call of
    pytest's (or unittest's) ``skip``, ``skipif``, ``importorskip`` or ``SkipTest``, or a
    skip mark given uncalled (``marks=pytest.mark.skip``)."""
    found = []
    for path in files:
        text = path.read_text()
        tree = ast.parse(text)
        called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = _name(node.func)
            elif isinstance(node, ast.Attribute) and id(node) not in called:
                name = _name(node) if _name(node).startswith("pytest.mark.") else ""
            else:
                continue
            if not _is_skip(name):
                continue
            source = ast.get_source_segment(text, node) or ""
            if not any(choice in source for choice in CHOICES):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {name} is no choice: what a test "
                             "lacks goes through tests/needs.py, which fails the test under CI=true")
    return sorted(found, key=lambda line: (line.split(":")[0], int(line.split(":")[1])))


def test_every_skip_in_the_tests_is_a_choice() -> None:
    files = [p for p in sorted((ROOT / "tests").rglob("*.py")) if p != ROOT / "tests" / "needs.py"]
    assert len(files) > 100
    assert unchosen_skips(files) == []


def test_a_skip_that_hides_a_lack_is_reported(tmp_path: Path) -> None:
    scratch = tmp_path / "test_scratch.py"
    scratch.write_text(
        "import pytest, shutil\n"
        "LONG = False\n"
        "@pytest.mark.skipif(shutil.which('kubectl') is None, reason='no kubectl')\n"
        "def test_a(): pytest.skip('no root')\n"
        "pa = pytest.importorskip('pyarrow')\n"
        "@pytest.mark.skipif(not LONG, reason='a minute: SHALE_LONG_TESTS=1 runs it')\n"
        "def test_b(): pytest.skip('SHALE_KERNELS=numpy asks for the fallbacks')\n"
        "p = pytest.param(1, marks=pytest.mark.skip)\n"
        "view.skip(3)\n")
    assert [line.split(": ")[0] for line in unchosen_skips([scratch], tmp_path)] == \
        ["test_scratch.py:3", "test_scratch.py:4", "test_scratch.py:5", "test_scratch.py:8"]


def test_what_is_missing_skips_and_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"^no-such-program is not on the PATH \(get it there\)$"):
        need_program("no-such-program", "get it there")
    with pytest.raises(pytest.skip.Exception, match="cannot be imported"):
        need_module("no_such_module_of_shale")
    need(None)
    need("")
    assert program("sh", "a POSIX system")() is None
    for truth in ("true", "1", "TRUE", "yes"):
        monkeypatch.setenv("CI", truth)
        with pytest.raises(pytest.fail.Exception, match=r"^what \(how\) \[CI=true: .*a skip would hide it\]$"):
            missing("what (how)")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        missing("what")


def _run_without(program_name: str, test: str, ci: bool) -> subprocess.CompletedProcess[str]:
    """pytest on ``test`` in a process whose PATH lacks every folder holding ``program_name``."""
    path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not (Path(d) / program_name).exists())
    env = {k: v for k, v in os.environ.items() if k != "CI"} | {"PATH": path} | ({"CI": "true"} if ci else {})
    return subprocess.run([sys.executable, "-m", "pytest", test, "-q", "-rsE", "-p", "no:cacheprovider"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


def test_a_test_whose_program_is_hidden_is_skipped_and_fails_under_ci() -> None:
    """A real test of the suite, kubectl hidden from its PATH: skipped saying what is
    missing and where it comes from; under CI=true an error, saying the same."""
    test = "tests/infra/test_monitoring.py::test_the_readmes_patches_label_the_rules_and_change_a_threshold"
    says = "kubectl is not on the PATH (kubectl 1.21 or later, for its built-in kustomize"
    skipped = _run_without("kubectl", test, ci=False)
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout + skipped.stderr
    assert says in skipped.stdout
    failed = _run_without("kubectl", test, ci=True)
    assert failed.returncode == 1 and "1 error" in failed.stdout, failed.stdout + failed.stderr
    assert says in failed.stdout and "[CI=true: " in failed.stdout
