# Sourced by _venv.sh: install_hash [ROOT] prints one number that changes whenever anything
# the install builds from changes: pyproject.toml, setup.py (if any) and every C source and
# header under the package folders, found by name, so that a new one counts too (each
# file's name is hashed with its contents).
install_hash() {
  local root="${1:-.}"
  (
    cd "$root" || exit 1
    {
      for f in pyproject.toml setup.py; do
        if [ -e "$f" ]; then printf '%s\n' "$f"; cat "$f"; fi
      done
      { find ledger compactor reader metadata shale \( -name '*.c' -o -name '*.h' \) -type f 2>/dev/null || true; } \
        | LC_ALL=C sort | while IFS= read -r f; do printf '%s\n' "$f"; cat "$f"; done
    } | cksum | cut -d' ' -f1
  )
}
