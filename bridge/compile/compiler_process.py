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
import logging
import os
import pickle
import re
import signal
import sys
import tempfile
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any, NoReturn

from ..exceptions import CompilerCrash
from . import wire

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
#: a line of the compiler's last words that says what went wrong
_ERROR_LINE = re.compile(r"^.*\berror\b.*$", re.IGNORECASE | re.MULTILINE)


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
    from kernelcache.plugin import warn_once

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
        message, refs = wire.dumps(fn, args)
        known = all(self.pinned.get(id(r)) is r for r in refs)
        if self.pid and message is not None and known:
            try:
                wire.write_message(self.requests, message)
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
            data = wire.read_message(self.replies)
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
        return Ran(error=wire.rebuilt(*payload), said=said)

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
                wire.write_all(2, data)
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
            wire.write_message(replies, _attempt(fn, args))
            message = wire.read_message(requests)
            current = None if message is None else wire.Unpickler(message, process.pinned).load()
    finally:
        os._exit(0)


def _attempt(fn: Callable[..., Any], args: tuple[Any, ...]) -> bytes:
    """The reply to one request: ``fn(*args)``'s value, or what it raised."""
    try:
        return pickle.dumps(("value", fn(*args)), protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException as e:  # carried back and raised there
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        return pickle.dumps(("error", wire.portable(e), text), protocol=pickle.HIGHEST_PROTOCOL)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


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
