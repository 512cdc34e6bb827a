"""``jax_triton.triton_lib``: the call and the names of jax-triton's module that code outside it
reaches (the primitive, the helpers), read as the offered release reads them (see
:func:`bridge.masquerade.api_version`); jax-triton's compile internals have no counterpart."""

from __future__ import annotations

import warnings
from typing import Any

import bridge
from bridge import CUSTOM_CALL_TARGET_NAME, TensorDescriptor, strides_from_shape
from bridge.call.tracing import triton_call_p as triton_kernel_call_p
from bridge.masquerade import api_version

API = api_version()


def get_compute_capability(device: int = 0) -> int:
    """The compute capability of local GPU ``device`` (90 for an H100 or H200)."""
    import jax

    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        raise RuntimeError("get_compute_capability: no GPU is visible to JAX")
    found = getattr(gpus[device], "compute_capability", None)
    if found is None:
        raise RuntimeError(f"get_compute_capability: {gpus[device]} has no compute capability")
    return int(str(found).replace(".", ""))


def triton_call(*args: Any, **kwargs: Any) -> Any:
    """``jax_triton.triton_call``: ``bridge.triton_call`` read as the offered release reads it
    (0.4: ``out_shape=`` is the deprecated spelling of ``out_type=``)."""
    if API == "0.3":  # (out_shape= read as 0.3 or as the ROCm fork, whichever fits)
        return bridge.triton_call(*args, **kwargs)
    if "out_shape" in kwargs:
        if kwargs.get("out_type") is not None:
            raise TypeError("Cannot specify both out_type= and the deprecated out_shape=")
        warnings.warn(
            "out_shape= is deprecated in favor of out_type=", DeprecationWarning, stacklevel=2
        )
        kwargs["out_type"] = kwargs.pop("out_shape")
    return bridge.triton_call(*args, **kwargs)


__all__ = [
    "CUSTOM_CALL_TARGET_NAME",
    "TensorDescriptor",
    "get_compute_capability",
    "strides_from_shape",
    "triton_call",
    "triton_kernel_call_p",
]
