"""Tracing a ``triton_call``: from the caller's arguments to a :class:`CallSpec`.

Two calling conventions are understood, chosen by the keyword that describes the outputs:

- ``out_shape=`` (jax-triton 0.3 and the ROCm fork): inputs are positional (keywords naming
  parameters allowed); the output pointers are the parameters right after the positional
  arguments, or those ``out_names=`` / the keys of a dict ``out_shape`` name.
  ``input_output_aliases`` maps an input *array* index (or parameter name) to an output index
  (or name), the output keeping its own parameter; a list names inputs updated in place.
- ``out_type=`` (jax-triton 0.4): arguments bind to the signature like a Python call
  (positionally and by keyword, in any order); the outputs, a pytree, fill the non-constexpr
  parameters no argument fills, in declaration order. ``input_output_aliases`` maps an index of
  the *flattened* operands (non-constexpr parameters in declaration order, tuples flattened,
  scalars counted) to an index of the flattened outputs, and an aliased output has no parameter:
  the kernel writes through the input's pointer.

In both, ``jax.Ref`` arguments are updated in place: the ref's value is an operand aliased to
a result, and the result is written back to the ref (what JAX's discharge of a ref effect does).

Buffers: jaxlib hands the kernel its array arguments in operand-then-result order. Outputs that
come before the last input in the signature are passed as zero-filled operands aliased to
their results (one memset); outputs after the last input are plain results.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from . import targets, tma
from .binding import ArgArray
from .errors import KernelArgumentError
from .kernels import KernelParts

if TYPE_CHECKING:
    from .artifacts import CacheArg

try:  # jax >= 0.8
    from jax.ref import AbstractRef as _AbstractRef
except ImportError:  # pragma: no cover - older jax
    from jax._src.state.types import AbstractRef as _AbstractRef
try:
    from jax._src.state.types import TransformedRef

    _TRANSFORMED_REF: tuple[type, ...] = (TransformedRef,)
except ImportError:  # pragma: no cover - a jax without ref transforms
    _TRANSFORMED_REF = ()


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

    def __repr__(self) -> str:  # how jaxprs print the primitive's parameter
        return f"CallSpec({self.parts.qualname}, grid={self.grid!r})"


# -- arguments ------------------------------------------------------------------------------
def is_ref(value: Any) -> bool:
    """Whether ``value`` is a ``jax.Ref`` (or a tracer of one)."""
    if value is None or isinstance(value, (np.ndarray, np.generic, bool, int, float, str)):
        return False
    try:
        return isinstance(jax.typeof(value), _AbstractRef)
    except TypeError:
        return False


def _is_array(x: Any) -> bool:
    if isinstance(x, (np.generic, bool, int, float)):
        return False
    return isinstance(x, (jax.Array, np.ndarray)) or isinstance(x, jax.core.Tracer)


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
        arr = jax.numpy.asarray(value)
        placeholder = ArgArray(arr.shape, arr.dtype, ("in", len(self.arrays)))
        self.arrays.append(placeholder)
        self.values.append(arr)
        return placeholder

    def convert(self, value: Any, where: str) -> Any:
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
        if tma.is_descriptor(value):
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


def _leaf_arrays(value: Any) -> list[ArgArray]:
    """The buffers of a converted argument, in order (a descriptor's is its base)."""
    if isinstance(value, ArgArray):
        return [value]
    if isinstance(value, tuple):
        return [a for v in value for a in _leaf_arrays(v)]
    base = getattr(value, "base", None)
    if isinstance(base, ArgArray) and hasattr(value, "block_shape"):
        return [base]
    return []


def _operand_leaves(value: Any) -> list[Any]:
    """The leaves of a converted argument as jax-triton 0.4 counts operands: arrays, scalars
    and descriptors one each, tuples flattened, None none."""
    if value is None:
        return []
    if isinstance(value, tuple):
        return [x for v in value for x in _operand_leaves(v)]
    return [value]


def _param_index(parts: KernelParts, ref: Any, what: str) -> str:
    names = parts.arg_names
    if isinstance(ref, str):
        if ref not in names:
            raise KernelArgumentError(
                f"{what} {ref!r} is not a parameter of {parts.qualname} ({', '.join(names)})"
            )
        return ref
    if isinstance(ref, (int, np.integer)) and 0 <= int(ref) < len(names):
        return names[int(ref)]
    raise KernelArgumentError(
        f"{what} {ref!r} is not a parameter name or index of {parts.qualname}"
    )


def _is_struct(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _name_of(named: Mapping[str, Any], arr: ArgArray) -> str:
    for n, v in named.items():
        if v is arr or (isinstance(v, tuple) and arr in _leaf_arrays(v)):
            return n
    return ""


# -- the two conventions --------------------------------------------------------------------
@dataclass
class Plan:
    """What a convention decides: arguments and outputs by parameter, buffers updated in place,
    and how the results become what the caller gets back."""

    named: dict[str, Any]  # every argument given and every output, by parameter name
    kwargs: dict[str, Any]  # kernel parameters the caller pinned
    outputs: list[ArgArray]  # output parameters (in the order of their slots)
    initial: dict[int, ArgArray]  # id(output) -> the input whose value it starts from
    inplace: list[ArgArray]  # inputs the kernel updates in place (each gets a result)
    visible: list[ArgArray]  # the caller's results, flat
    rebuild: Callable[[list[Any]], Any]  # flat results -> what triton_call returns
    zero_targets: list[ArgArray]  # what an integer in zeroed_outputs names


def _outputs_03(
    parts: KernelParts, n_args: int, out_shape: Any, out_names: Any
) -> tuple[list[str], list[Any], Callable[[list[Any]], Any]]:
    """Output parameter names, their shapes, and how to rebuild the caller's structure."""
    names = parts.arg_names
    if isinstance(out_shape, Mapping):
        keys_ = [_param_index(parts, k, "out_shape key") for k in out_shape]
        if out_names is not None:
            given = [out_names] if isinstance(out_names, (str, int)) else list(out_names)
            if {_param_index(parts, n, "out_names entry") for n in given} != set(keys_):
                raise KernelArgumentError(
                    "out_names and the keys of out_shape name different parameters"
                )
        shapes = list(out_shape.values())
        return keys_, shapes, lambda outs: dict(zip(keys_, outs, strict=True))
    leaves, tree = jax.tree_util.tree_flatten(out_shape, is_leaf=_is_struct)
    if any(not _is_struct(leaf) for leaf in leaves):
        raise KernelArgumentError(
            "out_shape must hold objects with .shape and .dtype (e.g. jax.ShapeDtypeStruct)"
        )
    if out_names is not None:
        given = [out_names] if isinstance(out_names, (str, int)) else list(out_names)
        outs = [_param_index(parts, n, "out_names entry") for n in given]
        if len(outs) != len(leaves):
            raise KernelArgumentError(
                f"out_names names {len(outs)} output(s) but out_shape describes {len(leaves)}"
            )
    else:
        if n_args + len(leaves) > len(names):
            raise KernelArgumentError(
                f"{parts.qualname} has {len(names)} parameters ({', '.join(names)}); "
                f"{n_args} positional argument(s) and {len(leaves)} output(s) do not fit. "
                "Outputs follow the positional arguments unless out_names= or a dict out_shape= "
                "names them (or write out_type=, jax-triton 0.4's convention: outputs fill the "
                "parameters no argument fills)"
            )
        outs = names[n_args : n_args + len(leaves)]
    if len(set(outs)) != len(outs):
        raise KernelArgumentError(f"an output parameter is named twice: {outs}")
    for p in parts.fn.params:
        if p.name in outs and p.is_constexpr:
            raise KernelArgumentError(
                f"output {p.name} of {parts.qualname} is a tl.constexpr: outputs are pointer "
                "parameters. With out_shape= (jax-triton 0.3) outputs follow the positional "
                "arguments unless out_names= or a dict out_shape= names them; with out_type= "
                "(jax-triton 0.4) they fill the parameters no argument fills"
            )
    return outs, leaves, lambda flat: jax.tree_util.tree_unflatten(tree, flat)


def plan_03(
    parts: KernelParts,
    inputs: Inputs,
    args: Sequence[Any],
    kernel_kwargs: Mapping[str, Any],
    out_shape: Any,
    out_names: Any,
    input_output_aliases: Any,
) -> Plan:
    """The jax-triton 0.3 convention (``out_shape=``; see the module docstring)."""
    names = parts.arg_names
    out_params, out_structs, rebuild = _outputs_03(parts, len(args), out_shape, out_names)
    in_params = [n for n in names if n not in out_params]
    if len(args) > len(in_params):
        raise KernelArgumentError(
            f"{parts.qualname} takes {len(in_params)} input argument(s) ({', '.join(in_params)}) "
            f"besides its output(s) {', '.join(out_params)}; {len(args)} were given"
        )
    given: dict[str, Any] = dict(zip(in_params, args, strict=False))
    for key in kernel_kwargs:
        if key in out_params:
            raise KernelArgumentError(f"{key} is an output of {parts.qualname}: do not pass it")
        if key in given:
            raise KernelArgumentError(
                f"{parts.qualname} got {key} both by position and by keyword (multiple values "
                f"for argument '{key}')"
            )
    named: dict[str, Any] = {}
    outputs: dict[str, ArgArray] = {}
    for n in names:
        if n in out_params:
            s = out_structs[out_params.index(n)]
            outputs[n] = named[n] = ArgArray(s.shape, s.dtype, ("out", out_params.index(n)))
        elif n in given or n in kernel_kwargs:
            named[n] = inputs.convert(given[n] if n in given else kernel_kwargs[n], n)
    kwargs = {k: named[k] for k in kernel_kwargs}

    # roles of input arrays: an output's initial value (dict form) or updated in place (list)
    initial: dict[int, ArgArray] = {}
    inplace: list[ArgArray] = []
    if isinstance(input_output_aliases, Mapping):
        for src, dst in input_output_aliases.items():
            if isinstance(src, str):
                found = _leaf_arrays(
                    named.get(_param_index(parts, src, "input_output_aliases key"))
                )
                if len(found) != 1:
                    raise KernelArgumentError(f"input_output_aliases: {src} is not one input array")
                arr = found[0]
            elif isinstance(src, (int, np.integer)) and 0 <= int(src) < len(inputs.arrays):
                arr = inputs.arrays[int(src)]
            else:
                raise KernelArgumentError(
                    f"input_output_aliases key {src!r}: use the index of an input array "
                    f"(0..{len(inputs.arrays) - 1}) or an input parameter name"
                )
            out = (
                dst
                if isinstance(dst, str)
                else (out_params[int(dst)] if 0 <= int(dst) < len(out_params) else None)
            )
            if out not in outputs:
                raise KernelArgumentError(f"input_output_aliases value {dst!r} is not an output")
            o = outputs[out]
            if (o.shape, o.jax_dtype) != (arr.shape, arr.jax_dtype):
                raise KernelArgumentError(
                    f"input_output_aliases: output {out} {o} cannot alias input {arr}: shapes and "
                    "dtypes must match"
                )
            if arr in initial.values():
                raise KernelArgumentError(f"input_output_aliases: {arr} is aliased twice")
            initial[id(o)] = arr
    elif input_output_aliases:
        refs = input_output_aliases
        if isinstance(refs, (str, int)):
            refs = [refs]
        for ref in refs:
            found = _leaf_arrays(named.get(_param_index(parts, ref, "input_output_aliases entry")))
            if not found:
                raise KernelArgumentError(f"input_output_aliases: {ref!r} is not an input array")
            inplace.extend(a for a in found if a not in inplace)
    out_list = [outputs[n] for n in out_params]
    n_regular = len(out_list)
    visible = out_list + list(inplace)

    def finish(flat: list[Any]) -> Any:
        regular = rebuild(flat[:n_regular])
        extras = flat[n_regular:]
        if not extras:
            return regular
        if isinstance(regular, dict):
            return {
                **regular,
                **{_name_of(named, a): x for a, x in zip(inplace, extras, strict=True)},
            }
        if not n_regular:
            return extras[0] if len(extras) == 1 else tuple(extras)
        head = regular if isinstance(regular, tuple) else (regular,)
        return (*head, *extras)

    return Plan(named, kwargs, out_list, initial, inplace, visible, finish, list(out_list))


def plan_04(
    parts: KernelParts,
    inputs: Inputs,
    args: Sequence[Any],
    kernel_kwargs: Mapping[str, Any],
    out_type: Any,
    input_output_aliases: Any,
) -> Plan:
    """The jax-triton 0.4 convention (``out_type=``; see the module docstring).

    Non-constexpr parameters with a default: when the outputs do not fill every parameter no
    argument fills, they fill those without a default, and the others keep their defaults
    (jax-triton 0.4 then raises). Missing constexprs take their defaults (Triton's binder).
    """
    names = parts.arg_names
    constexpr = {p.name for p in parts.fn.params if p.is_constexpr}
    has_default = {p.name for p in parts.fn.params if p.has_default}
    if len(args) > len(names):
        raise KernelArgumentError(
            f"{parts.qualname} takes {len(names)} positional arguments but {len(args)} were "
            "given (outputs are not passed: out_type= describes them)"
        )
    bound: dict[str, Any] = dict(zip(names, args, strict=False))
    for key, value in kernel_kwargs.items():
        if key in bound:
            raise KernelArgumentError(
                f"{parts.qualname} got multiple values for argument '{key}' (by position and by "
                "keyword)"
            )
        bound[key] = value
    leaves, tree = jax.tree_util.tree_flatten(out_type)
    if any(not _is_struct(leaf) for leaf in leaves):
        raise KernelArgumentError(
            "out_type must be a pytree of objects with .shape and .dtype (jax.ShapeDtypeStruct, "
            "jax.typeof(x), arrays)"
        )
    structs = [(tuple(leaf.shape), np.dtype(leaf.dtype)) for leaf in leaves]
    named: dict[str, Any] = {}
    for n in names:
        if n in bound:
            named[n] = inputs.convert(bound[n], n)
    operands = [
        x for n in names if n in named and n not in constexpr for x in _operand_leaves(named[n])
    ]

    if input_output_aliases is None:
        input_output_aliases = {}
    if not isinstance(input_output_aliases, Mapping):
        raise KernelArgumentError(
            "with out_type=, input_output_aliases is a dict {flattened operand index: flattened "
            "output index} (jax-triton 0.4); pass refs (jax.new_ref) for buffers updated in place"
        )
    if input_output_aliases and inputs.refs:
        raise KernelArgumentError(
            "input_output_aliases cannot be combined with Ref arguments. Refs express "
            "input/output aliasing implicitly"
        )
    alias_out: dict[int, ArgArray] = {}
    for i, j in input_output_aliases.items():
        if not isinstance(i, (int, np.integer)) or not 0 <= int(i) < len(operands):
            raise KernelArgumentError(
                f"input_output_aliases key {i!r}: with out_type= it is an index into the "
                f"{len(operands)} flattened operands (non-constexpr parameters in declaration "
                "order, tuples flattened, scalars counted)"
            )
        if not isinstance(j, (int, np.integer)) or not 0 <= int(j) < len(structs):
            raise KernelArgumentError(
                f"input_output_aliases value {j!r} is not an index into the {len(structs)} "
                "flattened outputs of out_type"
            )
        leaf = operands[int(i)]
        arr = _leaf_arrays(leaf)
        if len(arr) != 1:
            raise KernelArgumentError(
                f"input_output_aliases: operand {i} is {leaf!r}, not an array: only arrays can "
                "be aliased to outputs"
            )
        if int(j) in alias_out:
            raise KernelArgumentError("input_output_aliases must be a bijection")
        if arr[0] in alias_out.values():
            raise KernelArgumentError(f"input_output_aliases: operand {i} is aliased twice")
        if (arr[0].shape, arr[0].jax_dtype) != structs[int(j)]:
            raise KernelArgumentError(
                f"input_output_aliases: output {j} {structs[int(j)]} cannot alias operand {i} "
                f"{arr[0]}: shapes and dtypes must match"
            )
        alias_out[int(j)] = arr[0]

    missing = [n for n in names if n not in constexpr and n not in bound]
    n_out = len(structs) - len(alias_out)
    if len(missing) != n_out:
        required = [n for n in missing if n not in has_default]
        if len(required) != n_out:
            raise KernelArgumentError(
                f"out_type has {n_out} unaliased outputs, but {len(missing)} kernel parameters "
                f"are missing an argument ({', '.join(missing) or 'none'}) in {parts.qualname}: "
                "outputs fill the non-constexpr parameters no argument fills, in declaration "
                "order; aliased outputs take no parameter"
            )
        missing = required
    free = iter(j for j in range(len(structs)) if j not in alias_out)
    visible: list[ArgArray | None] = [None] * len(structs)
    outputs: list[ArgArray] = []
    for n in missing:
        j = next(free)
        a = ArgArray(structs[j][0], structs[j][1], ("out", j))
        named[n] = visible[j] = a
        outputs.append(a)
    inplace = []
    for j, src in sorted(alias_out.items()):
        visible[j] = src
        inplace.append(src)
    order = {n: i for i, n in enumerate(names)}
    named = dict(sorted(named.items(), key=lambda item: order[item[0]]))
    kwargs = {n: named[n] for n in names if n in bound and (n in kernel_kwargs or n in constexpr)}
    flat = [a for a in visible if a is not None]
    return Plan(
        named,
        kwargs,
        outputs,
        {},
        inplace,
        flat,
        lambda results: jax.tree_util.tree_unflatten(tree, results),
        list(flat),
    )


# -- buffers ----------------------------------------------------------------------------------
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
    leaves = [a for n in names if n in named for a in _leaf_arrays(named[n])]
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

    out_avals = tuple(jax.core.ShapedArray(a.shape, a.jax_dtype) for a in results)
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
    )
    return spec, operands, finish
