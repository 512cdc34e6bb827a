"""The registered GPU vendors: by name, platform and machine code, and target names parsed
against every one of them.

A :class:`~bridge.vendors.targets.Target` refers to its vendor by name. CUDA and HIP are registered
here; a new vendor is one module beside :mod:`.cuda` and :mod:`.hip` and one :func:`register`
call below. A registered vendor is pickled by its name, so the same object comes back.
"""

from __future__ import annotations

import copyreg
from typing import Any

from ..errors import TargetError
from .cuda import CUDA
from .hip import HIP
from .vendor import Arch, Vendor

_registry: dict[str, Vendor] = {}


def register(vendor: Vendor) -> Vendor:
    """Make ``vendor`` known by its name (and its platform to the lowering), and pickled by its
    name; returns it.

    Raises:
        ValueError: another descriptor has its name or platform.
    """
    for other in _registry.values():
        if other is not vendor and other.platform == vendor.platform:
            raise ValueError(f"platform {vendor.platform!r} belongs to {other.name}")
    if _registry.get(vendor.name, vendor) is not vendor:
        raise ValueError(f"a vendor named {vendor.name!r} is registered already")
    _registry[vendor.name] = vendor
    copyreg.pickle(type(vendor), _reduce)
    return vendor


def _reduce(vendor: Vendor) -> tuple[Any, tuple[str]]:
    return by_name, (vendor.name,)


def unregister(vendor: Vendor) -> None:
    """Forget ``vendor`` (tests register descriptors of their own)."""
    if _registry.get(vendor.name) is vendor:
        del _registry[vendor.name]


def registered() -> tuple[Vendor, ...]:
    """Every registered descriptor, in registration order."""
    return tuple(_registry.values())


def by_name(name: str) -> Vendor:
    """The descriptor of Triton's backend ``name``.

    Raises:
        TargetError: no such backend is registered.
    """
    try:
        return _registry[name]
    except KeyError:
        known = ", ".join(_registry)
        raise TargetError(f"unknown GPU backend {name!r}: the bridge knows {known}") from None


def by_binary_ext(ext: str) -> Vendor | None:
    """The descriptor whose machine code has the extension ``ext``, None if there is none."""
    return next((v for v in _registry.values() if v.binary_ext == ext), None)


def by_platform(platform: str) -> Vendor | None:
    """The descriptor of JAX's ``platform``, None for a platform of no registered vendor."""
    return next((v for v in _registry.values() if v.platform == platform), None)


def examples() -> str:
    """Valid target names of every vendor, for messages."""
    return ", ".join(e for v in _registry.values() for e in v.examples)


def parse_name(text: str) -> tuple[Vendor, Arch]:
    """The vendor and architecture a target name names (any case, surrounding blanks ignored).

    Raises:
        TargetError: not a target name (the message shows valid examples), or one for an
            architecture Triton cannot compile for.
    """
    value = text.strip().lower()
    for vendor in _registry.values():
        arch = vendor.parse_arch(value)
        if arch is not None:
            return vendor, arch
    forms = " or ".join(v.name_form for v in _registry.values())
    raise TargetError(f"invalid target {text!r}: use {forms}, e.g. {examples()}")


register(CUDA)
register(HIP)
