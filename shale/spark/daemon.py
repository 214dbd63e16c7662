"""The Python daemon for Spark executors that run Shale's tasks.

Spark starts one Python daemon per executor, when the executor's first Python task
arrives, and forks a worker from it for each task (or reuses an idle worker, with
``spark.python.worker.reuse``).  PySpark's own daemon imports nothing of a task's, so
every worker it forks imports Shale and NumPy itself on its first task.  This module runs
the same daemon after importing, once, what Shale's tasks use: the workers forked from it
start with those modules loaded (the pages shared with the daemon until written).

It is set by the engine's own session (:func:`shale.compactor.spark.session.open_session`)
when Shale is importable on the executors; a session of one's own gets it with::

    spark.python.daemon.module=shale.spark.daemon
    spark.python.worker.reuse=true

Only modules that start no thread are imported here: PySpark forks its workers from the
daemon, and a thread does not survive a fork (which is why PySpark itself imports its
worker after the fork, and why pyarrow, which starts threads, is left to the workers).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import sys
from typing import Final

__all__ = ["PRELOAD", "PRELOADED", "PRELOADED_IN", "main", "preload"]

#: What Shale's Spark tasks import, in the order imported here: the compactor's map,
#: reduce, filter and write tasks (NumPy, zstandard and the C kernels with them), the
#: storage backends tasks open (boto3 with the S3 one), and PySpark's worker.  The module
#: their functions are pickled from imports pyarrow, which starts threads: the worker
#: imports it.
PRELOAD: Final = (
    "numpy",
    "shale.compactor.spark.tasks",
    "shale.compactor.spark.newkeys",
    "shale.compactor.spark.writes",
    "shale.storage._local",
    "shale.storage._s3",
    "pyspark.worker",
)

#: The modules this process imported in :func:`preload` (set once it ran): the workers
#: forked from the daemon inherit the value.
PRELOADED: tuple[str, ...] = ()
#: The id of the process that imported them (a forked worker's parent), 0 before.
PRELOADED_IN: int = 0


def preload() -> tuple[str, ...]:
    """Import :data:`PRELOAD` (and boto3, when installed); return the names imported.
    A module that cannot be imported, whatever the reason, is left to the tasks, which
    then say why: the daemon itself must start."""
    done = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # the task importing it reports it
            continue
        done.append(name)
    s3 = sys.modules.get("shale.storage._s3")
    if s3 is not None:
        with contextlib.suppress(Exception):
            s3.import_client()
            done.append("boto3")
    global PRELOADED, PRELOADED_IN
    PRELOADED, PRELOADED_IN = tuple(done), os.getpid()
    # What was imported lives as long as the process: out of the collector's sight, the
    # collection a worker runs after each task neither scans those objects nor writes to
    # their pages (which would copy each page from the daemon into the worker).
    gc.freeze()
    return PRELOADED


def main() -> None:
    """Import what Shale's tasks use, then run PySpark's daemon (which forks the workers)."""
    preload()
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    # Run as ``python -m``, this file is ``__main__``; the values the workers inherit are
    # kept in the module under its own name, where tasks find them.
    from shale.spark import daemon

    daemon.main()
