"""A run that keeps event times (``CompactionConfig.event_times``) gives its parts each
record's event time in their footers, taken from the footers of what they copy or, where
those do not say (format version 2, parts written without them), decoded; by default
parts carry none and say so.  ``verify --scrub`` refuses a footer whose event times are
not the records'."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import numpy as np
import pytest

from shale.compactor import CompactionConfig, Compactor
from shale.ledger.codecs import parse_compression
from shale.ledger.format import KIND_COMPACTED, NO_EVENT_TIME
from shale.ledger.reader import LedgerFile
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from tests import objects, tamper
from tests.conftest import run_cli_here


def produce(uri: str, seed: int, n: int, *, compression: str = "zstd", events: bool = True) -> None:
    """``n`` records of a seeded generator, about half with an event time (out of order),
    published over time so that one entry's records have several publish times."""
    rnd = random.Random(seed)
    clock = [1_700_000_000.0 + seed * 3600]
    with TopicWriter(uri, batch_size=9, max_ledger_records=300, compression=compression,
                     clock=lambda: clock[0]) as w:
        for i in range(n):
            clock[0] += rnd.choice((0.0, 0.001))
            key = f"k{rnd.randrange(150)}"
            value = None if rnd.random() < 0.1 else f"v{seed}-{i}" + "x" * rnd.randrange(30)
            event = 1_600_000_000_000 + rnd.randrange(10**9) if events and rnd.random() < 0.5 else None
            w.append(key, value, event_time=event)


def objects_of(uri: str) -> list[LedgerFile]:
    meta = TopicMetadata.open(uri)
    loc = meta.topic
    return ([LedgerFile.open(loc.store, loc.key(lg.object)) for lg in meta.load_topic().ledgers]
            + [LedgerFile.open(loc.store, loc.key(p.object), kind=KIND_COMPACTED)
               for p in meta.load_compaction().parts])


def check_event_times(uri: str) -> int:
    """Every object's footer of version 3 gives each record's event time
    (``NO_EVENT_TIME`` where none); returns how many compacted parts there are."""
    parts = 0
    for f in objects_of(uri):
        got = f.event_times()
        if f.footer.version < 3:
            assert got is None
            continue
        want = [NO_EVENT_TIME if m.event_time is None else m.event_time for m in f.messages()]
        assert got is not None and got.tolist() == want, f.url
        parts += f.footer.kind == KIND_COMPACTED
    return parts


def rewrite_as_version_2(uri: str, names: list[str]) -> None:
    for name in names:
        tamper.write_raw(uri, name, objects.to_version_2(tamper.read_raw(uri, name)))


@pytest.mark.parametrize("read_bytes", [0, 256], ids=["batches", "streams"])
@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_compacted_parts_keep_each_records_event_time(tmp_path: Path, codec: str, read_bytes: int) -> None:
    """Through every copy of pass two (whole frames, survivors of partly kept entries,
    packed and compressed anew; with ``read_bytes``, every entry bigger than a read and
    copied as a stream), from version 3 objects and from version 2 ones (whose records are
    decoded), first and incremental runs."""
    uri = str(tmp_path / "t")
    cfg = CompactionConfig(delete_retention_ms=0, compression=parse_compression(codec), max_part_bytes=1 << 16,
                           reuse_min_bytes=1 << 40, event_times=True, chunk_raw_bytes=read_bytes)
    produce(uri, 1, 900, compression=codec)
    meta = TopicMetadata.open(uri)
    old = [lg.object for lg in meta.load_topic().ledgers[:2]]
    rewrite_as_version_2(uri, old)
    assert [f.event_times() is None for f in objects_of(uri)][:3] == [True, True, False]
    assert Compactor(uri, cfg).run().status == "compacted"
    assert check_event_times(uri) >= 1
    # the next run copies the parts (version 3 footers) and a version 2 part
    first = meta.load_compaction().parts[0].object
    rewrite_as_version_2(uri, [first])
    produce(uri, 2, 400, compression=codec)
    assert Compactor(uri, cfg).run().status == "compacted"
    assert check_event_times(uri) >= 1


