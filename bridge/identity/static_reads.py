"""Reading code and values without running them: what a code object runs and names, what a
JIT function's source spells (:func:`spelled`: a superset of what it reads), its source and
settings, whether an object's state is all in its fields, attributes read without running code,
whether a module is the program's, and a source file's path as the import root names it
(:func:`relative_path`); plain values as keys hold them (:func:`plain_text`).

Nothing here calls a property, a ``__repr__`` or any other code of the value read: every
function answers from the value's own tables (its ``__dict__``, slots, code object, the type's
layout) or says it cannot (None, False).
"""

from __future__ import annotations

import dis
import enum
import functools
import hashlib
import os
import re
import struct
import sys
import types
import unicodedata
from typing import Any

#: bases whose instances' state the describer reads through the value itself, each with the
#: base's own way to that state (never a method a subclass overrides: a ``float`` whose
#: ``__float__`` lies is compiled by the value it holds)
DATA_BASES: dict[type, Any] = {
    int: int.__int__, float: float.__float__,
    complex: lambda v: complex(complex.real.__get__(v), complex.imag.__get__(v)),
    str: str.__str__, bytes: lambda v: bytes.__getitem__(v, slice(None)),
    tuple: lambda v: tuple.__getitem__(v, slice(None)), frozenset: frozenset.copy,
    list: list.copy, dict: dict.copy, set: set.copy, object: None,
}  # fmt: skip
#: what a class's namespace holds that is not its behaviour
CLASS_NOISE = frozenset(
    {"__dict__", "__weakref__", "__module__", "__qualname__", "__doc__", "__firstlineno__",
     "__static_attributes__", "__annotate__", "__orig_bases__", "__parameters__",
     "__slotnames__", "__abstractmethods__", "_abc_impl", "__dataclass_fields__",
     "__dataclass_params__"}
)  # fmt: skip
_IMPORT = frozenset(dis.opmap[name] for name in ("IMPORT_NAME", "IMPORT_FROM") if name in dis.opmap)


#: values described by type and text (:func:`plain_text`; exact types only: a subclass may
#: behave otherwise)
PLAIN = (int, float, str, bytes, bool, type(None), complex)


def plain_text(value: Any) -> str:
    """A plain value (of :data:`PLAIN`, or a tuple or frozenset of them, as a code object's
    constants are) as text that tells it from every other (see the module docstring). The text
    of a float or a complex starts with its kind, which no ``repr`` of another plain value
    does."""
    kind = type(value)
    if kind is float:
        return "float:" + struct.pack("<d", value).hex()
    if kind is complex:
        return "complex:" + struct.pack("<dd", value.real, value.imag).hex()
    if kind is tuple:
        return "(" + "".join(plain_text(v) + ", " for v in value) + ")"
    if kind is frozenset:  # (its iteration order varies between processes)
        return f"frozenset({sorted(plain_text(v) for v in value)!r})"
    return repr(value)


@functools.lru_cache(maxsize=4096)
def code_facts(code: types.CodeType) -> tuple[str, frozenset[str], bool]:
    """What a code object runs, as a digest (its instructions, constants, names and nested code;
    not its file or line numbers), every name it and the code nested in it spell (globals and
    attributes alike), and whether it imports a module."""
    consts: list[Any] = []
    names = set(code.co_names)
    imports = any(op in _IMPORT for op in code.co_code[::2])
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            digest, inner, inner_imports = code_facts(c)
            consts.append(digest)
            names |= inner
            imports = imports or inner_imports
        else:
            consts.append(plain_text(c))
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
    return hashlib.sha256(repr(doc).encode()).hexdigest(), frozenset(names), imports


# -- a JIT function's source ------------------------------------------------------------------
_QUOTED = r"""(?:'''[\s\S]*?'''|\"\"\"[\s\S]*?\"\"\"|'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")"""
#: an f-string (kept: its expressions are code), another string literal or a comment (dropped)
_LITERAL = re.compile(
    rf"(?P<f>(?<!\w)(?:[fF][rR]?|[rR][fF]){_QUOTED})"
    rf"|(?<!\w)(?:[rRbBuU]|[bB][rR]|[rR][bB])?{_QUOTED}|#[^\n]*"
)
#: a Python identifier, ASCII or not (a letter or underscore, then word characters)
_NAME = re.compile(r"[^\W\d]\w*")


