"""``triton_call_lowering``: the bridge inside a primitive's own lowering rule, with
TransformerEngine's contract (``transformer_engine.jax.triton_extensions.triton_call_lowering``).

A JAX primitive whose lowering rule (``mlir.register_lowering``) calls it gets a Triton or Gluon
kernel launched through jaxlib's Triton custom call, compiled through the kernel cache, with
everything ``bridge.triton_call`` does: inline machine code (no temporary path on ROCm),
byte-identical modules across processes, stored lowerings, autotune decisions.

TE's contract, argument for argument (NVIDIA's main and AMD's fork; :mod:`bridge.call.rule_contract`
plans it): every parameter ``constexprs`` names is bound at compile time and is part of the
kernel's key (a ``tl.constexpr``, a scalar runtime parameter such as a size or a stride, or a
pointer given as ``None``); the parameters it does not name, in signature order, take the
rule's operands (``ctx.avals_in``), then its results (``ctx.avals_out``); results past them
are written through the operand they alias. ``input_output_aliases`` maps an operand's index
to a result's (the same buffer: jaxlib's operand-output aliasing). ``grid`` is up to three
ints, or a function of the parameters (the caller's constexprs and an autotune config's
values) returning them. ``num_warps`` and ``num_stages`` default to TE's 4 and 3 on every
target; an autotuned kernel's configs carry their own, and these two are then ignored, as TE
ignores them. ``enable_fp_fusion`` defaults to False, as TE compiles. The target is the
platform being lowered ("cuda" or "rocm") with the local device, or ``$KERNELCACHE_TARGET``.

Invariants: the custom call's operands are the rule's operands, unchanged and in order, and the
values returned are its results in ``ctx.avals_out``'s order; ``bridge.triton_call`` is not
involved (its conventions are its own callers').
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax

from .call import rule_contract
from .call.tracing import triton_call_p
from .exceptions import KernelArgumentError
from .lowering import lower
from .vendors.vendor import registered

#: the lowering platforms the bridge has vendors for
_PLATFORMS = tuple(v.platform for v in registered())


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


#: TransformerEngine's compile options where the caller gives none (both repositories' current
#: ``triton_call_lowering``; Triton's ``Config`` defaults)
DEFAULT_NUM_WARPS, DEFAULT_NUM_STAGES = 4, 3


def _name(parts: Any) -> str:
    return f"triton_call_lowering of {parts.qualname}"


def _options(
    parts: Any,
    options: Mapping[str, Any],
    num_warps: int | None,
    num_stages: int | None,
    enable_fp_fusion: bool,
) -> dict[str, Any]:
    """The call's backend options: ``options`` checked as ``bridge.triton_call`` checks them,
    with TE's defaults (see the module docstring)."""
    from .api import call_options

    explicit: dict[str, Any] = {"enable_fp_fusion": bool(enable_fp_fusion)}
    if not rule_contract.is_autotuned(parts):  # (an autotuned kernel's configs carry their own)
        explicit["num_warps"] = DEFAULT_NUM_WARPS if num_warps is None else num_warps
        explicit["num_stages"] = DEFAULT_NUM_STAGES if num_stages is None else num_stages
    return call_options(parts, explicit, options, None)


def _traced(
    parts: Any,
    ctx: Any,
    constexprs: Mapping[str, Any],
    aliases: Mapping[int, int] | None,
    make: Callable[[Any, Any], tuple[Any, list[Any], Any]],
) -> tuple[Any, list[int]]:
    """The call spec of the rule's call, and where each of the rule's results is among the
    custom call's: the contract's plan traced on the rule's operands, which must be exactly one
    custom call of them."""
    from .call.tracing import Inputs

    def fn(*xs: Any) -> Any:
        inputs = Inputs(parts)
        plan = rule_contract.plan_rule(parts, inputs, xs, ctx.avals_out, constexprs, aliases)
        call, operands, finish = make(inputs, plan)
        return finish(list(triton_call_p.bind(*operands, call=call, has_side_effect=False)))

    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in ctx.avals_in]
    jaxpr = jax.make_jaxpr(fn)(*specs).jaxpr
    eqn = jaxpr.eqns[0] if len(jaxpr.eqns) == 1 else None
    if eqn is None or eqn.primitive is not triton_call_p or eqn.invars != jaxpr.invars:
        raise KernelArgumentError("the rule's operands are not exactly the kernel's operands")
    outs = list(eqn.outvars)
    order = [outs.index(v) for v in jaxpr.outvars]
    assert sorted(order) == list(range(len(outs))), (order, len(outs))
    return eqn.params["call"], order


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
    zeroed_outputs: Any = (),
    target: str | None = None,
    embed: str | None = None,
    cache: Any = None,
    autotune: str | None = None,
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
        constexprs: the parameters bound at compile time, by name: constexprs, scalars, and
            pointers given as None.
        num_warps, num_stages: compile options (4 and 3 where None; ignored for an autotuned
            kernel, whose configs carry their own).
        enable_fp_fusion: fuse multiplies and adds (False, as TransformerEngine compiles).
        platform: "cuda" or "rocm" where the rule is registered for several platforms.
        zeroed_outputs, target, embed, cache, autotune: as for ``bridge.triton_call``.
        **options: other options of the target's Triton backend (``num_ctas``, ...).

    Returns:
        The results, as MLIR values (what ``jax.ffi.ffi_lowering``'s rule returns).

    Raises:
        KernelArgumentError: the kernel's parameters do not fit the rule's operands and results.
    """
    from .call import tracing
    from .call.kernel_objects import decompose
    from .settings import AUTOTUNE_MODES
    from .vendors import targets

    chosen = _platform(ctx, platform)
    if len(array_args) != len(ctx.avals_in):
        raise KernelArgumentError(
            f"triton_call_lowering: {len(array_args)} operands given, but the rule has "
            f"{len(ctx.avals_in)} (ctx.avals_in): pass the rule's operands as they come"
        )
    if target is not None:
        targets.parse_target(target)
    if autotune is not None and autotune not in AUTOTUNE_MODES:
        raise KernelArgumentError(
            f"autotune={autotune!r} is not one of {', '.join(AUTOTUNE_MODES)}"
        )
    parts = decompose(kernel_fn)
    given = dict(constexprs or {})
    launch = _options(parts, options, num_warps, num_stages, enable_fp_fusion)

    def make(inputs: Any, plan: Any) -> tuple[Any, list[Any], Any]:
        return tracing.make_call(
            parts,
            inputs,
            plan,
            grid=rule_contract.meta_grid(grid, given),
            zeroed_outputs=zeroed_outputs,
            options=launch,
            target=target,
            embed_mode=embed,
            cache=cache,
            name="",
            serialized_metadata=b"",
            cost_estimate=None,
            autotune=autotune,
        )

    try:
        call, order = _traced(parts, ctx, given, input_output_aliases, make)
    except KernelArgumentError as e:
        raise KernelArgumentError(f"{_name(parts)}: {e}") from e
    inner = ctx
    if order != sorted(order):  # the custom call's results are in another order than the rule's
        avals = [None] * len(order)
        for j, r in enumerate(order):
            avals[r] = ctx.avals_out[j]
        inner = ctx.replace(avals_out=avals)
    rule: Callable[..., Any] = lower.lower_rule
    try:
        results = rule(inner, *array_args, call=call, has_side_effect=False, platform=chosen)
    except KernelArgumentError as e:  # (the arguments bind when the kernel is specialized)
        raise KernelArgumentError(f"{_name(parts)}: {e}") from e
    return [results[r] for r in order]
