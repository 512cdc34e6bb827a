"""The compiler process: where Triton's compiler runs, so that its abort or segfault is an error
of one compile, not the end of the job.

LLVM aborts the process on some inputs (``Cannot select: intrinsic ...`` for an instruction the
target lacks) and a compiler bug can segfault; in the user's process either ends the job before
any message. So a compile runs in a compiler process: a fork of this one, started by the first
compile of a batch (:func:`session`: one lowering's kernels), reused for the batch's other
compiles, started again after a crash, and ended with the batch.

Invariants:

- Nothing is started where nothing compiles: a warm lowering forks no process.
- The compiler process compiles what this process would. It is a fork, so kernels defined in
  ``__main__``, in an exec'd (notebook-like) module or in a closure are there as they are here,
  and it is forked once the batch's kernels are keyed, so it never compiles an older version of
  a kernel than the one keyed. A request after the first travels pickled: its arguments as
  their fields, plain data as itself, every other object (kernels, functions, classes, constexpr
  objects) by reference to the object the process was forked with; a request that references
  an object the process was not forked with, or does not pickle, starts a new compiler process
  forked with the request in memory. Where this system cannot fork (no ``os.fork``, or forking
  fails), the compile runs in this process, as a plain call.
- A compiler process that dies is a :class:`CompilerCrash`: ``lasting`` when the compiler
  crashed (a signal of its own: SIGABRT, SIGSEGV, ...; or it exited), so the same compile
  would crash again; not when the process was killed from outside (SIGKILL: out of memory).
- What the compiler writes to standard error is passed on to this process's standard error
  after each compile, and handed to the caller (:attr:`Ran.said`).
- Forking a process with other threads is unsafe when the child needs a lock that one of those
  threads held. The compiler process runs only Triton's compiler: never JAX, XLA or CUDA, whose
  threads it does not have (the C library resets its own locks at a fork), and it leaves with
  ``os._exit`` (no exit handlers). So JAX's warning about forking its multithreaded process
  (and Python's) is silenced for these forks only. It dies with the thread that forked it.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import gc
import io
import itertools
import logging
import os
import pickle
import re
import signal
import struct
import sys
import tempfile
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any, NoReturn

from ..errors import CompilerCrash, CompilerTraceback

logger = logging.getLogger(__name__)

#: signals a compiler dies of by itself: the same compile dies the same way again
LASTING_SIGNALS = frozenset(
    {
        signal.SIGABRT,
        signal.SIGSEGV,
        signal.SIGBUS,
        signal.SIGILL,
        signal.SIGFPE,
        signal.SIGTRAP,
        signal.SIGSYS,
    }
)
_LENGTH = struct.Struct("<Q")
#: a line of the compiler's last words that says what went wrong
_ERROR_LINE = re.compile(r"^.*\berror\b.*$", re.IGNORECASE | re.MULTILINE)
#: the exceptions of a cause chain carried back at most
_CHAIN = 16


@dataclass(frozen=True)
class Ran:
    """What a call in the compiler process gave: its ``value`` or the ``error`` it raised
    (a :class:`CompilerCrash` if the process died), and what it wrote to standard error."""

    value: Any = None
    error: BaseException | None = None
    said: str = ""


_local = threading.local()


def _sessions() -> list[_CompilerProcess]:
    stack: list[_CompilerProcess] | None = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


@contextlib.contextmanager
def session() -> Iterator[None]:
    """Calls of :func:`run` in this block, in this thread, share one compiler process, forked
    by the first of them; it ends with the block."""
    process = _CompilerProcess()
    stack = _sessions()
    stack.append(process)
    try:
        yield
    finally:
        stack.remove(process)
        process.close()


def run(fn: Callable[..., Any], *args: Any) -> Ran:
    """``fn(*args)`` in this thread's compiler process (see :func:`session`; outside one, in a
    compiler process of its own). ``fn`` sees this process as it was when its compiler process
    was forked (at the session's first call, or when ``args`` referenced an object it lacked)."""
    stack = _sessions()
    if stack:
        return stack[-1].run(fn, args)
    with session():
        return _sessions()[-1].run(fn, args)


def _in_this_process(fn: Callable[..., Any], args: tuple[Any, ...]) -> Ran:
    try:
        return Ran(value=fn(*args))
    except Exception as e:  # handed to the caller, as the compiler process's errors are
        return Ran(error=e)


#: every descriptor of every compiler process's pipes and files held here: a new compiler
#: process closes those of the others (each must see its own pipes close)
_held: set[int] = set()
_forking = threading.Lock()


def _cannot_fork(error: OSError) -> None:
    """Say once that no compiler process can be started, and why."""
    from kernelcache.process import warn_once

    warn_once(
        logger,
        "cannot fork a compiler process",
        "kernelcache: cannot start a compiler process (%s): compiling in this process, where a "
        "compiler crash ends it",
        error,
    )


class _CompilerProcess:
    """One compiler process (none until the first :meth:`run`)."""

    def __init__(self) -> None:
        self.pid = 0
        self.requests = -1  # write end of the pipe it reads requests from
        self.replies = -1  # read end of the pipe it writes replies to
        self.said: IO[bytes] | None = None  # its standard error
        self.said_upto = 0
        #: the objects pickled requests reference, as the process was forked with them
        self.pinned: dict[int, Any] = {}

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Ran:
        message, refs = _dumps(fn, args)
        known = all(self.pinned.get(id(r)) is r for r in refs)
        if self.pid and message is not None and known:
            try:
                _write_message(self.requests, message)
            except BrokenPipeError:  # it was killed while idle: this request goes to a new one
                pass
            else:
                return self._reply()
        if not self._start((fn, args), refs):
            return _in_this_process(fn, args)
        return self._reply()

    def _start(self, task: tuple[Callable[..., Any], tuple[Any, ...]], refs: list[Any]) -> bool:
        """Fork a compiler process that runs ``task`` first; False where none can be forked."""
        self.close()
        if not hasattr(os, "fork"):
            return False
        try:
            said: IO[bytes] | None = tempfile.TemporaryFile()
        except OSError:  # no TMPDIR to write to: its standard error stays this process's
            said = None
        fds: list[int] = []
        parent = os.getpid()
        with _forking:
            try:
                fds.extend(os.pipe())  # requests: read there, written here
                fds.extend(os.pipe())  # replies: written there, read here
                own = {fds[0], fds[3]} | ({said.fileno()} if said is not None else set())
                _held.update(fds, own)
                _quiet_fork_warnings()
                _prctl()
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
            except OSError as e:
                for fd in fds:
                    os.close(fd)
                    _held.discard(fd)
                if said is not None:
                    _held.discard(said.fileno())
                    said.close()
                _cannot_fork(e)
                return False
            if pid == 0:
                self.pinned = {id(r): r for r in refs}
                _serve(self, task, fds[0], fds[3], said, own, parent)
            for fd in (fds[0], fds[3]):
                os.close(fd)
                _held.discard(fd)
        self.pid, self.requests, self.replies = pid, fds[1], fds[2]
        self.said, self.said_upto = said, 0
        self.pinned = {id(r): r for r in refs}
        return True

    def _reply(self) -> Ran:
        try:
            data = _read_message(self.replies)
        except BaseException:  # interrupted here: the compile is abandoned with its process
            self.close()
            raise
        said = self._new_said()
        if data is None:
            status = _reaped(self.pid)
            self.pid = 0
            self.close()
            return Ran(error=_crash(status, said), said=said)
        kind, *payload = pickle.loads(data)
        if kind == "value":
            return Ran(value=payload[0], said=said)
        return Ran(error=_rebuilt(*payload), said=said)

    def _new_said(self) -> str:
        """What the compiler process wrote to standard error since the last call, also
        written to this process's standard error."""
        if self.said is None:
            return ""
        fd = self.said.fileno()
        size = os.fstat(fd).st_size
        data = os.pread(fd, size - self.said_upto, self.said_upto) if size > self.said_upto else b""
        self.said_upto += len(data)
        if data:
            sys.stderr.flush()
            with contextlib.suppress(OSError):  # no standard error here: nothing to pass on
                _write_all(2, data)
        return data.decode(errors="replace")

    def close(self) -> None:
        """End the compiler process, if there is one."""
        with _forking:  # no compiler process forked meanwhile closes a reused descriptor
            for fd in (self.requests, self.replies):
                if fd >= 0:
                    os.close(fd)
                    _held.discard(fd)
        self.requests = self.replies = -1
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            _reaped(self.pid)
            self.pid = 0
        if self.said is not None:
            with _forking:
                _held.discard(self.said.fileno())
                self.said.close()
            self.said = None
        self.pinned = {}


def _reaped(pid: int) -> int | None:
    """The status of the ended process ``pid`` (as ``waitpid`` gives it), once it has ended;
    None if something else in this process reaped it first."""
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return None


def _serve(
    process: _CompilerProcess,
    task: tuple[Callable[..., Any], tuple[Any, ...]],
    requests: int,
    replies: int,
    said: IO[bytes] | None,
    own: set[int],
    parent: int,
) -> NoReturn:
    """The compiler process: run ``task``, then each request, replying to each."""
    try:
        # the objects it was forked with are never collected here, so its garbage collections
        # do not write to (and copy) the pages it shares with the process it was forked from
        gc.freeze()
        _die_with(parent)
        for fd in _held - own:  # the other ends, and other compiler processes' pipes
            with contextlib.suppress(OSError):
                os.close(fd)
        if said is not None:
            os.dup2(said.fileno(), 2)
            if faulthandler.is_enabled():  # where Python was at a crash: with the rest it said
                faulthandler.enable(2)
        current: tuple[Callable[..., Any], tuple[Any, ...]] | None = task
        while current is not None:
            fn, args = current
            _write_message(replies, _attempt(fn, args))
            message = _read_message(requests)
            current = None if message is None else _Unpickler(message, process.pinned).load()
    finally:
        os._exit(0)


def _attempt(fn: Callable[..., Any], args: tuple[Any, ...]) -> bytes:
    """The reply to one request: ``fn(*args)``'s value, or what it raised."""
    try:
        return pickle.dumps(("value", fn(*args)), protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException as e:  # carried back and raised there
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        return pickle.dumps(("error", _portable(e), text), protocol=pickle.HIGHEST_PROTOCOL)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _portable(error: BaseException) -> list[tuple[BaseException, list[str]]]:
    """``error`` and its causes, each with its notes, as they can be pickled: one that does
    not come back whole from pickling travels as a RuntimeError with its type and message."""
    chain: list[tuple[BaseException, list[str]]] = []
    seen: BaseException | None = error
    while seen is not None and len(chain) < _CHAIN:
        try:
            whole = type(pickle.loads(pickle.dumps(seen))) is type(seen)
        except Exception:  # any exception that does not pickle travels as its text
            whole = False
        kind = type(seen)
        copy = seen if whole else RuntimeError(f"{kind.__module__}.{kind.__qualname__}: {seen}")
        chain.append((copy, list(getattr(seen, "__notes__", ()))))
        seen = seen.__cause__
    return chain


def _rebuilt(chain: list[tuple[BaseException, list[str]]], text: str) -> BaseException:
    """The exception the compiler process raised, its causes linked again, its traceback the
    innermost cause."""
    errors = [e for e, _ in chain]
    for error, notes in chain:
        if notes:  # as they were there (pickling may drop them)
            error.__notes__ = notes  # type: ignore[attr-defined]
    for outer, inner in itertools.pairwise(errors):
        outer.__cause__ = inner
    errors[-1].__cause__ = CompilerTraceback(f"in the compiler process:\n{text}")
    return errors[0]


def _crash(status: int | None, said: str) -> CompilerCrash:
    """The error of a compiler process that ended with ``status`` (as ``waitpid`` gives it;
    None: unknown) before replying, having written ``said``."""
    code = 0 if status is None else os.waitstatus_to_exitcode(status)
    if status is None:
        reason, lasting = "the compiler process ended (reaped elsewhere: how is unknown)", False
    elif code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        what = f"{name}: {signal.strsignal(-code) or 'unknown signal'}"
        if -code in LASTING_SIGNALS:
            reason, lasting = f"the compiler crashed ({what})", True
        else:
            reason = f"the compiler process was killed ({what}): out of memory, or from outside"
            lasting = False
    else:
        reason, lasting = f"the compiler exited with status {code}", code != 0
    words = _ERROR_LINE.findall(said)
    if words:
        reason += f": {words[0].strip()}"
    return CompilerCrash(reason, lasting)


#: types pickled as themselves (no class of theirs is touched by pickling)
_PLAIN = frozenset(
    {int, float, complex, bool, str, bytes, type(None), tuple, list, dict, set, frozenset}
)


def _dumps(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bytes | None, list[Any]]:
    """A request: ``fn`` and ``args`` pickled (None if they do not pickle), and the objects
    it references. The arguments travel as their class and fields; plain data (numbers,
    strings, containers) as itself; every other object, ``fn`` included, by reference to the
    object the compiler process was forked with. Pickling by value would change what a kernel
    key describes: it caches ``__slotnames__`` on the class of each object it pickles."""
    refs: list[Any] = []
    out = io.BytesIO()
    try:
        _Pickler(out, refs, args).dump((fn, args))
    except Exception:  # anything that does not pickle goes in memory, in a new process
        return None, refs
    return out.getvalue(), refs


def _instance(cls: Any, fields: dict[str, Any]) -> Any:
    """An object of class ``cls`` with ``fields`` (frozen dataclasses included)."""
    obj = cls.__new__(cls)
    obj.__dict__.update(fields)
    return obj


class _Pickler(pickle.Pickler):
    def __init__(self, file: IO[bytes], refs: list[Any], copied: tuple[Any, ...]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.refs = refs
        self.copied = copied

    def _copied(self, obj: Any) -> bool:
        return any(obj is c for c in self.copied) and hasattr(obj, "__dict__")

    def persistent_id(self, obj: Any) -> int | None:
        if type(obj) in _PLAIN or self._copied(obj):
            return None
        self.refs.append(obj)
        return id(obj)

    def reducer_override(self, obj: Any) -> Any:
        if self._copied(obj):
            return _instance, (type(obj), dict(vars(obj)))
        return NotImplemented


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, pinned: dict[int, Any]) -> None:
        super().__init__(io.BytesIO(data))
        self.pinned = pinned

    def persistent_load(self, pid: Any) -> Any:
        return self.pinned[pid]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _write_message(fd: int, data: bytes) -> None:
    _write_all(fd, _LENGTH.pack(len(data)) + data)


def _read_exactly(fd: int, size: int) -> bytes | None:
    parts, left = [], size
    while left:
        part = os.read(fd, min(left, 1 << 20))
        if not part:
            return None
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _read_message(fd: int) -> bytes | None:
    """One message from ``fd``; None if the pipe closed first."""
    head = _read_exactly(fd, _LENGTH.size)
    return None if head is None else _read_exactly(fd, _LENGTH.unpack(head)[0])


#: (message, category) of the warnings about forking a multithreaded process: JAX's (an
#: at-fork handler) and Python's (3.12 and later)
_FORK_WARNINGS = (
    (r"os\.fork\(\) was called", RuntimeWarning),
    (r"This process \(pid=\d+\) is multi-threaded", DeprecationWarning),
)


def _quiet_fork_warnings() -> None:
    """Silence the warnings about forking for this module's forks (see the module's
    docstring), once: adding a filter again would show every "once" warning again."""
    module = re.escape(__name__) + r"\Z"
    for message, category in _FORK_WARNINGS:
        present = any(
            f[0] == "ignore"
            and f[2] is category
            and getattr(f[1], "pattern", None) == message
            and getattr(f[3], "pattern", None) == module
            for f in warnings.filters
        )
        if not present:
            warnings.filterwarnings("ignore", message=message, category=category, module=module)


#: prctl's option: the signal this process gets when the thread that forked it ends
PR_SET_PDEATHSIG = 1


@functools.cache
def _prctl() -> Any:
    """The C library's ``prctl`` (Linux), looked up before a fork: the compiler process only
    calls it. None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # no C library to ask: no death signal
        return None


def _die_with(parent: int) -> None:
    """In the compiler process: end with the thread that forked it (Linux), and now if the
    process it was forked from is already gone."""
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)
