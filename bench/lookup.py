"""Point lookups (``shale get``, :func:`shale.reader.lookup`): bytes read and time per lookup.

    .venv/bin/python bench/lookup.py TOPIC [--lookups 50]

On a compacted topic (``bench/compare.py`` leaves one under
``bench/data/compare-*/incremental``: 2 M keys, compacted, plus a 1 % tail), looks up
random keys that exist and keys that do not, each in a fresh store (nothing cached), and
prints the median bytes read, objects opened, entries read and time per lookup.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shale.metadata.topic import TopicMetadata
from shale.reader import lookup
from shale.storage import clear_backend_cache


def _counting(meta: TopicMetadata) -> dict[str, int]:
    """Count the bytes the topic's store hands out (every read goes through these)."""
    store: Any = meta.topic.store
    seen = {"bytes": 0, "requests": 0}
    for name in ("get", "get_range", "get_view", "get_tail"):
        real = getattr(store, name)

        def counted(*args: Any, _real: Any = real, _name: str = name) -> Any:
            out = _real(*args)
            data = out[0] if _name == "get_tail" else out
            seen["bytes"] += len(data)
            seen["requests"] += 1
            return out

        setattr(store, name, counted)
    return seen


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("topic")
    p.add_argument("--lookups", type=int, default=50)
    p.add_argument("--keys", type=int, default=2_000_000,
                   help="keys are key-000000000.. as bench/compare.py writes them")
    a = p.parse_args()
    rnd = random.Random(1)
    rows: dict[str, list[dict[str, float]]] = {"present": [], "absent": []}
    for i in range(a.lookups):
        kind = "present" if i % 2 == 0 else "absent"
        key = f"key-{rnd.randrange(a.keys):09d}" if kind == "present" else f"missing-{i}"
        clear_backend_cache()
        meta = TopicMetadata.open(a.topic)
        seen = _counting(meta)
        t = time.perf_counter()
        got = lookup(meta, key.encode())
        took = time.perf_counter() - t
        if kind == "present":
            assert got.message is not None, key
        rows[kind].append({"bytes": seen["bytes"], "requests": seen["requests"], "footers": got.footers_read,
                           "entries": got.entries_read, "seconds": took})
    for kind, rs in rows.items():
        print(json.dumps({"lookup": kind, "n": len(rs),
                          **{f"median_{k}": round(statistics.median(r[k] for r in rs), 4) for k in rs[0]}}))


if __name__ == "__main__":
    main()
