"""Which reads a lookup may make of a stored read set (:mod:`.read_sets`): its text has the
form of one (:mod:`bridge.entries.metadata`, checked at every door); here each row is
checked against the kernel's code as a lookup makes the rows again (:class:`Admission`), and
nothing the rows say chooses code to run.

A global must be one the code of its function reads; an attribute, a name the code of the
kernel or of a function a read found spells (:func:`code_names`); a call only of a
``constexpr_function``, or a function or class of the program, that a read found, or of a pure
function of the standard library (:data:`PURE`), with arguments that are small plain values
(:func:`small`) or values the lookup holds already (given, constants of the code, found by a
read); a built-in of :data:`~bridge.entries.metadata.BUILTIN_NAMES` only on plain values;
the IR read only for a specialization the lookup is for.

The recorder (:mod:`.witness`) applies the same checks to each read it would record (a read
they refuse is not recorded: the read set is partial, and the IR decides), so a read set a
compile records is always admitted, and one that is not was written some other way.

Reads run no code of the objects they read (items and built-ins: :mod:`.static_access`). An
attribute is found where Python's own lookup finds it (:func:`attribute`), in the namespaces
(an object's, its class's and their bases', a metaclass's), bound as Python binds it where that
runs no code of the program: a function becomes a method, a static or class method its
function, a descriptor written in C or defined by Triton (in every key) gives what it gives, an
Enum member's ``name`` and ``value`` are its fields; one only code would give (a property of
the program, a ``__getattr__``, a type that reads attributes its own way) is :data:`RUNS_CODE`,
and no code runs. A call runs under a :class:`~.guard.Guard` with a deadline
(:data:`CALL_SECONDS`).
"""

from __future__ import annotations

import functools
import json
import math
import struct
import types
from collections.abc import Callable, Sequence
from typing import Any

from ..entries.metadata import IMPLICIT, MAX_ITEMS
from ..exceptions import RefusedReadSet
from . import static_reads
from .exact_values import ABSENT, exact, language, triton_code, triton_home
from .guard import program_class, program_module
from .static_reads import (
    RUNS_CODE,
    attribute,
    code_facts,
    global_loads,
    jit_classes,
    python_function,
    source,
    spelled,
    syntax,
)

#: the largest plain value a call is given that the lookup does not hold already
SMALL = 1 << 20
#: how long the calls of one check of a read set may run in all
CALL_SECONDS = 0.5
#: how long one check of a read set may take in all (its reads, descriptions and calls): a
#: read set still being checked then is refused, whatever it would find
CHECK_SECONDS = 1.0


# -- reads made as the code generator makes them, running no code of what they read -----------
def _function(fn: Any, lacks: str) -> types.FunctionType:
    """:func:`python_function` of ``fn``, which a read needs.

    Raises:
        TypeError: ``fn`` has none (it has no ``lacks``).
    """
    inner = python_function(fn)
    if inner is None:
        raise TypeError(f"{type(fn).__name__} has no {lacks}")
    return inner


def scope_value(fn: Any, name: str, module_map: dict[str, Any]) -> Any:
    """The global or closure variable ``name`` of the JIT function ``fn`` (or a function, see
    :func:`python_function`), as Triton's code generator sees it (the module map applied)."""
    inner = _function(fn, "globals")
    code = inner.__code__
    closure = inner.__closure__
    if closure and name in code.co_freevars:
        try:
            value = closure[code.co_freevars.index(name)].cell_contents
        except ValueError:
            return ABSENT
    else:
        value = inner.__globals__.get(name, ABSENT)
    return mapped(value, module_map)


def mapped(value: Any, module_map: dict[str, Any]) -> Any:
    """A global as the code generator keeps it: a module or one of its objects replaced by the
    backend's (found without running code of ``value``)."""
    if type(value) is types.ModuleType:
        return module_map.get(value.__name__, value)
    if not module_map:
        return value
    module = _static(value, "__module__")
    if type(module) is str and module in module_map:
        name = _static(value, "__name__")
        if type(name) is str:
            return getattr(module_map[module], name)
    return value


def _static(value: Any, name: str) -> Any:
    """:func:`~.static_reads.attribute`, None where there is none (or only code would give it)."""
    try:
        found = attribute(value, name)
    except AttributeError:
        return None
    return None if found is RUNS_CODE else found


def follow(value: Any, module_map: dict[str, Any]) -> Any:
    """A module followed through the module map, as the code generator does before it reads
    an attribute; anything else as it is."""
    if type(value) is types.ModuleType:
        while (known := value.__name__) in module_map:
            value = module_map[known]
            if value.__name__ == known:
                break
    return value


