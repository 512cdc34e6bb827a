"""``jax_triton.utils`` (jax-triton 0.3): the helpers kernels' call sites use."""

from __future__ import annotations

from . import cdiv, next_power_of_2, strides_from_shape

__all__ = ["cdiv", "next_power_of_2", "strides_from_shape"]
