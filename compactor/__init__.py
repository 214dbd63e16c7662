"""Shale's compactor: plan, pass one, pass two, publish, garbage collection."""

import os

# Shale never calls BLAS, but NumPy's OpenBLAS starts a thread per core when NumPy is
# imported, and each spins for a while before it sleeps: on a small machine that takes
# a core from the run (bench/README.md).  One thread, unless the environment says
# otherwise; this only has an effect before NumPy's import.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# (NumPy is imported below this line, through the modules of the package.)

from shale.compactor.config import CompactionConfig
from shale.compactor.gc import GcReport, collect_garbage
from shale.compactor.job import Compactor
from shale.compactor.summary import RunSummary
from shale.compactor.units import format_duration, format_size, parse_duration, parse_size

__all__ = [
    "CompactionConfig",
    "Compactor",
    "GcReport",
    "RunSummary",
    "collect_garbage",
    "format_duration",
    "format_size",
    "parse_duration",
    "parse_size",
]
