"""The executors' daemon (:mod:`shale.spark.daemon`) in this process: what it imports,
and that a module failing to import never stops it (the task importing it says why).
On executors: ``test_spark_cluster.py``."""

from __future__ import annotations

import gc
import os
import sys

import pytest

from shale.compactor.spark.engine import DAEMON_MODULE, worker_settings


def test_the_daemon_imports_what_tasks_use_and_starts_whatever_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    from shale.spark import daemon

    monkeypatch.setattr(daemon, "PRELOAD", ("shale.compactor.spark.tasks", "shale.no_such_module", "json"))
    monkeypatch.setattr(daemon, "PRELOADED", ())  # (put back after the test, as is what preload sets)
    monkeypatch.setattr(daemon, "PRELOADED_IN", 0)
    try:
        done = daemon.preload()
    finally:
        gc.unfreeze()
    assert done[:2] == ("shale.compactor.spark.tasks", "json") and "shale.no_such_module" not in done
    assert "shale.compactor.spark.tasks" in sys.modules
    assert done == daemon.PRELOADED and os.getpid() == daemon.PRELOADED_IN


def test_the_daemon_is_set_only_where_shale_is_installed() -> None:
    assert ("spark.python.daemon.module", DAEMON_MODULE) in worker_settings(shale_installed=True)
    # a shipped zip reaches only the workers: PySpark's own daemon then
    assert not any(k == "spark.python.daemon.module" for k, _ in worker_settings(shale_installed=False))
    assert ("spark.python.worker.reuse", "true") in worker_settings(shale_installed=False)
