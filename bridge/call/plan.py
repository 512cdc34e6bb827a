"""What a calling convention makes of a call: a :class:`Plan`, and what the conventions share.

The ``convention=`` values are declared here; :mod:`.out_shape` plans the two ``out_shape=``
conventions (jax-triton 0.3 and the ROCm fork), :mod:`.out_type` the ``out_type=`` one
(jax-triton 0.4), and :mod:`.conventions` chooses among them (see its docstring for how each
reads a call).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import KernelArgumentError
from .arguments import leaf_arrays
from .kernel_objects import KernelParts
from .placeholders import ArgArray

#: the convention= values (see the module docstring)
JAX_TRITON_03, JAX_TRITON_04, ROCM_FORK = "0.3", "0.4", "rocm"
#: convention= values, and what each names
CONVENTIONS = {
    JAX_TRITON_03: "jax-triton 0.3",
    JAX_TRITON_04: "jax-triton 0.4",
    ROCM_FORK: "the ROCm fork of jax-triton",
}


def operand_leaves(value: Any) -> list[Any]:
    """The leaves of a converted argument as jax-triton 0.4 counts operands: arrays, scalars
    and descriptors one each, tuples flattened, None none."""
    if value is None:
        return []
    if isinstance(value, tuple):
        return [x for v in value for x in operand_leaves(v)]
    return [value]


def param_index(parts: KernelParts, ref: Any, what: str) -> str:
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


def is_struct(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def name_of(named: Mapping[str, Any], arr: ArgArray) -> str:
    for n, v in named.items():
        if v is arr or (isinstance(v, tuple) and arr in leaf_arrays(v)):
            return n
    return ""


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
