"""How the describer of :mod:`.jit` reads values without running them: a code object's text,
the global names it spells, closure cells, an object's fields and namespaces, and whether a
module or class is Triton's or Python's own (described by name, not by content).

Nothing here calls a property or a ``__repr__`` that shows an address; a value that cannot be
read this way is left for :mod:`.jit` to report as undescribable.
"""

from __future__ import annotations

import functools
import hashlib
import sys
import types
from typing import Any

#: modules whose attributes Triton does not follow (its language, and what it treats as such)
OPAQUE_MODULES = ("triton", "math", "copy", "builtins")
#: values described by their ``repr``
PLAIN = (int, float, str, bytes, bool, type(None), complex)


@functools.lru_cache(maxsize=1024)
def code_text(code: types.CodeType) -> str:
    """A digest of what a code object runs (its instructions, constants, names and nested code;
    not its file or line numbers)."""
    consts: list[Any] = []
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            consts.append(code_text(c))
        elif isinstance(c, frozenset):  # (its iteration order varies between processes)
            consts.append(sorted(repr(x) for x in c))
        else:
            consts.append(repr(c))
    doc = [
        code.co_code.hex(),
        consts,
        code.co_names,
        code.co_varnames,
        code.co_freevars,
        code.co_cellvars,
        code.co_argcount,
        code.co_posonlyargcount,
        code.co_kwonlyargcount,
        code.co_flags,
    ]
    return hashlib.sha256(repr(doc).encode()).hexdigest()


def global_names(code: types.CodeType) -> set[str]:
    """The names ``code`` and the code nested in it may look up as globals."""
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= global_names(c)
    return names


def cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def opaque_module(name: str) -> bool:
    """Whether the module ``name`` is described by its name alone: Triton's language and
    Python's standard library (their contents are installed files and the process's state,
    such as ``os.environ``, which no kernel key holds)."""
    top = name.split(".")[0]
    return top in OPAQUE_MODULES or top in sys.stdlib_module_names


def opaque(cls: type) -> bool:
    """Whether the class ``cls`` is described by its name alone (see :func:`opaque_module`)."""
    return opaque_module(getattr(cls, "__module__", "") or "")


def is_member(value: Any) -> bool:
    """Whether a class attribute is described as a value (not a C-level slot or wrapper)."""
    return not isinstance(
        value,
        (
            types.MemberDescriptorType,
            types.GetSetDescriptorType,
            types.WrapperDescriptorType,
            types.MethodDescriptorType,
        ),
    )


def descriptor(value: Any) -> Any:
    return ["descriptor", type(value).__name__, getattr(value, "__name__", None)]


def fields(value: Any) -> dict[str, Any] | None:
    """The fields of ``value`` (its ``__dict__`` and slots), or None where its state may be
    elsewhere (an instance of a C type)."""
    own = getattr(value, "__dict__", None)
    fields = dict(own) if isinstance(own, dict) else None
    classes = [c for c in type(value).__mro__ if c is not object]
    if fields is None and not all("__slots__" in vars(c) for c in classes):
        return None
    fields = fields or {}
    for cls in classes:
        slots = vars(cls).get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if isinstance(slot, str) and slot not in ("__dict__", "__weakref__"):
                fields[slot] = getattr(value, slot, MISSING_FIELD)
    return fields


MISSING_FIELD = "<unset>"


def safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception as e:  # (the call is then not stored: lowered as before)
        kind = name_of(type(value))
        raise ValueError(f"{kind} {name_of(value)} has no repr: {e!r:.80}") from e


def namespaces(value: Any) -> list[Any]:
    """Where attributes of ``value`` are found: its own namespace, then its classes'."""
    own = getattr(value, "__dict__", None)
    spaces = [own] if isinstance(own, (dict, types.MappingProxyType)) else []
    if isinstance(value, types.ModuleType):
        return spaces
    classes = value.__mro__ if isinstance(value, type) else type(value).__mro__
    spaces += [vars(c) for c in classes if c is not object and c is not value]
    return spaces


def parameters(inner: Any) -> frozenset[str]:
    """The parameter names of the Python function ``inner``."""
    code = getattr(inner, "__code__", None)
    if code is None:
        return frozenset()
    count = code.co_argcount + code.co_kwonlyargcount
    return frozenset(code.co_varnames[:count])


def cells(inner: Any) -> dict[str, Any]:
    """The closure cells of the Python function ``inner``, by name."""
    code = getattr(inner, "__code__", None)
    cells = getattr(inner, "__closure__", None) or ()
    if code is None:
        return {}
    return dict(zip(code.co_freevars, cells, strict=False))


def name_of(value: Any) -> str:
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    return f"{module}:{qualname}" if isinstance(qualname, str) else type(value).__name__


def plain_value(value: Any) -> Any:
    if isinstance(value, PLAIN):
        return repr(value)
    if isinstance(value, (tuple, list, set, frozenset)):
        return sorted(repr(v) for v in value)
    return name_of(value)
