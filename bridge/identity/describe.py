"""Describing what Triton's frontend can read, by content, or saying that it cannot.

A description is plain data (lists, strings, numbers) whose ``repr`` tells apart any two values
that the frontend could compile differently. It is built from what values *are*, never from
their name, ``repr`` or address:

- exact ``int``, ``float``, ``complex``, ``str``, ``bytes``, ``bool`` and None by type and
  ``repr``; tuples, lists, dicts and sets item by item;
- code by content (:mod:`.describe_code`): a JIT function by its source, first line, decorator
  settings and the value of every name its source spells outside string literals and comments
  (a superset of what its syntax reads, found without parsing; the syntax is parsed only where
  a value has no description, to tell whether the code reads it), looked up as Triton looks it
  up (closure, then globals; a parameter hides a global); a ``constexpr_function`` or any
  Python function by its code (instructions, constants, names), closure, defaults and every
  global it names; a class by its bases, metaclass and members; an enum member by its class
  and name; a bound method by its function and object;
- objects by their class and every field, where the type's memory layout holds nothing else
  (:func:`~.static_reads.data_base`); ``functools.partial`` by its function, arguments and fields;
  buffers (NumPy arrays, ``bytearray``, ``array.array``, ``memoryview``) by their bytes;
- modules by the value of every attribute that any code described in the same description
  spells (the names are gathered until they settle: see :func:`describe`), so that a module read
  by the kernel and by its helper is described with both helpers' names;
- code of Triton and of the pure standard library by name (Triton's files are in every key, the
  interpreter's version is in every description), code of installed distributions by name and
  by the digest of its file.

What the describer cannot prove complete raises :class:`~bridge.errors.Undescribable` naming the
value and why; the kernel is then *open* (keyed by the IR Triton's frontend produces:
:mod:`.frontend`): a type whose instances may hold state no field shows (a type written in C,
``random.Random``, a pybind11 object), code that looks values up by computed names
(``getattr``/``hasattr`` with a name that is not a literal, ``globals()``, ``vars()``,
``eval``, ``__dict__``...), imports inside code, code that answers differently in each process
(``id``, ``hash``) or reads the process's state (modules such as ``os``, ``sys``, ``random``,
``time``), a module-level ``__getattr__`` asked for a name it lacks, more than
:data:`MAX_VALUES` values.

Every description also records what it read (:data:`Read`): a warm process reuses a description
only while :func:`unchanged` finds every read as it was (the same objects; buffers and sets by
content).
"""

from __future__ import annotations

import enum
import functools
import sys
import types
from collections.abc import Callable
from typing import Any

from ..errors import Undescribable
from . import static_reads
from .describe_code import CodeDescriber
from .static_reads import MISSING
from .watch import BYTES, ITEMS, SET, SLOTS, TYPE, Read, buffer_snapshot, items

#: the most values one description holds (a larger one makes the kernel open)
MAX_VALUES = 20_000
#: passes over a kernel's reach until the attribute names it spells settle
MAX_PASSES = 8
PYTHON = list(sys.version_info[:2])


