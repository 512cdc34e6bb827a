"""A call's arguments as Triton values: arrays become abstract placeholders (:class:`ArgArray`,
recorded as operands), ``jax.Ref`` arguments placeholders of their value (updated in place),
host-side descriptors Triton's own descriptor objects, NumPy scalars Python ones, tuples
element-wise. No array value is read: tracing sees shapes and dtypes only.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ..errors import KernelArgumentError
from . import tma
from .kernel_objects import KernelParts
from .placeholders import ArgArray

try:  # jax >= 0.8
    from jax.ref import AbstractRef as _AbstractRef
except ImportError:  # pragma: no cover - older jax
    from jax._src.state.types import AbstractRef as _AbstractRef
try:
    from jax._src.state.types import TransformedRef

    _TRANSFORMED_REF: tuple[type, ...] = (TransformedRef,)
except ImportError:  # pragma: no cover - a jax without ref transforms
    _TRANSFORMED_REF = ()


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


_TRACER = jax.core.Tracer
_JAX_VALUES = (_TRACER, jax.Array)  # (the tracer class first: jax.Array is an ABC, slower)


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
