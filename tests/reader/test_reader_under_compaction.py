"""A reader iterating the compacted view while compactions publish and garbage
collection (with no grace) deletes the parts it is reading, again and again: it finishes
without an error, without a duplicate, and with exactly the table a full replay of the
same records gives.

Every ``EVERY`` records the reader stops until one more compaction has published and
collected the parts it was reading, so those rounds land in the middle of its read
however fast or loaded the machine; between them compactions run freely beside it."""

from __future__ import annotations

import itertools
import random
import threading
from typing import Any

from shale.compactor import CompactionConfig, Compactor
from shale.ledger.ids import MessageId
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader

T0 = 1_700_000_000.0
#: The reader waits for a compaction after this many records.
EVERY = 3_000
#: At most this many compactions run beside the reader (it is not held for them).
FREE = 2


def produce(uri: str, rnd: random.Random, n: int) -> None:
    with TopicWriter(uri, max_ledger_records=1_500, batch_size=25) as w:
        for _ in range(n):
            w.append(f"key-{rnd.randrange(12_000)}", None if rnd.random() < 0.1 else f"v{rnd.random():.12f}")


def table_of(messages: list[Any]) -> dict[bytes, bytes]:
    table: dict[bytes, bytes] = {}
    for m in messages:
        if m.key is None:
            continue
        if m.value is None:
            table.pop(m.key, None)
        else:
            table[m.key] = m.value
    return table


def test_reader_survives_compaction_and_gc_underneath(disk_topic_uri: str) -> None:
    uri = disk_topic_uri
    rnd = random.Random(3)
    produce(uri, rnd, 30_000)
    # tombstones stay a day: a reader that saw a value must also see its deletion
    config = CompactionConfig(gc_grace_ms=0, max_part_bytes=1 << 16)
    assert Compactor(uri, config).run().status == "compacted"
    first_version = TopicMetadata.open(uri).load_compaction().version
    reader = TopicReader(uri, read_compacted=True, chunk_bytes=4_096)
    seen: list[Any] = []
    errors: list[BaseException] = []
    wants, resume = threading.Semaphore(0), threading.Semaphore(0)

    def read() -> None:
        try:
            for i, m in enumerate(reader):
                seen.append(m)
                if i % EVERY == EVERY - 1:  # hold here until a compaction has replaced what it reads
                    wants.release()
                    assert resume.acquire(timeout=300)
        except BaseException as e:  # reported below
            errors.append(e)

    t = threading.Thread(target=read)
    t.start()
    held = free = 0
    while t.is_alive():
        waiting = wants.acquire(timeout=0.01)
        if not waiting and free >= FREE:
            continue  # enough rounds beside the reader: only the held ones from here
        produce(uri, rnd, 400)
        assert Compactor(uri, config).run().status == "compacted"
        if waiting:
            held += 1
            resume.release()
        else:
            free += 1
    t.join()
    assert not errors, errors
    print(f"\n{held} held rounds, {free} free, {len(seen)} records read")
    assert held == len(seen) // EVERY >= 3  # rounds that ran in the middle of the read
    assert reader.compaction.version > first_version  # it followed newer states
    ids = [m.id for m in seen]
    assert all(a < b for a, b in itertools.pairwise(ids))
    last: MessageId = ids[-1]
    replay = [m for m in TopicReader(uri) if m.id <= last]
    assert table_of(seen) == table_of(replay)
    assert len(seen) < len(replay)  # it did read compacted data


def test_a_compacted_reader_opened_before_anything_was_written_keeps_its_state() -> None:
    """Nothing was ever truncated (``removed_through`` 0): a compacted reader opened on an
    empty topic reads the records written since from the original ledgers, as of the
    (empty) compaction state it opened with; it does not jump to a newer compaction that
    dropped a keyless record, as if retention had removed ledgers it had yet to read."""
    uri = "memory://reader-empty-start/t"
    TopicMetadata.open(uri).create_topic()
    r = TopicReader(uri, read_compacted=True)
    assert r.read() == []
    with TopicWriter(uri) as w:
        w.append(None, "keyless")
    assert Compactor(uri, CompactionConfig(delete_retention_ms=0)).run().keyless_dropped == 1
    got = r.read()
    assert [(m.id, m.value) for m in got] == [(MessageId(1, 0, 0), b"keyless")]
    assert r.compaction.epoch == 0
