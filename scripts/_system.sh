# Sourced by test.sh: the system tools the container image tests need. Without a Docker
# engine they build and run the image with buildah, and make its base with debootstrap;
# as root on Debian these are installed here when missing (anywhere else the image tests
# say what is missing and are skipped).
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
