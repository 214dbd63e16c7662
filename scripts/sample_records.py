"""Print sample JSON-lines records: many updates per key, some deletes, a few keyless.

    python scripts/sample_records.py --records 200000 --keys 20000 | shale produce /tmp/topic
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--delete-share", type=float, default=0.02, help="share of records that are tombstones")
    p.add_argument("--keyless-share", type=float, default=0.001)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = random.Random(a.seed)
    out = sys.stdout
    for i in range(a.records):
        r = rng.random()
        if r < a.keyless_share:
            rec: dict[str, object] = {"key": None, "value": f"heartbeat {i}"}
        else:
            key = f"user-{rng.randrange(a.keys):07d}"
            if r < a.keyless_share + a.delete_share:
                rec = {"key": key, "value": None}
            else:
                rec = {"key": key, "value": json.dumps({"email": f"{key}@example.com", "seq": i}),
                       "properties": {"source": "demo"}}
        out.write(json.dumps(rec) + "\n")


def _quietly_gone(code: int) -> None:
    """End without a word about output nobody reads any more: the reader went away (a
    pipe closed) or Ctrl-C stopped the pipeline; what is still buffered goes nowhere."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(code)


if __name__ == "__main__":
    try:
        main()
        sys.stdout.flush()
    except KeyboardInterrupt:
        _quietly_gone(130)
    except BrokenPipeError:
        _quietly_gone(1)
