"""The worker pool: compiling a plan's jobs in forked processes (or in this one).

Workers are forked from the planning process, so they share its imported Triton and memoized
identities (see :func:`can_fork`); each re-binds its job and checks that the key is still the
planned one before compiling. A worker exits as soon as the process that forked it is gone.
A compiler process that dies (a crash inside Triton/LLVM, or killed for memory) breaks the
pool: every job it left unfinished then runs again on its own, so the culprit is named.

Across processes: workers publish through the cache (atomic, first writer wins, one builder per
key across every process sharing the root).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .. import backends
from ..specialize import fetch
from ..targets import parse_target
from .plan import Job, present, resolve, specializations
from .report import WarmOutcome

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


def compile_job(job: Job, cache: Cache | None = None) -> WarmOutcome:
    """Fetch or compile one job (in a worker process, or in this one with ``cache``).

    Never raises for a kernel that fails to compile: the failure and the compiler's
    diagnostics are the result.
    """
    started = time.monotonic()
    target = parse_target(job.target)
    ext = backends.make_backend(target).binary_ext
    cache = cache if cache is not None else _worker_cache(job.root, job.readonly)

    def result(status: str, error: str | None = None) -> WarmOutcome:
        return WarmOutcome(
            job.call.kernel,
            job.target,
            job.config,
            job.key,
            ext,
            status,
            time.monotonic() - started,
            error=error,
        )

    captured: list[str] = []
    try:
        parts = resolve(job.call)
        spec = specializations(job.call, parts, target, cache)[job.index]
        if spec.key != job.key:
            return result(
                "failed",
                f"the kernel key changed between planning and compiling ({job.key[:16]} -> "
                f"{spec.key[:16]}): the kernel's module changed during the run; run warm again",
            )
        with _captured_stderr() as captured:
            kb = fetch(spec, cache)
    except Exception as e:  # a kernel that does not compile is a reported failure, not a crash
        said = "".join(captured).strip()
        message = f"{type(e).__name__}: {e}".strip()
        if said:
            message += "\n" + said[-_DIAGNOSTIC_CHARS:]
        return result("failed", message)
    said = "".join(captured).strip()
    if said:
        logger.info("while compiling %s for %s:\n%s", job.call.kernel, job.target, said)
    from kernelcache import stats

    stats.flush()  # a pool worker never runs exit handlers
    if present(cache, spec.key, ext, target.backend == "cuda") is None:
        return result(
            "failed",
            f"compiled, but the kernel could not be stored under {cache.root}"
            + (f": {said[-_DIAGNOSTIC_CHARS:]}" if said else "")
            + " (check the root with `kernelcache doctor`)",
        )
    return result("compiled" if kb.built else "present")


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


#: the error of a job whose compiler process died
CRASHED = (
    "the compiler process died (a crash inside Triton/LLVM, or killed for memory); run "
    "`kernelcache warm` with --jobs 1 to see its output"
)


def execute(
    jobs: Sequence[Job], workers: int, cache: Cache, progress: Callable[[int], None]
) -> list[WarmOutcome]:
    """Run ``jobs``: in this process when ``workers`` is 1, else in a pool of forked processes
    (see :func:`can_fork`)."""
    if workers <= 1 or len(jobs) <= 1:
        results = []
        for job in jobs:
            results.append(compile_job(job, cache))
            progress(1)
        return results
    from kernelcache import stats

    stats.flush()  # forked workers start from flushed counters: nothing is counted twice
    logger.debug("compiling %d kernels in %d forked processes", len(jobs), workers)
    done: dict[int, WarmOutcome] = {}
    pending = _pool_run(jobs, workers, done, progress)
    for i in pending:  # the pool broke: each unfinished job again, alone, to find the culprit
        _pool_run([jobs[i]], 1, done, progress, offset=i)
    return [done[i] for i in range(len(jobs))]


def _exit_with_parent(parent: int) -> None:
    """In a pool worker: exit as soon as the process that forked it is gone.

    A warm killed with SIGKILL cannot shut its pool down, and its workers would wait forever on
    a queue that their siblings keep open (holding the caller's pipes open too).
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=watch, name="kernelcache-warm-watchdog", daemon=True).start()


def _pool_run(
    jobs: Sequence[Job],
    workers: int,
    done: dict[int, WarmOutcome],
    progress: Callable[[int], None],
    offset: int = 0,
) -> list[int]:
    """Run ``jobs`` in a pool; returns the indices left unfinished by a broken pool (or, for
    a single job, records it as crashed)."""
    from concurrent.futures.process import BrokenProcessPool

    pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("fork"),
        initializer=_exit_with_parent,
        initargs=(os.getpid(),),
    )
    broken: list[int] = []
    try:
        futures = {pool.submit(compile_job, job): offset + i for i, job in enumerate(jobs)}
        for future in concurrent.futures.as_completed(futures):
            i = futures[future]
            try:
                done[i] = future.result()
            except BrokenProcessPool:
                if len(jobs) == 1:
                    job = jobs[0]
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
            progress(1)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return sorted(broken)
