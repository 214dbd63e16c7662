"""The commands: what each is for, what ``--help`` says about it, and the function that
runs it (imported only when it runs, so that ``--help`` loads little).  A declared table;
their flags come from the settings model (:mod:`shale.settings`)."""

from __future__ import annotations

from typing import Final

from shale.ledger.values import dataclass

__all__ = ["COMMAND_TABLE", "EXIT_CODES", "Command"]


@dataclass(frozen=True, slots=True)
class Command:
    """One command of ``shale``."""

    name: str
    #: one line in ``shale --help``
    summary: str
    description: str
    #: what its exit codes mean (the ``exit codes:`` part of its ``--help``)
    exit_codes: str
    #: ``module:function`` that runs it, given the parsed arguments and the output streams
    run: str


#: Every command's exit codes, as ``shale --help`` lists them.
EXIT_CODES: Final = """\
  0  success (for compact: compacted, nothing to do, or skipped)
  1  unexpected failure, or storage that failed on its own (unreachable, an I/O error)
  2  bad usage or input: bad flag, variable or value, bad URI, missing topic, bad
     record; access refused (file permissions, S3 access denied)
  3  lost a compare-and-swap race (another writer or compactor won)
  4  corrupt data: bad checksum, truncated object, unknown format version, a metadata
     document that breaks its schema or invariants, a link or folder where an object
     should be
  5  shale verify: the compacted view does not match the original ledgers; shale get:
     the key has no value
  6  shale read (and export --start ID): records it had yet to read were removed by
     retention (see shale read --on-gap); every record before them was written
  7  compact of several topics: some failed, every other one completed (see compact --help)
130  interrupted (Ctrl-C): stopped within moments; what a run wrote was removed"""

_PRODUCE_CODES: Final = """\
  0  appended every record of the input
  1  unexpected failure, or storage that failed on its own (unreachable, an I/O error)
  2  bad usage or input: bad flag, variable or value, bad URI, a bad line or row (named;
     what came before it was appended); access refused
  3  the topic's ledger list kept changing (many writers at once), or another writer
     with the same --producer-id registered first: what was appended before is kept;
     run again for the rest (with --producer-id, what was appended is skipped)
  4  a metadata document (the ledger list, the policy, a dictionary) breaks its schema
130  interrupted (Ctrl-C): the records read before it are appended, and named"""

_READ_CODES: Final = """\
  0  printed (with --follow: until Ctrl-C)
  1  unexpected failure, or storage that failed on its own (unreachable, an I/O error;
     for longer than --retry-for)
  2  bad usage or input: bad flag, variable, position or URI, missing topic, bad
     subscription name, --start for a subscription that exists; access refused
  3  with --subscription: a reset or another reader changed the subscription first (the
     records printed since the last commit are read again next time)
  4  corrupt data: bad checksum, truncated object, unknown format version, a metadata
     document that breaks its schema or invariants
  6  records it had yet to read were removed by retention (see --on-gap); every record
     before them was printed
130  interrupted (Ctrl-C, without --follow)"""

_EXPORT_CODES: Final = """\
  0  written (OUT complete)
  1  unexpected failure, or storage that failed on its own (nothing is left at OUT); an
     Iceberg catalog that could not be reached
  2  bad usage or input: bad flag, URI or position, missing topic, OUT inside a topic or
     existing (without --overwrite), a record not UTF-8 with --utf8; access refused; an
     Iceberg table that is not Shale's or holds another topic, a catalog or warehouse
     that refuses to be written
  4  corrupt data: bad checksum, truncated object, unknown format version, a metadata
     document that breaks its schema or invariants
  6  --start ID: records from there were removed by retention
130  interrupted (Ctrl-C): nothing is left at OUT"""

_STATUS_CODES: Final = """\
  0  printed (damaged ledgers or parts are named in it, and on standard error)
  1  unexpected failure, or storage that failed on its own (unreachable, an I/O error)
  2  bad usage or missing topic; access refused
  4  a metadata document breaks its schema or invariants"""

