"""``triton_call_lowering``: the bridge inside a primitive's own lowering rule, with
TransformerEngine's contract (``transformer_engine.jax.triton_extensions.triton_call_lowering``).

A JAX primitive whose lowering rule (``mlir.register_lowering``) calls it gets a Triton or Gluon
kernel launched through jaxlib's Triton custom call, compiled through the kernel cache, with
everything ``bridge.triton_call`` does: inline machine code (no temporary path on ROCm),
byte-identical modules across processes, stored lowerings, autotune decisions.

TE's contract, argument for argument (NVIDIA's main and AMD's fork): the kernel's parameters
that ``constexprs`` does not name are its tensors, the rule's operands (``ctx.avals_in``) then
its results (``ctx.avals_out``), in signature order; scalars are constexprs.
``input_output_aliases`` maps an operand's index to a result's (the result keeps its own
parameter, its buffer starting as the operand's: jaxlib's operand-output aliasing).
``grid`` is up to three ints, or a function of the parameters (constexprs and an autotune
config's values) returning them. ``num_warps`` and ``num_stages`` default to the target's
(Triton's: 4 warps); an autotuned kernel's configs carry their own. ``enable_fp_fusion``
defaults to False, as TE compiles. The call is lowered as ``bridge.triton_call`` would lower
the same call with ``out_shape=ctx.avals_out`` (jax-triton 0.3's convention, which TE's is),
for the platform being lowered ("cuda" or "rocm": the target follows from it and the local
device, or ``$KERNELCACHE_TARGET``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax

from .call.primitive import triton_call_p
from .errors import KernelArgumentError
from .lowering import lower
from .vendors import vendor_registry

#: the lowering platforms the bridge has vendors for
_PLATFORMS = tuple(v.platform for v in vendor_registry.registered())


def _platform(ctx: Any, given: str | None) -> str:
    """The platform ``ctx`` lowers for (one of the vendors' platforms)."""
    if given is not None:
        found: tuple[str, ...] = (given,)
    else:
        found = tuple(getattr(ctx, "platforms", None) or ctx.module_context.platforms)
    ours = [p for p in found if p in _PLATFORMS]
    if len(ours) != 1:
        raise KernelArgumentError(
            f"triton_call_lowering lowers for one GPU platform ({' or '.join(_PLATFORMS)}), "
            f"but this rule is lowering for {', '.join(found) or 'none'}: register it with "
            "mlir.register_lowering(..., platform='cuda') (or 'rocm'), or pass platform="
        )
    return ours[0]


def _contract(kernel_fn: Any, avals_in: Any, avals_out: Any) -> str:
    inner = kernel_fn
    while hasattr(inner, "fn"):  # (an autotuner's or heuristics' kernel)
        inner = inner.fn
    name = getattr(inner, "__name__", type(kernel_fn).__name__)
    return (
        f"triton_call_lowering: the parameters of {name} "
        "that constexprs does not name must be the rule's operands, then its results, in "
        f"signature order ({len(avals_in)} operands, {len(avals_out)} results), as "
        "TransformerEngine's triton_call_lowering requires; name every scalar in constexprs"
    )


def _call(kernel_fn: Any, avals_in: Any, avals_out: Any, kwargs: Mapping[str, Any]) -> Any:
    """The bridge's call spec for TE's call: ``bridge.triton_call`` traced on the rule's
    operands, which must be exactly one custom call of them, giving exactly its results."""
    from .api import triton_call

    out_shape = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals_out]

    def fn(*xs: Any) -> Any:
        return triton_call(*xs, kernel=kernel_fn, out_shape=out_shape, convention="0.3", **kwargs)

    contract = _contract(kernel_fn, avals_in, avals_out)
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals_in]
    try:
        jaxpr = jax.make_jaxpr(fn)(*specs).jaxpr
    except KernelArgumentError as e:
        raise KernelArgumentError(f"{e} ({contract})") from e
    eqns = [e for e in jaxpr.eqns if e.primitive is triton_call_p]
    (eqn,) = eqns or [None]
    if (
        eqn is None
        or len(jaxpr.eqns) != 1
        or list(eqn.invars) != list(jaxpr.invars)
        or list(eqn.outvars) != list(jaxpr.outvars)
    ):
        raise KernelArgumentError(contract)
    return eqn.params["call"], eqn.params["has_side_effect"]


def triton_call_lowering(
    ctx: Any,
    kernel_fn: Any,
    *array_args: Any,
    grid: Any,
    input_output_aliases: Mapping[int, int] | None = None,
    constexprs: Mapping[str, Any] | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    enable_fp_fusion: bool = False,
    platform: str | None = None,
    **options: Any,
) -> Any:
    """Lower a launch of ``kernel_fn`` inside a primitive's lowering rule (see the module
    docstring): TransformerEngine's ``triton_call_lowering``, through the kernel cache.

    Args:
        ctx: the lowering rule's context (``ctx.avals_in``: the operands, ``ctx.avals_out``:
            the results the kernel writes).
        kernel_fn: a ``@triton.jit`` or ``@gluon.jit`` function, optionally wrapped in
            ``@triton.autotune`` or ``@triton.heuristics``.
        *array_args: the rule's operands (MLIR values), one per ``ctx.avals_in``.
        grid: up to three ints, or a function of the parameters returning them.
        input_output_aliases: ``{operand index: result index}``.
        constexprs: the kernel's constexpr (and scalar) parameters by name.
        num_warps, num_stages: compile options (the target's defaults where None; an autotune
            config's own where it has them).
        enable_fp_fusion: fuse multiplies and adds (False, as TransformerEngine compiles).
        platform: "cuda" or "rocm" where the rule is registered for several platforms.
        **options: other options of the target's Triton backend, and the bridge's own keywords
            of ``bridge.triton_call`` (``target=``, ``embed=``, ``cache=``, ``autotune=``).

    Returns:
        The results, as MLIR values (what ``jax.ffi.ffi_lowering``'s rule returns).

    Raises:
        KernelArgumentError: the kernel's parameters do not fit the rule's operands and results.
    """
    chosen = _platform(ctx, platform)
    if len(array_args) != len(ctx.avals_in):
        raise KernelArgumentError(
            f"triton_call_lowering: {len(array_args)} operands given, but the rule has "
            f"{len(ctx.avals_in)} (ctx.avals_in): pass the rule's operands as they come"
        )
    kwargs: dict[str, Any] = {
        **dict(constexprs or {}),
        **options,
        "grid": grid,
        "enable_fp_fusion": enable_fp_fusion,
    }
    if num_warps is not None:
        kwargs["num_warps"] = num_warps
    if num_stages is not None:
        kwargs["num_stages"] = num_stages
    if input_output_aliases:
        kwargs["input_output_aliases"] = dict(input_output_aliases)
    call, side_effect = _call(kernel_fn, ctx.avals_in, ctx.avals_out, kwargs)
    rule: Callable[..., Any] = lower.lower_rule
    try:
        return rule(ctx, *array_args, call=call, has_side_effect=side_effect, platform=chosen)
    except KernelArgumentError as e:  # (the arguments bind when the kernel is specialized)
        contract = _contract(kernel_fn, ctx.avals_in, ctx.avals_out)
        raise KernelArgumentError(f"{e} ({contract})") from e
