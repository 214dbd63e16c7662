"""A progress display for a terminal: a bar of topics done, and one line per topic being
compacted with its phase and time.  Used only when standard error is a terminal and logs
are text; pipes, files and CronJob logs never see it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

__all__ = ["TopicProgress"]


class _Count(ProgressColumn):
    """``done/total`` on the topics line; nothing on a topic's own line."""

    def render(self, task: Task) -> Text:
        return Text(f"{int(task.completed)}/{int(task.total)}" if task.total else "", style="green")


class TopicProgress:
    """``with TopicProgress(stream, total) as p: show = p.start(uri); show("pass one"); p.finish(uri)``."""

    def __init__(self, stream: TextIO, total: int) -> None:
        self.console = Console(file=stream, stderr=True)
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                  _Count(), TimeElapsedColumn(), console=self.console, transient=True,
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

    def print(self, line: str) -> None:
        """Print a line above the display (for output bound for the same terminal)."""
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)
