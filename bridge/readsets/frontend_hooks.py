"""The witness's hooks in Triton's code generator: each read the frontend makes of the program
(a global or closure variable, an attribute, an item, a call made at compile time) recorded in
the active :class:`~.witness.Recorder` where a check can make it again as it was made, and the
read set made partial where it cannot.

The hooks wrap the generator's constructor, its name, attribute, item, call, f-string and ``is``
visits, the operators of Triton's ``constexpr`` and ``constexpr_type.mangle`` (Triton 3.9 names
a specialization by an object's ``repr``); they do nothing outside a recording of the same
thread. A call of the program's code is recorded where what its code can read decides it
(:mod:`.reach`); everything else the frontend runs of the program is seen by the recording's
guard (:mod:`.guard`).
"""

from __future__ import annotations

import ast
import functools
import types
from collections.abc import Callable
from typing import Any

from ..identity import exact_values as ev
from ..identity import namespaces, static_reads
from ..identity.static_reads import RUNS_CODE, program_module, python_function
from . import reach, static_access
from .guard import program_class
from .witness import Recorder, active


def _triton_value(value: Any) -> bool:
    from triton.language.core import base_value

    return isinstance(value, base_value)


def _ignorable(value: Any) -> bool:
    """Whether reading from ``value`` needs no witness: a plain value, or one of Triton's own
    objects (a dtype, a layout: what Triton's files, in every key, decide)."""
    if namespaces.exact(value) is not None:
        return True
    return ev.triton_home(type(value)) is not None


