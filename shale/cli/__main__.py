"""``python -m shale.cli``: the ``shale`` command."""

import sys

from shale.cli import main

sys.exit(main())
