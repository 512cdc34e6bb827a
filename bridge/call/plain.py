"""A call's values as plain JSON data, as records and manifests hold them.

Arrays become ``{"array": dtype, "shape": [...]}``, tensor descriptors ``{"tensordesc": {...}}``,
dtypes and JIT functions are named, ``tl.constexpr`` objects ``{"constexpr": value}``, tuples
become lists, anything else is kept by ``repr``
(:mod:`bridge.warm.manifest` revives them). A kernel's source is recorded by its digest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any


def plain(value: Any) -> Any:
    """``value`` as JSON data: arrays as ``{"array": dtype, "shape": [...]}``, tensor
    descriptors as ``{"tensordesc": {...}}``, dtypes and JIT functions by name, tuples as lists,
    anything else by ``repr``."""
    from ..call.placeholders import ArgArray

    if isinstance(value, ArgArray):
        return {"array": value.jax_dtype.name, "shape": list(value.shape)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    base = getattr(value, "base", None)
    if isinstance(base, ArgArray) and hasattr(value, "block_shape"):  # a tensor descriptor
        desc = {
            "base": plain(base),
            "shape": [int(d) for d in value.shape],
            "strides": [int(d) for d in value.strides],
            "block_shape": [int(d) for d in value.block_shape],
            "padding": str(value.padding),
            "round_f32_to_tf32": bool(getattr(value, "round_f32_to_tf32", False)),
        }
        if hasattr(value, "layout"):  # Gluon's, recorded by repr
            desc["layout"] = plain(value.layout)
        return {"tensordesc": desc}
    fn = getattr(value, "fn", None)
    if fn is not None and hasattr(value, "cache_key"):
        return {"jit": f"{fn.__module__}:{fn.__qualname__}"}
    inner = getattr(value, "value", None)
    if type(value).__name__ == "constexpr":  # (a scalar bound at compile time stays one)
        return {"constexpr": plain(inner)}
    if type(value).__name__ == "dtype" and hasattr(value, "name"):
        return {"dtype": str(value.name)}
    return {"repr": repr(value)}


def source_digest(fn: Any) -> str:
    """sha256 of a kernel function's source text as Triton parses it (decorators excluded)."""
    return hashlib.sha256(str(fn.src).encode()).hexdigest()
