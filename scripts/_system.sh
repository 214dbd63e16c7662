# Sourced by test.sh: the system tools the container image tests need. Without a Docker
# engine they build and run the image with buildah, and make its base with debootstrap;
# as root on Debian these are installed here when missing (anywhere else the image tests
# say what is missing and are skipped, or fail under CI=true: tests/needs.py).
if ! { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }; then
  missing=()
  for tool in buildah debootstrap; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
  done
  if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing ${missing[*]} for the container image tests" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "${missing[@]}" >/dev/null; }
  fi
fi

# The monitoring tests run a real Pushgateway and Prometheus (and promtool for the alert
# rules). As root on Debian they are installed here when missing; their services are
# kept from starting (a policy-rc.d that refuses, unless the image already has one), so
# the install works the same with or without an init system.
missing=()
for tool in prometheus prometheus-pushgateway promtool; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing prometheus and prometheus-pushgateway for the monitoring tests" >&2
  export DEBIAN_FRONTEND=noninteractive
  refuse=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && refuse=1
  fi
  pkgs=(prometheus prometheus-pushgateway)
  apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null; } \
    || echo "could not install ${pkgs[*]}: the monitoring tests will be skipped (failed under CI=true)" >&2
  if [ -n "$refuse" ]; then rm -f /usr/sbin/policy-rc.d; fi
fi

# The infra tests render the Kubernetes manifests with kubectl's built-in kustomize, 1.21 or
# later for components. Debian's kubectl (kubernetes-client) is 1.20, too old: nothing is
# installed here, and without a kubectl on the PATH those tests fail under CI=true.
if ! command -v kubectl >/dev/null 2>&1; then
  echo "kubectl is not on the PATH: the infra tests will be skipped (failed under CI=true)" >&2
fi

# The Iceberg tests keep a table's catalog in a real PostgreSQL server they start
# themselves (tests/postgres.py, as SeaweedFS is started): Debian's postgresql, installed
# here as root when missing, its own cluster kept from starting as the monitoring
# packages' services are.
if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
    && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing postgresql for the Iceberg catalog tests" >&2
  export DEBIAN_FRONTEND=noninteractive
  refuse=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && refuse=1
  fi
  apt-get install -y -q --no-install-recommends postgresql >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends postgresql >/dev/null; } \
    || echo "could not install postgresql: the PostgreSQL catalog tests will be skipped (failed under CI=true)" >&2
  if [ -n "$refuse" ]; then rm -f /usr/sbin/policy-rc.d; fi
fi