@functools.lru_cache(maxsize=1)
def install() -> None:
    """Hook Triton's code generator (once per process)."""
    from triton.compiler.code_generator import CodeGenerator

    init = CodeGenerator.__init__
    visit_name = CodeGenerator.visit_Name
    call_function = CodeGenerator.call_Function

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        recorder = active()
        self._kc_root = None
        if recorder is not None:
            self._kc_root = recorder.origin(self.jit_fn)
            if self._kc_root is None:
                recorder.missed(f"{getattr(self.jit_fn, '__name__', '?')} reached otherwise")
            else:
                with recorder.guarded():
                    recorder.add(self._kc_root, "f", "", namespaces.source_file(self.jit_fn))

    def visit_Name(self: Any, node: Any) -> Any:
        value = visit_name(self, node)
        recorder = active()
        if recorder is not None and not isinstance(node.ctx, ast.Store):
            name = node.id
            root = getattr(self, "_kc_root", None)
            if name not in self.lscope and root is not None:
                with recorder.guarded():
                    recorder.add(root, "g", name, self.gscope.get(name, ev.ABSENT))
        return value

    def visit_Attribute(self: Any, node: Any) -> Any:
        lhs = self.visit(node.value)
        value = self.get_Attribute(namespaces.follow(lhs, self.builder.module_map), node.attr)
        recorder = active()
        if recorder is not None:
            with recorder.guarded():
                _attribute(recorder, lhs, node.attr, value, self.builder.module_map)
        return value

    def visit_Subscript_Load(self: Any, node: Any) -> Any:
        lhs = self.visit(node.value)
        slices = self.visit(node.slice)
        if _triton_value(lhs):
            return self.call_Method(node, lhs.__getitem__, lhs, [slices], {})
        value = lhs[slices]
        recorder = active()
        if recorder is not None:
            with recorder.guarded():
                _item(recorder, lhs, slices, value)
        return value

    def call_Function(self: Any, node: Any, fn: Any, args: Any, kws: Any) -> Any:
        given = list(args)
        recorder = active()
        ran: set[Any] = set()  # (the code objects the call ran, where it is recorded)
        if recorder is None or recorder.guard is None or not recordable(fn):
            value = call_function(self, node, fn, args, kws)
        else:  # (program code it runs is the call's, if the call is recorded)
            with recorder.guard.calling() as block:
                value = call_function(self, node, fn, args, kws)
            ran = block[1]
        if recorder is not None:
            with recorder.guarded():
                _call(recorder, fn, given, dict(kws), value, self.builder.module_map, ran)
        return value

    joined = CodeGenerator.visit_JoinedStr

    def visit_JoinedStr(self: Any, node: Any) -> Any:
        recorder = active()
        if recorder is None:
            return joined(self, node)
        formatted = {id(v.value) for v in node.values if isinstance(v, ast.FormattedValue)}
        visit = self.visit

        def noting(inner: Any) -> Any:  # (what each formatted value is, as the f-string sees it)
            value = visit(inner)
            if id(inner) in formatted:
                _opaque(recorder, "an f-string", namespaces.unwrap(value))
            return value

        self.visit = noting
        try:
            return joined(self, node)
        finally:
            del self.visit

    compare = CodeGenerator.visit_Compare

    def visit_Compare(self: Any, node: Any) -> Any:
        recorder = active()
        if recorder is None or type(node.ops[0]) not in (ast.Is, ast.IsNot):
            return compare(self, node)
        operands = {id(node.left), id(node.comparators[0])}
        found: list[Any] = []
        visit = self.visit

        def noting(inner: Any) -> Any:  # (the two values ``is`` compares, as it sees them)
            value = visit(inner)
            if id(inner) in operands:
                found.append(namespaces.unwrap(value))
            return value

        self.visit = noting
        try:
            return compare(self, node)
        finally:
            del self.visit
            with recorder.guarded():
                _identity(recorder, found)

    kind: Any = getattr(getattr(namespaces.language(), "core", None), "constexpr_type", None)
    mangle = vars(kind).get("mangle") if kind is not None else None
    if mangle is not None:  # (Triton 3.9 names a specialization by repr(value) there)
        kind.mangle = _mangled(mangle)
    constexpr = namespaces.language().constexpr
    for name in OPERATORS:
        method = vars(constexpr).get(name)
        if method is not None:
            setattr(constexpr, name, _operator(name, method))
    table = getattr(CodeGenerator, "statically_implemented_functions", {})
    executor = getattr(CodeGenerator, "static_executor", None)
    for builtin in (int, len):  # (Triton runs these itself, never through call_Function)
        if builtin in table and executor is not None:
            table[builtin] = executor(_noted(builtin))
    CodeGenerator.visit_JoinedStr = visit_JoinedStr
    CodeGenerator.visit_Compare = visit_Compare
    CodeGenerator.__init__ = __init__
    CodeGenerator.visit_Name = visit_Name
    CodeGenerator.visit_Attribute = visit_Attribute
    CodeGenerator.visit_Subscript_Load = visit_Subscript_Load
    CodeGenerator.call_Function = call_Function


#: the methods of Triton's ``constexpr`` that compute with the value it holds (its operators,
#: comparisons, truth and index): on a value that is not plain, code that is not Triton's runs
OPERATORS = (
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__mod__", "__truediv__",
    "__rtruediv__", "__floordiv__", "__rfloordiv__", "__gt__", "__ge__", "__lt__", "__le__",
    "__eq__", "__ne__", "__and__", "__or__", "__xor__", "__pow__", "__rpow__", "__rshift__",
    "__lshift__", "logical_and", "logical_or", "__neg__", "__pos__", "__invert__", "__not__",
    "__bool__", "__index__",
)  # fmt: skip


def _opaque(recorder: Recorder, what: str, value: Any) -> None:
    """Make the read set partial where ``what`` (an operator, a built-in Triton runs itself, an
    f-string) is given ``value``, neither plain nor Triton's own: what it computes is the
    value's code (a ``Decimal`` reads its thread's context; a set's text, the hash seed), which
    no read made again sees, so the IR decides."""
    if not _ignorable(value):
        recorder.missed(f"{what} of a {type(value).__qualname__}")


