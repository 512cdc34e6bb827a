"""The runtime arguments of a bound kernel call, as jaxlib's Triton call passes them.

A call bound by Triton's binder (:func:`.binding.bind`) becomes its :class:`Leaf` tuple: every
runtime argument in the order of the kernel's ABI (tuples flattened depth first, constexprs
left out), with its Triton type, its value and the divisibility the kernel was specialized for.
The lowering makes each one parameter of jaxlib's ``TritonKernelCall``.

Invariants, checked by :func:`abi_leaves` before anything is keyed or compiled: a pointer
parameter holds an array placeholder (:class:`~.placeholders.ArgArray`) and no other parameter
does; a scalar's type is one of :data:`SCALAR_FIELDS`, those jaxlib can pass; an integer fits
its type, and a Python float passed as fp32 does not overflow it; a host-side tensor descriptor
passes as it is. A pointer's divisibility is 16 where Triton's specialization says so, else 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import KernelArgumentError
from .kernel_objects import KernelParts
from .placeholders import ArgArray

#: Triton scalar type -> field of jaxlib's TritonKernelCall.Parameter
SCALAR_FIELDS = {
    "i1": "bool_",
    "u1": "bool_",
    "i32": "i32",
    "u32": "u32",
    "i64": "i64",
    "u64": "u64",
    "fp32": "f32",
    "fp64": "f64",
}
#: the values each integer type holds
_INT_RANGES = {
    "i32": (-(2**31), 2**31 - 1),
    "u32": (0, 2**32 - 1),
    "i64": (-(2**63), 2**63 - 1),
    "u64": (0, 2**64 - 1),
}
#: the largest finite fp32
_FP32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class Leaf:
    """A runtime argument of the compiled kernel, in the order of the kernel's ABI."""

    path: tuple[int, ...]
    type: str
    value: Any  # ArgArray for pointers, a Python scalar otherwise
    divisibility: int = 0

    @property
    def is_array(self) -> bool:
        return self.type.startswith("*")

    @property
    def is_descriptor(self) -> bool:
        """A host-side tensor descriptor (``value`` is Triton's descriptor object)."""
        return self.type.startswith("tensordesc")


def abi_leaves(
    parts: KernelParts,
    bound_args: Mapping[str, Any],
    signature: Mapping[str, Any],
    attrs: Mapping[tuple[int, ...], Any],
) -> Iterator[Leaf]:
    """The runtime arguments of ``bound_args`` (every parameter's value, as Triton's binder
    gives them), by the ``signature`` and ``attrs`` Triton's ``_pack_args`` returns for them.

    Raises:
        KernelArgumentError: a pointer given anything but an array, a scalar given an array, a
            scalar type jaxlib's Triton call cannot pass, or a value its type does not hold.
    """

    def walk(value: Any, typ: Any, path: tuple[int, ...], name: str):
        if isinstance(typ, tuple):
            for j, (v, t) in enumerate(zip(value, typ, strict=True)):
                yield from walk(v, t, (*path, j), name)
            return
        if typ == "constexpr":
            return
        if typ.startswith("tensordesc"):
            yield Leaf(path, typ, value)
            return
        if typ.startswith("*"):
            if not isinstance(value, ArgArray):
                raise KernelArgumentError(
                    f"{parts.qualname}: parameter {name} is a pointer ({typ}) but got {value!r}; "
                    "pass a JAX array"
                )
            divisible = ["tt.divisibility", 16] in list(attrs.get(path, []))
            yield Leaf(path, typ, value, 16 if divisible else 0)
            return
        if isinstance(value, ArgArray):
            raise KernelArgumentError(
                f"{parts.qualname}: parameter {name} is annotated as the scalar type {typ} but got "
                "an array"
            )
        if typ not in SCALAR_FIELDS:
            raise KernelArgumentError(
                f"{parts.qualname}: parameter {name} has type {typ}, which jaxlib's Triton call "
                f"cannot pass; runtime scalars may be {', '.join(sorted(SCALAR_FIELDS))}: make "
                "it a tl.constexpr or change its annotation"
            )
        if typ in _INT_RANGES:
            lo, hi = _INT_RANGES[typ]
            if not lo <= int(value) <= hi:
                raise KernelArgumentError(f"{parts.qualname}: {name}={value} does not fit {typ}")
        if typ == "fp32" and math.isfinite(value) and abs(value) > _FP32_MAX:
            raise KernelArgumentError(
                f"{parts.qualname}: {name}={value} overflows fp32 (the type Triton gives a Python "
                f"float): annotate the parameter ({name}: tl.float64) to pass it as fp64"
            )
        yield Leaf(path, typ, value)

    for i, (name, value) in enumerate(bound_args.items()):
        yield from walk(value, signature[name], (i,), name)
