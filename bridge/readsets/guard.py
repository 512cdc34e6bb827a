"""Watching which Python code runs while Triton's frontend generates a kernel: what the
witness did not see run makes a read set partial.

Code is told apart by where it is defined (:func:`kind_of`): the bridge's, kernelcache's and
Triton's files (*ours*), the standard library's (*library*), and everything else, code made at
run time included (*program*). A :class:`Guard` traces the calls of one thread (chained to a
tracer already there) until its block ends: each call of program code is reported to ``ran``
(the read set is then partial), unless a :meth:`Guard.calling` block says it is part of a call
the witness records: there the code objects that run are collected, for :mod:`.reach` to judge
whether the call is decided. Library code given an object or class of the program counts as the
program's; within :meth:`Guard.ours` (the witness's own bookkeeping) nothing counts.

Only a recording is watched: a check runs no code to watch. Invariants: nothing here runs code
of the objects it looks at; a guard always restores the tracer it found.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import sysconfig
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

from ..identity.static_reads import program_module

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


_classes: dict[int, tuple[type, bool]] = {}


def program_class(cls: type) -> bool:
    """Whether ``cls`` is a class of the program (:func:`program_module`), read from its own
    namespace."""
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


#: this thread's guard (:func:`current`)
STATE = threading.local()


def current() -> Guard | None:
    """The guard open in this thread, if any."""
    return getattr(STATE, "guard", None)


class Guard:
    """Watches the calls of this thread until its block ends: a call of program code is
    reported to ``ran``, collected (:meth:`calling`) or not looked at (:meth:`ours`), by the
    innermost block open."""

    def __init__(self, ran: Callable[[str], None] | None = None) -> None:
        self.ran = ran
        #: the blocks open, innermost last: a mode, and for a call the code that ran in it
        self.blocks: list[list[Any]] = [["witness", None]]
        self.previous: Any = None
        self.outer: Guard | None = None
        self.collecting = False

    def __enter__(self) -> Guard:
        """The guard current in this thread, tracing every call until the block ends."""
        self.outer = current()
        STATE.guard = self
        self.previous = sys.gettrace()
        self.collecting = gc.isenabled()
        gc.disable()  # (a collection runs callbacks and finalizers of whatever it finds)
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(self.previous)
        if self.collecting:
            gc.enable()
        STATE.guard = self.outer

    @contextlib.contextmanager
    def _block(self, mode: str) -> Iterator[list[Any]]:
        block: list[Any] = [mode, set() if mode == "calling" else None]
        self.blocks.append(block)
        try:
            yield block
        finally:
            self.blocks.pop()
            outer = self.blocks[-1]
            if mode == "calling" and outer[0] == "calling":
                outer[1] |= block[1]

    @contextlib.contextmanager
    def calling(self) -> Iterator[list[Any]]:
        """A call the witness records: any code may run in it. Yields a block whose ``[1]``
        is afterwards the set of code objects that ran in it, but ours."""
        with self._block("calling") as block:
            yield block

    @contextlib.contextmanager
    def ours(self) -> Iterator[None]:
        """The witness's own bookkeeping: what runs in it is not the frontend's."""
        with self._block("quiet"):
            yield

    # -- the tracer ----------------------------------------------------------------------------
    def _call(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        local = self.previous(frame, event, arg) if self.previous is not None else None
        block = self.blocks[-1]
        mode = block[0]
        if event != "call" or mode == "quiet":
            return local
        code = frame.f_code
        kind = kind_of(code)
        if kind == OURS or code.co_name == "__del__":  # (a finalizer: not the reads')
            return local
        if mode == "calling":
            block[1].add(code)
            return local
        if kind in (LIBRARY, MADE) and not self._given_program(frame):
            return local
        if self.ran is not None:
            self.ran(_name(code))
        return local

    def _given_program(self, frame: types.FrameType) -> bool:
        """Whether library code was called with an object or class of the program."""
        code = frame.f_code
        count = code.co_argcount + code.co_kwonlyargcount
        if not count:
            return False
        values = frame.f_locals
        return any(of_program(values.get(n)) for n in code.co_varnames[:count])


def _name(code: types.CodeType) -> str:
    return f"{os.path.basename(code.co_filename)}:{getattr(code, 'co_qualname', code.co_name)}"
