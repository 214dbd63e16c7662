"""Bytes on storage per codec, for choosing how Shale compresses entries.

    .venv/bin/pip install faker zstandard lz4 pyarrow      # the bench's own needs
    .venv/bin/python bench/codecs.py --records 200000

Two kinds of records, keyed as a changelog topic keys them:

* ``users``: change capture of a users table, generated with Faker (name, email, address,
  status, updated_at) as JSON values, about a tenth of the keys updated again and again;
* ``random64``: the 64-byte values ``bench/compare.py`` uses.

Each is encoded into entries of 100 records exactly as the producer writes them, then
measured as stored: uncompressed; each entry compressed on its own with lz4, zstd levels 1
and 3, and zstd level 3 with a dictionary trained on a sample (zstd level 1 and the
dictionary also with zstd's content checksum, as Shale writes frames); one zstd frame per 16 KiB
of records (Kafka's batches); and the same records as a zstd Parquet file (key, value).
Prints one JSON line per codec with bytes, the ratio to uncompressed, and compression and
decompression rates (per second of CPU time, medians of interleaved repeats).
"""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shale.ledger.record import Record
from shale.ledger.writer import encode_entry

Codec = tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]


def users(n: int, seed: int) -> list[tuple[bytes, bytes]]:
    from faker import Faker

    fake = Faker()
    Faker.seed(seed)
    rnd = random.Random(seed)
    keys = max(1, n // 10)
    rows = {}
    out = []
    statuses = ("active", "active", "active", "suspended", "pending", "deleted")
    for i in range(n):
        k = rnd.randrange(keys)
        row = rows.get(k) or {"id": k, "name": fake.name(), "email": fake.email(), "address": fake.address(),
                              "created_at": fake.iso8601()}
        row = {**row, "status": rnd.choice(statuses), "updated_at": f"2026-11-{1 + i % 28:02d}T{i % 24:02d}:00:00Z",
               "login_count": rnd.randrange(10_000)}
        rows[k] = row
        out.append((f"user-{k:08d}".encode(), json.dumps({"op": "u", "after": row}).encode()))
    return out


def random64(n: int, seed: int) -> list[tuple[bytes, bytes]]:
    rnd = random.Random(seed)
    return [(f"key-{rnd.randrange(n // 10):09d}".encode(), rnd.randbytes(64)) for _ in range(n)]


def entries(records: list[tuple[bytes, bytes]], per: int = 100) -> list[bytes]:
    out = []
    for i in range(0, len(records), per):
        batch = [Record(k, v, publish_time=1_795_000_000_000 + i) for k, v in records[i:i + per]]
        out.append(bytes(encode_entry(batch).payload))
    return out


def codecs(sample: list[bytes]) -> dict[str, Codec]:
    import lz4.frame
    import zstandard as zstd

    def z(level: int, d: Any = None, checksum: bool = False) -> Codec:
        c = zstd.ZstdCompressor(level=level, dict_data=d, write_checksum=checksum)
        dz = zstd.ZstdDecompressor(dict_data=d)
        return c.compress, dz.decompress

    trained = zstd.train_dictionary(112 * 1024, sample)
    # "+checksum": with zstd's content checksum, as Shale writes its frames
    return {"none": (bytes, bytes), "lz4": (lz4.frame.compress, lz4.frame.decompress),
            "zstd-1": z(1), "zstd-1+checksum": z(1, checksum=True), "zstd-3": z(3),
            "zstd-3+dict": z(3, trained), "zstd-3+dict+checksum": z(3, trained, checksum=True)}


def measure(data: list[bytes], codecs: dict[str, Codec], repeat: int) -> list[dict[str, Any]]:
    """Each codec over ``data``: bytes stored and rates, medians of ``repeat`` rounds that
    each run every codec once (so that a slow spell of the machine hits them alike).
    Rates are per second of this process's CPU time, which another process's load on a
    shared machine changes far less than it changes the wall clock's."""
    raw = sum(map(len, data))
    ctimes: dict[str, list[float]] = {name: [] for name in codecs}
    dtimes: dict[str, list[float]] = {name: [] for name in codecs}
    stored: dict[str, int] = {}
    for _ in range(repeat):
        for name, (comp, decomp) in codecs.items():
            t = time.process_time()
            packed = [comp(e) for e in data]
            ctimes[name].append(time.process_time() - t)
            t = time.process_time()
            for p in packed:
                decomp(p)
            dtimes[name].append(time.process_time() - t)
            stored[name] = sum(map(len, packed))
    out = []
    for name in codecs:
        if name == "none":
            out.append({"codec": name, "bytes": stored[name], "ratio": 1.0})
            continue
        out.append({"codec": name, "bytes": stored[name], "ratio": round(raw / stored[name], 2),
                    "compress_MBps": round(raw / statistics.median(ctimes[name]) / 1e6, 1),
                    "decompress_MBps": round(raw / statistics.median(dtimes[name]) / 1e6, 1)})
    return out


def kafka_batches(records: list[tuple[bytes, bytes]], raw_entries: list[bytes], batch: int = 16 * 1024) -> int:
    """Bytes with one zstd frame per 16 KiB of encoded records (Kafka's batch.size)."""
    import zstandard as zstd

    c = zstd.ZstdCompressor(level=3)
    blob = b"".join(raw_entries)
    return sum(len(c.compress(blob[i:i + batch])) for i in range(0, len(blob), batch))


def parquet_bytes(records: list[tuple[bytes, bytes]]) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table({"key": [k for k, _ in records], "value": [v for _, v in records]}), buf,
                   compression="zstd")
    return len(buf.getvalue())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--per", type=int, action="append", default=None,
                   help="records per entry (repeatable; default 100): small entries are where a dictionary helps")
    a = p.parse_args()
    for kind, make in (("users", users), ("random64", random64)):
        records = make(a.records, 1)
        for per in a.per or [100]:
            data = entries(records, per)
            raw = sum(map(len, data))
            print(json.dumps({"records": kind, "per_entry": per, "n": len(records), "entries": len(data),
                              "raw_bytes": raw}), flush=True)
            # the dictionary is trained on entries of another seed: a sample, as a producer would have
            for row in measure(data, codecs(entries(make(min(a.records, 20_000), 2), per)), a.repeat):
                print(json.dumps({"records": kind, "per_entry": per, **row}), flush=True)
        data = entries(records)
        raw = sum(map(len, data))
        kb = kafka_batches(records, data)
        print(json.dumps({"records": kind, "codec": "kafka zstd 16KiB batches", "bytes": kb,
                          "ratio": round(raw / kb, 2)}), flush=True)
        pb = parquet_bytes(records)
        print(json.dumps({"records": kind, "codec": "parquet zstd", "bytes": pb, "ratio": round(raw / pb, 2)}),
              flush=True)


if __name__ == "__main__":
    main()
