"""The hostile fuzz (``tests/metadata/test_fuzz_hostile.py``) for compressed frames and dictionaries:
lies told inside the checksums of compressed entries, and dictionaries changed under
their registration.

Every example copies a small topic whose ledgers and compacted parts hold entries of
every codec (zstd frames with and without zstd's content checksum, lz4 blocks, zstd
frames compressed with the topic's trained dictionary; entries of 40 records, big enough
to be copied whole), tells it one or two lies, runs ``compact`` (writing a codec drawn at
random) and then, as a ``retention`` policy does after a publish, removes every ledger
wholly below the horizon and collects garbage two days on.  What must hold whatever the
lies:

1. **Nothing undecodable is published.**  A run either publishes nothing (it fails with a
   :class:`~ledger.errors.ShaleError`, and every registered ledger, dictionary,
   metadata document and published part is as it was) or every entry of every part it
   wrote decodes — checked with the codec libraries and msgpack, not with Shale's code,
   through the dictionaries the store holds: one frame or block and nothing after it,
   of the footer's size, every record where its footer puts it.
2. **``read --compacted`` and ``verify`` agree**: when verify finds the view right, the
   compacted view reads back in full up to the horizon.
3. **A run that could see a sound topic publishes a view that verifies** (lies told about
   a dictionary or a compacted part are rewrites of what was already published: there,
   property 1 is what is asserted; lies in ledgers no run reads again are undone before
   verify, as in ``test_fuzz_hostile.py``).
4. **Retention loses nothing readable**: after the ledgers below the horizon are removed
   and garbage is collected, the compacted view reads back exactly as it did right after
   the publish, and every registered dictionary is still there.

and every failure is a ShaleError, never another exception.  The lies:

* a compressed entry of a ledger or a compacted part (stored payload and frame header
  rebuilt, CRC32C right): compressed again from one byte more or a few bytes less than
  the footer says, a zstd frame that declares no content size, or another one (up to
  2^40), garbage of the same size, the records stored as they are under a compressed
  codec, bytes or a second frame after the frame, a bit flipped, the content checksum
  left out (a frame as written before it existed: must stay readable), another codec in
  the footer, another decompressed size in the footer, a frame compressed with a
  dictionary the topic does not have (or with one where the codec says none);
* a dictionary: bytes of its content changed, cut short, or the whole object replaced by
  another dictionary with the same id, with ``topic.json``'s size and CRC32C updated to
  match and its SHA-256 kept (damage), updated (a consistent rewrite) or removed (a
  registration made before it was recorded); or its object deleted.

The default run is seeded and bounded; ``SHALE_LONG_TESTS=1`` runs a long campaign.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import struct
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lz4.block
import msgpack
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from shale.compactor import CompactionConfig, Compactor, collect_garbage
from shale.ledger.codecs import Codec, Dictionary, parse_compression
from shale.ledger.errors import ShaleError
from shale.ledger.format import FLAG_HAS_KEY, FLAG_TOMBSTONE
from shale.ledger.ids import MessageId
from shale.ledger.kernels import crc32c
from shale.maintenance.retention import retention_cut, truncate
from shale.maintenance.verify import verify_topic
from shale.metadata.dictionaries import register_dictionary
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from tests import objects, tamper
from tests.metadata.test_fuzz_hostile import (
    DAY_MS,
    EXAMPLE_TIMEOUT_S,
    ORPHAN_GRACE_MS,
    Hung,
    _settings,
    event,
    note,
    watchdog,
)

pytestmark = pytest.mark.kernels  # (scripts/sanitize.sh runs these under ASan and UBSan)

PER_ENTRY = 40
NAMES = ["alice", "bob", "carol", "dave", "erin"]
CITIES = ["paris", "rome", "oslo", "lima", "kyiv"]
WRITES = ["zstd", "none", "lz4", "zstd-dict"]


# ------------------------------------------------------------------------ the template

def _value(i: int, rng: random.Random) -> str:
    return (f'{{"id": {i}, "name": "{rng.choice(NAMES)}", "city": "{rng.choice(CITIES)}", '
            f'"note": "{"n" * rng.randrange(40, 80)}"}}')


def _trained(seed: int, dict_id: int) -> Dictionary:
    rng = random.Random(seed)
    samples = [_value(i, rng).encode() for i in range(3000)]
    d = zstandard.train_dictionary(4096, samples, dict_id=dict_id)  # type: ignore[arg-type]
    return Dictionary(d.dict_id(), d.as_bytes())


def build_frames_topic(uri: str) -> None:
    """Ledgers 1 (zstd), 2 (lz4) and 3 (zstd-dict), compacted with zstd-dict; then, above
    the horizon, ledgers 4 (zstd) and 5 (zstd-dict) with frames as written before they
    carried a content checksum, and 6 (lz4).  Four entries of 40 records a ledger; 3 % of
    the records write a key again, so that a few entries are only partly kept."""
    rng = random.Random(5)

    def produce(first: int, compression: str) -> None:
        with TopicWriter(uri, batch_size=PER_ENTRY, max_ledger_records=4 * PER_ENTRY, compression=compression) as w:
            for i in range(first, first + 4 * PER_ENTRY):
                k = rng.randrange(first) if first and rng.random() < 0.03 else i
                w.append(f"user-{k:05d}", _value(i, rng))

    produce(0, "zstd")
    produce(160, "lz4")
    register_dictionary(TopicMetadata.open(uri), _trained(1, 40_000))
    produce(320, "zstd-dict")
    Compactor(uri, CompactionConfig(delete_retention_ms=0, compression=parse_compression("zstd-dict"))).run()
    produce(480, "zstd")
    produce(640, "zstd-dict")
    produce(800, "lz4")
    meta = TopicMetadata.open(uri)
    dictionaries = current_dictionaries(uri)
    for lg in meta.load_topic().ledgers[3:5]:
        p = objects.parse(tamper.read_raw(uri, lg.object))
        for e, stored in enumerate(p.payloads):
            codec = int(p.cols["e_codec"][e])
            raw = decoded(stored, codec, int(p.cols["e_raw_length"][e]), dictionaries)
            p.payloads[e] = recompressed(raw, codec, dictionaries, checksum=False)
        tamper.write_raw(uri, lg.object, objects.build(p))


# ------------------------------------------------------------ codecs, independently of Shale

def current_dictionaries(uri: str) -> dict[int, bytes]:
    """The dictionaries ``topic.json`` registers, as the store holds them (those whose
    object is missing left out)."""
    out = {}
    try:
        registered = TopicMetadata.open(uri).load_topic().dictionaries
    except ShaleError:
        return out
    for d in registered:
        path = Path(uri) / d.object
        if path.is_file():
            out[d.id] = path.read_bytes()
    return out


def decoded(stored: bytes, codec: int, size: int, dictionaries: dict[int, bytes]) -> bytes:
    """``stored`` decompressed with the codec libraries, or :class:`ValueError` saying why
    it is not exactly one frame or block of ``size`` bytes."""
    if codec == Codec.NONE:
        raw = stored
    elif codec == Codec.LZ4:
        raw = lz4.block.decompress(stored, uncompressed_size=size)
    elif codec in (Codec.ZSTD, Codec.ZSTD_DICT):
        params = zstandard.get_frame_parameters(stored)
        if params.content_size != size:
            raise ValueError(f"declares {params.content_size} bytes, the footer {size}")
        if (codec == Codec.ZSTD) != (params.dict_id == 0):
            raise ValueError(f"codec {codec} with dictionary {params.dict_id}")
        zdict = None
        if codec == Codec.ZSTD_DICT:
            if params.dict_id not in dictionaries:
                raise ValueError(f"no dictionary {params.dict_id}")
            zdict = zstandard.ZstdCompressionDict(dictionaries[params.dict_id])
        raw = zstandard.ZstdDecompressor(dict_data=zdict).decompress(stored, max_output_size=size,
                                                                     allow_extra_data=False)
    else:
        raise ValueError(f"codec {codec}")
    if len(raw) != size:
        raise ValueError(f"{len(raw)} bytes, the footer says {size}")
    return raw


def recompressed(raw: bytes, codec: int, dictionaries: dict[int, bytes], *, checksum: bool = True,
                 content_size: bool = True, dictionary: bytes | None = None) -> bytes:
    if codec == Codec.LZ4:
        return bytes(lz4.block.compress(raw, store_size=False))
    if codec == Codec.NONE:
        return raw
    if dictionary is None and codec == Codec.ZSTD_DICT:
        dictionary = next(iter(dictionaries.values()))
    zdict = zstandard.ZstdCompressionDict(dictionary) if dictionary is not None else None
    return zstandard.ZstdCompressor(level=3, dict_data=zdict, write_checksum=checksum,
                                    write_content_size=content_size).compress(raw)


def undecodable(data: bytes, dictionaries: dict[int, bytes]) -> list[str]:
    """Every entry of the object ``data`` that does not decode, or whose records are not
    each one msgpack record ``[key, value, properties, publish_time, event_time]`` where
    the footer puts it, with the footer's flags (empty: all decode)."""
    try:
        p = objects.parse(data)
    except Exception as e:
        return [f"not an object: {e!r}"]
    bad = []
    start = [int(x) for x in p.e_rec_start]
    for e, stored in enumerate(p.payloads):
        try:
            raw = decoded(stored, int(p.cols["e_codec"][e]), int(p.cols["e_raw_length"][e]), dictionaries)
            for r in range(start[e], start[e + 1]):
                at, size = int(p.cols["r_offset"][r]), int(p.cols["r_size"][r])
                key, value, props, publish, event_time = msgpack.unpackb(raw[at:at + size], raw=False,
                                                                          strict_map_key=True)
                flags = (FLAG_HAS_KEY if key is not None else 0) | (FLAG_TOMBSTONE if not value else 0)
                if not (isinstance(key, bytes | None) and isinstance(value, bytes | None)
                        and isinstance(props, dict | None) and isinstance(publish, int)
                        and isinstance(event_time, int | None) and int(p.cols["r_flags"][r]) == flags):
                    raise ValueError(f"record {r} is not a record of its flags")
        except Exception as error:
            bad.append(f"entry {e} (codec {int(p.cols['e_codec'][e])}): {error!r}")
    return bad


