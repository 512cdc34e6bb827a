"""``jax_triton.utils`` (jax-triton 0.3): the helpers kernels' call sites use."""

from __future__ import annotations

import triton

from bridge import strides_from_shape

cdiv = triton.cdiv
next_power_of_2 = triton.next_power_of_2

__all__ = ["cdiv", "next_power_of_2", "strides_from_shape"]
