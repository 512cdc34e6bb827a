"""Warming: compile recorded specializations for any target, without a GPU and without the
program that recorded them.

A manifest (written by ``$KERNELCACHE_RECORD``, see :mod:`bridge.record` and docs/warm.md) holds
one record per lowered specialization. :func:`warm` groups its records into distinct calls
(kernel, abstract arguments, options), imports each kernel, and for every target does what a
lowering there does: rebuild the call with placeholder arrays, expand the autotune and heuristics
layers (every config), bind with Triton's binder and compute the kernel key. Keys already in the
cache are "present"; the others are compiled by a pool of worker processes into the writable
root, under exactly the keys a later lowering for that target computes, so that lowering is a
hit and runs no Triton compile.

Plan, then execute: the plan (keys, what is present, what cannot be warmed and why) is made in
this process without compiling anything; only the missing kernels go to the workers. A re-run
over a warm root therefore compiles nothing and starts no worker.

Across processes: workers publish through the cache (atomic, first writer wins, one builder per
key across every process sharing the root), so several warms, or a warm and running jobs, may
share a root at the same time.

A record whose kernel no longer exists, whose source text changed since it was recorded, or that
no longer fits the kernel is reported with the reason and makes the run fail; nothing stale can be
served, because the kernel key covers the kernel's source.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import importlib
import json as jsonlib
import logging
import multiprocessing
import os
import re
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelcache import CacheError, Store
from kernelcache.jsonio import load_json

from . import backends, binding, keys
from .artifacts import PTX_EXT, as_cache, entry_metadata, fetch
from .binding import ArgArray
from .compile import compile_source, output_to_stderr
from .errors import BridgeError, KernelArgumentError, OptionError
from .kernels import KernelParts, decompose
from .record import RECORD_VERSION, source_digest
from .targets import MAX_THREADS_PER_BLOCK, Target, parse_target

logger = logging.getLogger(__name__)

#: version of the ``--json`` document (the CLI's schema)
SCHEMA = 1
#: failure kinds, in the order the summary lists them
KINDS = (
    "bad-record",
    "not-importable",
    "missing-kernel",
    "source-changed",
    "configs-changed",
    "invalid",
    "compile",
    "crash",
)
_DIAGNOSTIC_CHARS = 4000
#: the CPU quota of this process's cgroup (v2): "<quota> <period>" or "max <period>"
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


class ManifestError(BridgeError, ValueError):
    """The manifest cannot be read at all, or is not a manifest (a usage error: exit 2)."""


class RootError(BridgeError, OSError):
    """The writable cache root cannot take entries: nothing would be kept (exit 1)."""


# -- importing kernels ----------------------------------------------------------------------
#: a dotted Python name (module path or qualified name)
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


def import_kernel(path: str) -> Any:
    """The kernel object named ``module:qualname`` (the autotune/heuristics wrapper if any).

    Raises:
        KernelArgumentError: the module or name cannot be found, or importing the module
            failed (the message carries the module's own error).
    """
    module_name, _, qualname = path.partition(":")
    if not module_name or not qualname or "<locals>" in qualname or "<lambda>" in qualname:
        raise KernelArgumentError(f"{path} is not importable: define kernels at module level")
    if not (_DOTTED.fullmatch(module_name) and _DOTTED.fullmatch(qualname)):
        raise KernelArgumentError(
            f"{path!r} is not a kernel import path: expected module.name:Qualified.name"
        )
    if module_name == "__main__":
        raise KernelArgumentError(
            f"{path} was defined in a script run as __main__: move it into a module"
        )
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise KernelArgumentError(f"cannot import the kernel {path}: {e}") from None
    except Exception as e:  # the user's module failed while importing: report its error
        raise KernelArgumentError(
            f"importing {module_name} for {path} raised {type(e).__name__}: {e}"
        ) from None
    try:
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except AttributeError as e:
        raise KernelArgumentError(f"cannot import the kernel {path}: {e}") from None
    return obj


def revive(value: Any, counter: list[int]) -> Any:
    """The inverse of :func:`bridge.record.plain` for what a call can contain.

    Raises:
        KernelArgumentError: a value that was recorded only by its ``repr``.
    """
    if isinstance(value, list):
        return tuple(revive(v, counter) for v in value)
    if isinstance(value, dict):
        if "array" in value:
            counter[0] += 1
            return ArgArray(value["shape"], value["array"], ("in", counter[0] - 1))
        if "dtype" in value:
            import triton.language as tl

            return tl.dtype(value["dtype"])
        if "jit" in value:
            return import_kernel(value["jit"])
        raise KernelArgumentError(f"a recorded value cannot be rebuilt: {value}")
    return value


# -- the manifest -------------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    """One distinct recorded call: a kernel with abstract arguments and options.

    Records of the same call (one per autotune config, possibly from several processes and
    recording targets) are one Call. Arguments that follow the target's warp size
    (``target_params``) are replaced per target.
    """

    kernel: str
    arguments: Mapping[str, Any]
    kwargs: tuple[str, ...]
    options: Mapping[str, Any]
    target_params: Mapping[str, str]
    lines: tuple[int, ...]
    sources: frozenset[str] = frozenset()
    #: autotune configs recorded, by the Triton version that recorded them
    configs: Mapping[str, frozenset[str]] = field(default_factory=dict)
    problem: str | None = None  # why the recording process thought it cannot be imported
    config_lines: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def for_target(self, target: Target) -> dict[str, Any]:
        """The recorded arguments, with the warp-size arguments set for ``target``."""
        args = dict(self.arguments)
        for name, what in self.target_params.items():
            if what == "warp_size" and name in args:
                args[name] = target.warp_size
        return args


@dataclass(frozen=True)
class Failure:
    """Something that could not be warmed, and why (``kind`` is one of :data:`KINDS`)."""

    kind: str
    detail: str
    kernel: str | None = None
    target: str | None = None  # None: every target
    config: str = ""
    lines: tuple[int, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "kernel": self.kernel,
            "target": self.target,
            "config": self.config,
            "lines": list(self.lines),
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Manifest:
    """A manifest read: its distinct calls and the lines that are not usable records."""

    path: str
    records: int
    calls: tuple[Call, ...]
    failures: tuple[Failure, ...]


def _open_regular(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ManifestError(f"cannot read the manifest {path}: {e.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ManifestError(f"the manifest {path} is not a regular file")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    except OSError as e:
        raise ManifestError(f"cannot read the manifest {path}: {e.strerror}") from None
    finally:
        os.close(fd)


def _check_record(rec: Any) -> str | None:
    """What is wrong with a parsed line, or None."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    version = rec.get("version")
    if not isinstance(version, int):
        return "no record version"
    if version > RECORD_VERSION:
        return (
            f"record version {version} was written by a newer kernelcache; this one reads "
            f"version {RECORD_VERSION}: upgrade kernelcache where you warm"
        )
    for name, kind in (("kernel", str), ("arguments", dict), ("options", dict)):
        if not isinstance(rec.get(name), kind):
            return f"field {name!r} is missing or not a {kind.__name__}"
    return None


def _call_ident(rec: Mapping[str, Any], target_params: Mapping[str, str]) -> str:
    args = {k: ("<target>" if k in target_params else v) for k, v in rec["arguments"].items()}
    kwargs = sorted(rec.get("kwargs") or {})
    return jsonlib.dumps([rec["kernel"], args, kwargs, rec["options"]], sort_keys=True)


def load_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read a manifest: distinct calls in first-seen order, and unusable lines as failures.

    Raises:
        ManifestError: the file cannot be read, or no line of it is a record.
    """
    name = os.fspath(path)
    raw = _open_regular(name)
    groups: dict[str, dict[str, Any]] = {}
    failures: list[Failure] = []
    records = 0
    nonblank = 0
    newer = 0  # records of a later format: a manifest, just not one this version reads
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        nonblank += 1
        try:
            rec = load_json(line)
        except ValueError as e:  # includes a UnicodeDecodeError
            failures.append(
                Failure(
                    "bad-record",
                    f"line {number} is not a JSON record ({e}): a writer died mid-line or the "
                    "file was edited; delete the line or record the manifest again",
                    lines=(number,),
                )
            )
            continue
        problem = _check_record(rec)
        if problem is not None:
            newer += (
                isinstance(rec, dict)
                and isinstance(rec.get("version"), int)
                and (rec["version"] > RECORD_VERSION)
            )
            kernel = rec.get("kernel") if isinstance(rec, dict) else None
            failures.append(
                Failure(
                    "bad-record",
                    f"line {number}: {problem}",
                    kernel if isinstance(kernel, str) else None,
                    lines=(number,),
                )
            )
            continue
        records += 1
        params = rec.get("target_params") or {}
        ident = _call_ident(rec, params)
        group = groups.setdefault(
            ident,
            {
                "first": rec,
                "lines": [],
                "sources": set(),
                "configs": {},
                "problem": None,
                "config_lines": {},
            },
        )
        group["lines"].append(number)
        group["config_lines"].setdefault(str(rec.get("config") or ""), []).append(number)
        if rec.get("source"):
            group["sources"].add(rec["source"])
        triton = (rec.get("producer") or {}).get("triton")
        if triton:
            group["configs"].setdefault(triton, set()).add(str(rec.get("config") or ""))
        if rec.get("importable") is False and group["problem"] is None:
            group["problem"] = rec.get("problem") or "marked not importable when recorded"
    if nonblank and not records and not newer:
        raise ManifestError(
            f"{name} is not a kernelcache manifest (no line is a record): pass the file "
            "that KERNELCACHE_RECORD wrote"
        )
    calls = []
    for group in groups.values():
        first = group["first"]
        calls.append(
            Call(
                kernel=first["kernel"],
                arguments=first["arguments"],
                kwargs=tuple(sorted(first.get("kwargs") or {})),
                options=first["options"],
                target_params=dict(first.get("target_params") or {}),
                lines=tuple(group["lines"]),
                sources=frozenset(group["sources"]),
                configs={t: frozenset(c) for t, c in group["configs"].items()},
                problem=group["problem"],
                config_lines={c: tuple(n) for c, n in group["config_lines"].items()},
            )
        )
    return Manifest(name, records, tuple(calls), tuple(failures))


def read_manifest(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The usable records of a manifest, one per distinct (kernel, call, variant)."""
    seen: dict[str, dict[str, Any]] = {}
    for line in _open_regular(os.fspath(path)).splitlines():
        with contextlib.suppress(ValueError):
            rec = load_json(line)
            if _check_record(rec) is None:
                ident = jsonlib.dumps(
                    [rec["kernel"], rec["arguments"], rec.get("variant")], sort_keys=True
                )
                seen.setdefault(ident, rec)
    return list(seen.values())


# -- planning: from a call and a target to kernel keys ------------------------------------
@dataclass(frozen=True)
class Spec:
    """One specialization of a call for a target, bound and keyed (not compiled)."""

    variant: binding.Variant
    bound: binding.Bound
    src: Any
    key: str


def _resolve(call: Call) -> KernelParts:
    return decompose(import_kernel(call.kernel))


def specializations(call: Call, parts: KernelParts, target: Target, cache: Any) -> list[Spec]:
    """Every variant of ``call`` for ``target`` (autotune configs after pruning, heuristics
    applied), bound and keyed exactly as a lowering for ``target`` does it.

    Raises:
        BridgeError (or whatever the kernel's own heuristics or prune functions raise): the
            call does not fit the kernel or the target.
    """
    counter = [0]
    named = {k: revive(v, counter) for k, v in call.for_target(target).items()}
    kwargs = {k: named[k] for k in call.kwargs if k in named}
    options = {k: revive(v, counter) for k, v in call.options.items()}
    backends.check_options(target, set(options))
    backend = backends.make_backend(target)
    out = []
    for variant in binding.expand_variants(parts, named, kwargs, options):
        bound = binding.bind(parts, backend, named, variant)
        warps = int(bound.options.num_warps)
        if warps * target.warp_size > MAX_THREADS_PER_BLOCK:
            raise OptionError(
                f"num_warps={warps} on {target} means {warps * target.warp_size} threads per "
                f"block; the limit is {MAX_THREADS_PER_BLOCK}"
            )
        src = keys.source(parts.fn, parts.is_gluon, bound.signature, bound.constexprs, bound.attrs)
        key = keys.kernel_key(cache, target, backend, src, bound.options, parts.language)
        out.append(Spec(variant, bound, src, key))
    return out


def present(cache: Any, key: str, ext: str, need_ptx: bool) -> str | None:
    """The layer ("local" or "readonly") that already holds a usable ``key``, or None.

    Usable means what a lowering needs without compiling: the verified binary and, on CUDA,
    the PTX whose digest its metadata names. Nothing is counted as a hit or a miss.
    """
    from kernelcache import Artifact

    from .keys import derived_key

    found = None
    for store in cache.layers:
        art = store.read(key, ext)
        if isinstance(art, Artifact):
            found = art
            break
    if found is None:
        return None
    if need_ptx:
        want = found.meta.get("ptx_sha256")
        ptx_key = derived_key(key, PTX_EXT)
        for store in cache.layers:
            art = store.read(ptx_key, PTX_EXT)
            if isinstance(art, Artifact) and want and hashlib.sha256(art.data).hexdigest() == want:
                return found.source
        return None
    return found.source


# -- executing: the compile jobs ------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    """One kernel to compile: a call's ``index``-th variant for ``target``, expected ``key``."""

    call: Call
    target: str
    index: int
    key: str
    ext: str
    config: str
    root: str
    readonly: tuple[str, ...]


@dataclass(frozen=True)
class Result:
    """What became of one specialization for one target."""

    kernel: str
    target: str
    config: str
    key: str
    ext: str
    status: str  # "compiled", "present" or "failed"
    seconds: float = 0.0
    layer: str | None = None  # where a present entry was found: "local" or "readonly"
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "target": self.target,
            "config": self.config,
            "key": self.key,
            "ext": self.ext,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "layer": self.layer,
            "error": self.error,
        }


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


