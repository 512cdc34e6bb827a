"""What a read of the frontend found, described by content: the values of read sets.

Plain values exactly (:func:`~.namespaces.exact`). Anything else by what it is
(:func:`describe`), never by its name or address: a JIT function by its source, settings and
first line; Triton's own objects by where Triton defines them (:func:`triton_home`); a function
by its code, what it closes over and its defaults; a class by its namespace, bases, metaclass
and registrations; any other object by its class and fields, where its type's layout holds
nothing else. None where a value has no exact description. Nothing here runs code of what it
describes: what an object is, is asked of its type. The descriptions of modules, Triton's own
objects and functions are remembered across reads (:func:`remember`), a function's while its
code, defaults and what it closes over are the same.
"""

from __future__ import annotations

import abc
import collections
import enum
import functools
import gc
import hashlib
import inspect
import json
import os
import sys
import threading
import types
from typing import Any

from . import static_reads
from .namespaces import exact, language, spend, wrapped
from .static_reads import RUNS_CODE, attribute_of, in_mro, mark, one_of, program_module

#: what a lookup that found nothing finds
ABSENT: Any = static_reads.MISSING
#: how deep a description follows what functions close over and containers hold
MAX_DEPTH = 6


@functools.lru_cache(maxsize=1)
def _triton_dir() -> str:
    import triton

    return triton.__file__.rsplit("/", 1)[0] + "/"


def triton_home(value: Any) -> list[str] | None:
    """``["triton", module, qualname]`` where ``value`` is Triton's own: found under that
    name, in a module of Triton's files, and (a function) defined in them; else None. Reads
    nothing but namespaces (no code of ``value`` runs)."""
    if type(value) is types.ModuleType:
        name = value.__name__
        found = sys.modules.get(name)
        where = getattr(found, "__file__", None) or ""
        if found is value and name.split(".")[0] == "triton" and where.startswith(_triton_dir()):
            return ["triton", name, ""]
        return None
    module, qualname = attribute_of(value, "__module__"), attribute_of(value, "__qualname__")
    if module is None or qualname is None or module.split(".")[0] != "triton":
        return None
    home = sys.modules.get(module)
    if not (getattr(home, "__file__", None) or "").startswith(_triton_dir()):
        return None
    at: Any = home
    for part in qualname.split("."):
        at = attribute_of(at, part, object)
    if at is not value:
        return None
    code = attribute_of(value, "__code__", types.CodeType)
    if code is not None and not code.co_filename.startswith(_triton_dir()):
        return None
    return ["triton", module, qualname]


def triton_code(fn: Any) -> bool:
    """Whether the function ``fn``, and what it wraps (``__wrapped__``), is code of Triton's
    files (a builtin of Triton's own, not one a program made with Triton's decorator)."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    return isinstance(code, types.CodeType) and code.co_filename.startswith(_triton_dir())


@functools.lru_cache(maxsize=4096)
def code_digest(code: types.CodeType) -> str:
    """The digest of what ``code`` runs (:func:`_code`), memoized per code object."""
    text = json.dumps(_code(code), separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


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
    it has no exact description. Reads nothing but namespaces and fields: no code of
    ``value`` runs."""
    if depth > MAX_DEPTH:
        return None
    tl = language()
    jit_callable, constexpr_function, _ = static_reads.jit_classes()
    kind = type(value)
    spend(1 + len(value) if one_of(kind, (dict, collections.OrderedDict, set, frozenset)) else 1)
    if issubclass(kind, tl.constexpr):
        inner = wrapped(value)
        return None if inner is RUNS_CODE else _whole(["k", _part(inner, depth)])
    if kind is tuple or kind is list:
        return _whole([kind.__name__, [_part(v, depth) for v in value]])
    home = triton_home(value)
    if home is not None:
        return home
    if kind is types.ModuleType:
        return ["module"]
    if value is os.environ:  # (what code reads of it is read as each variable: "e" reads)
        return ["environ"]
    if issubclass(kind, jit_callable):
        if constexpr_function is not None and issubclass(kind, constexpr_function):
            inner = static_reads.python_function(value)
            function = None if inner is None else _part(inner, depth)
            return None if function is None else ["cfn", function]
        src = repr(mark(value))
        file, line = _first_line(value)
        defined = static_reads.bound(value, lambda v: _part(v, depth))
        return _whole(["jit", hashlib.sha256(src.encode()).hexdigest(), file, line, defined])
    if kind is types.FunctionType:
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
        own = _named_fields(value)
        attrs = None if own is None else [[k, _part(v, depth)] for k, v in own]
        return _whole(["fn", code_digest(value.__code__), cells, defaults, attrs])
    if issubclass(kind, type):
        return klass(value, depth)
    if kind is types.MethodType:
        return _whole(["method", _part(value.__func__, depth), _part(value.__self__, depth)])
    if one_of(
        kind, (types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType)
    ):
        return _builtin(value, depth)
    if issubclass(kind, enum.Enum):
        fields = _fields(value)
        return _whole(["member", klass(kind, depth + 1), _part(fields.get("_name_"), depth)])
    if kind is dict or kind is collections.OrderedDict:
        items = [[_part(k, depth), _part(v, depth)] for k, v in value.items()]
        return _whole(["dict" if kind is dict else "odict", items])
    if kind is types.MappingProxyType:  # (the mapping it shows, as the garbage collector's
        # walk finds it: no code runs; e.g. an inspect.Signature's parameters)
        (shown,) = gc.get_referents(value)
        return _whole(["proxy", _part(shown, depth)])
    if kind is set or kind is frozenset:  # (iterated in an order that varies by process)
        parts = [_part(v, depth) for v in value]
        return None if _holes(parts) else [kind.__name__, sorted(parts, key=repr)]
    return _object(value, kind, depth)


