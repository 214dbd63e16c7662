#!/usr/bin/env bash
# Build the C kernels (ledger/_kernels.c, _encoder.c, _jsonl.c) once with AddressSanitizer and
# UndefinedBehaviorSanitizer, and run the tests marked `kernels` against that build: those
# whose work is the kernels' own (they call one, compare one with its fallback, feed one
# hostile bytes: the fuzz of frames and footers, or compact through them with and without;
# the marker's rule is in pyproject.toml and docs/architecture.md).  tests/kernel_calls.py
# fails the run when one of the extensions' functions went uncalled by them, so a new
# kernel cannot go untested here.  Under the sanitizers the footer fuzz runs a quarter of
# its examples (SHALE_SANITIZED_KERNELS), to keep the run's time bounded.
# Fails on a compiler warning (-Werror:
# the install itself only warns, so that a user's newer compiler cannot break it), on a
# failing test and on any sanitizer report.  scripts/test.sh runs it; alone:
#     scripts/sanitize.sh [extra pytest arguments]   (with any, the uncalled-kernel check is off)
# Needs gcc with its libasan (the suite needs a C compiler anyway) and .venv (scripts/test.sh
# makes it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${SHALE_VENV_PYTHON:-$ROOT/.venv/bin/python}"

fail() {
  echo "scripts/sanitize.sh: $*" >&2
  exit 1
}
[ -x "$PY" ] || fail "no $PY: run scripts/test.sh once (it creates .venv), or set SHALE_VENV_PYTHON"
command -v gcc >/dev/null || fail "gcc not found: the sanitizer build needs gcc and its libasan (apt-get install gcc)"
# The ASan runtime of this gcc: Python is not built with ASan, so it is preloaded (it must
# come before every other library).  -print-file-name echoes the bare name when not found.
LIBASAN="$(gcc -print-file-name=libasan.so)"
[ -e "$LIBASAN" ] || fail "gcc has no libasan.so (apt-get install libasan8, or the one matching gcc $(gcc -dumpversion))"
# Headers and file name of the venv's own Python (a python3-config on PATH may belong to another).
INCLUDE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
SUFFIX="$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
[ -f "$INCLUDE/Python.h" ] || fail "no Python.h in $INCLUDE: install the Python development headers"

TMP="$(mktemp -d "${TMPDIR:-/tmp}/shale-sanitize.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
TMP="$(cd "$TMP" && pwd -P)"

# A copy of the shale package (its subpackages' links followed) whose extension is the
# sanitized build, first on the path.
cp -RL shale "$TMP/shale"
find "$TMP/shale" -name __pycache__ -prune -exec rm -rf {} +
rm -f "$TMP"/shale/ledger/_kernels*.so "$TMP"/shale/ledger/_kernels*.pyd "$TMP"/shale/ledger/_encoder*.so \
  "$TMP"/shale/ledger/_encoder*.pyd "$TMP"/shale/ledger/_jsonl*.so "$TMP"/shale/ledger/_jsonl*.pyd
SO="$TMP/shale/ledger/_kernels$SUFFIX"
start=$SECONDS
echo "scripts/sanitize.sh: building ledger/_kernels.c, ledger/_encoder.c and ledger/_jsonl.c with -fsanitize=address,undefined"
# -isystem: a warning in Python's own headers (a newer Python's) is not ours to fail on.
gcc -shared -fPIC -isystem "$INCLUDE" \
  -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined \
  -O1 -g -Wall -Wextra -Werror \
  ledger/_kernels.c -o "$SO" -lm
ENC="$TMP/shale/ledger/_encoder$SUFFIX"
gcc -shared -fPIC -isystem "$INCLUDE" \
  -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined \
  -O1 -g -Wall -Wextra -Werror \
  ledger/_encoder.c -o "$ENC"
gcc -shared -fPIC -isystem "$INCLUDE" \
  -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined \
  -O1 -g -Wall -Wextra -Werror \
  ledger/_jsonl.c -o "$TMP/shale/ledger/_jsonl$SUFFIX"

# Loaded with pytest -p: imports the kernels before any conftest can put the repository
# first on sys.path (pytest's default import mode prepends the folder above tests/, whose
# shale/ holds the normal build), and stops the run unless the tests use the sanitized one.
cat >"$TMP/shale_sanitized_kernels.py" <<'EOF'
import os
import sys

