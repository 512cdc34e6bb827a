"""A kernel's code and constexprs as keys hold them: what Triton's own cache key covers.

:func:`identity` is the digest of a JIT function's *own* code: its source, decorator settings,
file (as the import root names it) and first line, and the same of every JIT function its source
names as a global or closure variable, transitively (found by the names the source spells: a
superset of the helpers its syntax calls). :func:`constant` describes a constexpr by content
(:func:`~.exact_values.describe`). Nothing here has to be complete: what else the frontend reads
is the kernel's read set (:mod:`bridge.readsets`), checked before a cached kernel is used.
"""

from __future__ import annotations

import hashlib
from typing import Any

from .exact_values import describe
from .namespaces import exact
from .static_reads import SETTINGS, bound, is_jit, mark, relative_path, source, spelled

__all__ = ["SETTINGS", "constant", "identity", "is_jit", "mark", "source"]

#: the most JIT functions one identity follows
MAX_HELPERS = 256


def _own(fn: Any, strict: bool) -> list[Any]:
    """What :func:`identity` holds of one JIT function: its module and name, source, settings,
    file and first line, and its parameters' defaults and annotations as defined."""
    code = getattr(getattr(fn, "fn", None), "__code__", None)
    line = getattr(fn, "starting_line_number", None)
    if line is None and code is not None:
        line = code.co_firstlineno
    file = relative_path(code.co_filename) if code is not None else None
    return [getattr(fn, "__module__", None), getattr(fn, "__qualname__", None),
            repr(mark(fn)), file, line, bound(fn, constant if strict else _loose)]  # fmt: skip


def _loose(value: Any) -> Any:
    try:
        return constant(value)
    except (ValueError, RecursionError):
        return ["object"]


def _helpers(fn: Any) -> list[Any]:
    """The JIT functions the source of ``fn`` names as closure variables or globals."""
    inner = getattr(fn, "fn", None)
    text = source(fn)
    if inner is None or not isinstance(text, str):
        return []
    cells = dict(zip(inner.__code__.co_freevars, inner.__closure__ or (), strict=False))
    scope = inner.__globals__
    found = []
    for name in sorted(spelled(text)):
        try:
            value = cells[name].cell_contents if name in cells else scope.get(name)
        except ValueError:  # (an empty cell)
            continue
        if is_jit(value):
            found.append(value)
    return found


def identity(fn: Any, strict: bool = False) -> str:
    """The identity of the JIT function ``fn`` (see the module docstring): a sha256 digest. A
    default or annotation with no description by content is an object only (the read set
    decides), or with ``strict`` a ValueError (a key that must tell every value apart)."""
    rows: list[list[Any]] = []
    seen, todo = {id(fn)}, [fn]
    while todo and len(rows) < MAX_HELPERS:
        one = todo.pop()
        rows.append(_own(one, strict))
        for helper in _helpers(one):
            if id(helper) not in seen:
                seen.add(id(helper))
                todo.append(helper)
    return hashlib.sha256(repr(rows).encode()).hexdigest()


def constant(value: Any) -> Any:
    """``value``, a constexpr, as plain data whose ``repr`` tells it from every value the
    frontend could compile differently: exactly where it is plain (a float by its bits, so a
    NaN's sign counts), else by content (:func:`~.exact_values.describe`).

    Raises:
        ValueError: ``value`` has no description by content (the message says what).
    """
    plain = exact(value)
    if plain is not None:
        return plain
    if is_jit(value):
        return ["jit", identity(value, strict=True)]
    described = describe(value)
    if described is None:
        raise ValueError(f"{type(value).__qualname__} has no description by content")
    return described
