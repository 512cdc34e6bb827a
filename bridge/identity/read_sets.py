"""A read set: what Triton's frontend read while it generated one kernel, as plain data that any
process can ask again (:func:`check`).

A read set is a list of rows ``[parent, op, operand, want]``, in the order the frontend made the
reads. ``parent`` is the row whose object the read was made on (``-1``: the kernel itself);
``op`` is one of

- ``"g"``: the global (or closure variable) ``operand`` of a JIT function, as Triton's code
  generator resolves it (its backend's module map applied), or of a ``constexpr_function`` or
  Python function whose call the witness could not make again (what its code can read);
- ``"a"``: the attribute ``operand`` of an object (a module followed through the module map, a
  ``constexpr`` unwrapped, as the code generator does);
- ``"i"``: the item of an object at the key ``operand`` (an argument, below);
- ``"c"``: a call of the object with ``operand = [args, kwargs]`` (a ``constexpr_function``, a
  function or class of the program's own), its result unwrapped from ``constexpr``;
- ``"b"``: a call of a Python built-in the code generator offers (``len``, ``isinstance``,
  ``getattr``, ...) named ``operand[0]``, with ``operand[1:]`` as for ``"c"``;
- ``"o"``: an operator of Triton's ``constexpr`` (:data:`OPERATORS`: ``S * 1.0``, ``-S``, its
  ``repr``...) named ``operand[0]``, on the arguments ``operand[1]`` (the first the value the
  ``constexpr`` holds): the code of an object's own operators, run at compile time;

- ``"f"``: the source file of a JIT function as the binary's debug information names it
  (:func:`source_file`: relative to the import root, which the import path decides);
- ``"d"``: the defaults and keyword defaults of a function (what a call that cannot be made
  again takes where an argument is left out: :func:`~.reach.reachable`);
- ``"e"``: the environment variable ``operand``, read while the kernel compiled (those that
  only select devices or say where files go, :mod:`.compiler_identity`, are not kept);
- ``"p"``: the constexpr argument ``operand`` of the kernel (by parameter name; plain values
  are in the kernel's key, so only objects are read this way);
- ``"ir"``: the digest of the IR the frontend gives in the specialization ``operand``
  (:func:`~.frontend.specialization`), where the read set is partial (it runs again);

and ``want`` is a digest of what the read found (:meth:`Trace.want`). An argument is
``["v", value]`` (a plain value, :func:`exact`, made again by :func:`remake`), ``["r", row]``
(the object a row found) or ``["rk", row]`` (that object in a ``constexpr``).

What a read found is described by content, never by name or address: plain values exactly
(floats by their bits, so a NaN's sign counts; tuples item by item), a JIT function by its
source, settings and first line, Triton's own objects by where Triton defines them (only where
that very object is there, defined in Triton's files), a function by its code, any other object
by :func:`bridge.identity.jit.constant` where it has an exact description, and an object met
before by the row that first found it (so two names for one object, and one name for two,
tell apart). Invariant: :func:`check` gives the digests a frontend run now would record for the
same reads, so a kernel whose reads all find what they found is the kernel its frontend would
generate now (given the same source, arguments, options and compiler, which its key holds).

A call the witness cannot make again (a ``constexpr_function`` given a tensor) is recorded as
what its code can read (:mod:`.reach`: the globals, closure variables, defaults and module
attributes its code names, through the functions and classes found) and, as code may reach
values by no name (an import when it runs, a file), the read set is partial: it ends with the
``"ir"`` read, so the frontend vouches for what the witness cannot.

A cached kernel or lowering is used only while :func:`stale` finds every read of its read sets
as it was; where one finds something else, the kernel of this version of the code is kept under
a key chained from the first (:func:`chained`), for at most :data:`MAX_HOPS` versions. Reads
are recorded at each compile by :mod:`.witness`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import types
from collections.abc import Callable, Sequence
from typing import Any

from . import static_reads
from .exact_values import ABSENT, describe, exact, language, remake, unwrap
from .watch import mark

#: the built-ins Triton's code generator offers by name (its ``builtin_namespace``)
BUILTINS: dict[str, Callable[..., Any]] = {
    f.__name__: f for f in (len, list, range, float, int, isinstance, getattr, hasattr)
}
#: the methods of Triton's ``constexpr`` that run code of the value it holds (its operators,
#: comparisons, truth, index and text: an object's own ``__mul__``, ``__bool__``... and its
#: ``__repr__``, which names the specialization of a JIT function it is given to)
OPERATORS = frozenset(
    {"__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__mod__",
     "__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__", "__gt__", "__rgt__",
     "__ge__", "__rge__", "__lt__", "__rlt__", "__le__", "__rle__", "__eq__", "__ne__",
     "__and__", "__or__", "__xor__", "__pow__", "__rpow__", "__rshift__", "__lshift__",
     "logical_and", "logical_or", "__neg__", "__pos__", "__invert__", "__not__", "__bool__",
     "__index__", "__repr__"}
)  # fmt: skip
FORMAT = 1


class Trace:
    """The objects reads found, by the row that first found each (a recorder's, or a
    :func:`check`'s: both describe what they find the same way)."""

    def __init__(self) -> None:
        self.rows: dict[int, int] = {}
        self.kept: list[Any] = []  # (the objects of ``rows``, alive while their ids are keys)
        self.opaque: list[str] = []

    def row_of(self, value: Any) -> int | None:
        return self.rows.get(id(value))

    def note(self, value: Any, row: int) -> None:
        """Remember ``value`` as found by ``row`` (unless met before)."""
        if exact(value) is None and id(value) not in self.rows:
            self.rows[id(value)] = row
            self.kept.append(value)

    def want(self, value: Any, row: int) -> str:
        """The digest of what ``value``, found by ``row``, is (and remember it)."""
        if value is ABSENT:
            return "absent"
        plain = exact(value)
        if plain is not None:
            return _digest(plain)
        first = self.rows.get(id(value))
        if first is not None:
            return f"same:{first}"
        want = self._described(value, row)  # (may raise: then ``value`` is not remembered)
        self.note(value, row)
        return want

    def _described(self, value: Any, row: int) -> str:
        known = _wants.get(id(value))
        if known is not None and known[0] is value:
            if known[1] is None or known[1] == _stamp(value, known[1][0]):
                return known[2]
        desc = describe(value)
        if desc is None:
            self.opaque.append(f"{type(value).__qualname__} (row {row})")
            return _digest(["opaque", row])
        want = _digest(desc)
        if isinstance(value, types.ModuleType) or desc[0] == "triton":
            _keep(value, None, want)
        elif desc[0] in ("jit", "fn", "cfn"):
            _keep(value, _stamp(value, desc[0]), want)
        return want


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
    JIT function's source, settings and first line; a function's code object, defaults and
    the objects it closes over (what they hold is read where it is used: calls are made
    again); a ``constexpr_function``'s code object (its calls are made again)."""
    if kind == "jit":
        return (kind, mark(value), getattr(value, "starting_line_number", None))
    if kind == "cfn":
        return (kind, value.fn.__code__)
    cells = []
    for cell in value.__closure__ or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:
            cells.append(ABSENT)
    return (kind, value.__code__, value.__defaults__, value.__kwdefaults__, *cells)


def _digest(desc: Any) -> str:
    text = json.dumps(desc, separators=(",", ":"), default=repr)
    return text if len(text) <= 40 else hashlib.sha256(text.encode()).hexdigest()[:32]


def python_function(fn: Any) -> types.FunctionType | None:
    """The Python function that runs when ``fn`` is called or generated (a JIT function's or a
    ``constexpr_function``'s ``fn``, a method's function, ``fn`` itself), None where none."""
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    jit_callable = static_reads.jit_classes()[0]
    if isinstance(fn, jit_callable):  # (bound to an object: its ``__func__``'s)
        fn = vars(fn).get("fn") or vars(fn).get("__func__")
    if isinstance(fn, jit_callable):
        fn = vars(fn).get("fn")
    return fn if isinstance(fn, types.FunctionType) else None


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
    backend's."""
    if isinstance(value, types.ModuleType):
        return module_map.get(value.__name__, value)
    module = getattr(value, "__module__", "")
    if module in module_map:
        return getattr(module_map[module], value.__name__)
    return value


def follow(value: Any, module_map: dict[str, Any]) -> Any:
    """A module followed through the module map, as the code generator does before it reads
    an attribute; anything else as it is."""
    if isinstance(value, types.ModuleType):
        while (known := value.__name__) in module_map:
            value = module_map[known]
            if value.__name__ == known:
                break
    return value


def attribute(value: Any, name: str, module_map: dict[str, Any]) -> Any:
    """``getattr(value, name)`` as the code generator reads an attribute."""
    value = follow(value, module_map)
    if isinstance(value, language().constexpr) and name not in ("value", "type"):
        value = value.value
    return getattr(value, name)


def _argument(arg: Any, found: Sequence[Any]) -> Any:
    tag, body = arg
    if tag == "r":
        return found[int(body)]
    if tag == "rk":
        return language().constexpr(found[int(body)])
    return remake(body)


def _call(fn: Any, operand: Any, found: Sequence[Any]) -> Any:
    args, kwargs = operand
    args = [_argument(a, found) for a in args]
    kwargs = {str(k): _argument(a, found) for k, a in kwargs}
    constexpr_function = static_reads.jit_classes()[1]
    if constexpr_function is not None and isinstance(fn, constexpr_function):
        return unwrap(
            fn.fn(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in kwargs.items()})
        )
    return unwrap(fn(*args, **kwargs))


