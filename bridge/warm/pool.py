"""The worker pool: compiling a plan's jobs in forked processes (or in this one).

Workers are forked from the planning process, so they share its imported Triton and memoized
identities (see :func:`can_fork`); each re-binds its job and checks that the key is still the
planned one before compiling. A worker exits as soon as the process that forked it is gone.
A crash of Triton's compiler fails only its job (the compile runs in a compiler process of its
own, :mod:`bridge.compile.compiler_process`: the kernel is left out). A worker that dies (a crash
outside the compiler, or killed for memory) breaks the pool: every job it left unfinished then
runs again on its own, so the culprit is named.

Ctrl-C: each worker is the leader of a process group of its own (its compiler process and the
tools it runs are in it); an interruption kills those groups at once, rather than waiting for
the compiles under way, and is noticed even where Python drops the exception (a signal that
arrives while a worker is forked: :func:`interruptible`).

Across processes: workers publish through the cache (atomic, first writer wins, one builder per
key across every process sharing the root). A kernel that another process is compiling is
skipped at first and waited for once the rest is done, so every worker compiles while anything
is left to compile (see :func:`execute`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..compile.compiler import Compiled
from ..compile.fetch import KernelBinary, Request, fetch_each, request
from ..exceptions import LeftOut
from ..identity.specialize import Specialization
from ..vendors.targets import parse_target
from .outcomes import WarmOutcome
from .planning import Job, kernel_parts, present, specialization

if TYPE_CHECKING:
    from kernelcache import Cache

logger = logging.getLogger(__name__)

_DIAGNOSTIC_CHARS = 4000
#: the CPU quota of this process's cgroup (v2): "<quota> <period>" or "max <period>"
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


@contextlib.contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """Collect what native code (MLIR diagnostics, ptxas) writes to file descriptor 2."""
    text: list[str] = []
    sys.stderr.flush()
    with tempfile.TemporaryFile() as tmp:
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield text
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text.append(tmp.read().decode(errors="replace"))


_worker_caches: dict[tuple[str, tuple[str, ...]], Cache] = {}


def _worker_cache(root: str, readonly: tuple[str, ...]) -> Cache:
    cache = _worker_caches.get((root, readonly))
    if cache is None:
        import kernelcache

        cache = _worker_caches[(root, readonly)] = kernelcache.Cache(
            root=root, readonly_roots=readonly
        )
    return cache


def _prepare(job: Job, cache: Cache) -> Specialization | str:
    """The specialization of ``job``, re-bound in this process; or why it cannot be compiled."""
    try:
        parts = kernel_parts(job.call)
        spec = specialization(job.call, parts, parse_target(job.target), cache, job.index)
    except Exception as e:  # a kernel that no longer binds is a reported failure, not a crash
        return f"{type(e).__name__}: {e}".strip()
    if spec.key != job.key:
        return (
            f"the kernel key changed between planning and compiling ({job.key[:16]} -> "
            f"{spec.key[:16]}): the kernel's module changed during the run; run warm again"
        )
    return spec


@dataclass
class _Compiling:
    """What the compiler of one job said on fd 2, and how long it ran in this process."""

    said: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def request(self, spec: Specialization) -> Request:
        """The request of ``spec``, compiled with the diagnostics collected here."""
        plain = request(spec)

        def build() -> Compiled:
            started = time.monotonic()
            text: list[str] = []
            try:
                with _captured_stderr() as text:
                    return plain.build()
            finally:
                self.said.extend(text)
                self.seconds += time.monotonic() - started

        return dataclasses.replace(plain, build=build)


def _outcome(
    job: Job,
    spec: Specialization | str,
    result: KernelBinary | Exception | None,
    compiling: _Compiling,
    seconds: float,
    cache: Cache,
) -> WarmOutcome:
    """The outcome of ``job`` from what fetching it gave (``spec`` a string: why it failed)."""
    text = "".join(compiling.said).strip()

    def outcome(status: str, error: str | None = None) -> WarmOutcome:
        return WarmOutcome(
            job.call.kernel, job.target, job.config, job.key, job.ext, status, seconds, error=error
        )

    if isinstance(spec, str):
        return outcome("failed", spec)
    if isinstance(result, LeftOut):  # cannot compile, as Triton's autotuner leaves configs out
        return outcome("left-out", result.reason)
    if result is None or isinstance(result, Exception):
        message = f"{type(result).__name__}: {result}".strip()
        if text:
            message += "\n" + text[-_DIAGNOSTIC_CHARS:]
        return outcome("failed", message)
    if text:
        logger.info("while compiling %s for %s:\n%s", job.call.kernel, job.target, text)
    if present(cache, spec) is None:
        return outcome(
            "failed",
            f"{UNSTORED} {cache.root}{_why_unstored(cache.root)}"
            + (f": {text[-_DIAGNOSTIC_CHARS:]}" if text else "")
            + " (check the root with `kernelcache doctor`)",
        )
    return outcome("compiled" if result.built else "present")


#: how the detail of a kernel that compiled but could not be stored begins (problem kind
#: ``store``, not ``compile``: the environment failed, not the compiler)
UNSTORED = "compiled, but the kernel could not be stored under"


def _why_unstored(root: str) -> str:
    """What keeps ``root`` from taking entries, as far as its filesystem says ("": nothing
    visible)."""
    try:
        st = os.statvfs(root)
    except OSError as e:
        return f": {e.strerror}"
    free = st.f_bavail * st.f_frsize
    if free < 1 << 20:
        return f": no space left on its filesystem ({free:,} bytes free)"
    if not os.access(root, os.W_OK):
        return ": the root is not writable"
    return ""


def compile_job(job: Job, cache: Cache | None = None, *, wait: bool = True) -> WarmOutcome | None:
    """Fetch or compile one job (in a worker process, or in this one with ``cache``).

    With ``wait=False``, a kernel that another process is compiling is not waited for: the
    result is then None. Never raises for a kernel that fails to compile: the failure and the
    compiler's diagnostics are the result.
    """
    started = time.monotonic()
    cache = cache if cache is not None else _worker_cache(job.root, job.readonly)
    spec = _prepare(job, cache)
    compiling = _Compiling()
    result: KernelBinary | Exception | None = None
    if not isinstance(spec, str):
        ((_, result),) = fetch_each(cache, [compiling.request(spec)], wait=wait)
        if result is None:
            return None
    from kernelcache.plugin import flush

    flush()  # a pool worker never runs exit handlers
    return _outcome(job, spec, result, compiling, time.monotonic() - started, cache)


@contextlib.contextmanager
def interruptible() -> Iterator[Callable[[], None]]:
    """SIGINT raises KeyboardInterrupt, as Python's own handler does, and is remembered: the
    check this yields raises it again where Python dropped it (an exception in a fork's
    handlers is only printed). Outside the main thread, Python's handler stays."""
    hit: list[bool] = []

    def handler(signum: int, frame: object) -> None:
        hit.append(True)
        raise KeyboardInterrupt

    def check() -> None:
        if hit:
            raise KeyboardInterrupt

    try:
        before = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread
        yield check
        return
    try:
        yield check
    finally:
        signal.signal(signal.SIGINT, before)