_worker_caches: dict[tuple[str, tuple[str, ...]], Any] = {}


def _worker_cache(root: str, readonly: tuple[str, ...]) -> Any:
    cache = _worker_caches.get((root, readonly))
    if cache is None:
        import kernelcache

        cache = _worker_caches[(root, readonly)] = kernelcache.Cache(
            root=root, readonly_roots=readonly
        )
    return cache


def compile_job(job: Job, cache: Any = None) -> Result:
    """Fetch or compile one job (in a worker process, or in this one with ``cache``).

    Never raises for a kernel that fails to compile: the failure and the compiler's
    diagnostics are the result.
    """
    started = time.monotonic()
    target = parse_target(job.target)
    backend = backends.make_backend(target)
    ext = backend.binary_ext
    cache = cache if cache is not None else _worker_cache(job.root, job.readonly)

    def result(status: str, error: str | None = None) -> Result:
        return Result(
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
        parts = _resolve(job.call)
        spec = specializations(job.call, parts, target, cache)[job.index]
        if spec.key != job.key:
            return result(
                "failed",
                f"the kernel key changed between planning and compiling ({job.key[:16]} -> "
                f"{spec.key[:16]}): the kernel's module changed during the run; run warm again",
            )
        with _captured_stderr() as captured:
            kb = fetch(
                cache,
                spec.key,
                ext,
                build=lambda: compile_source(spec.src, target, backend, spec.bound.options),
                describe=entry_metadata(parts, target, spec.bound),
                need_ptx=target.backend == "cuda",
            )
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


_CRASH = (
    "the compiler process died (a crash inside Triton/LLVM, or killed for memory); run "
    "`kernelcache warm` with --jobs 1 to see its output"
)


def execute(
    jobs: Sequence[Job], workers: int, cache: Any, progress: Callable[[int], None]
) -> list[Result]:
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
    done: dict[int, Result] = {}
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
    done: dict[int, Result],
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
                    done[i] = Result(
                        job.call.kernel,
                        job.target,
                        job.config,
                        job.key,
                        job.ext,
                        "failed",
                        error=_CRASH,
                    )
                else:
                    broken.append(i)
                    continue
            progress(1)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return sorted(broken)


# -- the whole run ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Report:
    """The outcome of a warm run (see :meth:`as_json` for the stable fields)."""

    manifest: str
    root: str
    readonly_roots: tuple[str, ...]
    targets: tuple[str, ...]
    records: int
    calls: int
    kernels: int
    results: tuple[Result, ...]
    failures: tuple[Failure, ...]
    changed: tuple[Failure, ...]
    workers: int
    seconds: float

    def count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)

    @property
    def ok(self) -> bool:
        return not self.failures

    def as_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "command": "warm",
            "manifest": self.manifest,
            "root": self.root,
            "readonly_roots": list(self.readonly_roots),
            "targets": list(self.targets),
            "records": self.records,
            "calls": self.calls,
            "kernels": self.kernels,
            "specializations": len(self.results),
            "compiled": self.count("compiled"),
            "present": self.count("present"),
            "failed": len(self.failures),
            "workers": self.workers,
            "seconds": round(self.seconds, 3),
            "results": [r.as_json() for r in self.results],
            "failures": [f.as_json() for f in self.failures],
            "changed": [f.as_json() for f in self.changed],
            "ok": self.ok,
        }

    def summary(self) -> str:
        """The human-readable summary."""
        lines = [
            f"Warmed {self.manifest} into {self.root}",
            f"  {self.records} records: {self.calls} calls of {self.kernels} kernels; "
            f"targets {', '.join(self.targets)}",
            f"  compiled         {self.count('compiled'):5d}"
            + (f"  ({self.seconds:.1f} s, {self.workers} processes)" if self.workers else ""),
            f"  already present  {self.count('present'):5d}",
            f"  failed           {len(self.failures):5d}",
        ]
        if self.changed:
            lines.append("Compiled the current source of kernels that changed since recording:")
            lines += [f"  {_where(f)}: {f.detail}" for f in self.changed]
        if self.failures:
            lines.append("Failed:")
            for f in sorted(self.failures, key=lambda f: KINDS.index(f.kind)):
                detail = f.detail.replace("\n", "\n      ")
                lines.append(f"  [{f.kind}] {_where(f)}: {detail}")
        return "\n".join(lines)


