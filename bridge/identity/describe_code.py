"""Describing code by content: the part of a description pass (:class:`.describe.Describer`)
that meets code, and what it defers until the pass ends.

- a JIT function by its source, first line, decorator settings, defaults and the value of
  every name its source spells outside string literals and comments, looked up as Triton looks
  it up (closure, then globals; a parameter hides a global);
- a Python function (a ``constexpr_function`` too) by its code (instructions, constants,
  names), closure, defaults and every global it names;
- a class by its bases, metaclass and members; a built-in by its name, or by its method and
  the object it is bound to;
- a module by the value of each attribute among the pass's ``names``;
- Triton's code and the pure standard library's by name, an installed distribution's by name
  and by the digest of its file.

Invariants: whatever a description depends on is recorded as a read (:mod:`.watch`), so that a
warm process sees it change. Code that imports when it runs, looks values up by computed names
or reaches a module whose values are the process's state raises
:class:`~bridge.errors.Undescribable` at once. What has no description where code may not read
it (a method no code calls, a global or an attribute no code loads) is deferred, and
:meth:`CodeDescriber.finish` raises it only where code met reads it for certain
(:meth:`CodeDescriber.read_for_certain`: a JIT function's syntax is parsed only then).

:class:`CodeDescriber` keeps no state of its own: the pass's state (the attributes it
declares) and :meth:`~CodeDescriber.value`, which describes every value code holds, are its
subclass's.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from ..errors import Undescribable
from . import static_reads
from .static_reads import MISSING
from .syntax import LOOKUPS, UNKNOWN, resolved, scope, spelled, syntax
from .watch import (
    CELL,
    FUNCTION,
    ITEMS,
    LOOKUP,
    SETTINGS,
    SOURCE,
    Read,
    function_parts,
    items,
    mark,
    source,
)


class CodeDescriber:
    """The code of a description pass (see :class:`.describe.Describer`, which derives from
    it): functions, JIT functions, classes, built-ins and modules, and the deferred."""

    #: the attribute names modules are described by
    names: frozenset[str]
    #: what the code met spells (the names of the next pass)
    spelled: set[str]
    #: the names Python code met spells: its globals and attributes
    code_names: set[str]
    #: the JIT functions met: their source, and how their names are looked up
    sources: list[tuple[str, Callable[[str], Any]]]
    reads: list[Read]
    #: what has no description, found where code may not read it: (whether it is an
    #: attribute; the module it is an attribute of, or None; its name; why)
    deferred: list[tuple[bool, types.ModuleType | None, str, Undescribable]]
    #: the namespaces of the modules described
    spaces: list[dict[str, Any]]

    def value(self, value: Any) -> Any:
        """The description of any value (the subclass's)."""
        raise NotImplementedError

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
            return [what, name, static_reads.installed_digest(module)]  # type: ignore[arg-type]
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
