"""A pytest plugin (``-p tests.kernel_calls``) that records which functions of the C
extensions the tests call, and fails a run that leaves one of them uncalled, naming it.

scripts/sanitize.sh runs the tests marked ``kernels`` under ASan and UBSan with it: the
marker is the selection, and this is what keeps the selection whole — a kernel added to
an extension, or a marked test that stopped reaching one, fails the run instead of going
untested under the sanitizers.  Each function is wrapped in place on its module (the
callers look it up there at every call), so nothing else changes."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Final

import pytest

EXTENSIONS: Final = ("shale.ledger._kernels", "shale.ledger._encoder", "shale.ledger._jsonl")

_called: set[str] = set()
_watched: list[str] = []


def _wrapped(full: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        _called.add(full)
        return real(*args, **kwargs)

    call.__wrapped__ = real  # type: ignore[attr-defined]
    return call


def watch(modules: tuple[str, ...] = EXTENSIONS) -> list[str]:
    """Wrap every public function of ``modules`` (the CRC ones only where the hardware CRC
    is what the kernels use); the names watched."""
    for name in modules:
        module = importlib.import_module(name)
        for attr in sorted(dir(module)):
            real = getattr(module, attr)
            if attr.startswith("_") or not callable(real) or hasattr(real, "__wrapped__"):
                continue
            if attr.startswith(("crc32c", "check_frames")) and not getattr(module, "HARDWARE_CRC", True):
                continue  # (without the CPU's CRC instruction the kernels leave CRCs to the crc32c package)
            full = f"{name}.{attr}"
            setattr(module, attr, _wrapped(full, real))
            _watched.append(full)
    return list(_watched)


def uncalled() -> list[str]:
    """The watched functions no test has called yet."""
    return [n for n in _watched if n not in _called]


def pytest_configure(config: pytest.Config) -> None:
    watch()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if exitstatus == 0 and (missing := uncalled()):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        names = ", ".join(missing)
        session.config.get_terminal_writer().line(
            f"tests.kernel_calls: no test marked kernels called {names}: mark a test that does (pytest.mark.kernels)",
            red=True)
