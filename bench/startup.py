"""Small runs: ``shale status``, ``shale read``, ``shale get`` and ``compact`` on a small
topic, each a whole process, beside DuckDB doing the same work on the same rows as Parquet;
and what each command imports.

    .venv/bin/pip install duckdb pyarrow      # the peer (not Shale's dependencies)
    .venv/bin/python bench/startup.py --records 1000 --keys 100 --repeat 11

Generates, once (kept under bench/data/ and reused), a topic of ``--records`` records on a
local folder (zstd, as produced by default), a copy of it compacted once, and the very
same records as a Parquet file (key, seq, value).  Then, ``--repeat`` times interleaved
(Shale, then DuckDB, then the next pair; this machine's speed drifts from minute to
minute, so medians of interleaved runs are compared):

* ``status``: ``shale status`` of the compacted topic; DuckDB counts the rows and keys and
  takes the first and last sequence numbers;
* ``read``: ``shale read`` of the compacted topic (every record, JSON lines); DuckDB
  copies every row to standard output as JSON lines;
* ``get``: ``shale get`` of one key; DuckDB's ``arg_max(value, seq) WHERE key = ?``;
* ``compact``: ``compact`` of a fresh copy of the uncompacted topic; DuckDB's
  ``arg_max(value, seq) ... GROUP BY key`` from Parquet to a new Parquet file.

* ``read --table``: ``shale read --table`` (the latest record of every key); DuckDB's
  ``arg_max(value, seq) ... GROUP BY key`` copied to standard output as JSON lines.

Both sides are whole processes started the same way (a console script, or ``python -c``
for DuckDB's Python package), interpreter start included, standard output to /dev/null;
wall time, and CPU time (user + system of the process, its threads and its children).
``--cache`` says how compiled modules are found, for both sides alike (default
``warm,read-only``, each timed in turn):

* ``warm``: a writable cache (under bench/data/pycache), filled before the timed runs;
* ``read-only``: no cache can be written (``PYTHONDONTWRITEBYTECODE=1``) and Shale is a
  copy of the tree compiled beforehand (``python -m compileall``), as the container image
  and the README's install leave it; DuckDB, NumPy and the standard library are as pip and
  the interpreter's installer compiled them;
* ``uncompiled``: the same, with the copy of Shale not compiled, so that every process
  compiles Shale's source again (what a checkout that cannot be written costs).

``--instructions`` also counts, once per command and tree, the instructions of the whole
process under Valgrind (``valgrind --tool=callgrind``; the same on a quiet or a busy
machine), with the warm cache.  Beside them: the interpreter alone, importing NumPy (the floor of a command
that reads a footer) and importing DuckDB; and, per command, its imports as ``python -X
importtime`` counts them (the sum over modules the bare interpreter does not import) and
how many modules it imports.  ``--against DIR`` times another checkout's Shale (the
version before a change) beside this one, interleaved too.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent


def child_env() -> dict[str, str]:
    """Compiled modules cached even where the environment turns that off, so that no run
    pays for compiling Shale's or DuckDB's modules."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(ROOT / "bench" / "data" / "pycache")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def generate(base: Path, n: int, keys: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shale.producer import TopicWriter

    ks = [f"key-{(i * 7919) % keys:06d}" for i in range(n)]
    vs = [json.dumps({"seq": i, "email": f"{k}@example.com"}) for i, k in enumerate(ks)]
    with TopicWriter(str(base / "topic")) as w:
        w.append_batch(pa.table({"key": ks, "value": vs}))
    pq.write_table(pa.table({"key": ks, "seq": list(range(n)), "value": vs}), base / "records.parquet")
    shutil.copytree(base / "topic", base / "compacted")
    subprocess.run([str(BIN / "compact"), str(base / "compacted")], check=True, env=child_env(),
                   stdout=subprocess.DEVNULL)


def duckdb(sql: str, show: str = "") -> list[str]:
    """A whole process running ``sql`` with DuckDB's Python package, printing the first row
    when ``show`` says so."""
    code = f"import duckdb\nr = duckdb.connect().execute({sql!r})\n" + (f"print({show})\n" if show else "")
    return [sys.executable, "-c", code]


