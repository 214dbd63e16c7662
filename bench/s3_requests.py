"""What one compaction asks of object storage: its requests, counted by kind, and its wall
time on SeaweedFS, on moto and on a local folder.

    .venv/bin/python bench/s3_requests.py --records 2000000 --keys 200000 --rounds 3

Generates a topic once on a local folder (kept under ``bench/data/`` and reused: 64-byte
values, the producer's defaults: entries of 1000 records, ledgers of 500,000, zstd level
1) and uploads it to a SeaweedFS server (``shale.testing.seaweedfs``, data under the same
folder) and to a moto server (``tests/moto_server.py --concurrent``), both on this
machine.  Then, in ``--rounds`` interleaved rounds (local, moto, SeaweedFS, local, ...),
on a fresh copy of the topic in each store: a full compaction, ``--increment`` new
records (1 %, the same key space), an incremental compaction, as many again and an
incremental compaction without garbage collection (``--no-gc``), a run with nothing new;
each with ``CompactionConfig()``'s defaults otherwise, in this process.  Then the compacted
view is read back (``TopicReader.iter_batches``) with each ``--max-batch-bytes``.

Requests are counted as the S3 client sends them (a botocore ``before-send`` hook on every
client Shale makes, forked pass-two workers' included; copies, uploads and clean-ups the
benchmark makes itself are not counted), by operation, a ``GetObject`` with a ``Range``
apart.  Prints one JSON line per run, then the medians of each backend's times and each
S3 run's request counts.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BUCKET = "bench"

# --------------------------------------------------------------- counting the client's requests

#: where the hook writes one line per request (an O_APPEND file: forked workers share it)
_SINK: list[int] = []


_KINDS = ("ledgers", "compacted", "_meta")


def _object_kind(url: str) -> str:
    """What a request is about: the topic's ``ledgers/``, ``compacted/`` or the ``_meta/``
    document it names (a listing: the prefix it lists)."""
    parts = urlsplit(url)
    path = unquote(parts.path)
    prefix = parse_qs(parts.query).get("prefix")
    if prefix:
        path += "/" + prefix[0]
    names = path.split("/")
    for i, name in enumerate(names):
        if name in _KINDS:
            rest = names[i + 1] if name == "_meta" and i + 1 < len(names) else ""
            return f"{name}/{rest}" if rest else name
    return "topic prefix"


def _count(request: Any = None, event_name: str = "", **_: Any) -> None:
    """botocore ``before-send`` handler: one line per HTTP request about to be sent.
    Returns None, so that the request is sent."""
    if _SINK and request is not None:
        op = event_name.rsplit(".", 1)[-1]
        if op == "GetObject" and "Range" in request.headers:
            op = "GetObject (ranged)"
        os.write(_SINK[0], f"{op}\t{_object_kind(request.url)}\n".encode())


def _install_counter() -> None:
    """Every S3 client Shale makes from now on (in this process and in processes forked
    from it) reports its requests to :func:`_count`."""
    from shale.storage import _s3

    make = _s3._make_client

    def counting(options: Any) -> Any:
        client = make(options)
        client.meta.events.register("before-send.s3", _count)
        return client

    _s3._make_client = counting


def counted(path: Path, fn: Callable[[], Any]) -> tuple[Any, Counter[str]]:
    """``fn()``, and the requests Shale's clients sent while it ran."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    _SINK.append(fd)
    try:
        result = fn()
    finally:
        _SINK.clear()
        os.close(fd)
    return result, Counter(path.read_text().split("\n")[:-1])


def by_operation(requests: dict[str, int]) -> dict[str, int]:
    ops: Counter[str] = Counter()
    for line, n in requests.items():
        ops[line.split("\t")[0]] += n
    return dict(sorted(ops.items()))


# ------------------------------------------------------------------------------ the data set

def batches(seed: int, n: int, keys: int, value_bytes: int, first: int = 0) -> Iterator[dict[str, list[str]]]:
    rng = random.Random(seed)
    pad = "x" * max(0, value_bytes - 12)
    step = 100_000
    for start in range(0, n, step):
        stop = min(n, start + step)
        yield {"key": [f"key-{rng.randrange(keys):09d}" for _ in range(start, stop)],
               "value": [f"{first + i:012d}{pad}" for i in range(start, stop)]}