# --------------------------------------------------------------------------- the world

@dataclass(slots=True)
class World:
    template: Path
    topic: Path
    pristine: dict[int, bytes] = field(default_factory=dict)  # the template's dictionaries

    @property
    def uri(self) -> str:
        return str(self.topic)


def make_world(tmp_path: Path) -> World:
    template = tmp_path / "template" / "topic"
    if not (template / "_meta" / "topic.json").exists():
        shutil.rmtree(template.parent, ignore_errors=True)
        build_frames_topic(str(template))
    work = tmp_path / "work"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(template, work / "topic")
    return World(template, work / "topic", current_dictionaries(str(template)))


# --------------------------------------------------------------------------- the lies

@dataclass(slots=True)
class Lie:
    family: str  # "frame" (in a ledger or a part) or "dictionary"
    what: str
    target: str  # the object lied about, relative to the topic
    in_part: bool = False


def _declaring(frame: bytes, size: int) -> bytes:
    """``frame`` (written without a content size) declaring ``size`` bytes."""
    fhd = frame[4]
    dict_bytes = (0, 1, 2, 4)[fhd & 3]
    head = 6 + dict_bytes  # magic, descriptor, window descriptor, dictionary id
    return frame[:4] + bytes([fhd | 0xC0]) + frame[5:head] + struct.pack("<Q", size) + frame[head:]


