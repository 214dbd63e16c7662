"""Each command's ``--help`` lists the exit codes that command can end with, and only those:
``produce`` never verifies nor reads past retention, ``read`` never verifies; the codes
only one command uses (5, 6) are listed by it alone."""

from __future__ import annotations

import re

import pytest

from shale.cli.commands import COMMAND_TABLE
from tests.conftest import run_cli_here

#: What each command can exit with (130: an interrupt, for the commands that run long).
OWN = {
    "produce": {0, 1, 2, 3, 4, 130},
    "read": {0, 1, 2, 3, 4, 6, 130},
    "export": {0, 1, 2, 4, 6, 130},
    "status": {0, 1, 2, 4},
    "get": {0, 2, 4, 5},
    "verify": {0, 2, 4, 5},
}


def listed(command: str) -> set[int]:
    r = run_cli_here(command, "--help")
    assert r.returncode == 0, r.stderr
    part = r.stdout[r.stdout.index("exit codes:\n"):].split("\n\n")[0]
    return {int(code) for code in re.findall(r"^\s*(\d+)  ", part, re.M)}


@pytest.mark.parametrize("command", sorted(OWN))
def test_help_lists_the_commands_own_exit_codes(command: str) -> None:
    assert listed(command) == OWN[command]


def test_the_codes_of_one_command_are_listed_by_it_alone() -> None:
    for command in COMMAND_TABLE:
        codes = listed(command)
        if command not in ("get", "verify"):
            assert 5 not in codes, command
        if command not in ("read", "export"):
            assert 6 not in codes, command
