"""Fixtures of the Iceberg tests: a topic to compact, its table in a SQLite catalog with a
local warehouse, and a PostgreSQL server the tests start themselves (tests/postgres.py)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.needs import missing
from tests.postgres import PostgresServer
from tests.postgres import missing as postgres_missing


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    why = postgres_missing()
    if why:
        missing(why)
    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.stop()


class Topic:
    """A topic a test produces to and compacts, with every record it produced by key."""

    def __init__(self, root: Path, seed: int = 7, keys: int = 300) -> None:
        self.uri = str(root / "topic")
        self.rnd = random.Random(seed)
        self.keys = keys

    def produce(self, n: int, *, tombstones: float = 0.1, event_times: bool = False, now_ms: int | None = None,
                keys: int | None = None, pad: int = 0) -> None:
        from shale.producer import TopicWriter

        rnd = self.rnd
        clock = None if now_ms is None else (lambda: now_ms / 1000)
        with TopicWriter(self.uri, max_ledger_records=rnd.randrange(40, 120), batch_size=rnd.randrange(1, 6),
                         **({"clock": clock} if clock else {})) as w:
            for _ in range(n):
                key = f"k{rnd.randrange(keys or self.keys)}"
                value = None if rnd.random() < tombstones else \
                    f'{{"n": {rnd.randrange(10**6)}, "pad": "{rnd.randbytes(pad // 2).hex()}"}}'
                event = None
                if event_times and rnd.random() < 0.8:
                    event = (now_ms or 1_790_000_000_000) - rnd.randrange(0, 50) * 60_000
                w.append(key, value, event_time=event)

    def compact(self, **config: Any) -> Any:
        from shale.compactor import CompactionConfig, Compactor

        return Compactor(self.uri, CompactionConfig(delete_retention_ms=0, **config)).run()

    def meta(self) -> Any:
        from shale.metadata.topic import TopicMetadata

        return TopicMetadata.open(self.uri)


@pytest.fixture
def topic(tmp_path: Path) -> Topic:
    return Topic(tmp_path)


@pytest.fixture
def catalog_uri(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/catalog.db"


def load_table(catalog: str, name: str = "shale.t", warehouse: str | None = None) -> Any:
    from shale.iceberg.catalog import IcebergTarget, open_catalog

    return open_catalog(IcebergTarget(catalog, name, warehouse)).load_table(tuple(name.split(".")))