def works(base: Path, key: str) -> dict[str, tuple[list[str], list[str] | None]]:
    """Each work: Shale's command and DuckDB's (none for the commands that read no records)."""
    topic, pq = str(base / "compacted"), str(base / "records.parquet")
    src = f"read_parquet('{pq}')"
    return {
        "status": ([str(BIN / "shale"), "status", topic],
                   duckdb(f"SELECT count(*), count(DISTINCT key), min(seq), max(seq) FROM {src}", "r.fetchone()")),
        "read": ([str(BIN / "shale"), "read", topic],
                 duckdb(f"COPY (SELECT key, seq, value FROM {src}) TO '/dev/stdout' (FORMAT json)")),
        "read --table": ([str(BIN / "shale"), "read", "--table", topic],
                         duckdb(f"COPY (SELECT key, max(seq) AS seq, arg_max(value, seq) AS value FROM {src} "
                                "GROUP BY key ORDER BY seq) TO '/dev/stdout' (FORMAT json)")),
        "get": ([str(BIN / "shale"), "get", topic, key],
                duckdb(f"SELECT arg_max(value, seq) FROM {src} WHERE key = '{key}'", "r.fetchone()[0]")),
        "compact": ([str(BIN / "compact"), str(base / "work")],
                    duckdb(f"COPY (SELECT key, max(seq) AS seq, arg_max(value, seq) AS value FROM {src} "
                           f"GROUP BY key) TO '{base / 'out.parquet'}' (FORMAT parquet)")),
        # no NumPy: help, and a command that reads only the topic's metadata
        "shale --help": ([str(BIN / "shale"), "--help"], None),
        "compact --help": ([str(BIN / "compact"), "--help"], None),
        "config": ([str(BIN / "shale"), "config", topic], None),
    }


def child_env_for(tree: Path | None) -> dict[str, str]:
    env = child_env()
    if tree is not None:  # another checkout's Shale first on the path
        env["PYTHONPATH"] = os.pathsep.join((str(tree), env["PYTHONPATH"]))
    return env


CACHES: Final = ("warm", "read-only", "uncompiled")
PACKAGES: Final = ("ledger", "metadata", "reader", "compactor", "shale")


def read_only_env(tree: Path | None) -> dict[str, str]:
    """No bytecode written, none looked for under a prefix; ``tree`` alone on the path."""
    env = dict(os.environ)
    env.pop("PYTHONPYCACHEPREFIX", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if tree is None:
        env.pop("PYTHONPATH", None)
    else:
        env["PYTHONPATH"] = str(tree)
    return env


def copy_of(tree: Path, into: Path, compiled: bool) -> Path:
    """Shale's packages of ``tree`` (their C kernels built) copied without any compiled
    module, then compiled as the image and the README's install compile them, or not."""
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    for name in PACKAGES:  # (shale/'s links to the other folders are copied as links)
        shutil.copytree(tree / name, into / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    if compiled:
        subprocess.run([sys.executable, "-m", "compileall", "-q", *PACKAGES], check=True, cwd=into,
                       env=read_only_env(None), stdout=subprocess.DEVNULL)
    return into


def environments(cache: str, scratch: Path, against: Path | None) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """Each tree's environment and DuckDB's, for one way of finding compiled modules (the
    copies of the trees under ``scratch``)."""
    if cache == "warm":
        trees = {"shale": child_env_for(None), **({"before": child_env_for(against)} if against else {})}
        return trees, child_env()
    compiled = cache == "read-only"
    trees = {"shale": read_only_env(copy_of(ROOT, scratch / cache / "shale", compiled))}
    if against:
        trees["before"] = read_only_env(copy_of(against, scratch / cache / "before", compiled))
    return trees, read_only_env(None)


def instructions(cmd: list[str], env: dict[str, str], before: Callable[[], None]) -> int:
    """Instructions of one whole process (and what it starts), counted by Valgrind, after a
    run that fills the compiled-module cache (the tree may have changed since it was filled)."""
    before()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    before()
    res = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", "--trace-children=yes",
                          *cmd], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=True)
    return sum(int(line.rsplit(":", 1)[1]) for line in res.stderr.splitlines() if "Collected :" in line)


