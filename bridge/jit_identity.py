"""What identifies a JIT function's code, without parsing it: the kernel part of a lowering key.

Triton's ``JITFunction.cache_key`` parses the function's source and walks its syntax tree to
find what it depends on (0.5 to 1 ms per kernel in every process). :func:`identity` is computed
from the same inputs without parsing, and covers a superset of them, so that whatever changes
Triton's key changes this one:

- the source Triton compiles (``src``, which may have been replaced) and its first line;
- the decorator's settings, which Triton leaves out of ``cache_key`` but which change the
  compiled code (``noinline``, ``debug``, ``do_not_specialize``, ``do_not_specialize_on_alignment``);
- every name the source spells (a regular expression over the text: a superset of the names
  its syntax tree reads, including those in strings and comments), looked up as Triton looks
  them up, in the closure and in the module's globals; each value found is described:
  a JIT function by its own identity (recursively; a cycle by a marker), a ``constexpr`` by
  its ``repr`` (as Triton's key holds it), a Triton aggregate by its annotations and hashed
  attributes, plain numbers and strings by their ``repr``, and any other object by its type
  and ``repr`` (unless that shows an address) and, for every name of the source that it has as
  an attribute, that attribute's description (the attribute chains Triton resolves,
  ``module.kernel`` or ``namespace.constant``; found without calling properties). Triton's
  own language modules are described by name: their contents are Triton's files, which the
  lowering key covers.

A value whose description is not the same in every process (an object whose ``repr`` holds an
address) gives a key that never matches: a lowering done again, never a stale one. An object
whose ``repr`` fails makes :func:`identity` raise ``ValueError``: the call is not stored.
"""

from __future__ import annotations

import hashlib
import re
import types
import weakref
from collections.abc import Callable
from typing import Any

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: modules whose attributes Triton does not follow (its language, and what it treats as such)
_OPAQUE_MODULES = ("triton", "math", "copy", "builtins")
#: the decorator settings that change what is compiled but not ``cache_key``
_SETTINGS = ("noinline", "debug", "do_not_specialize", "do_not_specialize_on_alignment")
_PLAIN = (int, float, str, bytes, bool, type(None), complex)


def is_jit(value: Any) -> bool:
    """Whether ``value`` is a Triton JIT function (a ``JITCallable``: source, globals, a key)."""
    from triton.runtime import jit

    return isinstance(value, getattr(jit, "JITCallable", jit.JITFunction))


def _settings(fn: Any) -> list[Any]:
    """The decorator settings of ``fn`` (:data:`_SETTINGS`), as plain values."""
    return [_plain(getattr(fn, s, None)) for s in _SETTINGS]


def _mark(fn: Any) -> tuple[Any, ...]:
    """The source and decorator settings of ``fn`` as they are now (lists and sets copied):
    what the memo of its identity is valid for."""
    mark = [_src(fn)]
    for s in _SETTINGS:
        value: Any = getattr(fn, s, None)
        kind = type(value)
        mark.append(tuple(value) if kind is list else frozenset(value) if kind is set else value)
    return tuple(mark)


def _src(fn: Any) -> Any:
    try:
        return fn.src
    except AttributeError:
        return getattr(fn, "_src", None)


def identity(fn: Any) -> str:
    """The identity of the JIT function ``fn`` (see the module docstring): a sha256 digest.

    Memoized per function object for the process while its source and settings stay the
    same, as Triton memoizes ``cache_key`` on the function (a new module, or a source
    replaced, is identified anew)."""
    mark = _mark(fn)
    known = _memo.get(id(fn))
    if known is not None and known[0]() is fn and known[1] == mark:
        return known[2]
    doc = _Describer().jit(fn)
    found = hashlib.sha256(repr(doc).encode()).hexdigest()  # (plain lists and strings)
    try:
        _memo[id(fn)] = (weakref.ref(fn), mark, found)
    except TypeError:  # (an object that cannot be referred to weakly: not memoized)
        pass
    return found


#: identities by the id of their function: (a weak reference to it, its source and settings
#: then, the identity)
_memo: dict[int, tuple[Callable[[], Any], tuple[Any, ...], str]] = {}


