"""Shale's value classes: :func:`dataclasses.dataclass`, with the methods it writes made on
first use.

Python 3.11 and 3.12 write each method of a dataclass (``__init__``, ``__repr__``,
``__eq__``, ``__hash__``, the order methods, and ``__setattr__`` and ``__delattr__`` for a
frozen class) as source text and compile it while the class is made: for a short command,
which makes a hundred classes and calls few of their methods, that compiling was more than
a quarter of the whole process.  :func:`dataclass` lets :func:`dataclasses.dataclass` make
the class as it always does (its fields, slots, pickling, ``__match_args__``, its checks
and errors) and only holds back the compiling: each method is at first a small stand-in
that, the first time the method is looked up, compiles it from the same text with the same
names and puts the result where the stand-in was.  From then on the class is the one
:func:`dataclasses.dataclass` would have made.

Where the standard library writes its methods otherwise (Python 3.13 compiles a class's
methods in one go), :func:`dataclass` is :func:`dataclasses.dataclass` itself.
"""

from __future__ import annotations

import _thread
import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform, overload

__all__ = ["dataclass"]

_T = TypeVar("_T")

# dataclasses looks both names up in its own module at the time it makes a class, so they
# are swapped for the time one class is made, and only that thread's calls are deferred: a
# class another thread makes meanwhile is made as usual.  (Reentrant: making a class can run
# code, a default's descriptor, that makes another.)
_SWAP = _thread.RLock()  # (not threading: a command that starts no thread need not import it)
_owner = 0  # the thread whose classes are being made
_depth = 0
_CREATE_FN: Callable[..., Any] | None = getattr(dataclasses, "_create_fn", None)
_RECURSIVE_REPR: Callable[..., Any] | None = getattr(dataclasses, "_recursive_repr", None)


class _OnFirstUse:
    """A method of a dataclass not compiled yet: the arguments dataclasses passed to have it
    compiled, and what to do with the function once it is."""

    __slots__ = ("home", "kwargs", "name", "parts", "qualname", "recursive")

    def __init__(self, name: str, parts: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.name = name
        self.parts = parts
        self.kwargs = kwargs
        self.recursive = False  # ``__repr__``: wrapped as dataclasses wraps it
        self.home: type | None = None  # the class made, once it is
        self.qualname = name

    @property
    def __name__(self) -> str:  # the order methods are set by their name
        return self.name

    def compile(self) -> Any:
        """The function dataclasses would have made, named as it names it."""
        assert _CREATE_FN is not None and _RECURSIVE_REPR is not None  # (only made when both exist)
        fn = _CREATE_FN(self.name, *self.parts, **self.kwargs)
        if self.recursive:
            fn = _RECURSIVE_REPR(fn)
        if self.home is not None:
            fn.__qualname__ = self.qualname
        return fn

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if self.home is None and owner is not None:
            # (a class dataclasses made in this thread while one of ours was being made)
            self.home = next((c for c in owner.__mro__ if c.__dict__.get(self.name) is self), None)
            if self.home is not None:
                self.qualname = f"{self.home.__qualname__}.{self.name}"
        fn = self.compile()
        home = self.home
        if home is not None and home.__dict__.get(self.name) is self:
            setattr(home, self.name, fn)
        return fn.__get__(instance, type(instance) if owner is None else owner)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # only if something calls the stand-in without looking it up on its class
        return self.compile()(*args, **kwargs)


def _later(name: str, *parts: Any, **kwargs: Any) -> Any:
    if _thread.get_ident() != _owner:
        assert _CREATE_FN is not None
        return _CREATE_FN(name, *parts, **kwargs)
    return _OnFirstUse(name, parts, kwargs)


def _wrap_later(fn: Any) -> Any:
    if isinstance(fn, _OnFirstUse):
        fn.recursive = True
        return fn
    assert _RECURSIVE_REPR is not None
    return _RECURSIVE_REPR(fn)


def _make(cls: type[_T], options: dict[str, Any]) -> type[_T]:
    if _CREATE_FN is None or _RECURSIVE_REPR is None:
        return dataclasses.dataclass(cls, **options)
    global _owner, _depth
    module: Any = dataclasses
    with _SWAP:
        if not _depth:
            _owner = _thread.get_ident()
            module._create_fn, module._recursive_repr = _later, _wrap_later
        _depth += 1
        try:
            made = dataclasses.dataclass(cls, **options)
        finally:
            _depth -= 1
            if not _depth:
                module._create_fn, module._recursive_repr = _CREATE_FN, _RECURSIVE_REPR
                _owner = 0
    for name, attribute in list(made.__dict__.items()):
        if isinstance(attribute, _OnFirstUse):
            # named after the class as it is now, as dataclasses names what it compiles
            attribute.home, attribute.qualname = made, f"{made.__qualname__}.{name}"
    return made


@overload
def dataclass(cls: type[_T], /) -> type[_T]: ...


@overload
def dataclass(*, init: bool = True, repr: bool = True, eq: bool = True, order: bool = False,
              unsafe_hash: bool = False, frozen: bool = False, match_args: bool = True, kw_only: bool = False,
              slots: bool = False, weakref_slot: bool = False) -> Callable[[type[_T]], type[_T]]: ...


@dataclass_transform(field_specifiers=(dataclasses.field, dataclasses.Field))
def dataclass(cls: type[_T] | None = None, /, **options: Any) -> Any:
    """:func:`dataclasses.dataclass`, taking the same options and making the same class,
    whose generated methods are compiled the first time each is looked up."""
    if cls is None:
        return lambda c: _make(c, options)
    return _make(cls, options)
