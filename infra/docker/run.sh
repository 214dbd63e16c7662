#!/usr/bin/env bash
# Run `compact ARGS...` in one of Shale's images the way the Kubernetes CronJob runs it.
#
#   infra/docker/run.sh local|spark DIR [--image IMAGE] [--entrypoint CMD] -- ARGS...
#
# As infra/k8s/ does: user 10001:10001, a read-only root filesystem, a writable /tmp (an
# emptyDir there, a fresh directory of the host's here). The host's network, so that a
# server on the host's loopback (an S3 endpoint) is reachable. DIR is mounted at /data and
# must be writable by uid 10001. Every SHALE_* and AWS_* variable of this shell is passed
# through (SHALE_BUILDAH_* aside, which are run.sh's own).
# --entrypoint runs another command of the image instead, e.g. `--entrypoint shale --
# verify /data/t`. IMAGE defaults to what infra/docker/build.sh builds for the target.
#
# With a Docker engine this is `docker run`; without one, buildah (as root): a working
# container of the image, its root filesystem bind-mounted read-only, `buildah run` with
# chroot isolation. The command's exit code is run.sh's.
set -euo pipefail

usage() {
  echo "usage: infra/docker/run.sh local|spark DIR [--image IMAGE] [--entrypoint CMD] -- ARGS..." >&2
  exit 2
}

[ $# -ge 2 ] || usage
target="$1"; dir="$2"; shift 2
case "$target" in local|spark) ;; *) usage ;; esac
image=""; entrypoint=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case "$1" in
    --image) [ $# -ge 2 ] || usage; image="$2"; shift 2 ;;
    --entrypoint) [ $# -ge 2 ] || usage; entrypoint="$2"; shift 2 ;;
    *) usage ;;
  esac
done
[ "${1:-}" = "--" ] || usage
shift

uid=10001

if [ ! -d "$dir" ]; then
  echo "run.sh: $dir is not a directory" >&2
  exit 2
fi
dir="$(cd "$dir" && pwd)"
owner="$(stat -c %u "$dir")"; mode="$(stat -c %a "$dir")"
if [ "$owner" != "$uid" ] && [ "${mode: -1}" != 7 ]; then
  echo "run.sh: $dir is not writable by uid $uid, which the image runs as (chown -R $uid:$uid $dir)" >&2
  exit 2
fi

source "$(dirname "$0")/_engine.sh"
shale_engine_setup "$target"
image="${image:-$IMAGE}"

envs=()
while IFS= read -r name; do
  envs+=(-e "$name=${!name}")
done < <(compgen -e | grep -E '^(SHALE|AWS)_' | grep -v '^SHALE_BUILDAH_' || true)

if [ "$ENGINE" = docker ]; then
  args=(run --rm --user "$uid:$uid" --read-only --tmpfs /tmp --network host -v "$dir:/data" "${envs[@]}")
  if [ -n "$entrypoint" ]; then args+=(--entrypoint "$entrypoint"); fi
  exec docker "${args[@]}" "$image" "$@"
fi

if ! "${BH[@]}" inspect --type image "$image" >/dev/null 2>&1; then
  echo "run.sh: no image $image (infra/docker/build.sh $target builds it)" >&2
  exit 2
fi

# What `docker run IMAGE ARGS` runs: the image's entrypoint, or the one asked for.
if [ -n "$entrypoint" ]; then
  command=("$entrypoint")
else
  mapfile -t command < <("${BH[@]}" inspect --type image --format '{{range .OCIv1.Config.Entrypoint}}{{println .}}{{end}}' "$image" | sed '/^$/d')
fi

# /tmp: a fresh directory of the host's, as an emptyDir is a fresh directory of the node's.
scratch="$(mktemp -d "${TMPDIR:-/tmp}/shale-run-tmp.XXXXXX")"
chmod 1777 "$scratch"
ctr="$("${BH[@]}" from --quiet --pull=never "$image")"
mnt=""
cleanup() {
  if [ -n "$mnt" ]; then
    umount "$mnt/run" 2>/dev/null || true
    umount "$mnt" 2>/dev/null || true
  fi
  rm -rf "$scratch" "$scratch.run"
  "${BH[@]}" rm "$ctr" >/dev/null 2>&1 || true
}
trap cleanup EXIT
# A read-only root: the container's root filesystem bind-mounted over itself, read-only.
# buildah's own mounts (/proc, /dev, /etc/hosts, /tmp, /data) go on top of it, as a
# runtime's do on a read-only rootfs.
mnt="$("${BH[@]}" mount "$ctr")"
# Mount points, made in the working container's own layer before it turns read-only:
# /data and /tmp, and what buildah mounts over in every container.
mkdir -p "$mnt/data" "$mnt/tmp" "$mnt/run" "$mnt/dev" "$mnt/proc" "$mnt/sys"
touch "$mnt/etc/hosts" "$mnt/etc/resolv.conf" "$mnt/etc/hostname"
mount --bind "$mnt" "$mnt"
mount -o remount,bind,ro "$mnt"
# buildah makes and afterwards removes /run/.containerenv in the root filesystem itself,
# so /run is a fresh directory, root's and mode 0755 as in the image: uid 10001 cannot
# write there either.
mkdir "$scratch.run"
mount --bind "$scratch.run" "$mnt/run"

set +e
"${BH[@]}" run --isolation chroot --network host --uts host --user "$uid:$uid" \
  -v "$scratch:/tmp" -v "$dir:/data" "${envs[@]}" \
  "$ctr" -- "${command[@]}" "$@" \
  2> >(grep -v -E '^(subprocess exited with status [0-9]+|Error: exit status [0-9]+)$' >&2)
rc=$?  # the command's own: buildah exits with it (its two lines saying so are dropped above)
wait $! 2>/dev/null || true  # the filter's last lines are out before run.sh exits
set -e
exit "$rc"
