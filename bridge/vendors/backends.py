"""Triton and its vendor backends, imported only when a kernel needs them.

Triton ships one backend per vendor; a build may have only some of them. The bridge asks for
the backend of the target at hand and, when it is missing, says which one and how to get it
(from the target's descriptor) rather than "Triton is required".
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from ..exceptions import BackendUnavailable, OptionError
from .targets import Target, target_of
from .vendor import Vendor, registered

logger = logging.getLogger(__name__)


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
def compiler_module(vendor: Vendor) -> ModuleType:
    """``triton.backends.<package>.compiler`` of ``vendor``.

    Raises:
        BackendUnavailable: this Triton has no backend for ``vendor``.
    """
    mod = triton()
    from triton.backends import backends

    package = vendor.package
    if package not in backends:
        where = os.path.dirname(mod.__file__ or "")
        present = ", ".join(sorted(backends)) or "none"
        raise BackendUnavailable(
            f"Triton {mod.__version__} at {where} has no '{package}' backend "
            f"(triton/backends/{package} is missing; it has: {present}): {vendor.install_hint}"
        )
    import importlib

    return importlib.import_module(f"triton.backends.{package}.compiler")


def backend_class(target: Target) -> type:
    """Triton's compiler backend class for ``target`` (CUDABackend, HIPBackend, ...).

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
    raise BackendUnavailable(f"Triton's {target.vendor.package} backend does not support {target}")


def options_class(target: Target) -> type:
    """The options dataclass of ``target``'s backend (CUDAOptions, HIPOptions, ...)."""
    module = compiler_module(target.vendor)
    name = target.vendor.options_class
    cls = getattr(module, name, None)
    if not isinstance(cls, type) or not dataclasses.is_dataclass(cls):
        raise BackendUnavailable(f"Triton's {target.vendor.package} backend has no {name}")
    return cls


def llvm_ptx_isa(target: Target, written: int) -> int | None:
    """The PTX ISA Triton lets LLVM generate code for when it writes PTX ISA ``written`` (as
    10*major + minor) for ``target``: Triton's own ``get_features`` (``min(written, 90)`` in
    Triton 3.9). None where this Triton's backend does not say."""
    try:
        module = compiler_module(target.vendor)
        options = dataclasses.replace(options_class(target)(), ptx_version=written)
        features = str(module.get_features(options, int(target.arch)))
    except (AttributeError, TypeError, ValueError, BackendUnavailable) as e:
        logger.debug(
            "Triton's %s backend does not say which PTX ISA LLVM targets: %s",
            target.vendor.package,
            e,
        )
        return None
    m = re.search(r"\+ptx(\d+)", features)
    return int(m.group(1)) if m else None


@functools.cache
def option_names(vendor: Vendor) -> frozenset[str]:
    """Field names of the options class of ``vendor``'s backend (empty if it is missing)."""
    probe = target_of(vendor, vendor.probe_arch)
    try:
        return frozenset(f.name for f in dataclasses.fields(options_class(probe)))
    except BackendUnavailable:
        return frozenset()


def all_option_names() -> frozenset[str]:
    """Field names of the options classes of every registered vendor's backend."""
    return _option_names_of(registered())


@functools.cache
def _option_names_of(registered: tuple[Vendor, ...]) -> frozenset[str]:
    return frozenset().union(*(option_names(v) for v in registered))


#: option fields that are derived from the target and may not be set by a caller
DERIVED_OPTIONS = frozenset({"arch", "backend_name", "warp_size"})


def check_options(target: Target, names: set[str] | frozenset[str]) -> None:
    """Check that every name in ``names`` is an option of ``target``'s backend.

    Raises:
        OptionError: an unknown or derived option; the message lists the valid ones.
    """
    valid = option_names(target.vendor) - DERIVED_OPTIONS
    unknown = sorted(set(names) - valid)
    if unknown:
        raise OptionError(
            f"unknown compile option(s) {', '.join(unknown)} for {target}: valid options are "
            f"{', '.join(sorted(valid))}"
        )


#: options that Triton's launcher (not its compiler) applies, as launch attributes, and what
#: each asks for: jaxlib's Triton kernel call has no field for either (every jaxlib through
#: 0.11 launches plainly, or with a cluster for num_ctas > 1)
LAUNCH_ATTRIBUTES = {
    "launch_pdl": (
        "programmatic dependent launch (the kernel's gdc_wait() and gdc_launch_dependents() "
        "overlapping it with its neighbours)"
    ),
    "launch_cooperative_grid": (
        "a cooperative launch (every program resident at once: a kernel that synchronizes "
        "across its grid would deadlock without it)"
    ),
}


def check_launch_options(options: Mapping[str, Any], where: str) -> None:
    """Refuse a launch attribute (:data:`LAUNCH_ATTRIBUTES`) that ``options`` turns on.

    Raises:
        OptionError: naming the option, what it asks for, and that jaxlib cannot launch it.
    """
    for name, what in LAUNCH_ATTRIBUTES.items():
        if options.get(name):
            raise OptionError(
                f"{where}: {name}={options[name]!r} asks Triton's launcher for {what}, but "
                "jaxlib's Triton kernel call has no field for it and would launch the kernel "
                f"without it: drop {name}, or launch the kernel outside JAX"
            )


#: FP fusion (contracting a*b+c into one fused multiply-add) when neither the call
#: (``enable_fp_fusion=``) nor Triton's TRITON_DEFAULT_FP_FUSION says: Triton's documented default
#: from 3.6 through 3.9. The bridge always passes the option explicitly, so a kernel's code and its
#: key stay the same when a Triton release changes its own default (3.9 announces that 3.10 will).
DEFAULT_FP_FUSION = True


def default_fp_fusion() -> bool:
    """``enable_fp_fusion`` for a call that does not set it: Triton's TRITON_DEFAULT_FP_FUSION
    where that is set (in the environment or through ``triton.knobs``), else
    :data:`DEFAULT_FP_FUSION`."""
    from triton import knobs

    knob = vars(type(knobs.language)).get("default_fp_fusion")
    name = getattr(knob, "key", "TRITON_DEFAULT_FP_FUSION")
    if knobs.getenv(name) is None:
        return DEFAULT_FP_FUSION
    return bool(knobs.language.default_fp_fusion)


@functools.cache
def make_backend(target: Target) -> Any:
    """An instance of the backend compiler for ``target``, shared per process.

    Its options always hold an explicit ``enable_fp_fusion`` (see :func:`default_fp_fusion`).
    Where the vendor answers the backend's pointer specialization in its place (AMD's backend
    would import torch), the instance binds arguments with the vendor's answer.
    """
    cls = _bridge_backend(backend_class(target), target.vendor)
    return cls(target.triton())


@functools.cache
def _bridge_backend(cls: Any, vendor: Vendor) -> type:
    """``cls`` with the bridge's option defaults, and the vendor's own pointer specialization
    where it has one (:meth:`~bridge.vendors.vendor.Vendor.tensor_specialization`)."""

    def parse_options(self: Any, options: dict[str, Any]) -> Any:
        if options.get("enable_fp_fusion") is None:
            options = {**options, "enable_fp_fusion": default_fp_fusion()}
        return cls.parse_options(self, options)

    body: dict[str, Any] = {"parse_options": parse_options}
    special = vendor.tensor_specialization(cls)
    if special is not None:
        body["get_tensor_specialization"] = staticmethod(special)
    return type(cls.__name__, (cls,), body)
