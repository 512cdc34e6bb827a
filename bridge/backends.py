"""Triton and its vendor backends, imported only when a kernel needs them.

Triton ships one backend per vendor ("nvidia", "amd"); a build may have only one of them. The
bridge asks for the backend of the target at hand and, when it is missing, says which one and
how to get it rather than "Triton is required".
"""

from __future__ import annotations

import dataclasses
import functools
import os
from types import ModuleType
from typing import Any

from .errors import BackendUnavailable, OptionError
from .targets import Target

_INSTALL = {
    "nvidia": "install the standard Triton wheel (pip install triton), which includes it",
    "amd": "install a Triton build with the AMD backend (the ROCm build of Triton)",
}


def triton() -> ModuleType:
    """The ``triton`` package.

    Raises:
        BackendUnavailable: Triton is not installed.
    """
    try:
        import triton as mod
    except ImportError as e:
        raise BackendUnavailable(
            f"Triton is not importable ({e}): install it (pip install 'kernelcache[bridge]')"
        ) from e
    return mod


@functools.cache
def compiler_module(vendor: str) -> ModuleType:
    """``triton.backends.<vendor>.compiler`` for "nvidia" or "amd".

    Raises:
        BackendUnavailable: this Triton has no backend for ``vendor``.
    """
    mod = triton()
    from triton.backends import backends

    if vendor not in backends:
        where = os.path.dirname(mod.__file__ or "")
        present = ", ".join(sorted(backends)) or "none"
        raise BackendUnavailable(
            f"Triton {mod.__version__} at {where} has no '{vendor}' backend "
            f"(triton/backends/{vendor} is missing; it has: {present}): {_INSTALL[vendor]}"
        )
    import importlib

    return importlib.import_module(f"triton.backends.{vendor}.compiler")


def backend_class(target: Target) -> type:
    """Triton's compiler backend class for ``target`` (CUDABackend or HIPBackend).

    Raises:
        BackendUnavailable: Triton, or its backend for the target's vendor, is missing.
    """
    triton()  # a missing Triton is named as such, with what to install
    from triton.backends.compiler import BaseBackend

    module = compiler_module(target.vendor)
    for value in vars(module).values():
        if (
            isinstance(value, type)
            and issubclass(value, BaseBackend)
            and value is not BaseBackend
            and value.supports_target(target.triton())  # type: ignore[attr-defined]
        ):
            return value
    raise BackendUnavailable(f"Triton's {target.vendor} backend does not support {target}")


def options_class(target: Target) -> type:
    """The options dataclass of ``target``'s backend (CUDAOptions or HIPOptions)."""
    module = compiler_module(target.vendor)
    name = "CUDAOptions" if target.backend == "cuda" else "HIPOptions"
    cls = getattr(module, name, None)
    if not isinstance(cls, type) or not dataclasses.is_dataclass(cls):
        raise BackendUnavailable(f"Triton's {target.vendor} backend has no {name}")
    return cls


@functools.cache
def option_names(target_backend: str) -> frozenset[str]:
    """Field names of the options class of "cuda" or "hip" (empty if the backend is missing)."""
    probe = Target("cuda", 90, 32) if target_backend == "cuda" else Target("hip", "gfx942", 64)
    try:
        return frozenset(f.name for f in dataclasses.fields(options_class(probe)))
    except BackendUnavailable:
        return frozenset()


#: option fields that are derived from the target and may not be set by a caller
DERIVED_OPTIONS = frozenset({"arch", "backend_name", "warp_size"})


def check_options(target: Target, names: set[str] | frozenset[str]) -> None:
    """Check that every name in ``names`` is an option of ``target``'s backend.

    Raises:
        OptionError: an unknown or derived option; the message lists the valid ones.
    """
    valid = option_names(target.backend) - DERIVED_OPTIONS
    unknown = sorted(set(names) - valid)
    if unknown:
        raise OptionError(
            f"unknown compile option(s) {', '.join(unknown)} for {target}: valid options are "
            f"{', '.join(sorted(valid))}"
        )


@functools.cache
def make_backend(target: Target) -> Any:
    """An instance of the backend compiler for ``target``, shared per process.

    On AMD the instance binds arguments without importing torch: Triton 3.6 imports torch to
    decide the 32-bit pointer-range specialization, which the bridge answers from the array's
    size in bytes instead (the placeholder arrays carry ``ptr_range()``).
    """
    cls = backend_class(target)
    if target.backend == "hip":
        cls = _hip_binding_backend(cls)
    return cls(target.triton())


@functools.cache
def _hip_binding_backend(cls: Any) -> type:
    from triton.backends.compiler import BaseBackend

    def get_tensor_specialization(arg, **kwargs):
        try:
            return cls.get_tensor_specialization(arg, **kwargs)
        except ImportError:
            from triton import knobs

            spec = BaseBackend.get_tensor_specialization(arg, **kwargs)
            if knobs.amd.use_buffer_ops and arg.ptr_range() <= 2**31 - 1:
                spec += "S"
            return spec

    return type(
        cls.__name__, (cls,), {"get_tensor_specialization": staticmethod(get_tensor_specialization)}
    )
