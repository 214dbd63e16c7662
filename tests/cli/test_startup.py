"""A command imports what it runs and no more: the import budget of each kind of command,
counted in modules (never timed), and how a command's process ends.

``--help`` and a command line's parsing import neither NumPy nor any codec; a command
that reads only a topic's metadata (``shale config``, ``shale snapshots``) imports no
NumPy; none imports pyarrow, boto3, PySpark, pandas or ``importlib.metadata`` (with the
``email`` package under it) unless its work needs them, nor ``shutil`` (with ``bz2`` and
``lzma``); ``status``, ``get`` and ``read`` of a small topic start no thread pool (nor
import one) and import no ``logging``; and a compaction whose compare-and-swap succeeds at
the first try imports no tenacity.  bench/README.md ("Small runs") has what each costs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.craft import build_topic

ROOT = Path(__file__).resolve().parents[2]

#: What no command imports unless its work needs it: the optional extras' libraries,
#: and the package metadata machinery (a plugin's storage scheme aside).
NEVER = frozenset({"pyarrow", "pandas", "polars", "duckdb", "boto3", "botocore", "pyspark", "py4j",
                   "importlib.metadata", "email", "rich", "prometheus_client", "lz4",
                   # argparse finds the terminal's width through shutil, which imports both
                   "shutil", "bz2", "lzma"})
#: What only work on a topic's records needs.
RECORDS = frozenset({"numpy", "zstandard", "msgpack"})
#: What only some runs need: typed sizes and durations, compare-and-swap retries, threads.
SOME_RUNS = frozenset({"humanfriendly", "pytimeparse2", "isodate", "tenacity", "concurrent.futures"})
#: What only a run that has something to log needs (a reader's gap or outage, compact's run log).
LOGGING = frozenset({"logging"})


@dataclass(frozen=True, slots=True)
class Case:
    """A way a command starts: the Python it runs, what it must not import, and at most
    how many modules it may import (NumPy's own aside, which NumPy's version decides)."""

    name: str
    code: str
    forbidden: frozenset[str]
    budget: int


_PROBE = """
import sys
before = set(sys.modules)
exec(sys.argv[1])
with open(sys.argv[2], "w") as f:
    f.write("\\n".join(sorted(set(sys.modules) - before)))
"""


def imported(code: str, tmp_path: Path) -> list[str]:
    """The modules a fresh interpreter imports to run ``code``."""
    out = tmp_path / "modules.txt"
    res = subprocess.run([sys.executable, "-c", _PROBE, code, str(out)], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    return out.read_text().split()


@pytest.fixture(scope="module")
def topic(tmp_path_factory: pytest.TempPathFactory) -> str:
    uri = str(tmp_path_factory.mktemp("startup") / "t")
    build_topic(uri)  # compacted parts, a deletion vector, and ledgers above the horizon
    return uri


def _shale(*args: str) -> str:
    return f"from shale.cli import main\nassert main({list(args)!r}) == 0"


def cases(topic: str, scratch: str) -> list[Case]:
    light = NEVER | RECORDS | SOME_RUNS | {"msgspec", "json", "xxhash"}
    return [
        Case("shale --help", _shale("--help"), light, 48),
        Case("shale status --help", _shale("status", "--help"), light, 48),
        Case("compact --help", "from shale.compactor.cli import main\nassert main(['--help']) == 0", light, 50),
        Case("parsing shale get T KEY", "import os\nfrom shale.cli.parsing import build_parser, parse\n"
             "parse(build_parser('get'), ['get', 'T', 'KEY'], os.environ)", light, 43),
        Case("shale config T", _shale("config", topic), NEVER | RECORDS | SOME_RUNS, 101),
        Case("shale snapshots T", _shale("snapshots", topic), NEVER | RECORDS | SOME_RUNS, 101),
        Case("shale get T KEY", _shale("get", topic, "k3"), NEVER | SOME_RUNS | LOGGING, 134),
        Case("shale read T", _shale("read", topic), NEVER | SOME_RUNS | LOGGING, 146),
        Case("shale status T", _shale("status", topic), NEVER | SOME_RUNS | LOGGING, 135),
        Case("compact T", f"from shale.compactor.cli import main\nassert main([{scratch!r}]) == 0",
             NEVER | {"humanfriendly", "pytimeparse2", "isodate", "tenacity"}, 177),
    ]


_NAMES = [c.name for c in cases("T", "S")]


@pytest.mark.parametrize("name", _NAMES)
def test_a_command_imports_only_what_it_runs(name: str, topic: str, tmp_path: Path) -> None:
    scratch = tmp_path / "t"
    shutil.copytree(topic, scratch)  # (compact changes its topic)
    case = next(c for c in cases(topic, str(scratch)) if c.name == name)
    mods = imported(case.code, tmp_path)
    assert sorted(m for m in mods if m.split(".")[0] in case.forbidden or m in case.forbidden) == []
    counted = [m for m in mods if m != "numpy" and not m.startswith("numpy.")]
    assert len(counted) <= case.budget, f"{name}: {len(counted)} modules, budget {case.budget}"


# ------------------------------------------------------------------ how the process ends

_FINALIZER = """
import sys
class _Noisy:
    def __del__(self):
        sys.__stderr__.write("torn down\\n")
_keep = _Noisy()  # freed by the interpreter's teardown
import atexit
atexit.register(lambda: sys.__stderr__.write("exit handler ran\\n"))
from shale.cli import main
sys.exit(main())
"""


def test_a_command_called_in_a_process_returns_its_code() -> None:
    code = _FINALIZER.replace("sys.exit(main())", "sys.exit(main(['get', '--help']) + 3)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 3 and res.stdout.startswith("usage: shale get")
    assert res.stderr == "exit handler ran\ntorn down\n"  # the caller's process ends as usual


_THREAD = """
import sys, threading
def late():
    sys.stdin.readline()  # until the test has read the command's output
    print("thread done", flush=True)
threading.Thread(target=late).start()
from shale.cli import main
sys.exit(main())
"""


def test_a_command_waits_for_a_thread_that_still_runs() -> None:
    p = subprocess.Popen([sys.executable, "-c", _THREAD, "--help"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert p.stdout is not None and p.stdin is not None
    lines = []
    while not lines or not lines[-1].startswith("  precedence:"):  # the help's last line
        lines.append(p.stdout.readline())
        assert lines[-1], "".join(lines)
    p.stdin.write("go\n")
    p.stdin.flush()
    out, err = p.communicate(timeout=120)
    assert (p.returncode, out, err) == (0, "thread done\n", "")
