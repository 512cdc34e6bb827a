"""The frontend as witness: record what Triton's code generator reads while it generates one
kernel, as a read set (:mod:`.read_sets`) kept with the compiled kernel.

A kernel's key is computed from a description of its code (:mod:`.describe`) made before any
compile: a model of what the frontend might read. The witness is what it did read, as ccache's
direct mode keeps, beside each result, the manifest of the headers the preprocessor opened,
and as Triton keeps ``used_global_vals`` for a warm process: every global and closure variable
a JIT function resolved, every attribute and item the frontend took from an object it got that
way, every call of code of the program's own it made at compile time (``constexpr_function``,
functions, classes, and built-ins given such objects) with its arguments and result. A cached
kernel is used only while its reads find what they found (:func:`bridge.identity.read_sets.stale`);
the key stays the fast way to the entry, and no longer has to be complete.

Recording hooks Triton's ``CodeGenerator`` (its name, attribute, item and call visits, and its
constructor, which says which JIT function is being generated) and the operators of Triton's
``constexpr`` (:data:`~.read_sets.OPERATORS`: ``S * 1.0`` or ``not S`` runs the object's own
``__mul__`` or ``__bool__``, code of the program's own as much as a call is); the hooks do
nothing outside a :func:`recording` block of the same thread. What the witness cannot follow
(an object reached from a kernel argument, a call whose arguments cannot be made again) is
named in the read set as ``partial``: the reads it did record are still checked, and the rest
is as the key describes it. A call it cannot make again (a ``constexpr_function`` given a
tensor or a layout; Triton's dtypes, pointer and block types are exact values) still has what its code can read recorded: each global and
closure variable its code names, each attribute its code names of a module among them, and so
on through the functions and the classes' methods found (:func:`~.reach.reachable`), so that code the
key trusts by its name (an installed distribution's, by its file) is not trusted for the values
it reads. Each JIT function generated has its file recorded as the binary's debug information
names it (relative to the import root, which the import path decides: ``"f"``).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import os
import threading
from collections.abc import Iterator
from typing import Any

from . import exact_values as ev
from . import reach, static_reads
from . import read_sets as rs

#: the most rows a read set keeps (a larger one is cut, and says so)
MAX_ROWS = 2000
#: the largest read set's text an entry keeps (its rows are cut to fit, and it says so)
MAX_TEXT = 48 << 10
_local = threading.local()


class Recorder:
    """The read set of one frontend run (see the module docstring)."""

    def __init__(self, kernel: Any, params: dict[str, Any]) -> None:
        self.kernel = kernel
        self.trace = rs.Trace()
        self.rows: list[list[Any]] = []
        self.index: dict[str, int] = {}
        self.partial: list[str] = []
        self.environ: dict[str, str | None] = {}  # variables read during the compile
        #: the specialization the frontend ran for and the digest of its IR (see :meth:`ran`)
        self.frontend: tuple[Any, str] | None = None
        for name, value in params.items():
            if ev.exact(value) is None:  # (a plain value is in the key as it is)
                self.add(-1, "p", name, value)

    def origin(self, value: Any) -> int | None:
        """The row that found ``value`` (``-1``: the kernel), None where no read did."""
        if value is self.kernel:
            return -1
        return self.trace.row_of(value)

    def add(self, parent: int, op: str, operand: Any, value: Any) -> int | None:
        """Record that the read ``op operand`` of the object of ``parent`` found ``value``;
        its row (None where the read set is full)."""
        name = json.dumps([parent, op, operand], separators=(",", ":"), default=repr)
        known = self.index.get(name)
        if known is not None:
            self.trace.note(value, known)
            return known
        if len(self.rows) >= MAX_ROWS:
            self.missed(f"more than {MAX_ROWS} reads")
            return None
        row = len(self.rows)
        want = self.trace.want(value, row)  # (may raise: then nothing is recorded)
        self.index[name] = row
        self.rows.append([parent, op, operand, want])
        return row

    def argument(self, value: Any) -> list[Any] | None:
        """``value`` as an argument of a recorded call: plain, or found by a read; None."""
        plain = ev.exact(value)
        if plain is not None:
            return ["v", plain]
        row = self.origin(value)
        if row is None and isinstance(value, ev.language().constexpr):
            row = self.origin(value.value)
            return None if row is None or row < 0 else ["rk", row]
        return None if row is None or row < 0 else ["r", row]

    @contextlib.contextmanager
    def guarded(self) -> Iterator[None]:
        """Note a read; a failure of the witness itself is named in the read set (as what it
        could not follow), never the compile's."""
        try:
            yield
        except Exception as e:  # (the user's objects, described: whatever they raise)
            self.missed(f"the witness failed: {type(e).__name__}: {e}"[:200])

    def missed(self, why: str) -> None:
        if len(self.partial) < 8 and why not in self.partial:
            self.partial.append(why)

    def ran(self, specialization: Any, ir: str) -> None:
        """Note that the frontend gave IR of digest ``ir`` for ``specialization`` (plain data,
        :func:`~.frontend.specialization`; None where it has none): where the read set is
        partial, it ends with that as a read (``"ir"``), which runs the frontend again."""
        self.frontend = (specialization, ir)

    def text(self) -> str:
        """The read set as its entry keeps it."""
        from .compiler_identity import DEVICE_SELECTION, NEUTRAL

        for name, value in sorted(self.environ.items()):
            if name not in NEUTRAL and name not in DEVICE_SELECTION:
                self.add(-1, "e", name, ev.ABSENT if value is None else value)
        partial = self.partial + [f"no exact description of {o}" for o in self.trace.opaque[:4]]
        rows = self.rows
        while True:
            doc = {"format": rs.FORMAT, "rows": self._vouched(rows, partial), "partial": partial}
            text = json.dumps(doc, separators=(",", ":"))
            if len(text) <= MAX_TEXT:
                return text
            rows = rows[: len(rows) // 2]  # (a row names only rows before it)
            partial = [*partial[:7], f"cut to {len(rows)} reads"]

    def _vouched(self, rows: list[list[Any]], partial: list[str]) -> list[list[Any]]:
        """``rows`` and, where they are ``partial``, the IR the frontend gave, as a read."""
        if not partial or self.frontend is None:
            return rows
        made, ir = self.frontend
        return [*rows, [-1, "ir", made, rs.Trace().want(ir, len(rows))]]


def active() -> Recorder | None:
    return getattr(_local, "recorder", None)


@contextlib.contextmanager
def recording(kernel: Any, given: dict[str, Any]) -> Iterator[Recorder]:
    """Record what the frontend reads in this thread, generating ``kernel`` with the constexpr
    arguments ``given`` (by parameter name), until the block ends."""
    _install()
    recorder = Recorder(kernel, given)
    before = active()
    _local.recorder = recorder
    try:
        yield recorder
    finally:
        _local.recorder = before


class _Environ(os._Environ):
    """``os.environ`` as the compile sees it: the same variables, each read noted."""

    def __init__(self, real: Any, recorder: Recorder) -> None:
        super().__init__(
            real._data, real.encodekey, real.decodekey, real.encodevalue, real.decodevalue
        )
        self.recorder = recorder

    def __getitem__(self, key: str) -> str:
        try:
            value = super().__getitem__(key)
        except KeyError:
            self.recorder.environ.setdefault(key, None)
            raise
        self.recorder.environ.setdefault(key, value)
        return value

    def copy(self) -> dict[str, str]:
        """The whole environment, for a process the compile starts: not a read of any one
        variable (that process's own reads are its tool's, whose file counts)."""
        return {self.decodekey(k): self.decodevalue(v) for k, v in self._data.items()}  # type: ignore[attr-defined]

    def items(self) -> Any:
        return self.copy().items()

    def values(self) -> Any:
        return self.copy().values()


@contextlib.contextmanager
def reading_environment(recorder: Recorder) -> Iterator[None]:
    """Note in ``recorder`` every variable read through ``os.environ`` (and ``os.getenv``) or
    Triton's knobs until the block ends: for a compiler process, whose every thread is the
    compile's (elsewhere, reads of other threads are noted too: more reads, never fewer)."""
    from triton import knobs

    real = os.environ
    readers = {n: getattr(knobs, n) for n in ("getenv", "getenv_bool") if hasattr(knobs, n)}

    def noting(read: Any) -> Any:
        def reader(key: str, *args: Any) -> Any:
            recorder.environ.setdefault(key, real.get(key))
            return read(key, *args)

        return reader

    os.environ = _Environ(real, recorder)  # noqa: B003 (the same variables, each read noted)
    for name, read in readers.items():  # (Triton's knobs read through its native library)
        setattr(knobs, name, noting(read))
    try:
        yield
    finally:
        os.environ = real  # noqa: B003
        for name, read in readers.items():
            setattr(knobs, name, read)


def _triton_value(value: Any) -> bool:
    from triton.language.core import base_value

    return isinstance(value, base_value)


def _ignorable(value: Any) -> bool:
    """Whether reading from ``value`` needs no witness: a plain value, or one of Triton's own
    objects (a dtype, a layout: what Triton's files, in every key, decide)."""
    if ev.exact(value) is not None:
        return True
    return ev.triton_home(type(value)) is not None


@functools.lru_cache(maxsize=1)
def _install() -> None:
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
                    recorder.add(self._kc_root, "f", "", rs.source_file(self.jit_fn))

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
        value = self.get_Attribute(rs.follow(lhs, self.builder.module_map), node.attr)
        recorder = active()
        if recorder is not None:
            with recorder.guarded():
                _attribute(recorder, lhs, node.attr, value)
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
        value = call_function(self, node, fn, args, kws)
        recorder = active()
        if recorder is not None:
            with recorder.guarded():
                _call(recorder, fn, given, dict(kws), value, self.builder.module_map)
        return value

    constexpr = ev.language().constexpr
    for name in sorted(rs.OPERATORS):
        method = vars(constexpr).get(name)
        if method is not None:
            setattr(constexpr, name, _operator(name, method))
    kind: Any = getattr(getattr(ev.language(), "core", None), "constexpr_type", None)
    mangle = vars(kind).get("mangle") if kind is not None else None
    if mangle is not None:  # (Triton 3.9 names a specialization by repr(value) there)
        kind.mangle = _mangled(mangle)
    CodeGenerator.__init__ = __init__
    CodeGenerator.visit_Name = visit_Name
    CodeGenerator.visit_Attribute = visit_Attribute
    CodeGenerator.visit_Subscript_Load = visit_Subscript_Load
    CodeGenerator.call_Function = call_Function


def _attribute(recorder: Recorder, base: Any, name: str, value: Any) -> None:
    inner = base
    if isinstance(base, ev.language().constexpr) and name not in ("value", "type"):
        inner = base.value  # (what the code generator reads the attribute of)
    row = recorder.origin(base)
    if row is None and inner is not base:
        row = recorder.origin(inner)
    if row is not None:
        recorder.add(row, "a", name, value)
    elif _triton_value(inner):
        # (an aggregate's method: a member of its class, which a read may have found)
        row = recorder.origin(type(inner))
        if row is not None:
            recorder.add(row, "a", name, value)
        elif static_reads.is_jit(value) and ev.triton_home(type(inner)) is None:
            recorder.missed(f"a method of {type(inner).__qualname__} not witnessed")
    elif not _ignorable(inner):
        recorder.missed(f"an attribute of a {type(inner).__qualname__} not witnessed")


def _item(recorder: Recorder, base: Any, key: Any, value: Any) -> None:
    if _ignorable(base):
        return
    row, made = _origin(recorder, base), recorder.argument(key)
    if row is None or made is None:
        recorder.missed(f"an item of a {type(base).__qualname__} not witnessed")
    else:
        recorder.add(row, "i", made, value)


def _operator(name: str, method: Any) -> Any:
    """``method`` (an operator of Triton's ``constexpr``), recording what it computes from an
    object (:func:`_operated`) while a recording is active."""

    def operator(self: Any, *args: Any) -> Any:
        value = method(self, *args)
        recorder = active()
        if recorder is not None:
            with recorder.guarded():
                _operated(recorder, name, [self, *args], value)
        return value

    return functools.wraps(method)(operator)


def _mangled(method: Any) -> Any:
    """``method`` (``constexpr_type.mangle``, where a JIT function's specialization is named by
    the ``repr`` of an object it is given), recording that ``repr`` as ``constexpr``'s own
    ``__repr__`` operator (what :func:`~.read_sets.operate` computes again)."""

    def mangle(self: Any) -> Any:
        text = method(self)
        recorder = active()
        if recorder is not None and not hasattr(self.value, "mangle"):
            with recorder.guarded():
                constexpr = ev.language().constexpr
                # (the constexpr a read found holding it, as Triton 3.6 repr()s that very one)
                kept = recorder.trace.kept
                found = next(
                    (k for k in kept if type(k) is constexpr and k.value is self.value), self.value
                )
                shown = constexpr(self.value).__repr__()
                _operated(recorder, "__repr__", [found], shown)
        return text

    return functools.wraps(method)(mangle)


def _operated(recorder: Recorder, name: str, operands: list[Any], value: Any) -> None:
    """Record the operator ``name`` of a ``constexpr`` on ``operands`` (the ``constexpr``
    first), where one of them holds an object of the program's own (plain values and Triton's
    objects compute as Triton's files, in every key, say)."""
    constexpr = ev.language().constexpr
    held = [o.value if isinstance(o, constexpr) else o for o in operands]
    if all(_ignorable(o) for o in held):
        return
    made = [recorder.argument(o) for o in operands]
    if any(m is None for m in made):
        recorder.missed(f"{name} of a {type(held[0]).__qualname__} not witnessed")
        return
    row = recorder.add(-1, "o", [name, made], ev.unwrap(value))
    if row is not None:
        recorder.trace.note(value.value if isinstance(value, constexpr) else value, row)


def _bound(recorder: Recorder, fn: Any, module_map: dict[str, Any]) -> tuple[Any, Any] | None:
    """For a ``constexpr_function`` bound to an object (a method of an ``@aggregate`` class):
    the function, found as an attribute of the object's class (a read recorded), and the
    object; None for anything else."""
    constexpr_function = static_reads.jit_classes()[1]
    own = vars(fn)
    func, owner = own.get("__func__"), own.get("__self__")
    if constexpr_function is None or not isinstance(func, constexpr_function) or owner is None:
        return None
    name = getattr(rs.python_function(func), "__name__", None)
    row = recorder.origin(type(owner))
    if row is None or not isinstance(name, str):
        recorder.missed(f"a method of {type(owner).__qualname__} not witnessed")
        return None
    if rs.attribute(type(owner), name, module_map) is not func:
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
) -> None:
    """Record a call the code generator made at compile time of code that is not Triton's."""
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
    if hasattr(fn, "__self__") and _triton_value(fn.__self__):
        return  # (a method of a tensor)
    if getattr(fn, "__triton_builtin__", False):
        if not ev.triton_code(fn):  # (a builtin of the program's own, given tensors: never
            reach.reachable(recorder, fn, module_map)  # called again)
        return
    builtin = next((n for n, f in rs.BUILTINS.items() if f is fn), None)
    constexpr = ev.language().constexpr
    if builtin is not None or hasattr(fn, "__self__"):  # (given their arguments unwrapped)
        args = [a.value if isinstance(a, constexpr) else a for a in args]
        kws = {k: v.value if isinstance(v, constexpr) else v for k, v in kws.items()}
    given = [recorder.argument(a) for a in args]
    named = [[k, recorder.argument(v)] for k, v in sorted(kws.items())]
    made = [m for m in given if m is not None]
    if len(made) < len(given) or any(m is None for _, m in named):
        if builtin is None:
            recorder.missed(f"a call of {_name(fn)} with arguments not witnessed")
            reach.reachable(recorder, fn, module_map)
        return
    if builtin is not None:
        if not named and any(m[0] == "r" for m in made):
            recorder.add(-1, "b", [builtin, made], ev.unwrap(value))
        return
    parent = recorder.origin(fn)
    if parent is None:
        recorder.missed(f"a call of {_name(fn)} not witnessed")
        return
    row = recorder.add(parent, "c", [made, named], ev.unwrap(value))
    if row is not None:
        recorder.trace.note(value, row)  # (the wrapped result the generator goes on with)


def _origin(recorder: Recorder, value: Any) -> int | None:
    """The row that found ``value`` or, for a ``constexpr``, the value it holds."""
    row = recorder.origin(value)
    if row is None and isinstance(value, ev.language().constexpr):
        row = recorder.origin(value.value)
    return row


def _name(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", None) or type(fn).__qualname__)
