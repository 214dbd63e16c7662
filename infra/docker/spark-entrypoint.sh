#!/bin/bash
# Entrypoint of the Spark image (infra/docker/Dockerfile, --target spark), installed as
# /opt/shale/bin/shale-spark-entrypoint.
#
#   executor [...]   Spark on Kubernetes starts executor pods from this image with the
#                    argument `executor` and describes the executor in SPARK_* variables:
#                    run the executor JVM exactly as Apache Spark's own image does
#                    (resource-managers/kubernetes/docker/src/main/dockerfiles/spark/entrypoint.sh).
#   connect-server [...]
#                    a Spark Connect server in the foreground (Spark's SparkConnectServer,
#                    through spark-submit, as sbin/start-connect-server.sh --wait runs it),
#                    with a --conf for each KEY=VALUE line of SPARK_CONNECT_CONF, then the
#                    arguments given; Shale's CronJob is its client (compact --spark-remote).
#   anything else    compact with those arguments; the CronJob's pod, the Spark driver
#                    (client mode), runs compact directly.
set -euo pipefail

if [ "${1:-}" != "executor" ] && [ "${1:-}" != "connect-server" ]; then
  exec compact "$@"
fi
mode="$1"
shift

# Python workers must run the interpreter that has Shale and its dependencies.
export PYSPARK_PYTHON="${PYSPARK_PYTHON:-/opt/shale/bin/python}"
if [ -n "${PYSPARK_DRIVER_PYTHON+x}" ]; then
  export PYSPARK_DRIVER_PYTHON
fi

if [ "$mode" = "connect-server" ]; then
  conf=()
  while IFS= read -r line; do
    line="${line#"${line%%[![:space:]]*}"}"  # leading blanks of an indented block
    if [ -n "$line" ]; then
      conf+=(--conf "$line")
    fi
  done <<< "${SPARK_CONNECT_CONF:-}"
  exec "$SPARK_HOME/bin/spark-submit" --class org.apache.spark.sql.connect.service.SparkConnectServer \
    --name shale-spark-connect ${conf[@]+"${conf[@]}"} "$@"
fi

# The classpath of Spark's image: its configuration directory, Hadoop's, SPARK_CLASSPATH,
# Spark's jars, SPARK_EXTRA_CLASSPATH and Hadoop's jars (empty parts left out: Java would
# read an empty entry as the working directory).
# Hadoop jars come from HADOOP_HOME when it is set and SPARK_DIST_CLASSPATH is not.
if [ -n "${HADOOP_HOME:-}" ] && [ -z "${SPARK_DIST_CLASSPATH:-}" ]; then
  SPARK_DIST_CLASSPATH="$("$HADOOP_HOME/bin/hadoop" classpath)"
  export SPARK_DIST_CLASSPATH
fi
classpath=()
if [ -n "${SPARK_CONF_DIR+x}" ]; then
  classpath+=("$SPARK_CONF_DIR")
else
  classpath+=("$SPARK_HOME/conf")
fi
if [ -n "${HADOOP_CONF_DIR+x}" ]; then
  classpath+=("$HADOOP_CONF_DIR")
fi
classpath+=("${SPARK_CLASSPATH:-}" "$SPARK_HOME/jars/*" "${SPARK_EXTRA_CLASSPATH:-}" "${SPARK_DIST_CLASSPATH:-}")
SPARK_CLASSPATH=""
for part in "${classpath[@]}"; do
  if [ -n "$part" ]; then
    SPARK_CLASSPATH="${SPARK_CLASSPATH:+$SPARK_CLASSPATH:}$part"
  fi
done

# The driver passes the executor's JVM options as SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ...:
# in numeric order, one argument each (a value may hold spaces).
SPARK_EXECUTOR_JAVA_OPTS=()
while IFS= read -r name; do
  SPARK_EXECUTOR_JAVA_OPTS+=("${!name}")
done < <(compgen -v SPARK_JAVA_OPT_ | sort -t_ -k4 -n)

CMD=(
  "${JAVA_HOME}/bin/java"
  "${SPARK_EXECUTOR_JAVA_OPTS[@]}"
  "-Xms${SPARK_EXECUTOR_MEMORY}"
  "-Xmx${SPARK_EXECUTOR_MEMORY}"
  -cp "$SPARK_CLASSPATH"
  org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend
  --driver-url "$SPARK_DRIVER_URL"
  --executor-id "$SPARK_EXECUTOR_ID"
  --cores "$SPARK_EXECUTOR_CORES"
  --app-id "$SPARK_APPLICATION_ID"
  --hostname "$SPARK_EXECUTOR_POD_IP"
  --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID"
  --podName "$SPARK_EXECUTOR_POD_NAME"
)

# Under tini, as in Spark's image: it forwards signals and reaps the Python workers.
if [ -x /usr/bin/tini ]; then
  exec /usr/bin/tini -s -- "${CMD[@]}"
fi
exec "${CMD[@]}"
