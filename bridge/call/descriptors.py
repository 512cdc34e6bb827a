"""``bridge.TensorDescriptor``: a host-side tensor descriptor (TMA) argument of ``triton_call``.

jax-triton 0.4's: a JAX pytree whose only child is the base array (so it passes through
``jax.jit``), with the descriptor's shape, element strides, block shape, Gluon layout,
out-of-bounds padding and TF32 rounding as static fields. A kernel parameter that receives one is
a ``tensordesc`` in Triton. How it is bound and passed to jaxlib: :mod:`bridge.call.tma`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax

from ..exceptions import KernelArgumentError

PADDINGS = ("zero", "nan")


def strides_from_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major (C-contiguous) element strides of ``shape``."""
    shape = tuple(int(d) for d in shape)
    return tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))


@dataclasses.dataclass(frozen=True)
class TensorDescriptor:
    """A host-side TMA descriptor of ``base``, passed where the kernel takes a ``tensordesc``.

    Drop-in for ``jax_triton.TensorDescriptor`` (0.4): ``base`` is the only pytree child;
    ``shape``, ``strides`` (in elements), ``block_shape``, ``layout`` (a Gluon
    ``NVMMASharedLayout``, for ``@gluon.jit`` kernels only), ``padding`` ("zero" or "nan") and
    ``round_f32_to_tf32`` are static. Needs a CUDA target with TMA (sm_90 or newer) and
    jaxlib >= 0.11.1.
    """

    base: Any
    shape: tuple[int, ...] = dataclasses.field(metadata={"static": True})
    strides: tuple[int, ...] = dataclasses.field(metadata={"static": True})
    block_shape: tuple[int, ...] = dataclasses.field(metadata={"static": True})
    layout: Any = dataclasses.field(default=None, metadata={"static": True})
    padding: str = dataclasses.field(default="zero", metadata={"static": True})
    round_f32_to_tf32: bool = dataclasses.field(default=False, metadata={"static": True})

    def __post_init__(self) -> None:
        for name in ("shape", "strides", "block_shape"):
            object.__setattr__(self, name, tuple(int(d) for d in getattr(self, name)))
        if self.padding not in PADDINGS:
            raise KernelArgumentError(f"padding must be 'zero' or 'nan', got {self.padding!r}")
        if not len(self.shape) == len(self.strides) == len(self.block_shape):
            raise KernelArgumentError(
                "shape, strides, and block_shape must have the same length, got "
                f"{len(self.shape)}, {len(self.strides)}, {len(self.block_shape)}"
            )

    @classmethod
    def from_array(
        cls,
        array: Any,
        block_shape: Sequence[int],
        layout: Any = None,
        padding: str = "zero",
        round_f32_to_tf32: bool = False,
    ) -> TensorDescriptor:
        """A descriptor of the whole (row-major) ``array``, in blocks of ``block_shape``."""
        return cls(
            array,
            tuple(array.shape),
            strides_from_shape(array.shape),
            tuple(block_shape),
            layout,
            padding,
            round_f32_to_tf32,
        )


jax.tree_util.register_dataclass(TensorDescriptor)
