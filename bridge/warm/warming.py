"""Warming, as Python calls it: read the manifest, plan, compile the missing kernels in the
worker pool, and report.

:func:`warm` returns a :class:`~bridge.warm.outcomes.WarmReport` (``kernelcache warm`` prints it:
:mod:`bridge.cli.warm`); :func:`compile_record` and :func:`compile_manifest` are the forms for one
record and for a whole manifest.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kernelcache import Artifact, CacheError, Store

from ..call.kernel_objects import Variant, decompose
from ..compile.fetch import fetch
from ..exceptions import KernelArgumentError, RootError, TargetError
from ..identity.specialize import specialize
from ..settings import as_cache
from ..vendors import backends
from ..vendors.targets import Target, parse_target
from .manifest import (
    RecordedCall,
    check_record,
    import_kernel,
    load_manifest,
    revive,
)
from .outcomes import WarmProblem, WarmReport, merged
from .planning import make_plan
from .pool import CRASHED, UNSTORED, can_fork, default_workers, execute

if TYPE_CHECKING:
    from ..settings import CacheArg

logger = logging.getLogger(__name__)


def _check_writable(root: str) -> None:
    """Create ``root`` if needed and stage a probe file in it, as a put would.

    Raises:
        RootError: entries cannot be written there.
    """
    try:
        Store.from_settings(root).check_writable()
    except CacheError as e:
        raise RootError(
            e.errno or 0,
            f"{e}; warm into a writable root (--root or KERNELCACHE_DIR): a read-only layer "
            "is read through KERNELCACHE_READONLY_DIRS",
        ) from None


#: the prefix of a warm run's temporary directory, followed by its process's pid and a dash
TEMP_PREFIX = "kernelcache-warm-"


@contextlib.contextmanager
def _private_temp() -> Iterator[None]:
    """Temporary files of the compiles (Triton leaves a PTX file and a log behind when ptxas
    fails) in a directory of this run's, removed with what is in it at the end; those of runs
    whose process is gone (killed) are removed first. Only in a process with no other thread
    (see :func:`can_fork`), whose temporary files are then all the compiles'."""
    if not can_fork():
        yield
        return
    from kernelcache.plugin import pid_alive

    saved, base = tempfile.tempdir, tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            pid = name.removeprefix(TEMP_PREFIX).partition("-")[0]
            if name.startswith(TEMP_PREFIX) and pid.isdigit() and not pid_alive(int(pid)):
                shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    mine = tempfile.tempdir = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-")
    try:
        yield
    finally:
        shutil.rmtree(mine, ignore_errors=True)
        tempfile.tempdir = saved


def _parse_targets(targets: Iterable[str | Target]) -> list[Target]:
    out: list[Target] = []
    for t in targets:
        parsed = parse_target(t)
        if parsed not in out:
            out.append(parsed)
    if not out:
        raise KernelArgumentError("no target given: pass at least one, e.g. cuda:90")
    for t in out:
        backends.make_backend(t)  # a missing vendor backend is an error before any work
    return out


def _check_known(targets: Iterable[Target]) -> None:
    """Refuse, before any compile, a target the compiler Triton runs here does not know (its
    compiles would all fail: ptxas or LLVM refusing the architecture, after pages of dumps).

    Raises:
        TargetError: naming the target and the architectures the compiler knows.
    """
    for t in targets:
        known = t.vendor.known_archs()
        if known is not None and t.arch not in known:
            names = ", ".join(f"{t.backend}:{arch}" for arch in known)
            raise TargetError(
                f"target {t}: the {t.vendor.title} compiler Triton runs here does not know "
                f"{t.arch}; nothing was compiled. It knows {names}"
            )


