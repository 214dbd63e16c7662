# Sourced by the other scripts: make sure .venv exists and holds Shale with its extras.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
EXTRAS="${SHALE_EXTRAS:-dev,s3,spark}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# pyproject.toml and the C kernels: a change to either reinstalls (and rebuilds them)
stamp=".venv/.shale-installed-$(cat pyproject.toml ledger/_kernels.c | cksum | cut -d' ' -f1)-${EXTRAS//,/_}"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[${EXTRAS}]"
  rm -f .venv/.shale-installed-* && touch "$stamp"
fi
export PATH="$ROOT/.venv/bin:$PATH"
