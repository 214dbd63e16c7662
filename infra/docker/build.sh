#!/usr/bin/env bash
# Build one of Shale's container images from infra/docker/Dockerfile.
#
#   infra/docker/build.sh local|spark [--tag TAG]
#
# With a Docker engine (`docker info` answers) this is `docker build`. Without one it is
# buildah (`apt-get install buildah`), as root with chroot isolation: no daemon, and no
# kernel privileges a sandbox may lack. Storage settings: infra/docker/_engine.sh.
#
# The base image is PYTHON_IMAGE when set, else python:3.11-slim-bookworm when it can be
# pulled, else (buildah only) a local stand-in made once with debootstrap: a minimal Debian
# bookworm with Debian's Python 3.11 (python3, python3-venv, python-is-python3), committed
# as localhost/shale-python:3.11-bookworm. The Dockerfile is the same in every case.
# DEBIAN_MIRROR picks the stand-in's mirror. Prints the image's name on its last line.
set -euo pipefail

usage() { echo "usage: infra/docker/build.sh local|spark [--tag TAG]" >&2; exit 2; }

[ $# -ge 1 ] || usage
target="$1"; shift
case "$target" in local|spark) ;; *) usage ;; esac
tag=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) [ $# -ge 2 ] || usage; tag="$2"; shift 2 ;;
    *) usage ;;
  esac
done

source "$(dirname "$0")/_engine.sh"
shale_engine_setup "$target"
tag="${tag:-$IMAGE}"
upstream="docker.io/library/python:3.11-slim-bookworm"
standin="localhost/shale-python:3.11-bookworm"

if [ "$ENGINE" = docker ]; then
  args=(build -f "$REPO_ROOT/infra/docker/Dockerfile" --target "$target" -t "$tag")
  if [ -n "${PYTHON_IMAGE:-}" ]; then args+=(--build-arg "PYTHON_IMAGE=$PYTHON_IMAGE"); fi
  if [ -n "${PIP_INDEX_URL:-}" ]; then args+=(--build-arg "PIP_INDEX_URL=$PIP_INDEX_URL"); fi
  docker "${args[@]}" "$REPO_ROOT" >&2
  echo "$tag"
  exit 0
fi

# The base: PYTHON_IMAGE, else the upstream image if a registry gives it, else the stand-in.
base="${PYTHON_IMAGE:-}"
if [ -z "$base" ]; then
  if "${BH[@]}" inspect --type image "$upstream" >/dev/null 2>&1 \
     || timeout 60 "${BH[@]}" pull --quiet "$upstream" >/dev/null 2>&1; then
    base="$upstream"
  else
    base="$standin"
  fi
fi
if [ "$base" = "$standin" ] && ! "${BH[@]}" inspect --type image "$standin" >/dev/null 2>&1; then
  if ! command -v debootstrap >/dev/null 2>&1; then
    echo "build.sh: $upstream cannot be pulled, and making a stand-in needs debootstrap (apt-get install debootstrap)" >&2
    exit 3
  fi
  echo "build.sh: $upstream cannot be pulled; making $standin with debootstrap" >&2
  ctr="$("${BH[@]}" from scratch)"
  trap '"${BH[@]}" rm "$ctr" >/dev/null 2>&1 || true' EXIT
  mnt="$("${BH[@]}" mount "$ctr")"
  debootstrap --variant=minbase --include=python3,python3-venv,python-is-python3,ca-certificates \
    bookworm "$mnt" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >&2
  # The stand-in trusts what this machine trusts: a TLS-inspecting proxy's CA added here
  # must be trusted in the build too, or pip cannot reach the package index.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$mnt/usr/local/share/ca-certificates/"
    chroot "$mnt" update-ca-certificates >/dev/null 2>&1
  fi
  # What python:3.11-slim leaves out as well: package caches and lists, docs, man pages.
  rm -rf "$mnt"/var/cache/apt/archives/*.deb "$mnt"/var/lib/apt/lists/* "$mnt"/usr/share/doc/* \
         "$mnt"/usr/share/man/* "$mnt"/usr/share/info/*
  "${BH[@]}" umount "$ctr" >/dev/null
  "${BH[@]}" config --env LANG=C.UTF-8 --cmd python3 \
    --label org.opencontainers.image.description="Debian bookworm with Debian's Python 3.11, standing in for $upstream" \
    "$ctr"
  "${BH[@]}" commit --quiet --rm "$ctr" "$standin" >/dev/null
  trap - EXIT
fi

# A package mirror this shell's pip uses serves the build too (the index otherwise).
build_args=(--build-arg "PYTHON_IMAGE=$base" --build-arg "PIP_INDEX_URL=${PIP_INDEX_URL:-https://pypi.org/simple}")
# Debian's python3 has pip use certifi's roots, not the system's: point it at the system's.
if [ "$base" = "$standin" ]; then build_args+=(--build-arg "PIP_CERT=/etc/ssl/certs/ca-certificates.crt"); fi
"${BH[@]}" build --isolation chroot --layers --quiet "${build_args[@]}" \
  -f "$REPO_ROOT/infra/docker/Dockerfile" --ignorefile "$REPO_ROOT/infra/docker/Dockerfile.dockerignore" \
  --target "$target" -t "$tag" "$REPO_ROOT" >&2
echo "$tag"
