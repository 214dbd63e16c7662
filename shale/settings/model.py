"""Every setting of every command, each defined once (:data:`SETTINGS`).

A :class:`Setting` holds a setting's name (its flag without the dashes, its policy key,
``shale config --set NAME``), the kind of value it takes (:mod:`shale.settings.kinds`:
type, constraints, how it is typed and shown), its default, its help, the commands that
take it, and whether a topic's policy may set it.  The command line's flags, their
``SHALE_*`` variables, ``--help``, ``--print-config``, the policy document's schema
(:mod:`shale.metadata.policy`), ``shale config`` and the compactor's run settings
(:class:`~shale.compactor.config.CompactionConfig`) are all made from this table.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any, Final

from shale.ledger.codecs import DEFAULT_COMPRESSION
from shale.ledger.values import dataclass
from shale.settings.kinds import (
    Choice,
    Codec,
    Duration,
    Instant,
    Kind,
    Pairs,
    Rate,
    Ratio,
    Seconds,
    Size,
    Switch,
    Text,
    Uri,
    Url,
    Whole,
)

__all__ = ["COMMANDS", "ENV_PREFIX", "POLICY_SETTINGS", "SETTINGS", "VARIABLES", "Setting", "Variable", "settings_for"]

ENV_PREFIX: Final = "SHALE_"

#: Every command, in the order ``shale --help`` lists them.
COMMANDS: Final = ("create", "produce", "read", "get", "export", "changes", "status", "compact", "gc", "truncate",
                   "snapshots", "rollback",
                   "config", "topics", "subscriptions", "exporter", "verify", "dictionary")
#: The commands about one topic, named by a ``TOPIC_URI`` and ``--metadata``.
_ONE_TOPIC: Final = frozenset(COMMANDS) - {"compact", "topics", "exporter"}


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting, as every command that takes it, its variable and a topic's policy see it."""

    #: how people name it: the flag without its dashes, the policy key, ``--set NAME``
    name: str
    kind: Kind
    help: str
    #: the commands that take it (none: only a topic's policy sets it)
    commands: frozenset[str]
    default: Any = None
    #: the default in words where it is not a value (``None`` with ``default`` None: no default)
    default_text: str | None = None
    #: whether a topic's policy may set it (``shale config --set NAME=VALUE``)
    policy: bool = False
    #: its name in Python: a run's settings and the policy document (default: the name in snake case)
    field: str = ""
    #: the flag, where it differs from ``--NAME`` (two settings of different commands share a flag)
    flag: str = ""
    #: more flags that mean the same (former names)
    aliases: tuple[str, ...] = ()
    #: a positional argument's metavar (``TOPIC_URI``); empty: a flag
    positional: str = ""
    #: a positional list, or a flag that may be given many times (its variable: one value a line)
    many: bool = False
    #: a positional argument that may be left out (the command says when it is needed)
    optional: bool = False
    #: whether a ``SHALE_*`` variable may set it (``--print-config`` is a flag only)
    env: bool = True
    #: the settings of one group exclude each other: a flag of one replaces the variables of all
    group: str = ""
    #: the group needs one of its settings
    required: bool = False
    #: the help in one command's own words: ``(command, help)`` pairs
    help_for: tuple[tuple[str, str], ...] = ()
    metavar: str = ""

    @property
    def dest(self) -> str:
        """The setting's name as an identifier (``max-topics`` → ``max_topics``)."""
        return self.name.replace("-", "_")

    @property
    def py_name(self) -> str:
        """Its field in a run's settings and in the policy document."""
        return self.field or self.dest

    @property
    def option(self) -> str:
        """How the user names it: its flag, or a positional's metavar."""
        return self.positional or self.flag or f"--{self.name}"

    @property
    def variable(self) -> str:
        """Its ``SHALE_*`` variable: ``SHALE_`` and its name in capitals."""
        return ENV_PREFIX + self.name.upper().replace("-", "_")

    def help_of(self, command: str) -> str:
        """The help ``command`` shows."""
        return dict(self.help_for).get(command, self.help)

    def default_shown(self) -> str | None:
        """The default as ``--help`` says it, or None."""
        if self.default_text is not None:
            return self.default_text
        if self.default is None or self.kind.switch or self.many:
            return None
        return self.kind.show(self.default)


def _s(name: str, kind: Kind, help: str, commands: frozenset[str] | set[str], **kw: Any) -> Setting:
    return Setting(name, kind, help, frozenset(commands), **kw)


_JSON_HELP: Final = (("compact", "print one JSON line per topic instead of a summary"),
                     ("create", "print one JSON document instead of text"),
                     ("status", "print one JSON document instead of text"),
                     ("config", "print one JSON document instead of text"),
                     ("topics", "print one JSON line per topic instead of a table"),
                     ("subscriptions", "print one JSON document instead of text"),
                     ("snapshots", "print one JSON document instead of text"),
                     ("verify", "print the report as one JSON line"),
                     ("produce", "print one JSON line with the ids and counts instead of text"))