_COMPACT_CODES: Final = """\
  0  compacted, nothing to do, or skipped (dirty ratio below --min-dirty-ratio)
  1  unexpected failure
  2  bad usage or input: bad flag or variable, bad URI, missing topic
  3  lost the publish race: another compactor published first (nothing was published
     by this run and its output was removed); safe to run again
  4  corrupt data found: a ledger object failed its checks (the object and position
     are named) or a metadata document broke its schema or invariants (the document
     and field are named); nothing was published or deleted
  7  several topics (or --all): some failed (an error, or a lost race) and every other one
     completed; each failed topic is named, with its own code, on standard error, in its
     --json line and in the last line; the others need no second run
130  interrupted (Ctrl-C): the run stopped within moments, removed what it wrote and
     published nothing (a second Ctrl-C stops at once, leaving it to gc)
With several topics, each is compacted and published on its own, whatever the others do,
and a last line counts them: compacted, nothing to do, skipped, failed (--json: one JSON
object). When every topic failed, the exit code is the worst of theirs (4, then 1, then
2, then 3). A prefix without topics yet (--all) is exit 0, with a warning."""

_PRODUCE: Final = (
    'Append records: JSON lines (one object per line: {"key": str|null, "value": str|object|array|null, '
    '"value_b64": str, "properties": {str: str}, "event_time": int}), or the rows of a Parquet, Arrow IPC or CSV '
    "file, whose columns --key-field and --value-field pick. A null or empty value is a tombstone. An object or "
    "array value is stored as its JSON text exactly as the line gives it (nested at most 512 deep). Lines must be "
    "strict JSON (no NaN or Infinity). Event times are milliseconds since 1970, years 0001 to 9999 "
    "(-62135596800000 to 253402300799999). A bad line stops the run (exit 2, naming it) after appending the lines "
    "before it (a bad row: the batches before its own). Prints what was appended (--json: one JSON line with the "
    "ids and counts).")
_EXPORT: Final = (
    "Write the topic's records from --start (--compacted: its compacted view; --table: the latest record of every "
    "live key) to OUT, one object: a local path, any URI Shale writes to (s3://bucket/key), or - for standard "
    "output (then the summary goes to standard error). It becomes visible only once complete. OUT must not be "
    "inside a topic (the source's folder or --metadata, a folder holding _meta/topic.json, or a name shaped like a "
    "topic's objects), nor exist (unless --overwrite), nor be anything but a regular file (a link, folder, FIFO or "
    "device is refused even with --overwrite); a local OUT's folder must exist. A local export writes a hidden "
    ".shale-export-<nonce>.tmp beside OUT, locked while it runs; each export removes those of its folder whose "
    "writer was killed. DuckDB, Polars, pandas and Spark read Parquet and Arrow directly. Needs pyarrow for "
    "Parquet and Arrow (pip install 'shale[arrow]'). --format iceberg takes no OUT: it brings the topic's Iceberg "
    "table (--iceberg-table in --iceberg-catalog, else the topic's policy) to the published epoch, one snapshot "
    "per epoch, written incrementally; made, with its namespace, on first use (pip install 'shale[iceberg]'; "
    "docs/operations.md).")

