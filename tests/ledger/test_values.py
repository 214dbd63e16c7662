"""``shale.ledger.values.dataclass`` makes the very class :func:`dataclasses.dataclass`
makes, only with its generated methods compiled on first use.

Two ways of checking it: classes declared twice, once with each decorator, behave alike in
everything a caller can do with them (construct with defaults, factories, ``init=False``
and ``__post_init__``; repr, equality, hashing, ordering, frozen errors, ``replace``,
``asdict``, ``fields``, pickling, ``__match_args__``, slots, signatures, subclasses); and
every class of the package made with it, imported once with it and once with the standard
decorator in its place, comes out the same to the bytecode of each method and the values
its closures hold.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import FrozenInstanceError, field
from pathlib import Path
from typing import Any, ClassVar

import pytest

from shale.ledger import values

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("__init__", "__repr__", "__eq__", "__hash__", "__lt__", "__le__", "__gt__", "__ge__",
             "__setattr__", "__delattr__")


# Module-level pairs (pickle finds classes by their qualified name).
def _frozen(deco: Callable[..., Any]) -> Any:
    @deco(frozen=True, slots=True, order=True)
    class Point:
        """A frozen, slotted, ordered value."""

        x: int
        tags: tuple[str, ...] = field(default_factory=tuple)
        label: str = field(default="p", compare=False)
        derived: int = field(default=0, init=False, repr=False)
        LIMIT: ClassVar[int] = 10

        def __post_init__(self) -> None:
            if self.x > self.LIMIT:
                raise ValueError(f"x too big: {self.x}")
            object.__setattr__(self, "derived", self.x * 2)

    return Point


def _mutable(deco: Callable[..., Any]) -> Any:
    @deco(slots=True)
    class Box:
        items: list[int] = field(default_factory=list)
        name: str = "box"
        child: Any = None

    return Box


def _plain_eq(deco: Callable[..., Any]) -> Any:
    @deco(frozen=True, slots=True, eq=False)
    class Handle:
        """Compared by identity."""

        ref: int

    return Handle


def _bare(deco: Callable[..., Any]) -> Any:
    @deco
    class Bare:
        a: int
        b: str = "b"

    return Bare


def _kw(deco: Callable[..., Any]) -> Any:
    @deco(frozen=True, kw_only=True)
    class Kw:
        """Keyword-only fields, no slots."""

        a: int
        b: float = 1.5

    return Kw


PointLazy, PointPlain = _frozen(values.dataclass), _frozen(dataclasses.dataclass)
BoxLazy, BoxPlain = _mutable(values.dataclass), _mutable(dataclasses.dataclass)
HandleLazy, HandlePlain = _plain_eq(values.dataclass), _plain_eq(dataclasses.dataclass)
BareLazy, BarePlain = _bare(values.dataclass), _bare(dataclasses.dataclass)
KwLazy, KwPlain = _kw(values.dataclass), _kw(dataclasses.dataclass)
for _name, _cls in list(globals().items()):
    if _name.endswith(("Lazy", "Plain")) and isinstance(_cls, type):
        _cls.__qualname__ = _name
PAIRS = [(PointLazy, PointPlain), (BoxLazy, BoxPlain), (HandleLazy, HandlePlain), (BareLazy, BarePlain),
         (KwLazy, KwPlain)]


def _outcome(f: Callable[[], Any]) -> tuple[str, str]:
    """What calling ``f`` gives, the class names of the pair made alike."""
    try:
        out = f()
    except Exception as e:  # the kind of error and its text are what must match
        return type(e).__name__, str(e).replace("Lazy", "").replace("Plain", "")
    return "ok", repr(out).replace("Lazy", "").replace("Plain", "")


def _alike(lazy: Callable[[], Any], plain: Callable[[], Any]) -> None:
    assert _outcome(lazy) == _outcome(plain)


def test_the_methods_are_not_compiled_until_used() -> None:
    fresh = _frozen(values.dataclass)
    assert {n for n in GENERATED if isinstance(fresh.__dict__.get(n), values._OnFirstUse)} == \
        {"__init__", "__repr__", "__eq__", "__hash__", "__lt__", "__le__", "__gt__", "__ge__", "__setattr__",
         "__delattr__"}
    fresh(1)
    assert inspect.isfunction(fresh.__dict__["__init__"])  # compiled once, then the class's own
    assert fresh.__init__.__qualname__ == "_frozen.<locals>.Point.__init__"
    assert isinstance(fresh.__dict__["__repr__"], values._OnFirstUse)


def test_a_frozen_ordered_value_behaves_as_the_standard_one() -> None:
    lz, pl = PointLazy, PointPlain
    _alike(lambda: lz(1), lambda: pl(1))
    _alike(lambda: lz(11), lambda: pl(11))  # __post_init__'s error
    _alike(lambda: lz(), lambda: pl())  # a missing argument
    _alike(lambda: lz(1, derived=3), lambda: pl(1, derived=3))  # an init=False field
    _alike(lambda: lz(1, ["a"], "q"), lambda: pl(1, ["a"], "q"))
    _alike(lambda: lz(1) == lz(1, label="other"), lambda: pl(1) == pl(1, label="other"))
    _alike(lambda: lz(1) == lz(2), lambda: pl(1) == pl(2))
    _alike(lambda: lz(1) == (1,), lambda: pl(1) == (1,))
    _alike(lambda: sorted([lz(3), lz(1), lz(2)]), lambda: sorted([pl(3), pl(1), pl(2)]))
    _alike(lambda: (lz(1) < lz(1), lz(1) <= lz(1), lz(2) > lz(1), lz(2) >= lz(3)),
           lambda: (pl(1) < pl(1), pl(1) <= pl(1), pl(2) > pl(1), pl(2) >= pl(3)))
    _alike(lambda: lz(1) < 3, lambda: pl(1) < 3)
    _alike(lambda: hash(lz(1)) == hash(lz(1, label="x")), lambda: hash(pl(1)) == hash(pl(1, label="x")))
    _alike(lambda: hash(lz(1, ["a"])), lambda: hash(pl(1, ["a"])))  # a list field: unhashable
    assert hash(lz(2)) == hash(pl(2))
    for attempt in (lambda c: setattr(c(1), "x", 2), lambda c: delattr(c(1), "x"),
                    lambda c: setattr(c(1), "other", 2), lambda c: delattr(c(1), "other")):
        _alike(lambda a=attempt: a(lz), lambda a=attempt: a(pl))  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        lz(1).x = 3
    _alike(lambda: dataclasses.replace(lz(1, ["a"]), x=4), lambda: dataclasses.replace(pl(1, ["a"]), x=4))
    _alike(lambda: dataclasses.replace(lz(1), derived=4), lambda: dataclasses.replace(pl(1), derived=4))
    _alike(lambda: dataclasses.asdict(lz(1, ["a"])), lambda: dataclasses.asdict(pl(1, ["a"])))
    _alike(lambda: dataclasses.astuple(lz(1, ["a"])), lambda: dataclasses.astuple(pl(1, ["a"])))
    assert [(f.name, f.init, f.repr, f.compare) for f in dataclasses.fields(lz)] == \
        [(f.name, f.init, f.repr, f.compare) for f in dataclasses.fields(pl)]
    assert lz.__match_args__ == pl.__match_args__ == ("x", "tags", "label")
    assert lz.__slots__ == pl.__slots__
    assert str(inspect.signature(lz)) == str(inspect.signature(pl))
    assert lz.__doc__ == pl.__doc__


@pytest.mark.parametrize(("lz", "pl"), PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_every_kind_pickles_copies_and_shows_alike(lz: Any, pl: Any) -> None:
    args: dict[str, Any] = {"a": 1} if lz in (KwLazy, BareLazy) else {"ref": 1} if lz is HandleLazy else \
        {"x": 1} if lz is PointLazy else {}
    one, two = lz(**args), pl(**args)
    for f in (lambda c: c, lambda c: pickle.loads(pickle.dumps(c)), copy.copy, copy.deepcopy, repr,
              lambda c: c == type(c)(**args), lambda c: type(c).__hash__ is None, lambda c: dataclasses.replace(c)):
        _alike(lambda f=f: f(one), lambda f=f: f(two))  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(one)) == one or lz is HandleLazy
    assert lz.__doc__.replace("Lazy", "") == pl.__doc__.replace("Plain", "")
    assert ("__slots__" in lz.__dict__) == ("__slots__" in pl.__dict__)
    assert lz.__dataclass_params__.__repr__() == pl.__dataclass_params__.__repr__()


def test_a_mutable_value_and_a_recursive_repr() -> None:
    b, p = BoxLazy([1]), BoxPlain([1])
    b.child, p.child = b, p  # repr of a cycle: "..."
    assert repr(b).replace("Lazy", "") == repr(p).replace("Plain", "")
    b.name, p.name = "n", "n"
    _alike(lambda: setattr(b, "other", 1), lambda: setattr(p, "other", 1))  # slots: no such attribute
    assert BoxLazy.__hash__ is None and BoxPlain.__hash__ is None
    assert BoxLazy() == BoxLazy() and BoxLazy() != BoxPlain()


def test_a_subclass_looks_the_methods_up_first() -> None:
    base = _frozen(values.dataclass)

    class Sub(base):  # type: ignore[misc, valid-type]
        __slots__ = ()

    s = Sub(1)  # compiled through the subclass, kept on the class that owns it
    assert "__init__" not in Sub.__dict__ and inspect.isfunction(base.__dict__["__init__"])
    assert repr(s).endswith(".<locals>.Sub(x=1, tags=(), label='p')") and s == Sub(1) and s != base(1)
    assert hash(s) == hash(base(1))
    with pytest.raises(FrozenInstanceError):
        s.x = 2

    @values.dataclass(frozen=True, slots=True)
    class Child(base):  # type: ignore[misc, valid-type]
        y: int = 5

    assert repr(Child(1)).endswith(".<locals>.Child(x=1, tags=(), label='p', y=5)")
    assert Child(1) == Child(1) and Child(1).derived == 2 and Child.__match_args__ == ("x", "tags", "label", "y")


# --------------------------------------------------- every class of the package, both ways

_DUMP = r"""
import dataclasses, importlib, json, re, sys, types
import shale.ledger.values as values
if sys.argv[1] == "plain":
    values.dataclass = dataclasses.dataclass