_COMPACT: Final = {"compact"}
_SPARK: Final = "with --engine spark: "
_GAP_HELP: Final = (
    "when retention removed records this read had yet to reach (a paused --follow, a --start id below the oldest "
    "ledger left): error stops with exit code 6 naming the range; skip goes on at the next record left, with a "
    "warning; compacted reads the range from the compacted view (the latest value of each of its keys), with a "
    "warning")
_VALUE_FORMAT_HELP: Final = (
    "text: every value as a JSON string of its text (value_b64 when not UTF-8); json: a value that is a JSON "
    "document strict parsers read is printed as that document, its text as stored (line breaks become spaces), any "
    "other (not JSON, NaN, Infinity, a number beyond 64-bit floats or of over 4300 digits, nested over 512 deep) as "
    "a JSON string of its text, value_b64 when not UTF-8. Every line is strict JSON")

#: Every setting.  A declared table: one entry per setting, in the order ``--help`` lists them.
SETTINGS: Final[dict[str, Setting]] = {s.name: s for s in (
    # --------------------------------------------------------------- what to work on
    _s("topic", Uri(), "topic folder: a local path, file:///path or s3://bucket/prefix", _ONE_TOPIC,
       positional="TOPIC_URI", env=False),
    _s("topics", Uri(), "topic folders: local paths, file:///path or s3://bucket/prefix", _COMPACT,
       positional="TOPIC_URI", many=True, group="topics"),
    _s("all", Uri(), "compact every topic under this prefix (a topic is a folder holding _meta/topic.json)",
       _COMPACT, group="topics", metavar="PREFIX_URI"),
    _s("prefix", Uri(), "a folder holding topics: a local path or s3://bucket/prefix", {"topics", "exporter"},
       positional="PREFIX_URI", env=False,
       help_for=(("exporter", "a folder holding topics (every topic under it, looked for again at each reading), "
                  "or one topic: a local path or s3://bucket/prefix"),)),
    _s("metadata", Uri(), "where the topic's metadata lives", _ONE_TOPIC | _COMPACT, default_text="TOPIC_URI/_meta"),
    _s("key", Text(), "the key, as text", {"get"}, positional="KEY", env=False),
    _s("key-b64", Switch(), "KEY is base64 (a binary key)", {"get"}, default=False),
    _s("out", Uri(), "where to write: a local path, s3://bucket/key.parquet, ..., or - (standard output; also "
       "/dev/stdout); none with --format iceberg", {"export"}, positional="OUT", env=False, optional=True),
    # ---------------------------------------------------------------------- produce
    _s("input", Text(), "input file", {"produce"}, default="-", default_text="standard input", metavar="PATH|-"),
    _s("format", Choice(("jsonl", "parquet", "arrow", "csv")), "input format", {"produce"},
       default_text="from the file name's suffix, else jsonl"),
    _s("key-field", Text(), "the column of keys (parquet, arrow, csv)", {"produce"}, default_text="key",
       metavar="COLUMN"),
    _s("value-field", Text(), "the column of values (parquet, arrow, csv)", {"produce"}, default_text="value",
       metavar="COLUMN"),
    _s("properties-field", Text(), "a map<string,string> column of properties (parquet, arrow)", {"produce"},
       metavar="COLUMN"),
    _s("event-time-field", Text(), "a timestamp or integer-milliseconds column of event times (parquet, arrow, csv)",
       {"produce"}, metavar="COLUMN"),
    _s("max-ledger-records", Whole(1), "seal a ledger after N records", {"produce"}, default=500_000),
    _s("max-ledger-bytes", Size(1), "seal a ledger once it holds SIZE bytes (64MiB, 1GB)", {"produce"},
       default=64 << 20),
    _s("batch-size", Whole(1), "records per entry (as Pulsar batches; fewer once they come to 1 MiB)", {"produce"},
       default=1000),
    _s("max-ledger-age", Duration(), "seal what was appended once its oldest record has waited this long, however "
       "slowly the input comes, so that a follower sees every record within this plus its poll interval (Kafka's "
       "linger.ms); each seal is one ledger: one object and one swap of the ledger list (0: by size and at the end "
       "only)", {"produce"}, flag="--linger", default=0, policy=True, field="max_ledger_age_ms"),
    _s("producer-id", Text(), "make a retried produce skip what an earlier run with this id appended: the records "
       "of the input are numbered from 0, and those below the number the id last registered (with its ledger, in "
       "one swap) are skipped, as Kafka's idempotent producer does; give each input its own id (its file name and "
       "date, say): a prefix is skipped by position, not by content", {"produce"}, metavar="ID"),
    _s("producer-expiry", Duration(), "how long what a producer id registered is kept after its last ledger; a run "
       "with the id after that appends everything again", {"produce"}, default=7 * 24 * 3_600_000, policy=True,
       field="producer_expiry_ms"),
    _s("compression", Codec(),
       "how entries are compressed: none, lz4, zstd (level 1), zstd:LEVEL (1-22), or zstd-dict[:LEVEL] (zstd with "
       "the topic's newest trained dictionary: shale dictionary --train)", {"produce", "compact"},
       default=DEFAULT_COMPRESSION, policy=True,
       help_for=(("compact", "how the entries a run writes anew (survivors of partly kept entries, packed together) "
                  "are compressed: none, lz4, zstd (level 1), zstd:LEVEL (1-22), or zstd-dict[:LEVEL] (zstd with "
                  "the topic's newest trained dictionary); entries kept whole keep their stored bytes"),)),
    # ------------------------------------------------------------------ read, get, export
    _s("start", Text(), "where to start: earliest, latest, a message id LEDGER:ENTRY:BATCH (a missing id starts at "
       "the next existing one), or a time, the first record published then or later (Kafka's offsetsForTimes: ISO "
       "8601, UTC unless it names a zone; milliseconds since 1970; or -DURATION before now, e.g. -1h); with "
       "--subscription, where a new subscription starts (an existing one is refused: shale subscriptions --reset)",
       {"read", "export"}, default="earliest", metavar="earliest|latest|ID|TIME"),
    _s("limit", Whole(1), "stop after N records", {"read"}),
    _s("compacted", Switch(), "read the compacted view: compacted ledger up to the horizon, then the tail",
       {"read", "export"}, default=False),
    _s("table", Switch(), "only the latest record of every live key (implies --compacted)", {"read", "export"},
       default=False),
    _s("as-of", Text(), "the topic as it was at a point, nothing written later: an epoch (that compacted view through "
       "its horizon), a time (ISO 8601, UTC without a zone, or MILLISms: every record published by then), a message "
       "id (every record up to it) or a tag (shale snapshots --tag); a point older than the history kept is refused "
       "(implies --compacted; see snapshot-retention)", {"read", "get", "export"}, metavar="EPOCH|TIME|ID|TAG"),
    _s("from-snapshot", Text(), "read a retained snapshot's compacted view (an epoch, or a tag), then every record "
       "above its horizon as the topic holds them now (what shale rollback --to-epoch EPOCH would publish; implies "
       "--compacted)", {"read"}, metavar="EPOCH|TAG"),
    _s("from-point", Text(), "the earlier point: an epoch, a time (ISO 8601, UTC without a zone, or MILLISms), a "
       "message id or a tag, as shale read --as-of takes them", {"changes"}, flag="--from", env=False,
       group="from", required=True, metavar="EPOCH|TIME|ID|TAG"),
    _s("to-point", Text(), "the later point (default: the topic as it is now)", {"changes"}, flag="--to", env=False,
       metavar="EPOCH|TIME|ID|TAG"),
    _s("changes-from", Text(), "write the changes from this point instead of records: one row per key whose state "
       "differs, with an op column (upsert or delete); a point as --as-of takes it", {"export"}, env=False,
       metavar="EPOCH|TIME|ID|TAG"),
    _s("changes-to", Text(), "with --changes-from: the later point (default: the topic as it is now)", {"export"},
       env=False, metavar="EPOCH|TIME|ID|TAG"),
    _s("follow", Switch(), "keep reading as new ledgers are registered (Ctrl-C ends it, exit code 0)", {"read"},
       default=False),
    _s("poll-interval", Duration(), "with --follow: how often to look for new ledgers", {"read"}, default=1000),
    _s("retry-for", Duration(), "ride out storage outages: a read that finds storage unreachable (after its own "
       "retries) tries again, waiting twice as long each time from --poll-interval up to 30s, for this long before "
       "it gives up (exit 1); each outage is said once when it starts and once when it ends", {"read"},
       default_text="with --follow: until storage is back; otherwise 0, only the store's own retries"),
    _s("value-format", Choice(("text", "json")), _VALUE_FORMAT_HELP, {"read", "get", "changes"}, default="text"),
    _s("on-gap", Choice(("error", "skip", "compacted")), _GAP_HELP, {"read"}, default="error"),
    _s("subscription", Text(), "read as this durable subscription: start where it last committed (a new one is "
       "created at --start) and commit after the records printed (shale subscriptions)", {"read"}, metavar="NAME"),
    _s("max-batch-bytes", Size(1), "the most bytes of records, once decompressed, that one batch holds and that are "
       "decompressed at once (a bigger record goes alone; entries are read 8MiB at most at a time, a bigger entry "
       "in pieces as it is decompressed; an lz4 entry bigger than this, than its biggest record and than 1MiB is "
       "refused)",
       {"read", "export"}, default=16 << 20),
    _s("overwrite", Switch(), "replace OUT if it is an existing regular file (default: refuse, and never replace one "
       "that appears while the export runs)", {"export"}, default=False),
    _s("export-format", Choice(("parquet", "arrow", "jsonl", "iceberg")), "what to write (iceberg: bring the "
       "topic's Iceberg table, --iceberg-table in --iceberg-catalog, to its published epoch; no OUT)", {"export"},
       flag="--format", default_text="from OUT's suffix (.parquet, .arrow, .jsonl), else parquet"),
    _s("utf8", Switch(), "keys and values as text (refused, naming the row, where one is not valid UTF-8) rather "
       "than binary", {"export"}, default=False),
    _s("export-compression", Choice(("zstd", "lz4", "snappy", "none")),
       "how Parquet or Arrow compresses its pages: zstd, lz4, snappy (Parquet only) or none", {"export"},
       flag="--compression", default="zstd"),
    # ---------------------------------------------------------------------- Iceberg
    _s("iceberg-catalog", Text(), "the topic's Iceberg catalog: sqlite:///PATH (or a path: pyiceberg's SQL catalog on "
       "a SQLite file), postgresql://USER@HOST:PORT/DB (the SQL catalog on PostgreSQL; the password from "
       "PGPASSWORD), or a REST catalog's http(s):// URI; in a topic's policy, every compact brings the table to the "
       "epoch it publishes", {"export"}, policy=True, aliases=("--catalog",), metavar="URI"),
    _s("iceberg-table", Text(), "the topic's Iceberg table, NAMESPACE.NAME (made, with its namespace, on first use)",
       {"export"}, policy=True, metavar="NS.NAME"),
    _s("iceberg-warehouse", Uri(), "where the table's files go: a folder or s3://bucket/prefix (default: the REST "
       "catalog's own; for a SQLite catalog, a warehouse folder beside its file)", {"export"}, policy=True,
       aliases=("--warehouse",), metavar="LOCATION"),
    _s("iceberg-value-format", Choice(("binary", "text", "json")), "how the table keeps keys and values: binary, "
       "or strings (text; json: JSON text, for engines' JSON functions), chosen when the table is made",
       {"export"}, default="binary", policy=True),
    _s("iceberg-rewrite-fraction", Ratio(), "rewrite a data file of the table once this fraction of its rows is "
       "deleted", {"export"}, default=0.2, policy=True),
    _s("iceberg-property", Pairs(prefix="", what="a catalog property"), "a property handed to the Iceberg catalog "
       "as it is, e.g. credential=ID:SECRET or s3.endpoint=URL (repeatable)", {"export", "compact"}, many=True),
    # ---------------------------------------------------------------------- compact
    _s("max-topics", Whole(1), "compact at most N topics this run: overdue ones first, then the highest dirty "
       "ratio (--all, --max-topics and --max-compaction-lag order the topics so; otherwise they run in the order "
       "given)", _COMPACT),
    _s("parallel", Whole(1, 64), "compact N topics at a time; one topic's failure does not stop the others",
       _COMPACT, default=1),
    _s("max-compaction-lag", Duration(), "a topic whose oldest uncompacted record is older than this is compacted "
       "first, whatever its dirty ratio (Kafka's max.compaction.lag.ms)", _COMPACT, policy=True,
       field="max_compaction_lag_ms"),
    _s("min-compaction-lag", Duration(), "records younger than this wait for a later run", _COMPACT, default=0,
       policy=True, field="min_compaction_lag_ms"),
    _s("delete-retention", Duration(), "keep tombstones this long after the first compaction that kept them (0 "
       "drops them at once)", _COMPACT, default=24 * 3_600_000, policy=True, field="delete_retention_ms"),
    _s("retain-null-key", Switch(), "keep records without a key in place (default: drop them)", _COMPACT,
       default=False, policy=True),
    _s("arrow-cache", Switch(), "write an Arrow IPC file beside each compacted part written (its rows as a read "
       "of the view as Arrow gives them), which such reads map instead of decoding the part; costs compaction time "
       "and storage (bench/README.md)", _COMPACT, default=False, policy=True),
    _s("min-dirty-ratio", Ratio(), "skip when bytes above the horizon / live bytes is below R", _COMPACT,
       default=0.0, policy=True),
    _s("order", Choice(("offset", "event-time")), "which record of a key wins: offset (the one written last) or "
       "event-time (the greatest event time, a record without one counting as its publish time; a later offset "
       "breaks ties); changing it needs --rewrite once a compacted view exists", _COMPACT, default="offset",
       policy=True),
    _s("key-ttl", Duration(), "drop a key from the compacted view, and hide it from readers, once its latest record "
       "is older than this (by event time under event-time order, else by publish time; 0: never)", _COMPACT,
       default=0, policy=True, field="key_ttl_ms"),
    _s("rewrite", Switch(), "compact the whole topic again, every original ledger still kept and the compacted view, "
       "as when the order changes (reads every ledger; writes a new compacted view)", _COMPACT, default=False),
    _s("subscription-expiry", Duration(), "a subscription that has not committed for this long holds nothing back "
       "(neither tombstones nor ledgers) until it commits again", _COMPACT, default=7 * 24 * 3_600_000,
       policy=True, field="subscription_expiry_ms"),
    _s("max-tombstone-hold", Duration(), "drop a tombstone past the delete retention that has been kept this long "
       "whatever the subscriptions that have yet to read it (0: subscriptions hold no tombstone back)", _COMPACT,
       default=30 * 24 * 3_600_000, policy=True, field="max_tombstone_hold_ms"),
    _s("retention", Duration(), "after each compact run, whatever it found to do, and with shale truncate --policy: "
       "remove the ledgers wholly below the horizon and older than this that no active subscription or retained "
       "snapshot needs", set(), policy=True, field="retention_ms"),
    _s("retention-bytes", Size(), "after each compact run, whatever it found to do, and with shale truncate "
       "--policy: remove the oldest ledgers below the horizon beyond this many bytes that no active subscription or "
       "retained snapshot needs", set(), policy=True),
    _s("snapshot-retention", Whole(1, 1000), "keep the newest N compacted views readable, the published one included "
       "(shale read --as-of, shale rollback; 1: only the published one), with every object they read and the ledgers "
       "above their horizons; tagged views (shale snapshots --tag) are kept besides", {"compact", "rollback"},
       default=1, policy=True),
    _s("snapshot-retention-age", Duration(), "also keep every compacted view replaced less than this long ago (0: "
       "by count only)", {"compact", "rollback"}, default=0, policy=True, field="snapshot_retention_age_ms"),
    _s("dry-run", Switch(), "plan and run pass one only; report what would be written; publish nothing",
       {"compact", "gc", "truncate", "subscriptions", "rollback"}, default=False,
       help_for=(("gc", "list what would be deleted, delete nothing"),
                 ("truncate", "say what would be removed; remove nothing"),
                 ("subscriptions", "say what --create or --delete would do; change nothing (a reset is a dry run "
                  "unless --execute)"),
                 ("rollback", "say what would be published; publish nothing"))),
    _s("gc-grace", Duration(), "delete a retired compacted ledger only after this long", {"compact", "gc"},
       default=5 * 60_000, field="gc_grace_ms", aliases=("--grace",),
       help_for=(("gc", "delete retired compacted ledgers only after this long (--grace is its former name)"),)),
    _s("orphan-grace", Duration(15 * 60_000, "a writer may pause that long between uploading and publishing"),
       "delete leftovers of crashed or beaten runs (unreferenced objects) only after this long", {"compact", "gc"},
       default=3_600_000, field="orphan_grace_ms"),
    _s("no-gc", Switch(), "do not collect garbage after the run", _COMPACT, default=False),
    _s("max-part-bytes", Size(64 << 10, why="the least a compacted part may hold"),
       "roll the compacted ledger into a new part at this size", _COMPACT, default=256 << 20),
    _s("read-parallelism", Whole(1, 64), "ranged reads pass two keeps in flight, 8 MiB each", _COMPACT, default=4),
    _s("max-read-bytes-per-second", Rate(), "limit pass two's reads to SIZE per second, at least 64KiB (0: no limit; "
       "per task with Spark)", {"compact", "verify"}, default=0, field="max_read_bytes_per_s",
       help_for=(("verify", "with --scrub: read at most SIZE per second, at least 64KiB (0: no limit)"),)),
    _s("max-write-bytes-per-second", Rate(), "limit pass two's writes to SIZE per second, at least 64KiB (0: no "
       "limit; per task with Spark)", _COMPACT, default=0, field="max_write_bytes_per_s"),
    _s("workers", Whole(0, 64), "CPU cores the local engine uses: threads building pass one's key map, processes "
       "copying in pass two (0: every available CPU, at most 8; small runs use one)", _COMPACT, default=0),
    _s("max-map-bytes", Size(24, why="one key"), "memory for pass one's key map, 24 bytes per key written since the "
       "last run; when the new keys need more, compact up to where they fit and let the next run continue; with "
       "--engine spark, the most one reduce task holds (more reduce partitions, nothing left for the next run)",
       _COMPACT, default_text="1GiB, about 44 million keys"),
    _s("max-memory", Size(32 << 20, why="the least a run makes progress in"), "bound the whole run's memory (local "
       "engine): key map, pass two's buffers, reads and writes in flight, the footer pages kept mapped; the key map "
       "gets what the rest leaves (within --max-map-bytes), so a run whose new keys do not fit compacts up to where "
       "they fit and the next run continues; peak memory stays within SIZE plus a fixed overhead (docs/operations.md, "
       "Sizing memory); with --parallel N, each topic gets SIZE/N; refused with --engine spark, whose executors Spark "
       "sizes itself", _COMPACT,
       default_text="none: only --max-map-bytes and the other settings bound it"),
    _s("json", Switch(), "print one JSON line instead of text", set(COMMANDS) - {"exporter"}, default=False,
       help_for=_JSON_HELP),
    _s("log-format", Choice(("text", "json")), "text: errors and warnings as one line each; json: one JSON object "
       "per event on standard error, for log collectors (no progress display)", _COMPACT, default="text"),
    _s("pushgateway", Url(), "push each topic's run metrics to this Prometheus Pushgateway (e.g. "
       "http://pushgateway:9091); a failed push is a warning and does not change the exit code", _COMPACT),
    _s("pushgateway-job", Text(), "the job label of pushed metrics", _COMPACT, default="shale_compact",
       metavar="NAME"),
    _s("print-config", Switch(), "print the effective settings (each with its source: flag, the topic's policy, "
       "SHALE_* variable or default) as JSON with secrets masked, and exit", _COMPACT, default=False, env=False),
    _s("engine", Choice(("local", "spark")), "where the two passes run: local, in this process; spark, as Spark "
       "jobs (needs pip install 'shale[spark]'); planning and publishing always run here", _COMPACT,
       default="local"),
    _s("spark-master", Text(), _SPARK + "the Spark master: local[N], spark://HOST:PORT, k8s://https://HOST, yarn",
       _COMPACT, default_text="spark-submit's master under spark-submit, else local[*]", metavar="URL"),
    _s("spark-remote", Text(), _SPARK + "run as a client of this Spark Connect server: sc://HOST:PORT (with "
       "/;token=... and Spark Connect's other parameters), or local[N] for one started here; instead of a master",
       _COMPACT, default_text="Spark's SPARK_REMOTE when set (and no master is given), else none", metavar="URL"),
    _s("spark-conf", Pairs(), _SPARK + "a Spark setting for the session Shale starts (repeatable)", _COMPACT,
       many=True),
    _s("spark-split-size", Size(64 << 10, why="the least a Spark task handles"),
       _SPARK + "entry bytes one Spark task handles at most", _COMPACT, default_text="128MiB"),
    _s("no-forward-credentials", Switch(), _SPARK + "do not send the driver's AWS credential variables to "
       "executors with the tasks (use when executors have their own identity)", _COMPACT, default=False),
    # ------------------------------------------------------------ gc, truncate, verify
    _s("before-ledger", Whole(0, (1 << 63) - 1), "remove the ledgers whose id is below ID (at most the last "
       "ledger's id + 1)", {"truncate"}, group="rule", required=True, metavar="ID"),
    _s("older-than", Duration(), "remove the oldest ledgers whose last record is older than this (Kafka's "
       "retention.ms)", {"truncate"}, group="rule", required=True),
    _s("keep-bytes", Size(), "remove the oldest ledgers until at most SIZE of ledgers is left (retention.bytes)",
       {"truncate"}, group="rule", required=True),
    _s("policy", Switch(), "remove what the topic's own retention lets go (its policy's retention and "
       "retention-bytes, shale config), as compact does after every run: never past the horizon, nor what an active "
       "subscription or a retained snapshot needs", {"truncate"}, default=False, group="rule", required=True),
    _s("allow-uncompacted", Switch(), "also remove ledgers with records above the horizon, which no compaction has "
       "kept: those records are lost (the report says how many)", {"truncate"}, default=False),
    _s("allow-unread", Switch(), "also remove ledgers an active subscription has not read yet: it meets a gap "
       "(shale read --on-gap)", {"truncate"}, default=False),
    _s("drop-snapshots", Switch(), "also remove ledgers that retained snapshots (snapshot-retention) need above their "
       "horizons, dropping those snapshots first (they can then no longer be read as of, nor rolled back to)",
       {"truncate"}, default=False),
    _s("to-epoch", Whole(1, (1 << 62) - 1), "the retained epoch whose compacted view to publish again (shale "
       "snapshots lists them)", {"rollback"}, group="to", required=True, metavar="EPOCH"),
    _s("to-time", Instant(), "publish again the view that was current at TIME (ISO 8601, UTC without a zone, or "
       "milliseconds since 1970): the newest retained view published at or before it", {"rollback"}, group="to",
       required=True),
    _s("to-tag", Text(), "publish again the view the tag NAME names (shale snapshots --tag)", {"rollback"}, group="to",
       required=True, metavar="NAME"),
    _s("scrub", Switch(), "first read every frame of every ledger and compacted part, superseded ones included, and "
       "check it (exit 4 naming every damaged object)", {"verify"}, default=False),
    # -------------------------------------------------------------------- snapshots
    _s("tag", Text(), "name a retained view NAME (1 to 200 letters, digits, '.', '_' or '-', starting with a letter): "
       "it is kept, whatever the snapshot retention, until the tag is removed; read it with --as-of NAME",
       {"snapshots"}, group="tagging", env=False, metavar="NAME"),
    _s("untag", Text(), "remove the tag NAME: its view falls under the snapshot retention again at the next publish",
       {"snapshots"}, group="tagging", env=False, metavar="NAME"),
    _s("epoch", Whole(1, (1 << 62) - 1), "with --tag: the retained epoch to tag", {"snapshots"}, env=False,
       default_text="the published epoch"),
    # ---------------------------------------------------------------- subscriptions
    _s("create", Text(), "create the subscription NAME (at --to, default earliest)", {"subscriptions"},
       group="action", env=False, metavar="NAME"),
    _s("delete", Text(), "delete the subscription NAME: it holds nothing back any more (refused while a reader holds "
       "it, unless --force)", {"subscriptions"}, group="action", env=False, metavar="NAME"),
    _s("reset", Text(), "move the subscription NAME to --to, --shift-by or --by-duration (like kafka-consumer-groups "
       "--reset-offsets): a dry run printing the plan unless --execute", {"subscriptions"}, group="action", env=False,
       metavar="NAME"),
    _s("all-subscriptions", Switch(), "reset every subscription of the topic (to --to, --shift-by or --by-duration; "
       "a dry run unless --execute)", {"subscriptions"}, flag="--all", group="action", env=False, default=False),
    _s("from-file", Text(), "reset the subscriptions a CSV file names, each to its own position: lines NAME,POSITION, "
       "POSITION as --to takes it (a first line name,position is a header; - reads standard input); a dry run unless "
       "--execute", {"subscriptions"}, group="action", env=False, metavar="CSV"),
    _s("describe", Switch(), "also show each subscription's compacted lag (what a compacted read from its position "
       "has left: one record per key up to the horizon, then every record above it) and the reader its document "
       "names even once gone", {"subscriptions"}, env=False, default=False),
    _s("to", Text(), "where --create or --reset puts it: earliest (the compacted view's start), latest (past the "
       "last record), current (where it stands), a message id within the topic, or a time, the first record "
       "published then or later (ISO 8601, UTC unless it names a zone; milliseconds since 1970; or -DURATION before "
       "now, e.g. -1h)", {"subscriptions"}, env=False, metavar="earliest|latest|current|ID|TIME"),
    _s("shift-by", Whole(-(1 << 62), 1 << 62), "with --reset: move it by N records from where it stands (back when "
       "negative), at most to latest and back at most to earliest", {"subscriptions"}, env=False),
    _s("by-duration", Text(), "with --reset: move it to the first record published within DURATION of now (1h, "
       "PT1H; a leading - is allowed: -1h)", {"subscriptions"}, env=False, metavar="DURATION"),
    _s("execute", Switch(), "carry out a reset (without it, a reset is a dry run that prints the plan: each "
       "subscription's position and lag before and after)", {"subscriptions"}, env=False, default=False),
    _s("force", Switch(), "reset or delete even while a reader holds the subscription (its heartbeat is live): that "
       "reader fails at its next commit", {"subscriptions"}, env=False, default=False),
    # -------------------------------------------------------------------- exporter
    _s("listen", Text(), "serve /metrics on this address (HOST:PORT; port 0: any free port, printed as it starts)",
       {"exporter"}, default="0.0.0.0:9838", metavar="HOST:PORT"),
    _s("interval", Duration(1000, "the least time between two readings"), "read every subscription's lag and state "
       "this often (a scrape serves the last reading, and costs the store nothing)", {"exporter"}, default=60_000),
    _s("once", Switch(), "read once, print the metrics in Prometheus's text format and exit (for a textfile "
       "collector, or to look)", {"exporter"}, default=False),
    # -------------------------------------------------------------- config, dictionary
    _s("set", Text(), "set a policy setting, e.g. delete-retention=7d (repeatable)", {"config", "create"}, many=True,
       metavar="NAME=VALUE", help_for=(("create", "the new topic's policy: a policy setting, e.g. retention=7d "
                                        "(repeatable)"),)),
    _s("unset", Text(), "remove a policy setting: the run's own value applies again (repeatable)", {"config"},
       many=True, metavar="NAME"),
    _s("train", Switch(), "train a new dictionary and register it", {"dictionary"}, default=False),
    _s("size", Size(1 << 10, 1 << 20, why="zstd's dictionaries hold 1KiB to 1MiB"), "the dictionary's size "
       "(zstd's own default)", {"dictionary"}, default=112 << 10),
    _s("level", Whole(1, 22), "the zstd level to measure it at, and with --use to write at", {"dictionary"},
       default=3),
    _s("use", Switch(), "also set the topic's compression policy to zstd-dict:LEVEL", {"dictionary"}, default=False),
)}