#: Every command of ``shale``, in the order its ``--help`` lists them (``compact`` is also
#: a console script of its own).
COMMAND_TABLE: Final[dict[str, Command]] = {c.name: c for c in (
    Command("create", "create a topic, with its own policy (--set NAME=VALUE)",
            "Create an empty topic at TOPIC_URI, with the policy --set gives it (the settings shale config sets), "
            "so that its first produce and compaction already run under it: the policy is written first, then the "
            "topic, and a setting the topic could not work with is refused before anything is written. shale produce "
            "creates a topic too, without a policy.",
            "  0  created\n"
            "  2  bad usage or setting, a topic there already (shale config changes its policy), or one it would\n"
            "     lie inside or around (nothing is written)\n"
            "  3  the policy kept changing (other writers)", "shale.cli.maintain:run_create"),
    Command("produce", "append records to a topic (creating it if needed)", _PRODUCE, _PRODUCE_CODES,
            "shale.cli.produce:run_produce"),
    Command("read", "print a topic's records as JSON lines",
            'Print records as JSON lines {"id","key","value" (or "value_b64"),"properties","publish_time",'
            '"event_time"}.', _READ_CODES, "shale.cli.read:run_read"),
    Command("get", "print the latest record of one key",
            "Print the latest record of KEY (one JSON line), from the compacted view and the tail above the "
            "horizon, reading only the footers and the entries whose key hashes match (Pulsar's TableView.get).",
            "  0  found\n  2  bad usage or missing topic\n  4  corrupt data\n"
            "  5  the key has no value; the line says why, as far as can be known: deleted, expired\n"
            "     (the key TTL), never written, or no record of it left (retention removed its ledgers)",
            "shale.cli.read:run_get"),
    Command("export", "write a topic, its compacted view or its table as Parquet, Arrow or JSON lines, or as an "
            "Iceberg table", _EXPORT,
            _EXPORT_CODES, "shale.cli.read:run_export"),
    Command("changes", "print what changed between two points: one JSON line per key whose state differs",
            'Print, as JSON lines, one line per key whose state (its latest record; none once deleted or expired) '
            'differs between --from and --to: {"op":"upsert", and the key\'s new record as shale read prints it} '
            'or {"op":"delete","key"}. Upserts come first, in id order, then deletes. A point is an epoch, a time, '
            'a message id or a tag, as shale read --as-of takes it; one older than the history kept is refused. '
            'Between two retained epochs only what the later compaction changed is read (the parts the views do '
            'not share, and their deletion vectors).',
            "  0  printed\n  2  bad usage or input: a bad point, one older than the history kept, missing topic\n"
            "  4  corrupt data", "shale.cli.read:run_changes"),
    Command("status", "print a topic's ledgers, records and compaction state",
            "Print a topic's ledgers, its compaction state and its dirty ratio. A damaged ledger or part does not "
            "stop it: each is named (on standard error too) and the dirty ratio is then estimated from the "
            "metadata; shale verify --scrub is the check.", _STATUS_CODES, "shale.cli.inspect:run_status"),
    Command("compact", "compact topics (same as the compact command)",
            "Compact keyed topics: keep the latest record of every key below a new horizon in a new compacted "
            "ledger, and publish it atomically.", _COMPACT_CODES, "shale.cli.compact:run_compact"),
    Command("gc", "delete retired compacted ledgers and leftovers past their grace period",
            "Delete retired compacted ledgers older than --gc-grace and orphaned objects (crashed or beaten runs, "
            "unregistered ledgers) older than --orphan-grace. Never deletes anything a published state refers to.",
            "  0  collected (or, with --dry-run, listed) what was past its grace\n"
            "  1  unexpected failure (storage unreachable after retries)\n"
            "  2  bad usage or input: bad flag or variable, bad URI, missing topic\n"
            "  3  the compaction state kept changing (other writers); safe to run again\n"
            "  4  a metadata document breaks its schema or invariants (nothing is deleted)",
            "shale.cli.maintain:run_gc"),
    Command("truncate", "retention: remove the oldest ledgers from a topic",
            "Remove the oldest ledgers of the topic (retention by hand), by one rule: --before-ledger ID (the "
            "ledgers with ids below ID), --older-than DURATION (the oldest ledgers whose last record is older), "
            "--keep-bytes SIZE (the oldest ledgers until at most SIZE is left) or --policy (the topic's own retention "
            "and retention-bytes, as compact applies them after every run). By default only ledgers wholly at "
            "or below the compaction horizon go: the compacted view keeps the latest record of every key, so "
            "nothing a compacted reader sees is lost; --before-ledger past the horizon is refused, and the age and "
            "size rules stop at the horizon. Nor does it remove a ledger an active subscription has yet to read "
            "(shale subscriptions) unless --allow-unread. A rule stops at the first ledger something holds back, "
            "and says what holds it (the horizon, a subscription, a retained or tagged snapshot) and how many ledgers "
            "past the rule it keeps. A compaction that read them while they were removed publishes nothing and exits "
            "3; their objects are deleted by gc once the orphan grace has passed.",
            "  0  removed (or, with --dry-run, listed) the ledgers the rule names\n"
            "  2  bad usage or input: missing topic, ID out of range, --policy on a topic whose policy\n"
            "     sets no retention, ledgers above the horizon\n"
            "     without --allow-uncompacted, or ledgers an active subscription has yet to read\n"
            "     without --allow-unread (nothing is removed)\n"
            "  3  the topic kept changing (other writers); safe to run again\n"
            "  4  a ledger footer or metadata document is corrupt", "shale.cli.maintain:run_truncate"),
    Command("snapshots", "list a topic's retained compacted views; tag one to keep it, or remove a tag",
            "Without --tag or --untag, list the topic's retained compacted views, oldest first: each one's epoch, "
            "horizon, when it was published (compacted) and replaced, its keys, live records, bytes, order and tags "
            "(--json: one document). --tag NAME [--epoch N] names a retained view (default: the published one): a "
            "tagged view is kept whatever snapshot-retention and snapshot-retention-age say, with every object it "
            "reads and the ledgers above its horizon, until the tag is removed; read it with shale read --as-of NAME, "
            "publish it again with shale rollback --to-tag NAME. --untag NAME removes the name: the view falls under "
            "the snapshot retention again at the next publish. truncate --drop-snapshots never drops a tagged view. "
            "Each change is one compare-and-swap on the compaction state: a compaction planned before it loses its "
            "publish (exit 3, safe to run again) rather than publish without it.",
            "  0  listed, tagged or untagged\n"
            "  2  bad usage or input: missing topic, bad tag name, an epoch that is not retained (or was\n"
            "     dropped meanwhile by a publish), a tag that names another epoch, an unknown tag\n"
            "  3  the compaction state kept changing (other writers); safe to run again\n"
            "  4  a metadata document breaks its schema or invariants", "shale.cli.maintain:run_snapshots"),
    Command("rollback", "publish a retained snapshot's compacted view again, as a new epoch",
            "Publish a retained compacted view again, as the epoch after the published one: the view of --to-epoch, "
            "of --to-tag, or the one current at --to-time (the newest retained view published at or before it). "
            "Rollback undoes compactions, not records: it republishes an earlier compacted view, and every record "
            "written since is still read, above that view's horizon. It publishes with one compare-and-swap fenced "
            "by the published epoch, as a compaction publishes: the view it replaces becomes a snapshot if the "
            "snapshot retention keeps it, and a compaction planned from that epoch loses its race. The next "
            "compaction builds on the view rolled back to (its parts, then the ledgers above its horizon). shale "
            "snapshots lists the retained views.",
            "  0  published (or, with --dry-run, said what would be)\n"
            "  2  bad usage or input: missing topic, an epoch that is not retained or is the published one,\n"
            "     an unknown tag, a time before every retained view was published, or a view whose\n"
            "     records above its horizon retention removed (nothing is published)\n"
            "  3  lost the race: another epoch was published first (nothing was rolled back)\n"
            "  4  a metadata document breaks its schema or invariants", "shale.cli.maintain:run_rollback"),
    Command("config", "show or change a topic's policy (its own compaction and retention settings)",
            "Show a topic's policy, or change it with --set and --unset (one compare-and-swap). compact applies "
            "each topic's policy, and produce its compression: a run's flag wins over it, and it wins over SHALE_* "
            "variables and the defaults.",
            "  0  shown or changed\n  2  bad setting or missing topic (nothing changed)\n"
            "  3  the policy kept changing (other writers)", "shale.cli.maintain:run_config"),
    Command("topics", "list every topic under a prefix",
            "List every topic under a prefix: ledgers, records, bytes, horizon, dirty ratio (estimated from the "
            "metadata, as compact --all orders topics), last compaction and policy. A topic whose metadata cannot "
            "be read is listed with its error.", "  0  listed\n  2  bad URI or no topic under the prefix",
            "shale.cli.inspect:run_topics"),
    Command("subscriptions", "list a topic's durable subscriptions with their lag and readers; create, delete or "
            "reset them",
            "Without an action, list the topic's durable subscriptions (shale read --subscription NAME, "
            "TopicReader(subscription=...)): each one's position (the next record it reads), its lag in records and "
            "bytes, when it last committed, whether it is active or expired (one that has not committed for the "
            "topic's subscription-expiry holds nothing back), and the reader holding it (--describe: also the lag of "
            "a compacted read). --create NAME [--to ...] and --delete NAME change one at once. --reset NAME, --all "
            "and --from-file CSV move them, as kafka-consumer-groups --reset-offsets does: a dry run printing the "
            "plan (each one's position and lag before and after) unless --execute. A reset or a delete is refused "
            "while a reader holds the subscription (readers heartbeat into its document as they commit, and every "
            "30 s when idle, and count as gone 90 s after their last heartbeat), unless --force. An active "
            "subscription keeps every tombstone it has yet to read past delete-retention (up to "
            "max-tombstone-hold), and every ledger it has yet to read from retention.",
            "  0  listed, created or deleted, reset (--execute), or the plan printed (a dry run)\n"
            "  2  bad usage or input: bad name, unknown or existing subscription, bad --to (an id\n"
            "     outside the topic), a bad --from-file line, missing topic (nothing changed)\n"
            "  3  a reader holds the subscription (run again once it has stopped, or --force), or\n"
            "     the subscription kept changing (other writers); nothing changed\n"
            "  4  a subscription's or the topic's metadata document breaks its schema",
            "shale.cli.subscriptions:run_subscriptions"),
    Command("exporter", "serve every subscription's lag and state on /metrics for Prometheus, read continuously",
            "Read every subscription's lag and state of the topics under PREFIX_URI (or of the one topic it names) "
            "every --interval, and serve the last reading on http://HOST:PORT/metrics for Prometheus to scrape "
            "(Kafka's lag exporters): per subscription its lag in records and bytes, whether it is active, when it "
            "last committed and when it expires, and the reader holding it; per topic whether it could be read. A "
            "topic that cannot be read is logged and reported (shale_exporter_topic_up 0) and never stops the "
            "others. Runs until stopped (Ctrl-C, SIGTERM); --once prints one reading instead. The alert rules and "
            "dashboard panels on these metrics are in infra/monitoring.",
            "  0  stopped (Ctrl-C, or SIGTERM: it ends the reading under way), or printed one reading\n     (--once)\n"
            "  1  unexpected failure: the address cannot be served (in use, not this machine's)\n"
            "  2  bad usage: a bad flag, variable or --listen address",
            "shale.cli.exporter:run_exporter"),
    Command("verify", "recompute the compacted view from the original ledgers and compare",
            "Recompute the latest record of every key up to the published horizon from the original ledgers that "
            "still exist (footers only), compare it with the published compacted view, and verify every compacted "
            "frame's checksum.",
            "  0  the view matches (and, with --scrub, every object is whole)\n  2  bad usage or missing topic\n"
            "  4  an object is corrupt (with --scrub: every damaged one is listed)\n"
            "  5  missing, extra or stale keys (listed)", "shale.cli.maintain:run_verify"),
    Command("dictionary", "list a topic's zstd dictionaries, or train a new one",
            "Without --train, list the topic's trained zstd dictionaries. With --train, train one on a sample of "
            "the topic's newest records, register it, and print what it saves on entries it was not trained on. "
            "Entries compressed with zstd-dict (the topic's compression policy, or --compression) use the newest "
            "dictionary; older entries keep theirs, and dictionaries are never deleted.",
            "  0  listed or trained\n  2  bad usage, missing topic or too few records to train on\n"
            "  3  the topic kept changing\n  4  a ledger or metadata document is corrupt",
            "shale.cli.maintain:run_dictionary"),
)}