def generated_attribute(value: Any, name: str, module_map: dict[str, Any]) -> Any:
    """``getattr(value, name)`` as the code generator reads an attribute, where that runs no
    code of ``value`` (:func:`~.static_reads.attribute`): :data:`~.static_reads.RUNS_CODE` where only code
    would give it.

    Raises:
        AttributeError: ``value`` has no such attribute.
    """
    value = follow(value, module_map)
    if issubclass(type(value), language().constexpr) and name not in ("value", "type"):
        value = attribute(value, "value")
    return attribute(value, name)


def defaults(fn: Any) -> list[Any]:
    """The defaults and keyword defaults of the function ``fn`` (:func:`python_function`)."""
    inner = _function(fn, "defaults")
    return [inner.__defaults__, inner.__kwdefaults__]


def source_file(fn: Any) -> str:
    """The file of the JIT function ``fn`` as the compile writes it into the binary's debug
    information: relative to the longest import root that holds it
    (:func:`~.static_reads.relative_path`)."""
    inner = _function(fn, "source file")
    return static_reads.relative_path(inner.__code__.co_filename)


def remake(desc: Any) -> Any:
    """The value :func:`exact` described as ``desc`` (untrusted).

    Raises:
        ValueError: ``desc`` describes no value.
    """
    if desc == "N":
        return None
    if not isinstance(desc, list) or len(desc) != 2:
        raise ValueError(f"not a value: {desc!r:.60}")
    tag, body = desc
    if tag == "b":
        return bool(body)
    if tag == "i":
        return int(body)
    if tag == "f":
        return struct.unpack("<d", bytes.fromhex(body))[0]
    if tag == "s" and isinstance(body, str):
        return body
    if tag == "y":
        return bytes.fromhex(body)
    if tag == "j":
        return complex(*struct.unpack("<dd", bytes.fromhex(body)))
    if tag in ("t", "l") and isinstance(body, list):
        items = [remake(v) for v in body]
        return tuple(items) if tag == "t" else items
    if tag == "k":
        return language().constexpr(remake(body))
    if tag == "d" and isinstance(body, str):
        return language().dtype(body)
    if tag == "dp" and isinstance(body, list) and len(body) == 3:
        inner, space, const = remake(body[0]), body[1], body[2]
        if not isinstance(inner, language().dtype) or type(space) not in (int, str):
            raise ValueError(f"not a pointer type: {desc!r:.60}")
        return language().pointer_type(inner, space, bool(const))
    if tag == "db" and isinstance(body, list) and len(body) >= 2:
        element, shape = remake(body[0]), [remake(d) for d in body[1:]]
        if not isinstance(element, language().dtype) or any(type(d) is not int for d in shape):
            raise ValueError(f"not a block type: {desc!r:.60}")
        return language().block_type(element, shape)
    raise ValueError(f"not a value: {desc!r:.60}")


_maps: dict[type, dict[str, Any]] = {}


def module_map_of(backend: Any) -> dict[str, Any]:
    """The module map of ``backend`` (what its code generator replaces Triton's modules by),
    asked once per backend class."""
    found = _maps.get(type(backend))
    if found is None:
        found = _maps[type(backend)] = dict(backend.get_module_map())
    return found


# -- values -------------------------------------------------------------------------------------
def small(value: Any, depth: int = 0) -> bool:
    """Whether the plain ``value`` is small: what a call may be given that the lookup does not
    hold already (numbers within :data:`SMALL`, short strings, short tuples of such)."""
    kind = type(value)
    if value is None or kind is bool:
        return True
    if kind is int:
        return -SMALL <= value <= SMALL
    if kind is float:
        return not math.isfinite(value) or -SMALL <= value <= SMALL
    if kind is complex:
        return small(value.real) and small(value.imag)
    if kind in (str, bytes):
        return len(value) <= 64
    if kind in (tuple, list):
        return depth < 4 and len(value) <= MAX_ITEMS and all(small(v, depth + 1) for v in value)

    tl = language()
    if kind is tl.constexpr:
        return small(value.value, depth + 1)
    if kind is tl.block_type:
        return all(small(d, depth + 1) for d in value.shape)
    return kind in (tl.dtype, tl.pointer_type)


def consts(code: types.CodeType) -> list[Any]:
    """The constants of ``code`` and of the code nested in it."""
    found: list[Any] = []
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            found += consts(c)
        else:
            found.append(c)
    return found


