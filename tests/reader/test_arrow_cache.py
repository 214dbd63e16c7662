"""The compacted parts' Arrow caches (policy ``arrow-cache``): Arrow reads of the view give
exactly what decoding the parts gives, whatever the read asks for; a broken or hostile
cache changes nothing but the speed; garbage collection, snapshots and ``verify`` treat a
cache as they treat its part.  Locally (mapped) and on S3 (moto: ranged reads)."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shale.compactor import CompactionConfig, Compactor
from shale.ledger.arrow_cache import cache_counts
from shale.ledger.errors import InvalidInputError
from shale.ledger.ids import MessageId
from shale.maintenance.gc import collect_garbage
from shale.maintenance.verify import verify_topic
from shale.metadata.topic import TopicMetadata
from shale.reader import TableView, TopicReader
from tests.needs import need_module
from tests.reader.test_arrow import T0, _produce

pa = need_module("pyarrow")
_YEARS = 10 * 365 * 86_400_000  # a key TTL no record is past when compacted


def _config(**more: Any) -> CompactionConfig:
    return CompactionConfig(**{"delete_retention_ms": 3_600_000, "arrow_cache": True, "snapshot_retention": 3,
                               "key_ttl_ms": _YEARS, **more})


def _topic(uri: str) -> None:
    """Three rounds: null keys kept, tombstones, properties, event times; the first part
    kept in place with a deletion vector by the second run; records above the horizon."""
    _produce(uri, 1, 900, "zstd")
    Compactor(uri, _config(retain_null_key=True)).run()
    _produce(uri, 2, 500, "lz4")
    Compactor(uri, _config(reuse_min_bytes=0, reuse_min_live=0.0)).run()
    _produce(uri, 3, 250, "none")


def _caches(uri: str) -> list[str]:
    """Every cache the state names (published, retained or retired), as the store's keys."""
    meta = TopicMetadata.open(uri)
    state = meta.load_compaction()
    names = {p.arrow_cache for p in state.parts if p.arrow_cache}
    names |= {p.arrow_cache for s in state.snapshots for p in s.parts if p.arrow_cache}
    return sorted(meta.topic.key(n) for n in names)


@contextlib.contextmanager
def _decoding(uri: str) -> Iterator[None]:
    """The caches taken away (the reader decodes every part), then put back."""
    store = TopicMetadata.open(uri).topic.store
    kept = {k: store.get(k) for k in _caches(uri)}
    for k in kept:
        store.delete(k)
    try:
        yield
    finally:
        for k, data in kept.items():
            store.put(k, data)


def _both(uri: str, read: Callable[[], Any]) -> tuple[Any, Any]:
    """``read()`` from the caches (each used, none refused), then with every part decoded."""
    used, refused = cache_counts()
    cached = read()
    now = cache_counts()
    assert now[0] > used and now[1] == refused
    with _decoding(uri):
        decoded = read()
    return cached, decoded


_MIDDLE = MessageId(5, 0, 0)  # (inside the second part)
_ABOVE_FIRST = MessageId(4, 20, 0)  # (between the two runs' horizons: epoch 1's view, then ledgers)


def _reads(uri: str) -> dict[str, Callable[[], Any]]:
    """What an Arrow read of the view may ask for."""
    at = (T0 + 450 + _YEARS) / 1000  # (a TTL's "now": the keys last written before T0 + 0.45 s expired)

    def in_batches(**kw: Any) -> Any:
        batches = list(TopicReader(uri, read_compacted=True).iter_batches(**kw))
        assert all(b.num_rows <= 7 for b in batches) or "rows" not in kw
        return pa.Table.from_batches(batches)

    return {
        "view": lambda: TopicReader(uri, read_compacted=True).to_arrow(),
        "rows of 7, ids as text": lambda: in_batches(rows=7, id_text=True),
        "from the middle": lambda: TopicReader(uri, read_compacted=True, start=_MIDDLE).to_arrow(),
        "as of epoch 1": lambda: TopicReader(uri, as_of=1).to_arrow(),
        "as of an id": lambda: TopicReader(uri, as_of=_ABOVE_FIRST).to_arrow(),
        "table": lambda: TableView(uri).to_arrow(),
        "table as of epoch 1": lambda: TableView(uri, as_of=1).to_arrow(),
        "table past a key TTL": lambda: TableView(uri, clock=lambda: at).to_arrow(),
        "messages in batches": lambda: pa.Table.from_batches(
            [b.records for b in TopicReader(uri, read_compacted=True).read_batches(rows=50)]),
    }


