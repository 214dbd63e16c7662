"""One CPU counter (:func:`shale.runtime.cpus.available_cpus`, which a container's cgroup
CPU quota caps) sizes every pool of threads and processes: the local engine's workers and
the readers' Arrow decoding threads alike."""

from __future__ import annotations

import pytest

from shale.reader.arrow import MAX_DECODE_THREADS, decode_threads
from shale.runtime import cpus
from shale.runtime.cpus import MAX_WORKERS, worker_count


@pytest.mark.parametrize("available", [1, 3, 64])
def test_the_readers_and_the_compactor_count_cpus_alike(monkeypatch: pytest.MonkeyPatch, available: int) -> None:
    monkeypatch.setattr(cpus, "available_cpus", lambda: available)
    assert decode_threads() == min(available, MAX_DECODE_THREADS)
    assert worker_count() == min(available, MAX_WORKERS)