def lie_in_frame(data: st.DataObject, w: World) -> Lie:
    files = sorted((w.topic / "ledgers").glob("*.ledger")) + sorted((w.topic / "compacted").rglob("*.ledger"))
    path = data.draw(st.sampled_from(files), label="object")
    rel = str(path.relative_to(w.topic))
    p = objects.parse(path.read_bytes())
    # a compressed entry no earlier lie touched
    compressed = []
    for i in range(len(p.payloads)):
        if p.cols["e_codec"][i] != Codec.NONE:
            try:
                decoded(p.payloads[i], int(p.cols["e_codec"][i]), int(p.cols["e_raw_length"][i]), w.pristine)
                compressed.append(i)
            except Exception:
                pass
    if not compressed:
        return Lie("frame", f"{rel}: no entry left to lie about", rel, in_part=rel.startswith("compacted/"))
    e = data.draw(st.sampled_from(compressed), label="entry")
    codec, size = int(p.cols["e_codec"][e]), int(p.cols["e_raw_length"][e])
    stored = p.payloads[e]
    raw = decoded(stored, codec, size, w.pristine)
    zstd = codec != Codec.LZ4
    ops = ["one byte more", "bytes fewer", "garbage", "stored as it is", "bytes after", "a second frame", "bit flip",
           "no content checksum", "another codec", "another size in the footer", "another dictionary"]
    ops += ["no content size", "declares another size"] if zstd else []
    op = data.draw(st.sampled_from(ops), label="op")
    what = op
    if op == "one byte more":
        p.payloads[e] = recompressed(raw + b"}", codec, w.pristine)
    elif op == "bytes fewer":
        k = data.draw(st.integers(1, 16), label="fewer")
        p.payloads[e] = recompressed(raw[:-k], codec, w.pristine)
        what = f"{k} bytes fewer"
    elif op == "garbage":
        p.payloads[e] = data.draw(st.binary(min_size=len(stored), max_size=len(stored)), label="garbage")
    elif op == "stored as it is":
        p.payloads[e] = raw
    elif op == "bytes after":
        tail = data.draw(st.binary(min_size=1, max_size=16), label="tail")
        p.payloads[e] = stored + tail
        what = f"{len(tail)} bytes after it"
    elif op == "a second frame":
        p.payloads[e] = stored + recompressed(b"more", codec, w.pristine)
    elif op == "bit flip":
        i = data.draw(st.integers(0, len(stored) * 8 - 1), label="bit")
        p.payloads[e] = stored[:i // 8] + bytes([stored[i // 8] ^ (1 << (i % 8))]) + stored[i // 8 + 1:]
        what = f"bit {i} flipped"
    elif op == "no content checksum":  # what a build before content checksums wrote: must stay readable
        p.payloads[e] = recompressed(raw, codec, w.pristine, checksum=False)
    elif op == "another codec":
        new = data.draw(st.sampled_from([c for c in (Codec.LZ4, Codec.ZSTD, Codec.ZSTD_DICT) if c != codec]),
                        label="codec")
        p.cols["e_codec"][e] = new
        what = f"codec {codec} -> {int(new)} in the footer"
    elif op == "another size in the footer":
        d = data.draw(st.sampled_from([1, -1, 7, size]), label="by")
        p.cols["e_raw_length"][e] = size + d
        what = f"e_raw_length {size} -> {size + d}"
    elif op == "another dictionary":  # one the topic does not have, or another under the registered id
        dict_id = data.draw(st.sampled_from([40_000, 40_001]), label="dictionary id")
        p.payloads[e] = recompressed(raw, Codec.ZSTD_DICT, w.pristine, dictionary=_trained(2, dict_id).data)
        what = f"compressed with another dictionary {dict_id}"
    elif op == "no content size":
        p.payloads[e] = recompressed(raw, codec, w.pristine, content_size=False)
    else:
        declared = data.draw(st.sampled_from([0, size - 1, size + 1, 1 << 40]), label="declared")
        p.payloads[e] = _declaring(recompressed(raw, codec, w.pristine, content_size=False), declared)
        what = f"declares {declared} bytes"
    path.write_bytes(objects.build(p))
    return Lie("frame", f"{rel} entry {e} (codec {codec}): {what}", rel, in_part=rel.startswith("compacted/"))


def lie_about_dictionary(data: st.DataObject, w: World) -> Lie:
    (reg,) = TopicMetadata.open(w.uri).load_topic().dictionaries
    path = w.topic / reg.object
    old = path.read_bytes()
    op = data.draw(st.sampled_from(["change bytes", "change names", "cut short", "replace", "delete"]), label="op")
    if op == "delete":
        path.unlink()
        return Lie("dictionary", f"{reg.object} deleted", reg.object)
    if op == "change bytes":  # in its content (the tables come first)
        at = data.draw(st.lists(st.integers(len(old) // 2, len(old) - 1), min_size=1, max_size=8), label="at")
        new = bytearray(old)
        for i in at:
            new[i] = data.draw(st.integers(0, 255), label="byte")
        new_bytes = bytes(new)
    elif op == "change names":  # same length, same structure: values decode to other names
        new_bytes = old.replace(b"alice", b"mallo").replace(b"user-", b"usex-")
    elif op == "cut short":
        new_bytes = old[:data.draw(st.integers(8, len(old) - 1), label="cut at")]
    else:
        new_bytes = _trained(3, reg.id).data
    sha = data.draw(st.sampled_from(["kept", "updated", "removed"]), label="sha256")
    path.write_bytes(new_bytes)

    def change(doc: dict[str, Any]) -> None:
        (d,) = doc["value"]["dictionaries"]
        d.update(bytes=len(new_bytes), crc32c=crc32c(new_bytes))
        if sha == "updated":
            d["sha256"] = hashlib.sha256(new_bytes).hexdigest()
        elif sha == "removed":
            d.pop("sha256", None)

    tamper.edit(w.uri, "topic.json", change)
    return Lie("dictionary", f"{reg.object}: {op}, size and CRC32C updated, SHA-256 {sha}", reg.object)


# ---------------------------------------------------------------------- the properties

def published(uri: str) -> tuple[int, MessageId | None, list[str]]:
    state = TopicMetadata.open(uri).load_compaction()
    return state.epoch, state.horizon, [p.object for p in state.parts]


def compacted_view(uri: str, horizon: MessageId | None) -> list[tuple[Any, ...]]:
    """The compacted view up to ``horizon``, read back (raising what the reader raises)."""
    out = []
    with TopicReader(uri, read_compacted=True) as reader:
        for m in reader:
            if horizon is None or m.id > horizon:
                break
            out.append((m.id, m.key, m.value, dict(m.properties), m.publish_time, m.event_time))
    return out


def guarded(name: str, fn: Callable[[], Any], results: dict[str, str], unclassified: list[str]) -> Any:
    try:
        with watchdog(EXAMPLE_TIMEOUT_S):
            got = fn()
        results[name] = "ok"
        return got
    except ShaleError as e:
        results[name] = f"{type(e).__name__}: {e}"
        event(f"{name}: {type(e).__name__}")
    except (Exception, Hung) as e:
        results[name] = f"UNCLASSIFIED {type(e).__name__}: {e}"
        unclassified.append(f"{name}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
    return None


def check_frames_example(data: st.DataObject, tmp_path: Path, families: tuple[str, ...]) -> None:
    w = make_world(tmp_path)
    before_epoch, _, before_parts = published(w.uri)
    lies = []
    for _ in range(data.draw(st.integers(1, 2), label="lies")):
        family = data.draw(st.sampled_from(families), label="family")
        lie = lie_in_frame(data, w) if family == "frame" else lie_about_dictionary(data, w)
        note(f"lie: {lie.what}")
        lies.append(lie)
        if family == "dictionary":
            break  # (a second lie would be told about an object that may be gone)
    write = data.draw(st.sampled_from(WRITES), label="compact writes")
    note(f"compact --compression {write}")
    kept = {name: body for name, body in tamper.snapshot(w.uri).items() if not name.startswith("compacted/")}
    kept |= {name: (w.topic / name).read_bytes() for name in before_parts}
    results: dict[str, str] = {}
    unclassified: list[str] = []
    config = CompactionConfig(delete_retention_ms=0, orphan_grace_ms=ORPHAN_GRACE_MS, gc_grace_ms=0,
                              compression=parse_compression(write))
    guarded("compact", lambda: Compactor(w.uri, config).run().status, results, unclassified)
    epoch, horizon, parts = published(w.uri)
    wrong: list[str] = []
    if epoch == before_epoch:
        event("not published")
        now = tamper.snapshot(w.uri)
        wrong += [f"{name} {'changed' if name in now else 'deleted'} by a run that published nothing"
                  for name, body in kept.items() if now.get(name) != body]
    else:
        event("published")
        # 1. every part the run wrote decodes, through the dictionaries the store holds
        dictionaries = current_dictionaries(w.uri)
        for name in sorted(set(parts) - set(before_parts)):
            wrong += [f"{name}: {why}" for why in undecodable((w.topic / name).read_bytes(), dictionaries)]
        # 2. verify and the compacted view agree; 3. a sound topic's publish verifies
        sound = not any(lie.family == "dictionary" or lie.in_part for lie in lies)
        if sound:
            for lg in TopicMetadata.open(str(w.template)).load_topic().ledgers[:3]:
                shutil.copyfile(w.template / lg.object, w.topic / lg.object)  # below the horizon: never read
        report = guarded("verify", lambda: verify_topic(TopicMetadata.open(w.uri)), results, unclassified)
        view = guarded("read --compacted", lambda: compacted_view(w.uri, horizon), results, unclassified)
        if report is not None and report.ok and view is None:
            wrong.append(f"verify finds the view right, and a compacted read fails: {results['read --compacted']}")
        if sound and (report is None or not report.ok):
            wrong.append(f"a run over a sound topic published a view verify refuses: "
                         f"{results['verify'] if report is None else report.human()}")
        # 4. retention after the publish, then garbage collection: nothing readable lost
        registered = {d.object: (w.topic / d.object).read_bytes() for d in
                      TopicMetadata.open(w.uri).load_topic().dictionaries if (w.topic / d.object).is_file()}

        def retention() -> None:
            meta = TopicMetadata.open(w.uri)
            cut = retention_cut(meta, older_than_ms=0)
            ledgers = meta.load_topic().ledgers
            if ledgers and cut > ledgers[0].id:
                truncate(meta, cut)
            collect_garbage(meta, now_ms=meta.now_ms() + 2 * DAY_MS, grace_ms=0, orphan_grace_ms=ORPHAN_GRACE_MS)

        guarded("retention", retention, results, unclassified)
        if view is not None:
            after = guarded("read --compacted after retention", lambda: compacted_view(w.uri, horizon), results,
                            unclassified)
            if after != view:
                wrong.append(f"after retention the compacted view is {results['read --compacted after retention']}"
                             f" ({len(after or [])} records), right after the publish {len(view)} records")
        wrong += [f"registered dictionary {name} lost" for name, body in registered.items()
                  if not (w.topic / name).is_file() or (w.topic / name).read_bytes() != body]
    context = "\n  ".join(lie.what for lie in lies) + f"\ncompact --compression {write}: {results}"
    assert not wrong, f"{wrong}\nafter the lies\n  {context}"
    assert not unclassified, f"not a ShaleError: {unclassified}\nafter the lies\n  {context}"


# --------------------------------------------------------------------------- the tests

@pytest.mark.timeout(7200)
@_settings(80)
@given(data=st.data())
def test_lies_in_compressed_frames(tmp_path: Path, data: st.DataObject) -> None:
    check_frames_example(data, tmp_path, ("frame",))


@pytest.mark.timeout(7200)
@_settings(40)
@given(data=st.data())
def test_lies_about_dictionaries(tmp_path: Path, data: st.DataObject) -> None:
    check_frames_example(data, tmp_path, ("dictionary",))


@pytest.mark.timeout(7200)
@_settings(40)
@given(data=st.data())
def test_lies_in_frames_and_dictionaries(tmp_path: Path, data: st.DataObject) -> None:
    check_frames_example(data, tmp_path, ("frame", "dictionary"))


def test_the_frames_topic_is_what_the_fuzzer_expects(tmp_path: Path) -> None:
    """Every codec in the ledgers and the part, legacy frames above the horizon, entries
    copied whole; an untouched copy compacts (writing every codec) to a view that
    verifies, and survives retention."""
    w = make_world(tmp_path)
    meta = TopicMetadata.open(w.uri)
    codecs: set[tuple[str, int, bool]] = set()
    for name in [lg.object for lg in meta.load_topic().ledgers] + [p.object for p in meta.load_compaction().parts]:
        p = objects.parse(tamper.read_raw(w.uri, name))
        for e, stored in enumerate(p.payloads):
            codec = int(p.cols["e_codec"][e])
            checked = codec in (Codec.ZSTD, Codec.ZSTD_DICT) and zstandard.get_frame_parameters(stored).has_checksum
            codecs.add((name.split("/")[0], codec, checked))
        assert not undecodable(tamper.read_raw(w.uri, name), w.pristine)
    assert {("ledgers", Codec.ZSTD, True), ("ledgers", Codec.ZSTD, False), ("ledgers", Codec.ZSTD_DICT, True),
            ("ledgers", Codec.ZSTD_DICT, False), ("ledgers", Codec.LZ4, False), ("compacted", Codec.ZSTD_DICT, True),
            ("compacted", Codec.LZ4, False), ("compacted", Codec.ZSTD, True)} <= codecs, codecs
    for write in WRITES:
        w = make_world(tmp_path)
        s = Compactor(w.uri, CompactionConfig(delete_retention_ms=0, compression=parse_compression(write))).run()
        assert s.status == "compacted"
        assert verify_topic(TopicMetadata.open(w.uri)).ok
        whole = [p for p in objects.parse(tamper.read_raw(w.uri, TopicMetadata.open(w.uri).load_compaction()
                                                            .parts[0].object)).payloads]
        ledger = objects.parse(tamper.read_raw(w.uri, TopicMetadata.open(w.uri).load_topic().ledgers[-1].object))
        assert any(stored in whole for stored in ledger.payloads)  # some entries copied as they are stored