@functools.lru_cache(maxsize=512)
def spelled(src: str) -> frozenset[str]:
    """Every name a JIT function's source spells outside string literals and comments: a
    superset of the names and attributes its syntax reads, found without parsing; each as
    Python reads it (NFKC-normalized: ``ﬁ`` is ``fi``, as in code objects)."""
    found = _NAME.findall(_LITERAL.sub(r"\g<f>", src))  # (f-strings kept)
    return frozenset(unicodedata.normalize("NFKC", name) for name in found)


@functools.lru_cache(maxsize=1)
def jit_classes() -> tuple[Any, Any, Any]:
    from triton.runtime import jit

    return (
        getattr(jit, "JITCallable", jit.JITFunction),
        getattr(jit, "ConstexprFunction", None),
        jit.KernelInterface,
    )


def is_jit(value: Any) -> bool:
    """Whether ``value`` is a Triton JIT function (``constexpr_function`` included)."""
    return issubclass(type(value), jit_classes()[0])


# -- JIT functions ---------------------------------------------------------------------------
#: the decorator settings that change what is compiled but not Triton's ``cache_key``
SETTINGS = ("noinline", "debug", "do_not_specialize", "do_not_specialize_on_alignment")


def source(fn: Any) -> Any:
    """The source of the JIT function ``fn``, as Triton's frontend parses it."""
    try:
        return fn.src
    except AttributeError:
        return getattr(fn, "_src", None)


def mark(fn: Any) -> tuple[Any, ...]:
    """The source and decorator settings of the JIT function ``fn`` as they are now."""
    found: list[Any] = [source(fn)]
    for s in SETTINGS:
        value: Any = getattr(fn, s, None)
        kind = type(value)
        found.append(tuple(value) if kind is list else frozenset(value) if kind is set else value)
    return tuple(found)


def bound(fn: Any, part: Any) -> list[Any] | None:
    """What Triton takes of the JIT function ``fn`` as it was defined: the module and
    qualified name it names what it generates by, and its parameters' default values and
    annotations as the ``def`` bound them (``part`` describes each); None where one cannot be
    read without running code."""
    names = [attribute(fn, n) for n in ("__module__", "__qualname__")]
    inner = attribute(fn, "fn")
    if RUNS_CODE in names or type(inner) is not types.FunctionType:
        return None
    kw = inner.__kwdefaults__ or {}
    notes = inner.__annotations__
    return [[part(n) for n in names], [part(v) for v in inner.__defaults__ or ()],
            [[k, part(kw[k])] for k in sorted(kw)], [[k, part(notes[k])] for k in notes]]  # fmt: skip


# -- objects ---------------------------------------------------------------------------------
#: a field that has no value (an unset slot), or a lookup that found nothing
MISSING = "<unset>"
_WORD = 8


#: a class's own tables, read through ``type``'s descriptors (never a metaclass's)
_TYPE = {n: type.__dict__[n] for n in ("__base__", "__basicsize__", "__weakrefoffset__",
         "__dictoffset__", "__mro__", "__dict__")}  # fmt: skip


def _of(cls: type, name: str) -> Any:
    return _TYPE[name].__get__(cls)


def one_of(kind: type, kinds: Any) -> bool:
    """Whether ``kind`` is one of the classes ``kinds``, by identity (``kind in kinds`` would
    ask a metaclass of the program's for its equality)."""
    return any(kind is k for k in kinds)


def _own_slots(cls: type) -> list[str]:
    slots = _of(cls, "__dict__").get("__slots__", ())
    if type(slots) is str:
        return [slots]
    return [s for s in slots if type(s) is str] if one_of(type(slots), (tuple, list)) else []


