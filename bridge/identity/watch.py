"""What a description read, and whether it still finds it: how a warm process knows that a
memoized description (:mod:`.jit`) still holds.

Every read of a description (:mod:`.describe`) is kept as a :data:`Read`: where it was made, what
was asked and what was found. :func:`unchanged` asks again; a description is reused only while
every read finds the very same object (buffers and sets: the same content). Nothing here runs
the values' own code, except the pickling state of a type of the pure standard library written
in C (an ``OrderedDict``, a ``deque``: :func:`reduced_state`), which its description is made of.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from . import static_reads
from .static_reads import MISSING

#: the decorator settings that change what is compiled but not Triton's ``cache_key``
SETTINGS = ("noinline", "debug", "do_not_specialize", "do_not_specialize_on_alignment")

#: a read: (kind, where, what, what was found). LOOKUP: ``where.get(what)``; CELL: a closure
#: cell's content; ITEMS: the items of a list, dict or namespace (compared object by object);
#: SET: a set's members; SOURCE: a JIT function's source and settings; BYTES: a buffer's
#: content; FUNCTION: a function's code, defaults and keyword defaults; SLOTS: an object's slots;
#: TYPE: an object's class (``__class__`` can be assigned); REDUCED: the objects of the
#: pickling state of a type of the pure standard library written in C (compared object by object)
Read = tuple[int, Any, Any, Any]
LOOKUP, CELL, ITEMS, SET, SOURCE, BYTES, FUNCTION, SLOTS, TYPE, REDUCED = range(10)


def items(container: Any) -> tuple[Any, ...]:
    """What an ITEMS read keeps of a list, dict or namespace: its items, keys and values."""
    if isinstance(container, dict):  # (the dict's own, never what a subclass overrides)
        return tuple(x for item in dict.items(container) for x in item)
    if isinstance(container, types.MappingProxyType):
        return tuple(x for item in container.items() for x in item)
    return tuple(list.copy(container) if isinstance(container, list) else container)


def mark(fn: Any) -> tuple[Any, ...]:
    """The source and decorator settings of the JIT function ``fn`` as they are now."""
    found: list[Any] = [source(fn)]
    for s in SETTINGS:
        value: Any = getattr(fn, s, None)
        kind = type(value)
        found.append(tuple(value) if kind is list else frozenset(value) if kind is set else value)
    return tuple(found)


def source(fn: Any) -> Any:
    try:
        return fn.src
    except AttributeError:
        return getattr(fn, "_src", None)


def function_parts(fn: Any) -> tuple[Any, ...]:
    return (fn.__code__, fn.__defaults__, fn.__kwdefaults__)


def is_buffer(value: Any) -> bool:
    """Whether ``value`` is a buffer described by its bytes (:func:`buffer_snapshot`): a
    ``bytearray``, ``memoryview``, ``array.array`` or NumPy array of plain values."""
    if isinstance(value, (bytearray, memoryview)):
        return True
    kind = type(value)
    if kind.__name__ == "array" and kind.__module__ == "array":
        return True
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.ndarray) and value.dtype != object


def buffer_snapshot(value: Any) -> tuple[Any, ...]:
    """A buffer's content as a snapshot: type, layout and bytes."""
    if isinstance(value, (bytearray, memoryview)):
        return (type(value), bytes(value))
    if type(value).__name__ == "array" and type(value).__module__ == "array":
        return (type(value), value.typecode, value.tobytes())
    return (type(value), str(value.dtype), tuple(value.shape), value.tobytes())


def reduced_parts(value: Any) -> list[Any]:
    """What pickling ``value`` keeps (``__reduce_ex__(4)``, five parts, its iterators as
    lists): the whole state of a type of the pure standard library written in C.

    Raises:
        TypeError: ``value`` does not pickle (as anything its type's ``__reduce_ex__`` raises).
    """
    parts = list(value.__reduce_ex__(4))
    parts += [None] * (5 - len(parts))
    parts[3:5] = [None if p is None else list(p) for p in parts[3:5]]
    return parts


def reduced_state(value: Any) -> tuple[Any, ...]:
    """The objects :func:`reduced_parts` holds, the lists and tuples it makes opened: what a
    REDUCED read keeps (an item put, removed or replaced in place changes them)."""
    out: list[Any] = []
    todo = [reduced_parts(value)]
    while todo:
        part = todo.pop()
        if type(part) in (list, tuple):
            todo.extend(reversed(part))
            out.append(len(part))
        else:
            out.append(part)
    return tuple(out)


def _same(now: tuple[Any, ...], found: tuple[Any, ...]) -> bool:
    return len(now) == len(found) and all(a is b for a, b in zip(now, found, strict=True))


def unchanged(found: tuple[Read, ...]) -> bool:
    """Whether every read of ``found`` still finds what it found."""
    for kind, where, what, was in found:
        if kind == LOOKUP:
            if where.get(what, MISSING) is not was:
                return False
        elif kind == CELL:
            if static_reads.cell(where) is not was:
                return False
        elif kind == ITEMS:
            if not _same(items(where), was):
                return False
        elif kind == SET:
            if frozenset(where) != was:
                return False
        elif kind == SOURCE:
            if mark(where) != was:
                return False
        elif kind == BYTES:
            if buffer_snapshot(where) != was:
                return False
        elif kind == FUNCTION:
            if not _same(function_parts(where), was):
                return False
        elif kind == SLOTS:
            if not _same(tuple(getattr(where, s, MISSING) for s in what), was):
                return False
        elif kind == REDUCED:
            if not _same(reduced_state(where), was):
                return False
        elif type(where) is not was:  # TYPE
            return False
    return True