def _where(f: Failure) -> str:
    parts = [f.kernel or "(manifest)"]
    if f.target:
        parts.append(f"for {f.target}")
    if f.config:
        parts.append(f"({f.config})")
    if f.lines:
        shown = ", ".join(map(str, f.lines[:5])) + (", ..." if len(f.lines) > 5 else "")
        parts.append(f"[line{'s' if len(f.lines) > 1 else ''} {shown}]")
    return " ".join(parts)


def _check_source(call: Call, parts: KernelParts, allow_changed: bool) -> Failure | None:
    if not call.sources:
        return None
    if source_digest(parts.fn) in call.sources:
        return None
    return Failure(
        "source-changed",
        "the kernel's source changed since the manifest was recorded, so the recorded calls may "
        "no longer be what your program lowers. Record the manifest again"
        + ("" if allow_changed else ", or pass --allow-changed to compile the current source"),
        call.kernel,
        lines=call.lines,
    )


def _check_configs(
    call: Call, specs: Sequence[Spec], allow_changed: bool, triton: str
) -> Failure | None:
    recorded = call.configs.get(triton)
    if recorded is None:
        return None  # recorded by another Triton: config descriptions are not comparable
    now = {s.variant.description for s in specs}
    if now == set(recorded):
        return None
    gone, new = sorted(set(recorded) - now), sorted(now - set(recorded))
    detail = "the kernel's autotune configs changed since the manifest was recorded"
    if gone:
        detail += f"; recorded but no longer generated: {'; '.join(gone)}"
    if new:
        detail += f"; new: {'; '.join(new)}"
    detail += ". Record the manifest again" + (
        "" if allow_changed else ", or pass --allow-changed to compile the current configs"
    )
    return Failure("configs-changed", detail, call.kernel, lines=call.lines)