def compile_jobs(
    jobs: Sequence[Job],
    cache: Cache,
    progress: Callable[[int], None],
    check: Callable[[], None] = lambda: None,
) -> list[WarmOutcome]:
    """Fetch or compile ``jobs`` in this process, with work stealing: first every kernel that
    no other process is compiling, then the others as their compilers finish (taking over from
    a compiler that died; see :func:`bridge.compile.fetch.fetch_each`). Calls ``progress(1)`` as
    each job finishes. A job's seconds: its compile, else the time until its kernel was there.
    """
    started = time.monotonic()
    specs = [_prepare(job, cache) for job in jobs]
    compiling = [_Compiling() for _ in jobs]
    done: dict[int, WarmOutcome] = {}
    todo: list[tuple[int, Specialization]] = []
    for i, spec in enumerate(specs):
        if isinstance(spec, str):
            done[i] = _outcome(jobs[i], spec, None, compiling[i], 0.0, cache)
            progress(1)
        else:
            todo.append((i, spec))
    requests = [compiling[i].request(spec) for i, spec in todo]
    for n, result in fetch_each(cache, requests):
        check()
        i, spec = todo[n]
        seconds = compiling[i].seconds or time.monotonic() - started
        done[i] = _outcome(jobs[i], spec, result, compiling[i], seconds, cache)
        progress(1)
    return [done[i] for i in range(len(jobs))]