def timed(cmd: list[str], env: dict[str, str], before: Callable[[], None] | None = None) -> tuple[float, float]:
    """Wall and CPU seconds (user + system, the process and its threads and children) of one run."""
    if before is not None:
        before()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime


def import_figures(cmd: list[str], env: dict[str, str], bare: set[str], cwd: Path) -> tuple[float, int]:
    """The command's imports (seconds, as ``-X importtime`` sums them, beyond what the bare
    interpreter imports) and how many modules it imports."""
    entry = {"shale": "from shale.cli import main",
             "compact": "from shale.compactor.cli import main"}[Path(cmd[0]).name]
    # (run from the data's folder: ``python -c`` puts the current folder first on the path,
    # which in this checkout would win over the one ``env`` names)
    res = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import sys\n{entry}\nsys.exit(main())",
                          *cmd[1:]], check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         cwd=cwd)
    total, names = 0, set()
    for line in res.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, raw = line.split("|")
        if raw.strip() in bare:
            continue
        names.add(raw.strip())
        if raw[: len(raw) - len(raw.lstrip())] == " ":  # a top-level import: its cumulative time counts
            total += int(cumulative)
    return total / 1e6, len(names)


def bare_modules() -> set[str]:
    res = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], check=True, env=child_env(),
                         stderr=subprocess.PIPE, text=True)
    return {ln.split("|")[2].strip() for ln in res.stderr.splitlines() if ln.startswith("import time:")}


REFERENCES: Final = {
    "python -c pass": "pass",
    "python importing NumPy (one BLAS thread)": "import os\nos.environ['OPENBLAS_NUM_THREADS'] = '1'\nimport numpy",
    "python importing DuckDB": "import duckdb",
}


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=1000)
    p.add_argument("--keys", type=int, default=100)
    p.add_argument("--repeat", type=int, default=11, help="runs of each, interleaved; medians are compared")
    p.add_argument("--against", type=Path, help="another checkout of Shale (the version before a change), timed "
                   "beside this one")
    p.add_argument("--dir", default=str(ROOT / "bench" / "data"))
    p.add_argument("--cache", default="warm,read-only",
                   help=f"how compiled modules are found, one or more of {', '.join(CACHES)} (above)")
    p.add_argument("--instructions", action="store_true", help="count each command's instructions with Valgrind")
    a = p.parse_args()
    a.caches = a.cache.split(",")
    if not set(a.caches) <= set(CACHES):
        p.error(f"--cache: one or more of {', '.join(CACHES)}, comma-separated")
    return a


def main() -> None:
    a = arguments()
    base = Path(a.dir) / f"startup-{a.records}-{a.keys}"
    if not (base / "ready").exists():
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        generate(base, a.records, a.keys)
        (base / "ready").write_text("")

    def fresh() -> None:  # every compact run starts from the topic as produced
        shutil.rmtree(base / "work", ignore_errors=True)
        shutil.copytree(base / "topic", base / "work")
        (base / "out.parquet").unlink(missing_ok=True)

    todo = works(base, f"key-{a.keys // 2:06d}")
    bare = bare_modules()
    # (the copies of the trees go outside the repository: they are source files)
    scratch = Path(tempfile.mkdtemp(prefix="shale-startup-"))
    try:
        for cache in a.caches:
            trees, peer_env = environments(cache, scratch, a.against)
            runs, imports = timed_runs(todo, trees, peer_env, bare, base, a.repeat, fresh)
            print(f"\nCompiled modules: {cache}", flush=True)
            report(runs, imports, list(todo), list(trees), cache)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if a.instructions:
        trees, _ = environments("warm", scratch, a.against)
        print("\n| work | " + " | ".join(f"{t}: instructions" for t in trees) + " |\n|" + "---|" * (len(trees) + 1))
        for name, (shale_cmd, _) in todo.items():
            counts = {t: instructions(shale_cmd, env, fresh) for t, env in trees.items()}
            print(json.dumps({"work": name, "instructions": counts}), flush=True)
            print(f"| {name} | " + " | ".join(f"{c / 1e6:.0f} M" for c in counts.values()) + " |", flush=True)


