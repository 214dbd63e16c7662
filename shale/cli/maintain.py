"""The commands that look after a topic: ``gc``, ``truncate``, ``snapshots``, ``rollback``,
``verify`` (and ``--scrub``), ``config`` and ``dictionary``."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from shale.cli.app import Streams
from shale.cli.errors import EXIT_CORRUPT, EXIT_MISMATCH
from shale.cli.output import emit, print_json
from shale.ledger.errors import InvalidInputError

if TYPE_CHECKING:
    from shale.maintenance.scrub import ScrubReport
    from shale.metadata.topic import TopicMetadata

__all__ = ["run_config", "run_create", "run_dictionary", "run_gc", "run_rollback", "run_snapshots", "run_truncate",
           "run_verify"]


def _topic(args: argparse.Namespace) -> TopicMetadata:
    """The topic's metadata; a missing topic is an error, not an empty one."""
    from shale.metadata.topic import TopicMetadata

    meta = TopicMetadata.open(args.topic, args.metadata)
    meta.load_topic()
    return meta


def run_gc(args: argparse.Namespace, io: Streams) -> int:
    from shale.maintenance.gc import collect_garbage

    report = collect_garbage(_topic(args), grace_ms=args.gc_grace,  # ages by the store's clock
                             orphan_grace_ms=args.orphan_grace, dry_run=args.dry_run)
    emit(report, io.out, args.json)
    return 0


def run_truncate(args: argparse.Namespace, io: Streams) -> int:
    from shale.maintenance.retention import policy_retention, retention_hold, truncate

    meta = _topic(args)
    if args.policy:
        for flag in ("allow-uncompacted", "allow-unread", "drop-snapshots"):
            if args.settings.value(flag):
                raise InvalidInputError(f"--policy removes what the topic's retention lets go, as compact does: "
                                        f"--{flag} goes with --before-ledger, --older-than or --keep-bytes")
        emit(policy_retention(meta, dry_run=args.dry_run), io.out, args.json)
        return 0
    before, cut = args.before_ledger, None
    if before is None:  # a rule: as many of the oldest ledgers as it lets go
        cut = retention_hold(meta, older_than_ms=args.older_than, keep_bytes=args.keep_bytes,
                             allow_uncompacted=args.allow_uncompacted, allow_unread=args.allow_unread,
                             drop_snapshots=args.drop_snapshots)
        before = cut.before_ledger
    done = truncate(meta, before, allow_uncompacted=args.allow_uncompacted, allow_unread=args.allow_unread,
                    dry_run=args.dry_run, drop_snapshots=args.drop_snapshots)
    if args.before_ledger is None:
        rule = args.settings["older-than" if args.older_than is not None else "keep-bytes"]
        done = done.by_rule(f"{rule.setting.option} {rule.setting.kind.show(rule.value)}", cut)
    emit(done, io.out, args.json)
    return 0


def run_snapshots(args: argparse.Namespace, io: Streams) -> int:
    from shale.maintenance.tags import list_views, tag_view, untag_view
    from shale.metadata.snapshots import check_tag

    if args.epoch is not None and args.tag is None:
        raise InvalidInputError("--epoch goes with --tag")
    name = args.tag if args.tag is not None else args.untag
    if name is not None:
        check_tag(name)  # a bad name is refused before anything is read
    meta = _topic(args)
    if args.tag is not None:
        emit(tag_view(meta, args.tag, args.epoch), io.out, args.json)
    elif args.untag is not None:
        emit(untag_view(meta, args.untag), io.out, args.json)
    else:
        emit(list_views(meta), io.out, args.json)
    return 0


def run_rollback(args: argparse.Namespace, io: Streams) -> int:
    from shale.maintenance.snapshots import rollback
    from shale.maintenance.tags import epoch_at
    from shale.metadata.handle import Topic
    from shale.metadata.snapshots import epoch_of_tag
    from shale.metadata.topic import COMPACTION_DOC

    topic = Topic.open(args.topic, args.metadata, settings=args.settings)
    topic.state  # noqa: B018  (a missing topic is an error)
    planned, where = topic.compaction, topic.meta.docs.url(COMPACTION_DOC)
    if args.to_epoch is not None:
        to_epoch = args.to_epoch
    elif args.to_tag is not None:
        to_epoch = epoch_of_tag(planned, args.to_tag, where)
    else:
        to_epoch = epoch_at(planned, args.to_time, where)
    # (snapshot-retention and its age by the one precedence rule: the topic's handle holds the settings)
    done = rollback(topic, to_epoch, dry_run=args.dry_run, planned=planned)
    emit(done, io.out, args.json)
    if done.note:
        io.err.write(done.note + "\n")
    return 0


