"""What the code a call of the frontend runs can read, recorded as rows of the read set, and
whether the call is decided by them.

For a call the witness records (a ``constexpr_function``, a function or class of the program's
own), :func:`reachable` records each global and closure variable its code names, its defaults,
the module attributes its code names, and so on through the functions and methods found (to
:data:`MAX_REACH` levels): rows a check reads again. The call is *decided* (:class:`Reach`) where
all the code it ran was code followed so (or pure code of the standard library), no C function
it can name keeps state or reads the world (:data:`PURE_C`), and no code followed builds a set;
else the read set is partial. Recorded at a compile only; nothing here runs at a lookup.
"""

from __future__ import annotations

import builtins
import dis
import math
import types
from typing import Any

from ..entries.metadata import IMPLICIT
from ..identity import static_reads
from ..identity.exact_values import ABSENT, describe, triton_home
from ..identity.namespaces import defaults, exact, follow, generated_attribute, scope_value
from ..identity.static_reads import python_function
from .guard import LIBRARY, MADE, kind_of

#: standard library modules whose Python code depends only on what it is given
PURE_STDLIB = frozenset(
    {"math", "cmath", "operator", "functools", "itertools", "enum", "dataclasses", "typing",
     "types", "collections", "abc", "numbers", "fractions", "re", "string", "copy",
     "builtins", "textwrap", "struct", "statistics", "heapq", "bisect", "keyword", "json",
     "_operator", "_functools", "_collections", "_collections_abc", "_abc",
     "_struct", "_heapq", "_bisect", "_json", "_sre", "sre_compile",
     "sre_parse", "sre_constants", "_string", "contextlib", "warnings", "_warnings", "weakref",
     "_weakref", "_weakrefset", "reprlib", "copyreg", "inspect"}
)  # fmt: skip
#: modules whose C functions, and classes written in C, depend only on their arguments (not
#: ``decimal``: its arithmetic reads the thread's context)
PURE_C = frozenset(
    {"math", "cmath", "_operator", "operator", "builtins", "_functools", "functools",
     "collections", "_collections", "itertools", "fractions", "numbers", "enum", "types"}
)  # fmt: skip
#: built-ins that read or change the world, the process or the hash seed
IMPURE_BUILTINS = frozenset(
    {"open", "input", "print", "exec", "eval", "compile", "__import__", "id", "hash",
     "globals", "locals", "vars", "breakpoint", "help", "setattr", "delattr", "dir", "exit",
     "quit", "iter", "next", "aiter", "anext", "set", "frozenset"}
)  # fmt: skip
#: callables of the standard library that depend only on their (plain) arguments, which a
#: kernel may call at compile time (``math.log2(BLOCK)``): a call of one is decided by them
PURE_MATH = frozenset(
    getattr(math, n)
    for n in ("log2", "log", "log10", "ceil", "floor", "sqrt", "isqrt", "exp", "gcd", "lcm",
              "trunc", "fabs", "copysign", "frexp", "sin", "cos", "tan", "tanh", "atan", "erf",
              "isfinite", "isinf", "isnan", "log1p", "expm1", "atan2", "hypot")
    if hasattr(math, n)
)  # fmt: skip
#: how deep :func:`reachable` follows the functions a function names
MAX_REACH = 4
_BUILTINS = vars(builtins)
_SETS = frozenset(dis.opmap[n] for n in ("BUILD_SET", "SET_ADD", "SET_UPDATE") if n in dis.opmap)


def _qualname(code: types.CodeType) -> str:
    return str(getattr(code, "co_qualname", code.co_name))


class Reach:
    """What :func:`reachable` followed of one call: the code objects of the functions whose
    reads it recorded, and why the call is not decided by them (None where it is)."""

    def __init__(self) -> None:
        self.code: set[types.CodeType] = set()
        self.done: set[int] = set()
        self.why: str | None = None

    def follow(self, inner: types.FunctionType) -> None:
        stack = [inner.__code__]
        while stack:
            code = stack.pop()
            self.code.add(code)
            if self.why is None and any(i.opcode in _SETS for i in dis.get_instructions(code)):
                self.why = f"{_qualname(code)} builds a set (ordered by the hash seed)"
            stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]

    def found(self, value: Any) -> None:
        """Note ``value``, a global or module attribute the code followed names (or an
        argument of the call): a C function that keeps state or reads the world, or a value
        holding a module (whose attributes the code may read: reads no row records), leaves
        the call undecided."""
        if self.why is None and type(value) is not types.ModuleType and _holds_module(value):
            self.why = f"it can read a module held by a {type(value).__qualname__}"
        if self.why is None and isinstance(value, type) and static_reads.data_base(value) is None:
            module = static_reads.attribute(value, "__module__")
            if type(module) is not str or module.split(".")[0] not in PURE_C:
                self.why = f"it can use {value.__qualname__}, a class whose objects hold state"
        if self.why is None and type(value) is types.BuiltinFunctionType:
            owner = getattr(value, "__self__", None)
            module = getattr(value, "__module__", None) or getattr(owner, "__name__", None)
            name = getattr(value, "__name__", "?")
            pure = type(owner) is types.ModuleType or owner is None
            if not pure or module not in PURE_C or name in IMPURE_BUILTINS:
                self.why = f"it can call {module}.{name}, C code that is no function of its values"

    def decided(self, ran: set[types.CodeType]) -> str | None:
        """Why a call that ran the code objects ``ran`` is not decided by what was followed
        (None where it is)."""
        if self.why is not None:
            return self.why
        for code in ran:
            if code in self.code:
                continue
            kind = kind_of(code)
            module = code.co_filename.rsplit("/", 1)[-1].removesuffix(".py")
            if kind == LIBRARY and (
                module in PURE_STDLIB or code.co_filename.startswith("<frozen")
            ):
                continue
            if kind == MADE and code.co_name in ("__init__", "__repr__", "__eq__", "__hash__"):
                continue  # (a dataclass's or namedtuple's made methods: its fields decide)
            return f"it ran {_qualname(code)}, code no read followed"
        return None