def produce(uri: str, seed: int, n: int, keys: int, value_bytes: int, first: int = 0) -> None:
    from shale.producer import TopicWriter

    with TopicWriter(uri) as w:
        for b in batches(seed, n, keys, value_bytes, first):
            w.append_batch(b)


def data_set(a: argparse.Namespace) -> tuple[Path, Path]:
    base = Path(a.dir) / f"s3requests-{a.records}-{a.keys}-{a.value_bytes}"
    topic = base / "topic"
    if not (base / "ready").exists():
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        t = time.perf_counter()
        produce(str(topic), 1, a.records, a.keys, a.value_bytes)
        (base / "ready").write_text("")
        print(json.dumps({"run": "generate", "seconds": round(time.perf_counter() - t, 1)}), flush=True)
    return base, topic


# ------------------------------------------------------------------------------------ stores

class Backend:
    """Where a round's copy of the topic lives."""

    name = ""

    def fresh_copy(self, round_no: int) -> str:
        raise NotImplementedError

    def drop(self, uri: str) -> None:
        raise NotImplementedError

    def activate(self) -> None:
        """Point Shale (the AWS variables it reads) at this store."""


class LocalFolder(Backend):
    name = "local folder"

    def __init__(self, base: Path, topic: Path) -> None:
        self.base, self.topic = base, topic

    def fresh_copy(self, round_no: int) -> str:
        work = self.base / f"work-{round_no}"
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(self.topic, work, copy_function=os.link)  # objects are never changed in place
        return str(work)

    def drop(self, uri: str) -> None:
        shutil.rmtree(uri, ignore_errors=True)


class S3(Backend):
    """A bucket on an S3 endpoint; the benchmark's own client (not counted) uploads and copies."""

    def __init__(self, name: str, env: dict[str, str], topic: Path) -> None:
        import boto3

        self.name, self.env = name, env
        self.client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_DEFAULT_REGION"],
                                   aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                                   aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
        existing = {b["Name"] for b in self.client.list_buckets().get("Buckets", [])}
        if BUCKET not in existing:
            self.client.create_bucket(Bucket=BUCKET)
        for f in sorted(p for p in topic.rglob("*") if p.is_file()):
            self.client.put_object(Bucket=BUCKET, Key=f"source/{f.relative_to(topic)}", Body=f.read_bytes())

    def keys(self, prefix: str) -> list[str]:
        out: list[str] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
            out += [o["Key"] for o in page.get("Contents", [])]
        return out

    def fresh_copy(self, round_no: int) -> str:
        prefix = f"round-{round_no}"
        for key in self.keys("source/"):
            self.client.copy_object(Bucket=BUCKET, Key=f"{prefix}/{key.removeprefix('source/')}",
                                    CopySource={"Bucket": BUCKET, "Key": key})
        return f"s3://{BUCKET}/{prefix}"

    def drop(self, uri: str) -> None:
        for key in self.keys(uri.removeprefix(f"s3://{BUCKET}/") + "/"):
            self.client.delete_object(Bucket=BUCKET, Key=key)

    def activate(self) -> None:
        os.environ.update(self.env)


