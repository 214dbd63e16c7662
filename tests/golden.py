"""The golden comparison of ``shale read``: every read a test runs in this process is run
twice, record by record (``message_line`` of each decoded message, as every read of
fewer than ``BATCH_READ_RECORDS`` records runs) and in Arrow batches (the ``json_lines``
kernel, as every bigger read runs), and both must give the same bytes, the same warnings
and the same error, whatever topic the test built.

A read that follows or reads as a subscription is run once, as it is (it waits, or
commits).  ``tests/conftest.py`` applies it to every test."""

from __future__ import annotations

import argparse
import io
from collections.abc import Callable

import pytest

from shale.cli.app import Streams

#: How many reads the comparison has seen run both ways (a test asserts it is not idle).
COMPARED: list[int] = [0]


def _run(real: Callable[[argparse.Namespace, Streams], int], args: argparse.Namespace, threshold: int,
         monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, int | None, BaseException | None]:
    """One run of ``read`` with reads of ``threshold`` records or more in batches."""
    import shale.reader.batches as batches

    out, err = io.StringIO(), io.StringIO()
    with monkeypatch.context() as m:
        m.setattr(batches, "BATCH_READ_RECORDS", threshold)
        try:
            code = real(args, Streams(out, err))
        except Exception as e:
            return out.getvalue(), err.getvalue(), None, e
    return out.getvalue(), err.getvalue(), code, None


def compare_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``shale read`` run both ways and compare (see the module)."""
    import shale.cli.read as read_cli

    real = read_cli.run_read

    def run_read(args: argparse.Namespace, streams: Streams) -> int:
        if args.follow or args.subscription is not None:
            return real(args, streams)
        want = _run(real, args, 1 << 62, monkeypatch)
        got = _run(real, args, 0, monkeypatch)
        assert got[:3] == want[:3], f"shale read {args}: batches gave {got[:3]!r}, messages {want[:3]!r}"
        assert repr(got[3]) == repr(want[3]), f"shale read {args}: batches raised {got[3]!r}, messages {want[3]!r}"
        COMPARED[0] += 1
        streams.out.write(got[0])
        streams.err.write(got[1])
        if got[3] is not None:
            raise got[3]
        assert got[2] is not None
        return got[2]

    monkeypatch.setattr(read_cli, "run_read", run_read)