GENERATED = __GENERATED__

def clean(text):
    return re.sub(r" at 0x[0-9a-f]+", "", text)

def code(c):
    return {"code": c.co_code.hex(), "names": c.co_names, "vars": c.co_varnames, "free": c.co_freevars,
            "cells": c.co_cellvars, "args": [c.co_argcount, c.co_kwonlyargcount, c.co_flags], "name": c.co_qualname,
            "consts": [code(k) if isinstance(k, types.CodeType) else clean(repr(k)) for k in c.co_consts]}

def value(v, depth=0):
    if isinstance(v, type):
        return "class " + v.__module__ + "." + v.__qualname__
    if isinstance(v, types.FunctionType) and depth < 2:
        return function(v, depth + 1)
    return clean(repr(v))

def function(fn, depth=0):
    if fn is None or not isinstance(fn, types.FunctionType):
        return clean(repr(fn))
    return {"qualname": fn.__qualname__, "name": fn.__name__, "module": fn.__module__, "doc": fn.__doc__,
            "defaults": clean(repr(fn.__defaults__)), "kwdefaults": clean(repr(fn.__kwdefaults__)),
            "annotations": clean(repr(fn.__annotations__)), "code": code(fn.__code__),
            "closure": [value(c.cell_contents, depth) for c in fn.__closure__ or ()],
            "wrapped": function(getattr(fn, "__wrapped__", None), depth)}