#: The settings a topic's policy may hold, by name.
POLICY_SETTINGS: Final[dict[str, Setting]] = {s.name: s for s in SETTINGS.values() if s.policy}


def settings_for(command: str) -> tuple[Setting, ...]:
    """The settings ``command`` takes, in the order its ``--help`` lists them."""
    return tuple(s for s in SETTINGS.values() if command in s.commands)


@dataclass(frozen=True, slots=True)
class Variable:
    """An environment variable that shapes a run without being a command's flag: what the
    stores are opened with (:class:`~shale.storage.StorageOptions` is made of these), and
    how the process runs.  ``--print-config`` shows every one that is set, secrets masked."""

    name: str
    help: str
    #: what it sets: an :class:`~shale.storage.S3Options` field (``s3.region``), the retry
    #: policy's ``retry.attempts``, or "" (read where it is used)
    target: str = ""
    kind: Kind = field(default_factory=Text)
    #: how a value it cannot take is described, after the variable and the value
    expected: str = ""
    #: who reads it: Shale, or the library or program Shale leaves it to
    reader: str = "shale"


_S3: Final = "the s3:// store: "
#: Every variable that is no command's flag, each once.  A declared table; where several
#: set one thing, the first one set wins (``AWS_ENDPOINT_URL_S3`` over ``AWS_ENDPOINT_URL``).
VARIABLES: Final[dict[str, Variable]] = {v.name: v for v in (
    Variable("AWS_ENDPOINT_URL_S3", _S3 + "the endpoint (MinIO, R2, moto ...)", "s3.endpoint_url"),
    Variable("AWS_ENDPOINT_URL", _S3 + "the endpoint, when AWS_ENDPOINT_URL_S3 is not set", "s3.endpoint_url"),
    Variable("AWS_REGION", _S3 + "the region", "s3.region"),
    Variable("AWS_DEFAULT_REGION", _S3 + "the region, when AWS_REGION is not set", "s3.region"),
    Variable("AWS_PROFILE", _S3 + "the profile of the AWS configuration files", "s3.profile"),
    Variable("AWS_ACCESS_KEY_ID", _S3 + "the access key", "s3.access_key_id"),
    Variable("AWS_SECRET_ACCESS_KEY", _S3 + "the secret key", "s3.secret_access_key"),
    Variable("AWS_SESSION_TOKEN", _S3 + "the session token of temporary credentials", "s3.session_token"),
    Variable("AWS_ROLE_ARN", _S3 + "the role a web identity assumes", "s3.role_arn"),
    Variable("AWS_WEB_IDENTITY_TOKEN_FILE", _S3 + "the web identity's token (IRSA, workload identity)",
             "s3.web_identity_token_file"),
    Variable("AWS_ROLE_SESSION_NAME", _S3 + "the session name of an assumed role", "s3.role_session_name"),
    Variable("AWS_CA_BUNDLE", _S3 + "the certificate authorities the endpoint's certificate is checked against",
             "s3.ca_bundle"),
    Variable("AWS_STS_REGIONAL_ENDPOINTS", _S3 + "legacy or regional: which STS endpoint assumes roles",
             "s3.sts_regional_endpoints"),
    Variable("SHALE_S3_ADDRESSING_STYLE", _S3 + "auto, virtual or path: how the bucket is named in requests",
             "s3.addressing_style", Choice(("auto", "virtual", "path")), "one of auto, virtual, path"),
    Variable("SHALE_S3_CONNECT_TIMEOUT", _S3 + "seconds to wait for a connection (default 10)", "s3.connect_timeout",
             Seconds(), "expected a number of seconds"),
    Variable("SHALE_S3_READ_TIMEOUT", _S3 + "seconds to wait for an answer (default 60)", "s3.read_timeout",
             Seconds(), "expected a number of seconds"),
    Variable("SHALE_S3_ATTEMPTS", "how many times a transient storage failure is tried before it is given up "
             "(default 6)", "retry.attempts", Whole(1, 9999), "expected a whole number of attempts from 1 to 9999"),
    Variable("GOOGLE_APPLICATION_CREDENTIALS", "the gs:// store: the service account's key file", reader="gcsfs"),
    Variable("SHALE_DEBUG", "set: an error's traceback is printed after its one-line message"),
    Variable("SHALE_KERNELS", "numpy: the NumPy fallbacks instead of the C kernels (to compare, or to rule the "
             "kernels out)", kind=Choice(("native", "numpy", "python"))),
    Variable("PYSPARK_PYTHON", "the Python a local Spark master's workers run (this interpreter when not set)",
             reader="Spark"),
    Variable("SPARK_REMOTE", "the Spark Connect server the Spark engine is a client of when neither "
             "--spark-remote nor --spark-master is given", reader="Spark"),
    Variable("PYSPARK_GATEWAY_PORT", "set under spark-submit: the Spark engine joins the application it names",
             reader="Spark"),
    Variable("PYTHONWARNINGS", "Python's warning filters, given to the Spark executors' Python as well",
             reader="Python"),
    Variable("OPENBLAS_NUM_THREADS", "NumPy's BLAS threads: the command line sets 1 unless it is set",
             reader="NumPy"),
    Variable("COLUMNS", "the width --help is written to (the terminal's, or 80, when not set)", reader="argparse"),
)}