@pytest.mark.parametrize("where", ["local", "s3"])
def test_reads_from_the_caches_are_the_decoded_reads(where: str, request: pytest.FixtureRequest,
                                                     tmp_path: Any) -> None:
    from tests.conftest import make_root

    uri = f"{make_root(where, request, tmp_path)}/t"
    _topic(uri)
    assert len(_caches(uri)) >= 2  # (the kept part's, the second run's; the first run's in its snapshot)
    for name, read in _reads(uri).items():
        cached, decoded = _both(uri, read)
        assert cached.num_rows > 0, name
        assert cached.equals(decoded), name
        assert decoded.equals(cached), name
    # the deletion vector and the TTL took rows away: the reads did not all give the same
    reads = _reads(uri)
    assert reads["table past a key TTL"]().num_rows < reads["table"]().num_rows


def test_text_is_checked_as_when_decoded(tmp_path: Any) -> None:
    """Values that are not UTF-8 refused alike, naming the same record; text read alike."""
    uri = str(tmp_path / "t")
    _topic(uri)
    errors = []
    refused = cache_counts()[1]
    for cached in (True, False):
        with contextlib.nullcontext() if cached else _decoding(uri), pytest.raises(InvalidInputError) as e:
            TopicReader(uri, read_compacted=True).to_arrow(utf8=True)
        errors.append(str(e.value))
        if cached:
            assert cache_counts()[1] == refused  # (the text is at fault, not the cache)
    assert errors[0] == errors[1] and "UTF-8" in errors[0]
    text = str(tmp_path / "text")
    from shale.producer import TopicWriter

    with TopicWriter(text, batch_size=5) as w:
        for i in range(200):
            w.append(f"k{i % 37}", None if i % 11 == 0 else f"välue {i}", properties={"p": "ü"})
    Compactor(text, _config()).run()
    cached, decoded = _both(text, lambda: TopicReader(text, read_compacted=True).to_arrow(utf8=True))
    assert cached.equals(decoded) and cached.schema.field("value").type == pa.large_string()


def _rewritten(data: bytes, change: Callable[[Any, dict[bytes, bytes]], tuple[Any, dict[bytes, bytes]]]) -> bytes:
    """A cache's bytes, its table and schema metadata changed by ``change``."""
    table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
    table, meta = change(table, dict(table.schema.metadata))
    sink = io.BytesIO()
    with pa.ipc.new_file(sink, table.schema.with_metadata(meta)) as w:
        for b in table.to_batches():
            w.write_batch(b)
    return sink.getvalue()


def _huge_footer(data: bytes) -> bytes:
    # the footer's length, just before the closing magic: declared as 2 GiB
    return data[:-10] + (0x7FFF_FFF0).to_bytes(4, "little") + data[-6:]


def _renamed(t: Any, m: dict[bytes, bytes]) -> tuple[Any, dict[bytes, bytes]]:
    return t.rename_columns([*t.column_names[:-1], "deleted"]), m


def _wrong_rows(t: Any, m: dict[bytes, bytes]) -> tuple[Any, dict[bytes, bytes]]:
    return t, m | {b"batch_rows": b"1," + m[b"batch_rows"]}


def _other_part(t: Any, m: dict[bytes, bytes]) -> tuple[Any, dict[bytes, bytes]]:
    return t, m | {b"bytes": str(int(m[b"bytes"]) + 1).encode()}


def _offsets_out_of_bounds(data: bytes) -> bytes:
    """The last key offset of the first batch pointed a terabyte away, in the file's bytes."""
    batch = pa.ipc.open_file(pa.py_buffer(data)).get_batch(0)
    key = batch.column(3)
    offsets = bytes(key.buffers()[1])[:8 * (len(key) + 1)]
    at = data.index(offsets) + len(offsets) - 8
    return data[:at] + (1 << 40).to_bytes(8, "little") + data[at + 8:]


