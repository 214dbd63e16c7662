"""The ``shale`` command: produce, read, status, compact, gc.

Exit codes (every subcommand): 0 success, 1 unexpected failure, 2 bad usage or input
(bad flag, bad URI, missing topic), 3 lost a compare-and-swap race, 4 corrupt data,
6 a reader's next records were removed by retention.
"""

from __future__ import annotations

import os
import sys

# As the compactor's package does (see compactor/__init__.py): one BLAS thread, set
# before anything imports NumPy.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

try:  # a Ctrl-C while the command's modules load ends it as at any other time: one line, 130
    import argparse
    import base64
    import itertools
    import json
    from collections.abc import Callable, Sequence
    from typing import Any, BinaryIO, TextIO

    from shale.compactor import interrupts
    from shale.compactor.commandline import (
        COMPRESSION_HELP,
        OneLineParser,
        add_topic_arguments,
        compression_arg,
        duration_arg,
        positive_size_arg,
        run_command,
    )
    from shale.ingest import FORMATS
    from shale.ledger.codecs import Compression
    from shale.ledger.errors import EXIT_USAGE, InvalidInputError
except KeyboardInterrupt:
    sys.stderr.write("shale: interrupted\n")
    raise SystemExit(130) from None

__all__ = ["main"]

#: ``shale get``: the key has no value (as ``shale verify`` uses 5 for a mismatch).
EXIT_NOT_FOUND = 5

EXIT_CODES_HELP = """\
exit codes:
  0  success (for compact: compacted, nothing to do, or skipped)
  1  unexpected failure, or storage that failed on its own (unreachable, an I/O error)
  2  bad usage or input: bad flag or value, bad URI, missing topic, bad record; access
     refused (file permissions, S3 access denied)
  3  lost a compare-and-swap race (another writer or compactor won)
  4  corrupt data: bad checksum, truncated object, unknown format version, a metadata
     document that breaks its schema or invariants, a link or folder where an object
     should be
  5  shale verify: the compacted view does not match the original ledgers
  6  shale read (and export --start ID): records it had yet to read were removed by
     retention (see shale read --on-gap); every record before them was written
130  interrupted (Ctrl-C): stopped within moments; what a run wrote was removed
every flag also reads a SHALE_* variable (SHALE_ and the flag's name in capitals, e.g.
--max-ledger-bytes: SHALE_MAX_LEDGER_BYTES); flags win
"""


VALUE_FORMAT_HELP = (
    "text (default): every value as a JSON string of its text (value_b64 when not UTF-8); json: a value "
    "that is a JSON document strict parsers read is printed as that document, its text as stored (line breaks "
    "become spaces), any other (not JSON, NaN, Infinity, a number beyond 64-bit floats or of over 4300 digits, "
    "nested over 512 deep) as a JSON string of its text, value_b64 when not UTF-8. Every line is strict JSON")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:  # not a number, or one of thousands of digits
        raise argparse.ArgumentTypeError(f"{_shown(text)!r} is not a whole number from 1 to {sys.maxsize}") from None
    if not 1 <= value <= sys.maxsize:
        raise argparse.ArgumentTypeError(f"{_shown(text)!r} must be from 1 to {sys.maxsize}")
    return value