def timed_runs(todo: dict[str, tuple[list[str], list[str] | None]], trees: dict[str, dict[str, str]],
               peer_env: dict[str, str], bare: set[str], base: Path, repeat: int, fresh: Callable[[], None],
               ) -> tuple[dict[str, list[tuple[float, float]]], dict[str, list[tuple[float, int]]]]:
    """``repeat`` interleaved rounds of every work, after an untimed one."""
    for shale_cmd, peer_cmd in todo.values():  # untimed: fills the compiled-module caches (when they are written)
        for env in trees.values():
            timed(shale_cmd, env, fresh)
        if peer_cmd:
            timed(peer_cmd, peer_env)
    runs: dict[str, list[tuple[float, float]]] = {}
    imports: dict[str, list[tuple[float, int]]] = {}
    for _ in range(repeat):  # interleaved, so that a slow spell of the machine hits everyone
        for name, (shale_cmd, peer_cmd) in todo.items():
            for tree, env in trees.items():
                runs.setdefault(f"{tree} {name}", []).append(timed(shale_cmd, env, fresh))
                fresh()
                imports.setdefault(f"{tree} {name}", []).append(import_figures(shale_cmd, env, bare, base))
            if peer_cmd:
                runs.setdefault(f"duckdb {name}", []).append(timed(peer_cmd, peer_env, fresh))
        for name, code in REFERENCES.items():
            runs.setdefault(name, []).append(timed([sys.executable, "-c", code], peer_env))
    return runs, imports


def report(runs: dict[str, list[tuple[float, float]]], imports: dict[str, list[tuple[float, int]]],
           works: list[str], trees: list[str], cache: str) -> None:
    """Medians: one JSON line per work and per reference, then a table."""
    wall = {k: statistics.median(r[0] for r in v) for k, v in runs.items()}
    cpu = {k: statistics.median(r[1] for r in v) for k, v in runs.items()}
    imp = {k: statistics.median(x[0] for x in v) for k, v in imports.items()}
    mods = {k: v[0][1] for k, v in imports.items()}
    rows = []
    for name in works:
        out: dict[str, Any] = {"work": name, "cache": cache}
        for tree in trees:
            k = f"{tree} {name}"
            out[tree] = {"seconds": round(wall[k], 3), "cpu_seconds": round(cpu[k], 3),
                         "imports_seconds": round(imp[k], 3), "modules": mods[k]}
        d = f"duckdb {name}"
        if d in wall:
            out["duckdb"] = {"seconds": round(wall[d], 3), "cpu_seconds": round(cpu[d], 3)}
            out["duckdb_over_shale"] = round(wall[d] / wall[f"shale {name}"], 2)
            # (by CPU time too: on a machine shared with other work, it moves less than wall time)
            out["duckdb_over_shale_cpu"] = round(cpu[d] / cpu[f"shale {name}"], 2)
        print(json.dumps(out), flush=True)
        rows.append(out)
    for name in REFERENCES:
        print(json.dumps({"reference": name, "cache": cache, "seconds": round(wall[name], 3),
                          "cpu_seconds": round(cpu[name], 3)}))
    print()
    head = "| work | " + " | ".join(f"{t}: whole process (CPU), imports, modules" for t in trees) + \
        " | DuckDB (CPU) | DuckDB / Shale (by CPU) |"
    print(head + "\n|" + "---|" * (head.count("|") - 1))
    for r in rows:
        cells = [f"{r[t]['seconds']:.3f} s ({r[t]['cpu_seconds']:.3f} s), {r[t]['imports_seconds'] * 1000:.0f} ms, "
                 f"{r[t]['modules']}" for t in trees]
        peer = (f"{r['duckdb']['seconds']:.3f} s ({r['duckdb']['cpu_seconds']:.3f} s) | {r['duckdb_over_shale']} "
                f"({r['duckdb_over_shale_cpu']})" if "duckdb" in r else "| ")
        print(f"| {r['work']} | " + " | ".join(cells) + f" | {peer} |")


if __name__ == "__main__":
    main()
