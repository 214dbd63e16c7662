"""How many CPUs the local engine may use."""

from __future__ import annotations

import os

__all__ = ["MAX_WORKERS", "available_cpus", "worker_count"]

#: More processes or threads than this buy nothing on the machines a run is given.
MAX_WORKERS = 8


def available_cpus() -> int:
    """CPUs this process may use: its affinity, capped by a cgroup v2 CPU quota (as a
    container's CPU limit sets it), at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


def worker_count(requested: int = 0) -> int:
    """Processes or threads a run uses: ``requested`` (0: one per available CPU), at most
    :data:`MAX_WORKERS`."""
    return min(requested or available_cpus(), MAX_WORKERS)
