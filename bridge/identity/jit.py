"""What identifies a JIT function's code, and the constexprs it is compiled with, without
parsing: the kernel part of lowering keys and of kernel keys.

Triton's ``JITFunction.cache_key`` parses the function's source and walks its syntax tree to
find what it depends on (0.5 to 1 ms per kernel in every process), and leaves out some of what
its frontend reads: constexprs reached as attributes of another module, globals read by a
``constexpr_function``, the values of globals it checks only when it launches. :func:`identity`
is computed from the same inputs without parsing, and covers a superset of what the frontend
reads, so that whatever changes the compiled code changes it:

- the source Triton compiles (``src``, which may have been replaced) and its first line;
- the decorator's settings, which Triton leaves out of ``cache_key`` but which change the
  compiled code (``noinline``, ``debug``, ``do_not_specialize``, ``do_not_specialize_on_alignment``);
- every name the source spells (a regular expression over the text: a superset of the names
  its syntax tree reads, including those in strings and comments), looked up as Triton looks
  them up, in the closure and in the module's globals (but for the function's parameters,
  which hide globals of their names); each value found is described: a JIT
  function (``constexpr_function`` included) by its own identity (recursively; a cycle by a
  marker), a ``constexpr`` by the value it holds, a Triton aggregate by its annotations and
  hashed attributes, numbers and strings by their ``repr``, lists, tuples and dicts item by
  item, and any other object by its type and ``repr`` (unless that shows an address) and, for
  every name of the source that it has as an attribute, that attribute's description (the
  attribute chains Triton resolves, ``module.kernel`` or ``namespace.constant``; found without
  calling properties). Triton's own language modules and Python's standard library are
  described by name: their contents are installed files (Triton's are in every key) and the
  process's state (``os.environ``), not the kernel's.

An identity is memoized per function for the process, and used only while nothing it read has
changed: each read (a global, a closure cell, a module's or object's attribute, the items of a
list or dict, a helper's source and settings) is kept with the object it found, and the memo
holds while every read still finds that very object (Triton's launcher checks the globals a
kernel used the same way before each launch; here a change gives a new identity, so the new
code is lowered, never the old one).

:func:`constant` describes a constexpr argument for a kernel key: exactly, or not at all. A
value is described by what it is, never by its ``str`` (two objects that print alike may
compile differently): numbers and strings by ``repr``, containers item by item, enums by
member, JIT functions by identity, classes by their members (functions by their code,
closures and defaults included), other objects by their type and every field. A value with no
such description (an object known only by its address) raises :class:`Undescribable`: its
kernel is compiled in the process and not stored.

A value whose description is not the same in every process (an object whose ``repr`` holds an
address) gives a key that never matches: a lowering done again, never a stale one. An object
whose ``repr`` fails makes :func:`identity` raise ``ValueError``: the call is not stored.
"""

from __future__ import annotations

import enum
import hashlib
import re
import types
import weakref
from collections.abc import Callable
from typing import Any

from ..errors import Undescribable
from . import reads

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: the decorator settings that change what is compiled but not ``cache_key``
_SETTINGS = ("noinline", "debug", "do_not_specialize", "do_not_specialize_on_alignment")
#: the most values one :func:`constant` describes (a larger one is not described)
MAX_VALUES = 20_000
#: what a class's namespace holds that is not its behaviour
_CLASS_NOISE = frozenset(
    {"__dict__", "__weakref__", "__module__", "__qualname__", "__doc__", "__firstlineno__",
     "__static_attributes__", "__annotations__", "__annotate__", "__orig_bases__",
     "__parameters__", "__slots__", "__match_args__", "__dataclass_fields__",
     "__dataclass_params__", "__hash__", "__slotnames__", "__abstractmethods__", "_abc_impl"}
)  # fmt: skip


def is_jit(value: Any) -> bool:
    """Whether ``value`` is a Triton JIT function (a ``JITCallable``: source, globals, a key)."""
    from triton.runtime import jit

    return isinstance(value, getattr(jit, "JITCallable", jit.JITFunction))


def _settings(fn: Any) -> list[Any]:
    """The decorator settings of ``fn`` (:data:`_SETTINGS`), as plain values."""
    return [reads.plain_value(getattr(fn, s, None)) for s in _SETTINGS]


def _mark(fn: Any) -> tuple[Any, ...]:
    """The source and decorator settings of ``fn`` as they are now (lists and sets copied)."""
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


# -- what a description read --------------------------------------------------------------------
#: a read: (where, what, the object found). ``what`` is a name looked up in the mapping
#: ``where``; None: the content of the closure cell ``where``; :data:`_ITEMS`: the items of the
#: list, dict or set ``where``; :data:`_SOURCE`: the source and settings of the JIT function
#: ``where``
Read = tuple[Any, Any, Any]
_MISSING = object()
_ITEMS = object()
_SOURCE = object()


