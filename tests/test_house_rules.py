"""The house rules, checked on every run of the test command so that they cannot come back
unnoticed: no function over 60 lines unless it is a declared table, no cyclomatic grade
worse than C (radon), and every cross-reference in a docstring or comment names something
that exists.  The checks read the source (and import the shipped modules to resolve the
cross-references) in this process: a few seconds at most.

The small tests at the end feed each check a violation of its own, so a check that stopped
seeing anything would fail too."""

from __future__ import annotations

import ast
import builtins
import importlib
import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from radon.complexity import cc_rank
from radon.visitors import Class, ComplexityVisitor, Function

ROOT = Path(__file__).resolve().parent.parent
# Top-level folders that are installed as shale.<folder> (shale/<folder> links to them).
SUBPACKAGES = ("compactor", "reader", "metadata", "ledger")
# Names a cross-reference must not start with: the repository's folders, which import only
# from a checkout (the installed distribution claims ``shale`` alone).
NOT_INSTALLED = (*SUBPACKAGES, "bench", "scripts", "tests")
MAX_LINES = 60
WORST_GRADE = "C"
ROLE = re.compile(r":(?:py:)?(mod|func|class|meth|attr|data|exc|obj):`([^`]+)`")
TABLES_HOW = "declare it in pyproject.toml [tool.shale.house] tables with a reason only if it is a table"


@dataclass(frozen=True, slots=True)
class Source:
    """One shipped Python file and the dotted name its definitions are known by."""

    path: Path
    module: str
    importable: bool

    @property
    def where(self) -> str:
        return self.path.relative_to(ROOT).as_posix() if self.path.is_relative_to(ROOT) else str(self.path)


def _module_name(relative: Path) -> str:
    parts = list(relative.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["shale", *parts] if parts[0] in SUBPACKAGES else parts)


