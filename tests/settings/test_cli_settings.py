"""Every setting is defined once (``shale.settings``): each command's flags, their
``SHALE_*`` variables, ``--help``, the policy keys and the policy document's schema are
made from that one model, and a bad value anywhere is bad usage naming where it came
from.  In process: parsing needs no subprocess."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shale.cli.parsing import UsageError, build_compact_parser, build_parser, parse
from shale.maintenance.policies import parse_assignments
from shale.metadata.policy import PolicyDoc
from shale.settings import COMMANDS, POLICY_SETTINGS, SETTINGS, VARIABLES, Setting, VariableError, resolve, settings_for
from shale.settings.kinds import Choice, Codec, Duration, Instant, Kind, Pairs, Rate, Ratio, Size, Uri, Url, Whole

ROOT = Path(__file__).resolve().parents[2]


def _words(text: str) -> str:
    return " ".join(text.split())


def _squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _help_of(command: str) -> str:
    parser = build_compact_parser() if command == "compact" else build_parser().commands[command]
    return _words(parser.format_help())


@pytest.mark.parametrize("command", COMMANDS)
def test_each_commands_flags_variables_and_help_come_from_the_model(command: str) -> None:
    parsers = [build_parser().commands[command]] + ([build_compact_parser()] if command == "compact" else [])
    mine = {s.dest: s for s in settings_for(command)}
    for parser in parsers:
        actions = [a for a in parser._actions if a.dest != "help"]
        assert {a.dest for a in actions} == set(mine)  # every flag is a setting, every setting a flag
        shown = _words(parser.format_help())
        for a in actions:
            s = mine[a.dest]
            if s.positional:
                assert not a.option_strings and a.metavar == s.positional
            else:
                assert a.option_strings == [s.option, *s.aliases]
            # (help is wrapped, at spaces and after hyphens)
            assert _squeezed(s.help_of(command)) in _squeezed(shown)
            assert (f"[env var: {s.variable}]" in shown) == s.env
            if s.default_shown() is not None:
                assert f"(default: {s.default_shown()})" in shown
        assert "precedence:" in shown and "exit codes:" in shown


def test_the_policy_document_and_config_keys_come_from_the_model() -> None:
    assert set(POLICY_SETTINGS) == {s.name for s in SETTINGS.values() if s.policy}
    assert set(PolicyDoc.__struct_fields__) == {s.py_name for s in POLICY_SETTINGS.values()}
    config = _help_of("config")
    for s in POLICY_SETTINGS.values():
        assert s.name in config
    # --set takes each policy setting by its name, with the flag's own kind of value
    changes, _ = parse_assignments([f"{s.name}={_good(s.kind)}" for s in POLICY_SETTINGS.values()], [])
    assert set(changes) == set(PolicyDoc.__struct_fields__)
    # and a compact flag of the same name is the same setting (rollback publishes as compact does;
    # export --format iceberg brings the table the policy names up to date, as compact does)
    assert all(s.commands <= {"compact", "produce", "rollback"} or (s.name.startswith("iceberg-")
               and s.commands == {"export"}) for s in POLICY_SETTINGS.values())


def test_precedence_is_the_same_everywhere() -> None:
    """flag > the topic's policy > a variable > the default."""
    s = resolve("compact", {"parallel": 3}, {"SHALE_PARALLEL": "5", "SHALE_DELETE_RETENTION": "2h",
                                              "SHALE_MIN_COMPACTION_LAG": "1m"})
    assert (s.value("parallel"), s.source("parallel")) == (3, "flag")
    assert (s.value("delete-retention"), s.source("delete-retention")) == (7_200_000, "env")
    assert (s.value("gc-grace"), s.source("gc-grace")) == (SETTINGS["gc-grace"].default, "default")
    topic = s.with_policy({"delete_retention_ms": 0, "min_compaction_lag_ms": 5})
    assert (topic.value("delete-retention"), topic.source("delete-retention")) == (0, "policy")
    flagged = resolve("compact", {"delete-retention": 60_000}).with_policy({"delete_retention_ms": 0})
    assert (flagged.value("delete-retention"), flagged.source("delete-retention")) == (60_000, "flag")
    # a command with no policy setting says so in its help, and every help states its order
    assert "a run's flag > the topic's policy (shale config) > a SHALE_* variable > the default" in _help_of(
        "compact")
    assert "a flag > its SHALE_* variable > the default" in _help_of("read")