# -- the rows against the code ------------------------------------------------------------------
def program_function(fn: Any) -> bool:
    """Whether ``fn`` is a Python function (or a method of one) of the program's own."""
    if type(fn) is types.MethodType:
        fn = fn.__func__
    if type(fn) is not types.FunctionType or triton_home(fn) is not None:
        return False
    return program_module(fn.__globals__.get("__name__"))


#: callables of the standard library that depend only on their (small) arguments, which a
#: kernel may call (``math.log2(BLOCK)``)
PURE = frozenset(
    getattr(math, n)
    for n in ("log2", "log", "log10", "ceil", "floor", "sqrt", "isqrt", "exp", "gcd", "lcm",
              "trunc", "fabs", "copysign", "frexp", "sin", "cos", "tan", "tanh", "atan", "erf",
              "isfinite", "isinf", "isnan", "log1p", "expm1", "atan2", "hypot")
    if hasattr(math, n)
)  # fmt: skip


class Admission:
    """The rows a lookup of one read set may make (see the module docstring), fed the rows in
    order: :meth:`check` before a row runs, :meth:`found` with what it found. ``expected()``:
    the specializations (:func:`~.frontend.specialization`) the lookup is for, one of which an
    IR read must be for (None: an IR read is admitted, and not made)."""

    def __init__(
        self,
        kernel: Any,
        given: dict[str, Any],
        expected: Callable[[], Sequence[Any]] | None = None,
    ) -> None:
        self.kernel = kernel
        self.expected = expected
        self.params = frozenset(getattr(kernel, "arg_names", ()) or ())
        self.names: set[str] = set()
        #: what the lookup holds: the given values, the found ones and the code followed
        #: (whose constants are made known only when a call needs them: :meth:`_known`)
        self.held: list[Any] = list(given.values())
        self._held = {id(v) for v in self.held}
        self.code: list[types.CodeType] = []
        #: :meth:`_known`'s values, and how many of ``held`` and ``code`` they cover
        self._plain: set[str] = set()
        self._made = (0, 0)
        self.followed: set[int] = set()
        #: how each object was found (the read that found it, by the object's id), and the read
        #: being made
        self.how: dict[int, tuple[str, Any, Any]] = {}
        self.read: tuple[str, Any, Any] = ("", None, None)
        self.found(kernel)

    def found(self, value: Any) -> None:
        """Note ``value``, found by an admitted read (or the kernel): a function's names and
        code, any other value itself."""
        self.how.setdefault(id(value), self.read)
        inner = python_function(value)
        if inner is None:
            if len(self.held) < 65536 and id(value) not in self._held:
                self._held.add(id(value))  # (each object once: a read made again finds it)
                self.held.append(value)
            return
        if id(inner) in self.followed:
            return
        self.followed.add(id(inner))
        self.names |= code_names(value)
        if not triton_code(inner):  # (Triton's constants are no values of the call)
            self.code.append(inner.__code__)

    def _known(self) -> set[str]:
        """The plain values the lookup holds, as JSON text (made when first asked, and kept:
        what was held or followed since is added)."""
        held, code = self._made
        for value in self.held[held:]:
            desc = exact(value)
            if desc is not None:
                self._plain.add(plain_json(desc))
        for inner in self.code[code:]:
            self._plain.update(_constants(inner))
        self._made = (len(self.held), len(self.code))
        return self._plain

    def check(self, index: int, base: Any, op: str, operand: Any, found: Sequence[Any]) -> None:
        """Raise :class:`~bridge.exceptions.RefusedReadSet` where the code does not allow row ``index``, ``op`` of
        ``operand`` on ``base`` (what its parent found)."""
        self.read = (op, operand, base)
        why = self._why(base, op, operand, found)
        if why is not None:
            raise RefusedReadSet(f"row {index} ({op} {json.dumps(operand)[:60]}): {why}")

    def _why(self, base: Any, op: str, operand: Any, found: Sequence[Any]) -> str | None:
        jit, cfn, _ = jit_classes()
        if op == "g":
            if python_function(base) is None:
                return "a global is read only of a function"
            ok = operand in code_names(base)
            return None if ok else "a global its function's code does not spell"
        if op == "a":
            if operand in self.names:
                return None
            ok = operand in IMPLICIT and issubclass(type(base), type)
            return None if ok else "a name no code the reads followed spells"
        if op == "f":
            ok = issubclass(type(base), jit) and (cfn is None or not issubclass(type(base), cfn))
            return None if ok else "a source file is read only of a JIT function"
        if op == "d":
            return None if python_function(base) is not None else "defaults only of a function"
        if op == "p":
            return None if operand in self.params else "not a parameter of the kernel"
        if op == "e":
            return None
        if op == "i":
            return self._argument(operand[:], found, any_value=False)
        if op == "c":
            return self._call(base, operand, found)
        if op == "b":
            return self._builtin(operand, found)
        if op == "ir":
            if self.expected is None:
                return None  # (made again where the specialization is known: see read_sets)
            ok = plain_json(operand) in {plain_json(e) for e in self.expected()}
            return None if ok else "an IR read of a specialization the lookup is not for"
        return "no such read"

    def _call(self, fn: Any, operand: Any, found: Sequence[Any]) -> str | None:
        cfn = jit_classes()[1]
        callable_ = (
            (cfn is not None and issubclass(type(fn), cfn))
            or program_function(fn)
            or (issubclass(type(fn), type) and program_class(fn))
            or (type(fn) is types.BuiltinFunctionType and fn in PURE)
        )
        if not callable_:
            return "a call only of a constexpr_function or a function or class of the program"
        how = self.how.get(id(fn), ("", None, None))
        plain = (cfn is not None and issubclass(type(fn), cfn)) or (
            type(fn) is types.BuiltinFunctionType and fn in PURE
        )
        if not plain and not (how[0] == "g" and how[1] in loads(how[2])):
            return "a call of a function or class the code does not load by its name"
        args, kwargs = operand
        for arg in [*args, *(a for _, a in kwargs)]:
            why = self._argument(arg, found, any_value=True)
            if why is not None:
                return why
        return None

    def _argument(self, arg: Any, found: Sequence[Any], any_value: bool) -> str | None:
        """Why the argument ``arg`` may not be given, None where it may: a value found by a
        read (``any_value``: any object; else a plain one), or a plain value that is small or
        that the lookup holds already."""
        tag, body = arg
        if tag in ("r", "rk"):
            value = found[body]
            return None if any_value or exact(value) is not None else "an object as a key"
        try:
            value = remake(body)
        except (ValueError, TypeError, OverflowError):
            return "not a value"
        if small(value) or plain_json(body) in self._known():
            return None
        return "a large value the lookup does not hold (given, in the code or found)"

    def _builtin(self, operand: Any, found: Sequence[Any]) -> str | None:
        name, args = operand
        if name in ("getattr", "hasattr"):
            if not 2 <= len(args) <= (3 if name == "getattr" else 2):
                return f"{name} takes an object and a name"
            attr = args[1]
            named = attr[0] == "v" and isinstance(attr[1], list) and attr[1][:1] == ["s"]
            if not named or attr[1][1] not in self.names:
                return f"{name} of a name no code the reads followed spells"
            return self._argument(args[0], found, any_value=True)
        if name == "isinstance":
            return None if len(args) == 2 else "isinstance takes two arguments"
        for arg in args:
            why = self._argument(arg, found, any_value=False)
            if why is not None:
                return why
        return None


