"""Arrow in: ``TopicWriter.append_batch`` and ``shale produce --format parquet`` against
pyarrow writing the same rows to Parquet.

    .venv/bin/python bench/arrow_in.py [--records 2000000] [--repeat 3]

The rows: ``--records`` records over a quarter as many keys (``user-00001234``), each
with a 64-byte value (hex text, compressible about 2x as real payloads are) — written once
to ``bench/data/arrow-in.parquet``.  Then, interleaved, ``--repeat`` times each, into a
fresh local topic or file: ``append_batch`` of the whole table (default settings: zstd
level 1, entries of 1000 records), ``shale produce --format parquet`` of the file (a
process of its own, start-up included), and ``pyarrow.parquet.write_table`` of the same
table (pyarrow's defaults: snappy).  Medians and records per second.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def rows(n: int):  # type: ignore[no-untyped-def]
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(7)
    keys = np.char.add("user-", np.char.zfill(rng.integers(0, max(1, n // 4), n).astype(str), 8))
    values = rng.integers(0, 256, size=(n, 32), dtype=np.uint8)
    hexed = np.frombuffer(values.tobytes().hex().encode(), dtype="S64")
    return pa.table({"key": pa.array(keys.astype(object), pa.string()), "value": pa.array(hexed, pa.binary())})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=2_000_000)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    import pyarrow.parquet as pq

    from shale.producer import TopicWriter

    table = rows(a.records)
    data = ROOT / "bench" / "data"
    data.mkdir(parents=True, exist_ok=True)
    source = data / "arrow-in.parquet"
    pq.write_table(table, source)
    shale = Path(sys.executable).parent / "shale"
    times: dict[str, list[float]] = {"append_batch": [], "shale produce --format parquet": [],
                                     "pyarrow write_table(parquet)": []}
    for _ in range(a.repeat):
        work = Path(tempfile.mkdtemp(prefix="shale-arrow-in-", dir=data))
        try:
            t = time.perf_counter()
            with TopicWriter(str(work / "bulk")) as w:
                w.append_batch(table)
            times["append_batch"].append(time.perf_counter() - t)
            assert w.result.records == a.records
            t = time.perf_counter()
            subprocess.run([str(shale), "produce", str(work / "cli"), "--input", str(source)], check=True,
                           stdout=subprocess.DEVNULL)
            times["shale produce --format parquet"].append(time.perf_counter() - t)
            t = time.perf_counter()
            pq.write_table(table, work / "out.parquet")
            times["pyarrow write_table(parquet)"].append(time.perf_counter() - t)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    out = {k: {"median_s": round(statistics.median(v), 3),
               "records_per_s": round(a.records / statistics.median(v))} for k, v in times.items()}
    print(json.dumps({"records": a.records, "repeat": a.repeat, **out}, indent=2))


if __name__ == "__main__":
    main()
