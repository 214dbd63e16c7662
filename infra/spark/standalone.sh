#!/usr/bin/env bash
# A local Spark standalone cluster for Shale: one master and N workers, each a process of
# its own started from PySpark's launcher classes (no separate Spark download).
#
#   infra/spark/standalone.sh start [--workers N] [--cores C] [--memory 1g] [--dir DIR]
#                                   [--host 127.0.0.1] [--port 0] [--webui-port 0] [--timeout 120]
#   infra/spark/standalone.sh status [--dir DIR]
#   infra/spark/standalone.sh stop [--dir DIR]
#
# start prints the master URL (spark://HOST:PORT) on standard output, and only that, once
# every worker has registered with the master; everything else goes to standard error.
# Port 0 (the default) lets the master pick free ports; its web UI URL is written to
# DIR/webui-url. Logs, pid files and the workers' work folders (one folder per application,
# with each executor's stdout and stderr) live under DIR.
#
# SPARK_HOME is the installed PySpark's folder, found with the Python named by $PYTHON
# (default python3), which must also have Shale installed: executors run it
# (PYSPARK_PYTHON, and first on the workers' PATH, so an application that names no Python
# of its own still gets it).
set -euo pipefail

readonly PROG="${0##*/}"

die() {
  printf '%s: error: %s\n' "$PROG" "$*" >&2
  exit 1
}

note() {
  printf '%s: %s\n' "$PROG" "$*" >&2
}

usage() {
  sed -n '5,8p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

command_name="${1:-}"
case "$command_name" in
  start | stop | status) shift ;;
  -h | --help) usage ;;
  *) usage ;;
esac

workers=2
cores=1
memory=1g
dir="${TMPDIR:-/tmp}/shale-spark-standalone-$(id -u)"
host=127.0.0.1
port=0
webui_port=0
timeout=120

while [ $# -gt 0 ]; do
  case "$1" in
    --workers | --cores | --memory | --dir | --host | --port | --webui-port | --timeout)
      [ $# -ge 2 ] || die "$1 needs a value"
      case "$1" in
        --workers) workers="$2" ;;
        --cores) cores="$2" ;;
        --memory) memory="$2" ;;
        --dir) dir="$2" ;;
        --host) host="$2" ;;
        --port) port="$2" ;;
        --webui-port) webui_port="$2" ;;
        --timeout) timeout="$2" ;;
      esac
      shift 2
      ;;
    -h | --help) usage ;;
    *) die "unknown argument: $1 (try --help)" ;;
  esac
done

# check_uint VALUE MIN MAX MESSAGE: fail with MESSAGE unless VALUE is a whole number in [MIN, MAX]
check_uint() {
  case "$1" in
    '' | *[!0-9]*) die "$4: $1" ;;
  esac
  if [ "$1" -lt "$2" ] || [ "$1" -gt "$3" ]; then
    die "$4: $1"
  fi
}

check_uint "$workers" 1 1000 "--workers must be a whole number of at least 1"
check_uint "$cores" 1 100000 "--cores must be a whole number of at least 1"
check_uint "$port" 0 65535 "--port must be 0 (a free port) or a port number"
check_uint "$webui_port" 0 65535 "--webui-port must be 0 (a free port) or a port number"
check_uint "$timeout" 1 100000 "--timeout must be a whole number of seconds"
[[ "$memory" =~ ^[0-9]+[kKmMgGtT]$ ]] || die "--memory must be a size such as 512m or 2g: $memory"
[ -n "$dir" ] || die "--dir must not be empty"

# --- processes ---------------------------------------------------------------------------

# The launcher class a pid file stands for.
class_of() {
  case "${1##*/}" in
    master.pid) echo org.apache.spark.deploy.master.Master ;;
    *) echo org.apache.spark.deploy.worker.Worker ;;
  esac
}

# Whether pid file $1 names a live process running its class (not a reused pid).
alive() {
  local pidfile="$1" pid args
  [ -f "$pidfile" ] || return 1
  pid="$(cat "$pidfile")"
  case "$pid" in
    '' | *[!0-9]*) return 1 ;;
  esac
  args="$(ps -o args= -p "$pid" 2>/dev/null)" || return 1
  [[ "$args" == *"$(class_of "$pidfile")"* ]]
}

