"""Planning a warm run: from the calls of a manifest and the targets to kernel keys, what is
already present in the cache, and the jobs that compile the rest.

The plan is made in the calling process without compiling anything. Each call's specializations
are bound and keyed by :func:`bridge.identity.specialize.specialize_call`, exactly as a lowering of that
call for the target does it. A kernel is "present" when a layer of the cache holds what a
lowering needs without compiling: a build avoided, counted as one kernel hit (as a lowering
that finds it would count it), so a re-run that finds everything has a hit rate of 100%;
nothing else is counted while planning (:func:`present` counts nothing). "Present" is the entry
a lowering would use: one whose reads find something else now (a global the kernel reads has
changed) is not, and the version of the code they find now is compiled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kernelcache.plugin import count

from ..call.kernel_objects import KernelParts, decompose, expand_variants
from ..call.plain import source_digest
from ..entries import decisions
from ..entries.failures import remembered
from ..entries.kernels import PTX, ptx_pairs
from ..exceptions import BridgeError, KernelArgumentError
from ..identity.specialize import Specialization, specialize, specialize_call
from ..vendors.targets import Target
from .manifest import Manifest, RecordedCall, import_kernel
from .outcomes import WarmOutcome, WarmProblem

if TYPE_CHECKING:
    from kernelcache import Cache


def kernel_parts(call: RecordedCall) -> KernelParts:
    """The kernel ``call`` names, imported and taken apart.

    Raises:
        KernelArgumentError: it cannot be imported, or is not a Triton or Gluon kernel.
    """
    return decompose(import_kernel(call.kernel))


def specializations(
    call: RecordedCall, parts: KernelParts, target: Target, cache: Cache
) -> list[Specialization]:
    """Every variant of ``call`` for ``target`` (autotune configs after pruning, heuristics
    applied), bound and keyed by :func:`bridge.identity.specialize.specialize_call`: exactly as a
    lowering for ``target`` does it.

    Raises:
        BridgeError (or whatever the kernel's own heuristics or prune functions raise): the
            call does not fit the kernel or the target.
    """
    named, kwargs, options = call.revived(target, [0])
    return specialize_call(parts, named, kwargs, options, target, cache)


def specialization(
    call: RecordedCall, parts: KernelParts, target: Target, cache: Cache, index: int
) -> Specialization:
    """``specializations(call, parts, target, cache)[index]``, without binding and keying the
    other variants.

    Raises:
        IndexError: the call has no ``index``-th variant (any more).
        BridgeError (or whatever the kernel's own heuristics or prune functions raise): the
            call does not fit the kernel or the target.
    """
    named, kwargs, options = call.revived(target, [0])
    variant = expand_variants(parts, named, kwargs, options, target)[index]
    return specialize(parts, named, variant, target, cache)


def present(cache: Cache, spec: Specialization) -> str | None:
    """The layer ("local" or "readonly") that holds the entry a lowering of ``spec`` would use,
    or None (the lowering would compile).

    That entry is found as a lowering finds it (:func:`bridge.readsets.read_sets.follow`): the
    one under the key, or where its reads find something else now, the one under the key
    chained from it; it is usable when a layer holds the verified binary and, for a target with
    PTX, the PTX whose digest its metadata names. Nothing is counted as a hit or a miss.
    """
    from kernelcache import Artifact

    from ..compile import fetch

    def entry(key: str) -> Artifact | None:
        found = next(
            (a for s in cache.layers if isinstance(a := s.read(key, spec.ext), Artifact)), None
        )
        if found is None or not spec.target.vendor.has_ptx:
            return found
        for store in cache.layers:
            ptx = store.read(PTX.key(key), PTX.ext)
            if isinstance(ptx, Artifact) and ptx_pairs(found.meta, ptx.data):
                return found
        return None

    _, found = fetch.followed(spec, entry)
    return None if found is None else found.source


@dataclass(frozen=True)
class Job:
    """One kernel to compile: a call's ``index``-th variant for ``target``, expected ``key``."""

    call: RecordedCall
    target: str
    index: int
    key: str
    ext: str
    config: str
    root: str
    readonly: tuple[str, ...]


def _check_source(
    call: RecordedCall, parts: KernelParts, allow_changed: bool
) -> WarmProblem | None:
    if not call.sources:
        return None
    if source_digest(parts.fn) in call.sources:
        return None
    return WarmProblem(
        "source-changed",
        "the kernel's source changed since the manifest was recorded, so the recorded calls may "
        "no longer be what your program lowers. Record the manifest again"
        + ("" if allow_changed else ", or pass --allow-changed to compile the current source"),
        call.kernel,
        lines=call.lines,
    )


def _check_configs(
    call: RecordedCall, specs: Sequence[Specialization], allow_changed: bool, triton: str
) -> WarmProblem | None:
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
    return WarmProblem("configs-changed", detail, call.kernel, lines=call.lines)


@dataclass(frozen=True)
class WarmPlan:
    """What a warm run does, decided without compiling.

    ``outcomes`` has one entry per distinct specialization and target, in manifest order: the
    outcome of those already present, None where the outcome of a job goes (the ``slots``, one
    per job). ``problems`` cannot be warmed; ``changed`` changed since recording and are
    compiled anyway (``allow_changed``). A kernel the cache knows cannot compile is "left-out",
    never a job.
    """

    outcomes: tuple[WarmOutcome | None, ...]
    jobs: tuple[Job, ...]
    slots: tuple[int, ...]
    problems: tuple[WarmProblem, ...]
    changed: tuple[WarmProblem, ...]


def decided(
    call: RecordedCall,
    parts: KernelParts,
    target: Target,
    specs: Sequence[Specialization],
    cache: Cache,
    devices: Sequence[str],
) -> Sequence[Specialization]:
    """The variants of ``call`` worth compiling for ``target``: the chosen one where the cache
    holds an autotune decision for one of ``devices`` (or one pinned for every device), else
    all of them."""
    if len(specs) < 2:
        return specs
    named, _, _ = call.revived(target, [0])
    keys = decisions.keys_of(parts, named, specs, devices)
    found = decisions.find(cache, keys, [s.key for s in specs])
    return specs if found is None else [specs[found.chosen]]


def make_plan(
    loaded: Manifest,
    targets: Sequence[Target],
    cache: Cache,
    allow_changed: bool,
    *,
    devices: Sequence[str] = (),
    all_configs: bool = False,
) -> WarmPlan:
    """Plan warming every call of ``loaded`` for every target into ``cache``: of an autotuned
    call with a decision, only the chosen variant (every variant with ``all_configs``).

    Never raises for a call: a kernel that cannot be imported, changed since recording, or
    does not fit a target is a problem of the plan, with its reason.
    """
    from ..versions import triton_version

    triton = triton_version()
    problems = list(loaded.failures)
    changed: list[WarmProblem] = []
    outcomes: list[WarmOutcome | None] = []
    jobs: list[Job] = []
    slots: list[int] = []
    seen: set[tuple[str, str]] = set()
    readonly = tuple(str(s.root) for s in cache.readonly)
    for call in loaded.calls:
        try:
            parts = kernel_parts(call)
        except KernelArgumentError as e:
            kind = "not-importable" if call.problem else "missing-kernel"
            detail = f"{call.problem} ({e})" if call.problem else str(e)
            if not call.problem:
                detail += (
                    ". It was renamed, moved or removed since the manifest was recorded, or its "
                    "module is not on the path: run warm from the directory your program runs "
                    "in (or set PYTHONPATH), or record the manifest again"
                )
            problems.append(WarmProblem(kind, detail, call.kernel, lines=call.lines))
            continue
        problem = _check_source(call, parts, allow_changed)
        config_checked = False
        if problem is not None:
            if not allow_changed:
                problems.append(problem)
                continue
            changed.append(problem)
        for target in targets:
            try:
                specs = specializations(call, parts, target, cache)
            except Exception as e:  # the call does not fit the kernel/target: report it
                why = (
                    "the recorded call does not fit the kernel for this target"
                    if isinstance(e, BridgeError)
                    else f"binding the recorded call failed (with Triton {triton})"
                )
                problems.append(
                    WarmProblem(
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
                        problems.append(problem)
                        break
                    changed.append(problem)
            wanted = specs if all_configs else decided(call, parts, target, specs, cache, devices)
            keys = {s.key for s in wanted}
            for index, spec in enumerate(specs):
                if spec.key not in keys:
                    continue  # an autotune decision chose another config
                if (spec.key, str(target)) in seen:
                    continue  # another call has the same specialization
                seen.add((spec.key, str(target)))
                config, ext = spec.variant.description, spec.ext
                layer = present(cache, spec)
                if layer is not None:  # a build avoided: a hit, as a lowering's would be
                    count(cache.root, hits=1)
                    outcomes.append(
                        WarmOutcome(
                            call.kernel, str(target), config, spec.key, ext, "present", 0.0, layer
                        )
                    )
                    continue
                failed = remembered(cache, spec.key)
                if failed is not None:  # known not to compile: never compiled again
                    outcomes.append(
                        WarmOutcome(
                            call.kernel,
                            str(target),
                            config,
                            spec.key,
                            ext,
                            "left-out",
                            error=failed,
                        )
                    )
                    continue
                slots.append(len(outcomes))
                outcomes.append(None)
                jobs.append(
                    Job(call, str(target), index, spec.key, ext, config, str(cache.root), readonly)
                )
    return WarmPlan(tuple(outcomes), tuple(jobs), tuple(slots), tuple(problems), tuple(changed))
