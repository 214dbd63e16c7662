"""``shale dictionary``: train a zstd dictionary on a sample of a topic's records, register
it, and measure what it saves.

Records are sampled from the newest ledgers (decompressed, one sample per record, as zstd's
trainer wants them).  Every other entry sampled is kept out of the training and used to
measure: each is compressed on its own, as a producer stores it, with zstd at the level
asked for, with and without the new dictionary.  The dictionary is registered in the
topic (:mod:`shale.metadata.dictionaries`); ``--use`` also sets the topic's compression
policy to ``zstd-dict``, so producers and compactions write with it from then on — only when
it helps: a dictionary that leaves those entries no smaller than zstd alone is refused with
``--use`` (nothing registered, the policy unchanged).
"""

from __future__ import annotations

import random
from dataclasses import asdict
from typing import Any, Final, NamedTuple, cast

import numpy as np

from shale.ledger.codecs import MAX_DICTIONARY_BYTES, Codec, Compression, Dictionary, compress
from shale.ledger.errors import InvalidInputError
from shale.ledger.format import FRAME_HEADER
from shale.ledger.reader import LedgerFile
from shale.ledger.values import dataclass
from shale.metadata.dictionaries import register_dictionary
from shale.metadata.topic import TopicMetadata
from shale.settings.units import count

__all__ = ["TrainReport", "Trained", "gain_text", "train_and_register", "train_dictionary"]

#: zstd's trainer wants about a hundred times the dictionary's size in samples ...
SAMPLE_FACTOR: Final = 100
#: ... and is refused less than a tenth of that, or fewer records than this.
MIN_SAMPLE_FACTOR: Final = 10
MIN_SAMPLES: Final = 1000
#: Dictionary ids below this are reserved by zstd for a registry.
_MIN_ID: Final = 1 << 15


@dataclass(frozen=True, slots=True)
class TrainReport:
    """What training used and what the dictionary saves on entries it was not trained on."""

    topic: str
    dictionary_id: int
    dictionary_bytes: int
    records_sampled: int
    entries_measured: int
    raw_bytes: int  # the measured entries, uncompressed
    zstd_bytes: int  # ... each compressed on its own with zstd at the level
    zstd_dict_bytes: int  # ... and with the dictionary
    level: int
    used: bool  # whether the topic's compression policy was set to zstd-dict

    @property
    def helps(self) -> bool:
        """Whether the dictionary makes the entries measured smaller than zstd alone does."""
        return self.zstd_dict_bytes < self.zstd_bytes

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "helps": self.helps}

    def measured(self) -> str:
        """What it was measured on and what it gives, in words."""
        entries = count(self.entries_measured, "other entry", "other entries")
        return (f"on {entries} ({count(self.raw_bytes, 'byte')}), each compressed on its own: zstd:{self.level} "
                f"{count(self.zstd_bytes, 'byte')}, with the dictionary {self.zstd_dict_bytes:,} "
                f"({gain_text(self.zstd_bytes, self.zstd_dict_bytes)})")

    def human(self) -> str:
        line = (f"{self.topic}: trained dictionary {self.dictionary_id} ({count(self.dictionary_bytes, 'byte')}) on "
                f"{count(self.records_sampled, 'record')}; {self.measured()}")
        if self.used:
            return line + f"; producers and compactions now write zstd-dict:{self.level}"
        if not self.helps:
            return line + ("; it does not help: keep zstd (nothing uses a dictionary until the compression policy "
                           "says so)")
        return line + f"; to write with it: shale config {self.topic} --set compression=zstd-dict:{self.level}"


def gain_text(plain: int, with_dict: int) -> str:
    """What a dictionary does to ``plain`` bytes, made ``with_dict``: ``2.50x smaller``,
    ``no smaller``, or ``19.0% larger``."""
    if with_dict < plain:
        return f"{plain / with_dict:.2f}x smaller" if with_dict else "smaller"
    if with_dict == plain:
        return "no smaller"
    return f"{(with_dict - plain) / plain:.1%} larger" if plain else "larger"


