"""Specializing a call: from a kernel and its arguments to bound, keyed variants.

The one way from a kernel's parts, its arguments by parameter name, a variant (an autotune
config after heuristics) and a target to what the cache is asked for: bind with Triton's
binder, check the block's thread count, build Triton's source object and compute the kernel key
(:mod:`.kernel_keys`). The lowering and warm's planning and compile jobs all go through
:func:`specialize`, so warming a recorded call computes the very keys its lowering computes.
Nothing here compiles (:mod:`bridge.compile.fetch` does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..call import kernel_objects
from ..call.kernel_objects import KernelParts
from ..exceptions import BackendUnavailable, OptionError
from ..vendors import backends
from ..vendors.targets import Target
from . import kernel_keys

if TYPE_CHECKING:
    from kernelcache import Cache

    from ..call.binding import Bound

#: whether a cached entry's metadata has what a call needs
Usable = Callable[[Mapping[str, Any]], bool]


@dataclass(frozen=True)
class Specialization:
    """One variant of a call, bound to Triton's specialization for a target and keyed (not
    compiled). The key is the same in every process with the same software."""

    parts: KernelParts
    variant: kernel_objects.Variant
    bound: Bound
    source: Any  # Triton's ASTSource (GluonASTSource for Gluon)
    key: str
    target: Target
    backend: Any  # the target's Triton backend (CUDABackend / HIPBackend)

    @property
    def ext(self) -> str:
        """The file extension of the machine code ("cubin", "hsaco", ...)."""
        return self.target.vendor.binary_ext


def threads_problem(target: Target, num_warps: int) -> str | None:
    """Why ``num_warps`` warps of ``target`` do not fit in one block (the same words on every
    vendor), or None."""
    threads = num_warps * target.warp_size
    limit = target.vendor.max_threads_per_block
    if threads <= limit:
        return None
    return (
        f"num_warps={num_warps} on {target} means {threads} threads per block; the limit is "
        f"{limit}: use num_warps <= {limit // target.warp_size}"
    )


def specialize(
    parts: KernelParts,
    named: Mapping[str, Any],
    variant: kernel_objects.Variant,
    target: Target,
    cache: Cache,
    *,
    strict: bool = True,
) -> Specialization:
    """Bind ``variant`` of a call with arguments ``named`` for ``target`` and key it (``cache``
    only memoizes the compiler's identity). Not ``strict`` (one config of several), a variant
    with more threads than a block may have is keyed all the same, to be left out of the call
    (:mod:`bridge.compile.variants`), as Triton's autotuner leaves out a config over a limit.

    Raises:
        KernelArgumentError: the arguments do not fit the kernel.
        OptionError: the variant's options do not fit the target (too many threads).
        BackendUnavailable: Triton has no backend for ``target``, or it writes machine code of
            another kind than the target's descriptor says.
    """
    backend = backends.make_backend(target)
    if backend.binary_ext != target.vendor.binary_ext:
        raise BackendUnavailable(
            f"Triton's {target.vendor.package} backend writes .{backend.binary_ext} files, but "
            f"the bridge expects .{target.vendor.binary_ext} for {target}"
        )
    from ..call.binding import bind  # (a warm hit binds nothing)

    bound = bind(parts, backend, named, variant)
    why = threads_problem(target, int(bound.options.num_warps)) if strict else None
    if why is not None:
        raise OptionError(why)
    src = kernel_keys.source(
        parts.fn, parts.is_gluon, bound.signature, bound.constexprs, bound.attrs
    )
    key = kernel_keys.kernel_key(cache, target, backend, src, bound.options, parts.language)
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
    applied and pre_hooks run: :func:`bridge.call.kernel_objects.expand_variants`), each through
    :func:`specialize`. ``named`` are the call's arguments by parameter name, ``kwargs`` the
    kernel parameters the caller set by keyword, ``options`` the backend options the caller set.

    Raises:
        OptionError: an option ``target``'s backend does not have, or too many threads.
        KernelArgumentError: the call does not fit the kernel.
        whatever the kernel's own heuristics, prune functions or hooks raise.
    """
    variants = kernel_objects.expand_variants(parts, named, kwargs, options, target)
    strict = len(variants) == 1  # (of several configs, one over a limit is left out)
    return [specialize(parts, named, v, target, cache, strict=strict) for v in variants]


def components(spec: Specialization, cache: Cache | None = None) -> dict[str, str]:
    """The components of ``spec``'s key, named (:func:`.kernel_keys.key_components`; without
    ``cache``, the compiler's identity from this process's memo)."""
    target, options = spec.target, spec.bound.options
    return kernel_keys.key_components(
        cache, target, spec.backend, spec.source, options, spec.parts.language
    )
