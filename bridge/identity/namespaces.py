"""Reading an object's attributes without running its code: where Python's own lookup finds
them, in the namespaces (an object's, its class's and their bases', a metaclass's), bound as
Python binds them where that runs no code of the program; and the Python function a callable
runs (:func:`python_function`).

A function becomes a method, a static or class method its function, a descriptor written in C
(a slot, a field of a built-in type) or defined by Triton (in every key) gives what it gives,
an Enum member's ``name`` and ``value`` are its fields. An attribute only code would give (a
property of the program, a ``__getattr__``, a type that reads attributes its own way) is
:data:`RUNS_CODE`, and no code runs.

Invariant: nothing here calls code of the program: types are read through ``type``'s own
descriptors, namespaces as the dictionaries they are.
"""

from __future__ import annotations

import enum
import types
from typing import Any

from .guard import triton_type
from .static_reads import jit_classes

#: what an attribute only code would give finds (no code runs)
RUNS_CODE: Any = type("RunsCode", (), {"__repr__": lambda self: "<computed by code>"})()

_TYPE_DICT = type.__dict__["__dict__"]
_TYPE_MRO = type.__dict__["__mro__"]
#: descriptors written in C whose ``__get__`` runs no code of the program
_C_DESCRIPTORS = frozenset(
    {types.MemberDescriptorType, types.GetSetDescriptorType, types.MethodDescriptorType,
     types.WrapperDescriptorType, types.ClassMethodDescriptorType, types.BuiltinFunctionType}
)  # fmt: skip
_MISSING: Any = object()
#: an Enum member's ``name`` and ``value`` (Enum's own properties): the fields they return
_ENUM_FIELDS = {
    id(enum.Enum.__dict__[n]): (enum.Enum.__dict__[n], f"_{n}_") for n in ("name", "value")
}


def in_mro(cls: type, name: str) -> Any:
    """``name`` as the classes of ``cls``'s method resolution order hold it, raw (no
    descriptor called), or a sentinel where none does."""
    for base in _TYPE_MRO.__get__(cls):
        space = _TYPE_DICT.__get__(base)
        if name in space:
            return space[name]
    return _MISSING


def _overrides_access(kind: type) -> bool:
    """Whether objects of ``kind`` read attributes through code of their own."""
    found = in_mro(kind, "__getattribute__")
    return (
        found is not object.__getattribute__
        and found is not type.__getattribute__
        and (found is not types.ModuleType.__getattribute__)
    )


def attribute(value: Any, name: str) -> Any:
    """``getattr(value, name)`` where it runs no code but Python's own lookup: the attribute
    itself, :data:`RUNS_CODE` where only code would give it (a property, a descriptor or a
    ``__getattr__`` of the program's, a type that reads attributes its own way), and
    ``AttributeError`` where there is none. Enum members' ``name`` and ``value`` are their
    fields."""
    kind = type(value)
    if _overrides_access(kind):
        return RUNS_CODE
    if kind is types.ModuleType:
        space = vars(value)
        if name in space:
            return space[name]
        if "__getattr__" in space:
            return RUNS_CODE
        raise AttributeError(name)
    if issubclass(kind, type):  # a class: its metaclass's data descriptors first, then its own
        meta = in_mro(kind, name)
        if meta is not _MISSING and _is_data(meta):
            return _bound(meta, value, kind)
        own = in_mro(value, name)
        if own is not _MISSING:
            return _bound(own, None, value)
        if meta is not _MISSING:
            return _bound(meta, value, kind)
        if in_mro(kind, "__getattr__") is not _MISSING:
            return RUNS_CODE
        raise AttributeError(name)
    raw = in_mro(kind, name)
    if raw is not _MISSING and _is_data(raw):
        return _bound(raw, value, kind)
    slot = in_mro(kind, "__dict__")
    if slot is not _MISSING and type(slot) is not types.GetSetDescriptorType:
        return RUNS_CODE  # (a ``__dict__`` of the program's own)
    own = slot.__get__(value, kind) if slot is not _MISSING else None
    if type(own) is dict and name in own:
        return own[name]
    if raw is not _MISSING:
        return _bound(raw, value, kind)
    if in_mro(kind, "__getattr__") is not _MISSING:
        return RUNS_CODE
    raise AttributeError(name)


def _is_data(raw: Any) -> bool:
    kind = type(raw)
    return in_mro(kind, "__set__") is not _MISSING or in_mro(kind, "__delete__") is not _MISSING


def _bound(raw: Any, instance: Any, owner: type) -> Any:
    """What ``raw``, found in a class, gives ``instance`` (None: the class ``owner`` itself)."""
    kind = type(raw)
    if in_mro(kind, "__get__") is _MISSING:
        return raw
    if kind is types.FunctionType:
        return raw if instance is None else types.MethodType(raw, instance)
    if kind is staticmethod:
        return raw.__func__
    if kind is classmethod:
        return types.MethodType(raw.__func__, owner if instance is None else type(instance))
    if kind in _C_DESCRIPTORS:
        return raw.__get__(instance, owner)
    if triton_type(kind):  # (Triton's own descriptor: its code is in every key)
        return raw.__get__(instance, owner)
    field = _ENUM_FIELDS.get(id(raw))
    if field is not None and raw is field[0] and issubclass(type(instance), enum.Enum):
        slot = in_mro(type(instance), "__dict__")
        own = slot.__get__(instance) if type(slot) is types.GetSetDescriptorType else None
        if type(own) is dict and field[1] in own:
            return own[field[1]]
    return RUNS_CODE


def python_function(fn: Any) -> types.FunctionType | None:
    """The Python function that runs when ``fn`` is called or generated (a JIT function's or a
    ``constexpr_function``'s ``fn``, a method's function, ``fn`` itself), None where none."""
    if type(fn) is types.MethodType:
        fn = fn.__func__
    jit_callable = jit_classes()[0]
    if issubclass(type(fn), jit_callable):  # (bound to an object: its ``__func__``'s)
        fn = vars(fn).get("fn") or vars(fn).get("__func__")
    if issubclass(type(fn), jit_callable):
        fn = vars(fn).get("fn")
    return fn if type(fn) is types.FunctionType else None