def start_moto() -> tuple[subprocess.Popen[str], dict[str, str]]:
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "moto_server.py"), "--concurrent"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    port = int(proc.stdout.readline().split()[1])
    return proc, {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "bench",
                  "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}


# ------------------------------------------------------------------------------------- runs

def compact(uri: str, gc: bool = True) -> dict[str, Any]:
    from shale.compactor import CompactionConfig, Compactor

    t = time.perf_counter()
    s = Compactor(uri, CompactionConfig(collect_garbage=gc)).run()
    return {"seconds": round(time.perf_counter() - t, 3), "status": s.status, "records_read": s.records_read,
            "written": s.records_written, "bytes_read": s.bytes_read,
            "durations": {k: round(v, 3) for k, v in s.durations.items()}}


def read_view(uri: str, max_batch_bytes: int) -> dict[str, Any]:
    """A consumer restoring state: the whole compacted view as Arrow batches."""
    from shale.reader import TopicReader

    t = time.perf_counter()
    rows = 0
    with TopicReader(uri, read_compacted=True) as r:
        for b in r.iter_batches(max_batch_bytes=max_batch_bytes):
            rows += b.num_rows
    return {"seconds": round(time.perf_counter() - t, 3), "records_read": rows, "bytes_read": 0}


def one_round(backend: Backend, round_no: int, a: argparse.Namespace, base: Path) -> list[dict[str, Any]]:
    """On a fresh copy of the topic: a full run; 1 % new records and an incremental run;
    1 % more and an incremental run without garbage collection; a run with nothing new;
    then the compacted view read back (requests only: these runs are not compared)."""
    backend.activate()
    uri = backend.fresh_copy(round_no)
    out: list[dict[str, Any]] = []

    def measure(name: str, fn: Callable[[], dict[str, Any]]) -> None:
        got, requests = counted(base / "requests.log", fn)
        out.append({"backend": backend.name, "run": name, **got, "requests": by_operation(requests),
                    "by_object": dict(sorted(requests.items()))})

    inc = int(a.records * a.increment)
    try:
        measure("full", lambda: compact(uri))
        produce(uri, 2, inc, a.keys, a.value_bytes, first=a.records)
        measure(f"incremental after {inc:,} new records", lambda: compact(uri))
        produce(uri, 3, inc, a.keys, a.value_bytes, first=a.records + inc)
        measure(f"incremental after {inc:,} more, --no-gc", lambda: compact(uri, gc=False))
        measure("nothing new", lambda: compact(uri))
        for mbb in a.max_batch_bytes:
            measure(f"read the compacted view, max_batch_bytes {mbb >> 20} MiB", functools.partial(read_view, uri, mbb))
    finally:
        backend.drop(uri)
    for r in out:
        print(json.dumps({"round": round_no, **r}), flush=True)
    return out


def report(runs: list[dict[str, Any]]) -> None:
    print("\nmedians:", flush=True)
    order = list(dict.fromkeys(r["run"] for r in runs))
    keys = sorted({(r["backend"], r["run"]) for r in runs}, key=lambda k: (order.index(k[1]), k[0]))
    for backend, run in keys:
        mine = [r for r in runs if r["backend"] == backend and r["run"] == run]
        line: dict[str, Any] = {"backend": backend, "run": run, "rounds": len(mine),
                                "seconds": round(statistics.median(r["seconds"] for r in mine), 3),
                                "all_seconds": [r["seconds"] for r in mine]}
        if any(r["requests"] for r in mine):
            counts = [r["requests"] for r in mine]
            line["requests"] = counts[0] if all(c == counts[0] for c in counts) else counts
            line["total_requests"] = statistics.median(sum(c.values()) for c in counts)
            line["by_object"] = mine[-1]["by_object"]
        if mine[0]["bytes_read"]:
            line["bytes_read_mb"] = round(statistics.median(r["bytes_read"] for r in mine) / 1e6, 1)
        print(json.dumps(line), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=2_000_000)
    p.add_argument("--keys", type=int, default=200_000)
    p.add_argument("--value-bytes", type=int, default=64)
    p.add_argument("--increment", type=float, default=0.01, help="new records before the incremental run, "
                                                                  "as a share of --records")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-batch-bytes", type=lambda v: int(v) << 20, action="append", default=None,
                   help="MiB: also read the compacted view back with batches of at most this (repeatable; "
                        "default 1 and 16)")
    p.add_argument("--dir", default=str(ROOT / "bench" / "data"))
    p.add_argument("--skip", action="append", default=[], choices=["local", "moto", "seaweedfs"])
    a = p.parse_args()
    a.max_batch_bytes = a.max_batch_bytes or [1 << 20, 16 << 20]
    base, topic = data_set(a)
    _install_counter()
    backends: list[Backend] = []
    moto: subprocess.Popen[str] | None = None
    weed = None
    try:
        if "local" not in a.skip:
            backends.append(LocalFolder(base, topic))
        if "moto" not in a.skip:
            moto, env = start_moto()
            backends.append(S3("moto", env, topic))
        if "seaweedfs" not in a.skip:
            from shale.testing.seaweedfs import SeaweedFS

            shutil.rmtree(base / "seaweedfs", ignore_errors=True)
            weed = SeaweedFS(base / "seaweedfs", buckets=(BUCKET,)).start()
            backends.append(S3("SeaweedFS", weed.environment(), topic))
        runs: list[dict[str, Any]] = []
        for i in range(a.rounds):  # interleaved, so that a slow spell of the machine hits every store
            for b in backends:
                runs += one_round(b, i, a, base)
        report(runs)
    finally:
        if weed is not None:
            weed.stop()
        if moto is not None:
            moto.terminate()
            moto.wait(timeout=10)


if __name__ == "__main__":
    main()
