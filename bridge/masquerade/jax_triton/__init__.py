"""``jax_triton``, as the bridge: the API of jax-triton 0.3 or 0.4 (see
:func:`bridge.masquerade.api_version`) over ``bridge.triton_call``, so that code written for
jax-triton compiles through the kernel cache unchanged.

jax-triton 0.3: ``triton_call(*args, kernel, out_shape, grid, ...)`` (the output pointers after
the inputs), ``cdiv``, ``next_power_of_2``, ``strides_from_shape``, ``get_compute_capability``,
``utils``. jax-triton 0.4: ``triton_call(..., out_type=...)`` (``out_shape=`` its deprecated
spelling), ``strides_from_shape``, ``TensorDescriptor``, ``CUSTOM_CALL_TARGET_NAME``; the 0.3
helpers too, which 0.4 dropped and code still calls. ``triton_lib.triton_kernel_call_p`` is the
bridge's primitive. As in jax-triton, the package only gathers its two modules' names.
"""

from __future__ import annotations

from . import triton_lib, utils
from .triton_lib import (
    API,
    CUSTOM_CALL_TARGET_NAME,
    TensorDescriptor,
    get_compute_capability,
    triton_call,
)
from .utils import cdiv, next_power_of_2, strides_from_shape

#: tells this package from the real jax-triton (``bridge.masquerade.active``)
__bridge__ = True
__version__ = "0.3.1" if API == "0.3" else "0.4.1"
__version_info__ = tuple(int(p) for p in __version__.split("."))

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
