"""Every environment variable Shale reads is in the settings model: a setting's
``SHALE_*`` variable, or one of :data:`shale.settings.VARIABLES` (the stores', the
process's).  The stores' options and ``--print-config`` are made from that table, so a
variable added to it reaches both, and one read anywhere else fails here."""

from __future__ import annotations

import ast
import dataclasses

import pytest

from shale.compactor.effective import effective_config
from shale.settings import SETTINGS, VARIABLES, Variable, resolve
from shale.settings import model as settings_model
from shale.storage import S3Options, StorageOptions
from tests.test_house_rules import shipped_sources

#: The modules that read variables by the names the model gives them.
_MODEL_READERS = {"shale.settings.resolve", "shale.storage.options", "shale.compactor.effective"}
_ENV_NAMES = {"environ", "env", "environment"}


def _is_environ(node: ast.expr) -> bool:
    """``os.environ``, or a mapping named like the environment (``environ``, ``env``)."""
    if isinstance(node, ast.Attribute):
        return node.attr == "environ"
    return isinstance(node, ast.Name) and node.id in _ENV_NAMES


def environment_reads(tree: ast.AST) -> list[tuple[int, str | None]]:
    """Every read of an environment variable in ``tree``, with its name (None: not a
    literal): ``os.environ.get(X)``, ``os.environ[X]``, ``X in os.environ``,
    ``os.environ.setdefault(X, ...)`` and ``os.getenv(X)``."""
    found: list[tuple[int, ast.expr]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            f = node.func
            if (f.attr in ("get", "setdefault", "pop") and _is_environ(f.value)) or (
                    f.attr == "getenv" and isinstance(f.value, ast.Name) and f.value.id == "os"):
                found.append((node.lineno, node.args[0]))
        elif isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
            found.append((node.lineno, node.slice))
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.In | ast.NotIn) \
                and _is_environ(node.comparators[0]):
            found.append((node.lineno, node.left))
    return [(line, arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None)
            for line, arg in found]


def test_every_variable_the_code_reads_is_in_the_model() -> None:
    known = set(VARIABLES) | {s.variable for s in SETTINGS.values()}
    problems, seen = [], set()
    for source in shipped_sources():
        if not source.importable:
            continue
        for line, name in environment_reads(ast.parse(source.path.read_text())):
            if name is None:
                if source.module not in _MODEL_READERS:
                    problems.append(f"{source.where}:{line}: a variable read by a name that is no literal, outside "
                                    "the model's readers")
            elif name not in known:
                problems.append(f"{source.where}:{line}: {name} is read but is in no table of shale.settings.model")
            else:
                seen.add(name)
    assert not problems, "\n".join(problems)
    assert {"SHALE_DEBUG", "SHALE_KERNELS", "PYSPARK_PYTHON"} <= seen  # (the walk sees reads)


def test_the_walk_sees_every_way_of_reading_a_variable() -> None:
    code = ("import os\nos.environ.get('A')\nos.environ['B']\n'C' in os.environ\nos.getenv('D')\n"
            "os.environ.setdefault('E', '1')\nenv.get(name)\n")
    assert environment_reads(ast.parse(code)) == [(2, "A"), (3, "B"), (4, "C"), (5, "D"), (6, "E"), (7, None)]


def _sample(v: Variable) -> str:
    return {"s3.addressing_style": "path", "s3.connect_timeout": "2.5", "s3.read_timeout": "7",
            "retry.attempts": "3"}.get(v.target, f"value-of-{v.name.lower()}")


@pytest.mark.parametrize("variable", [v for v in VARIABLES.values() if v.target], ids=lambda v: v.name)
def test_each_storage_variable_sets_its_field(variable: Variable) -> None:
    options = StorageOptions.from_environment({variable.name: _sample(variable)})
    group, _, name = variable.target.partition(".")
    value = getattr(options.s3 if group == "s3" else options.retry, name)
    assert value == variable.kind.parse(_sample(variable))
    if group == "s3":
        assert options.s3.named(name) == variable.name


def test_the_stores_options_are_made_from_the_models_table(monkeypatch: pytest.MonkeyPatch) -> None:
    added = Variable("SHALE_TEST_REGION", "a region", "s3.region")
    monkeypatch.setattr(settings_model, "VARIABLES", {**VARIABLES, added.name: added})
    monkeypatch.setattr("shale.storage.options.VARIABLES", settings_model.VARIABLES)
    s3 = S3Options.from_environment({"SHALE_TEST_REGION": "mars-1"})
    assert s3.region == "mars-1" and s3.named("region") == "SHALE_TEST_REGION"
    # a bad value is refused at the first request, naming the variable as the model describes it
    bad = StorageOptions.from_environment({"SHALE_S3_ATTEMPTS": "0"})
    assert bad.s3.problems == (f"SHALE_S3_ATTEMPTS '0': {VARIABLES['SHALE_S3_ATTEMPTS'].expected}",)


def test_print_config_shows_every_variable_of_the_model_that_is_set() -> None:
    environ = {v.name: _sample(v) for v in VARIABLES.values()}
    environ["AWS_SECRET_ACCESS_KEY"] = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    doc = effective_config(resolve("compact", {"topics": ["/t"]}), environ)
    assert set(doc["environment"]) == set(VARIABLES)
    assert doc["environment"]["AWS_CA_BUNDLE"] == environ["AWS_CA_BUNDLE"]
    assert "EXAMPLEKEY" not in doc["environment"]["AWS_SECRET_ACCESS_KEY"]


def test_every_variable_says_what_it_does() -> None:
    for v in VARIABLES.values():
        assert v.help and v.name == v.name.upper(), v
        if v.target:
            group, _, name = v.target.partition(".")
            owner = S3Options if group == "s3" else type(StorageOptions().retry)
            assert name in {f.name for f in dataclasses.fields(owner)}, v
            assert v.expected or v.kind.parse("x") == "x", v  # a typed one says how a bad value is described
