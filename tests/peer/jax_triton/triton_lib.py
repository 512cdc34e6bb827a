"""The parts of ``jax_triton.triton_lib`` that jax-triton's tests reach: the primitive (its
equations carry ``has_side_effect`` like jax-triton's). The rest of jax-triton's internals
(``TritonFunction``, ``compile_ttir_inplace``) have no counterpart: the tests that use them
cannot pass against the bridge (README.md lists them)."""

from __future__ import annotations

from bridge.call.tracing import triton_call_p as triton_kernel_call_p

from . import CUSTOM_CALL_TARGET_NAME, TensorDescriptor, strides_from_shape, triton_call

__all__ = [
    "CUSTOM_CALL_TARGET_NAME",
    "TensorDescriptor",
    "strides_from_shape",
    "triton_call",
    "triton_kernel_call_p",
]