def _good(kind: Kind) -> str:
    if isinstance(kind, Codec):
        return "zstd:3"
    if isinstance(kind, Duration):
        return "1h"
    if isinstance(kind, Size | Rate):
        return "1GiB"
    if isinstance(kind, Ratio):
        return "0.5"
    if isinstance(kind, Choice):
        return kind.values[-1]
    if isinstance(kind, Whole):
        return str(kind.least)
    return "true"


def _bad(kind: Kind) -> str | None:
    """A value the kind refuses, if it refuses any."""
    bad: dict[type[Kind], str] = {Duration: "soon", Size: "lots", Rate: "1", Ratio: "2", Whole: "x",
                                  Choice: "bogus", Codec: "zstd:99", Uri: "s3:/bucket/t", Url: "ftp://x",
                                  Pairs: "no-equals", Instant: "soon"}
    return bad.get(type(kind))


def _typed(command: str, s: Setting, value: str) -> list[str]:
    """A command line for ``command`` giving ``s`` the text ``value``."""
    given = {"TOPIC_URI": "/t", "PREFIX_URI": "/prefix", "KEY": "KEY", "OUT": "/o.parquet"}
    if s.positional:
        given[s.positional] = value
    argv = [command, *(given[x.positional] for x in settings_for(command) if x.positional)]
    if command == "truncate" and s.group != "rule":
        argv += ["--before-ledger", "1"]
    return argv if s.positional else [*argv, s.option, value]


CASES = [(c, s) for c in COMMANDS for s in settings_for(c) if _bad(s.kind) is not None]


@pytest.mark.parametrize(("command", "setting"), CASES, ids=[f"{c}-{s.name}" for c, s in CASES])
def test_a_bad_value_of_any_setting_is_bad_usage_naming_it(command: str, setting: Setting) -> None:
    bad = _bad(setting.kind)
    assert bad is not None
    with pytest.raises(UsageError, match=re.escape(setting.option)) as info:
        parse(build_parser(), _typed(command, setting, bad), {})
    assert str(info.value).count("\n") == 0 and f"shale {command} --help" in str(info.value)
    if setting.env:
        with pytest.raises(VariableError, match=setting.variable):
            resolve(command, {}, {setting.variable: bad})


def test_every_documented_variable_is_a_setting() -> None:
    """README, docs/operations.md and the Kubernetes manifests name only variables the
    settings model has (a setting's, or one of :data:`~shale.settings.VARIABLES`; the
    tests' own SHALE_LONG_TESTS aside)."""
    process = {*VARIABLES, "SHALE_LONG_TESTS"}
    variables = {s.variable for s in SETTINGS.values()}  # (SHALE_PRINT_CONFIG: named as refused)
    texts = [ROOT / "README.md", ROOT / "docs" / "operations.md", *sorted((ROOT / "infra" / "k8s").rglob("*.yaml"))]
    for path in texts:
        for name in re.findall(r"\bSHALE_[A-Z][A-Z0-9_]*[A-Z0-9]\b", path.read_text()):
            assert name in variables | process, f"{path.name}: {name} is no setting's variable"


def test_help_texts_name_the_flags_as_they_are() -> None:
    truncate = _help_of("truncate")
    description = truncate[truncate.index("Remove"):truncate.index("positional arguments")]
    for flag in ("--before-ledger", "--older-than", "--keep-bytes"):
        assert flag in description
    gc = _help_of("gc")
    assert "older than --gc-grace" in gc and "older than --grace " not in gc
    # export's --compression and --format read variables of their own: produce's and compact's
    # --compression takes values export's does not
    export = _help_of("export")
    assert "[env var: SHALE_EXPORT_COMPRESSION]" in export and "[env var: SHALE_EXPORT_FORMAT]" in export
