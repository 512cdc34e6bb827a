"""Tracing a ``triton_call``: from the caller's arguments to a :class:`CallSpec`.

The arguments become Triton values (:mod:`bridge.call.arguments`), a calling convention
(:mod:`bridge.call.conventions`) places the outputs, and :func:`make_call` lays out the custom call's
buffers.

Buffers: jaxlib hands the kernel its array arguments in operand-then-result order. Outputs that
come before the last input in the signature are passed as zero-filled operands aliased to
their results (one memset); outputs after the last input are plain results. A ref's value is an
operand aliased to a result, written back to the ref (what JAX's discharge of a ref effect
does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax

from ..errors import KernelArgumentError
from ..vendors import targets
from .arguments import Inputs, leaf_arrays
from .kernel_objects import KernelParts
from .placeholders import ArgArray

if TYPE_CHECKING:
    from ..caches import CacheArg
    from .plan import Plan


_SHAPED = jax.core.ShapedArray


@dataclass(frozen=True, eq=False)
class CallSpec:
    """Everything about one ``triton_call`` site except the array values (the primitive's
    static parameter; compared by identity)."""

    parts: KernelParts
    named: Mapping[str, Any]  # every argument given, by parameter name (ArgArray for arrays)
    kwargs: Mapping[str, Any]  # kernel parameters the caller pinned (by keyword; 0.4 constexprs)
    options: Mapping[str, Any]  # backend options the caller set
    grid: Any
    zeroed: Any  # output indices/names, or a function of the bound arguments returning them
    zero_targets: tuple[ArgArray, ...]  # what an output index of ``zeroed`` names
    writable: frozenset[int]  # id() of every ArgArray whose buffer the kernel may overwrite
    n_operands: int
    out_avals: tuple[Any, ...]  # results, in custom-call order
    buffers: Mapping[int, int]  # id(ArgArray) -> buffer index (operands, then results)
    aliases: tuple[tuple[int, int], ...]  # (operand, result)
    restore: tuple[tuple[int, int], ...]  # (operand, result) whose input must survive autotuning
    target: str | targets.Target | None
    embed: str | None
    cache: CacheArg
    name: str
    metadata: bytes
    cost_estimate: Mapping[str, Any] | None = None
    autotune: str | None = None  # the call's autotune mode (None: $KERNELCACHE_AUTOTUNE)
    choice: int | None = None  # lower only this variant (measuring one config)

    def __repr__(self) -> str:  # how jaxprs print the primitive's parameter
        return f"CallSpec({self.parts.qualname}, grid={self.grid!r})"


def make_call(
    parts: KernelParts,
    inputs: Inputs,
    plan: Plan,
    *,
    grid: Any,
    zeroed_outputs: Any,
    options: Mapping[str, Any],
    target: str | targets.Target | None,
    embed_mode: str | None,
    cache: CacheArg,
    name: str,
    serialized_metadata: bytes,
    cost_estimate: Mapping[str, Any] | None,
    autotune: str | None = None,
) -> tuple[CallSpec, list[Any], Callable[[list[Any]], Any]]:
    """Lay out the buffers of a planned call: returns its CallSpec, the operand values, and a
    function that turns the custom call's results into what ``triton_call`` returns (writing
    updated refs back)."""
    names = parts.arg_names
    named = plan.named
    inplace = list(plan.inplace)
    for a in inputs.arrays:  # refs are updated in place too
        if id(a) in inputs.refs and a not in inplace:
            inplace.append(a)

    # buffer layout: array leaves in signature order; operands up to the last input
    leaves = [a for n in names if n in named for a in leaf_arrays(named[n])]
    last_in = max((i for i, a in enumerate(leaves) if a.slot[0] == "in"), default=-1)
    operands: list[Any] = []
    op_arrays: list[ArgArray] = []
    plain: list[ArgArray] = []
    extra: list[tuple[ArgArray, int]] = []  # results aliasing an operand
    restore: list[tuple[int, int]] = []
    in_values = dict(zip(map(id, inputs.arrays), inputs.values, strict=True))
    for i, a in enumerate(leaves):
        if i > last_in:
            plain.append(a)
            continue
        k = len(op_arrays)
        op_arrays.append(a)
        if a.slot[0] == "in":
            operands.append(in_values[id(a)])
            if a in inplace:
                extra.append((a, k))
        else:  # an output before the last input: a zero-filled operand aliased to its result
            src = plan.initial.get(id(a))
            operands.append(
                in_values[id(src)] if src is not None else jax.numpy.zeros(a.shape, a.jax_dtype)
            )
            extra.append((a, k))
    results = plain + [a for a, _ in extra]
    n_ops = len(op_arrays)
    buffers = {id(a): i for i, a in enumerate(op_arrays)}
    buffers.update({id(a): n_ops + j for j, a in enumerate(plain)})
    aliases: list[tuple[int, int]] = []
    for j, (a, k) in enumerate(extra):
        aliases.append((k, len(plain) + j))
        if a.slot[0] == "in" or plan.initial.get(id(a)) is not None:
            restore.append((k, len(plain) + j))
    for o in plan.outputs:
        src = plan.initial.get(id(o))
        if src is None:
            continue
        if id(o) in buffers and buffers[id(o)] >= n_ops:  # a plain result aliasing an input
            if src not in op_arrays:
                raise KernelArgumentError(f"input_output_aliases: {src} is not an operand")
            k = op_arrays.index(src)
            aliases.append((k, buffers[id(o)] - n_ops))
            restore.append((k, buffers[id(o)] - n_ops))
    if len({k for k, _ in aliases}) != len(aliases):
        raise KernelArgumentError("input_output_aliases: an input buffer is aliased to two outputs")

    out_avals = tuple(_SHAPED(a.shape, a.jax_dtype) for a in results)
    result_index = {id(a): j for j, a in enumerate(results)}
    refs = [
        (result_index[id(a)], inputs.refs[id(a)]) for a in inputs.arrays if id(a) in inputs.refs
    ]

    def finish(flat: list[Any]) -> Any:
        for j, ref in refs:
            ref[...] = flat[j]
        return plan.rebuild([flat[result_index[id(a)]] for a in plan.visible])

    spec = CallSpec(
        parts=parts,
        named=named,
        kwargs=plan.kwargs,
        options=dict(options),
        grid=grid,
        zeroed=zeroed_outputs,
        zero_targets=tuple(plan.zero_targets),
        writable=frozenset(map(id, [*plan.outputs, *inplace])),
        n_operands=n_ops,
        out_avals=out_avals,
        buffers=buffers,
        aliases=tuple(aliases),
        restore=tuple(restore),
        target=target,
        embed=embed_mode,
        cache=cache,
        name=name or parts.name,
        metadata=bytes(serialized_metadata),
        cost_estimate=dict(cost_estimate) if cost_estimate else None,
        autotune=autotune,
    )
    return spec, operands, finish
