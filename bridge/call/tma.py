"""Host-side tensor descriptors on Triton's side and in jaxlib's call (no jax imported here).

A descriptor argument is bound as Triton's own descriptor object (what Triton's launcher takes:
``triton.tools.tensor_descriptor.TensorDescriptor`` for ``@triton.jit``, the Gluon Hopper one for
``@gluon.jit``) with the abstract base array inside, so the specialization, the type string and
Triton's own checks are Triton's. Compiled for a TMA target (CUDA sm_90+), the kernel's metadata
holds one ``tensordesc_meta`` entry per descriptor argument (swizzle, element type, block size);
the lowering turns each into jaxlib's ``tensor_descriptor`` parameter (field 9: jaxlib >= 0.11.1
encodes the CUtensorMap at every launch), followed by the shape (i32) and strides (i64) as
Triton's CUDA launcher passes them. Its base array is one buffer of the custom call.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..exceptions import KernelArgumentError

#: TMA element types: Triton's device-side enum -> CUDA's ``CUtensorMapDataType`` (as Triton's
#: CUDA driver maps them; used where that driver cannot be imported)
TMA_DTYPE_DEVICE_TO_HOST = {i: i for i in range(16)} | {8: 10, 9: 8, 10: 9}
#: Triton's device-side enum value for TF32 (``CU_TENSOR_MAP_DATA_TYPE_TFLOAT32``)
TMA_TF32 = 11
PADDINGS = ("zero", "nan")


@functools.cache
def _with_tf32(cls: type) -> type:
    """``cls`` (one of Triton's descriptor dataclasses) with a ``round_f32_to_tf32`` field
    where this Triton release lacks it (3.6): the TMA path rounds through the element type,
    which the bridge sets at lowering."""
    if any(f.name == "round_f32_to_tf32" for f in dataclasses.fields(cls)):
        return cls
    return dataclasses.make_dataclass(
        cls.__name__,
        [("round_f32_to_tf32", bool, dataclasses.field(default=False))],
        bases=(cls,),
    )


def triton_descriptor(
    desc: Any, base: Any, gluon: bool, kernel: str, where: str = "argument"
) -> Any:
    """Triton's own descriptor object for ``desc`` with ``base`` (an abstract array) inside:
    what Triton's binder specializes and its launcher would take.

    Raises:
        KernelArgumentError: the descriptor does not fit the kernel's language or Triton's
            rules (rank, alignment, contiguity, padding, layout).
    """
    layout = getattr(desc, "layout", None)
    padding = str(desc.padding)
    tf32 = bool(getattr(desc, "round_f32_to_tf32", False))
    dtype = np.dtype(base.jax_dtype)
    if padding not in PADDINGS:
        raise KernelArgumentError(f"{where}: padding must be 'zero' or 'nan', got {padding!r}")
    if padding == "nan" and (dtype.kind != "f" or dtype.itemsize < 2):
        raise KernelArgumentError(
            f"{where}: padding='nan' needs a floating-point array of 16 bits or more, not "
            f"{dtype.name}"
        )
    if tf32 and dtype != np.float32:
        raise KernelArgumentError(
            f"{where}: round_f32_to_tf32=True needs a float32 array, not {dtype.name}"
        )
    if gluon:
        if layout is None:
            raise KernelArgumentError(
                f"{where}: {kernel} is a Gluon kernel; its tensor descriptors need "
                "layout=gl.NVMMASharedLayout(...)"
            )
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

        cls: type = _with_tf32(GluonDescriptor)
        fields: dict[str, Any] = {"layout": layout}
    else:
        if layout is not None:
            raise KernelArgumentError(
                f"{where}: layout= is for Gluon kernels; {kernel} is a @triton.jit kernel, "
                "which chooses its own shared-memory layout"
            )
        from triton.tools.tensor_descriptor import TensorDescriptor as TritonDescriptor

        cls = _with_tf32(TritonDescriptor)
        fields = {}
    try:
        made = cls(
            base=base,
            shape=[int(d) for d in desc.shape],
            strides=[int(d) for d in desc.strides],
            block_shape=[int(d) for d in desc.block_shape],
            padding="zero",  # Triton's own check of "nan" asks a torch dtype; done above
            **fields,
        )
    except AssertionError as e:
        raise KernelArgumentError(f"{where}: invalid tensor descriptor for {kernel}: {e}") from None
    made.padding = padding
    made.round_f32_to_tf32 = tf32
    return made


def revive(fields: Mapping[str, Any], base: Any, kernel: str) -> Any:
    """The Triton descriptor object of a recorded ``@triton.jit`` descriptor argument
    (``fields`` as :func:`bridge.call.plain.plain` wrote them) around ``base``.

    Raises:
        KernelArgumentError: a Gluon descriptor (its layout is recorded only by repr) or
            fields that do not form a valid descriptor.
    """
    if "layout" in fields:
        raise KernelArgumentError(
            f"a recorded Gluon tensor descriptor of {kernel} cannot be rebuilt (its layout is "
            "recorded by repr)"
        )
    try:
        desc = SimpleNamespace(
            shape=[int(d) for d in fields["shape"]],
            strides=[int(d) for d in fields["strides"]],
            block_shape=[int(d) for d in fields["block_shape"]],
            padding=str(fields.get("padding", "zero")),
            round_f32_to_tf32=bool(fields.get("round_f32_to_tf32", False)),
        )
    except (KeyError, TypeError, ValueError):
        raise KernelArgumentError(
            f"a recorded tensor descriptor of {kernel} is malformed"
        ) from None
    return triton_descriptor(desc, base, False, kernel, "recorded descriptor")


#: what a valid ``tensordesc_meta`` entry holds: key -> check of its value
def _int_in(lo: int, hi: int) -> Any:
    return lambda v: type(v) is int and lo <= v <= hi


_META_FIELDS: Mapping[str, Any] = {
    "swizzle": _int_in(0, 3),
    "elem_size": lambda v: v in (1, 2, 4, 8) and type(v) is int,
    "elem_type": _int_in(0, 15),
    "block_size": lambda v: (
        isinstance(v, list)
        and 1 <= len(v) <= 5
        and all(type(b) is int and 1 <= b <= 256 for b in v)
    ),
    "fp4_padded": lambda v: type(v) is bool,
}


def descriptor_meta(value: Any) -> list[dict[str, Any]] | None:
    """``value`` (the ``tensordesc_meta`` of a cache entry, untrusted) as validated TMA
    metadata, one dict per host-side descriptor argument; None where anything is off."""
    if not isinstance(value, list):
        return None
    out = []
    for entry in value:
        if not isinstance(entry, dict):
            return None
        if any(k not in entry or not check(entry[k]) for k, check in _META_FIELDS.items()):
            return None
        im2col = entry.get("is_im2col", False)
        if type(im2col) is not bool:
            return None
        out.append({**{k: entry[k] for k in _META_FIELDS}, "is_im2col": im2col})
    return out


def host_elem_type(device_type: int, round_f32_to_tf32: bool) -> int:
    """CUDA's ``CUtensorMapDataType`` for Triton's device-side TMA element type."""
    try:
        from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST as table
    except ImportError:
        table = TMA_DTYPE_DEVICE_TO_HOST
    return int(table[TMA_TF32 if round_f32_to_tf32 else device_type])
