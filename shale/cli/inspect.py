"""``shale status`` and ``shale topics``: what a topic, or every topic under a prefix,
holds and how compacted it is."""

from __future__ import annotations

import argparse

from shale.cli.app import Streams
from shale.cli.output import print_json
from shale.ledger.errors import InvalidInputError

__all__ = ["run_status", "run_topics"]


def run_status(args: argparse.Namespace, io: Streams) -> int:
    from shale.maintenance.status import status_text, topic_status

    doc = topic_status(args.topic, args.metadata)
    for d in doc["damaged"]:
        io.err.write(f"shale: warning: {doc['topic']}: damaged object {d['object']}: {d['error']}\n")
    if args.json:
        print_json(doc, io.out)
    else:
        io.out.write(status_text(doc) + "\n")
    return 0


def run_topics(args: argparse.Namespace, io: Streams) -> int:
    from shale.maintenance.listing import list_topics, rows_text

    rows = list_topics(args.prefix)
    if not rows:
        raise InvalidInputError(f"no topics under {args.prefix} (a topic is a folder holding _meta/topic.json)")
    if args.json:
        for r in rows:
            print_json(r.to_json(), io.out)
    else:
        io.out.write(rows_text(rows) + "\n")
    return 0