_BROKEN: dict[str, Callable[[bytes], bytes]] = {
    "truncated": lambda d: d[:len(d) // 2],
    "empty": lambda d: b"",
    "not Arrow": lambda d: b"PAR1" * 100,
    "a 2 GiB footer declared": _huge_footer,
    "wrong schema": lambda d: _rewritten(d, _renamed),
    "rows not the binding's": lambda d: _rewritten(d, _wrong_rows),
    "bound to another part": lambda d: _rewritten(d, _other_part),
    "offsets out of bounds": _offsets_out_of_bounds,
}


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_broken_cache_changes_nothing_but_is_counted(where: str, request: pytest.FixtureRequest,
                                                       tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    from tests.conftest import make_root

    uri = f"{make_root(where, request, tmp_path)}/t"
    _topic(uri)
    store = TopicMetadata.open(uri).topic.store
    read = _reads(uri)["view"]
    with _decoding(uri):
        want = read()
    key = _caches(uri)[-1]
    good = store.get(key)
    for name, breaking in _BROKEN.items():
        store.put(key, breaking(good))
        refused = cache_counts()[1]
        caplog.clear()
        assert read().equals(want), name
        assert cache_counts()[1] == refused + 1, name
        assert "Arrow cache" in caplog.text and "is not used" in caplog.text, name
    store.put(key, good)
    refused = cache_counts()[1]
    assert read().equals(want) and cache_counts()[1] == refused


def test_a_remote_read_holds_no_more_than_asked(request: pytest.FixtureRequest, tmp_path: Any) -> None:
    """On S3, a cache whose batches are bigger than the read may hold at once is not read
    (the part is decoded, within the bound)."""
    from tests.conftest import make_root

    uri = f"{make_root('s3', request, tmp_path)}/t"
    _topic(uri)
    with _decoding(uri):
        want = TopicReader(uri, read_compacted=True).to_arrow(max_batch_bytes=2_000)
    refused = cache_counts()[1]
    assert TopicReader(uri, read_compacted=True).to_arrow(max_batch_bytes=2_000).equals(want)
    assert cache_counts()[1] > refused


def test_gc_deletes_a_cache_with_its_part_and_never_before(tmp_path: Any) -> None:
    uri = str(tmp_path / "t")
    _produce(uri, 1, 400, "zstd")
    Compactor(uri, _config(snapshot_retention=1)).run()
    meta = TopicMetadata.open(uri)
    first = meta.load_compaction().parts
    assert all(p.arrow_cache for p in first)
    _produce(uri, 2, 400, "zstd")
    Compactor(uri, _config(snapshot_retention=1, collect_garbage=False)).run()  # (the first part copied: retired)
    state = meta.load_compaction()
    retired = {o for r in state.retired for o in r.objects}
    assert {p.object for p in first} | {p.arrow_cache for p in first if p.arrow_cache} <= retired

    def there(name: str) -> bool:
        return (tmp_path / "t" / name).exists()

    report = collect_garbage(meta, grace_ms=3_600_000, orphan_grace_ms=3_600_000)
    assert not report.retired_deleted and all(there(p.object) and there(str(p.arrow_cache)) for p in first)
    report = collect_garbage(meta, grace_ms=0, orphan_grace_ms=3_600_000)
    gone = set(report.retired_deleted)
    assert all(p.object in gone and p.arrow_cache in gone for p in first)
    assert not any(there(p.object) or there(str(p.arrow_cache)) for p in first)
    now = meta.load_compaction().parts
    assert all(p.arrow_cache and there(p.arrow_cache) for p in now)


def test_a_retained_snapshot_keeps_its_caches_and_reads_them(tmp_path: Any) -> None:
    uri = str(tmp_path / "t")
    _topic(uri)
    meta = TopicMetadata.open(uri)
    collect_garbage(meta, grace_ms=0, orphan_grace_ms=3_600_000)
    snap = meta.load_compaction().snapshots[0]
    assert all(p.arrow_cache and (tmp_path / "t" / p.arrow_cache).exists() for p in snap.parts)
    cached, decoded = _both(uri, lambda: TopicReader(uri, as_of=snap.epoch).to_arrow())
    assert cached.equals(decoded)
    # rolled back to it: its parts published again with their caches, which reads then use
    from shale.maintenance.snapshots import rollback

    rollback(meta, snap.epoch, keep=3)
    assert meta.load_compaction().parts == snap.parts
    after, _ = _both(uri, lambda: TopicReader(uri, as_of=snap.epoch).to_arrow())
    assert after.equals(cached)
    rolled, decoded = _both(uri, lambda: TopicReader(uri, read_compacted=True).to_arrow())
    assert rolled.equals(decoded)


def test_verify_compares_each_cache_with_its_part(tmp_path: Any) -> None:
    uri = str(tmp_path / "t")
    _topic(uri)
    meta = TopicMetadata.open(uri)
    report = verify_topic(meta)
    assert report.ok and report.caches_checked == len(meta.load_compaction().parts)
    # a cache bound to its part whose values are not the part's: read as it is (what
    # verify is for), and found by verify
    key = _caches(uri)[-1]
    store = meta.topic.store

    def other_value(t: Any, m: dict[bytes, bytes]) -> tuple[Any, dict[bytes, bytes]]:
        values = t.column("value").to_pylist()
        i = next(i for i, v in enumerate(values) if v)
        values[i] = b"?" + values[i][1:]
        return t.set_column(4, "value", pa.array(values, pa.large_binary())), m

    store.put(key, _rewritten(store.get(key), other_value))
    report = verify_topic(meta)
    assert not report.ok and report.caches_bad == 1
    assert any("Arrow cache does not match its part" in e for e in report.examples)
    from tests.conftest import run_cli_here

    r = run_cli_here("verify", uri)
    assert r.returncode == 5 and "not matching its part" in r.stdout  # (a mismatch, as of the view)


def test_the_policy_writes_caches_and_the_default_does_not(tmp_path: Any) -> None:
    from tests.conftest import run_cli_here

    plain, cached = str(tmp_path / "plain"), str(tmp_path / "cached")
    for uri in (plain, cached):
        _produce(uri, 1, 300, "zstd")
    assert run_cli_here("config", cached, "--set", "arrow-cache=true").returncode == 0
    for uri in (plain, cached):
        assert run_cli_here("compact", uri).returncode == 0
    assert not _caches(plain) and not list((tmp_path / "plain").rglob("*.arrow"))
    assert len(_caches(cached)) == len(list((tmp_path / "cached").rglob("*.arrow"))) >= 1
    a = TopicReader(plain, read_compacted=True).to_arrow()
    b = TopicReader(cached, read_compacted=True).to_arrow()
    assert a.equals(b)


def test_shale_read_prints_the_same_lines_from_the_caches(tmp_path: Any) -> None:
    """``shale read`` (its Arrow path) of the view and of the table, byte for byte."""
    from tests.conftest import run_cli_here

    uri = str(tmp_path / "t")
    _topic(uri)
    for args in (("--compacted",), ("--table",), ("--compacted", "--as-of", "1")):
        read, _ = cache_counts()
        cached = run_cli_here("read", uri, *args)
        assert cached.returncode == 0 and cached.stdout and cache_counts()[0] > read, args
        with _decoding(uri):
            decoded = run_cli_here("read", uri, *args)
        assert cached.stdout == decoded.stdout, args


def test_splits_are_read_from_the_caches(tmp_path: Any) -> None:
    """What the Spark data source's executors read: each split of the view, from its
    part's cache (and an original ledger's as before), the same rows as decoded."""
    from shale.reader.splits import plan_splits, read_split

    uri = str(tmp_path / "t")
    _topic(uri)
    meta = TopicMetadata.open(uri)

    def splits() -> Any:
        got = [b for s in plan_splits(meta, compacted=True, max_records=100) for b in read_split(meta, s, rows=64)]
        return pa.Table.from_batches(got)

    cached, decoded = _both(uri, splits)
    assert cached.equals(decoded) and cached.equals(TopicReader(uri, read_compacted=True).to_arrow())
