"""bridge: Triton and Gluon kernels in JAX, compiled once and kept in the kernel cache.

    import bridge
    out = bridge.triton_call(x, y, kernel=add_kernel, out_shape=x, grid=(n // 1024,), BLOCK=1024)

See ``triton_call`` and ``kernel``; ``enable_jax_cache`` turns on JAX's persistent compilation
cache beside the kernel cache.
"""

from __future__ import annotations

import kernelcache as _kernelcache  # noqa: F401  (imported with the bridge, not at first lowering)

from .call import triton_call
from .errors import (
    BackendUnavailable,
    BridgeError,
    EmbedError,
    KernelArgumentError,
    OptionError,
    TargetError,
    UnsupportedTransformation,
)
from .jax_cache import enable_jax_cache
from .kernel import Kernel, kernel
from .record import add_listener as on_lowered
from .targets import Target, parse_target

__all__ = [
    "BackendUnavailable",
    "BridgeError",
    "EmbedError",
    "Kernel",
    "KernelArgumentError",
    "OptionError",
    "Target",
    "TargetError",
    "UnsupportedTransformation",
    "enable_jax_cache",
    "kernel",
    "on_lowered",
    "parse_target",
    "triton_call",
]
