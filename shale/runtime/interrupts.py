"""What Ctrl-C (SIGINT) does to a command.

* The first interrupt stops the command within moments: the main thread gets a
  ``KeyboardInterrupt`` at once, and every other thread of the process — pass two's reads
  and writes, the topics of ``compact --parallel``, pass-two worker processes (they are
  sent the signal too) — raises one at its next throttle call, or from a throttled wait
  at once (:mod:`shale.runtime.throttle`).  What the run wrote is removed on the way
  out, as for any failure, and the command exits 130 with one line.
* A second interrupt ends the process at once, without cleaning up: garbage collection
  removes what is left once the orphan grace has passed.
* Work that must not be cut in the middle (appending a record, a publish) runs
  *deferred* (:func:`deferred`, :func:`deferring`): an interrupt then waits for the next
  point where stopping loses nothing (:func:`interruptible`, :func:`check`), except while
  the command waits for input, which it stops at once.
* Once the command's outcome is decided and printed (:func:`outcome_decided`), an
  interrupt changes nothing: a success stays one.

The handler touches nothing but this module's flags (plain assignments, safe whatever
the main thread was doing); waits elsewhere look at them.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Final, TypeVar

__all__ = [
    "EXIT_INTERRUPTED",
    "check",
    "deferred",
    "deferring",
    "handled",
    "interrupted",
    "interruptible",
    "outcome_decided",
    "running_command",
]

#: The exit code of an interrupted command (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED: Final = 130

T = TypeVar("T")


class _State:
    """The process's interrupt state; the handler only assigns its fields."""

    __slots__ = ("count", "decided", "deferring", "installed", "interrupted", "pending", "pid", "prog", "waiting")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.pid = os.getpid()
        self.prog = "shale"
        self.installed = False
        self.interrupted = False  # an interrupt arrived: every throttle raises
        self.count = 0
        self.deferring = False  # an interrupt waits for a point where stopping loses nothing ...
        self.waiting = False  # ... unless the command is waiting for input
        self.pending = False  # an interrupt is waiting
        self.decided = False  # the outcome is printed: interrupts change nothing


_STATE: Final = _State()


def interrupted() -> bool:
    """Whether this process was interrupted: long work stops at its next check."""
    return _STATE.interrupted


def _handler(signum: int, frame: FrameType | None) -> None:
    s = _STATE
    if os.getpid() != s.pid:
        # a pass-two worker forked from the command: its throttles stop its copy, which
        # its parent, interrupted too, waits for before it removes the run's output
        s.interrupted = True
        return
    if s.decided:
        return
    s.count += 1
    if s.count > 1:
        os.write(2, f"{s.prog}: interrupted again: stopped at once, without cleaning up (garbage collection "
                 "removes what was left once the orphan grace has passed)\n".encode())
        os._exit(EXIT_INTERRUPTED)
    s.interrupted = True
    _forward_to_workers()
    if s.deferring and not s.waiting:
        s.pending = True
        return
    raise KeyboardInterrupt


def _forward_to_workers() -> None:
    """Pass the interrupt on to pass-two worker processes (Ctrl-C on a terminal reaches
    them anyway; ``kill -INT`` of the command alone would not)."""
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return
    try:
        for child in mp.active_children():
            if child.pid is not None:
                os.kill(child.pid, signal.SIGINT)
    except Exception:  # best effort: a child that is gone needs nothing
        pass


@contextmanager
def handled(prog: str, *, owner: bool) -> Iterator[None]:
    """A command's interrupts handled as this module says, for the duration.  ``owner``:
    the command is the process's own (a console script), which then ignores interrupts
    once it is done, so that nothing after its outcome can change its exit status;
    otherwise the previous handler comes back.  Off the main thread nothing changes."""
    if threading.current_thread() is not threading.main_thread() or _STATE.installed:
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    _STATE.reset()
    _STATE.prog, _STATE.installed = prog, True
    signal.signal(signal.SIGINT, _handler)
    try:
        yield
    finally:
        if owner:
            _STATE.decided = True
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        else:
            signal.signal(signal.SIGINT, previous)
            _STATE.reset()


def running_command() -> bool:
    """Whether a command handles this process's interrupts now (:func:`handled`)."""
    return _STATE.installed


def outcome_decided() -> None:
    """The command's outcome is decided (and being printed): later interrupts are ignored."""
    if _STATE.installed:
        _STATE.decided = True


def deferred(command: Callable[..., T]) -> Callable[..., T]:
    """``command`` run deferred: an interrupt waits for :func:`interruptible` or
    :func:`check` (where stopping loses nothing) to raise it."""
    @functools.wraps(command)
    def run(*args: object, **kwargs: object) -> T:
        s = _STATE
        if not s.installed:
            return command(*args, **kwargs)
        s.deferring = True
        try:
            return command(*args, **kwargs)
        finally:
            s.deferring = s.waiting = False
    return run


@contextmanager
def deferring() -> Iterator[None]:
    """Within the block, an interrupt of the main thread waits until the block is done
    (:func:`check` raises it then): for work that must never be cut in the middle, such
    as a publish whose outcome must be known.  Other threads are never interrupted but
    through their throttles, so for them nothing changes."""
    s = _STATE
    if not s.installed or threading.current_thread() is not threading.main_thread():
        yield
        return
    was = s.deferring
    s.deferring = True
    try:
        yield
    finally:
        s.deferring = was


def check(detail: str = "") -> None:
    """Raise the interrupt that is waiting, if any (call where stopping loses nothing);
    ``detail`` says what was done before it."""
    s = _STATE
    if s.pending and not s.decided:
        s.pending = False
        raise KeyboardInterrupt(detail) if detail else KeyboardInterrupt


def interruptible(items: Iterable[T]) -> Iterator[T]:
    """``items`` for a deferred command: an interrupt stops the wait for the next item at
    once (reading input may wait for ever), and one that came while the caller handled
    the item before is raised here, before the next is taken."""
    s = _STATE
    it = iter(items)
    end = object()
    try:
        while True:
            s.waiting = True
            check()
            item = next(it, end)
            s.waiting = False
            if item is end:
                return
            yield item  # type: ignore[misc]  # (not end: an item)
    finally:
        s.waiting = False
