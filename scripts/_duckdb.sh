# Sourced by test.sh: DuckDB with its iceberg extension, a reader of the Iceberg tables
# Shale writes that shares nothing with the writer (tests/iceberg). The extension is
# built for one DuckDB release (the duckdb-extension-* packages), and the dev extra's
# duckdb is newer, so it lives in a virtual environment of its own, .venv-duckdb, made
# here once; the tests run it as SHALE_DUCKDB_PYTHON (without it they fail under CI=true).
DUCKDB_PINS="duckdb==1.5.5 duckdb-extension-iceberg==1.5.5 duckdb-extension-avro==1.5.5 duckdb-extension-httpfs==1.5.5"
if [ -z "${SHALE_DUCKDB_PYTHON:-}" ]; then
  stamp="$ROOT/.venv-duckdb/.shale-pins-$(printf '%s' "$DUCKDB_PINS" | cksum | cut -d' ' -f1)"
  if [ ! -e "$stamp" ]; then
    rm -rf "$ROOT/.venv-duckdb"
    { "${PYTHON:-python3}" -m venv "$ROOT/.venv-duckdb" \
        && "$ROOT/.venv-duckdb/bin/python" -m pip install --quiet $DUCKDB_PINS \
        && touch "$stamp"; } \
      || echo "could not make .venv-duckdb: the DuckDB reader tests will be skipped (failed under CI=true)" >&2
  fi
  if [ -e "$stamp" ]; then
    export SHALE_DUCKDB_PYTHON="$ROOT/.venv-duckdb/bin/python"
  fi
fi
