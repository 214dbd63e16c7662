"""``shale read``, ``shale get`` and ``shale export``: a topic's records out, as JSON lines
or as one Parquet, Arrow or JSON-lines object."""

from __future__ import annotations

import argparse
import itertools
import time
from typing import TYPE_CHECKING

from shale.cli.app import Streams
from shale.cli.errors import EXIT_NOT_FOUND
from shale.cli.output import emit
from shale.ledger.errors import InvalidInputError
from shale.settings.kinds import shown

if TYPE_CHECKING:
    from collections.abc import Callable

    from shale.ledger.ids import MessageId
    from shale.metadata.asof import AsOf
    from shale.metadata.topic import TopicMetadata
    from shale.reader import TopicReader
    from shale.reader.gaps import Gap
    from shale.reader.outage import Outage

__all__ = ["run_changes", "run_export", "run_get", "run_read"]


def run_read(args: argparse.Namespace, io: Streams) -> int:
    from shale.ledger.reader import DEFAULT_CHUNK_BYTES

    chunk_bytes = min(DEFAULT_CHUNK_BYTES, args.max_batch_bytes)
    if args.table:  # the latest record of every key: the compacted view, necessarily
        if args.follow or args.subscription is not None:
            flag = "--follow" if args.follow else "--subscription"
            raise InvalidInputError(f"--table prints the table once; {flag} goes with a plain or --compacted read")
        _read_table(args, io, chunk_bytes)
    else:
        _read_records(args, io, chunk_bytes)
    return 0


def _read_table(args: argparse.Namespace, io: Streams, chunk_bytes: int) -> None:
    from shale.metadata.topic import TopicMetadata
    from shale.producer.jsonlines import message_line
    from shale.reader.latest import table_messages

    # footers first, then only the table's records: memory follows records, not values
    meta = TopicMetadata.open(args.topic, args.metadata)
    as_of, from_snapshot = _point(args)
    printed = _print_table_batches(meta, args, io, as_of, from_snapshot)
    if printed is None:
        return
    for m in itertools.islice(table_messages(meta, chunk_bytes=chunk_bytes, as_of=as_of, from_snapshot=from_snapshot,
                                             hold_bytes=args.max_batch_bytes), printed, args.limit):
        text = message_line(m, args.value_format)
        del m  # (a big value goes before its line is written)
        io.out.write(text)
        io.out.write("\n")


def _print_table_batches(meta: TopicMetadata, args: argparse.Namespace, io: Streams, as_of: AsOf | None,
                         from_snapshot: int | str | None) -> int | None:
    """The table's lines, written from Arrow batches when it is big (else as messages:
    :func:`~shale.reader.latest.table_rows`); None when all are printed.  Should reading
    batches fail, how many rows were printed: the table read as messages goes on from
    there, printing what it prints and failing as it fails."""
    from shale.ledger.errors import ShaleError
    from shale.ledger.record import Message
    from shale.producer.jsonlines import LineOutput, message_line, write_batches
    from shale.reader.latest import table_rows

    printed, out = 0, None
    try:
        for item in table_rows(meta, max_batch_bytes=args.max_batch_bytes, as_of=as_of, from_snapshot=from_snapshot):
            if args.limit is not None and printed >= args.limit:
                break
            if isinstance(item, Message):
                text = message_line(item, args.value_format)
                del item
                io.out.write(text + "\n")
                printed += 1
                continue
            out = out or LineOutput(io.out)
            printed += write_batches([item if args.limit is None else item.slice(0, args.limit - printed)], out,
                                     args.value_format)
    except ShaleError:
        if out is None:
            raise
        out.flush()
        return printed
    return None


def _read_records(args: argparse.Namespace, io: Streams, chunk_bytes: int) -> None:
    from shale.ledger.errors import GapError
    from shale.producer.jsonlines import message_line
    from shale.reader import TopicReader, parse_start
    from shale.reader.subscriber import COMMIT_EVERY

    start = parse_start(args.start)
    as_of, from_snapshot = _point(args)
    if args.subscription is not None:
        _check_start(args)

    gone_past, outage = _told(io)
    subscribed = args.subscription is not None
    with TopicReader(args.topic, metadata_uri=args.metadata, read_compacted=args.compacted, start=start,
                     follow=args.follow, poll_interval=args.poll_interval / 1000, on_gap=args.on_gap,
                     gap_listener=gone_past, chunk_bytes=chunk_bytes, subscription=args.subscription,
                     # a follower prints and flushes each record before asking for the next: the reader
                     # may commit it then, and keeps an idle subscription active; a read to the end
                     # commits every COMMIT_EVERY records printed, and at the end (what was printed
                     # is flushed first)
                     auto_commit=args.follow and subscribed,
                     commit_every=COMMIT_EVERY if subscribed and not args.follow else None,
                     before_commit=io.out.flush, as_of=as_of, from_snapshot=from_snapshot,
                     max_batch_bytes=args.max_batch_bytes,
                     retry_for=None if args.retry_for is None else args.retry_for / 1000, outage_listener=outage) as r:
        if r.subscriber is not None and r.subscriber.expired:
            io.err.write(f"shale: warning: {r.meta.uri}: subscription {r.subscriber.name!r} had expired (no commit "
                         "within the topic's subscription-expiry): it held nothing back meanwhile, so deletes may have "
                         "been missed\n")
        limit = args.limit
        if r.subscriber is None and _batched(r):
            done, limit = _print_batches(r, args, io)
            if done:
                _commit(r, io)
                return
        unprinted = None  # a record returned but not printed whole (an interrupt came): read again next time
        try:
            # islice stops at the limit before asking for one more (a follower would wait for it)
            for m in itertools.islice(r, limit):
                unprinted = m.id
                io.out.write(message_line(m, args.value_format) + "\n")
                unprinted = None
                if args.follow:
                    io.out.flush()
        except KeyboardInterrupt:
            if not args.follow:
                raise
        except GapError:
            _commit(r, io)  # every record read before the gap is out before the error line
            raise
        if r.subscriber is not None:
            r.subscriber.auto = False  # the last commit: closing must not move it past an unprinted record
        _commit(r, io, unprinted, leave=True)


