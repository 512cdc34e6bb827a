"""Watching which Python code runs: while Triton's frontend generates a kernel (what the witness
did not see run), and while a stored read set is checked (what a lookup may run at all).

Code is told apart by where it is defined (:func:`kind_of`): the bridge's, kernelcache's and
Triton's files (*ours*: in every key, or the check itself), the standard library's (*library*),
and everything else: the program's own and the installed distributions' (*program*), code a
``constexpr_function``, a property, a metaclass or a module's ``__getattr__`` runs. Code made at
run time (``<string>``: a dataclass's or namedtuple's methods) is a program's.

A :class:`Guard` traces the calls of one thread (:func:`sys.settrace`, chained to a tracer
already there, such as a debugger's) until its block ends. Each call of program code:

- while *witnessing* a frontend run (:data:`WITNESS`) is reported to ``ran`` (the read set is
  then partial, so the IR decides), unless a :meth:`Guard.calling` block says it is part of a
  call the witness records and makes again; library code given an object or class of the
  program (``len`` of an Enum runs ``EnumType.__len__``, an ABC's ``isinstance`` its registry)
  counts as the program's. Within :meth:`Guard.ours` (the witness's own bookkeeping) nothing
  counts.
- while *checking* a stored read set (:data:`CHECK`) raises
  :class:`~bridge.exceptions.CheckInterrupted` before its first line runs, unless it is within
  :meth:`Guard.calling` (a call the read set may make again: :mod:`.admit` decided), where it
  may run until a :class:`Watchdog` interrupts it (and again, where the program swallows it).

Invariants: nothing here runs code of the objects it looks at (types and namespaces are read
from their own tables); :class:`~bridge.exceptions.CheckInterrupted` derives from ``BaseException`` so that program code
catching ``Exception`` cannot swallow it; a guard always restores the tracer it found.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import sys
import sysconfig
import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

from ..exceptions import CheckInterrupted

#: what a guard watches for: a frontend run (report program code) or a check (refuse it)
WITNESS = "witness"
CHECK = "check"
OURS, LIBRARY, MADE, PROGRAM_CODE = 0, 1, 2, 3
#: library modules that never run code of the objects they are given (what the frontend
#: itself runs): their calls are not looked at
_PLUMBING = frozenset(
    {"ast", "warnings", "contextlib", "re", "sre_compile", "sre_parse", "posixpath",
     "genericpath", "os", "threading", "weakref", "_weakrefset", "linecache", "tokenize",
     "textwrap", "codecs", "json", "hashlib", "struct", "string", "traceback"}
)  # fmt: skip


def _dirs() -> tuple[tuple[str, ...], tuple[str, ...]]:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # bridge/
    ours = [here + os.sep, os.path.join(os.path.dirname(here), "kernelcache") + os.sep]
    try:
        import triton

        ours.append(os.path.dirname(os.path.abspath(triton.__file__)) + os.sep)
    except ImportError:  # (no Triton: nothing of it runs)
        pass
    paths = sysconfig.get_paths()
    library = {paths.get("stdlib"), paths.get("platstdlib")}
    return tuple(ours), tuple(os.path.realpath(p) + os.sep for p in library if p)


_kinds: dict[types.CodeType, int] = {}
_where: list[tuple[tuple[str, ...], tuple[str, ...]]] = []


def kind_of(code: types.CodeType) -> int:
    """Whose code ``code`` is: :data:`OURS`, :data:`LIBRARY` or :data:`PROGRAM_CODE` (see the
    module docstring), memoized per code object."""
    found = _kinds.get(code)
    if found is not None:
        return found
    if not _where:
        _where.append(_dirs())
    ours, library = _where[0]
    name = code.co_filename
    if name.startswith(ours):
        found = OURS
    elif name.startswith("<frozen "):
        found = LIBRARY
    elif name.startswith("<") or not os.path.isabs(name):
        found = MADE  # (made at run time: a dataclass's or namedtuple's methods, ``exec``)
    else:
        real = os.path.realpath(name)
        home = next((d for d in library if real.startswith(d)), None)
        found = PROGRAM_CODE
        if home is not None and "site-packages" not in real:
            top = real[len(home) :].split(os.sep)[0].removesuffix(".py")
            found = OURS if top in _PLUMBING else LIBRARY
    if len(_kinds) > 65536:
        _kinds.clear()
    _kinds[code] = found
    return found


def triton_type(kind: type) -> bool:
    """Whether the class ``kind`` is defined by Triton (in a module of Triton's files)."""
    module = type.__dict__["__module__"].__get__(kind)
    if not isinstance(module, str) or module.split(".")[0] != "triton":
        return False
    if not _where:
        _where.append(_dirs())
    where = getattr(sys.modules.get(module), "__file__", None) or ""
    return where.startswith(_where[0][0])


_classes: dict[int, tuple[type, bool]] = {}


def program_module(module: Any) -> bool:
    """Whether the module named ``module`` is the program's (not built in, not the standard
    library's, not Triton's, the bridge's or kernelcache's); a name that is no string is."""
    if not isinstance(module, str):
        return True
    top = module.split(".")[0]
    return top not in ("builtins", "triton", "bridge", "kernelcache") and (
        top not in sys.stdlib_module_names
    )


def program_class(cls: type) -> bool:
    """Whether ``cls`` is a class of the program (not built in, not the standard library's, not
    Triton's or the bridge's), read from its own namespace."""
    known = _classes.get(id(cls))
    if known is not None and known[0] is cls:
        return known[1]
    answer = program_module(type.__dict__["__module__"].__get__(cls))
    if len(_classes) > 65536:
        _classes.clear()
    _classes[id(cls)] = (cls, answer)
    return answer


#: types whose values are never an object of the program (quick answers)
_PLAIN = frozenset(
    {int, float, str, bytes, bool, type(None), complex, tuple, list, dict, set, frozenset,
     types.FunctionType, types.ModuleType, types.CodeType, types.FrameType, types.MethodType,
     types.BuiltinFunctionType, types.MappingProxyType, types.CellType}
)  # fmt: skip


def of_program(value: Any) -> bool:
    """Whether ``value`` is a class of the program or an object of one."""
    kind = type(value)
    if kind in _PLAIN:
        return False
    return program_class(value if issubclass(kind, type) else kind)


#: this thread's guard (:func:`current`), or what makes it when first needed (a check's:
#: :class:`bridge.identity.read_sets.OnDemand`)
STATE = threading.local()


def current() -> Guard | None:
    """The guard open in this thread, if any."""
    return getattr(STATE, "guard", None)


def watched() -> contextlib.AbstractContextManager[None]:
    """A block traced by the guard open in this thread, if any (what may run code of the
    program: a description of an object by its fields)."""
    guard = current()
    return guard.tracing() if guard is not None else contextlib.nullcontext()


class Guard:
    """Watches the calls of this thread until its block ends (see the module docstring).

    What a call of program code does depends on the innermost block open: the guard's own
    ``mode`` (:data:`WITNESS`: reported; :data:`CHECK`: refused), :meth:`calling` (allowed, and
    noted), :meth:`strict` (refused) or :meth:`ours` (not looked at)."""

    def __init__(
        self,
        mode: str,
        ran: Callable[[str], None] | None = None,
    ) -> None:
        self.ran = ran
        #: the blocks open, innermost last: a mode, and for a call whether program code ran
        self.blocks: list[list[Any]] = [[mode, False]]
        self.previous: Any = None
        self.outer: Guard | None = None
        self.collecting = False
        self.tracer_on = False

    # -- blocks --------------------------------------------------------------------------------
    def __enter__(self) -> Guard:
        """The guard current in this thread, tracing every call until the block ends."""
        self._arm()
        self._trace()
        return self

    def __exit__(self, *exc: object) -> None:
        self._untrace()
        self._disarm()

    @contextlib.contextmanager
    def tracing(self) -> Iterator[None]:
        """Trace every call in this block (already traced: as it is)."""
        if self.tracer_on:
            yield
            return
        self._trace()
        try:
            yield
        finally:
            self._untrace()

    def _arm(self) -> None:
        self.outer = current()
        STATE.guard = self

    def _disarm(self) -> None:
        STATE.guard = self.outer

    def _trace(self) -> None:
        self.previous = sys.gettrace()
        self.collecting = gc.isenabled()
        gc.disable()  # (a collection runs callbacks and finalizers of whatever it finds)
        self.tracer_on = True
        sys.settrace(self._call)

    def _untrace(self) -> None:
        sys.settrace(self.previous)
        self.tracer_on = False
        if self.collecting:
            gc.enable()

    def rearm(self) -> None:
        """Trace again after :class:`~bridge.exceptions.CheckInterrupted` was raised (Python
        stops a tracer that raises)."""
        if self.tracer_on and sys.gettrace() is not self._call:
            sys.settrace(self._call)

    @contextlib.contextmanager
    def _block(self, mode: str) -> Iterator[list[Any]]:
        block = [mode, False]
        self.blocks.append(block)
        try:
            yield block
        finally:
            self.blocks.pop()
            if block[1] and mode == "calling":
                self.blocks[-1][1] = True

    @contextlib.contextmanager
    def calling(self) -> Iterator[list[Any]]:
        """A call that is made again (a check) or recorded to be (a witness): program code may
        run in it. Yields a block whose ``[1]`` is True afterwards where any did."""
        with self._block("calling") as block:
            yield block

    @contextlib.contextmanager
    def ours(self) -> Iterator[None]:
        """The witness's own bookkeeping: what runs in it is not the frontend's."""
        with self._block("quiet"):
            yield

    @contextlib.contextmanager
    def strict(self) -> Iterator[None]:
        """A description of what a read found: program code may not run in it (a check makes
        the same description, where it may not either)."""
        with self._block(CHECK):
            yield

    # -- the tracer ----------------------------------------------------------------------------
    def _call(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        local = self.previous(frame, event, arg) if self.previous is not None else None
        block = self.blocks[-1]
        mode = block[0]
        if event != "call" or mode == "quiet":
            return local
        kind = kind_of(frame.f_code)
        if kind == OURS or frame.f_code.co_name == "__del__":  # (a finalizer: not the reads')
            return local
        if kind == LIBRARY and (mode == CHECK or not self._given_program(frame)):
            return local
        if kind == MADE and not self._given_program(frame):
            return local
        if mode == "calling":
            block[1] = True
            return local
        if mode == CHECK:
            raise CheckInterrupted(f"{_name(frame.f_code)} would run, code a check may not run")
        if self.ran is not None:
            self.ran(_name(frame.f_code))
        return local

    def _given_program(self, frame: types.FrameType) -> bool:
        """Whether library code was called with an object or class of the program."""
        code = frame.f_code
        count = code.co_argcount + code.co_kwonlyargcount
        if not count:
            return False
        values = frame.f_locals
        return any(of_program(values.get(n)) for n in code.co_varnames[:count])


class Watchdog:
    """Interrupts this thread once ``seconds`` have passed, and again every few milliseconds
    until :meth:`close` (code of the program that swallows the exception meets it again at its
    next instruction), from a thread of its own: raising from the tracer would stop it."""

    def __init__(self, seconds: float) -> None:
        self.thread = threading.get_ident()
        self.done = threading.Event()
        self.fired = False
        self.deadline = time.monotonic() + seconds
        self.watcher = threading.Thread(target=self._watch, name="kernelcache-check", daemon=True)
        self.watcher.start()

    def _watch(self) -> None:
        if self.done.wait(max(0.0, self.deadline - time.monotonic())):
            return
        while not self.done.is_set():
            self.fired = True
            interrupt(self.thread, CheckInterrupted)
            self.done.wait(0.005)

    def close(self) -> None:
        """Stop interrupting; an interruption not yet delivered is taken here (wherever one
        lands, the watcher is stopped before this returns)."""
        while True:
            try:
                self.done.set()
                self.watcher.join()
                for _ in range(8) if self.fired else ():  # (delivered at a jump back)
                    pass
                return
            except CheckInterrupted:
                continue


def interrupt(thread: int, exception: type[BaseException]) -> None:
    """Raise ``exception`` in ``thread`` at its next instruction (never "none": CPython then
    keeps asking the thread to check, and a thread that finds nothing loops on it)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object(exception))


def _name(code: types.CodeType) -> str:
    return f"{os.path.basename(code.co_filename)}:{getattr(code, 'co_qualname', code.co_name)}"