def _print_json(doc: Any, out: TextIO) -> None:
    out.write(json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n")


# ------------------------------------------------------------------- produce

@interrupts.deferred  # a record is appended whole or not at all: an interrupt waits for the next read
def _cmd_produce(args: argparse.Namespace, out: TextIO) -> int:
    from shale.columns import DEFAULT_KEY_FIELD, DEFAULT_VALUE_FIELD, Fields
    from shale.ingest import format_of, produce_columnar
    from shale.jsonlines import parse_record_line
    from shale.producer import TopicWriter

    stream: BinaryIO
    if args.input in (None, "-"):
        stream, name = sys.stdin.buffer, "<stdin>"
    else:
        try:
            stream = open(args.input, "rb")  # noqa: SIM115  (closed below)
        except OSError as e:
            raise InvalidInputError(f"cannot open input {args.input}: {e.strerror}") from None
        name = args.input
    writer = TopicWriter(args.topic, metadata_uri=args.metadata, max_ledger_records=args.max_ledger_records,
                         max_ledger_bytes=args.max_ledger_bytes, batch_size=args.batch_size,
                         compression=_produce_compression(args))
    shown = _ProduceProgress() if sys.stderr.isatty() else None
    fmt = args.format or format_of(args.input)
    picked = [f for f in ("key_field", "value_field", "properties_field", "event_time_field")
              if getattr(args, f) is not None]
    if fmt == "jsonl" and picked:
        writer.close()
        raise InvalidInputError(f"--{picked[0].replace('_', '-')} picks a column of parquet, arrow or csv input; "
                                "JSON lines have fixed fields (see shale produce --help)")
    try:
        if fmt != "jsonl":
            fields = Fields(args.key_field or DEFAULT_KEY_FIELD, args.value_field or DEFAULT_VALUE_FIELD,
                            args.properties_field, args.event_time_field)
            produce_columnar(writer, stream, name, fmt, fields, _between_batches(shown))
        for n, raw in enumerate(interrupts.interruptible(stream) if fmt == "jsonl" else (), start=1):
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
    except InvalidInputError as e:
        # Records before the bad line were accepted; seal them so nothing is lost, then fail.
        result = writer.close()
        done = (f"{result.records} earlier records were appended, last id {result.last_id}" if result.records
                else "nothing was appended")
        raise InvalidInputError(f"{e} ({done})") from None
    except KeyboardInterrupt:
        # Stopped between two records: the records before were accepted; seal them, and say so.
        result = writer.close()
        raise KeyboardInterrupt(f"{_appended(result.records, len(result.ledgers))}, last id {result.last_id}"
                                if result.records else "nothing was appended") from None
    finally:
        if shown is not None:
            shown.close()
        if stream is not sys.stdin.buffer:
            stream.close()
    result = writer.close()
    if args.json:
        _print_json(result.to_json(), out)
    else:
        out.write(result.human() + "\n")
    return 0


def _appended(records: int, ledgers: int) -> str:
    return (f"{records:,} record{'' if records == 1 else 's'} {'was' if records == 1 else 'were'} appended "
            f"in {ledgers:,} ledger{'' if ledgers == 1 else 's'}")


def _between_batches(shown: _ProduceProgress | None) -> Callable[[int, int], None]:
    """Called after each batch of columns is appended: the progress, and an interrupt."""
    def done(rows: int, nbytes: int) -> None:
        if shown is not None:
            shown.add(rows, nbytes)
        interrupts.check()
    return done


def _produce_compression(args: argparse.Namespace) -> Compression | None:
    """The flag's compression; else the topic's policy's (None: the writer reads it); else
    the variable's, else the default (a flag > the topic's policy > a variable > the default)."""
    from shale.compactor.settings import settings_of
    from shale.metadata.topic import TopicMetadata

    source = next((s.source for s in settings_of(args) if s.dest == "compression"), "default")
    given: Compression | None = args.compression
    if source == "flag" or given is None:
        return given
    return TopicMetadata.open(args.topic, args.metadata).load_policy().compression or given


class _ProduceProgress:
    """Records, bytes and rate on the terminal while ``shale produce`` reads (pipes and
    logs never get it), redrawn at most ten times a second."""

    def __init__(self) -> None:
        import time

        self._clock = time.monotonic
        self.start = self._last = self._clock()
        self.records = self.bytes = 0

    def add(self, records: int, nbytes: int) -> None:
        self.records += records
        self.bytes += nbytes
        now = self._clock()
        if now - self._last >= 0.1:
            self._last = now
            rate = self.records / max(now - self.start, 1e-9)
            sys.stderr.write(f"\rproduce: {self.records:,} records, {self.bytes / 1e6:,.1f} MB, "
                             f"{rate:,.0f} records/s ")
            sys.stderr.flush()

    def close(self) -> None:
        if self._last != self.start:
            sys.stderr.write("\r\033[K")  # the line is cleared: the summary follows on stdout
            sys.stderr.flush()


# ---------------------------------------------------------------------- read

def _cmd_read(args: argparse.Namespace, out: TextIO) -> int:
    from shale.jsonlines import message_line
    from shale.ledger.errors import GapError
    from shale.ledger.reader import DEFAULT_CHUNK_BYTES
    from shale.reader import TopicReader, parse_position
    from shale.reader.gaps import Gap

    chunk_bytes = min(DEFAULT_CHUNK_BYTES, _max_batch_bytes(args))
    if args.table:  # the latest record of every key: the compacted view, necessarily
        if args.follow:
            raise InvalidInputError("--table prints the table once; --follow goes with a plain or --compacted read")
        from shale.metadata.topic import TopicMetadata
        from shale.reader.latest import table_messages

        # footers first, then only the table's records: memory follows records, not values
        meta = TopicMetadata.open(args.topic, args.metadata)
        for m in itertools.islice(table_messages(meta, chunk_bytes=chunk_bytes), args.limit):
            text = message_line(m, args.value_format)
            del m  # (a big value goes before its line is written)
            out.write(text)
            out.write("\n")
        return 0
    start = parse_position(args.start)

    def gone_past(gap: Gap) -> None:  # --on-gap skip or compacted: said on stderr, where it falls in the output
        out.flush()
        sys.stderr.write(f"shale: warning: {gap.human()}\n")
        sys.stderr.flush()

    with TopicReader(args.topic, metadata_uri=args.metadata, read_compacted=args.compacted, start=start,
                     follow=args.follow, poll_interval=args.poll_interval / 1000, on_gap=args.on_gap,
                     gap_listener=gone_past, chunk_bytes=chunk_bytes) as r:
        try:
            # islice stops at the limit before asking for one more (a follower would wait for it)
            for m in itertools.islice(r, args.limit):
                out.write(message_line(m, args.value_format) + "\n")
                if args.follow:
                    out.flush()
        except KeyboardInterrupt:
            if not args.follow:
                raise
            out.flush()  # whole records only: each line is written at once
        except GapError:
            out.flush()  # every record read before the gap is out before the error line
            raise
    return 0


def _max_batch_bytes(args: argparse.Namespace) -> int:
    """``--max-batch-bytes``, else the readers' default."""
    from shale.reader.arrow import DEFAULT_MAX_BATCH_BYTES

    given: int | None = args.max_batch_bytes
    return DEFAULT_MAX_BATCH_BYTES if given is None else given


def _cmd_get(args: argparse.Namespace, out: TextIO) -> int:
    from shale.jsonlines import message_line
    from shale.metadata.topic import TopicMetadata
    from shale.reader import lookup

    key = _key_bytes(args.key, args.key_b64)
    found = lookup(TopicMetadata.open(args.topic, args.metadata), key)
    if found.value is None:
        sys.stderr.write(f"shale: no value for key {args.key!r} in {args.topic} "
                         f"({'deleted' if found.message is not None else 'never written'})\n")
        return EXIT_NOT_FOUND
    out.write((message_line(found.message, args.value_format) if found.message else "{}") + "\n")
    return 0


def _key_bytes(text: str, b64: bool) -> bytes:
    """KEY as ``get`` takes it: text as UTF-8 (bytes of the command line that are not UTF-8
    as they were given), or base64 with ``--key-b64``."""
    if not b64:
        try:
            return text.encode("utf-8", "surrogateescape")
        except UnicodeError:
            raise InvalidInputError(f"KEY {_shown(text)!r} is not valid text (--key-b64 takes a binary key)") from None
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error
        raise InvalidInputError(f"KEY {_shown(text)!r} is not base64 (--key-b64)") from None


def _shown(text: str) -> str:
    """A value as a message quotes it: thousands of characters are cut short."""
    return text if len(text) <= 40 else text[:37] + "..."


# -------------------------------------------------------------------- export

def _cmd_export(args: argparse.Namespace, out: TextIO) -> int:
    from shale.export import export_topic
    from shale.export_target import is_stdout
    from shale.reader import parse_position

    shown = _ExportProgress() if sys.stderr.isatty() else None
    try:
        result = export_topic(args.topic, args.out, metadata_uri=args.metadata, compacted=args.compacted,
                              table=args.table, fmt=args.format, start=parse_position(args.start),
                              compression=args.compression, utf8=args.utf8,
                              progress=shown.show if shown else None, overwrite=args.overwrite,
                              max_batch_bytes=_max_batch_bytes(args))
    finally:
        if shown is not None:
            shown.close()
    if is_stdout(args.out):
        out = sys.stderr  # standard output carries the export itself
    if args.json:
        _print_json(result.to_json(), out)
    else:
        out.write(result.human() + "\n")
    return 0


class _ExportProgress:
    """Rows and bytes written, on the terminal only, at most ten times a second."""

    def __init__(self) -> None:
        import time

        self._clock = time.monotonic
        self._last = 0.0
        self.drawn = False

    def show(self, rows: int, nbytes: int) -> None:
        now = self._clock()
        if now - self._last >= 0.1:
            self._last, self.drawn = now, True
            sys.stderr.write(f"\rexport: {rows:,} rows, {nbytes / 1e6:,.1f} MB written ")
            sys.stderr.flush()

    def close(self) -> None:
        if self.drawn:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


# -------------------------------------------------------------------- status

def _cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    from shale.status import status_text, topic_status

    doc = topic_status(args.topic, args.metadata)
    for d in doc["damaged"]:
        sys.stderr.write(f"shale: warning: {doc['topic']}: damaged object {d['object']}: {d['error']}\n")
    if args.json:
        _print_json(doc, out)
    else:
        out.write(status_text(doc) + "\n")
    return 0


# ----------------------------------------------------------------------- CLI

def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="shale",
        description="Shale: compact keyed topics stored as ledger objects on object storage.",
        epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("produce", help="append records to a topic (creating it if needed)",
                       description="Append records: JSON lines (one object per line: "
                       '{"key": str|null, "value": str|object|array|null, "value_b64": str, '
                       '"properties": {str: str}, "event_time": int}), or the rows of a Parquet, Arrow IPC '
                       "or CSV file, whose columns --key-field and --value-field pick. A null or empty value "
                       "is a tombstone. An object or array value is stored as its JSON text exactly as the line "
                       "gives it (nested at most 512 deep). Lines must be strict JSON (no NaN or Infinity). Event "
                       "times are milliseconds since 1970, years 0001 to 9999 (-62135596800000 to "
                       "253402300799999). A bad line stops the run (exit 2, naming it) after appending the lines "
                       "before it (a bad row: the batches before its own). Prints what was appended (--json: one "
                       "JSON line with the ids and counts).",
                       epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_topic_arguments(p)
    p.add_argument("--input", metavar="PATH|-", default="-", help="input file (default: standard input)")
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="input format (default: from the file name's suffix, else jsonl)")
    p.add_argument("--key-field", metavar="COLUMN", help="the column of keys (parquet, arrow, csv; default: key)")
    p.add_argument("--value-field", metavar="COLUMN",
                   help="the column of values (parquet, arrow, csv; default: value)")
    p.add_argument("--properties-field", metavar="COLUMN",
                   help="a map<string,string> column of properties (parquet, arrow)")
    p.add_argument("--event-time-field", metavar="COLUMN",
                   help="a timestamp or integer-milliseconds column of event times (parquet, arrow, csv)")
    p.add_argument("--max-ledger-records", type=positive_int, default=500_000, metavar="N",
                   help="seal a ledger after N records (default 500000)")
    p.add_argument("--max-ledger-bytes", type=positive_size_arg, default=64 * 1024 * 1024, metavar="SIZE",
                   help="seal a ledger once it holds SIZE bytes (64MiB, 1GB; default 64MiB)")
    p.add_argument("--batch-size", type=positive_int, default=1000, metavar="N",
                   help="records per entry (default 1000, as Pulsar batches; fewer once they come to 1 MiB)")
    p.add_argument("--compression", type=compression_arg, default=None, metavar="CODEC",
                   help=f"how each entry is compressed: {COMPRESSION_HELP}")
    p.add_argument("--json", action="store_true", help="print one JSON line with the ids and counts instead of text")
    p.set_defaults(func=_cmd_produce)

    p = sub.add_parser("read", help="print a topic's records as JSON lines",
                       description="Print records as JSON lines "
                       '{"id","key","value" (or "value_b64"),"properties","publish_time","event_time"}.',
                       epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_topic_arguments(p)
    p.add_argument("--start", default="earliest", metavar="earliest|latest|ID",
                   help="where to start: earliest (default), latest, or a message id LEDGER:ENTRY:BATCH "
                   "(a missing id starts at the next existing one)")
    p.add_argument("--limit", type=positive_int, default=None, metavar="N", help="stop after N records")
    p.add_argument("--compacted", action="store_true",
                   help="read the compacted view: compacted ledger up to the horizon, then the tail")
    p.add_argument("--table", action="store_true",
                   help="print only the latest record of every live key (implies --compacted)")
    p.add_argument("--follow", action="store_true",
                   help="keep reading as new ledgers are registered (Ctrl-C ends it, exit code 0)")
    p.add_argument("--poll-interval", type=duration_arg, default=1000, metavar="DURATION",
                   help="with --follow: how often to look for new ledgers (default 1s)")
    p.add_argument("--value-format", choices=("text", "json"), default="text", help=VALUE_FORMAT_HELP)
    p.add_argument("--on-gap", choices=("error", "skip", "compacted"), default="error",
                   help="when retention removed records this read had yet to reach (a paused --follow, a --start "
                   "id below the oldest ledger left): error (default) stops with exit code 6 naming the range; "
                   "skip goes on at the next record left, with a warning; compacted reads the range from the "
                   "compacted view (the latest value of each of its keys), with a warning")
    p.add_argument("--max-batch-bytes", type=positive_size_arg, default=None, metavar="SIZE",
                   help="the most stored bytes of entries read at once, 8MiB at most (records are decoded an "
                   "entry, and a big entry a record, at a time; default 16MiB, as shale export)")
    p.set_defaults(func=_cmd_read)

    p = sub.add_parser("get", help="print the latest record of one key",
                       description="Print the latest record of KEY (one JSON line), from the compacted view and "
                       "the tail above the horizon, reading only the footers and the entries whose key hashes "
                       "match (Pulsar's TableView.get).",
                       epilog="exit codes: 0 found; 5 the key has no value (deleted or never written); 2 bad "
                       "usage or missing topic; 4 corrupt data", formatter_class=argparse.RawDescriptionHelpFormatter)
    add_topic_arguments(p)
    p.add_argument("key", metavar="KEY", help="the key, as text")
    p.add_argument("--key-b64", action="store_true", help="KEY is base64 (a binary key)")
    p.add_argument("--value-format", choices=("text", "json"), default="text", help=VALUE_FORMAT_HELP)
    p.set_defaults(func=_cmd_get)

    p = sub.add_parser("export", help="write a topic, its compacted view or its table as Parquet, Arrow or JSON lines",
                       description="Write the topic's records from --start (--compacted: its compacted view; "
                       "--table: the latest record of every live key) to OUT, one object: a local path, any "
                       "URI Shale writes to (s3://bucket/key), or - for standard output (then the summary goes to "
                       "standard error). It becomes visible only once complete. OUT must not be inside a topic "
                       "(the source's folder or --metadata, a folder holding _meta/topic.json, or a name shaped "
                       "like a topic's objects), nor exist (unless --overwrite), nor be anything but a regular "
                       "file (a link, folder, FIFO or device is refused even with --overwrite); a local OUT's "
                       "folder must exist. A local export writes a hidden .shale-export-<nonce>.tmp beside OUT, "
                       "locked while it runs; each export removes those of its folder whose writer was killed. "
                       "DuckDB, Polars, pandas and Spark read Parquet and Arrow directly. Needs pyarrow for "
                       "Parquet and Arrow (pip install 'shale[arrow]').",
                       epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_topic_arguments(p)
    p.add_argument("out", metavar="OUT", help="where to write: a local path, s3://bucket/key.parquet, ..., or - "
                   "(standard output; also /dev/stdout)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace OUT if it is an existing regular file (default: refuse, and never replace one "
                   "that appears while the export runs)")
    p.add_argument("--compacted", action="store_true", help="the compacted view: compacted ledger, then the tail")
    p.add_argument("--table", action="store_true", help="the latest record of every live key (implies --compacted)")
    p.add_argument("--format", choices=("parquet", "arrow", "jsonl"), default=None,
                   help="default: from OUT's suffix (.parquet, .arrow, .jsonl), else parquet")
    p.add_argument("--start", default="earliest", metavar="earliest|latest|ID",
                   help="where to start (default earliest)")
    p.add_argument("--utf8", action="store_true",
                   help="keys and values as text (refused, naming the row, where one is not valid UTF-8) rather "
                   "than binary")
    p.add_argument("--compression", default="zstd", metavar="CODEC",
                   help="Parquet or Arrow compression: zstd (default), lz4, snappy (Parquet), none")
    p.add_argument("--max-batch-bytes", type=positive_size_arg, default=None, metavar="SIZE",
                   help="the most bytes of records, once decompressed, that one batch holds and that are "
                   "decompressed at once (a bigger record goes alone; default 16MiB)")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("status", help="print a topic's ledgers, records and compaction state",
                       description="Print a topic's ledgers, its compaction state and its dirty ratio. A damaged "
                       "ledger or part does not stop it: each is named (on standard error too) and the dirty "
                       "ratio is then estimated from the metadata; `shale verify --scrub` is the check.",
                       epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_topic_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    p.set_defaults(func=_cmd_status)

    for register in _EXTRA_COMMANDS:
        register(sub)
    return parser


_EXTRA_COMMANDS: list[Callable[[Any], None]] = []


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``shale`` console script."""
    def parser() -> argparse.ArgumentParser:
        _load_extra_commands()  # (imports the compactor: interruptible as the rest of the command)
        return build_parser()

    code = run_command(argv, parser, prog="shale")
    sys.stdout.flush()
    return code if code in range(256) else EXIT_USAGE


def _load_extra_commands() -> None:
    if _EXTRA_COMMANDS:
        return
    try:
        from shale.compactor.cli import register_subcommands
    except ImportError:  # the compactor is optional only in a broken install
        return
    _EXTRA_COMMANDS.append(register_subcommands)


if __name__ == "__main__":
    sys.exit(main())