out, deferred = {}, 0
for name in sys.argv[2:]:
    module = importlib.import_module(name)
    for obj in list(vars(module).values()):
        if not (isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == name):
            continue
        deferred += sum(isinstance(obj.__dict__.get(n), values._OnFirstUse) for n in GENERATED)
        for n in GENERATED:
            getattr(obj, n, None)  # (compiles a deferred method)
        out[name + ":" + obj.__qualname__] = {
            "doc": obj.__doc__, "params": repr(obj.__dataclass_params__), "bases": [value(b) for b in obj.__mro__],
            "slots": obj.__dict__.get("__slots__"), "match_args": obj.__dict__.get("__match_args__"),
            "dict": sorted(obj.__dict__), "fields": [
                [f.name, str(f.type), clean(repr(f.default)), value(f.default_factory), f.init, f.repr, f.hash,
                 f.compare, f.kw_only, repr(f._field_type)] for f in obj.__dataclass_fields__.values()],
            "methods": {n: function(obj.__dict__[n]) if isinstance(obj.__dict__[n], types.FunctionType)
                        else value(obj.__dict__[n]) for n in GENERATED + ("__getstate__", "__setstate__")
                        if n in obj.__dict__}}
print(json.dumps({"classes": out, "deferred": deferred}, sort_keys=True, default=lambda o: clean(repr(o))))
""".replace("__GENERATED__", repr(GENERATED))


def _modules_made_with_it() -> list[str]:
    names = []
    for top in ("shale", "ledger", "metadata", "reader", "compactor"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if top == "shale" and any(p.is_symlink() for p in path.relative_to(ROOT).parents if p != Path(".")):
                continue
            if "from shale.ledger.values import dataclass" not in path.read_text():
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            names.append(".".join(parts if parts[0] == "shale" else ["shale", *parts]))
    return names


def _dump(how: str, modules: list[str]) -> dict[str, Any]:
    res = subprocess.run([sys.executable, "-c", _DUMP, how, *modules], capture_output=True, text=True, cwd=ROOT,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def test_every_value_class_of_the_package_is_the_standard_one() -> None:
    modules = _modules_made_with_it()
    assert len(modules) > 60
    lazy, plain = _dump("lazy", modules), _dump("plain", modules)
    assert plain["deferred"] == 0 and lazy["deferred"] > 400  # what is compared was deferred, and made again
    assert len(lazy["classes"]) > 120
    assert sorted(lazy["classes"]) == sorted(plain["classes"])
    for name, made in lazy["classes"].items():
        assert made == plain["classes"][name], name


# ------------------------------------------------------ threads, and classes made meanwhile

class _MakesOthers:
    """A field default whose descriptor runs while its class is being made: it makes a class
    in another thread (with the standard decorator), one of ours and a standard one in this
    thread, as an import in the middle of a class's making could."""

    made: ClassVar[dict[str, Any]] = {}

    def __get__(self, instance: object, owner: type | None = None) -> int:
        if not self.made:
            def elsewhere() -> None:
                self.made["other thread"] = _kw(dataclasses.dataclass)

            t = threading.Thread(target=elsewhere)
            t.start()
            t.join()
            self.made["nested, ours"] = _kw(values.dataclass)
            self.made["nested, standard"] = _kw(dataclasses.dataclass)
        return 7


def test_classes_made_meanwhile_are_made_as_their_decorator_makes_them() -> None:
    @values.dataclass(slots=False)
    class Outer:
        n: int = _MakesOthers()  # type: ignore[assignment]

    made = _MakesOthers.made
    assert set(made) == {"other thread", "nested, ours", "nested, standard"}
    assert inspect.isfunction(made["other thread"].__dict__["__init__"])  # not deferred: another thread's
    assert isinstance(made["nested, ours"].__dict__["__init__"], values._OnFirstUse)
    plain = _kw(dataclasses.dataclass)
    for kw in made.values():
        k = kw(a=1)
        assert repr(k) == repr(plain(a=1)) and k == kw(a=1) and hash(k) == hash(plain(a=1))
        with pytest.raises(FrozenInstanceError):
            k.a = 2
        assert kw.__init__.__qualname__ == plain.__init__.__qualname__
        assert all(inspect.isfunction(kw.__dict__[n]) for n in ("__init__", "__repr__", "__eq__", "__hash__"))
    assert Outer().n == 7 and repr(Outer(3)).endswith("Outer(n=3)")
    assert dataclasses._create_fn is values._CREATE_FN  # type: ignore[attr-defined]  # put back