def test_parts_of_records_without_event_times_keep_that_they_have_none(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    produce(uri, 3, 600, compression="none", events=False)
    cfg = CompactionConfig(delete_retention_ms=0, compression=parse_compression("none"), event_times=True)
    assert Compactor(uri, cfg).run()
    assert check_event_times(uri) >= 1
    assert all("r_event" not in f.footer.cols for f in objects_of(uri) if f.footer.kind != KIND_COMPACTED)


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_by_default_parts_carry_no_event_times_and_say_so(tmp_path: Path, codec: str) -> None:
    """Packed entries mix records of several entries, so a part without the column must
    not read as "no record has an event time": it reads as unknown, and a scrub of it
    passes; a later run that keeps event times decodes its records."""
    uri = str(tmp_path / "t")
    produce(uri, 6, 500, compression=codec)
    cfg = CompactionConfig(delete_retention_ms=0, compression=parse_compression(codec), max_part_bytes=1 << 16,
                           reuse_min_bytes=1 << 40)
    assert Compactor(uri, cfg).run().status == "compacted"
    parts = [f for f in objects_of(uri) if f.footer.kind == KIND_COMPACTED]
    assert parts and all(f.footer.version == 3 and "r_event" not in f.footer.cols for f in parts)
    assert all(f.event_times() is None for f in parts)
    assert any(m.event_time is not None for f in parts for m in f.messages())
    assert run_cli_here("verify", uri, "--scrub").returncode == 0
    produce(uri, 7, 200, compression=codec)
    assert Compactor(uri, dataclasses.replace(cfg, event_times=True)).run().status == "compacted"
    assert check_event_times(uri) >= 1


def lie_about_an_event_time(data: bytes) -> bytes:
    p = objects.parse(data)
    n = int(p.e_rec_start[-1])
    events = p.cols.get("r_event")
    if events is None:
        events = np.repeat(p.cols["e_publish"], np.diff(p.e_rec_start.astype(np.int64)))
    events = events.copy()
    events[n // 2] += 1
    p.cols["r_event"] = events
    return objects.build(p)


@pytest.mark.parametrize("which", ["ledger", "part"])
def test_scrub_refuses_a_footer_whose_event_time_lies(tmp_path: Path, which: str) -> None:
    uri = str(tmp_path / "t")
    produce(uri, 4, 400)
    Compactor(uri, CompactionConfig(delete_retention_ms=0, event_times=True)).run()
    meta = TopicMetadata.open(uri)
    assert run_cli_here("verify", uri, "--scrub").returncode == 0
    name = meta.load_topic().ledgers[0].object if which == "ledger" else meta.load_compaction().parts[0].object
    tamper.write_raw(uri, name, lie_about_an_event_time(tamper.read_raw(uri, name)))
    r = run_cli_here("verify", uri, "--scrub")
    assert r.returncode == 4, r.stdout + r.stderr
    lines = [line for line in (r.stdout + r.stderr).splitlines() if "event time" in line]
    assert len(lines) == 1 and name in lines[0] and "record" in lines[0] and "footer" in lines[0], r.stdout
    assert "Traceback" not in r.stderr


def test_parts_keep_each_records_entry_publish_time_and_scrub_checks_it(tmp_path: Path) -> None:
    """A run in event-time order keeps, per record, the publish time of the entry it was
    first written in (``r_publish``) — not the packed entry's, the latest of what it
    packs — and a footer that puts it before the record's own is refused (exit 4)."""
    uri = str(tmp_path / "t")
    produce(uri, 8, 600)
    meta = TopicMetadata.open(uri)
    loc = meta.topic
    first_publish = {}
    for lg in meta.load_topic().ledgers:
        f = LedgerFile.open(loc.store, loc.key(lg.object))
        for i, m in enumerate(f.messages()):
            first_publish[m.id] = int(f.footer.record_publish()[i])
    cfg = CompactionConfig(delete_retention_ms=0, order="event-time", compression=parse_compression("zstd"),
                           entry_bytes=1 << 10)
    assert Compactor(uri, cfg).run().status == "compacted"
    parts = [f for f in objects_of(uri) if f.footer.kind == KIND_COMPACTED]
    assert parts and all("r_publish" in f.footer.cols for f in parts)
    packed_later = 0
    for f in parts:
        kept = f.footer.record_publish()
        for i, m in enumerate(f.messages()):
            assert int(kept[i]) == first_publish[m.id]
        packed = np.repeat(f.footer.cols["e_publish"], np.diff(f.footer.e_rec_start.astype(np.int64)))
        packed_later += int(np.count_nonzero(packed > kept))
    assert packed_later, "no packed entry mixes records of entries published apart"
    assert run_cli_here("verify", uri, "--scrub").returncode == 0
    name = meta.load_compaction().parts[0].object
    p = objects.parse(tamper.read_raw(uri, name))
    early = p.cols["r_publish"].copy()
    early[3] = 0
    p.cols["r_publish"] = early
    tamper.write_raw(uri, name, objects.build(p))
    r = run_cli_here("verify", uri, "--scrub")
    assert r.returncode == 4, r.stdout + r.stderr
    assert "publish time" in r.stdout + r.stderr and name in r.stdout + r.stderr
    assert "Traceback" not in r.stderr


def test_parts_of_all_timed_records_in_event_order_keep_no_publish_times(tmp_path: Path) -> None:
    """Under event-time order a record's publish time counts only in place of its event
    time: a part whose records all have one holds no ``r_publish``, and reads the same.
    Under offset order with a key TTL, which ages by publish time, it does."""
    uri = str(tmp_path / "t")
    with TopicWriter(uri, batch_size=7) as w:
        for i in range(100):
            w.append(f"k{i % 13}", f"v{i}", event_time=1_600_000_000_000 + (i * 7919) % 1000)
    assert Compactor(uri, CompactionConfig(delete_retention_ms=0, order="event-time")).run().status == "compacted"
    parts = [f for f in objects_of(uri) if f.footer.kind == KIND_COMPACTED]
    assert parts and all("r_event" in f.footer.cols and "r_publish" not in f.footer.cols for f in parts)
    assert run_cli_here("verify", uri, "--scrub").returncode == 0
    assert Compactor(uri, CompactionConfig(delete_retention_ms=0, key_ttl_ms=10**13, rewrite=True)).run().ok
    parts = [f for f in objects_of(uri) if f.footer.kind == KIND_COMPACTED]
    assert parts and all("r_publish" in f.footer.cols for f in parts)