def _adds_only_fields(cls: type) -> bool:
    """Whether ``cls`` adds nothing to its base's memory layout but its own slots and the
    pointers of ``__dict__`` and ``__weakref__``: all its instances' state is in fields."""
    base = _of(cls, "__base__")
    if base is None:
        return False
    size, base_size = _of(cls, "__basicsize__"), _of(base, "__basicsize__")
    grown = size - base_size
    slots = [s for s in _own_slots(cls) if s not in ("__dict__", "__weakref__")]
    grown -= _WORD * len(slots)
    for offset in (_of(cls, "__weakrefoffset__"), _of(cls, "__dictoffset__")):
        if offset > 0 and base_size <= offset < size:
            grown -= _WORD
    return grown == 0


#: :func:`data_base` of classes met, by id: (the class, kept alive; its base)
_bases: dict[int, tuple[type, type | None]] = {}


def data_base(cls: type) -> type | None:
    """The built-in base whose value holds the state of ``cls``'s instances besides their
    fields (``object``: none, ``int`` for a subclass of ``int``, ...), or None where an
    instance may hold state that no field shows (a type written in C, or a subclass of one:
    ``functools.partial``, ``random.Random``, a pybind11 class). Nothing of ``cls`` runs (no
    metaclass's hash or equality: classes are told apart by identity)."""
    known = _bases.get(id(cls))
    if known is not None and known[0] is cls:
        return known[1]
    at: type | None = cls
    while at is not None and not any(at is base for base in DATA_BASES):
        at = _of(at, "__base__") if _adds_only_fields(at) else None
    if len(_bases) > 4096:
        _bases.clear()
    _bases[id(cls)] = (cls, at)
    return at


def slot_names(kind: type) -> tuple[str, ...]:
    """The slots of instances of ``kind`` (for reading them again)."""
    return tuple(
        s
        for cls in _of(kind, "__mro__")
        for s in _own_slots(cls)
        if s not in ("__dict__", "__weakref__")
    )


# -- attributes, read without running code ---------------------------------------------------
#: what an attribute only code would give finds (no code runs)
RUNS_CODE: Any = type("RunsCode", (), {"__repr__": lambda self: "<computed by code>"})()
#: what :func:`in_mro` finds where no class holds the name
NOT_FOUND: Any = type("NotFound", (), {"__repr__": lambda self: "<not found>"})()
_TYPE_MRO, _TYPE_DICT = type.__dict__["__mro__"], type.__dict__["__dict__"]


def in_mro(cls: type, name: str) -> Any:
    """``name`` as the classes of ``cls``'s method resolution order hold it, raw (no
    descriptor called), or a sentinel where none does."""
    for base in _TYPE_MRO.__get__(cls):
        space = _TYPE_DICT.__get__(base)
        if name in space:
            return space[name]
    return NOT_FOUND


# -- attributes, continued -------------------------------------------------------------------------------
#: descriptors written in C whose ``__get__`` binds or reads a field and runs no code: a
#: slot's field, a method of a type written in C bound (a getset's getter is any C function,
#: which may run Python: only Python's own built-in types' are read, :func:`_builtin_getset`)
_C_DESCRIPTORS = frozenset(
    {types.MemberDescriptorType, types.MethodDescriptorType, types.WrapperDescriptorType,
     types.ClassMethodDescriptorType, types.BuiltinFunctionType}
)  # fmt: skip
#: an Enum member's ``name`` and ``value`` (Enum's own properties): the fields they return
_ENUM_FIELDS = {
    id(enum.Enum.__dict__[n]): (enum.Enum.__dict__[n], f"_{n}_") for n in ("name", "value")
}


def own_class(value: Any) -> bool:
    """Whether ``isinstance(value, cls)`` asks nothing of ``value`` but its type: its class
    reads attributes as Python does and has no ``__class__`` of its own (a proxy's)."""
    kind = type(value)
    return not _overrides_access(kind) and in_mro(kind, "__class__") is object.__dict__["__class__"]


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


