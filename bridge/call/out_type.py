"""The ``out_type=`` convention of jax-triton 0.4 (``"0.4"``), as :mod:`.conventions`
describes it: arguments bind like a Python call, and the outputs fill the non-constexpr
parameters no argument fills, in declaration order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from ..exceptions import KernelArgumentError
from .kernel_objects import KernelParts
from .out_shape import is_struct
from .placeholders import ArgArray
from .tracing import Inputs, Plan, leaf_arrays


def operand_leaves(value: Any) -> list[Any]:
    """The leaves of a converted argument as jax-triton 0.4 counts operands: arrays, scalars
    and descriptors one each, tuples flattened, None none."""
    if value is None:
        return []
    if isinstance(value, tuple):
        return [x for v in value for x in operand_leaves(v)]
    return [value]


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
    if any(not is_struct(leaf) for leaf in leaves):
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
        x for n in names if n in named and n not in constexpr for x in operand_leaves(named[n])
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
        arr = leaf_arrays(leaf)
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
