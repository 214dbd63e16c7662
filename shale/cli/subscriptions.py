"""``shale subscriptions``: a topic's durable subscriptions, and changing them."""

from __future__ import annotations

import argparse
import sys
from typing import Final

from shale.cli.app import Streams
from shale.cli.output import emit
from shale.ledger.errors import InvalidInputError

__all__ = ["run_subscriptions"]

#: The actions and the flags each takes besides the common ones (``--json``, ``--metadata``).
_TAKES: Final = {
    None: {"describe"},
    "create": {"to", "dry_run"},
    "delete": {"dry_run", "force"},
    "reset": {"to", "shift_by", "by_duration", "execute", "force", "dry_run"},
    "all_subscriptions": {"to", "shift_by", "by_duration", "execute", "force", "dry_run"},
    "from_file": {"execute", "force", "dry_run"},
}
_FLAGS: Final = {"to": "--to", "shift_by": "--shift-by", "by_duration": "--by-duration", "execute": "--execute",
                 "force": "--force", "dry_run": "--dry-run", "describe": "--describe"}
_ACTION_FLAGS: Final = {"create": "--create", "delete": "--delete", "reset": "--reset", "all_subscriptions": "--all",
                        "from_file": "--from-file"}


def _given(args: argparse.Namespace, dest: str) -> bool:
    value = getattr(args, dest)
    return value is not None and value is not False


def _check_flags(args: argparse.Namespace, action: str | None) -> None:
    """Each flag given goes with the action given (refused before anything is read)."""
    for dest, flag in _FLAGS.items():
        if _given(args, dest) and dest not in _TAKES[action]:
            takers = [_ACTION_FLAGS[a] for a, takes in _TAKES.items() if a is not None and dest in takes]
            raise InvalidInputError(f"{flag} goes with {' or '.join(takers) if takers else 'the listing'}"
                                    if dest != "describe" else "--describe goes with the listing (no action)")
    if args.execute and args.dry_run:
        raise InvalidInputError("--execute carries a reset out and --dry-run does not: give one")
    if action in ("reset", "all_subscriptions") and args.to is None and args.shift_by is None \
            and args.by_duration is None:
        raise InvalidInputError(f"{_ACTION_FLAGS[action]} needs --to earliest|latest|current|ID|TIME, --shift-by N "
                                "or --by-duration DURATION")


def run_subscriptions(args: argparse.Namespace, io: Streams) -> int:
    from shale.metadata.handle import Topic
    from shale.metadata.subscriptions import check_name

    action = next((a for a in _ACTION_FLAGS if _given(args, a)), None)
    _check_flags(args, action)
    if action in ("create", "delete", "reset"):
        check_name(getattr(args, action))  # a bad name is refused before anything is read
    plan_text = _read_plan(args.from_file) if action == "from_file" else None
    meta = Topic.open(args.topic, args.metadata)
    meta.state  # noqa: B018  (a missing topic is an error, and nothing is written for it)
    if action is None:
        from shale.maintenance.subscriptions import list_subscriptions

        emit(list_subscriptions(meta, describe=args.describe), io.out, args.json)
    elif action in ("create", "delete"):
        from shale.maintenance.resets import change_subscription

        emit(change_subscription(meta, action, getattr(args, action), args.to, dry_run=args.dry_run,
                                 force=args.force), io.out, args.json)
    else:
        from shale.maintenance.resets import Target, plan_file, reset_subscriptions

        target = Target(args.to, args.shift_by, args.by_duration)
        targets = (target if action == "all_subscriptions" else [(args.reset, target)] if action == "reset"
                   else plan_file(plan_text or "", "--from-file " + args.from_file))
        emit(reset_subscriptions(meta, targets, execute=args.execute, force=args.force, single=action == "reset"),
             io.out, args.json)
    return 0


def _read_plan(path: str) -> str:
    """The text of ``--from-file``'s CSV (``-``: standard input)."""
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise InvalidInputError(f"--from-file {path}: no such file") from None
    except UnicodeDecodeError:
        raise InvalidInputError(f"--from-file {path}: not UTF-8 text") from None
    except IsADirectoryError:
        raise InvalidInputError(f"--from-file {path}: a folder, not a CSV file") from None
