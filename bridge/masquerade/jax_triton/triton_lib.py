"""``jax_triton.triton_lib``: the names of jax-triton's module that code outside it reaches (the
primitive, the call, the helpers); jax-triton's compile internals have no counterpart."""

from __future__ import annotations

from bridge.call.primitive import triton_call_p as triton_kernel_call_p

from . import (
    CUSTOM_CALL_TARGET_NAME,
    TensorDescriptor,
    get_compute_capability,
    strides_from_shape,
    triton_call,
)

__all__ = [
    "CUSTOM_CALL_TARGET_NAME",
    "TensorDescriptor",
    "get_compute_capability",
    "strides_from_shape",
    "triton_call",
    "triton_kernel_call_p",
]
