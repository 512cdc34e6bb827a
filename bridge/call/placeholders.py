"""Placeholders of arrays while Triton binds and specializes a call: :class:`ArgArray` answers
what Triton asks of a tensor (dtype, data pointer, size) without any data."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import ml_dtypes  # noqa: F401  (registers bfloat16 and the float8 types with numpy, as jax does)
import numpy as np

from ..exceptions import KernelArgumentError

#: JAX dtype name -> name of the ``triton.language`` dtype of a pointer to it
TRITON_DTYPES = {
    "bool": "int1",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float32": "float32",
    "float64": "float64",
    "float8_e4m3fn": "float8e4nv",
    "float8_e5m2": "float8e5",
    "float8_e4m3fnuz": "float8e4b8",
    "float8_e5m2fnuz": "float8e5b16",
    "float8_e4m3b11fnuz": "float8e4b15",
}


#: what each dtype seen so far gives: (the NumPy dtype, its name, Triton's dtype)
_DTYPES: dict[Any, tuple[np.dtype[Any], str, Any]] = {}


def _dtype(jax_dtype: Any) -> tuple[np.dtype[Any], str, Any]:
    """:data:`_DTYPES`' entry of ``jax_dtype``, computed (and kept where it is hashable)."""
    import triton.language as tl

    dtype = np.dtype(jax_dtype)
    name = TRITON_DTYPES.get(dtype.name)
    if name is None:
        raise KernelArgumentError(
            f"arrays of dtype {dtype.name} cannot be passed to a Triton kernel; "
            f"supported: {', '.join(TRITON_DTYPES)}"
        )
    found = (dtype, dtype.name, getattr(tl, name))
    try:
        _DTYPES[jax_dtype] = found
    except TypeError:  # (an unhashable description of a dtype: computed each time)
        pass
    return found


def dtype_name(dtype: np.dtype[Any]) -> str:
    """``dtype.name`` of a dtype arrays may have, from :data:`_DTYPES` (NumPy computes it anew
    each time)."""
    return (_DTYPES.get(dtype) or _dtype(dtype))[1]


class ArgArray:
    """An abstract array standing in for a tensor while Triton binds and specializes a call.

    ``slot`` identifies the buffer (``("in", i)`` for the i-th input array, ``("out", j)`` for
    the j-th output). Heuristics and grid functions see these objects: they have ``shape``,
    ``dtype`` (Triton's), ``ndim``, ``numel()``, ``element_size()`` and contiguous ``stride()``.
    """

    __slots__ = ("dtype", "dtype_name", "jax_dtype", "nbytes", "shape", "slot")

    def __init__(self, shape: Sequence[int], jax_dtype: Any, slot: tuple[str, int]) -> None:
        self.shape = tuple(map(int, shape))
        known = _DTYPES.get(jax_dtype)
        if known is None:
            known = _dtype(jax_dtype)
        #: the NumPy dtype, its name (``float32``, ``bfloat16``) and Triton's dtype
        self.jax_dtype, self.dtype_name, self.dtype = known
        self.nbytes = math.prod(self.shape) * self.jax_dtype.itemsize
        self.slot = slot

    def data_ptr(self) -> int:
        return 0  # any multiple of 16: XLA's buffers are aligned at least that much

    def ptr_range(self) -> int:
        return self.nbytes

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)

    def element_size(self) -> int:
        return self.jax_dtype.itemsize

    def stride(self, dim: int | None = None) -> Any:
        strides = [math.prod(self.shape[i + 1 :]) for i in range(len(self.shape))]
        return tuple(strides) if dim is None else strides[dim]

    def __repr__(self) -> str:
        return f"ArgArray({self.jax_dtype.name}{list(self.shape)}, {self.slot[0]}{self.slot[1]})"
