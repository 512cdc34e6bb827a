"""A ``jax_triton`` (0.4) that is the bridge: run jax-triton's own test suite against
``bridge.triton_call`` (see tests/peer/README.md). Not a package to install.

jax-triton 0.4 gives ``out_shape=`` its ``out_type=`` meaning (with a DeprecationWarning); so
does this shim, whereas ``bridge.triton_call`` keeps jax-triton 0.3's meaning for it.
"""

from __future__ import annotations

import warnings
from typing import Any

import bridge
from bridge import CUSTOM_CALL_TARGET_NAME, TensorDescriptor, strides_from_shape

__version__ = "0.4.1"
__version_info__ = (0, 4, 1)


def triton_call(*args: Any, out_type: Any = None, **kwargs: Any) -> Any:
    """``jax_triton.triton_call`` (0.4): ``bridge.triton_call`` with ``out_shape=`` read as
    ``out_type=``."""
    if "out_shape" in kwargs:
        if out_type is not None:
            raise TypeError("Cannot specify both out_type= and the deprecated out_shape=")
        warnings.warn(
            "out_shape= is deprecated in favor of out_type=", DeprecationWarning, stacklevel=2
        )
        out_type = kwargs.pop("out_shape")
    if out_type is None:
        raise TypeError("Either out_type= or the deprecated out_shape= must be provided")
    return bridge.triton_call(*args, out_type=out_type, **kwargs)


__all__ = [
    "CUSTOM_CALL_TARGET_NAME",
    "TensorDescriptor",
    "strides_from_shape",
    "triton_call",
]
