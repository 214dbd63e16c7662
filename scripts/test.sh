#!/usr/bin/env bash
# Run the whole test suite (creates .venv and installs what it needs on first use).
# Extra arguments go to pytest, e.g. scripts/test.sh -k compaction
source "$(dirname "$0")/_venv.sh"
source "$ROOT/scripts/_system.sh"
source "$ROOT/scripts/_duckdb.sh"
ruff check .
mypy
lint-imports --no-cache
# every C extension built: a run that fell back to the NumPy paths would test those instead
python scripts/check_native.py
# the C kernels' tests again, built with AddressSanitizer and UBSan (fails without gcc's libasan)
scripts/sanitize.sh
# the slowest tests named at the end, so that the suite's time stays watched
exec python -m pytest --durations=30 "$@"
