"""bridge: Triton and Gluon kernels in JAX, compiled once and kept in the kernel cache.

    import bridge
    out = bridge.triton_call(x, y, kernel=add_kernel, out_shape=x, grid=(n // 1024,), BLOCK=1024)

See ``triton_call`` and ``kernel``; ``enable_jax_cache`` turns on JAX's persistent compilation
cache beside the kernel cache. Call sites of jax-triton 0.3 (``out_shape=``) and 0.4
(``out_type=``, ``TensorDescriptor``, refs) both run; ``CUSTOM_CALL_TARGET_NAMES`` are the
custom-call targets a lowered call may use (for ``jax.export``'s ``disabled_checks``).

Importing ``bridge`` is cheap: jax, triton and the lowering machinery are imported when one of
the names below is first used (``bridge.triton_call``), not by ``import bridge``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import settings as settings  # declares the bridge's variables to kernelcache
from .entries import metadata  # noqa: F401  (declares the metadata fields to kernelcache)
from .exceptions import (
    AutotuneError,
    BackendUnavailable,
    BridgeError,
    EmbedError,
    IncompleteOutput,
    KernelArgumentError,
    NoConfigError,
    OptionError,
    TargetError,
    UnsupportedTransformation,
)
from .versions import FFI_TARGET, LEGACY_TARGET

#: jaxlib's typed-FFI Triton custom call (jax-triton 0.4's ``CUSTOM_CALL_TARGET_NAME``)
CUSTOM_CALL_TARGET_NAME = FFI_TARGET
#: every custom-call target the bridge emits: the FFI one, and jaxlib's legacy
#: ``triton_kernel_call`` (autotuned calls, jaxlib < 0.10.1, and exports embedding PTX)
CUSTOM_CALL_TARGET_NAMES = (FFI_TARGET, LEGACY_TARGET)

if TYPE_CHECKING:
    from .api import triton_call
    from .call.descriptors import TensorDescriptor, strides_from_shape
    from .decorator import Kernel, kernel
    from .jax_cache.enable import enable_jax_cache
    from .lowering.record import add_listener as on_lowered
    from .masquerade import install as install_jax_triton
    from .rule import triton_call_lowering
    from .vendors.targets import Target, parse_target

#: public name -> (module, attribute), imported on first use
_LAZY = {
    "triton_call": (".api", "triton_call"),
    "triton_call_lowering": (".rule", "triton_call_lowering"),
    "install_jax_triton": (".masquerade", "install"),
    "TensorDescriptor": (".call.descriptors", "TensorDescriptor"),
    "strides_from_shape": (".call.descriptors", "strides_from_shape"),
    "enable_jax_cache": (".jax_cache.enable", "enable_jax_cache"),
    "Kernel": (".decorator", "Kernel"),
    "kernel": (".decorator", "kernel"),
    "on_lowered": (".lowering.record", "add_listener"),
    "Target": (".vendors.targets", "Target"),
    "parse_target": (".vendors.targets", "parse_target"),
}


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'bridge' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module, __name__), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "CUSTOM_CALL_TARGET_NAME",
    "CUSTOM_CALL_TARGET_NAMES",
    "AutotuneError",
    "BackendUnavailable",
    "BridgeError",
    "EmbedError",
    "IncompleteOutput",
    "Kernel",
    "KernelArgumentError",
    "NoConfigError",
    "OptionError",
    "Target",
    "TargetError",
    "TensorDescriptor",
    "UnsupportedTransformation",
    "enable_jax_cache",
    "install_jax_triton",
    "kernel",
    "on_lowered",
    "parse_target",
    "strides_from_shape",
    "triton_call",
    "triton_call_lowering",
]
