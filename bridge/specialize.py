"""Specializing a call: from a kernel and its arguments to bound, keyed variants.

The one way from a kernel's parts, its arguments by parameter name, a variant (an autotune
config after heuristics) and a target to what the cache is asked for: bind with Triton's binder,
check the block's thread count, build Triton's source object and compute the kernel key. The
lowering (:mod:`bridge.call`), warm's planning and its compile jobs (:mod:`bridge.warm`) all go
through :func:`specialize`, so warming a recorded call computes the very keys a lowering of that
call for the same target computes.

Nothing here compiles: :func:`fetch` takes a specialization from the cache, compiling it on a
miss (once across the processes sharing the cache).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import backends, binding, keys
from .artifacts import KernelBinary, entry_metadata
from .artifacts import fetch as fetch_entry
from .compile import compile_source
from .errors import OptionError
from .kernels import KernelParts
from .targets import MAX_THREADS_PER_BLOCK, Target

if TYPE_CHECKING:
    from kernelcache import Cache


@dataclass(frozen=True)
class Specialization:
    """One variant of a call, bound to Triton's specialization for a target and keyed (not
    compiled). The key is the same in every process with the same software."""

    parts: KernelParts
    variant: binding.Variant
    bound: binding.Bound
    source: Any  # Triton's ASTSource (GluonASTSource for Gluon)
    key: str
    target: Target
    backend: Any  # the target's Triton backend (CUDABackend / HIPBackend)

    @property
    def ext(self) -> str:
        """The file extension of the machine code: "cubin" or "hsaco"."""
        return str(self.backend.binary_ext)


def check_threads(target: Target, num_warps: int) -> None:
    """Check that ``num_warps`` warps of ``target`` fit in one block.

    Raises:
        OptionError: more than :data:`MAX_THREADS_PER_BLOCK` threads.
    """
    threads = num_warps * target.warp_size
    if threads > MAX_THREADS_PER_BLOCK:
        raise OptionError(
            f"num_warps={num_warps} on {target} means {threads} threads per block; the limit is "
            f"{MAX_THREADS_PER_BLOCK}: use num_warps <= {MAX_THREADS_PER_BLOCK // target.warp_size}"
        )


def specialize(
    parts: KernelParts,
    named: Mapping[str, Any],
    variant: binding.Variant,
    target: Target,
    cache: Cache,
) -> Specialization:
    """Bind ``variant`` of a call with arguments ``named`` for ``target`` and key it.

    ``cache`` only memoizes the compiler's identity; nothing is looked up or compiled.

    Raises:
        KernelArgumentError: the arguments do not fit the kernel.
        OptionError: the variant's options do not fit the target (too many threads).
        BackendUnavailable: Triton has no backend for ``target``.
    """
    backend = backends.make_backend(target)
    bound = binding.bind(parts, backend, named, variant)
    check_threads(target, int(bound.options.num_warps))
    src = keys.source(parts.fn, parts.is_gluon, bound.signature, bound.constexprs, bound.attrs)
    key = keys.kernel_key(cache, target, backend, src, bound.options, parts.language)
    return Specialization(parts, variant, bound, src, key, target, backend)


def specialize_call(
    parts: KernelParts,
    named: Mapping[str, Any],
    kwargs: Mapping[str, Any],
    options: Mapping[str, Any],
    target: Target,
    cache: Cache,
) -> list[Specialization]:
    """Every variant of a call for ``target`` (autotune configs after pruning, heuristics
    applied; see :func:`bridge.binding.expand_variants`), each through :func:`specialize`.

    ``named`` are the call's arguments by parameter name, ``kwargs`` the kernel parameters the
    caller set by keyword, ``options`` the backend options the caller set.

    Raises:
        OptionError: an option ``target``'s backend does not have, or too many threads.
        KernelArgumentError: the call does not fit the kernel.
        whatever the kernel's own heuristics or prune functions raise.
    """
    backends.check_options(target, set(options))
    return [
        specialize(parts, named, variant, target, cache)
        for variant in binding.expand_variants(parts, named, kwargs, options)
    ]


def fetch(
    spec: Specialization,
    cache: Cache,
    usable: Callable[[Mapping[str, Any]], bool] | None = None,
) -> KernelBinary:
    """The kernel of ``spec`` from ``cache``, compiled on a miss (once across the processes
    sharing the cache); on CUDA with the PTX that produced it (see :func:`bridge.artifacts.fetch`).
    An entry whose metadata ``usable`` rejects is compiled again in memory.
    """
    target, bound = spec.target, spec.bound
    return fetch_entry(
        cache,
        spec.key,
        spec.ext,
        build=functools.partial(compile_source, spec.source, target, spec.backend, bound.options),
        describe=entry_metadata(spec.parts, target, bound),
        need_ptx=target.backend == "cuda",
        usable=usable,
    )
