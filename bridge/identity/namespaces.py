"""What reads find without running code of what they read: namespace reads, and plain values
exactly, as a check makes the reads of a read set again (:mod:`bridge.readsets.read_sets`) and
as the witness compares what the frontend found with.

A global or closure variable of a function as Triton's code generator resolves it (the
backend's module map applied); an attribute where Python's own lookup finds it
(:func:`~.static_reads.attribute`), ``RUNS_CODE`` where only code would give it; a function's
defaults and source file.

A plain value is described so that it tells it from every other value (:func:`exact`: a float
by its bits; tuples item by item; Triton's ``constexpr``, dtypes, pointer and block types), made
again from that (:func:`remake`), and read out of ``constexpr`` wrappers (:func:`unwrap`). Every
description is made under the budget open (:func:`budget`): past it,
:class:`~bridge.exceptions.OverBudget` is raised, so what a check of hostile data can make a
thread do is bounded by the data's size.
"""

from __future__ import annotations

import contextlib
import functools
import json
import struct
import threading
import types
from collections.abc import Iterator
from typing import Any

from ..exceptions import OverBudget
from . import static_reads
from .static_reads import MISSING as ABSENT
from .static_reads import RUNS_CODE, attribute, attribute_of, in_mro, python_function

_budget = threading.local()


@contextlib.contextmanager
def budget(parts: int) -> Iterator[None]:
    """Describe at most ``parts`` values and items in this thread in this block (where an
    outer block leaves fewer, those): past it, :class:`OverBudget` is raised. What a check of
    a hostile read set can make this thread do is bounded so, by the data's size."""
    outer = getattr(_budget, "left", None)
    start = parts if outer is None else min(parts, outer)
    _budget.left = start
    try:
        yield
    finally:
        spent = start - _budget.left
        _budget.left = None if outer is None else outer - spent


def spend(parts: int) -> None:
    left = getattr(_budget, "left", None)
    if left is not None:
        left -= parts
        _budget.left = left
        if left < 0:
            raise OverBudget("a description past its budget")


@functools.lru_cache(maxsize=1)
def language() -> Any:
    import triton.language as tl

    return tl


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
        spend(len(value))
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
    """``value`` without Triton's ``constexpr`` wrappers (a tuple's items too), asked of its
    type alone: no code of ``value`` runs (a wrapper or tuple whose class reads its own
    fields or iterates its own way is left as it is)."""
    tl = language()
    kind = type(value)
    if issubclass(kind, tl.constexpr):
        inner = wrapped(value)
        return value if inner is RUNS_CODE else unwrap(inner)
    if kind is tuple or kind is tl.tuple:
        return tuple(unwrap(v) for v in value)
    if issubclass(kind, tuple) and in_mro(kind, "__iter__") is tuple.__iter__:
        return tuple(unwrap(v) for v in tuple.__iter__(value))
    return value


def wrapped(value: Any) -> Any:
    """What the ``constexpr`` ``value`` wraps: a subclass's field as Python's lookup finds it,
    :data:`~.static_reads.RUNS_CODE` where only code would give it (or it has none)."""
    if type(value) is language().constexpr:
        return value.value
    try:
        return attribute(value, "value")
    except AttributeError:
        return RUNS_CODE


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
    module = attribute_of(value, "__module__")
    if type(module) is str and module in module_map:
        name = attribute_of(value, "__name__")
        if type(name) is str:
            return getattr(module_map[module], name)
    return value


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


_maps: dict[type, dict[str, Any]] = {}


def module_map_of(backend: Any) -> dict[str, Any]:
    """The module map of ``backend`` (what its code generator replaces Triton's modules by),
    asked once per backend class."""
    found = _maps.get(type(backend))
    if found is None:
        found = _maps[type(backend)] = dict(backend.get_module_map())
    return found


def plain_json(value: Any) -> str:
    """``value`` as canonical JSON text (what two specializations are compared by)."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True)