def _holds_module(value: Any) -> bool:
    """Whether the description of ``value`` (:func:`~bridge.identity.exact_values.describe`) holds a module
    (which it names, never describes: its attributes are reads of their own)."""
    if exact(value) is not None or triton_home(value) is not None:
        return False
    stack = [describe(value)]
    while stack:
        part = stack.pop()
        if part == ["module"]:
            return True
        if isinstance(part, list):
            stack += part
    return False


def arguments(recorder: Any, values: list[Any], module_map: dict[str, Any], reach: Reach) -> None:
    """Follow the arguments ``values`` of a call :func:`reachable` follows the callee of: a
    function or class given is followed as the callee is; any other is decided by its
    description (:meth:`Reach.found`), what code of it runs checked when the call ran."""
    for value in values:
        if isinstance(value, type) or python_function(value) is not None:
            reachable(recorder, value, module_map, reach, 1)
        else:
            reach.found(value)


def reachable(
    recorder: Any, fn: Any, module_map: dict[str, Any], reach: Reach, depth: int = 0
) -> None:
    """Record in ``recorder`` (a :class:`~.witness.Recorder`) what the code of ``fn`` (a
    function or class a call of which the witness records) can read: each global and closure
    variable its code names, its defaults and, of each module among them, each attribute its
    code names; and so on for each function of the program's own found that way (to
    :data:`MAX_REACH` levels), and the methods of each class (:func:`members`). Every row is
    a namespace read a check makes again; ``reach`` notes what was followed."""
    if isinstance(fn, type):
        members(recorder, fn, [], module_map, depth, reach)
        return
    parent = recorder.origin(fn)
    inner = python_function(fn)
    if parent is None or inner is None or id(inner) in reach.done or depth > MAX_REACH:
        if inner is not None and id(inner) not in reach.done:
            reach.why = reach.why or f"{inner.__qualname__} is reached by no read"
        return
    reach.done.add(id(inner))
    reach.follow(inner)
    recorder.add(parent, "d", "", defaults(inner))
    _, spelled, _ = static_reads.code_facts(inner.__code__)
    names = sorted(spelled | set(inner.__code__.co_freevars))
    found = []
    for name in names:
        value = scope_value(fn, name, module_map)
        row = recorder.add(parent, "g", name, value)
        found.append(value)
        if value is ABSENT and name in _BUILTINS:  # (a built-in by that name is what runs)
            reach.found(_BUILTINS[name])
        if row is not None and isinstance(value, types.ModuleType):
            space = vars(follow(value, module_map))
            for attr in names:
                if attr in space:
                    found.append(generated_attribute(value, attr, module_map))
                    recorder.add(row, "a", attr, found[-1])
    for value in found:
        reach.found(value)
        if isinstance(value, type):
            members(recorder, value, names, module_map, depth, reach)
        elif python_function(value) is not None and triton_home(value) is None:
            reachable(recorder, value, module_map, reach, depth + 1)


def members(
    recorder: Any, cls: type, names: list[str], module_map: dict[str, Any], depth: int, reach: Reach
) -> None:
    """For :func:`reachable`: the methods of a class of the program's own that code names (or
    Python calls by itself: ``IMPLICIT``), found as its attributes, and what they can read."""
    row = recorder.origin(cls)
    if row is None or triton_home(cls) is not None:
        return
    if str(getattr(cls, "__module__", "")).split(".")[0] in PURE_STDLIB:
        return
    for name in sorted(set(names) | set(IMPLICIT)):
        member = static_reads.in_mro(cls, name)
        if python_function(member) is not None:
            recorder.add(row, "a", name, generated_attribute(cls, name, module_map))
            reachable(recorder, member, module_map, reach, depth + 1)
