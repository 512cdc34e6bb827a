"""Tracing a ``triton_call``: from the caller's arguments to one bind of the primitive.

The arguments become Triton values (:class:`Inputs`): arrays become abstract placeholders
(:class:`~.placeholders.ArgArray`, recorded as operands), ``jax.Ref`` arguments placeholders of their
value (updated in place), host-side descriptors Triton's own descriptor objects
(:mod:`bridge.call.tma`), NumPy scalars Python ones, tuples element-wise. No array value is read:
tracing sees shapes and dtypes only. A calling convention (:mod:`.conventions`) places them and
the outputs, and :func:`make_call` lays out the custom call's buffers into a :class:`CallSpec`,
the static parameter of the ``triton_call`` primitive (:data:`triton_call_p`).

Buffers: jaxlib hands the kernel its array arguments in operand-then-result order. Outputs that
come before the last input in the signature are passed as zero-filled operands aliased to
their results (one memset); outputs after the last input are plain results. A ref's value is an
operand aliased to a result, written back to the ref (what JAX's discharge of a ref effect
does).

The primitive's rules: abstract evaluation, no differentiation, batching by running the kernel
once per batch element, and dead-code elimination that keeps every call. Its lowerings live in
:mod:`bridge.lowering.lower`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

try:  # the public homes of the primitive registries (jax 0.8 - 0.11)
    from jax.interpreters import ad, batching
    from jax.interpreters import partial_eval as pe

    _ = (ad.primitive_jvps, batching.primitive_batchers, pe.dce_rules)
except (ImportError, AttributeError):  # pragma: no cover - later releases
    from jax._src.interpreters import ad, batching  # type: ignore[no-redef]
    from jax._src.interpreters import partial_eval as pe  # type: ignore[no-redef]

from ..exceptions import KernelArgumentError, UnsupportedTransformation
from ..vendors import targets
from .kernel_objects import KernelParts
from .placeholders import ArgArray

if TYPE_CHECKING:
    from ..settings import CacheArg

try:  # jax >= 0.8
    from jax.ref import AbstractRef as _AbstractRef
except ImportError:  # pragma: no cover - older jax
    from jax._src.state.types import AbstractRef as _AbstractRef
try:
    from jax._src.state.types import TransformedRef

    _TRANSFORMED_REF: tuple[type, ...] = (TransformedRef,)
except ImportError:  # pragma: no cover - a jax without ref transforms
    _TRANSFORMED_REF = ()


_TRACER = jax.core.Tracer
_JAX_VALUES = (_TRACER, jax.Array)  # (the tracer class first: jax.Array is an ABC, slower)


def is_ref(value: Any) -> bool:
    """Whether ``value`` is a ``jax.Ref`` (or a tracer of one)."""
    if value is None or isinstance(value, (np.ndarray, np.generic, bool, int, float, str)):
        return False
    if isinstance(value, _TRACER):
        return isinstance(value.aval, _AbstractRef)
    try:
        return isinstance(jax.typeof(value), _AbstractRef)
    except TypeError:
        return False


def is_descriptor(value: Any) -> bool:
    """Whether ``value`` is a host-side descriptor: ``bridge.TensorDescriptor``, or
    jax-triton's (recognised by name and fields, so call sites written for it need no change)."""
    return type(value).__name__ == "TensorDescriptor" and all(
        hasattr(value, f) for f in ("base", "shape", "strides", "block_shape", "padding")
    )


def _is_array(x: Any) -> bool:
    if isinstance(x, (np.generic, bool, int, float)):
        return False
    return isinstance(x, (_TRACER, np.ndarray, jax.Array))


class Inputs:
    """Turns call arguments into Triton values: arrays into ArgArray placeholders (recorded as
    operands), refs into placeholders of their value (updated in place), descriptors into
    Triton's descriptor objects, NumPy scalars into Python ones, tuples element-wise."""

    def __init__(self, parts: KernelParts) -> None:
        self.parts = parts
        self.arrays: list[ArgArray] = []
        self.values: list[Any] = []
        self.refs: dict[int, Any] = {}  # id(ArgArray) -> the jax.Ref it reads

    def _array(self, value: Any) -> ArgArray:
        # JAX's own values are what asarray would return; others (NumPy) are converted
        arr = value if isinstance(value, _JAX_VALUES) else jax.numpy.asarray(value)
        placeholder = ArgArray(arr.shape, arr.dtype, ("in", len(self.arrays)))
        self.arrays.append(placeholder)
        self.values.append(arr)
        return placeholder

    def convert(self, value: Any, where: str) -> Any:
        kind = type(value)
        if kind is int or kind is float or kind is bool:  # the common cases first
            return value
        if isinstance(value, _TRACER) and not isinstance(value.aval, _AbstractRef):
            return self._array(value)
        if isinstance(value, _TRANSFORMED_REF):
            raise KernelArgumentError(
                f"{where}: a transformed ref (ref.at[...]) cannot be passed to a kernel; pass "
                "the whole ref, or an array"
            )
        if is_ref(value):
            if any(r is value for r in self.refs.values()):
                raise KernelArgumentError(
                    f"{where}: the same ref is passed twice; a kernel gets one buffer per ref"
                )
            placeholder = self._array(value[...])
            self.refs[id(placeholder)] = value
            return placeholder
        if is_descriptor(value):
            from . import tma

            base = self.convert(value.base, f"{where} (descriptor base)")
            if not isinstance(base, ArgArray):
                raise KernelArgumentError(f"{where}: a tensor descriptor's base must be an array")
            return tma.triton_descriptor(
                value, base, self.parts.is_gluon, self.parts.qualname, where
            )
        if _is_array(value):
            return self._array(value)
        if isinstance(value, tuple):
            items = [self.convert(v, f"{where}[{i}]") for i, v in enumerate(value)]
            return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
        if isinstance(value, list):
            raise KernelArgumentError(
                f"{where}: pass tuples, not lists, as tuple arguments of a kernel"
            )
        if isinstance(value, np.bool_):
            return bool(value)
        if isinstance(value, np.integer):
            return int(value)
        if isinstance(value, np.floating):
            return float(value)
        return value


