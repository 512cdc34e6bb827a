"""What a call the witness cannot make again can read (a ``constexpr_function`` given a tensor,
a function of the program's own called by one): the globals and closure variables its code
names, its defaults, the module attributes its code names, and so on through the functions and
the classes' methods found that way, recorded as rows of the read set (:mod:`.read_sets`), each
a read :func:`~.read_sets.read` makes again.

Recorded at a compile only (by :mod:`.witness`); a hit makes the rows again through
:mod:`.read_sets`, never through this module. Such a read set is partial (code may reach values
by no name): it ends with the IR read, which the frontend vouches for.
"""

from __future__ import annotations

import types
from typing import Any

from . import static_reads
from .admit import defaults, follow, generated_attribute, scope_value
from .exact_values import triton_home
from .static_reads import python_function

#: standard library modules whose functions depend only on their arguments
PURE_STDLIB = frozenset(
    {"math", "cmath", "operator", "functools", "itertools", "enum", "dataclasses", "typing",
     "types", "collections", "abc", "numbers", "fractions", "decimal", "re", "string", "copy",
     "builtins", "textwrap", "struct", "statistics", "heapq", "bisect", "keyword", "json",
     "_operator", "_functools", "_collections", "_collections_abc", "_abc", "_decimal",
     "_pydecimal", "_struct", "_heapq", "_bisect", "_json", "_sre", "sre_compile",
     "sre_parse", "sre_constants", "_string", "contextlib", "warnings", "_warnings", "weakref",
     "_weakref", "_weakrefset", "reprlib", "copyreg"}
)  # fmt: skip
#: how deep :func:`reachable` follows the functions a function names
MAX_REACH = 4


def reachable(
    recorder: Any, fn: Any, module_map: dict[str, Any], depth: int = 0, done: Any = None
) -> None:
    """Record in ``recorder`` (a :class:`~.witness.Recorder`) what the code of ``fn`` (a
    function a call of which the witness cannot make again) can read: each global and closure
    variable its code names, its defaults and, of each module among them, each attribute its
    code names; and so on for each function of the program's own found that way (to
    :data:`MAX_REACH` levels). Every row is a read :func:`~.read_sets.read` makes again."""
    done = set() if done is None else done
    parent = recorder.origin(fn)
    inner = python_function(fn)
    if parent is None or inner is None or id(inner) in done or depth > MAX_REACH:
        return
    done.add(id(inner))
    recorder.add(parent, "d", "", defaults(inner))
    _, spelled, _ = static_reads.code_facts(inner.__code__)
    names = sorted(spelled | set(inner.__code__.co_freevars))
    found = []
    for name in names:
        value = scope_value(fn, name, module_map)
        row = recorder.add(parent, "g", name, value)
        found.append(value)
        if row is not None and isinstance(value, types.ModuleType):
            space = vars(follow(value, module_map))
            for attr in names:
                if attr in space:
                    found.append(generated_attribute(value, attr, module_map))
                    recorder.add(row, "a", attr, found[-1])
    for value in found:
        if isinstance(value, type):
            members(recorder, value, names, module_map, depth, done)
        elif python_function(value) is not None and triton_home(value) is None:
            reachable(recorder, value, module_map, depth + 1, done)


#: the methods Python calls on a class or its objects by itself
IMPLICIT = ("__init__", "__new__", "__post_init__", "__call__")


def members(
    recorder: Any,
    cls: type,
    names: list[str],
    module_map: dict[str, Any],
    depth: int,
    done: Any,
) -> None:
    """For :func:`reachable`: the methods of a class of the program's own that code names
    (or Python calls, :data:`IMPLICIT`), found as its attributes, and what they can read."""
    row = recorder.origin(cls)
    if row is None or triton_home(cls) is not None:
        return
    if str(getattr(cls, "__module__", "")).split(".")[0] in PURE_STDLIB:
        return
    for name in sorted(set(names) | set(IMPLICIT)):
        member = getattr(cls, name, None)
        if python_function(member) is not None:
            recorder.add(row, "a", name, generated_attribute(cls, name, module_map))
            reachable(recorder, member, module_map, depth + 1, done)
