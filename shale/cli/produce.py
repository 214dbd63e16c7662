"""``shale produce``: JSON lines, or the rows of a Parquet, Arrow IPC or CSV file, appended
to a topic.  A bad line stops the run after sealing the lines before it, so nothing
accepted is lost; an interrupt does the same between two records (JSON lines read as
columns: two chunks of lines)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING

from shale.cli.app import Streams
from shale.cli.output import emit
from shale.ledger.errors import InvalidInputError
from shale.runtime import interrupts
from shale.settings import Settings
from shale.settings.units import count

if TYPE_CHECKING:
    from shale.producer import TopicWriter

__all__ = ["run_produce"]


@interrupts.deferred  # a record is appended whole or not at all: an interrupt waits for the next read
def run_produce(args: argparse.Namespace, io: Streams) -> int:
    from shale.producer import TopicWriter
    from shale.producer.ingest import format_of

    fmt = args.format or format_of(args.input)
    picked = [s for s in ("key-field", "value-field", "properties-field", "event-time-field")
              if args.settings.value(s) is not None]
    if fmt == "jsonl" and picked:
        raise InvalidInputError(f"--{picked[0]} picks a column of parquet, arrow or csv input; JSON lines have "
                                "fixed fields (see shale produce --help)")
    own = _with_policy(args)
    stream, name = _open_input(args.input)
    try:
        writer = TopicWriter(args.topic, metadata_uri=args.metadata, max_ledger_records=args.max_ledger_records,
                             max_ledger_bytes=args.max_ledger_bytes, batch_size=args.batch_size,
                             compression=own.value("compression"), max_ledger_age_ms=own.value("max-ledger-age"),
                             producer_id=args.producer_id, producer_expiry_ms=own.value("producer-expiry"))
        _append_all(writer, stream, name, fmt, args)
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
    emit(writer.close(), io.out, args.json)
    return 0


def _open_input(path: str) -> tuple[IO[bytes], str]:
    if path in (None, "-"):
        return sys.stdin.buffer, "<stdin>"
    try:
        return open(path, "rb"), path
    except OSError as e:
        raise InvalidInputError(f"cannot open input {path}: {e.strerror}") from None


def _with_policy(args: argparse.Namespace) -> Settings:
    """The settings by the one precedence rule: the flag > the topic's policy (its
    compression, max-ledger-age, producer-expiry) > the variable > the default."""
    from shale.metadata.topic import TopicMetadata
    from shale.producer.idempotence import check_producer_id

    if args.producer_id is not None:
        check_producer_id(args.producer_id)  # (refused before the topic is read, or made)
    given: Settings = args.settings
    if all(given.source(s) == "flag" for s in ("compression", "max-ledger-age", "producer-expiry")):
        return given  # (the topic need not be read)
    return given.with_policy(TopicMetadata.open(args.topic, args.metadata).load_policy().to_json())


def _append_all(writer: TopicWriter, stream: IO[bytes], name: str, fmt: str, args: argparse.Namespace) -> None:
    """Every record of ``stream`` appended; on a bad record or an interrupt, those
    before it are sealed and named in the error."""
    shown = _ProduceProgress() if sys.stderr.isatty() else None
    try:
        if fmt == "jsonl":
            from shale.producer.jsonl_ingest import SCANNER, produce_lines

            if SCANNER == "native":
                produce_lines(writer, stream, name, _between_batches(shown))
            else:
                _append_lines(writer, stream, name, shown)
        else:
            from shale.producer.columns import DEFAULT_KEY_FIELD, DEFAULT_VALUE_FIELD, Fields
            from shale.producer.ingest import produce_columnar

            fields = Fields(args.key_field or DEFAULT_KEY_FIELD, args.value_field or DEFAULT_VALUE_FIELD,
                            args.properties_field, args.event_time_field)
            produce_columnar(writer, stream, name, fmt, fields, _between_batches(shown))
    except InvalidInputError as e:
        # Records before the bad line were accepted; seal them so nothing is lost, then fail.
        result = writer.close()
        done = (f"{count(result.records, 'earlier record')} {'was' if result.records == 1 else 'were'} appended, "
                f"last id {result.last_id}" if result.records else "nothing was appended")
        raise InvalidInputError(f"{e} ({done})") from None
    except KeyboardInterrupt:
        # Stopped between two records: the records before were accepted; seal them, and say so.
        result = writer.close()
        appended = (f"{count(result.records, 'record')} {'was' if result.records == 1 else 'were'} appended in "
                    f"{count(len(result.ledgers), 'ledger')}, last id {result.last_id}")
        raise KeyboardInterrupt(appended if result.records else "nothing was appended") from None
    finally:
        if shown is not None:
            shown.close()


def _append_lines(writer: TopicWriter, stream: IO[bytes], name: str, shown: _ProduceProgress | None) -> None:
    from shale.producer.jsonl_ingest import CHUNK_BYTES
    from shale.producer.jsonlines import parse_record_line
    from shale.producer.pipe import lines

    n = 0
    for raw in interrupts.interruptible(lines(stream, CHUNK_BYTES, writer.linger_due)):
        if not raw:  # the linger: what came is sealed before the wait goes on
            writer.seal_if_due()
            continue
        n += 1
        if shown is not None:
            shown.add(1, len(raw))
        where = f"{name}:{n}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInputError(f"{where}: not valid UTF-8") from None
        if not line.strip():
            continue
        key, value, props, event_time = parse_record_line(line, where)
        try:
            writer.append(key, value, props, event_time)
        except InvalidInputError as e:
            raise InvalidInputError(f"{where}: {e}") from None


def _between_batches(shown: _ProduceProgress | None) -> Callable[[int, int], None]:
    """Called after each batch of columns is appended: the progress, and an interrupt."""
    def done(rows: int, nbytes: int) -> None:
        if shown is not None:
            shown.add(rows, nbytes)
        interrupts.check()
    return done


class _ProduceProgress:
    """Records, bytes and rate on the terminal while ``shale produce`` reads (pipes and
    logs never get it): drawn once the first records are in, then redrawn at most ten
    times a second."""

    def __init__(self) -> None:
        self._clock = time.monotonic
        self.start = self._last = self._clock()
        self.records = self.bytes = 0
        self.drawn = False

    def add(self, records: int, nbytes: int) -> None:
        self.records += records
        self.bytes += nbytes
        now = self._clock()
        if not self.drawn or now - self._last >= 0.1:
            self.drawn, self._last = True, now
            rate = self.records / max(now - self.start, 1e-9)
            sys.stderr.write(f"\rproduce: {count(self.records, 'record')}, {self.bytes / 1e6:,.1f} MB, "
                             f"{rate:,.0f} records/s ")
            sys.stderr.flush()

    def close(self) -> None:
        if self.drawn:
            sys.stderr.write("\r\033[K")  # the line is cleared: the summary follows on stdout
            sys.stderr.flush()
