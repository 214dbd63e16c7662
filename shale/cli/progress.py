"""What every command shows while it works, in one place and one style (rich): on standard
error, only when that is a terminal; pipes, files and CronJob logs never see it.

* :func:`counting` — records (or rows) and bytes so far, with the rate: ``shale produce``,
  ``shale export``;
* :func:`transfer` — bytes of a known total, with the speed and the time left: ``shale
  verify --scrub``;
* :func:`waiting` — a spinner while something starts: the Spark application of ``compact
  --engine spark``;
* :class:`TopicProgress` — a bar of topics done, and one line per topic being compacted
  with its phase and time: ``compact``.

rich is imported only when a display is drawn.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

__all__ = ["Counter", "TopicProgress", "counting", "on_terminal", "transfer", "waiting"]


def on_terminal(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (standard error by default) is a terminal, where displays go."""
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream
        return False


def _console(stream: TextIO) -> Console:
    from rich.console import Console

    return Console(file=stream, stderr=True)


class Counter:
    """Counts records and bytes; draws them, with the rate, when it has a display."""

    def __init__(self, progress: Progress | None = None, task: TaskID | None = None) -> None:
        self._progress, self._task = progress, task
        self.records = self.bytes = 0
        self._start = time.monotonic()

    def add(self, records: int, nbytes: int) -> None:
        """Count ``records`` more, of ``nbytes``."""
        self.records += records
        self.bytes += nbytes
        if self._progress is not None and self._task is not None:
            rate = self.records / max(time.monotonic() - self._start, 1e-9)
            self._progress.update(self._task, completed=self.records, mb=self.bytes / 1e6, rate=rate)

    def set(self, records: int, nbytes: int) -> None:
        """The counts so far are ``records`` and ``nbytes``."""
        self.add(records - self.records, nbytes - self.bytes)


@contextmanager
def counting(what: str, *, unit: str = "records", stream: TextIO | None = None) -> Iterator[Counter]:
    """``with counting("produce") as c: ... c.add(records, nbytes)``: ``what: N records,
    X MB, R records/s`` on the terminal, redrawn as counts come (nothing elsewhere)."""
    stream = sys.stderr if stream is None else stream
    if not on_terminal(stream):
        yield Counter()
        return
    from rich.progress import Progress, TextColumn

    columns = (TextColumn(f"{what}: {{task.completed:,.0f}} {unit}, {{task.fields[mb]:,.1f}} MB, "
                          f"{{task.fields[rate]:,.0f}} {unit}/s"),)
    with Progress(*columns, console=_console(stream), transient=True, redirect_stdout=False,
                  redirect_stderr=False, refresh_per_second=10) as progress:
        yield Counter(progress, progress.add_task(what, total=None, mb=0.0, rate=0.0))


@contextmanager
def transfer(what: str, stream: TextIO | None = None) -> Iterator[Callable[[int, int], None] | None]:
    """``with transfer("scrub") as show: ... show(done, total)``: a bar of bytes with the
    speed and the time left on the terminal (``show`` is None elsewhere)."""
    stream = sys.stderr if stream is None else stream
    if not on_terminal(stream):
        yield None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    with Progress(what, BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                  console=_console(stream), transient=True) as bar:
        task = bar.add_task(what, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


class _Spinner:
    def __init__(self, status: Any) -> None:
        self._status: Any = status

    def stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None


def waiting(text: str, stream: TextIO | None = None) -> _Spinner:
    """A spinner with ``text`` on the terminal until ``stop()`` (nothing elsewhere)."""
    stream = sys.stderr if stream is None else stream
    if not on_terminal(stream):
        return _Spinner(None)
    status = _console(stream).status(text)
    status.start()
    return _Spinner(status)


class TopicProgress:
    """``with TopicProgress(stream, total) as p: show = p.start(uri); show("pass one"); p.finish(uri)``."""

    def __init__(self, stream: TextIO, total: int) -> None:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = _console(stream)
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                  _count_column(), TimeElapsedColumn(), console=self.console, transient=True,
                                  redirect_stdout=False, redirect_stderr=False)
        self._overall = self._progress.add_task("topics", total=total)
        self._tasks: dict[str, TaskID] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> TopicProgress:
        self._progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._progress.stop()

    def start(self, uri: str) -> Callable[[str], None]:
        """Add a line for ``uri``; the returned function shows its current phase."""
        with self._lock:
            task = self._progress.add_task(f"{uri}: starting", total=None)
            self._tasks[uri] = task

        def show(phase: str) -> None:
            self._progress.update(task, description=f"{uri}: {phase}")
        return show

    def finish(self, uri: str) -> None:
        """Remove ``uri``'s line and count it done."""
        with self._lock:
            task = self._tasks.pop(uri, None)
        if task is not None:
            self._progress.remove_task(task)
        self._progress.advance(self._overall)

    @staticmethod
    def on_terminal(stream: TextIO) -> bool:
        """Whether ``stream`` is a terminal (where :meth:`print` puts lines above the display)."""
        return on_terminal(stream)

    def print(self, line: str) -> None:
        """Print a line above the display (for output bound for the same terminal)."""
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)


def _count_column() -> Any:
    """``done/total`` on the topics line; nothing on a topic's own line."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class Count(ProgressColumn):
        def render(self, task: Any) -> Text:
            return Text(f"{int(task.completed)}/{int(task.total)}" if task.total else "", style="green")

    return Count()