def _items(container: Any) -> Any:
    """What a read of ``container``'s items keeps: its items, or for a set the set."""
    if isinstance(container, dict):
        return tuple(x for item in container.items() for x in item)
    if isinstance(container, (set, frozenset)):
        return frozenset(container)
    return tuple(container)


def unchanged(reads: tuple[Read, ...]) -> bool:
    """Whether every read of ``reads`` still finds the very object it found."""
    for where, what, found in reads:
        if what is None:
            try:
                now = where.cell_contents
            except ValueError:  # an empty cell
                now = _MISSING
        elif what is _ITEMS:
            now = _items(where)
            if type(now) is frozenset:
                if now != found:
                    return False
                continue
            if len(now) != len(found) or any(a is not b for a, b in zip(now, found, strict=True)):
                return False
            continue
        elif what is _SOURCE:
            if _mark(where) != found:
                return False
            continue
        else:
            now = where.get(what, _MISSING)
        if now is not found:
            return False
    return True


# -- identities --------------------------------------------------------------------------------
def identity(fn: Any) -> str:
    """The identity of the JIT function ``fn`` (see the module docstring): a sha256 digest.

    Memoized per function object for the process while its source and settings, and every
    value its description read, stay the same (see the module docstring)."""
    mark = _mark(fn)
    known = _memo.get(id(fn))
    if known is not None and known[0]() is fn and known[1] == mark and unchanged(known[3]):
        return known[2]
    describer = _Describer()
    doc = describer.jit(fn)
    found = hashlib.sha256(repr(doc).encode()).hexdigest()  # (plain lists and strings)
    try:
        _memo[id(fn)] = (weakref.ref(fn), mark, found, tuple(describer.reads))
    except TypeError:  # (an object that cannot be referred to weakly: not memoized)
        pass
    return found


#: identities by the id of their function: (a weak reference to it, its source and settings
#: then, the identity, what its description read)
_memo: dict[int, tuple[Callable[[], Any], tuple[Any, ...], str, tuple[Read, ...]]] = {}


def constant(value: Any) -> Any:
    """``value``, a constexpr, as plain data whose ``repr`` tells it from every value the
    frontend could compile differently (see the module docstring).

    Raises:
        Undescribable: ``value`` has no such description (it is named in the message).
    """
    return _Describer(exact=True).value(value, [])