def read(
    base: Any, op: str, operand: Any, found: Sequence[Any], given: Any, modules: Any, backend: Any
) -> Any:
    """Make one read again: what row ``[parent, op, operand, _]`` finds on ``base``
    (``given``: the kernel's constexpr arguments by parameter name; ``modules``: the backend's
    module map; ``backend``: the kernel's, for an ``"ir"`` read)."""
    if op == "ir":
        from .frontend import ir_again

        return ir_again(base, operand, given, backend)
    if op == "p":
        return given.get(str(operand), ABSENT)
    if op == "e":
        return os.environ.get(str(operand), ABSENT)
    if op == "g":
        return scope_value(base, str(operand), modules)
    if op == "a":
        return attribute(base, str(operand), modules)
    if op == "i":
        return base[_argument(operand, found)]
    if op == "c":
        return _call(base, operand, found)
    if op == "b":
        return unwrap(BUILTINS[str(operand[0])](*[_argument(a, found) for a in operand[1]]))
    if op == "o":
        return operate(str(operand[0]), [_argument(a, found) for a in operand[1]])
    if op == "f":
        return source_file(base)
    if op == "d":
        return defaults(base)
    raise ValueError(f"not a read: {op!r:.20}")


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


def operate(name: str, args: Sequence[Any]) -> Any:
    """The operator ``name`` of Triton's ``constexpr`` holding ``args[0]``, given the rest: what
    the code generator computes for ``S * 1.0`` (unwrapped)."""
    if name not in OPERATORS or not args:
        raise ValueError(f"not an operator: {name!r:.40}")
    return unwrap(getattr(language().constexpr(args[0]), name)(*args[1:]))


