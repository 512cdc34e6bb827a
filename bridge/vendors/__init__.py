"""GPU vendors: everything that differs between NVIDIA and AMD, one object per vendor.

In: a vendor's name as a target spells it (``cuda``, ``hip``) or as JAX names a platform. Out: its
:class:`~.vendor.Vendor` object: target-name grammar, limits, the machine code it writes, what its
compiler identity hashes, how pointers are specialized and how machine code is embedded. A new
vendor is one module (like :mod:`.cuda` or :mod:`.hip`) and its line in :mod:`.vendor_registry`.

Beside the vendors: compile targets (``cuda:90``, ``hip:gfx942``) and how a lowering chooses one
(:mod:`.targets`), and Triton's vendor backends, imported only when a kernel needs one
(:mod:`.backends`).
"""

from __future__ import annotations

import warnings
from typing import Any

#: the names ``bridge.vendors`` held when it was one module: (module of this folder, its name)
_MOVED = {
    "Vendor": ("vendor", "Vendor"),
    "NVIDIA": ("cuda", "CUDA"),
    "AMD": ("hip", "HIP"),
    **{
        name: ("vendor_registry", name)
        for name in (
            "register",
            "unregister",
            "registered",
            "by_name",
            "by_platform",
            "by_binary_ext",
            "examples",
            "parse_name",
        )
    },
}


def __getattr__(name: str) -> Any:
    """The names of the former ``bridge.vendors`` module, with a DeprecationWarning."""
    import importlib

    try:
        module, attr = _MOVED[name]
    except KeyError:
        raise AttributeError(f"module 'bridge.vendors' has no attribute {name!r}") from None
    warnings.warn(
        f"bridge.vendors.{name} is bridge.vendors.{module}.{attr}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
