"""The Iceberg table as each reader sees it, as one comparable value: a dict from key to
``(value, message id)``.  pyiceberg wrote the table; DuckDB (its iceberg extension, in a
Python of its own: SHALE_DUCKDB_PYTHON, made by scripts/_duckdb.sh) and Polars (its own
Iceberg planner, polars-iceberg) share none of its reading code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from shale.ledger.ids import MessageId
from tests.needs import missing

__all__ = ["Rows", "duckdb_rows", "polars_rows", "pyiceberg_rows", "rows_of", "view_rows"]

#: key -> (value, message id)
Rows = dict[Any, tuple[Any, MessageId]]

_DUCKDB_SCRIPT = r"""
import base64, glob, importlib, json, os, sys
import duckdb
args = json.loads(sys.argv[1])
con = duckdb.connect()
for name in ("duckdb_extension_avro", "duckdb_extension_iceberg", "duckdb_extension_httpfs"):
    folder = os.path.dirname(importlib.import_module(name).__file__)
    con.execute("LOAD '%s'" % sorted(glob.glob(folder + "/extensions/**/*.duckdb_extension", recursive=True))[0])
for k, v in args.get("settings", {}).items():
    con.execute("SET %s = '%s'" % (k, v))
snap = args.get("snapshot")
extra = ", snapshot_from_id => %d" % snap if snap is not None else ""
rows = con.execute("SELECT key, value, ledger, entry, batch FROM iceberg_scan('%s'%s)" % (args["metadata"], extra))
def text(v):
    return {"b64": base64.b64encode(v).decode()} if isinstance(v, (bytes, bytearray)) else v
print(json.dumps([[text(k), text(v), l, e, b] for k, v, l, e, b in rows.fetchall()]))
"""


def rows_of(keys: list[Any], values: list[Any], ledgers: list[int], entries: list[int], batches: list[int]) -> Rows:
    out: Rows = {}
    for k, v, lg, e, b in zip(keys, values, ledgers, entries, batches, strict=True):
        assert k not in out, f"key {k!r} twice"
        out[k] = (v, MessageId(lg, e, b))
    return out


def _table_rows(t: Any) -> Rows:
    return rows_of(*(t.column(c).to_pylist() for c in ("key", "value", "ledger", "entry", "batch")))


def pyiceberg_rows(table: Any, snapshot_id: int | None = None) -> Rows:
    return _table_rows(table.scan(snapshot_id=snapshot_id).to_arrow())


def polars_rows(table: Any, snapshot_id: int | None = None) -> Rows:
    import polars as pl

    df = pl.scan_iceberg(table, snapshot_id=snapshot_id).collect()
    return rows_of(*(df.get_column(c).to_list() for c in ("key", "value", "ledger", "entry", "batch")))


def duckdb_python() -> str:
    """DuckDB's Python (scripts/_duckdb.sh), or :func:`missing` it."""
    python = os.environ.get("SHALE_DUCKDB_PYTHON", "")
    if not python or not os.path.exists(python):
        missing("SHALE_DUCKDB_PYTHON names no Python with DuckDB's iceberg extension (scripts/_duckdb.sh, which "
                "scripts/test.sh runs, makes .venv-duckdb)")
    return python


def duckdb_rows(metadata_location: str, snapshot_id: int | None = None,
                settings: dict[str, str] | None = None) -> Rows:
    """The table as DuckDB's ``iceberg_scan`` reads it from its metadata file."""
    import base64

    args = {"metadata": metadata_location, "snapshot": snapshot_id, "settings": settings or {}}
    done = subprocess.run([duckdb_python(), "-c", _DUCKDB_SCRIPT, json.dumps(args)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    def value(v: Any) -> Any:
        return base64.b64decode(v["b64"]) if isinstance(v, dict) else v

    rows = json.loads(done.stdout)
    return rows_of([value(r[0]) for r in rows], [value(r[1]) for r in rows], *([r[i] for r in rows] for i in (2, 3, 4)))


def view_rows(uri: str, epoch: int, utf8: bool) -> Rows:
    """``shale read --table --as-of EPOCH``, through the command line."""
    done = subprocess.run([sys.executable, "-m", "shale.cli", "read", uri, "--table", "--as-of", str(epoch)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out: Rows = {}
    for line in done.stdout.splitlines():
        r = json.loads(line)
        key, value = r["key"], r["value"]
        if not utf8:
            key, value = key.encode(), None if value is None else value.encode()
        out[key] = (value, MessageId.parse(r["id"]))
    return out