@functools.lru_cache(maxsize=512)
def parse(text: str) -> tuple[tuple[int, str, Any, str], ...] | None:
    """The rows of a read set's text (untrusted: None for anything else)."""
    try:
        doc = json.loads(text)
        rows = doc["rows"] if isinstance(doc, dict) and doc.get("format") == FORMAT else None
        out: list[tuple[int, str, Any, str]] = []
        for parent, op, operand, want in rows or ():
            if type(parent) is not int or not -1 <= parent < len(out) or not isinstance(want, str):
                return None
            out.append((parent, str(op), operand, want))
        return tuple(out)
    except (ValueError, TypeError, KeyError, RecursionError):
        return None


def wants(
    text: str, kernel: Any, given: Any, module_map: Any, backend: Any = None
) -> list[str] | None:
    """What each read of the read set ``text`` finds now, made again from ``kernel`` (the JIT
    function the reads start from) and ``given`` (its constexpr arguments by parameter name);
    None where ``text`` is not a read set. A read that fails (or whose object failed) finds
    ``"error"``."""
    rows = parse(text)
    if rows is None:
        return None
    trace = Trace()
    found: list[Any] = []
    out: list[str] = []
    for index, (parent, op, operand, _) in enumerate(rows):
        base = kernel if parent < 0 else found[parent]
        try:
            if base is _FAILED:
                raise LookupError("its object failed")
            value = read(base, op, operand, found, given, module_map, backend)
            want = trace.want(value, index)
        except Exception:  # the user's code, run again: whatever it raises, the read differs
            value, want = _FAILED, "error"
        found.append(value)
        out.append(want)
    return out


