"""``jax_triton``, as the bridge: the API of jax-triton 0.3 or 0.4 (see
:func:`bridge.masquerade.api_version`) over ``bridge.triton_call``, so that code written for
jax-triton compiles through the kernel cache unchanged.

jax-triton 0.3: ``triton_call(*args, kernel, out_shape, grid, ...)`` (the output pointers after
the inputs), ``cdiv``, ``next_power_of_2``, ``strides_from_shape``, ``get_compute_capability``,
``utils``. jax-triton 0.4: ``triton_call(..., out_type=...)`` (``out_shape=`` its deprecated
spelling), ``strides_from_shape``, ``TensorDescriptor``, ``CUSTOM_CALL_TARGET_NAME``; the 0.3
helpers too, which 0.4 dropped and code still calls. ``triton_lib.triton_kernel_call_p`` is the
bridge's primitive.
"""

from __future__ import annotations

import warnings
from typing import Any

import triton

import bridge
from bridge import CUSTOM_CALL_TARGET_NAME, TensorDescriptor, strides_from_shape
from bridge.masquerade import api_version

#: tells this package from the real jax-triton (``bridge.masquerade.active``)
__bridge__ = True
API = api_version()
__version__ = "0.3.1" if API == "0.3" else "0.4.1"
__version_info__ = tuple(int(p) for p in __version__.split("."))

cdiv = triton.cdiv
next_power_of_2 = triton.next_power_of_2


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


from . import triton_lib, utils  # noqa: E402  (they take names from this module)

__all__ = [
    "CUSTOM_CALL_TARGET_NAME",
    "TensorDescriptor",
    "cdiv",
    "get_compute_capability",
    "next_power_of_2",
    "strides_from_shape",
    "triton_call",
    "triton_lib",
    "utils",
]