import pytest

from shale.ledger import _kernels, kernels

WANT = os.environ["SHALE_SANITIZED_KERNELS"]


def _problem() -> str | None:
    used = getattr(sys.modules["shale.ledger.kernels"], "_native", None)
    if used is None or os.path.realpath(used.__file__) != WANT:
        return f"the tests use {getattr(used, '__file__', 'no C kernels')}, not the sanitized build {WANT}"
    return None


def pytest_configure(config: pytest.Config) -> None:
    if kernels._native is not _kernels or (problem := _problem()):
        raise pytest.UsageError(problem or "shale.ledger.kernels does not use shale.ledger._kernels")


def pytest_collection_finish(session: pytest.Session) -> None:
    if problem := _problem():
        pytest.exit(problem, returncode=3)
EOF

# (the repository last: for the tests package and its plugin, never for shale itself)
export PYTHONPATH="$TMP${PYTHONPATH:+:$PYTHONPATH}:$ROOT"
export SHALE_SANITIZED_KERNELS="$SO"
export LD_PRELOAD="$LIBASAN${LD_PRELOAD:+:$LD_PRELOAD}"
# detect_leaks=0: CPython does not free everything at exit, and LeakSanitizer would report
# that.  The first error ends its process: ASan's default, UBSan's by
# -fno-sanitize-recover and halt_on_error.  log_path: ASan's reports (from pytest and from
# the subprocesses some tests start) go to files, checked below, so that none goes
# unnoticed.  UBSan's own reports cannot: with both runtimes loaded, libubsan applies its
# log_path to libasan's report file (the last one set wins, hence the same path in both)
# and keeps writing to stderr; so pytest runs with --capture=sys below (with fd capture, a
# report written as the process ends would vanish with the capture file).
# malloc_context_size and quarantine_size_mb: shorter allocation stacks and a smaller
# pool of freed memory held back, for speed and memory (a use after free is still caught
# within the last 64 MiB freed).
export ASAN_OPTIONS="detect_leaks=0:malloc_context_size=10:quarantine_size_mb=64:log_path=$TMP/report"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$TMP/report"
# Python objects through malloc rather than Python's own pools: ASan then puts a red zone
# after every bytes/bytearray the kernels are given, so reading past a small one (up to
# 512 bytes: most records the parser tests give check_records) is caught too; pool memory
# around it would count as valid.  Doubles the run time (about 25 s to 55 s) but is worth
# it: a record parser reading a length field 3 bytes past a cut record's end passes every
# test without it, and is caught with it.
export PYTHONMALLOC=malloc
unset SHALE_KERNELS

reports() {
  if compgen -G "$TMP/report.*" >/dev/null; then
    cat "$TMP"/report.* >&2
    fail "sanitizer report(s) above"
  fi
}
cd "$TMP" # not the repository: `python -c`/`-m` put the working directory first on sys.path
"$PY" -c '
import os, shale.ledger._kernels as k, shale.ledger.kernels as kk
got = os.path.realpath(k.__file__)
assert got == os.environ["SHALE_SANITIZED_KERNELS"] and kk.KERNELS == "native", (got, kk.KERNELS)
import shale.ledger._encoder as e, shale.ledger.encoder as ee
assert os.path.dirname(os.path.realpath(e.__file__)) == os.path.dirname(got) and ee.ENCODER == "native"
import shale.ledger._jsonl as s, shale.producer.jsonl_ingest as ss
assert os.path.dirname(os.path.realpath(s.__file__)) == os.path.dirname(got) and ss.SCANNER == "native"
print("scripts/sanitize.sh: testing", got)' || { reports; fail "the sanitized build is not the one imported"; }
status=0
calls=(-p tests.kernel_calls)
[ "$#" -eq 0 ] || calls=()
"$PY" -m pytest -q -p no:cacheprovider --capture=sys -p shale_sanitized_kernels "${calls[@]}" \
  -c "$ROOT/pyproject.toml" --rootdir "$ROOT" -m kernels "$ROOT/tests" "$@" || status=$?
reports
[ "$status" -eq 0 ] || fail "tests failed under the sanitizers (pytest exit status $status)"
echo "scripts/sanitize.sh: no sanitizer report ($((SECONDS - start)) s)"
