"""``shale produce``: JSON lines, or the rows of a Parquet, Arrow IPC or CSV file, appended
to a topic.  A bad line stops the run after sealing the lines before it, so nothing
accepted is lost; an interrupt does the same between two records (JSON lines read as
columns: two chunks of lines)."""

from __future__ import annotations

import argparse
import sys
from typing import IO, TYPE_CHECKING

from shale.cli.app import Streams
from shale.cli.output import emit
from shale.cli.progress import counting
from shale.ledger.errors import InvalidInputError
from shale.runtime import interrupts
from shale.settings.units import count

if TYPE_CHECKING:
    from shale.producer import TopicWriter
    from shale.producer.ahead import Ahead

__all__ = ["run_produce"]


@interrupts.deferred  # a record is appended whole or not at all: an interrupt waits for the next read
def run_produce(args: argparse.Namespace, io: Streams) -> int:
    from shale.producer.formats import format_of

    fmt = args.format or format_of(args.input)
    picked = [s for s in ("key-field", "value-field", "properties-field", "event-time-field")
              if args.settings.value(s) is not None]
    if fmt == "jsonl" and picked:
        raise InvalidInputError(f"--{picked[0]} picks a column of parquet, arrow or csv input; JSON lines have "
                                "fixed fields (see shale produce --help)")
    if args.producer_id is not None:
        from shale.producer.idempotence import check_producer_id

        check_producer_id(args.producer_id)  # (refused before the topic is read, or made)
    stream, name = _open_input(args.input)
    ahead: IO[bytes] | Ahead = stream
    if fmt == "jsonl":  # a file is read and scanned on another core while the rest starts up
        from shale.producer.ahead import scan_ahead
        from shale.producer.pipe import CHUNK_BYTES

        ahead = scan_ahead(stream, CHUNK_BYTES)
    try:
        from shale.metadata.handle import Topic
        from shale.producer import TopicWriter

        topic = Topic.open(args.topic, args.metadata, settings=args.settings)
        # compression, max-ledger-age and producer-expiry by the one precedence rule: the flag >
        # the topic's policy > the variable > the default
        writer = TopicWriter(topic, max_ledger_records=args.max_ledger_records,
                             max_ledger_bytes=args.max_ledger_bytes, batch_size=args.batch_size,
                             compression=topic.value("compression"), max_ledger_age_ms=topic.value("max-ledger-age"),
                             producer_id=args.producer_id, producer_expiry_ms=topic.value("producer-expiry"))
        _append_all(writer, ahead, name, fmt, args)
    finally:
        if ahead is not stream:
            ahead.close()
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


def _append_all(writer: TopicWriter, stream: IO[bytes] | Ahead, name: str, fmt: str, args: argparse.Namespace) -> None:
    """Every record of ``stream`` appended (:func:`~shale.producer.ingest.produce`); on a
    bad record or an interrupt, those before it are sealed and named in the error."""
    from shale.producer.columns import DEFAULT_KEY_FIELD, DEFAULT_VALUE_FIELD, Fields
    from shale.producer.ingest import produce

    fields = Fields(args.key_field or DEFAULT_KEY_FIELD, args.value_field or DEFAULT_VALUE_FIELD,
                    args.properties_field, args.event_time_field)
    with counting("produce") as shown:
        try:
            produce(writer, stream, name, fmt, fields, shown.add)
        except InvalidInputError as e:
            # Records before the bad line were accepted; seal them so nothing is lost, then fail.
            result = writer.close()
            done = (f"{count(result.records, 'earlier record')} {'was' if result.records == 1 else 'were'} "
                    f"appended, last id {result.last_id}" if result.records else "nothing was appended")
            raise InvalidInputError(f"{e} ({done})") from None
        except KeyboardInterrupt:
            # Stopped between two records: the records before were accepted; seal them, and say so.
            result = writer.close()
            appended = (f"{count(result.records, 'record')} {'was' if result.records == 1 else 'were'} appended in "
                        f"{count(len(result.ledgers), 'ledger')}, last id {result.last_id}")
            raise KeyboardInterrupt(appended if result.records else "nothing was appended") from None
