"""``bridge.triton_call``: the public call, from the caller's arguments to one bind of the
primitive (:data:`bridge.call.tracing.triton_call_p`), whose lowerings :mod:`bridge.lowering.lower`
registers.

Invariants: nothing is compiled or looked up in the cache before lowering; a call written
wrongly (conventions mixed, unknown options, a malformed target) fails at trace time, with a
message naming what to change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .call import conventions, tracing
from .call.kernel_objects import decompose
from .exceptions import KernelArgumentError, OptionError
from .lowering import lower  # noqa: F401  (registers the primitive's lowerings)
from .settings import AUTOTUNE_MODES
from .vendors import backends, targets
from .versions import FFI_TARGET, LEGACY_TARGET

if TYPE_CHECKING:
    from .settings import CacheArg


def call_options(
    parts: Any,
    explicit: Mapping[str, Any],
    keywords: Mapping[str, Any],
    backend_options: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The backend options of a call: explicit keywords, option keywords and
    ``backend_options`` (a name given twice is an error; unknown names are listed)."""
    options = {**explicit, **keywords}
    if backend_options is not None:
        if not isinstance(backend_options, Mapping):
            raise OptionError(
                f"backend_options must be a dict of compile options, not {backend_options!r}"
            )
        conflicts = sorted(set(backend_options) & set(options))
        if conflicts:
            raise OptionError(
                f"Cannot specify {', '.join(conflicts)} both as explicit arguments and in "
                "``backend_options``"
            )
        options.update(backend_options)
    if not options:
        return options
    known = backends.all_option_names()
    unknown = sorted(set(options) - known) if known else []
    if unknown:
        raise OptionError(
            f"unknown keyword argument(s) {', '.join(map(str, unknown))} for {parts.qualname}: "
            f"its parameters are {', '.join(parts.arg_names)}; compile options are "
            f"{', '.join(sorted(known - backends.DERIVED_OPTIONS))}"
        )
    derived = sorted(set(options) & backends.DERIVED_OPTIONS)
    if derived:
        raise OptionError(f"{', '.join(derived)} follow(s) from the target: pass target= instead")
    return options


