#!/usr/bin/env bash
# The main job on a local folder: create a sample topic with many updates per key,
# compact it, read the compacted view back, then add 1% more records and compact again.
# The main job needs none of the extras (S3, Spark, the developer tools).
SHALE_EXTRAS="${SHALE_EXTRAS-}"
source "$(dirname "$0")/_venv.sh"
DATA="${1:-$ROOT/demo-data}"
TOPIC="$DATA/users"
rm -rf "$TOPIC"
mkdir -p "$DATA"

echo "== produce 200,000 updates of 20,000 keys (with deletes and keyless records) into $TOPIC"
python scripts/sample_records.py --records 200000 --keys 20000 --seed 1 \
  | shale produce "$TOPIC" --max-ledger-records 50000
echo "== compact"
compact "$TOPIC"
echo "== the compacted view, first 3 records"
shale read "$TOPIC" --compacted --limit 3
echo "== 2,000 more updates, then an incremental compaction"
python scripts/sample_records.py --records 2000 --keys 20000 --seed 2 | shale produce "$TOPIC" >/dev/null
compact "$TOPIC"
echo "== latest value of every key (table view): $(shale read "$TOPIC" --compacted --table | wc -l) keys"
echo "== status"
shale status "$TOPIC"
echo "== verify: the compacted view recomputed from the original ledgers"
shale verify "$TOPIC"