def _told(io: Streams) -> tuple[Callable[[Gap], None], Callable[[Outage], None]]:
    """What a read says on standard error, where it falls in the output: each gap it goes
    past (--on-gap skip or compacted), each storage outage once as it starts and once as it
    ends."""
    def gone_past(gap: Gap) -> None:
        io.out.flush()
        io.err.write(f"shale: warning: {gap.human()}\n")
        io.err.flush()

    def outage(o: Outage) -> None:
        io.out.flush()
        io.err.write(f"shale: {'' if o.ended else 'warning: '}{o.human()}\n")
        io.err.flush()

    return gone_past, outage


def _batched(r: TopicReader) -> bool:
    """Whether to read in Arrow batches: pyarrow is installed and the read is big enough to
    pay for it (:data:`~shale.reader.batches.BATCH_READ_RECORDS`)."""
    import importlib.util

    from shale.reader.batches import BATCH_READ_RECORDS, records_ahead

    return records_ahead(r) >= BATCH_READ_RECORDS and importlib.util.find_spec("pyarrow") is not None


def _print_batches(r: TopicReader, args: argparse.Namespace, io: Streams) -> tuple[bool, int | None]:
    """The records as JSON lines written from Arrow batches (:func:`~shale.producer.jsonlines.batch_lines`),
    flushed after each batch when following: ``(True, _)`` once done.  A subscription's read
    prints and commits record by record instead (below).  Should reading batches fail but
    for a gap, ``(False, left)``: the record-by-record read goes on from where the reader
    stands, printing what it prints (``left`` more at most) and failing as it fails."""
    from shale.ledger.errors import GapError, ShaleError
    from shale.producer.jsonlines import LineOutput, write_batches

    out, left = LineOutput(io.out), args.limit
    try:
        while True:
            for batch in r.message_batches(limit=left, max_batch_bytes=args.max_batch_bytes, check_first=True):
                write_batches([batch], out, args.value_format, flush=args.follow)
                left = None if left is None else left - len(batch)
            if not args.follow or left == 0:
                return True, left
            time.sleep(r.poll_interval)
    except KeyboardInterrupt:
        if not args.follow:
            raise
        return True, left
    except GapError:
        out.flush()  # every record read before the gap is out before the error line
        raise
    except ShaleError:
        out.flush()
        return False, left


def _check_start(args: argparse.Namespace) -> None:
    """``--start`` places a new subscription only: given for an existing one, it is refused
    rather than ignored (moving one is ``shale subscriptions --reset``)."""
    from shale.metadata.subscriptions import Subscriptions, check_name
    from shale.metadata.topic import TopicMetadata
    from shale.settings import Source

    given = args.settings["start"]
    if given.source is Source.DEFAULT:
        return
    sub = Subscriptions(TopicMetadata.open(args.topic, args.metadata)).load(check_name(args.subscription))
    if sub is not None:
        raise InvalidInputError(
            f"{given.given_as} places a new subscription, and {args.topic} has subscription {args.subscription!r} "
            f"already (at {sub.position}): leave {given.given_as} out to go on from there, or move it with shale "
            f"subscriptions {args.topic} --reset {args.subscription} --to {args.start.strip()}")


def _commit(r: TopicReader, io: Streams, unprinted: MessageId | None = None, *, leave: bool = False) -> None:
    """Flush what was printed (whole records only: each line is written at once), then,
    when reading as a subscription, commit past it (up to ``unprinted`` when given;
    ``leave``: the last commit, letting the subscription go)."""
    io.out.flush()
    if r.subscriber is not None:
        r.subscriber.commit(unprinted, leave=leave)