def run_config(args: argparse.Namespace, io: Streams) -> int:
    from shale.maintenance.policies import check_workable, parse_assignments, policy_text
    from shale.metadata.topic import TopicMetadata

    meta = TopicMetadata.open(args.topic, args.metadata)
    changes, removed = parse_assignments(args.set, args.unset)
    meta.load_topic()  # a missing topic is an error, and nothing is written for it
    check_workable(meta, changes)
    policy = meta.update_policy(changes, removed) if changes or removed else meta.load_policy()
    shown = policy_text(policy)
    view = meta.load_compaction()
    order = policy.get("order") or "offset"
    if view.horizon is not None and order != view.order.order:
        # not refused: the policy is what a rewrite then applies
        io.err.write(f"{meta.uri}: note: the compacted view is in {view.order.order} order; compactions in "
                     f"{order} order are refused until one rewrites it: shale compact {meta.uri} --rewrite\n")
    if args.json:
        print_json({"topic": meta.uri, "policy": shown, "version": policy.version}, io.out)
    elif not shown:
        io.out.write(f"{meta.uri}: no policy: every setting comes from the run (flag, SHALE_* variable, default)\n")
    else:
        width = max(map(len, shown))
        io.out.write("".join(f"{k.ljust(width)}  {v}\n" for k, v in shown.items()))
    return 0


def run_create(args: argparse.Namespace, io: Streams) -> int:
    from shale.maintenance.policies import create_topic, parse_assignments, policy_text
    from shale.metadata.topic import TopicMetadata

    meta = TopicMetadata.open(args.topic, args.metadata)
    changes, _ = parse_assignments(args.set, ())
    shown = policy_text(create_topic(meta, changes))
    if args.json:
        print_json({"topic": meta.uri, "created": True, "policy": shown}, io.out)
    else:
        policy = ", ".join(f"{k}={v}" for k, v in shown.items())
        io.out.write(f"{meta.uri}: created{', policy ' + policy if policy else ', no policy'}\n")
    return 0


def run_verify(args: argparse.Namespace, io: Streams) -> int:
    from shale.maintenance.verify import verify_topic

    meta = _topic(args)
    if args.scrub:
        scrubbed = _scrub(meta, args)
        emit(scrubbed, io.out, args.json)
        if not scrubbed.ok:
            return EXIT_CORRUPT
    report = verify_topic(meta)
    emit(report, io.out, args.json)
    return 0 if report.ok else EXIT_MISMATCH


def _scrub(meta: TopicMetadata, args: argparse.Namespace) -> ScrubReport:
    """The scrub, with a progress bar on a terminal."""
    from shale.cli.progress import transfer
    from shale.maintenance.scrub import scrub_topic

    with transfer("scrub") as show:
        return scrub_topic(meta, max_bytes_per_s=args.max_read_bytes_per_second, progress=show)


def run_dictionary(args: argparse.Namespace, io: Streams) -> int:
    from shale.metadata.topic import TopicMetadata

    meta = TopicMetadata.open(args.topic, args.metadata)
    if args.train:
        from shale.maintenance.dictionary import train_and_register  # (it trains with NumPy: listing needs none)

        emit(train_and_register(meta, size=args.size, level=args.level, use=args.use), io.out, args.json)
        return 0
    if args.use:
        raise InvalidInputError("--use goes with --train")
    known = meta.load_topic().dictionaries
    if args.json:
        print_json({"topic": meta.uri, "dictionaries": [d.to_json() for d in known]}, io.out)
    elif not known:
        io.out.write(f"{meta.uri}: no dictionary (train one with --train)\n")
    else:
        io.out.write("".join(f"{d.id}  {d.bytes:,} bytes  {d.object}{'  (newest)' if d is known[-1] else ''}\n"
                             for d in known))
    return 0