def _check_writable(root: str) -> None:
    """Create ``root`` if needed and stage a probe file in it, as a put would.

    Raises:
        RootError: entries cannot be written there.
    """
    try:
        Store(root).check_writable()
    except CacheError as e:
        raise RootError(
            e.errno or 0,
            f"{e}; warm into a writable root (--root or KERNELCACHE_DIR): a read-only layer "
            "is read through KERNELCACHE_READONLY_DIRS",
        ) from None


def _merged(failures: Iterable[Failure]) -> tuple[Failure, ...]:
    """One failure per (kind, kernel, target, config, detail), with the lines of all."""
    out: dict[tuple[Any, ...], Failure] = {}
    for f in failures:
        ident = (f.kind, f.kernel, f.target, f.config, f.detail)
        seen = out.get(ident)
        if seen is None:
            out[ident] = f
        else:
            lines = tuple(sorted(set(seen.lines) | set(f.lines)))
            out[ident] = Failure(f.kind, f.detail, f.kernel, f.target, f.config, lines)
    return tuple(out.values())


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


def warm(
    manifest: str | os.PathLike[str],
    targets: Iterable[str | Target],
    *,
    cache: Any = None,
    jobs: int | None = None,
    allow_changed: bool = False,
    progress: Callable[[int], None] | None = None,
    on_planned: Callable[[int], None] | None = None,
) -> Report:
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
        progress: called with the number of kernels finished, as they finish.
        on_planned: called once with the number of kernels to compile, before compiling.

    Raises:
        ManifestError: the manifest cannot be read or is not a manifest.
        RootError: there is something to compile and the writable root cannot take it.
        TargetError, BackendUnavailable: a bad target, or Triton lacks its backend.
        ValueError: ``jobs`` < 1.
    """
    from .versions import triton_version

    started = time.monotonic()
    if jobs is not None and jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    tgts = _parse_targets(targets)
    loaded = load_manifest(manifest)
    cache = as_cache(cache)
    triton = triton_version()
    failures = list(loaded.failures)
    changed: list[Failure] = []
    results: list[Result | None] = []
    planned: list[Job] = []
    slots: list[int] = []  # index in results of each planned job
    seen: set[tuple[str, str]] = set()
    readonly = tuple(str(s.root) for s in cache.readonly)
    for call in loaded.calls:
        try:
            parts = _resolve(call)
        except KernelArgumentError as e:
            kind = "not-importable" if call.problem else "missing-kernel"
            detail = f"{call.problem} ({e})" if call.problem else str(e)
            if not call.problem:
                detail += (
                    ". It was renamed, moved or removed since the manifest was recorded, or its "
                    "module is not on the path: run warm from the directory your program runs "
                    "in (or set PYTHONPATH), or record the manifest again"
                )
            failures.append(Failure(kind, detail, call.kernel, lines=call.lines))
            continue
        problem = _check_source(call, parts, allow_changed)
        config_checked = False
        if problem is not None:
            if not allow_changed:
                failures.append(problem)
                continue
            changed.append(problem)
        for target in tgts:
            try:
                specs = specializations(call, parts, target, cache)
            except Exception as e:  # the call does not fit the kernel/target: report it
                why = (
                    "the recorded call does not fit the kernel for this target"
                    if isinstance(e, BridgeError)
                    else f"binding the recorded call failed (with Triton {triton})"
                )
                failures.append(
                    Failure(
                        "invalid",
                        f"{why}: {type(e).__name__}: {e}",
                        call.kernel,
                        str(target),
                        lines=call.lines,
                    )
                )
                continue
            if not config_checked:
                config_checked = True
                problem = _check_configs(call, specs, allow_changed, triton)
                if problem is not None:
                    if not allow_changed:
                        failures.append(problem)
                        break
                    changed.append(problem)
            backend = backends.make_backend(target)
            ext = backend.binary_ext
            for index, spec in enumerate(specs):
                if (spec.key, str(target)) in seen:
                    continue  # another call has the same specialization
                seen.add((spec.key, str(target)))
                config = spec.variant.description
                layer = present(cache, spec.key, ext, target.backend == "cuda")
                if layer is not None:
                    results.append(
                        Result(
                            call.kernel, str(target), config, spec.key, ext, "present", 0.0, layer
                        )
                    )
                    continue
                slots.append(len(results))
                results.append(None)
                planned.append(
                    Job(call, str(target), index, spec.key, ext, config, str(cache.root), readonly)
                )
    if planned:
        _check_writable(str(cache.root))
    workers = min(jobs or default_workers(), len(planned)) if planned else 0
    if workers > 1 and not can_fork():
        logger.info(
            "kernelcache: compiling %d kernels in this process: it runs other threads, so "
            "worker processes cannot be forked safely (`kernelcache warm` compiles in parallel)",
            len(planned),
        )
        workers = 1
    if on_planned is not None:
        on_planned(len(planned))
    outcomes = execute(planned, workers, cache, progress or (lambda n: None))
    for slot, job, outcome in zip(slots, planned, outcomes, strict=True):
        results[slot] = outcome
        if outcome.status == "failed":
            kind = "crash" if outcome.error == _CRASH else "compile"
            failures.append(
                Failure(
                    kind,
                    outcome.error or "failed",
                    outcome.kernel,
                    outcome.target,
                    outcome.config,
                    job.call.config_lines.get(outcome.config, job.call.lines),
                )
            )
    final = tuple(r for r in results if r is not None)
    return Report(
        manifest=loaded.path,
        root=str(cache.root),
        readonly_roots=readonly,
        targets=tuple(str(t) for t in tgts),
        records=loaded.records,
        calls=len(loaded.calls),
        kernels=len({c.kernel for c in loaded.calls}),
        results=final,
        failures=_merged(failures),
        changed=_merged(changed),
        workers=workers,
        seconds=time.monotonic() - started,
    )


def run(
    manifest: str,
    targets: Sequence[str],
    *,
    root: str | None = None,
    json: bool = False,
    jobs: int | None = None,
    allow_changed: bool = False,
) -> int:
    """``kernelcache warm``: warm, print the summary (or the JSON document), return the exit
    code: 0 all warmed, 1 something failed (listed with its reason).

    Kernels are imported as ``python -m`` would: the current directory first on ``sys.path``.

    Raises:
        kernelcache.cli.UsageError: a bad target, an unreadable manifest, a missing Triton
            backend, a disabled cache, ``jobs`` < 1 (the CLI exits 2 with the message).
    """
    from kernelcache import progress as progressbar
    from kernelcache.cli import CommandFailed, Output, UsageError
    from kernelcache.config import settings

    from .errors import BackendUnavailable, TargetError

    if settings().disable:
        raise UsageError("KERNELCACHE_DISABLE is set: there is no cache to warm; unset it")
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {jobs}")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    out = Output(json)
    quiet = output_to_stderr() if json else contextlib.nullcontext()
    with quiet, progressbar.bar("warming", None, enabled=progressbar.wanted(json)) as bar:
        try:
            report = warm(
                manifest,
                targets,
                cache=root,
                jobs=jobs,
                allow_changed=allow_changed,
                progress=bar,
                on_planned=bar.set_total,
            )
        except (ManifestError, TargetError, BackendUnavailable) as e:
            raise UsageError(str(e)) from None
        except RootError as e:
            raise CommandFailed(e.strerror) from None
    if not report.records and not report.failures:
        logger.warning("kernelcache: %s holds no records: nothing to warm", manifest)
    out.emit(report.as_json, report.summary)
    return 0 if report.ok else 1


def compile_record(record: Mapping[str, Any], target: str | Target, cache: Any = None) -> str:
    """Fetch or compile the variant of one record for ``target``; returns its key.

    Raises:
        KernelArgumentError / OptionError: the record does not fit the kernel or the target.
    """
    tgt = parse_target(target)
    parts = decompose(import_kernel(record["kernel"]))
    call = Call(
        kernel=record["kernel"],
        arguments=record["arguments"],
        kwargs=tuple(record.get("kwargs") or {}),
        options=record.get("options") or {},
        target_params=dict(record.get("target_params") or {}),
        lines=(),
    )
    counter = [0]
    named = {k: revive(v, counter) for k, v in call.for_target(tgt).items()}
    recorded = record.get("variant") or {"kwargs": {}, "options": record.get("options") or {}}
    variant_kwargs = {k: revive(v, counter) for k, v in recorded["kwargs"].items()}
    for name in call.target_params:
        if name in variant_kwargs:
            variant_kwargs[name] = named[name]
    variant = binding.Variant(
        kwargs=variant_kwargs,
        options={k: revive(v, counter) for k, v in recorded["options"].items()},
        description=record.get("config", ""),
    )
    backends.check_options(tgt, set(variant.options))
    backend = backends.make_backend(tgt)
    bound = binding.bind(parts, backend, named, variant)
    cache = as_cache(cache)
    src = keys.source(parts.fn, parts.is_gluon, bound.signature, bound.constexprs, bound.attrs)
    key = keys.kernel_key(cache, tgt, backend, src, bound.options, parts.language)
    fetch(
        cache,
        key,
        backend.binary_ext,
        build=lambda: compile_source(src, tgt, backend, bound.options),
        describe=entry_metadata(parts, tgt, bound),
        need_ptx=tgt.backend == "cuda",
    )
    return key


def compile_manifest(
    path: str | os.PathLike[str],
    targets: Iterable[str | Target],
    cache: Any = None,
    *,
    jobs: int = 1,
) -> dict[str, list[str]]:
    """Warm every record of a manifest for every target; returns the keys per target.

    Raises:
        KernelArgumentError: something could not be warmed (the message lists what and why).
    """
    report = warm(path, targets, cache=cache, jobs=jobs)
    if report.failures:
        raise KernelArgumentError(
            "could not warm "
            + "; ".join(f"{_where(f)}: {f.detail.splitlines()[0]}" for f in report.failures)
        )
    out: dict[str, list[str]] = {t: [] for t in report.targets}
    for r in report.results:
        out[r.target].append(r.key)
    return out