def _sample(meta: TopicMetadata, want_bytes: int) -> tuple[list[bytes], list[bytes]]:
    """Records of the newest entries for training (about ``want_bytes``) and, apart, whole
    entry payloads to measure on: every other entry goes to one or the other."""
    loc = meta.topic
    train: list[bytes] = []
    measure: list[bytes] = []
    got = 0
    for lg in reversed(meta.load_topic().ledgers):
        f = LedgerFile.open(loc.store, loc.key(lg.object), ledger_id=lg.id, dictionaries=meta.dictionaries)
        foot = f.footer
        for c0, c1 in reversed(list(f.chunks(0, f.n_entries))):
            base, buf = f.read_frames(c0, c1)
            f.check_frames(buf, base, c0, c1)
            sel = np.arange(c0, c1, dtype=np.int64)
            raw, at = f.raw_frames(buf, base, sel)
            view = memoryview(raw)
            for i, e in reversed(list(enumerate(sel.tolist()))):
                r0, r1 = int(foot.e_rec_start[e]), int(foot.e_rec_start[e + 1])
                payload = int(at[i]) + FRAME_HEADER.size
                if e % 2:
                    measure.append(bytes(view[payload:payload + int(foot.raw_lengths()[e])]))
                    continue
                for r in range(r0, r1):
                    o = payload + int(foot.col("r_offset")[r])
                    train.append(bytes(view[o:o + int(foot.col("r_size")[r])]))
                    got += int(foot.col("r_size")[r])
            if got >= want_bytes:
                return train, measure
    return train, measure


class Trained(NamedTuple):
    dictionary: Dictionary
    records: int  # records it was trained on
    held_out: list[bytes]  # entry payloads kept out of its training, to measure it on


def train_dictionary(meta: TopicMetadata, *, size: int = 112 << 10, level: int = 3,
                     rng: random.Random | None = None) -> Trained:
    """A dictionary of about ``size`` bytes trained on the newest records of the topic."""
    import zstandard

    if not 1 << 10 <= size <= MAX_DICTIONARY_BYTES:
        raise InvalidInputError(f"dictionary size {size} must be from 1 KiB to {MAX_DICTIONARY_BYTES >> 10} KiB")
    meta.load_topic()  # a missing topic is named as such
    samples, measure = _sample(meta, SAMPLE_FACTOR * size)
    got = sum(map(len, samples))
    if len(samples) < MIN_SAMPLES or got < MIN_SAMPLE_FACTOR * size:
        raise InvalidInputError(
            f"{meta.uri}: cannot train a dictionary on {len(samples):,} records ({got:,} bytes): a dictionary of "
            f"{size:,} bytes needs {MIN_SAMPLES:,} records and {MIN_SAMPLE_FACTOR * size:,} bytes at least "
            f"({SAMPLE_FACTOR * size:,} is better); produce more first, or ask for a smaller --size")
    dictionary_id = (rng or random.SystemRandom()).randrange(_MIN_ID, 1 << 31)
    try:
        trained = zstandard.train_dictionary(size, cast("list[bytes | bytearray | memoryview]", samples),
                                             dict_id=dictionary_id, level=level)
    except zstandard.ZstdError as e:
        raise InvalidInputError(f"{meta.uri}: cannot train a dictionary on {len(samples):,} records "
                                f"({sum(map(len, samples)):,} bytes): {e}; a topic needs a few thousand records "
                                "first") from None
    return Trained(Dictionary(trained.dict_id(), trained.as_bytes()), len(samples), measure)


def _measure(dictionary: Dictionary, payloads: list[bytes], level: int) -> tuple[int, int, int]:
    plain, with_dict = Compression(Codec.ZSTD, level), Compression(Codec.ZSTD_DICT, level, dictionary)
    raw = sum(map(len, payloads))
    return (raw, sum(len(compress(p, plain)[1]) for p in payloads),
            sum(len(compress(p, with_dict)[1]) for p in payloads))


def train_and_register(meta: TopicMetadata, *, size: int = 112 << 10, level: int = 3, use: bool = False,
                       rng: random.Random | None = None) -> TrainReport:
    """Train a dictionary on the topic's newest records (:func:`train_dictionary`),
    register it, with ``use`` set the topic's compression policy to ``zstd-dict:LEVEL``,
    and measure what it saves on entries it was not trained on."""
    trained = train_dictionary(meta, size=size, level=level, rng=rng)
    raw, plain, with_dict = _measure(trained.dictionary, trained.held_out, level)
    report = TrainReport(meta.uri, trained.dictionary.id, len(trained.dictionary.data), trained.records,
                         len(trained.held_out), raw, plain, with_dict, level, use)
    if use and not report.helps:
        raise InvalidInputError(
            f"{meta.uri}: --use refused: the dictionary trained does not help, {report.measured()}; nothing was "
            "registered and the compression policy is unchanged (train on more records, or keep zstd)")
    register_dictionary(meta, trained.dictionary)
    if use:
        meta.update_policy({"compression": f"zstd-dict:{level}"}, [])
    return report