class Describer(CodeDescriber):
    """One pass of a description (see :func:`describe`): ``names`` are the attribute names
    modules are described by; what the code it meets spells is gathered in ``spelled``. Values
    are described here, code by :class:`~.describe_code.CodeDescriber`."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self.spelled: set[str] = set()
        self.code_names: set[str] = set()
        self.sources: list[tuple[str, Callable[[str], Any]]] = []
        self.reads: list[Read] = []
        self.active: set[int] = set()
        self.seen: dict[int, str] = {}
        self.marks = 0
        self.kept: list[Any] = []  # (objects marked seen, alive while their ids are)
        self.deferred: list[tuple[bool, types.ModuleType | None, str, Undescribable]] = []
        self.spaces: list[dict[str, Any]] = []
        self.count = 0

    def value(self, value: Any) -> Any:
        kind = type(value)
        if kind in static_reads.PLAIN_TYPES:
            return [kind.__name__, repr(value)]
        self.count += 1
        if self.count > MAX_VALUES:
            raise Undescribable(f"more than {MAX_VALUES} values to describe")
        key = id(value)
        if key in self.active:
            return ["cycle", self.seen.get(key)]
        known = self.seen.get(key)
        if known is not None:
            return ["seen", known]
        if isinstance(value, static_reads.constexpr_class()):
            return ["constexpr", self.value(value.value)]
        self.marks += 1
        self.seen[key] = f"#{self.marks}"
        self.kept.append(value)
        self.active.add(key)
        try:
            return self._described(value, kind)
        except Undescribable:
            del self.seen[key]  # (met again, by another way, it raises again)
            raise
        finally:
            self.active.discard(key)

    def _described(self, value: Any, kind: type) -> Any:
        jit_callable, constexpr_function, launcher = static_reads.jit_classes()
        if isinstance(value, jit_callable):
            if constexpr_function is not None and isinstance(value, constexpr_function):
                return ["constexpr_function", self.function(value.fn)]
            return self.jit(value)
        if isinstance(value, launcher):
            # (an autotuner or heuristics: launched, never called by kernel code; its state is
            # the run's)
            return ["launcher", static_reads.name_of(kind)]
        if kind is tuple or kind is list:
            if kind is list:
                self.reads.append((ITEMS, value, None, items(value)))
            return [kind.__name__, [self.value(v) for v in value]]
        if kind is dict:
            self.reads.append((ITEMS, value, None, items(value)))
            return ["dict", self._rows(value.items())]
        if kind is types.MappingProxyType:  # (a read-only view of a dict)
            self.reads.append((ITEMS, value, None, items(value)))
            return ["mappingproxy", self._rows(value.items())]
        if kind is set or kind is frozenset:
            if kind is set:
                self.reads.append((SET, value, None, frozenset(value)))
            return [kind.__name__, sorted(repr(self.value(v)) for v in value)]
        if isinstance(value, types.ModuleType):
            return self.module(value)
        if isinstance(value, type):
            return self.klass(value)
        if isinstance(value, enum.Enum):
            return ["enum", self.value(kind), value.name]
        if isinstance(value, types.FunctionType):
            return self.function(value)
        if isinstance(value, types.MethodType):
            return ["method", self.value(value.__func__), self.value(value.__self__)]
        if isinstance(value, (staticmethod, classmethod)):
            return [kind.__name__, self.value(value.__func__)]
        if isinstance(value, property):
            return ["property", [self.value(f) for f in (value.fget, value.fset, value.fdel)]]
        if (
            isinstance(value, types.BuiltinFunctionType)
            or kind.__name__ in static_reads.C_CALLABLES
        ):
            return self.builtin(value)
        if kind.__name__ == "_lru_cache_wrapper" and isinstance(
            getattr(value, "__wrapped__", None), types.FunctionType
        ):  # (a memo of the function's answers: the function is what answers)
            return ["cached function", self.value(value.__wrapped__)]
        if kind is functools.partial:
            parts = [value.func, value.args, value.keywords, static_reads.fields(value)]
            return ["partial", [self.value(p) for p in parts]]
        if self._isbuffer_snapshot(value):
            snapshot = buffer_snapshot(value)
            self.reads.append((BYTES, value, None, snapshot))
            return ["buffer", repr(snapshot[:-1]), snapshot[-1].hex()]
        numpy = sys.modules.get("numpy")
        if numpy is not None and isinstance(value, (numpy.dtype, numpy.generic)):
            if isinstance(value, numpy.dtype):
                return ["numpy.dtype", value.str, repr(value.descr)]
            return ["numpy", kind.__name__, self.value(value.item())]
        return self.instance(value, kind)

    def _rows(self, pairs: Any) -> list[Any]:
        rows = [[self.value(k), self.value(v)] for k, v in pairs]
        return sorted(rows, key=repr)

    @staticmethod
    def _isbuffer_snapshot(value: Any) -> bool:
        if isinstance(value, (bytearray, memoryview)):
            return True
        kind = type(value)
        if kind.__name__ == "array" and kind.__module__ == "array":
            return True
        numpy = sys.modules.get("numpy")
        return numpy is not None and isinstance(value, numpy.ndarray) and value.dtype != object

    def instance(self, value: Any, kind: type) -> Any:
        base = static_reads.data_base(kind)
        if base is None and static_reads.origin(kind.__module__) == "python":
            return self.reduced(value, kind)
        if base is None:
            raise Undescribable(
                f"a {static_reads.name_of(kind)} may hold state that none of its fields shows (its type "
                "or a base of it is written in C)"
            )
        self.reads.append((TYPE, value, None, kind))
        own = getattr(value, "__dict__", None)
        if isinstance(own, dict):
            self.reads.append((ITEMS, own, None, items(own)))
        if base in (list, dict):  # (a subclass of a mutable built-in: its items are state too)
            self.reads.append((ITEMS, value, None, items(value)))
        elif base is set:
            self.reads.append((SET, value, None, frozenset(value)))
        slots = static_reads.slot_names(kind)
        if slots:
            self.reads.append(
                (SLOTS, value, slots, tuple(getattr(value, s, MISSING) for s in slots))
            )
        convert = static_reads.DATA_BASES[base]
        held = None if convert is None else self.value(convert(value))
        return ["object", self.value(kind), held, self._rows(static_reads.fields(value).items())]

    def reduced(self, value: Any, kind: type) -> Any:
        """An object of a type of the pure standard library written in C (an ``OrderedDict``, a
        ``deque``, a namedtuple's field): by what pickling it keeps, its whole state."""
        try:
            parts = list(value.__reduce_ex__(4))
        except Exception as e:  # (a type that does not pickle: no description)
            raise Undescribable(
                f"a {static_reads.name_of(kind)} does not show its state: {e}"
            ) from None
        parts += [None] * (5 - len(parts))
        parts[3:5] = [None if p is None else list(p) for p in parts[3:5]]
        return ["reduced", self.value(kind), [self.value(p) for p in parts]]


def describe(root: Any) -> tuple[Any, tuple[Read, ...]]:
    """The description of ``root`` (a JIT function, a constexpr: any value) and what it read.

    The attribute names that modules are described by are those that the code met spells:
    the description is made again with every name the last pass gathered until no module it
    described holds a name it was not described by (a module with ``__getattr__`` counts as
    holding every name).

    Raises:
        Undescribable: what has no description, and why.
    """
    names: frozenset[str] = frozenset()
    for _ in range(MAX_PASSES):
        describer = Describer(names)
        try:
            doc = describer.value(root)
        except RecursionError:
            raise Undescribable("its values are nested too deeply to describe") from None
        describer.finish()
        new = describer.spelled - names
        if not any(n in space for space in describer.spaces for n in new) and not any(
            "__getattr__" in space for space in describer.spaces if new
        ):
            return [PYTHON, doc], tuple(describer.reads)
        names = names | describer.spelled
    raise Undescribable(f"the names its code spells did not settle in {MAX_PASSES} passes")