@functools.lru_cache(maxsize=4096)
def _constants(code: types.CodeType) -> tuple[str, ...]:
    """The plain constants of ``code`` and the code nested in it, as JSON text."""
    return tuple(plain_json(d) for d in map(exact, consts(code)) if d is not None)


def plain_json(value: Any) -> str:
    """``value`` as canonical JSON text (what two specializations are compared by)."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def code_names(fn: Any) -> frozenset[str]:
    """The names the code of the function ``fn`` spells (its globals and attributes): a JIT
    function's source outside string literals and comments (found without parsing); a Python
    function's code, nested code and closure."""
    jit, cfn, _ = jit_classes()
    if issubclass(type(fn), jit) and (cfn is None or not issubclass(type(fn), cfn)):
        src = source(fn)
        if isinstance(src, str):
            return spelled(src)
    inner = python_function(fn)
    if inner is None:
        return frozenset()
    return code_facts(inner.__code__)[1] | frozenset(inner.__code__.co_freevars)


def loads(fn: Any) -> frozenset[str]:
    """The names the code of the function ``fn`` loads as globals (asked only of a function
    whose global a call is made of): a JIT function's syntax as Triton's frontend walks it,
    less the names it stores or takes as parameters (its locals); a Python function's global
    loads and closure (:func:`~.static_reads.global_loads`)."""
    jit, cfn, _ = jit_classes()
    if issubclass(type(fn), jit) and (cfn is None or not issubclass(type(fn), cfn)):
        src = source(fn)
        if isinstance(src, str):
            parsed = syntax(src)
            return parsed.loaded - parsed.stored
        return frozenset()
    inner = python_function(fn)
    if inner is None:
        return frozenset()
    return global_loads(inner.__code__) | frozenset(inner.__code__.co_freevars)
