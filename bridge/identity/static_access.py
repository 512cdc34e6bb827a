"""Reading an object's items, and calling the built-ins kernel code is offered, without running
code of the program: what a check of a stored read set (:mod:`.read_sets`) may do with
whatever its reads find, and what the witness (:mod:`.frontend_hooks`) compares each read it
records with (attributes: :mod:`.admit`).

An item is read only of a tuple, list or dict whose keys are plain; ``getattr`` and
``hasattr`` read as :func:`~.static_access.attribute` does, ``isinstance`` only of a class that
checks by its bases, the rest only on plain values, their result bounded. Where that cannot be,
the read finds :data:`~.static_reads.RUNS_CODE` and no code runs.
"""

from __future__ import annotations

import builtins
import enum
import types
from collections.abc import Callable, Sequence
from typing import Any

from ..entries.metadata import BUILTIN_NAMES
from . import static_reads
from .exact_values import exact, language, triton_home, unwrap
from .guard import triton_type
from .static_reads import NOT_FOUND, RUNS_CODE, in_mro

#: the built-ins Triton's code generator offers kernel code (:data:`~bridge.entries.metadata.BUILTIN_NAMES`)
BUILTINS: dict[str, Callable[..., Any]] = {n: vars(builtins)[n] for n in BUILTIN_NAMES}
#: the most items a built-in's result holds (``range``, ``list``) or a dict read holds
MAX_RESULT = 4096


def item(value: Any, key: Any) -> Any:
    """``value[key]`` for a tuple, list or dict whose keys are plain (nothing else is read:
    :data:`RUNS_CODE`)."""
    kind = type(value)
    if kind in (tuple, list, language().tuple) and type(key) in (int, bool):
        return value.values[key] if kind is language().tuple else value[key]
    if kind is dict and exact(key) is not None and len(value) <= MAX_RESULT:
        if all(type(k) in (int, str, bool, float, bytes, type(None)) for k in value):
            return value[key]
    return RUNS_CODE


def builtin(name: str, args: Sequence[Any]) -> Any:
    """The built-in ``name`` of :data:`BUILTINS` on ``args`` (unwrapped), made without running
    code of the program: ``getattr`` and ``hasattr`` read as :func:`~.attribute` does,
    ``isinstance`` only of a class that checks by its bases, and the rest only on plain values,
    their result bounded (:data:`MAX_RESULT` items). :data:`RUNS_CODE` where that cannot
    be."""
    args = [unwrap(a) for a in args]
    if name in ("getattr", "hasattr"):
        try:
            found = attribute(args[0], args[1])
        except AttributeError:
            if name == "hasattr":
                return False
            if len(args) > 2:
                return args[2]
            raise
        return RUNS_CODE if found is RUNS_CODE else (True if name == "hasattr" else found)
    if name == "isinstance":
        kinds = args[1] if type(args[1]) is tuple else (args[1],)
        if not all(type(k) is type or _triton_class(k) for k in kinds):
            return RUNS_CODE  # (a metaclass's own ``__instancecheck__``: an ABC, an Enum...)
        if in_mro(type(args[0]), "__class__") is not object.__dict__["__class__"]:
            return RUNS_CODE
        return isinstance(args[0], kinds)
    if any(exact(a) is None for a in args):
        return RUNS_CODE
    if name == "range":
        made = range(*args)
        return made if len(made) <= MAX_RESULT else RUNS_CODE
    return BUILTINS[name](*args)


def _triton_class(value: Any) -> bool:
    return issubclass(type(value), type) and triton_home(value) is not None


# -- attributes -------------------------------------------------------------------------------
#: descriptors written in C whose ``__get__`` runs no code of the program
_C_DESCRIPTORS = frozenset(
    {types.MemberDescriptorType, types.GetSetDescriptorType, types.MethodDescriptorType,
     types.WrapperDescriptorType, types.ClassMethodDescriptorType, types.BuiltinFunctionType}
)  # fmt: skip
#: an Enum member's ``name`` and ``value`` (Enum's own properties): the fields they return
_ENUM_FIELDS = {
    id(enum.Enum.__dict__[n]): (enum.Enum.__dict__[n], f"_{n}_") for n in ("name", "value")
}


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
        if meta is not NOT_FOUND and _is_data(meta):
            return _bound(meta, value, kind)
        own = in_mro(value, name)
        if own is not NOT_FOUND:
            return _bound(own, None, value)
        if meta is not NOT_FOUND:
            return _bound(meta, value, kind)
        if in_mro(kind, "__getattr__") is not NOT_FOUND:
            return RUNS_CODE
        raise AttributeError(name)
    raw = in_mro(kind, name)
    if raw is not NOT_FOUND and _is_data(raw):
        return _bound(raw, value, kind)
    slot = in_mro(kind, "__dict__")
    if slot is not NOT_FOUND and type(slot) is not types.GetSetDescriptorType:
        return RUNS_CODE  # (a ``__dict__`` of the program's own)
    own = slot.__get__(value, kind) if slot is not NOT_FOUND else None
    if type(own) is dict and name in own:
        return own[name]
    if raw is not NOT_FOUND:
        return _bound(raw, value, kind)
    if in_mro(kind, "__getattr__") is not NOT_FOUND:
        return RUNS_CODE
    raise AttributeError(name)


def _is_data(raw: Any) -> bool:
    kind = type(raw)
    return in_mro(kind, "__set__") is not NOT_FOUND or in_mro(kind, "__delete__") is not NOT_FOUND


def _bound(raw: Any, instance: Any, owner: type) -> Any:
    """What ``raw``, found in a class, gives ``instance`` (None: the class ``owner`` itself)."""
    kind = type(raw)
    if in_mro(kind, "__get__") is NOT_FOUND:
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
    jit_callable = static_reads.jit_classes()[0]
    if issubclass(type(fn), jit_callable):  # (bound to an object: its ``__func__``'s)
        fn = vars(fn).get("fn") or vars(fn).get("__func__")
    if issubclass(type(fn), jit_callable):
        fn = vars(fn).get("fn")
    return fn if type(fn) is types.FunctionType else None
