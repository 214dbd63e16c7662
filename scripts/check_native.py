"""Fail (exit status 1, one line naming them) when any of Shale's C extensions cannot be
imported: the CI run (scripts/test.sh) tests the C kernels, never their NumPy fallbacks
in silence.  Run from the repository: ``python scripts/check_native.py``."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

# the checkout first, as the test run has it (pytest puts the repository first on sys.path)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shale.ledger.kernels import EXTENSIONS


def missing() -> list[str]:
    """The extensions that do not import, each with its source and why."""
    found = []
    for name, source in EXTENSIONS.items():
        try:
            importlib.import_module(f"shale.ledger.{name}")
        except ImportError as e:
            found.append(f"shale.ledger.{name} ({source}: {e})")
    return found


def main() -> int:
    gone = missing()
    if gone:
        print(f"scripts/check_native.py: not built, the fallbacks would be tested instead: {'; '.join(gone)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