_FAILED: Any = object()


def check(text: str, kernel: Any, given: Any, module_map: Any, backend: Any = None) -> str | None:
    """None where every read of the read set ``text`` finds what it found; else the digest
    of what they find now (what tells this process's code from the one the reads were made
    in). A text that is no read set holds nothing: its digest is that of the text."""
    now = wants(text, kernel, given, module_map, backend)
    rows = parse(text)
    if now is None or rows is None:
        return hashlib.sha256(b"unreadable\0" + text.encode()).hexdigest()
    if all(w == row[3] for w, row in zip(now, rows, strict=True)):
        return None
    return reads_digest(now)


def reads_digest(parts: Sequence[str]) -> str:
    """A 64-hex-digit digest of ``parts``, what reads found (not a key: keys are
    :func:`kernelcache.keys.digest_of`'s)."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


# -- the read sets of a cached kernel or lowering, checked before it is used -------------------
def params(src: Any) -> dict[str, Any]:
    """The constexpr arguments of Triton's source object ``src``, by parameter name (those
    given whole: an item of a tuple argument is the tuple's)."""
    names = src.fn.arg_names
    return {names[p[0]]: v for p, v in src.constants.items() if len(p) == 1 and p[0] < len(names)}


_maps: dict[type, dict[str, Any]] = {}


def module_map_of(backend: Any) -> dict[str, Any]:
    """The module map of ``backend`` (what its code generator replaces Triton's modules by),
    asked once per backend class."""
    found = _maps.get(type(backend))
    if found is None:
        found = _maps[type(backend)] = dict(backend.get_module_map())
    return found


def stale(
    texts: Any, kernel: Any, given: Any, backend: Any, seen: dict[Any, Any] | None = None
) -> str | None:
    """None where every read of the read sets ``texts`` (those of kernels of the JIT function
    ``kernel`` compiled for ``backend``'s target, with the constexpr arguments ``given`` by
    parameter name) finds what it found; else the digest of what they find now (see
    :func:`check`).

    ``seen``: the checks made so far in one lowering of a program, where nothing but the
    lowering runs between two calls' checks (as the settings are read once per lowering): a
    read set checked again there for the same kernel and the same objects of ``given`` that it
    reads is not made again."""
    modules = module_map_of(backend)
    now = [_check_once(text, kernel, given, modules, backend, seen) for text in texts]
    if all(n is None for n in now):
        return None
    return reads_digest([n or "" for n in now])


def _check_once(
    text: str, kernel: Any, given: Any, modules: Any, backend: Any, seen: dict[Any, Any] | None
) -> str | None:
    """:func:`check`, or its result for the same read set, kernel and objects of ``given``
    in ``seen`` (by their ids: the objects are kept alive there, so no other takes an id)."""
    rows = parse(text) if seen is not None else None
    if seen is None or rows is None:
        return check(text, kernel, given, modules, backend)
    objects = (kernel, *(given.get(name, ABSENT) for name in _given_names(rows)))
    which = (text, *map(id, objects))
    found = seen.get(which)
    if found is None:
        found = seen[which] = (objects, check(text, kernel, given, modules, backend))
    return found[1]


def _given_names(rows: Sequence[tuple[int, str, Any, str]]) -> list[str]:
    """The parameters whose arguments the reads ``rows`` take from ``given``: those of ``"p"``
    reads, and those an ``"ir"`` read's specialization names (:func:`~.frontend.ir_again`)."""
    names = []
    for _, op, operand, _ in rows:
        if op == "p":
            names.append(str(operand))
        elif op == "ir" and isinstance(operand, dict):
            constants = operand.get("constants")  # (untrusted: any JSON value)
            for item in constants if isinstance(constants, list) else ():
                value = item[1] if isinstance(item, list) and len(item) == 2 else None
                if isinstance(value, list) and value[:1] == ["param"] and len(value) > 1:
                    names.append(str(value[1]))
    return names


#: how many other versions of a kernel's reads one lookup follows (each a :func:`chained` key)
#: before it compiles in memory
MAX_HOPS = 3


def chained(key: str, now: str) -> str:
    """The key under which the kernel (or lowering) of ``key`` is kept for code whose reads
    find ``now`` (:func:`stale`): each version of what the frontend reads has its own entry,
    as each set of header contents has its own result in ccache's manifest."""
    return reads_digest([key, now])