class _Describer:
    """One description: of a JIT function (:meth:`jit`), or, ``exact``, of a constexpr."""

    def __init__(self, exact: bool = False) -> None:
        self.exact = exact
        self.active: set[int] = set()  # JIT functions being described (a cycle's marker)
        self.seen: dict[int, Any] = {}  # objects described already, by id
        self.reads: list[Read] = []
        self.count = 0

    def jit(self, fn: Any) -> Any:
        if id(fn) in self.active:
            return ["cycle", reads.name_of(fn)]
        self.active.add(id(fn))
        try:
            src = _src(fn)
            self.reads.append((fn, _SOURCE, _mark(fn)))
            names = sorted(set(_NAME.findall(src)))
            inner = getattr(fn, "fn", None)
            cells = reads.cells(inner)
            glob = getattr(fn, "__globals__", None) or getattr(inner, "__globals__", {})
            params = reads.parameters(inner)
            found = []
            for name in names:
                if name in params:  # (a parameter hides a global of its name, as Triton has it)
                    continue
                cell = cells.get(name)
                if cell is not None:
                    try:
                        value = cell.cell_contents
                    except ValueError:  # an empty cell
                        value = _MISSING
                    self.reads.append((cell, None, value))
                    if value is not _MISSING:
                        found.append(["c", name, self.value(value, names)])
                if name in glob:
                    value = glob[name]
                    self.reads.append((glob, name, value))
                    found.append(["g", name, self.value(value, names)])
            return [
                "jit",
                reads.name_of(fn),
                src,
                getattr(fn, "starting_line_number", None),
                _settings(fn),
                found,
            ]
        finally:
            self.active.discard(id(fn))

    def value(self, value: Any, names: list[str]) -> Any:
        self.count += 1
        if self.count > MAX_VALUES:
            raise Undescribable(f"more than {MAX_VALUES} values to describe")
        if isinstance(value, reads.PLAIN):
            return [type(value).__name__, repr(value)]
        if is_jit(value):
            return ["jit", identity(value)] if self.exact else self.jit(value)
        known = self.seen.get(id(value))
        if known is not None:
            return ["seen", known]
        kind = type(value)
        if kind.__name__ == "constexpr" and hasattr(value, "value"):
            return ["constexpr", self.value(value.value, names)]
        if isinstance(value, types.ModuleType):
            return self._module(value, names)
        self.seen[id(value)] = f"{reads.name_of(kind)}@{len(self.seen)}"
        if isinstance(value, (tuple, list)):
            if isinstance(value, list):
                self.reads.append((value, _ITEMS, _items(value)))
            return [reads.name_of(kind), [self.value(v, names) for v in value]]
        if isinstance(value, dict):
            self.reads.append((value, _ITEMS, _items(value)))
            rows = [[repr(k), self.value(v, names)] for k, v in value.items()]
            return [reads.name_of(kind), sorted(rows, key=lambda row: row[0])]
        if isinstance(value, (set, frozenset)):
            if isinstance(value, set):
                self.reads.append((value, _ITEMS, _items(value)))
            return [reads.name_of(kind), sorted(repr(v) for v in value)]
        if getattr(value, "__triton_aggregate__", False):
            return self._aggregate(value, names)
        if self.exact:
            return self._exact(value)
        shown = reads.safe_repr(value)
        return [
            "object",
            reads.name_of(kind),
            reads.name_of(value),
            None if " at 0x" in shown else shown,
            self._attributes(value, names),
        ]

    def _aggregate(self, value: Any, names: list[str]) -> Any:
        attrs = getattr(value, "hash_attrs", ())
        fields: Any = None
        annotations = getattr(value, "__annotations__", None) or {}
        if self.exact and not isinstance(value, type):  # an instance: its fields' values
            fields = [[k, self.value(getattr(value, k, None), names)] for k in annotations]
        return [
            "aggregate",
            reads.name_of(value),
            str(annotations),
            [self.value(a, names) for a in attrs],
            fields if self.exact else self._attributes(value, names),
        ]

    def _module(self, module: types.ModuleType, names: list[str]) -> Any:
        name = module.__name__
        if self.exact or reads.opaque_module(name):
            return ["module", name]
        self.seen[id(module)] = f"module {name}"
        return ["module", name, self._attributes(module, names)]

    def _attributes(self, value: Any, names: list[str]) -> list[Any]:
        """The attributes of ``value`` that the source names, as found without running code
        (looked up in its own and its classes' namespaces: a property is described, not
        called)."""
        found = []
        spaces = reads.namespaces(value)
        for name in names:
            for i, space in enumerate(spaces):
                if name in space:
                    attr = space[name]
                    self.reads += [(s, name, _MISSING) for s in spaces[:i]]
                    self.reads.append((space, name, attr))
                    if isinstance(attr, (staticmethod, classmethod)):
                        attr = attr.__func__
                    found.append([name, self.value(attr, names)])
                    break
        return found

    # -- exact descriptions (constexprs) ---------------------------------------------------
    def _exact(self, value: Any) -> Any:
        kind = type(value)
        if isinstance(value, enum.Enum):
            return ["enum", reads.name_of(kind), value.name, self.value(value.value, [])]
        if isinstance(value, type):
            return self._class(value)
        if isinstance(value, types.FunctionType):
            return ["function", reads.name_of(value), self._function(value)]
        if isinstance(value, (staticmethod, classmethod)):
            return [reads.name_of(kind), self.value(value.__func__, [])]
        if isinstance(value, property):
            return ["property", [self.value(f, []) for f in (value.fget, value.fset, value.fdel)]]
        if isinstance(value, types.BuiltinFunctionType):  # (its module and name say which)
            return ["builtin", reads.name_of(value)]
        if isinstance(value, types.MethodType):
            return ["method", self.value(value.__func__, []), self.value(value.__self__, [])]
        if hasattr(value, "tobytes") and hasattr(value, "dtype") and hasattr(value, "shape"):
            data = value.tobytes()  # an array: its repr elides items
            digest = hashlib.sha256(data).hexdigest()
            return ["array", reads.name_of(kind), str(value.dtype), list(value.shape), digest]
        fields = reads.fields(value)
        if fields is not None:
            rows = [[k, self.value(v, [])] for k, v in sorted(fields.items())]
            return ["object", self.value(kind, []), rows]
        shown = reads.safe_repr(value)
        if " at 0x" in shown or kind.__repr__ is object.__repr__:
            raise Undescribable(
                f"a {reads.name_of(kind)} is known only by its address ({shown:.60})"
            )
        return ["repr", reads.name_of(kind), shown]

    def _class(self, cls: type) -> Any:
        if reads.opaque(cls):  # (Triton's and Python's own classes: their code is installed files)
            return ["class", reads.name_of(cls)]
        bases = [self.value(b, []) for b in cls.__bases__]
        members = [
            [k, self.value(v, []) if reads.is_member(v) else reads.descriptor(v)]
            for k, v in sorted(vars(cls).items())
            if k not in _CLASS_NOISE
        ]
        return [
            "class",
            reads.name_of(cls),
            bases,
            str(vars(cls).get("__annotations__", {})),
            members,
        ]

    def _function(self, fn: types.FunctionType) -> Any:
        code = fn.__code__
        cells = zip(code.co_freevars, fn.__closure__ or (), strict=False)
        glob = fn.__globals__
        return [
            reads.code_text(code),
            [[n, self.value(reads.cell(c), [])] for n, c in cells],
            self.value(fn.__defaults__, []),
            self.value(fn.__kwdefaults__, []),
            [[n, self.value(glob[n], [])] for n in sorted(reads.global_names(code)) if n in glob],
        ]