def leaf_arrays(value: Any) -> list[ArgArray]:
    """The buffers of a converted argument, in order (a descriptor's is its base)."""
    if isinstance(value, ArgArray):
        return [value]
    if isinstance(value, tuple):
        return [a for v in value for a in leaf_arrays(v)]
    base = getattr(value, "base", None)
    if isinstance(base, ArgArray) and hasattr(value, "block_shape"):
        return [base]
    return []


@dataclass
class Plan:
    """What a convention (:mod:`.conventions`) or TransformerEngine's rule contract
    (:mod:`.rule_contract`) decides, and :func:`make_call` lays out: arguments and outputs by
    parameter, buffers updated in place, and how the results become what the caller gets back."""

    named: dict[str, Any]  # every argument given and every output, by parameter name
    kwargs: dict[str, Any]  # kernel parameters the caller pinned
    outputs: list[ArgArray]  # output parameters (in the order of their slots)
    initial: dict[int, ArgArray]  # id(output) -> the input whose value it starts from
    inplace: list[ArgArray]  # inputs the kernel updates in place (each gets a result)
    visible: list[ArgArray]  # the caller's results, flat
    rebuild: Callable[[list[Any]], Any]  # flat results -> what triton_call returns
    zero_targets: list[ArgArray]  # what an integer in zeroed_outputs names


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


def _primitive_class() -> Any:
    """``jax.extend.core.Primitive``, without importing all of ``jax.extend`` where JAX's own
    class is at hand (``import jax.extend`` loads Pallas too)."""
    try:
        from jax._src.core import Primitive
    except ImportError:  # pragma: no cover - a JAX that moved it: the public path
        import jax.extend

        return jax.extend.core.Primitive
    return Primitive


triton_call_p = _primitive_class()("kernelcache_triton_call")
triton_call_p.multiple_results = True


def _impl(*args: Any, call: CallSpec, has_side_effect: bool) -> Any:
    return jax.jit(lambda *a: triton_call_p.bind(*a, call=call, has_side_effect=has_side_effect))(
        *args
    )


triton_call_p.def_impl(_impl)


@triton_call_p.def_abstract_eval
def _abstract_eval(*avals: Any, call: CallSpec, has_side_effect: bool) -> tuple[Any, ...]:
    return call.out_avals


def _no_jvp(primals: Any, tangents: Any, *, call: CallSpec, has_side_effect: bool) -> Any:
    raise UnsupportedTransformation(
        f"cannot differentiate the Triton kernel {call.parts.qualname}: JAX cannot see inside "
        "it. Wrap the call in jax.custom_vjp (or custom_jvp) with a backward kernel or a jnp rule"
    )


def _vmap(args: Sequence[Any], dims: Sequence[Any], **params: Any) -> Any:
    """Batching by running the kernel once per batch element (``lax.map``): exactly the
    results of separate calls, in sequence. Write a batched kernel for speed."""
    batched = [i for i, d in enumerate(dims) if d is not None]
    moved = [jax.numpy.moveaxis(args[i], dims[i], 0) for i in batched]

    def one(xs: Sequence[Any]) -> Any:
        full = list(args)
        for i, x in zip(batched, xs, strict=True):
            full[i] = x
        return tuple(triton_call_p.bind(*full, **params))

    outs = jax.lax.map(one, tuple(moved))
    return list(outs), [0] * len(outs)


def _keep(used_outputs: list[bool], eqn: Any) -> tuple[list[bool], Any]:
    """JAX's dead-code elimination keeps every kernel call, as jax-triton 0.4 does. (Without
    ``has_side_effect=True``, XLA may still remove a call whose results are all unused.)"""
    return [True] * len(eqn.invars), eqn


ad.primitive_jvps[triton_call_p] = _no_jvp
batching.primitive_batchers[triton_call_p] = _vmap
pe.dce_rules[triton_call_p] = _keep