def _operator(name: str, method: Any) -> Any:
    """``method``, an operator of Triton's ``constexpr``, noting a value it is given that is
    not plain (:func:`_opaque`) while a recording is active."""

    def operator(self: Any, *args: Any) -> Any:
        recorder = active()
        if recorder is not None:
            with recorder.guarded():
                for value in (self, *args):
                    _opaque(recorder, name, namespaces.unwrap(value))
        return method(self, *args)

    return functools.wraps(method)(operator)


def _noted(builtin: Any) -> Any:
    """``builtin`` as Triton runs it itself (``int``, ``len``), noting an argument that is not
    plain (:func:`_opaque`) while a recording is active."""

    def noted(*args: Any, **kwargs: Any) -> Any:
        recorder = active()
        if recorder is not None:
            with recorder.guarded():
                for value in (*args, *kwargs.values()):
                    _opaque(recorder, f"{builtin.__name__}()", value)
        return builtin(*args, **kwargs)

    return noted


#: the values whose identity is their value: ``x is None`` follows from what ``x`` is
SINGLETONS = (None, True, False, Ellipsis, NotImplemented)


def _identity(recorder: Recorder, operands: list[Any]) -> None:
    """Make the read set partial where ``is`` compares two values neither of which is a
    singleton or one of the kernel's own tensors: reads are recorded by value, and equal
    values may be other objects (``int('1000')``, ``tl.dtype('fp32')``), so the IR decides."""
    if len(operands) != 2:
        return
    if any(any(v is s for s in SINGLETONS) for v in operands):
        return
    constexpr = namespaces.language().constexpr
    if all(_triton_value(v) and not isinstance(v, constexpr) for v in operands):
        return  # (which tensor is which follows from the kernel's code)
    kinds = " and ".join(type(v).__qualname__ for v in operands)
    recorder.missed(f"`is` between a {kinds}")


def _attribute(recorder: Recorder, base: Any, name: str, value: Any, module_map: Any) -> None:
    inner = base
    if isinstance(base, namespaces.language().constexpr) and name not in ("value", "type"):
        inner = base.value  # (what the code generator reads the attribute of)
    row = recorder.origin(base)
    if row is None and inner is not base:
        row = recorder.origin(inner)
    owner, modules = base, module_map
    if row is None and _triton_value(inner):
        # (an aggregate's method: a member of its class, which a read may have found)
        row, owner, modules = recorder.origin(type(inner)), type(inner), {}
        if row is None and static_reads.is_jit(value) and ev.triton_home(owner) is None:
            recorder.missed(f"a method of {owner.__qualname__} not witnessed")
    if row is not None:
        again = lambda: namespaces.generated_attribute(owner, name, modules)  # noqa: E731
        _found(recorder, row, "a", name, value, again)
    elif owner is base and not _ignorable(inner):
        recorder.missed(f"an attribute of a {type(inner).__qualname__} not witnessed")


def _found(
    recorder: Recorder, row: int, op: str, operand: Any, value: Any, again: Callable[[], Any]
) -> None:
    """Record the read ``op operand`` of row ``row``'s object where a check makes it again
    without running code, finding ``value`` (``again()``: that read); else the read set is
    partial."""
    try:
        made = again()
    except (AttributeError, LookupError, TypeError):
        made = RUNS_CODE
    if made is value or (made is not RUNS_CODE and _same(made, value)):
        recorder.add(row, op, operand, value)
    else:
        recorder.missed(f"{op} {str(operand)[:40]}: found by code of the program's own")


def _same(made: Any, value: Any) -> bool:
    """Whether ``made`` (a read made again) is ``value``: the same object, an equal plain
    value, or a method of the same function bound to the same object."""
    if type(made) is types.MethodType and type(value) is types.MethodType:
        return made.__func__ is value.__func__ and made.__self__ is value.__self__
    plain = namespaces.exact(made)
    return plain is not None and plain == namespaces.exact(value)