def _object(value: Any, kind: type, depth: int) -> Any:
    """An object by its class and every field, where its type's memory layout holds nothing
    else (:func:`~.static_reads.data_base`); a subclass of a built-in type by the value of
    that type it holds too (never through a method a subclass may override)."""
    base = static_reads.data_base(kind)
    if base is None:
        return None
    held = []  # (the value of the built-in type it subclasses, if any)
    if base is not object:
        held = [_part(static_reads.DATA_BASES[base](value), depth)]
    fields = dict(_fields(value))
    spend(len(fields))
    for name in static_reads.slot_names(kind):
        slot = in_mro(kind, name)
        if type(slot) is not types.MemberDescriptorType:
            return None
        try:
            fields[name] = slot.__get__(value)
        except AttributeError:  # (an unset slot)
            fields[name] = ABSENT
    if any(type(name) is not str for name in fields):
        return None
    rows = [[name, _part(v, depth)] for name, v in sorted(fields.items())]
    return _whole(["obj", klass(kind, depth + 1), rows, *held])


def _builtin(value: Any, depth: int) -> Any:
    """A callable written in C: by the name that finds it, or (a method bound to an object)
    by its name and the object."""
    named = static_reads.named(value)
    owner = getattr(value, "__self__", None)
    if named is not None and (owner is None or type(owner) is types.ModuleType):
        return ["builtin", named]
    if owner is not None and type(owner) is not types.ModuleType:
        return _whole(["bound", attribute_of(value, "__name__"), _part(owner, depth)])
    return None


def _fields(value: Any) -> dict[str, Any]:
    """The instance dictionary of ``value``, read without running its code ({} where none)."""
    slot = in_mro(type(value), "__dict__")
    readable = (types.GetSetDescriptorType, types.MemberDescriptorType)
    own = slot.__get__(value) if one_of(type(slot), readable) else None
    return own if type(own) is dict else {}


def _named_fields(value: Any) -> list[tuple[str, Any]] | None:
    """The instance dictionary of ``value`` by name, in order; None where a key is not a
    name (sorting it would compare objects of the program)."""
    fields = _fields(value)
    if not all(type(name) is str for name in fields):
        return None
    return sorted(fields.items(), key=lambda item: item[0])


_TYPE_DICT = type.__dict__["__dict__"]
_TYPE_BASES = type.__dict__["__bases__"]


def klass(cls: type, depth: int = 0) -> Any:
    """A class by content: Triton's and Python's own by where they are defined (only where that
    very class is found there), any other by its name, bases, metaclass, namespace (an Enum's
    members by name and value, each member of the namespace described) and, an ABC, the
    classes registered with it; None where a part has no exact description."""
    home = triton_home(cls)
    if home is not None:
        return home
    module, qualname = attribute_of(cls, "__module__"), attribute_of(cls, "__qualname__")
    if module is not None and qualname is not None and not program_module(module):
        found: Any = sys.modules.get(module)
        for part in qualname.split("."):
            found = None if found is None else _namespace(found).get(part)
        if found is not cls:
            return None
        registered = _registered(cls)  # (an ABC of Python's: what the program registered)
        return ["python", module, qualname] + ([registered] if registered else [])
    if depth > MAX_DEPTH:
        return None
    open_ = _open.__dict__.setdefault("classes", [])
    for back, outer in enumerate(reversed(open_)):
        if outer is cls:  # (a class its own members name: a method closing over it)
            return ["enclosing", back]
    open_.append(cls)
    try:
        return _program_class(cls, module, qualname, depth)
    finally:
        open_.pop()


#: the classes being described in this thread, outermost first (:func:`klass`)
_open = threading.local()


def _program_class(cls: type, module: Any, qualname: Any, depth: int) -> Any:
    space = _TYPE_DICT.__get__(cls)
    spend(len(space))
    members = []
    for name in sorted(space):
        if name in static_reads.CLASS_NOISE or name in _ENUM_NOISE:
            continue
        members.append([name, _member(space[name], cls, depth)])
    meta = type(cls)
    return _whole(
        [
            "class",
            module,
            qualname,
            [klass(b, depth + 1) for b in _TYPE_BASES.__get__(cls)],
            klass(meta, depth + 1),
            members,
            _registered(cls),
        ]
    )


