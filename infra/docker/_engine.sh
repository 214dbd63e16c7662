# Sourced by build.sh and run.sh: which engine builds and runs images here, and the
# image's default name.
#
#   ENGINE    docker when a Docker engine answers `docker info`, else buildah
#   BH        the buildah command with its storage options (SHALE_BUILDAH_DRIVER: overlay
#             where the kernel has it, else vfs; SHALE_BUILDAH_ROOT, SHALE_BUILDAH_RUNROOT:
#             buildah's own defaults unless set). build.sh and run.sh must agree on them.
#   IMAGE     localhost/shale:VERSION (local) or localhost/shale:VERSION-spark (spark)

shale_engine_setup() {  # TARGET
  local root version suffix=""
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/pyproject.toml" | head -n1)"
  [ "$1" = spark ] && suffix="-spark"
  REPO_ROOT="$root"
  IMAGE="localhost/shale:${version}${suffix}"
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    ENGINE=docker
    return 0
  fi
  ENGINE=buildah
  if ! command -v buildah >/dev/null 2>&1; then
    echo "$(basename "$0"): no Docker engine answers and buildah is not installed (apt-get install buildah)" >&2
    exit 3
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "$(basename "$0"): without a Docker engine, buildah runs here as root (its chroot isolation needs it)" >&2
    exit 3
  fi
  local driver="${SHALE_BUILDAH_DRIVER:-}"
  if [ -z "$driver" ]; then
    # overlay shares layers between the build's steps and containers; vfs copies them
    # whole, which is slower but works on any filesystem.
    if grep -qw overlay /proc/filesystems 2>/dev/null; then driver=overlay; else driver=vfs; fi
  fi
  BH=(buildah --storage-driver "$driver")
  if [ -n "${SHALE_BUILDAH_ROOT:-}" ]; then BH+=(--root "$SHALE_BUILDAH_ROOT"); fi
  if [ -n "${SHALE_BUILDAH_RUNROOT:-}" ]; then BH+=(--runroot "$SHALE_BUILDAH_RUNROOT"); fi
}