def _item(recorder: Recorder, base: Any, key: Any, value: Any) -> None:
    if _ignorable(base):
        return
    row, made = _origin(recorder, base), recorder.argument(key)
    if row is None or made is None:
        recorder.missed(f"an item of a {type(base).__qualname__} not witnessed")
    else:
        again = lambda: static_access.item(base, namespaces.unwrap(key))  # noqa: E731
        _found(recorder, row, "i", made, value, again)


def _mangled(method: Any) -> Any:
    """``method`` (``constexpr_type.mangle``, where Triton names a JIT function's
    specialization by the ``repr`` of an object it is given): where that object is not a plain
    value, the read set is partial (the ``repr`` is the object's own code, or its address)."""

    def mangle(self: Any) -> Any:
        text = method(self)
        recorder = active()
        value = self.value
        if recorder is not None and namespaces.exact(value) is None and not _ignorable(value):
            recorder.missed(f"a specialization named by the repr of a {type(value).__qualname__}")
        return text

    return functools.wraps(method)(mangle)


def recordable(fn: Any) -> bool:
    """Whether a call of ``fn`` is one the witness records (:func:`_call`): what program code
    it runs is then the call's own, and decides whether its reads decide it."""
    jit_callable, constexpr_function, _ = static_reads.jit_classes()
    if constexpr_function is not None and isinstance(fn, constexpr_function):
        return True
    if isinstance(fn, jit_callable) or ev.triton_home(fn) is not None:
        return False
    if any(f is fn for f in static_access.BUILTINS.values()) or fn in reach.PURE_MATH:
        return True
    return program_function(fn) or (isinstance(fn, type) and program_class(fn))


def _bound(recorder: Recorder, fn: Any, module_map: dict[str, Any]) -> tuple[Any, Any] | None:
    """For a ``constexpr_function`` bound to an object (a method of an ``@aggregate`` class):
    the function, found as an attribute of the object's class (a read recorded), and the
    object; None for anything else."""
    constexpr_function = static_reads.jit_classes()[1]
    own = vars(fn)
    func, owner = own.get("__func__"), own.get("__self__")
    if constexpr_function is None or not isinstance(func, constexpr_function) or owner is None:
        return None
    name = getattr(python_function(func), "__name__", None)
    row = recorder.origin(type(owner))
    if row is None or not isinstance(name, str):
        recorder.missed(f"a method of {type(owner).__qualname__} not witnessed")
        return None
    if namespaces.generated_attribute(type(owner), name, module_map) is not func:
        recorder.missed(f"{type(owner).__qualname__}.{name} found otherwise")
        return None
    recorder.add(row, "a", name, func)
    return func, owner


