"""The Spark engine holds the tombstones an active subscription has yet to read as the
local engine does, in the shuffle and where previous parts settle their own records
through a filter of the new keys, against the rules folded in plain Python."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from shale.compactor import CompactionConfig, Compactor
from shale.compactor.spark import SparkOptions
from shale.compactor.spark.engine import SparkEngine
from shale.ledger.ids import MessageId
from shale.metadata.subscriptions import Subscriptions
from shale.metadata.topic import TopicMetadata
from tests.compaction_model import CompactionModel, every_record
from tests.compactor.spark.test_spark import compacted, figures, produce
from tests.conftest import SPARK_APIS, spark_session

pytestmark = pytest.mark.slow
HOUR = 3600.0


@pytest.fixture(scope="module", params=SPARK_APIS)
def engine(request: pytest.FixtureRequest) -> Iterator[SparkEngine]:
    """In a classic session, then as a Spark Connect client of the same application."""
    eng = SparkEngine(SparkOptions(master="local[2]", split_bytes=1 << 16, split_records=300, reduce_partitions=3,
                                   conf=(("spark.ui.enabled", "false"),)), session=spark_session(request.param))
    yield eng
    eng.close()


def test_spark_holds_what_a_subscription_has_yet_to_read_as_the_local_engine_does(engine: SparkEngine,
                                                                                   tmp_path: Path) -> None:
    uris = {name: str(tmp_path / name) for name in ("local", "filter", "shuffle")}
    engines = {"local": None, "filter": engine,
               "shuffle": SparkEngine(replace(engine.options, key_filter=False), session=engine.session)}
    cfg = CompactionConfig(delete_retention_ms=int(HOUR * 1000), reuse_min_bytes=1 << 10, max_part_bytes=1 << 16)
    t = 1_700_000_000.0
    model = CompactionModel()
    # inside the second ledger, then inside a compacted part; then past everything
    positions = [MessageId(2, 50, 3), MessageId(2, 50, 3), None]
    for rnd, (n, at) in enumerate(zip((3_000, 150, 120), positions, strict=True)):
        for uri in uris.values():
            produce(uri, seed=60 + rnd, n=n, t=t, keys=3_000, tomb=0.2)
            subs = Subscriptions(TopicMetadata.open(uri))
            here = at or MessageId(TopicMetadata.open(uri).load_topic().last_ledger_id + 1, 0, 0)
            sub = subs.load("app")
            if sub is None:
                subs.create("app", here, now_ms=int(t * 1000))
            else:
                subs.commit(sub, here, now_ms=int(t * 1000))
        t += 2 * HOUR  # the tombstones kept by the run before are past their retention
        runs = {name: Compactor(uri, cfg, clock=lambda t=t: t, engine=engines[name]).run()
                for name, uri in uris.items()}
        assert all(r.status == "compacted" for r in runs.values()), runs
        assert figures(runs["filter"]) == figures(runs["local"]) == figures(runs["shuffle"])
        assert compacted(uris["filter"]) == compacted(uris["local"]) == compacted(uris["shuffle"])
        records = every_record(uris["filter"])
        model.run(records, now_ms=int(t * 1000), retention_ms=cfg.delete_retention_ms, hold=positions[rnd] or
                  MessageId(records[-1].id.ledger + 1, 0, 0), max_hold_ms=cfg.max_tombstone_hold_ms)
        assert compacted(uris["filter"]) == model.rows(records)
        if rnd == 1:  # the first round's tombstones: before the position gone with their retention, after it held
            tombs = [MessageId.parse(r[0]) for r in compacted(uris["filter"]) if r[1] is not None and not r[2]]
            assert runs["filter"].tombstones_dropped > 0 and min(tombs) >= MessageId(2, 50, 3)
            assert runs["filter"].tombstones_held > 0  # (counted alike by every engine: the figures above)
            assert any(i < MessageId(4, 0, 0) for i in tombs)
    assert runs["filter"].tombstones_dropped > 0  # read past: the held ones went
