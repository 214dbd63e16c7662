"""A compaction run's folder (``compacted/<run>``) goes with its last object: on a local
folder, where folders are real, neither garbage collection nor a run that removes its own
output (a lost race) leaves empty folders behind to pile up run after run."""

from __future__ import annotations

import os
from pathlib import Path

from shale.compactor import CompactionConfig, Compactor, collect_garbage
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.storage import resolve


def produce(uri: str, first: int, n: int) -> None:
    with TopicWriter(uri, max_ledger_records=50) as w:
        for i in range(first, first + n):
            w.append(f"k{i % 13}", f"v{i}")


def run_folders(topic: Path) -> dict[str, list[str]]:
    """Each folder under ``compacted/`` with what it holds."""
    root = topic / "compacted"
    return {d.name: sorted(os.listdir(d)) for d in sorted(root.iterdir())} if root.exists() else {}


def test_no_empty_run_folder_is_left_behind(tmp_path: Path) -> None:
    topic = tmp_path / "t"
    uri = str(topic)
    meta = TopicMetadata.open(uri)
    config = CompactionConfig(gc_grace_ms=0)
    for round_ in range(3):
        produce(uri, 100 * round_, 100)
        assert Compactor(uri, config).run().status == "compacted"
    # each run's parts were retired by the next and collected at once (no grace): one folder left
    published = meta.load_compaction()
    assert list(run_folders(topic)) == sorted({o.split("/")[1] for o in published.referenced_objects()})
    assert all(run_folders(topic).values())

    # a run that loses its race removes what it wrote, its folder too
    produce(uri, 300, 100)

    def truncated_under_it(msg: str) -> None:
        if msg.startswith("pass two"):
            meta.truncate(meta.load_topic().ledgers[0].id + 1, attempts=5)

    lost = Compactor(uri, config, progress=truncated_under_it).run()
    assert lost.status == "conflict", lost.message
    assert all(run_folders(topic).values()), run_folders(topic)
    assert len(run_folders(topic)) == 1

    # a folder emptied by a collection of leftovers goes as well; a stranger's folder stays
    leftover = topic / "compacted" / "000000000009-0123456789ab"
    leftover.mkdir()
    (leftover / "part-00000.ledger").write_bytes(b"left by a crashed run")
    os.utime(leftover / "part-00000.ledger", (1, 1))  # long past the orphan grace
    (topic / "compacted" / "mine").mkdir()
    report = collect_garbage(meta, grace_ms=0, orphan_grace_ms=CompactionConfig().orphan_grace_ms)
    assert "compacted/000000000009-0123456789ab/part-00000.ledger" in report.orphans_deleted
    assert sorted(run_folders(topic)) == sorted([*{o.split("/")[1] for o in published.referenced_objects()}, "mine"])
    # the store removes an empty folder and nothing else
    store = resolve(uri)
    store.store.remove_empty_folder(store.key("compacted/mine"))
    store.store.remove_empty_folder(store.key("compacted"))  # not empty: stays
    assert (topic / "compacted").is_dir() and not (topic / "compacted" / "mine").exists()