def _call(
    recorder: Recorder,
    fn: Any,
    args: list[Any],
    kws: dict[str, Any],
    value: Any,
    module_map: dict[str, Any],
    ran: set[Any],
) -> None:
    """Record a call the code generator made at compile time of code that is not Triton's
    (``ran``: the code objects it ran, but ours), where what its code can read decides it
    (:mod:`.reach`); else the read set is partial."""
    jit_callable, constexpr_function, _ = static_reads.jit_classes()
    if isinstance(fn, jit_callable) and not (
        constexpr_function is not None and isinstance(fn, constexpr_function)
    ):
        bound = _bound(recorder, fn, module_map)
        if bound is None:
            return  # (generated: its reads are its generator's)
        fn, args = bound[0], [bound[1], *args]
    if ev.triton_home(fn) is not None:
        return  # (Triton's own code, in every key)
    owner = getattr(fn, "__self__", None)
    if _triton_value(owner):
        return  # (a method of a tensor)
    if ev.triton_home(type(owner)) is not None and namespaces.exact(owner) is not None:
        return  # (Triton's method of a value of Triton's: a dtype's ``is_int``, in every key)
    if getattr(fn, "__triton_builtin__", False):
        if not ev.triton_code(fn):  # (a builtin of the program's own, given tensors: never
            reach.reachable(recorder, fn, module_map, reach.Reach())  # decided by its reads)
        return
    builtin = next((n for n, f in static_access.BUILTINS.items() if f is fn), None)
    if builtin is not None:
        _builtin(recorder, builtin, args, kws, value, bool(ran))
        return
    constexpr = namespaces.language().constexpr
    if hasattr(fn, "__self__"):  # (given their arguments unwrapped)
        args = [a.value if isinstance(a, constexpr) else a for a in args]
        kws = {k: v.value if isinstance(v, constexpr) else v for k, v in kws.items()}
    given = [recorder.argument(a) for a in args]
    named = [[k, recorder.argument(v)] for k, v in sorted(kws.items())]
    followed = reach.Reach()
    if any(m is None for m in given) or any(m is None for _, m in named):
        recorder.missed(f"a call of {_name(fn)} with arguments not witnessed")
        reach.reachable(recorder, fn, module_map, followed)
        return
    parent = recorder.origin(fn)
    if parent is None:
        recorder.missed(f"a call of {_name(fn)} not witnessed")
        return
    row = recorder.add(parent, "c", [given, named], namespaces.unwrap(value))
    if row is not None:
        recorder.trace.note(value, row)  # (the wrapped result the generator goes on with)
    reach.reachable(recorder, fn, module_map, followed)
    unwrapped = [namespaces.unwrap(a) for a in [*args, *kws.values()]]
    reach.arguments(recorder, unwrapped, module_map, followed)
    why = followed.decided(ran)
    if why is not None:
        recorder.missed(f"a call of {_name(fn)} its reads do not decide: {why}"[:200])


def _builtin(
    recorder: Recorder, name: str, args: list[Any], kws: dict[str, Any], value: Any, ran: bool
) -> None:
    """Record a call of the built-in ``name``: nothing where its arguments are plain (its
    result follows from them) or Triton's own objects, a read where a check makes it again as
    it was made (no code of the program ran in it: :func:`.static_access.builtin`); else the
    read set is partial."""
    args = [namespaces.unwrap(a) for a in args]
    given = [recorder.argument(a) for a in args]
    if not ran and not kws:
        if all(g is not None and g[0] == "v" for g in given):
            return
        if all(
            g is not None or _triton_value(a) or _ignorable(a)
            for g, a in zip(given, args, strict=True)
        ):
            if all(g is not None for g in given):
                try:
                    again = static_access.builtin(name, args)
                except Exception:  # (the check would find an error, not this)
                    again = RUNS_CODE
                if again is not RUNS_CODE and (
                    again is namespaces.unwrap(value) or _same(again, namespaces.unwrap(value))
                ):
                    recorder.add(-1, "b", [name, given], namespaces.unwrap(value))
                    return
            elif not any(_registers(a) for a in args):
                return  # (Triton's objects and plain values: what Triton's files say)
    recorder.missed(f"{name}() of what no read can make again")


def _registers(value: Any) -> bool:
    """Whether ``value`` is a class (or a tuple of classes) whose ``isinstance`` answers from
    more than its bases: a metaclass of its own (an ABC's registry, an ``__instancecheck__``)."""
    if type(value) is tuple:
        return any(_registers(v) for v in value)
    kind = type(value)
    return issubclass(kind, type) and kind is not type and ev.triton_home(kind) is None


def _origin(recorder: Recorder, value: Any) -> int | None:
    """The row that found ``value`` or, for a ``constexpr``, the value it holds."""
    row = recorder.origin(value)
    if row is None and isinstance(value, namespaces.language().constexpr):
        row = recorder.origin(value.value)
    return row


def _name(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", None) or type(fn).__qualname__)


def program_function(fn: Any) -> bool:
    """Whether ``fn`` is a Python function (or a method of one) of the program's own."""
    if type(fn) is types.MethodType:
        fn = fn.__func__
    if type(fn) is not types.FunctionType or ev.triton_home(fn) is not None:
        return False
    return program_module(fn.__globals__.get("__name__"))