def default_workers() -> int:
    """Processes to compile in: the CPUs this process may use (affinity and cgroup quota)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    with contextlib.suppress(OSError, ValueError, IndexError):
        quota, period = CGROUP_CPU_MAX.read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, int(int(quota) / int(period) + 0.5)))
    return max(1, cpus)


def can_fork() -> bool:
    """Whether worker processes can be forked safely: a single-threaded process on Linux.

    Forked workers share the planning process's imported Triton and memoized identities, so
    none pays for importing Triton or for ``triton_key()``. Forking a process with other
    threads can deadlock the child (a lock held by a thread that does not exist there), and
    spawning would re-run the caller's main module; such callers compile in-process.
    """
    return sys.platform == "linux" and threading.active_count() == 1


#: the error of a job whose worker process died
CRASHED = (
    "the worker process died (a crash outside Triton's compiler, or killed for memory); run "
    "`kernelcache warm` with --jobs 1 to see its output"
)


def execute(
    jobs: Sequence[Job], workers: int, cache: Cache, progress: Callable[[int], None]
) -> list[WarmOutcome]:
    """Run ``jobs``: in this process when ``workers`` is 1, else in a pool of forked processes
    (see :func:`can_fork`).

    Work stealing across processes sharing the root (other warm runs, jobs lowering the same
    kernels): pool workers first skip a kernel that another process is compiling; once every
    other kernel is done, those are handed to the pool again, whose workers wait for them
    (taking over any whose compiler died). Each kernel is compiled once across them all, and a
    compiler that crashes only ever takes a worker down."""
    with interruptible() as check:
        if workers <= 1 or len(jobs) <= 1:
            return compile_jobs(jobs, cache, progress, check)
        from kernelcache.plugin import flush

        flush()  # forked workers start from flushed counters: nothing is counted twice
        logger.debug("compiling %d kernels in %d forked processes", len(jobs), workers)
        done: dict[int, WarmOutcome | None] = {}
        for wait in (False, True):  # skip what others compile, then wait for it
            todo = [i for i in range(len(jobs)) if done.get(i) is None]
            if not todo:
                break
            pending = _pool_run(jobs, todo, workers, done, progress, check, wait=wait)
            for i in pending:  # the pool broke: each unfinished job again, alone (the culprit)
                _pool_run(jobs, [i], 1, done, progress, check, wait=wait)
    outcomes = [done[i] for i in range(len(jobs))]
    assert all(o is not None for o in outcomes)
    return outcomes  # type: ignore[return-value]  # the second round waited for every job


def _worker_start(parent: int) -> None:
    """In a pool worker: lead a process group of its own (what it starts is in it: killed
    with it, see :func:`_kill_workers`), and exit as soon as the process that forked it is
    gone.

    A warm killed with SIGKILL cannot shut its pool down, and its workers would wait forever on
    a queue that their siblings keep open (holding the caller's pipes open too).
    """
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=watch, name="kernelcache-warm-watchdog", daemon=True).start()


def _kill_workers(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """Kill every worker of ``pool`` with what it started (its process group: a compiler
    process, the tools it runs), at once."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        with contextlib.suppress(OSError):  # (gone already; or not its group's leader yet)
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(process.pid, signal.SIGKILL)


#: seconds between two looks at whether Ctrl-C was dropped, while the pool works
_LOOK = 0.2


def _pool_run(
    jobs: Sequence[Job],
    indices: Sequence[int],
    workers: int,
    done: dict[int, WarmOutcome | None],
    progress: Callable[[int], None],
    check: Callable[[], None],
    *,
    wait: bool,
) -> list[int]:
    """Run ``jobs[i]`` for each of ``indices`` in a pool (without ``wait``, a kernel that
    another process is compiling is recorded as None); returns the indices left unfinished by
    a broken pool (or, for a single job, records it as crashed). Interrupted (``check``
    raises, or Ctrl-C), it kills its workers and what they started, and raises."""
    from concurrent.futures.process import BrokenProcessPool

    pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("fork"),
        initializer=_worker_start,
        initargs=(os.getpid(),),
    )
    broken: list[int] = []
    try:
        futures = {pool.submit(compile_job, jobs[i], wait=wait): i for i in indices}
        for future in _completed(futures, check):
            i = futures[future]
            try:
                done[i] = future.result()
            except BrokenProcessPool:
                if len(indices) == 1:
                    job = jobs[i]
                    done[i] = WarmOutcome(
                        job.call.kernel,
                        job.target,
                        job.config,
                        job.key,
                        job.ext,
                        "failed",
                        error=CRASHED,
                    )
                else:
                    broken.append(i)
                    continue
            if done[i] is not None:
                progress(1)
    except BaseException:
        _kill_workers(pool)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return sorted(broken)


def _completed(
    futures: Iterable[concurrent.futures.Future[WarmOutcome | None]], check: Callable[[], None]
) -> Iterator[concurrent.futures.Future[WarmOutcome | None]]:
    """``futures`` as they complete, calling ``check`` every :data:`_LOOK` seconds meanwhile."""
    pending = set(futures)
    while pending:
        finished, pending = concurrent.futures.wait(
            pending, timeout=_LOOK, return_when=concurrent.futures.FIRST_COMPLETED
        )
        check()
        yield from finished
