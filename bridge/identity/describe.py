"""Describing what Triton's frontend can read, by content, or saying that it cannot.

A description is plain data (lists, strings, numbers) whose ``repr`` tells apart any two values
that the frontend could compile differently. It is built from what values *are*, never from
their name, ``repr`` or address:

- exact ``int``, ``float``, ``complex``, ``str``, ``bytes``, ``bool`` and None by type and
  ``repr``, floats and complex numbers by their bits (:func:`~.static_reads.plain_text`:
  every NaN's ``repr`` is ``nan``, whatever its sign); tuples, lists, dicts and sets item by
  item;
- code by content: a JIT function by its source, first line, decorator settings and the value
  of every name its source spells outside string literals and comments (a superset of what its
  syntax reads, found without parsing; the syntax is parsed only where a value has no
  description, to tell whether the code reads it), looked up as Triton looks it up (closure,
  then globals; a parameter hides a global); a ``constexpr_function`` or any Python function by
  its code (instructions, constants, names), closure, defaults and every global it names; a
  class by its bases, metaclass and members; a built-in by its name, or by its method and the
  object it is bound to; an enum member by its class and name (and value, where the class is
  described by name); a bound method by its function and object;
- objects by their class and every field, where the type's memory layout holds nothing else
  (:func:`~.static_reads.data_base`); ``functools.partial`` by its function, arguments and fields;
  buffers (NumPy arrays, ``bytearray``, ``array.array``, ``memoryview``) by their bytes;
- modules by the value of every attribute that any code described in the same description
  spells (the names are gathered until they settle: see :func:`describe`), so that a module read
  by the kernel and by its helper is described with both helpers' names;
- code of Triton and of the pure standard library by name (Triton's files are in every key, the
  interpreter's version is in every description), code of installed distributions by name and
  by the digest of its own file (a module with none to read, as from a zip, makes it open).

What the describer cannot prove complete raises :class:`~bridge.exceptions.Undescribable` naming the
value and why; the kernel is then *open* (keyed by the IR Triton's frontend produces:
:mod:`.frontend`): a type whose instances may hold state no field shows (a type written in C,
``random.Random``, a pybind11 object), code that looks values up by computed names
(``getattr``/``hasattr`` with a name that is not a literal, ``globals()``, ``vars()``,
``eval``, ``__dict__``...), imports inside code, code that answers differently in each process
(``id``, ``hash``) or reads the process's state (modules such as ``os``, ``sys``, ``random``,
``time``), a module-level ``__getattr__`` asked for a name it lacks, more than
:data:`MAX_VALUES` values.

Every description also records what it read (:data:`~.watch.Read`): a warm process reuses a
description only while :func:`~.watch.unchanged` finds every read as it was (the same objects,
a deque's too; buffers and sets by content). What has no description where code may not read it (a method no
code calls, a global or an attribute no code loads) is deferred, and :meth:`Describer.finish`
raises it only where code met reads it for certain (:meth:`Describer.read_for_certain`: a JIT
function's syntax is parsed only then).
"""

from __future__ import annotations

import enum
import functools
import sys
import types
from collections.abc import Callable
from typing import Any

from ..exceptions import Undescribable
from . import file_digests, static_reads
from .static_reads import LOOKUPS, MISSING, UNKNOWN, resolved, scope, spelled, syntax
from .watch import (
    BYTES,
    CELL,
    FUNCTION,
    ITEMS,
    LOOKUP,
    REDUCED,
    SET,
    SETTINGS,
    SLOTS,
    SOURCE,
    TYPE,
    Read,
    buffer_snapshot,
    function_parts,
    is_buffer,
    items,
    mark,
    reduced_parts,
    reduced_state,
    source,
)

#: the most values one description holds (a larger one makes the kernel open)
MAX_VALUES = 20_000
#: passes over a kernel's reach until the attribute names it spells settle
MAX_PASSES = 8
PYTHON = list(sys.version_info[:2])