class _Describer:
    def __init__(self) -> None:
        self.active: set[int] = set()  # JIT functions being described (a cycle's marker)
        self.seen: dict[int, Any] = {}  # objects described already, by id

    def jit(self, fn: Any) -> Any:
        if id(fn) in self.active:
            return ["cycle", _name(fn)]
        self.active.add(id(fn))
        try:
            src = _src(fn)
            names = sorted(set(_NAME.findall(src)))
            inner = getattr(fn, "fn", None)
            closure = _closure(inner)
            glob = getattr(fn, "__globals__", None) or getattr(inner, "__globals__", {})
            found = []
            for name in names:
                for scope, where in ((closure, "c"), (glob, "g")):
                    if name in scope:
                        found.append([where, name, self.value(scope[name], names)])
            return [
                "jit",
                _name(fn),
                src,
                getattr(fn, "starting_line_number", None),
                _settings(fn),
                found,
            ]
        finally:
            self.active.discard(id(fn))

    def value(self, value: Any, names: list[str]) -> Any:
        if isinstance(value, _PLAIN):
            return [type(value).__name__, repr(value)]
        if is_jit(value):
            return self.jit(value)
        known = self.seen.get(id(value))
        if known is not None:
            return ["seen", known]
        kind = type(value)
        if kind.__name__ == "constexpr":
            described: Any = ["constexpr", repr(value)]
        elif isinstance(value, types.ModuleType):
            described = self._module(value, names)
        elif isinstance(value, (tuple, list)):
            self.seen[id(value)] = f"{kind.__name__}@{len(self.seen)}"
            described = [kind.__name__, [self.value(v, names) for v in value]]
        elif getattr(value, "__triton_aggregate__", False):
            self.seen[id(value)] = f"aggregate@{len(self.seen)}"
            attrs = getattr(value, "hash_attrs", ())
            described = [
                "aggregate",
                _name(value),
                str(getattr(value, "__annotations__", None)),
                [self.value(a, names) for a in attrs],
                self._attributes(value, names),
            ]
        else:
            self.seen[id(value)] = f"{_name(kind)}@{len(self.seen)}"
            try:
                shown = repr(value)
            except Exception as e:  # (the call is then not stored: lowered as before)
                raise ValueError(f"{_name(kind)} {_name(value)} has no repr: {e!r:.80}") from e
            described = [
                "object",
                _name(kind),
                _name(value),
                None if " at 0x" in shown else shown[:200],
                self._attributes(value, names),
            ]
        return described

    def _module(self, module: types.ModuleType, names: list[str]) -> Any:
        name = module.__name__
        if name.split(".")[0] in _OPAQUE_MODULES:
            return ["module", name]
        self.seen[id(module)] = f"module {name}"
        return ["module", name, self._attributes(module, names)]

    def _attributes(self, value: Any, names: list[str]) -> list[Any]:
        """The attributes of ``value`` that the source names, as found without running code
        (looked up in its own and its classes' namespaces: a property is described, not
        called)."""
        found = []
        spaces = _namespaces(value)
        for name in names:
            for space in spaces:
                if name in space:
                    attr = space[name]
                    if isinstance(attr, (staticmethod, classmethod)):
                        attr = attr.__func__
                    found.append([name, self.value(attr, names)])
                    break
        return found


def _namespaces(value: Any) -> list[Any]:
    """Where attributes of ``value`` are found: its own namespace, then its classes'."""
    own = getattr(value, "__dict__", None)
    spaces = [own] if isinstance(own, (dict, types.MappingProxyType)) else []
    if isinstance(value, types.ModuleType):
        return spaces
    classes = value.__mro__ if isinstance(value, type) else type(value).__mro__
    spaces += [vars(c) for c in classes if c is not object and c is not value]
    return spaces


def _closure(inner: Any) -> dict[str, Any]:
    code = getattr(inner, "__code__", None)
    cells = getattr(inner, "__closure__", None) or ()
    if code is None:
        return {}
    found = {}
    for name, cell in zip(code.co_freevars, cells, strict=False):
        try:
            found[name] = cell.cell_contents
        except ValueError:  # an empty cell
            continue
    return found


def _name(value: Any) -> str:
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    return f"{module}:{qualname}" if isinstance(qualname, str) else type(value).__name__


def _plain(value: Any) -> Any:
    if isinstance(value, _PLAIN):
        return repr(value)
    if isinstance(value, (tuple, list, set, frozenset)):
        return sorted(repr(v) for v in value)
    return _name(value)