def shipped_sources(root: Path = ROOT) -> list[Source]:
    """Every Python file of the distribution, the benchmarks and the scripts, once each
    (shale/'s links to the top-level folders are not followed: those are walked as they are)."""
    sources = []
    for top in ("shale", *SUBPACKAGES, "bench"):
        for folder, dirs, files in os.walk(root / top):
            dirs[:] = sorted(d for d in dirs if not (Path(folder) / d).is_symlink() and d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    path = Path(folder) / name
                    sources.append(Source(path, _module_name(path.relative_to(root)), top != "bench"))
    sources += [Source(p, f"scripts.{p.stem}", False) for p in sorted((root / "scripts").glob("*.py"))]
    return sources


def declared_tables(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """``module:qualname`` -> reason, from ``[tool.shale.house] tables``."""
    house = tomllib.loads(pyproject.read_text())["tool"]["shale"]["house"]
    return {entry["function"]: entry["reason"] for entry in house["tables"]}


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield f"{prefix}{node.name}", node
            yield from _functions(node, f"{prefix}{node.name}.<locals>.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def long_functions(sources: list[Source], tables: dict[str, str]) -> list[str]:
    """A line per function over MAX_LINES that is not a declared table, and per stale declaration."""
    problems, seen = [], set()
    for source in sources:
        for qualname, node in _functions(ast.parse(source.path.read_text(), str(source.path))):
            name, lines = f"{source.module}:{qualname}", node.end_lineno - node.lineno + 1  # type: ignore[operator]
            if lines <= MAX_LINES:
                continue
            seen.add(name)
            if name not in tables:
                problems.append(f"{source.where}:{node.lineno}: {name} is {lines} lines (the limit is {MAX_LINES}):"
                                f" split it into well-named steps, or {TABLES_HOW}")
    problems += [f"pyproject.toml [tool.shale.house] tables: {name} is declared a table but no function of that"
                 f" name is over {MAX_LINES} lines any more: remove the declaration"
                 for name in tables if name not in seen]
    return problems


def _blocks(blocks: list[Any], prefix: str = "") -> Iterator[tuple[str, Function]]:
    for block in blocks:
        if isinstance(block, Class):
            yield from _blocks([*block.methods, *block.inner_classes], f"{prefix}{block.name}.")
        else:
            yield f"{prefix}{block.name}", block
            yield from _blocks(block.closures, f"{prefix}{block.name}.<locals>.")


def complex_functions(sources: list[Source]) -> list[str]:
    """A line per function whose cyclomatic complexity grades worse than WORST_GRADE."""
    problems = []
    for source in sources:
        visitor = ComplexityVisitor.from_code(source.path.read_text())
        for qualname, block in _blocks([*visitor.functions, *visitor.classes]):
            grade = cc_rank(block.complexity)
            if grade > WORST_GRADE:
                problems.append(f"{source.where}:{block.lineno}: {source.module}:{qualname} has cyclomatic complexity"
                                f" {block.complexity}, grade {grade} (the worst allowed is {WORST_GRADE}): split its"
                                " decisions into well-named steps, or drive them from a table")
    return problems


def _get(dotted: str) -> tuple[bool, Any]:
    """Whether ``dotted`` names a module or something reachable from one by attributes, and what."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        except Exception:  # a module that cannot be imported at all names nothing
            return False, None
        for part in parts[cut:]:
            if hasattr(obj, part):
                obj = getattr(obj, part)
            elif isinstance(obj, type) and any(part in getattr(k, "__annotations__", {}) for k in obj.__mro__):
                obj = None  # a field declared by annotation only (a dataclass field without a default)
            else:
                return False, None
        return True, obj
    return False, None


@dataclass(frozen=True, slots=True)
class ClassSpan:
    """A class's lines, its qualified name and the attributes its methods set on ``self``."""

    start: int
    end: int
    qualname: str
    instance_attributes: frozenset[str]


def _classes_around(tree: ast.AST) -> list[ClassSpan]:
    spans = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                attributes = frozenset(t.attr for t in ast.walk(child) if isinstance(t, ast.Attribute)
                                       and isinstance(t.ctx, ast.Store) and isinstance(t.value, ast.Name)
                                       and t.value.id == "self")
                spans.append(ClassSpan(child.lineno, child.end_lineno or child.lineno, f"{prefix}{child.name}",
                                       attributes))
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return spans


def resolves(role: str, target: str, module: str | None, classes: list[str], top_level: set[str]) -> bool:
    """Whether a cross-reference found in ``module`` (inside ``classes``, innermost first) names
    something, the way Sphinx looks it up: the class's and the module's namespace, then an
    absolute name; a leading dot is relative to the module's package."""
    name = re.sub(r"[\s#]", "", target.split("<")[-1].rstrip(">")).lstrip("~!").removesuffix("()")
    if module is not None and name.startswith("."):
        candidates = [f"{module.rpartition('.')[0]}{name}"]
    else:
        candidates = [f"{module}.{c}.{name}" for c in classes] + ([f"{module}.{name}"] if module else [])
        if name.split(".")[0] not in NOT_INSTALLED:
            candidates.append(name)
            if hasattr(builtins, name.split(".")[0]):
                candidates.append(f"builtins.{name}")
    if module is None and name.split(".")[0] in top_level:
        return True
    for candidate in candidates:
        found, obj = _get(candidate)
        if found and (role != "mod" or isinstance(obj, ModuleType)):
            return True
    return False


def broken_references(sources: list[Source], documents: list[Path]) -> list[str]:
    """A line per cross-reference (in the shipped code or the documents) that names nothing."""
    problems = []
    texts = [(s.where, s.path.read_text(), s.module if s.importable else None, s) for s in sources]
    texts += [(d.relative_to(ROOT).as_posix() if d.is_relative_to(ROOT) else str(d), d.read_text(), None, None)
              for d in documents]
    for where, text, module, source in texts:
        tree = ast.parse(text) if source is not None else None
        spans = _classes_around(tree) if tree is not None else []
        top_level = _top_level_names(tree) if tree is not None and module is None else set()
        if source is not None and source.path.name == "__init__.py" and module is not None:
            module_for_dots = f"{module}.__init__"  # a leading dot in a package's own file is the package
        else:
            module_for_dots = module
        for match in ROLE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            around = [span for span in reversed(spans) if span.start <= line <= span.end]
            classes = [span.qualname for span in around]
            role, target = match.groups()
            if role == "attr" and around and target.lstrip("~") in around[0].instance_attributes:
                continue
            base = module_for_dots if target.lstrip("~").startswith(".") else module
            if not resolves(role, target, base, classes, top_level):
                problems.append(f"{where}:{line}: :{role}:`{target}` names nothing that exists: name it as it is"
                                " imported now (shale.<package>.<module>.<name>, or relative to this module)")
    return problems


def _top_level_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


# -- the rules, on the tree as it is --------------------------------------------------------


def test_no_function_is_over_sixty_lines_unless_a_declared_table() -> None:
    problems = long_functions(shipped_sources(), declared_tables())
    assert not problems, "\n".join(problems)


def test_no_function_grades_worse_than_c() -> None:
    problems = complex_functions(shipped_sources())
    assert not problems, "\n".join(problems)


def test_every_cross_reference_resolves() -> None:
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    problems = broken_references(shipped_sources(), documents)
    assert not problems, "\n".join(problems)


# Run in a fresh interpreter: imports every module of the installed package (a module
# whose optional extra is missing aside) and prints what the imports changed in the
# process.  The third-party modules Shale's modules import at their top are imported
# before the first look, so that what they do on import (NumPy adds warning filters) is
# not counted as Shale's.
_IMPORT_EVERYTHING = """
import ast, importlib, importlib.util, json, logging, os, pkgutil, signal, sys, threading, warnings

def look():
    root = logging.getLogger()
    return {"os.environ": dict(os.environ), "working directory": os.getcwd(),
            "signal handlers": {signal.Signals(s).name if s in signal.Signals._value2member_map_ else str(int(s)):
                                repr(signal.getsignal(s)) for s in signal.valid_signals()
                                if s not in (signal.SIGKILL, signal.SIGSTOP)},
            "root logger": [repr(h) for h in root.handlers] + [root.level],
            "warnings filters": [repr(f) for f in warnings.filters],
            "threads": sorted(t.name for t in threading.enumerate()),
            "excepthooks": [repr(sys.excepthook), repr(threading.excepthook)]}

# (found without importing anything of Shale's: walk_packages imports each package)
home = importlib.util.find_spec("shale").submodule_search_locations[0]
files = [os.path.join(d, f) for d, _, fs in os.walk(home, followlinks=True) for f in fs if f.endswith(".py")]
for path in files:
    statements = list(ast.parse(open(path).read()).body)
    while statements:
        node = statements.pop()
        if isinstance(node, (ast.If, ast.Try)):
            statements += node.body + node.orelse + getattr(node, "finalbody", [])
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
        for dependency in names:
            if dependency.split(".")[0] != "shale":
                try:
                    importlib.import_module(dependency)
                except ImportError:
                    pass
before = look()
import shale
modules = [m.name for m in pkgutil.walk_packages(shale.__path__, "shale.") if not m.name.endswith(".__main__")]
skipped = []
for name in modules:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        if (e.name or "shale").split(".")[0] == "shale":
            raise
        skipped.append(f"{name} (needs {e.name})")
after = look()
changed = {what: [before[what], after[what]] for what in before if before[what] != after[what]}
print(json.dumps({"modules": len(modules), "skipped": skipped, "changed": changed}))
"""


def test_importing_any_module_changes_nothing_in_the_process() -> None:
    # A bare environment: this process's may hold what an import here already wrote.
    clean = {k: os.environ[k] for k in ("PATH", "PYTHONPATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    run = subprocess.run([sys.executable, "-c", _IMPORT_EVERYTHING], env=clean, cwd=ROOT, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.splitlines()[-1])
    assert seen["modules"] > 50
    changes = []
    for what, (before, after) in seen["changed"].items():
        if isinstance(before, dict):
            diff = {k: (before.get(k), after.get(k)) for k in sorted(set(before) | set(after))
                    if before.get(k) != after.get(k)}
            changes.append(f"{what}: {diff}")
        else:
            changes.append(f"{what}: {before} -> {after}")
    assert not changes, ("importing Shale's modules changed the process; an import must only define things"
                         " (set up the process in a command's main(), or where a function is called):\n"
                         + "\n".join(changes))


# -- each check sees a violation ------------------------------------------------------------


def _scratch(tmp_path: Path, module: str, text: str) -> list[Source]:
    path = tmp_path / f"{module.rpartition('.')[2]}.py"
    path.write_text(text)
    return [Source(path, module, True)]


def test_a_long_function_and_a_stale_table_are_reported(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES))
    method = body.replace("    ", "        ")
    sources = _scratch(tmp_path, "shale.scratch", f"class K:\n    def long(self):\n{method}\n\ndef table():\n{body}")
    problems = long_functions(sources, {"shale.scratch:table": "rows", "shale.scratch:gone": "rows"})
    assert [p.split(": ")[1].split()[0] for p in problems] == ["shale.scratch:K.long", "shale.scratch:gone"]


def test_a_complex_function_is_reported(tmp_path: Path) -> None:
    branches = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(21))
    sources = _scratch(tmp_path, "shale.scratch", f"def simple(x):\n    return x\n\n\ndef tangled(x):\n{branches}")
    assert [p.split(": ")[1].split()[0] for p in complex_functions(sources)] == ["shale.scratch:tangled"]


def test_a_reference_to_a_path_that_no_longer_exists_is_reported(tmp_path: Path) -> None:
    text = ('"""See :mod:`compactor.keymap` and :func:`~shale.compactor.gone`, not :class:`KeyMap`,\n'
            ':meth:`KeyMap.contains`, :mod:`shale.compactor.keymap`, :mod:`.packing` or :class:`ValueError`."""\n')
    sources = _scratch(tmp_path, "shale.compactor.keymap", text)
    problems = broken_references(sources, [])
    named = [p.split(": ")[1].split()[0] for p in problems]
    assert named == [":mod:`compactor.keymap`", ":func:`~shale.compactor.gone`"]
