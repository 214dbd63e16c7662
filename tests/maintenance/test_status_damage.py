"""``shale status`` names as damaged exactly the objects a compacted read and the next run
read: every compacted part, and the original ledgers from the one the horizon lies in on
(the view's segments).  The horizon's own ledger is one of them even when the horizon is its
last record — the run opens it to find the record after the horizon — so a rule that
looked only at the ledgers wholly above the horizon would miss damage that stops the next
run; a ledger wholly below the horizon is read by neither, and is not named."""

from __future__ import annotations

from pathlib import Path

import pytest

from shale.compactor import CompactionConfig, Compactor
from shale.ledger.errors import CorruptLedgerError
from shale.maintenance.status import topic_status
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter


def _topic(tmp_path: Path) -> tuple[str, list[Path]]:
    """Ledgers 1 and 2 compacted (the horizon: ledger 2's last record), ledger 3 above."""
    uri = str(tmp_path / "t")
    for n in range(3):
        with TopicWriter(uri, max_ledger_records=4, batch_size=2) as w:
            for i in range(4):
                w.append(f"k{i}".encode(), f"v{n}".encode())
        if n == 1:
            Compactor(uri, CompactionConfig(collect_garbage=False)).run()
    ledgers = TopicMetadata.open(uri).load_topic().ledgers
    return uri, [Path(uri) / lg.object for lg in ledgers]


def _damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-10:] = b"\xff" * 10  # the trailer: the footer can no longer be found
    path.write_bytes(bytes(data))


def test_damage_to_the_horizons_ledger_is_named_and_stops_the_next_run(tmp_path: Path) -> None:
    uri, paths = _topic(tmp_path)
    horizon = topic_status(uri)["compaction"]["horizon"]
    assert horizon.startswith("2:")
    _damage(paths[1])
    doc = topic_status(uri)
    assert [d["object"] for d in doc["damaged"]] == [paths[1].relative_to(uri).as_posix()]
    with pytest.raises(CorruptLedgerError):
        Compactor(uri).run()


def test_damage_below_the_horizon_is_neither_read_nor_named(tmp_path: Path) -> None:
    uri, paths = _topic(tmp_path)
    _damage(paths[0])
    assert topic_status(uri)["damaged"] == []
    assert Compactor(uri).run().status == "compacted"