def warm(
    manifest: str | os.PathLike[str],
    targets: Iterable[str | Target],
    *,
    cache: CacheArg = None,
    jobs: int | None = None,
    allow_changed: bool = False,
    devices: Sequence[str] = (),
    all_configs: bool = False,
    progress: Callable[[int], None] | None = None,
    on_planned: Callable[[int], None] | None = None,
) -> WarmReport:
    """Compile every specialization recorded in ``manifest`` for every target into ``cache``.

    Args:
        manifest: a file written by ``$KERNELCACHE_RECORD``.
        targets: "cuda:90", "hip:gfx942", ...
        cache: a ``kernelcache.Cache``, a root directory, or None for the default cache.
            Workers open the cache by its writable and read-only roots.
        jobs: worker processes (default: the CPUs available; 1 compiles in this process, as
            does a process with other threads running, see :func:`can_fork`).
        allow_changed: compile the current source of kernels whose source or autotune configs
            changed since recording (reported under ``changed``) instead of failing them.
        devices: device kinds (``NVIDIA H200``) whose autotune decisions count: of an autotuned
            call with a decision for one of them (or one pinned for every device), only the
            chosen variant is compiled.
        all_configs: compile every variant of autotuned calls, decided or not.
        progress: called with the number of kernels finished, as they finish.
        on_planned: called once with the number of kernels to compile, before compiling.

    Raises:
        ManifestError: the manifest cannot be read or is not a manifest.
        RootError: there is something to compile and the writable root cannot take it.
        TargetError, BackendUnavailable: a bad target, one Triton's compiler here does not
            know (nothing is compiled), or Triton lacks its backend.
        ValueError: ``jobs`` < 1.
        KeyboardInterrupt: Ctrl-C; while it compiled, the compiles under way are killed, and
            its ``stored`` says how many of the kernels it was compiling are stored: (to
            compile, stored, the root).
    """
    started = time.monotonic()
    if jobs is not None and jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    tgts = _parse_targets(targets)
    loaded = load_manifest(manifest)
    cache = as_cache(cache)
    with contextlib.suppress(OSError):  # the root it writes, made first (its checks: below)
        os.makedirs(cache.root, exist_ok=True)
    _check_known(tgts)  # (before planning, which stores the compiler's identity for each)
    plan = make_plan(loaded, tgts, cache, allow_changed, devices=devices, all_configs=all_configs)
    if plan.jobs:
        _check_writable(str(cache.root))
    workers = min(jobs or default_workers(), len(plan.jobs)) if plan.jobs else 0
    if workers > 1 and not can_fork():
        logger.info(
            "kernelcache: compiling %d kernels in this process: it runs other threads, so "
            "worker processes cannot be forked safely (`kernelcache warm` compiles in parallel)",
            len(plan.jobs),
        )
        workers = 1
    if on_planned is not None:
        on_planned(len(plan.jobs))
    outcomes = list(plan.outcomes)
    problems = list(plan.problems)
    try:
        with _private_temp():
            done = execute(plan.jobs, workers, cache, progress or (lambda n: None))
    except KeyboardInterrupt as e:  # the compiles under way are killed: what is stored, counted
        kept = sum(isinstance(cache.store.inspect(j.key, j.ext), Artifact) for j in plan.jobs)
        e.stored = (len(plan.jobs), kept, str(cache.root))  # type: ignore[attr-defined]
        raise
    for slot, job, outcome in zip(plan.slots, plan.jobs, done, strict=True):
        outcomes[slot] = outcome
        if outcome.status == "failed":
            error = outcome.error or ""
            kind = (
                "crash"
                if error == CRASHED
                else "store"
                if error.startswith(UNSTORED)
                else "compile"
            )
            problems.append(
                WarmProblem(
                    kind,
                    outcome.error or "failed",
                    outcome.kernel,
                    outcome.target,
                    outcome.config,
                    job.call.config_lines.get(outcome.config, job.call.lines),
                )
            )
    return WarmReport(
        manifest=loaded.path,
        root=str(cache.root),
        readonly_roots=tuple(str(s.root) for s in cache.readonly),
        targets=tuple(str(t) for t in tgts),
        records=loaded.records,
        calls=len(loaded.calls),
        kernels=len({c.kernel for c in loaded.calls}),
        results=tuple(r for r in outcomes if r is not None),
        failures=merged(problems),
        changed=merged(plan.changed),
        workers=workers,
        seconds=time.monotonic() - started,
    )


def compile_record(record: Mapping[str, Any], target: str | Target, cache: CacheArg = None) -> str:
    """Fetch or compile the variant of one record for ``target``; returns its key.

    Raises:
        KernelArgumentError / OptionError: the record is malformed, or does not fit the kernel
            or the target.
    """
    problem = check_record(record)
    if problem is not None:
        raise KernelArgumentError(f"not a usable record: {problem}")
    tgt = parse_target(target)
    call = RecordedCall.from_record(record)
    parts = decompose(import_kernel(call.kernel))
    counter = [0]
    named, _, _ = call.revived(tgt, counter)
    recorded = record.get("variant") or {"kwargs": {}, "options": call.options}
    variant_kwargs = {k: revive(v, counter) for k, v in recorded["kwargs"].items()}
    for name in call.target_params:
        if name in variant_kwargs:
            variant_kwargs[name] = named[name]
    args = recorded.get("args")  # descriptors a config's pre_hook changed
    variant = Variant(
        kwargs=variant_kwargs,
        options={k: revive(v, counter) for k, v in recorded["options"].items()},
        description=record.get("config") or "",
        args={k: revive(v, counter) for k, v in args.items()} if isinstance(args, dict) else {},
    )
    backends.check_options(tgt, set(variant.options))
    cache = as_cache(cache)
    spec = specialize(parts, named, variant, tgt, cache)
    fetch(spec, cache)
    return spec.key


def compile_manifest(
    path: str | os.PathLike[str],
    targets: Iterable[str | Target],
    cache: CacheArg = None,
    *,
    jobs: int = 1,
) -> dict[str, list[str]]:
    """Warm every record of a manifest for every target; returns the keys per target (not
    those of configs that cannot compile).

    Raises:
        KernelArgumentError: something could not be warmed (the message lists what and why).
    """
    report = warm(path, targets, cache=cache, jobs=jobs)
    if report.failures:
        raise KernelArgumentError(
            "could not warm "
            + "; ".join(f"{f.where()}: {f.detail.splitlines()[0]}" for f in report.failures)
        )
    out: dict[str, list[str]] = {t: [] for t in report.targets}
    for r in report.results:
        if r.status != "left-out":
            out[r.target].append(r.key)
    return out
