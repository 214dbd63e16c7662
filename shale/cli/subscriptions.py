"""``shale subscriptions``: a topic's durable subscriptions, and changing one."""

from __future__ import annotations

import argparse

from shale.cli.app import Streams
from shale.cli.output import emit
from shale.ledger.errors import InvalidInputError

__all__ = ["run_subscriptions"]


def run_subscriptions(args: argparse.Namespace, io: Streams) -> int:
    from shale.maintenance.subscriptions import change_subscription, list_subscriptions
    from shale.metadata.handle import Topic
    from shale.metadata.subscriptions import check_name

    action = next((a for a in ("create", "delete", "reset") if getattr(args, a) is not None), None)
    if action is None:
        if args.to is not None:  # (--dry-run alone lists: a listing changes nothing)
            raise InvalidInputError("--to goes with --create or --reset")
    else:
        check_name(getattr(args, action))  # a bad name is refused before anything is read
        if action == "delete" and args.to is not None:
            raise InvalidInputError("--to goes with --create or --reset")
    topic = Topic.open(args.topic, args.metadata)
    topic.state  # noqa: B018  (a missing topic is an error, and nothing is written for it)
    if action is None:
        emit(list_subscriptions(topic), io.out, args.json)
    else:
        emit(change_subscription(topic, action, getattr(args, action), args.to, dry_run=args.dry_run), io.out,
             args.json)
    return 0
