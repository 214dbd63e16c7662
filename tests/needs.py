"""What a test needs from the machine: a program, a privilege, a kernel feature, an
optional package, a C extension.  Asked one way everywhere: where it is missing, the test
is skipped with a message naming what is missing and how to get it; under ``CI=true`` it
fails with that message instead.  The test command (scripts/test.sh, scripts/_system.sh)
installs what CI needs, so in CI a skip would only hide a test that stopped running.

Skips that are choices, not lacks, stay plain ``skipif``/``skip`` and name the variable
that makes the choice: the long campaigns behind ``SHALE_LONG_TESTS=1``, the C
extensions' own tests when ``SHALE_KERNELS=numpy`` asks for the fallbacks.
``tests/test_needs.py`` holds every other skip in tests/ to this.

A test marked ``@needs(check)`` asks ``check()`` when it is set up (tests/conftest.py's
``pytest_runtest_setup``): None means nothing is missing, a string says what is.
"""

from __future__ import annotations

import importlib
import os
import shutil
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import pytest

__all__ = ["BUILD_HOW", "EXTRAS_HOW", "HOW", "c_extension", "check_needs", "in_ci", "missing", "need",
           "need_c_extension", "need_module", "need_program", "needs", "program", "without_root_privileges"]

#: Where the programs the tests run come from (what a skip or a failure tells the reader).
HOW = {
    "kubectl": "kubectl 1.21 or later, for its built-in kustomize, from the Kubernetes project's packages; "
               "Debian's kubernetes-client, 1.20, renders no kustomize components",
    "promtool": "the Debian package prometheus, which scripts/_system.sh installs as root",
    "setpriv": "from the Debian package util-linux",
}

#: What installs the optional packages the tests import.
EXTRAS_HOW = "pip install -e '.[dev,s3,spark,arrow,seaweedfs,iceberg]', which scripts/test.sh does"

#: What builds the C extensions.
BUILD_HOW = ("a C compiler and Python's headers (gcc, Debian's python3-dev) when Shale is installed: "
             "pip install -e . builds them")


def in_ci() -> bool:
    """Whether this run is CI's (``CI`` set to true, 1 or yes, as CI services set it)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


def missing(why: str) -> NoReturn:
    """Skip the test for ``why`` (what is missing, how to get it); under ``CI=true`` fail it.
    At a module's top level it skips, or fails, the whole module."""
    if in_ci():
        pytest.fail(f"{why} [CI=true: what a test needs must be there, a skip would hide it]", pytrace=False)
    pytest.skip(why, allow_module_level=True)


def need(why: str | None) -> None:
    """:func:`missing` when ``why`` says something is (None or "": nothing is)."""
    if why:
        missing(why)


def program(name: str, how: str | None = None) -> Callable[[], str | None]:
    """A check for :func:`needs`: ``name`` on the PATH (``how``: where it comes from,
    :data:`HOW`'s word by default)."""
    def check() -> str | None:
        if shutil.which(name) is not None:
            return None
        return f"{name} is not on the PATH ({how or HOW[name]})"
    return check


def need_program(name: str, how: str | None = None) -> str:
    """The path of program ``name``, or :func:`missing` it."""
    need(program(name, how)())
    path = shutil.which(name)
    assert path is not None
    return path


def need_module(name: str) -> Any:
    """The module ``name`` imported (an optional package: pyarrow, pyspark, duckdb...), or
    :func:`missing` it: ``pytest.importorskip`` that fails in CI."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        missing(f"the Python module {name} cannot be imported ({e}): {EXTRAS_HOW}")


def need_c_extension(module: object | None, source: str) -> None:
    """The C extension built from ``source`` (``module``: what ``load_native`` gave, None
    when it is not in use), or :func:`missing` it.  Skipped in CI too when
    ``SHALE_KERNELS=numpy`` asks for the fallbacks: a choice, not a lack."""
    if module is not None:
        return
    if os.environ.get("SHALE_KERNELS", "").strip().lower() in ("numpy", "python"):
        pytest.skip(f"SHALE_KERNELS={os.environ['SHALE_KERNELS']} asks for the fallbacks: {source} is not used")
    missing(f"the C extension built from {source} is not in use: it needs {BUILD_HOW}")


def c_extension(module: object | None, source: str) -> Callable[[], str | None]:
    """A check for :func:`needs`: :func:`need_c_extension` when the test is set up."""
    def check() -> None:
        need_c_extension(module, source)
    return check


def needs(check: Callable[[], str | None]) -> pytest.MarkDecorator:
    """A mark: the test runs when ``check()`` answers None, and is :func:`missing` what it
    says otherwise; asked when the test is set up, before its fixtures."""
    return pytest.mark.needs.with_args(check)  # (called with a function alone, a mark would mark it)


def check_needs(item: pytest.Item) -> None:
    """Ask every ``needs`` mark of ``item`` (tests/conftest.py calls this at set-up)."""
    for mark in item.iter_markers("needs"):
        need(mark.args[0]())


def without_root_privileges(argv: Sequence[str]) -> list[str]:
    """``argv`` run without root's power over files: as root, through ``setpriv`` with
    every capability dropped (effective, inheritable, ambient and the bounding set, so
    that the command cannot get them back when it starts), so a file or folder its mode
    refuses really is refused (EACCES) as it would be to any other user.  The user stays
    root: the interpreter, the checkout and the test's temporary folder, all root's, stay
    reachable through their owner's bits.  Not as root: ``argv`` as it is."""
    if os.geteuid() != 0:
        return list(argv)
    setpriv = need_program("setpriv")
    return [setpriv, "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--", *argv]
