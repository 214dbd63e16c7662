# Sourced by the other scripts: make sure .venv exists and holds Shale with the extras
# the script needs (SHALE_EXTRAS; the test suite's default: every extra; the demo: none).
# SHALE_NO_VENV=1: make and install nothing, run the python and shale found on PATH (the
# test suite runs the scripts so, in the environment it runs in itself).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
EXTRAS="${SHALE_EXTRAS-dev,s3,spark,arrow,seaweedfs,iceberg}"
if [ -n "${SHALE_NO_VENV:-}" ]; then
  return 0
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# pyproject.toml and the C sources: a change to any reinstalls (and rebuilds the kernels).
# An install with more extras than asked for serves too.
source "$ROOT/scripts/_install_hash.sh"
hash="$(install_hash "$ROOT")"
installed=""
for stamp in .venv/.shale-installed-"$hash"-*; do
  [ -e "$stamp" ] || continue
  have="_${stamp##*-"$hash"-}_"
  missing=""
  for extra in ${EXTRAS//,/ }; do
    case "$have" in *"_${extra}_"*) ;; *) missing=1 ;; esac
  done
  [ -z "$missing" ] && installed=1
done
if [ -z "$installed" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  if [ -n "$EXTRAS" ]; then
    .venv/bin/python -m pip install --quiet -e ".[${EXTRAS}]"
  else
    .venv/bin/python -m pip install --quiet -e .
  fi
  # Shale's own modules compiled now (pip compiled its dependencies'), so that no command
  # compiles them where the checkout cannot be written or PYTHONDONTWRITEBYTECODE is set
  .venv/bin/python -m compileall -q ledger metadata reader compactor shale >/dev/null
  rm -f .venv/.shale-installed-* && touch ".venv/.shale-installed-$hash-${EXTRAS//,/_}"
fi
export PATH="$ROOT/.venv/bin:$PATH"