class Describer:
    """One pass of a description (see :func:`describe`): values, and the code they hold
    (functions, JIT functions, classes, built-ins and modules), with what is deferred."""

    def __init__(self, names: frozenset[str]) -> None:
        #: the attribute names modules are described by
        self.names = names
        #: what the code met spells (the names of the next pass)
        self.spelled: set[str] = set()
        #: the names Python code met spells: its globals and attributes
        self.code_names: set[str] = set()
        #: the JIT functions met: their source, and how their names are looked up
        self.sources: list[tuple[str, Callable[[str], Any]]] = []
        self.reads: list[Read] = []
        self.active: set[int] = set()
        self.seen: dict[int, str] = {}
        self.marks = 0
        self.kept: list[Any] = []  # (objects marked seen, alive while their ids are)
        #: what has no description, found where code may not read it: (whether it is an
        #: attribute; the module it is an attribute of, or None; its name; why)
        self.deferred: list[tuple[bool, types.ModuleType | None, str, Undescribable]] = []
        #: the namespaces of the modules described
        self.spaces: list[dict[str, Any]] = []
        self.count = 0

    def value(self, value: Any) -> Any:
        kind = type(value)
        if kind in static_reads.PLAIN_TYPES:
            return [kind.__name__, static_reads.plain_text(value)]
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
            doc = ["enum", self.value(kind), value.name]
            if static_reads.origin(str(kind.__module__)) in ("installed", "python"):
                doc.append(self.value(vars(value).get("_value_", MISSING)))  # (a class by name)
            return doc
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
        if is_buffer(value):
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
            parts = reduced_parts(value)
            self.reads.append((REDUCED, value, None, reduced_state(value)))
        except Exception as e:  # (a type that does not pickle: no description)
            why = f"a {static_reads.name_of(kind)} does not show its state: {e}"
            raise Undescribable(why) from None
        return ["reduced", self.value(kind), [self.value(p) for p in parts]]

    # -- what the code met reads for certain ------------------------------------------------
    def read_for_certain(self, attribute: bool, module: types.ModuleType | None, name: str) -> bool:
        """Whether code met may read ``name``: as a global (not ``attribute``), or as an
        attribute (of ``module``, where given). Python code that spells it may; a JIT function
        may where its syntax loads the name, or reads the attribute through a chain that does
        not start from another object (``tl.arange`` is no read of another module's
        ``arange``). The syntax is parsed only here, where something has no description."""
        if name in self.code_names:
            return True
        for src, finds in self.sources:
            if name not in spelled(src):
                continue
            found = syntax(src)
            if not attribute:
                if name in found.loaded:
                    return True
                continue
            if name not in found.attributes:
                continue
            if module is None:
                return True
            for head, attrs in found.chains:
                for i, attr in enumerate(attrs):
                    if attr == name:
                        start = resolved(found, finds, head, attrs[:i])
                        if start is UNKNOWN or start is module:
                            return True
        return False

    def finish(self) -> None:
        """Raise what was deferred that code met reads for certain (when the pass ends)."""
        for attribute, module, name, error in self.deferred:
            if self.read_for_certain(attribute, module, name):
                raise error

    # -- code -----------------------------------------------------------------------------
    def _trusted(self, value: Any, what: str) -> Any | None:
        """The description of Triton's, Python's or an installed distribution's ``value`` (a
        function, class or built-in) by name; None where it is the application's own. A
        function belongs to the module whose globals it runs with (a wrapper made by
        ``functools.wraps`` takes the name of the function it wraps, not its module)."""
        glob = getattr(value, "__globals__", None)
        module = (
            glob.get("__name__") if isinstance(glob, dict) else getattr(value, "__module__", None)
        )
        where = static_reads.origin(module) if isinstance(module, str) else "user"
        if where == "user":
            return None
        name = static_reads.name_of(value)
        if where == "impure":
            raise Undescribable(
                f"it reaches {name}, {what} of a module whose values are the state of the process"
            )
        if where == "installed":
            return [what, name, file_digests.installed_digest(module)]  # type: ignore[arg-type]
        return [what, name]

    def builtin(self, value: Any) -> Any:
        owner = getattr(value, "__self__", None)
        name = static_reads.named(value)
        if owner is None or isinstance(owner, types.ModuleType):
            if name is None:
                raise Undescribable(
                    f"the built-in {static_reads.name_of(value)} cannot be found by its name"
                )
            if (
                name.startswith("builtins:")
                and name.split(":", 1)[1] in static_reads.DYNAMIC_BUILTINS
            ):
                raise Undescribable(
                    f"it uses {name.split(':', 1)[1]}, which looks values up by computed names"
                )
            found = self._trusted(value, "built-in")
            return found if found is not None else ["built-in", name]
        method = getattr(value, "__name__", None)
        return ["bound built-in", repr(method), self.value(type(owner)), self.value(owner)]

    def klass(self, cls: type) -> Any:
        found = self._trusted(cls, "class")
        if found is not None:
            return found
        space = vars(cls)
        self.reads.append((ITEMS, space, None, items(space)))
        meta = type(cls)
        members = [
            [k, self._member(k, v)]
            for k, v in sorted(space.items())
            if k not in static_reads.CLASS_NOISE
        ]
        return [
            "class",
            static_reads.name_of(cls),
            [self.value(b) for b in cls.__bases__],
            None if meta is type else self.value(meta),
            members,
        ]

    def _member(self, name: str, value: Any) -> Any:
        """A class member: a method without a description is fine while no code calls it
        (none spells its name; a special method is called by Python itself)."""
        if not static_reads.is_member(value):
            return static_reads.descriptor(value)
        special = name.startswith("__") and name.endswith("__")
        if special or not isinstance(value, (types.FunctionType, staticmethod, classmethod)):
            return self.value(value)
        try:
            return self.value(value)
        except Undescribable as e:
            self.deferred.append((True, None, name, Undescribable(f"its method {name}: {e}")))
            return ["undescribed", name]

    def function(self, fn: types.FunctionType) -> Any:
        found = self._trusted(fn, "function")
        if found is not None:
            return found
        code = fn.__code__
        digest, spelled, imports = static_reads.code_facts(code)
        who = static_reads.name_of(fn)
        if imports:
            raise Undescribable(f"{who} imports a module when it runs")
        glob = fn.__globals__
        dynamic = sorted(n for n in spelled & static_reads.DYNAMIC_BUILTINS if n not in glob)
        if dynamic:
            raise Undescribable(
                f"{who} calls {dynamic[0]}(), which looks values up by computed names or reads the process's state"
            )
        attributes = sorted(spelled & static_reads.DYNAMIC_ATTRIBUTES)
        if attributes:
            raise Undescribable(
                f"{who} reads {attributes[0]}, which reaches values by computed names"
            )
        self.spelled |= spelled
        self.code_names |= spelled
        self.reads.append((FUNCTION, fn, None, function_parts(fn)))
        cells = []
        for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=False):
            content = static_reads.cell(cell)
            self.reads.append((CELL, cell, None, content))
            cells.append([name, self.value(content)])
        rows = []
        for name in sorted(spelled):
            value = glob.get(name, MISSING)
            self.reads.append((LOOKUP, glob, name, value))  # (a global defined later hides
            if value is not MISSING:  # a builtin: read as absent, it is seen when it appears)
                rows.append([name, self.value(value)])
        defaults = [self.value(fn.__defaults__), self.value(fn.__kwdefaults__)]
        return ["function", who, digest, cells, defaults, rows]

    def jit(self, fn: Any) -> Any:
        src = source(fn)
        self.reads.append((SOURCE, fn, None, mark(fn)))
        names = spelled(src)
        inner = getattr(fn, "fn", None)
        cells = static_reads.cells(inner)
        glob = getattr(fn, "__globals__", None) or getattr(inner, "__globals__", {})
        params = static_reads.parameters(inner)
        if any(n in names and not (n in params or n in cells or n in glob) for n in LOOKUPS):
            computed = syntax(src).computed
            if computed is not None:
                raise Undescribable(
                    f"{static_reads.name_of(fn)} looks an attribute up by a computed name: {computed}"
                )
            names = names | syntax(src).attributes  # (the literal names getattr reads)
        self.spelled |= names
        self.sources.append((src, scope(cells, glob, params)))
        found = []
        for name in sorted(names - params):
            cell = cells.get(name)
            if cell is not None:
                content = static_reads.cell(cell)
                self.reads.append((CELL, cell, None, content))
                found.append(["c", name, self._named(name, content)])
            value = glob.get(name, MISSING)
            self.reads.append((LOOKUP, glob, name, value))  # (absent too: see function())
            if value is not MISSING:
                found.append(["g", name, self._named(name, value)])
        settings = [static_reads.plain_value(getattr(fn, s, None)) for s in SETTINGS]
        defaults = None  # (a helper's parameters the caller leaves out take these)
        if isinstance(inner, types.FunctionType):
            self.reads.append((FUNCTION, inner, None, function_parts(inner)))
            defaults = [self.value(inner.__defaults__), self.value(inner.__kwdefaults__)]
        return [
            "jit",
            static_reads.name_of(fn),
            src,
            getattr(fn, "starting_line_number", None),
            settings,
            found,
            defaults,
        ]

    def _named(self, name: str, value: Any, module: types.ModuleType | None = None) -> Any:
        """The description of ``value``, found under ``name`` (a global of code met, or an
        attribute of ``module``); one that has none is fine where no code reads it."""
        try:
            return self.value(value)
        except Undescribable as e:
            error = Undescribable(f"{name}: {e}")
            self.deferred.append((module is not None, module, name, error))
            return ["undescribed", name]

    def module(self, module: types.ModuleType) -> Any:
        name = module.__name__
        where = static_reads.origin(name)
        if where in ("triton", "python"):
            return ["module", name]
        if where == "impure":
            raise Undescribable(
                f"it reaches the module {name}, whose values are the state of the process"
            )
        space = vars(module)
        self.spaces.append(space)
        self.reads.append((LOOKUP, space, "__getattr__", space.get("__getattr__", MISSING)))
        rows = []
        for attr in sorted(self.names):
            value = space.get(attr, MISSING)
            self.reads.append((LOOKUP, space, attr, value))
            if value is MISSING:
                if "__getattr__" in space and where == "user":
                    why = f"the module {name} makes its attribute {attr} with __getattr__"
                    self.deferred.append((True, module, attr, Undescribable(why)))
                continue
            rows.append([attr, self._named(attr, value, module)])
        return ["module", name, rows]


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
