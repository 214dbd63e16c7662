#!/usr/bin/env bash
# The main job: create a sample topic with many updates per key, compact it, read the
# compacted view back, then add 1% more records and compact again.
#   ./scripts/demo.sh [DIR]         on a local folder (DIR/users); needs none of the extras
#   ./scripts/demo.sh --s3 [DIR]    on s3://demo/users in SeaweedFS, a real S3-compatible
#                                   store started here (its data under DIR/seaweedfs) and
#                                   stopped when the demo ends, however it ends
usage() {
  cat <<'USAGE'
usage: scripts/demo.sh [--s3] [DIR]

Create a sample topic with many updates per key, compact it, read the compacted view
back, then add 1% more records and compact again.

  DIR     where the demo keeps its data (default: demo-data in the repository);
          the topic is DIR/users
  --s3    run it on s3://demo/users in SeaweedFS, a real S3-compatible store started
          here (its data under DIR/seaweedfs) and stopped when the demo ends, however
          it ends (Ctrl-C included)
  -h, --help  print this and exit
USAGE
}
S3=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --s3) S3=1; shift ;;
    --) shift; break ;;
    -*) echo "demo.sh: unknown option $1 (see scripts/demo.sh --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ $# -gt 1 ]; then
  echo "demo.sh: one DIR at most, given $# (see scripts/demo.sh --help)" >&2
  exit 2
fi
if [ -n "$S3" ]; then
  SHALE_EXTRAS="${SHALE_EXTRAS-s3,seaweedfs}"
else
  SHALE_EXTRAS="${SHALE_EXTRAS-}"
fi
source "$(dirname "$0")/_venv.sh"
DATA="$(mkdir -p "${1:-$ROOT/demo-data}" && cd "${1:-$ROOT/demo-data}" && pwd)"

if [ -n "$S3" ]; then
  WEED="$DATA/seaweedfs"
  rm -rf "$WEED" && mkdir -p "$WEED"
  weed_pid=""
  stop_weed() {
    if [ -n "$weed_pid" ]; then
      kill -TERM "$weed_pid" 2>/dev/null || true  # the server stops weed, then exits
      wait "$weed_pid" 2>/dev/null || true
      weed_pid=""
    fi
  }
  trap stop_weed EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  echo "== start SeaweedFS (data and log in $WEED)"
  python -m shale.testing.seaweedfs "$WEED" --bucket demo >"$WEED/env.sh" 2>"$WEED/server.err" &
  weed_pid=$!
  # ready once it has printed its variables (AWS_REGION is the last), or failed
  until grep -q '^export AWS_REGION=' "$WEED/env.sh"; do
    if ! kill -0 "$weed_pid" 2>/dev/null; then
      weed_pid=""
      cat "$WEED/server.err" >&2
      exit 1
    fi
    sleep 0.2
  done
  source "$WEED/env.sh"
  echo "   S3 endpoint $AWS_ENDPOINT_URL, bucket demo"
  TOPIC="s3://demo/users"
else
  TOPIC="$DATA/users"
  rm -rf "$TOPIC"
fi

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