def triton_call(
    *args: Any,
    kernel: Any,
    out_shape: Any = None,
    out_type: Any = None,
    grid: Any,
    num_warps: int | None = None,
    num_stages: int | None = None,
    input_output_aliases: Mapping[Any, Any] | Sequence[Any] | None = None,
    zeroed_outputs: Sequence[Any] | Callable[[dict[str, Any]], Sequence[Any]] = (),
    out_names: str | Sequence[str] | None = None,
    backend_options: Mapping[str, Any] | None = None,
    has_side_effect: bool = False,
    cost_estimate: Mapping[str, Any] | None = None,
    target: str | None = None,
    embed: str | None = None,
    autotune: str | None = None,
    convention: str | None = None,
    cache: CacheArg = None,
    name: str = "",
    serialized_metadata: bytes = b"",
    compute_capability: int | None = None,
    custom_call_target_name: str | None = None,
    **metaparams: Any,
) -> Any:
    """Call a Triton or Gluon kernel on JAX arrays.

    Works under ``jax.jit`` and eagerly. Call sites of jax-triton 0.3 and the ROCm fork
    (``out_shape=``) and of jax-triton 0.4 (``out_type=``) run unchanged: the keyword describing
    the outputs selects the convention, and an ``out_shape=`` call that 0.3 and the fork read
    differently is read the way that fits the kernel (see :mod:`bridge.call.conventions` and
    docs/bridge.md), or as ``convention=`` says.

    Args:
        *args: the kernel's arguments: arrays, ``jax.Ref`` (updated in place), Python/NumPy
            scalars, ``bridge.TensorDescriptor``, tuples of these. With ``out_shape=`` they
            are the inputs in signature order (jax-triton 0.3 flattens them first: a ``None``
            vanishes); with ``out_type=`` they bind like a Python call.
        kernel: a ``@triton.jit`` or ``@gluon.jit`` function, optionally wrapped in
            ``@triton.autotune`` (the decided config, or every config compiled and cached and
            jaxlib picking the fastest at the first run: see ``autotune``) and
            ``@triton.heuristics``.
        out_shape: jax-triton 0.3: a ShapeDtypeStruct-like object or a pytree of them, the
            output pointers being the parameters after the positional arguments; or a dict
            ``{parameter name: shape}`` naming the output parameters (then the result is a dict).
        out_type: jax-triton 0.4: a pytree of ShapeDtypeStruct-like objects (dicts included);
            the outputs fill the non-constexpr parameters no argument fills, in order, and the
            result has the same structure.
        grid: up to three ints, or a function of the bound arguments (every parameter by name,
            including autotuned and heuristic values) returning them.
        num_warps, num_stages: compile options (Triton's defaults for the target when None).
        input_output_aliases: with ``out_shape=``: a sequence of input parameters updated in
            place and returned after the outputs, or a dict: jax-triton 0.3's ``{input array
            index or parameter name: output index or name}`` (the output has its own parameter,
            its buffer starting as the input's) or the ROCm fork's ``{parameter index, name or
            (name, index, ...): out_shape index}`` (the aliased entries last in ``out_shape``;
            no output parameter: the kernel writes through the input). With ``out_type=``:
            ``{flattened operand index: flattened output index}``; the aliased output has no
            parameter of its own.
        zeroed_outputs: outputs (indices, or parameter names) zeroed before every launch, or a
            function of the bound arguments returning them.
        out_names: output parameter names, matching ``out_shape``'s leaves in order.
        backend_options: compile options as a dict (jax-triton 0.4); an option also given as a
            keyword is an error.
        has_side_effect: keep the call even where its results are unused.
        cost_estimate: ``{"flops": ..., "bytes_accessed": ...}`` for profilers (attached to the
            FFI custom call as ``cost_estimate_json``).
        target: "cuda:90", "hip:gfx942", ... (default ``$KERNELCACHE_TARGET``, else the device).
        embed: "auto", "inline", "ptx" or "path" (default ``$KERNELCACHE_EMBED``, else auto).
        autotune: which config of an autotuned kernel runs (default ``$KERNELCACHE_AUTOTUNE``,
            else "decided"): "decided" (the decision in the cache, else jaxlib's autotuning at
            the first run), "runtime" (always jaxlib's), "require" (a decision, else an error),
            "job" (without a decision, one process of the job measures and the others use its
            choice). See ``kernelcache tune``.
        convention: "0.3", "rocm" or "0.4": read the call as jax-triton 0.3, the ROCm fork or
            jax-triton 0.4 does (0.4 with ``out_shape=``: as its deprecated ``out_type=``).
            Needed only for an ``out_shape=`` call that fits both 0.3 and the fork.
        cache: a ``kernelcache.Cache``, a cache root directory, or None for the default cache.
        name, serialized_metadata: the custom call's name and metadata (as in jax-triton).
        compute_capability: jax-triton's way to say ``target=f"cuda:{cc}"``.
        **metaparams: kernel parameters by name (constexprs, scalars, arrays), and options of
            the target's Triton backend (``num_ctas``, ``maxnreg``, ``enable_fp_fusion``,
            ``waves_per_eu``, ...). Unknown names are an error that lists the valid ones.

    Returns:
        The outputs, in the structure of ``out_type`` / ``out_shape`` (``out_shape=``: followed
        by inputs updated in place). Refs are updated in place and not returned.
    """
    if custom_call_target_name not in (None, FFI_TARGET, LEGACY_TARGET):
        raise KernelArgumentError(
            f"custom_call_target_name={custom_call_target_name!r}: the bridge emits jaxlib's "
            f"{FFI_TARGET} or {LEGACY_TARGET}, whichever the running jaxlib needs"
        )
    if compute_capability is not None:
        if target is not None:
            raise KernelArgumentError("pass target= or compute_capability=, not both")
        target = f"cuda:{int(compute_capability)}"
    elif target is not None:
        targets.parse_target(target)
    if autotune is not None and autotune not in AUTOTUNE_MODES:
        raise KernelArgumentError(
            f"autotune={autotune!r} is not one of {', '.join(AUTOTUNE_MODES)}"
        )
    if cost_estimate is not None and not isinstance(cost_estimate, Mapping):
        raise KernelArgumentError(
            f"cost_estimate must be a dict such as {{'flops': 1e9, 'bytes_accessed': 1e6}}, not "
            f"{cost_estimate!r}"
        )
    parts = decompose(kernel)
    params = set(parts.arg_names)
    kernel_kwargs = {k: v for k, v in metaparams.items() if k in params}
    explicit = {
        k: v for k, v in (("num_warps", num_warps), ("num_stages", num_stages)) if v is not None
    }
    option_kwargs = {k: v for k, v in metaparams.items() if k not in params}
    options = call_options(parts, explicit, option_kwargs, backend_options)
    plan, inputs = conventions.plan_call(
        parts,
        args,
        kernel_kwargs,
        out_shape=out_shape,
        out_type=out_type,
        out_names=out_names,
        input_output_aliases=input_output_aliases,
        convention=convention,
    )
    call, operands, finish = tracing.make_call(
        parts,
        inputs,
        plan,
        grid=grid,
        zeroed_outputs=zeroed_outputs,
        options=options,
        target=target,
        embed_mode=embed,
        cache=cache,
        name=name,
        serialized_metadata=serialized_metadata,
        cost_estimate=cost_estimate,
        autotune=autotune,
    )
    results = tracing.triton_call_p.bind(
        *operands, call=call, has_side_effect=bool(has_side_effect)
    )
    return finish(list(results))