def attribute_of(value: Any, name: str, kind: type = str) -> Any:
    """The attribute ``name`` of ``value`` where Python's lookup gives it without running code
    and it is a ``kind`` (a ``str`` exactly: a subclass may hash and split its own way); else
    None."""
    try:
        found = attribute(value, name)
    except AttributeError:
        return None
    if found is RUNS_CODE:
        return None
    return found if (type(found) is str if kind is str else issubclass(type(found), kind)) else None


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
    if one_of(kind, _C_DESCRIPTORS) or _builtin_getset(raw):
        return raw.__get__(instance, owner)
    field = _ENUM_FIELDS.get(id(raw))
    if field is not None and raw is field[0] and issubclass(type(instance), enum.Enum):
        slot = in_mro(type(instance), "__dict__")
        own = slot.__get__(instance) if type(slot) is types.GetSetDescriptorType else None
        if type(own) is dict and field[1] in own:
            return own[field[1]]
    return RUNS_CODE


def _builtin_getset(raw: Any) -> bool:
    """Whether ``raw`` is a getset descriptor of one of Python's own built-in types (``type``,
    ``object``, a function's: its getter reads the object's fields)."""
    if type(raw) is not types.GetSetDescriptorType:
        return False
    owner = raw.__objclass__
    return type.__dict__["__module__"].__get__(owner) == "builtins"


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


# -- modules ---------------------------------------------------------------------------------
def program_module(module: Any) -> bool:
    """Whether the module named ``module`` is the program's (not built in, not the standard
    library's, not Triton's, the bridge's or kernelcache's); a name that is no string is."""
    if not isinstance(module, str):
        return True
    top = module.split(".")[0]
    return top not in ("builtins", "triton", "bridge", "kernelcache") and (
        top not in sys.stdlib_module_names
    )


def relative_dir(directory: str) -> str:
    """``directory`` relative to the longest ``sys.path`` entry containing it, else its name
    (the entries that are strings: the import system ignores any other, and nothing of one
    runs here)."""
    roots = tuple(entry for entry in sys.path if type(entry) is str)
    return _relative_dir(directory, roots, os.getcwd())


@functools.lru_cache(maxsize=4096)
def _relative_dir(directory: str, path: tuple[str, ...], cwd: str) -> str:
    """:func:`relative_dir` with ``sys.path`` and the working directory (what relative entries
    are relative to) given: a function of its arguments alone, so memoized."""
    directory = os.path.normpath(directory)
    best = ""
    for entry in path:
        root = os.path.normpath(os.path.join(cwd, entry))
        if (directory == root or directory.startswith(root + os.sep)) and len(root) > len(best):
            best = root
    if best:
        rel = os.path.relpath(directory, best)
        return "" if rel == "." else rel
    return os.path.basename(directory)


def relative_path(path: str) -> str:
    """An absolute source ``path`` as its directory relative to the import root, and its name."""
    if not os.path.isabs(path):
        return path
    directory, name = os.path.split(path)
    return os.path.join(relative_dir(directory), name)


def name_of(value: Any) -> str:
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    if isinstance(qualname, str) and isinstance(module, str):
        return f"{module}:{qualname}"
    return type(value).__name__


def named(value: Any) -> str | None:
    """``module:qualname`` of ``value`` where that name finds this very object (a function or
    class of a module, a built-in), else None."""
    owner = getattr(value, "__objclass__", None)  # (a slot or method of a built-in type)
    if isinstance(owner, type) and isinstance(getattr(value, "__name__", None), str):
        found = vars(owner).get(value.__name__, MISSING)
        return f"{name_of(owner)}.{value.__name__}" if found is value else None
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return None
    found = sys.modules.get(module)
    for part in qualname.split("."):
        found = vars(found).get(part, MISSING) if hasattr(found, "__dict__") else MISSING
        if found is MISSING:
            return None
    if isinstance(found, (staticmethod, classmethod)):
        found = found.__func__
    return f"{module}:{qualname}" if found is value else None
