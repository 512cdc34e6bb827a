"""What a read of the frontend found, described by content: the values of read sets
(:mod:`.read_sets`).

Plain values exactly (:func:`exact`, made again by :func:`remake`): floats by their bits, so a
NaN's sign counts; tuples item by item; Triton's ``constexpr``, dtypes, pointer and block types.
Anything else by what it is (:func:`describe`), never by its name or address: a JIT function by
its source, settings and first line; Triton's own objects by where Triton defines them, only
where that very object is there and defined in Triton's files (:func:`triton_home`); a function
by its code, what it closes over and its defaults (a wrapper's code is the same for every
function it wraps); any other object by :func:`bridge.identity.jit.constant` where it has an
exact description. None where a value has no exact description.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import struct
import sys
import types
from typing import Any

from ..exceptions import Undescribable
from . import static_reads
from .watch import mark

#: what a lookup that found nothing finds
ABSENT: Any = static_reads.MISSING
#: how deep a description follows what functions close over and containers hold
MAX_DEPTH = 4


@functools.lru_cache(maxsize=1)
def language() -> Any:
    import triton.language as tl

    return tl


@functools.lru_cache(maxsize=1)
def _triton_dir() -> str:
    import triton

    return triton.__file__.rsplit("/", 1)[0] + "/"


def exact(value: Any) -> Any:
    """A plain value as JSON that tells it from every other value (see the module docstring);
    None where ``value`` is not plain."""
    kind = type(value)
    if value is None:
        return "N"
    if kind is bool:
        return ["b", int(value)]
    if kind is int:
        return ["i", str(value)]
    if kind is float:
        return ["f", struct.pack("<d", value).hex()]
    if kind is str:
        return ["s", value]
    if kind is bytes:
        return ["y", value.hex()]
    if kind is complex:
        return ["j", struct.pack("<dd", value.real, value.imag).hex()]
    if kind is tuple or kind is list:
        items = [exact(v) for v in value]
        return None if any(i is None for i in items) else ["t" if kind is tuple else "l", items]
    tl = language()
    if kind is tl.constexpr:
        inner = exact(value.value)
        return None if inner is None else ["k", inner]
    if kind is tl.dtype:
        return ["d", value.name]
    if kind is tl.pointer_type:
        inner = exact(value.element_ty)
        space = value.address_space  # (a number before Triton 3.9, a name since)
        if inner is None or type(space) not in (int, str) or type(value.const) is not bool:
            return None
        return ["dp", [inner, space, value.const]]
    if kind is tl.block_type:
        items = [exact(value.element_ty), *(exact(unwrap(d)) for d in value.shape)]
        return None if any(i is None for i in items) else ["db", items]
    return None


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


def unwrap(value: Any) -> Any:
    """``value`` without Triton's ``constexpr`` wrappers (a tuple's items too)."""
    tl = language()
    if isinstance(value, tl.constexpr):
        return unwrap(value.value)
    if isinstance(value, (tuple, tl.tuple)):
        return tuple(unwrap(v) for v in value)
    return value


def triton_home(value: Any) -> list[str] | None:
    """``["triton", module, qualname]`` where ``value`` is Triton's own: found under that
    name, in a module of Triton's files, and (a function) defined in them; else None."""
    module = getattr(value, "__module__", None) if not isinstance(value, types.ModuleType) else None
    if isinstance(value, types.ModuleType):
        name = value.__name__
        found = sys.modules.get(name)
        where = getattr(found, "__file__", None) or ""
        if found is value and name.split(".")[0] == "triton" and where.startswith(_triton_dir()):
            return ["triton", name, ""]
        return None
    qualname = getattr(value, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return None
    if module.split(".")[0] != "triton":
        return None
    home = sys.modules.get(module)
    if not (getattr(home, "__file__", None) or "").startswith(_triton_dir()):
        return None
    at: Any = home
    for part in qualname.split("."):
        at = getattr(at, part, ABSENT)
    if at is not value:
        return None
    code = getattr(value, "__code__", None)
    if code is not None and not code.co_filename.startswith(_triton_dir()):
        return None
    return ["triton", module, qualname]


def triton_code(fn: Any) -> bool:
    """Whether the function ``fn``, and what it wraps (``__wrapped__``), is code of Triton's
    files (a builtin of Triton's own, not one a program made with Triton's decorator)."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    return isinstance(code, types.CodeType) and code.co_filename.startswith(_triton_dir())


def _code(code: types.CodeType) -> list[Any]:
    consts = [_const(c) for c in code.co_consts]
    return [code.co_code.hex(), consts, list(code.co_names), list(code.co_varnames)]


def _const(value: Any) -> Any:
    """A constant of compiled code (a literal: immutable, whatever its type)."""
    if isinstance(value, types.CodeType):
        return _code(value)
    plain = exact(value)
    if plain is not None:
        return plain
    if isinstance(value, (tuple, frozenset)):
        items = [_const(v) for v in value]
        return [type(value).__name__, items if type(value) is tuple else sorted(map(repr, items))]
    return ["literal", repr(value)]


def describe(value: Any, depth: int = 0) -> Any:
    """What a non-plain ``value`` is, by content (see the module docstring), and None where
    it has no exact description."""
    from .jit import constant

    if depth > MAX_DEPTH:
        return None

    tl = language()
    jit_callable, constexpr_function, _ = static_reads.jit_classes()
    if isinstance(value, tl.constexpr):
        return _whole(["k", _part(value.value, depth)])
    if isinstance(value, (tuple, list)):
        return _whole([type(value).__name__, [_part(v, depth) for v in value]])
    home = triton_home(value)
    if home is not None:
        return home
    if isinstance(value, types.ModuleType):
        return ["module"]
    if isinstance(value, jit_callable):
        if constexpr_function is not None and isinstance(value, constexpr_function):
            return ["cfn", _code(value.fn.__code__)]
        src = repr(mark(value))
        file, line = _first_line(value)
        return ["jit", hashlib.sha256(src.encode()).hexdigest(), file, line]
    if isinstance(value, types.FunctionType):
        # (its code, and what it closes over and defaults to: a wrapper's code is the same
        # for every function it wraps)
        cells = []
        for cell in value.__closure__ or ():
            try:
                held = cell.cell_contents
            except ValueError:
                held = ABSENT
            cells.append(_part(held, depth))
        defaults = [_part(v, depth) for v in value.__defaults__ or ()]
        return _whole(["fn", _code(value.__code__), cells, defaults])
    if isinstance(value, (type, types.MethodType, types.BuiltinFunctionType)):
        return ["code", type(value).__name__]
    try:
        return ["obj", constant(value)]
    except (Undescribable, ValueError, RecursionError):
        return None


def _part(value: Any, depth: int) -> Any:
    """A part of a description: ``value`` exactly, or described (None where it cannot be)."""
    plain = exact(value)
    return plain if plain is not None else describe(value, depth + 1)


def _whole(desc: list[Any]) -> list[Any] | None:
    """``desc``, or None where a part of it has no description."""
    return None if _holes(desc) else desc


def _holes(desc: Any) -> bool:
    return desc is None or (isinstance(desc, list) and any(_holes(d) for d in desc))


def _first_line(fn: Any) -> tuple[str, int]:
    """The file (import-relative) and first line of the JIT function ``fn``: where the
    locations of its code generator's IR point."""
    code = fn.fn.__code__
    line = getattr(fn, "starting_line_number", None)
    first = code.co_firstlineno if line is None else line
    return static_reads.relative_path(code.co_filename), int(first)