def _point(args: argparse.Namespace) -> tuple[AsOf | None, int | str | None]:
    """``--as-of EPOCH|TIME|ID|TAG``, parsed, and ``--from-snapshot EPOCH|TAG`` (None when
    not given; they exclude each other)."""
    text = getattr(args, "from_snapshot", None)
    from_snapshot = None if text is None else _parsed("--from-snapshot", text)
    if from_snapshot is not None and (isinstance(from_snapshot, bool) or not isinstance(from_snapshot, (int, str))):
        raise InvalidInputError(f"--from-snapshot: {text!r}: give an epoch or a tag (a time or an id is a point: "
                                "--as-of)")
    if args.as_of is None:
        return None, from_snapshot
    if from_snapshot is not None:
        raise InvalidInputError("--as-of reads the topic as it was at a point, --from-snapshot a snapshot and "
                                "everything since: give one")
    return _parsed("--as-of", args.as_of), None


def run_get(args: argparse.Namespace, io: Streams) -> int:
    from shale.metadata.topic import TopicMetadata
    from shale.producer.jsonlines import message_line
    from shale.reader import lookup
    from shale.reader.lookup import why_no_value

    key = _key_bytes(args.key, args.key_b64)
    as_of, _ = _point(args)
    meta = TopicMetadata.open(args.topic, args.metadata)
    found = lookup(meta, key, as_of=as_of)
    if found.value is None:
        why = why_no_value(meta, key, found, as_of=as_of)
        when = "" if as_of is None else f" as of {args.as_of.strip()}"
        io.err.write(f"shale: no value for key {args.key!r} in {args.topic}{when} ({why})\n")
        return EXIT_NOT_FOUND
    io.out.write((message_line(found.message, args.value_format) if found.message else "{}") + "\n")
    return 0


def run_changes(args: argparse.Namespace, io: Streams) -> int:
    from shale.ledger.reader import DEFAULT_CHUNK_BYTES
    from shale.metadata.topic import TopicMetadata
    from shale.producer.jsonlines import change_line
    from shale.reader.changes import changes

    since = _parsed("--from", args.from_point)
    until = None if args.to_point is None else _parsed("--to", args.to_point)
    meta = TopicMetadata.open(args.topic, args.metadata)
    for c in changes(meta, since, until, chunk_bytes=DEFAULT_CHUNK_BYTES):
        io.out.write(change_line(c.op, c.key, c.message, args.value_format))
        io.out.write("\n")
    return 0


def _parsed(flag: str, text: str) -> AsOf:
    from shale.metadata.asof import parse_point

    try:
        return parse_point(text)
    except InvalidInputError as e:
        raise InvalidInputError(f"{flag}: {e}") from None


def _key_bytes(text: str, b64: bool) -> bytes:
    """KEY as ``get`` takes it: text as UTF-8 (bytes of the command line that are not UTF-8
    as they were given), or base64 with ``--key-b64``."""
    if not b64:
        try:
            return text.encode("utf-8", "surrogateescape")
        except UnicodeError:
            raise InvalidInputError(f"KEY {shown(text)!r} is not valid text (--key-b64 takes a binary key)") from None
    import base64

    try:
        return base64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error
        raise InvalidInputError(f"KEY {shown(text)!r} is not base64 (--key-b64)") from None


def run_export(args: argparse.Namespace, io: Streams) -> int:
    from shale.cli.progress import counting
    from shale.export import export_topic
    from shale.export_target import is_stdout
    from shale.reader import parse_start

    if args.export_format == "iceberg":
        return _export_iceberg(args, io)
    if args.out is None:
        raise InvalidInputError("OUT is needed: where to write (a path, a URI, or - for standard output)")
    as_of, _ = _point(args)
    since = None if args.changes_from is None else _parsed("--changes-from", args.changes_from)
    until = None if args.changes_to is None else _parsed("--changes-to", args.changes_to)
    if until is not None and since is None:
        raise InvalidInputError("--changes-to goes with --changes-from")
    with counting("export", unit="rows") as shown:
        result = export_topic(args.topic, args.out, metadata_uri=args.metadata, compacted=args.compacted,
                              table=args.table, fmt=args.export_format, start=parse_start(args.start),
                              compression=args.export_compression, utf8=args.utf8, progress=shown.set,
                              overwrite=args.overwrite, max_batch_bytes=args.max_batch_bytes, as_of=as_of,
                              changes=None if since is None else (since, until))
    # standard output carries the export itself when OUT is -
    emit(result, io.err if is_stdout(args.out) else io.out, args.json)
    return 0


def _export_iceberg(args: argparse.Namespace, io: Streams) -> int:
    """``--format iceberg``: the topic's Iceberg table brought to its published epoch."""
    from shale.iceberg.follow import export_iceberg

    given = {"OUT": args.out, "--as-of": args.as_of, "--changes-from": args.changes_from,
             "--start": None if args.start == "earliest" else args.start}
    extra = next((name for name, v in given.items() if v is not None), None)
    if extra is not None:
        raise InvalidInputError(f"--format iceberg writes the table --iceberg-table names, as of the published "
                                f"epoch: {extra} is not taken")
    emit(export_iceberg(args.topic, args.settings, args.metadata), io.out, args.json)
    return 0