def _namespace(value: Any) -> Any:
    if type(value) is types.ModuleType:
        return vars(value)
    if issubclass(type(value), type):
        return _TYPE_DICT.__get__(value)
    return {}


#: what an Enum's namespace holds besides its members and methods (made from them)
_ENUM_NOISE = frozenset(
    {"_member_map_", "_value2member_map_", "_member_names_", "_unhashable_values_",
     "_member_type_", "_new_member_", "_use_args_", "_value_repr_", "_sort_order_",
     "_generate_next_value_", "_missing_", "_ignore_", "_order_"}
)  # fmt: skip


def _member(value: Any, cls: type, depth: int) -> Any:
    """A member of ``cls``'s namespace: plain values exactly, an Enum member of ``cls`` by its
    value, methods and other members described."""
    plain = exact(value)
    if plain is not None:
        return plain
    kind = type(value)
    if kind is cls and issubclass(kind, enum.Enum):
        return _whole(["value", exact(_fields(value).get("_value_"))])
    if kind is types.MemberDescriptorType and value.__objclass__ is cls:  # (a slot of cls)
        return ["slot", value.__name__]
    if one_of(kind, (staticmethod, classmethod)):
        return _whole([kind.__name__, _part(value.__func__, depth)])
    if kind is property:
        return _whole(["property", [_part(f, depth) for f in (value.fget, value.fset, value.fdel)]])
    return _part(value, depth)


def _registered(cls: type) -> Any:
    """The classes registered with the ABC ``cls`` (by name), [] for any other class, None
    where they cannot be read."""
    if not issubclass(type(cls), abc.ABCMeta):
        return []
    try:
        import _abc  # type: ignore[import-not-found]  # (CPython's: the registry of an ABC)

        registry = _abc._get_dump(cls)[0]
    except (ImportError, AttributeError, TypeError):
        return None
    names = []
    for ref in registry:
        held = ref()
        if held is not None:
            names.append(f"{attribute_of(held, '__module__')}:{attribute_of(held, '__qualname__')}")
    return sorted(names)


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


# -- wants remembered across reads ---------------------------------------------------------------
#: the wants of objects whose description follows from what they are (modules: their
#: attributes are reads of their own; Triton's objects: Triton's files are in every key) or
#: from that and a stamp (:func:`_stamp`), by id: (the object, its stamp then or None, its
#: want)
_wants: dict[int, tuple[Any, Any, str]] = {}
#: the most objects :data:`_wants` keeps (then it starts again)
MAX_KEPT = 4096


def _keep(value: Any, stamp: Any, want: str) -> None:
    if len(_wants) >= MAX_KEPT:
        _wants.clear()
    _wants[id(value)] = (value, stamp, want)


def _stamp(value: Any, kind: str) -> tuple[Any, ...]:
    """What the description of ``value`` (of ``kind``) follows from besides its identity: a
    JIT function's source, settings and first line; a function's (a ``constexpr_function``'s
    function's) code object, defaults and the objects it closes over (what they hold is
    read where it is used)."""
    if kind == "jit":
        return (kind, mark(value), getattr(value, "starting_line_number", None))
    if kind == "cfn":
        value = static_reads.python_function(value)
    cells = []
    for cell in value.__closure__ or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:
            cells.append(ABSENT)
    fields = _named_fields(value) or []  # (a function's own attributes: ``f.scale``)
    names, held = [k for k, _ in fields], [v for _, v in fields]
    return (kind, value.__code__, value.__defaults__, value.__kwdefaults__, *cells, *names, *held)


def _same(then: tuple[Any, ...], now: tuple[Any, ...]) -> bool:
    """Whether two stamps are the same: each part the same object, or equal plain values
    (compared as :func:`exact` describes them: no ``__eq__`` of the program
    runs, whatever a closure holds now)."""
    if len(then) != len(now):
        return False
    for a, b in zip(then, now, strict=True):
        if a is b:
            continue
        if type(a) is not type(b):
            return False
        plain = exact(a)
        if plain is None or plain != exact(b):
            return False
    return True


def remembered(value: Any) -> str | None:
    """The want :func:`remember` kept of ``value``, where what it follows from is unchanged
    (its stamp the same: :func:`_same`); else None."""
    known = _wants.get(id(value))
    if known is not None and known[0] is value:
        if known[1] is None or _same(known[1], _stamp(value, known[1][0])):
            return known[2]
    return None


def remember(value: Any, desc: Any, want: str) -> None:
    """Keep ``want``, the digest of ``desc`` (:func:`describe` of ``value``), where it follows
    from what ``value`` is (a module, Triton's own) or from that and its stamp (a JIT
    function, a function, a ``constexpr_function``)."""
    if type(value) is types.ModuleType or desc[0] == "triton":
        _keep(value, None, want)
    elif desc[0] in ("jit", "fn", "cfn"):
        _keep(value, _stamp(value, desc[0]), want)