# Stop every daemon of DIR: TERM to each process group (each daemon leads its own, set up
# by setsid, and its executors and their Python workers are in it too), KILL to those
# still there after 15 s; remove the pid files.
stop_all() {
  local pidfile pid i
  local -a pids=()
  shopt -s nullglob
  for pidfile in "$dir"/worker-*.pid "$dir"/master.pid; do
    if alive "$pidfile"; then
      pid="$(cat "$pidfile")"
      pids+=("$pid")
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    fi
  done
  for ((i = 0; i < 150 && ${#pids[@]} > 0; i++)); do
    for pid in "${pids[@]}"; do
      if kill -0 "$pid" 2>/dev/null; then
        sleep 0.1
        continue 2
      fi
    done
    break
  done
  for pid in "${pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  rm -f "$dir"/worker-*.pid "$dir/master.pid" "$dir/master-url" "$dir/webui-url"
  shopt -u nullglob
}

# Start "$@" in the background as the leader of a new process group (and session), its
# output in log file $1; print its pid.
launch() {
  local log="$1"
  shift
  if command -v setsid >/dev/null 2>&1; then
    # a background job of a non-interactive shell leads no group: setsid does not fork
    setsid "$@" >"$log" 2>&1 </dev/null &
  else
    set -m
    "$@" >"$log" 2>&1 </dev/null &
    set +m
  fi
  echo "$!"
}

# The last lines of log $1, indented, on standard error.
show_log() {
  if [ -f "$1" ]; then
    tail -n 15 "$1" | sed 's/^/    /' >&2
  fi
}

# Fail (stopping everything) with message $2 when pid file $1's process has died.
check_alive() {
  if ! alive "$1"; then
    local log="${1%.pid}.log"
    note "last lines of $log:"
    show_log "$log"
    stop_all
    die "$2 exited during start-up (log: $log)"
  fi
}

# --- commands ----------------------------------------------------------------------------

cmd_status() {
  local pidfile running=0 dead=0 name
  if [ ! -d "$dir" ]; then
    echo "not running (no $dir)"
    exit 3
  fi
  shopt -s nullglob
  for pidfile in "$dir/master.pid" "$dir"/worker-*.pid; do
    [ -e "$pidfile" ] || continue
    name="$(basename "$pidfile" .pid)"
    if alive "$pidfile"; then
      echo "$name: running, pid $(cat "$pidfile")"
      running=$((running + 1))
    else
      echo "$name: not running (stale pid file $pidfile)"
      dead=$((dead + 1))
    fi
  done
  shopt -u nullglob
  if [ "$running" -eq 0 ] && [ "$dead" -eq 0 ]; then
    echo "not running"
    exit 3
  fi
  if [ -f "$dir/master-url" ] && alive "$dir/master.pid"; then
    echo "master URL: $(cat "$dir/master-url")"
  fi
  if [ -f "$dir/webui-url" ] && alive "$dir/master.pid"; then
    echo "web UI: $(cat "$dir/webui-url") (state as JSON: $(cat "$dir/webui-url")/json/)"
  fi
  [ "$dead" -eq 0 ] || exit 1
}

cmd_start() {
  local python spark_home executor_python log master_url="" webui="" i n deadline registered pidfile
  python="${PYTHON:-python3}"
  command -v "$python" >/dev/null 2>&1 || die "no Python named $python (set PYTHON to the one that has Shale)"
  spark_home="$("$python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))' 2>/dev/null)" ||
    die "$python has no PySpark: pip install 'shale[spark]' (or set PYTHON to the Python that has it)"
  [ -x "$spark_home/bin/spark-class" ] || die "no $spark_home/bin/spark-class in the installed PySpark"
  # the interpreter itself (a venv's python stays the venv's, not the one it links to)
  executor_python="$("$python" -c 'import sys; print(sys.executable)')"
  "$executor_python" -c 'import shale.compactor' 2>/dev/null ||
    die "$executor_python cannot import shale: executors need it (set PYTHON to the Python that has Shale)"
  command -v java >/dev/null 2>&1 || [ -n "${JAVA_HOME:-}" ] || die "no java on the PATH and no JAVA_HOME: Spark needs Java 17+"

  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  shopt -s nullglob
  for pidfile in "$dir/master.pid" "$dir"/worker-*.pid; do
    if alive "$pidfile"; then
      die "a cluster already runs from $dir ($(basename "$pidfile" .pid), pid $(cat "$pidfile")): $PROG stop --dir $dir"
    fi
    rm -f "$pidfile"
  done
  shopt -u nullglob
  rm -f "$dir/master-url" "$dir/webui-url"

  # the daemons' settings: no REST submission server (it would take the fixed port 6066)
  cat >"$dir/spark-daemons.conf" <<'EOF'
spark.master.rest.enabled false
EOF

  export SPARK_HOME="$spark_home"
  export SPARK_LOCAL_IP="$host"
  export PYSPARK_PYTHON="$executor_python"
  PATH="$(dirname "$executor_python"):$PATH"
  export PATH
  # executors' scratch space (shuffle, spilled blocks) under DIR too
  export SPARK_LOCAL_DIRS="$dir/local"
  mkdir -p "$SPARK_LOCAL_DIRS"

  local start_s=$SECONDS
  deadline=$((SECONDS + timeout))
  log="$dir/master.log"
  launch "$log" "$spark_home/bin/spark-class" org.apache.spark.deploy.master.Master \
    --host "$host" --port "$port" --webui-port "$webui_port" \
    --properties-file "$dir/spark-daemons.conf" >"$dir/master.pid"
  # ready: elected leader (after it bound its port and its web UI)
  while ! grep -q 'New state: ALIVE' "$log" 2>/dev/null; do
    check_alive "$dir/master.pid" "the master"
    if [ "$SECONDS" -ge "$deadline" ]; then
      stop_all
      die "the master did not come up within ${timeout} s (log: $log)"
    fi
    sleep 0.2
  done
  master_url="$(sed -n 's/.*Starting Spark master at \(spark:\/\/[^ ]*\).*/\1/p' "$log" | head -n 1)"
  [ -n "$master_url" ] || {
    stop_all
    die "no master URL in $log"
  }
  n="$(sed -n "s/.*Successfully started service 'MasterUI' on port \([0-9]*\).*/\1/p" "$log" | head -n 1)"
  [ -z "$n" ] || webui="http://$host:$n"
  echo "$master_url" >"$dir/master-url"
  [ -z "$webui" ] || echo "$webui" >"$dir/webui-url"

  for ((i = 1; i <= workers; i++)); do
    mkdir -p "$dir/worker-$i"
    launch "$dir/worker-$i.log" "$spark_home/bin/spark-class" org.apache.spark.deploy.worker.Worker \
      --host "$host" --port 0 --webui-port 0 --cores "$cores" --memory "$memory" \
      --work-dir "$dir/worker-$i" --properties-file "$dir/spark-daemons.conf" \
      "$master_url" >"$dir/worker-$i.pid"
  done
  while :; do
    registered=0
    for ((i = 1; i <= workers; i++)); do
      check_alive "$dir/worker-$i.pid" "worker $i"
      if grep -q 'Successfully registered with master' "$dir/worker-$i.log" 2>/dev/null; then
        registered=$((registered + 1))
      fi
    done
    [ "$registered" -lt "$workers" ] || break
    check_alive "$dir/master.pid" "the master"
    if [ "$SECONDS" -ge "$deadline" ]; then
      stop_all
      die "$registered of $workers workers registered with $master_url within ${timeout} s (logs: $dir/worker-*.log)"
    fi
    sleep 0.2
  done

  note "$master_url: $workers workers ($cores cores, $memory each) registered in $((SECONDS - start_s)) s;" \
    "web UI ${webui:-unknown}; executors run $executor_python; logs and work folders in $dir"
  echo "$master_url"
}

case "$command_name" in
  start) cmd_start ;;
  stop)
    if [ -d "$dir" ]; then
      stop_all
      note "stopped (${dir})"
    else
      note "nothing runs from $dir"
    fi
    ;;
  status) cmd_status ;;
esac
