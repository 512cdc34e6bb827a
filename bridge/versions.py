"""Versions of the installed software, and the features each jaxlib release has.

Comparisons use parsed release tuples (``packaging.version.Version(v).release``), so local
suffixes such as ``+rocm7`` or ``.dev2026...+git`` cannot satisfy a check by accident: a
pre-release of 0.11.1 counts as 0.11.1 only through its release tuple, never through string
order. A plain release ("0.11.2": dotted decimal numbers only) is its own tuple; only the
others are parsed by ``packaging`` (which a process then imports).
"""

from __future__ import annotations

import functools

#: jaxlib's Triton custom-call targets: the typed-FFI one (api_version 4, an ``opaque``
#: attribute) and the legacy one (api_version 2, the opaque as raw backend_config)
FFI_TARGET = "triton_kernel_call_ffi"
LEGACY_TARGET = "triton_kernel_call"
#: first jaxlib with the typed-FFI custom call ``triton_kernel_call_ffi`` (api_version 4)
FFI_CALL = (0, 10, 1)
#: first jaxlib whose TritonKernel has module_image (field 11) and global scratch (12, 13), and
#: whose parameters include host-side TMA descriptors (field 9)
MODULE_IMAGE = (0, 11, 1)


@functools.lru_cache(maxsize=64)
def release(version: str) -> tuple[int, ...]:
    """The release tuple of ``version`` ("0.11.2+rocm7" -> (0, 11, 2)).

    Raises:
        ValueError: ``version`` is not a PEP 440 version.
    """
    parts = version.split(".")
    if all(p.isdecimal() and p.isascii() for p in parts):  # ("" is not decimal)
        return tuple(int(p) for p in parts)
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version).release
    except InvalidVersion:
        raise ValueError(f"not a version number: {version!r}") from None


@functools.lru_cache(maxsize=256)
def at_least(version: str | tuple[int, ...], minimum: tuple[int, ...]) -> bool:
    """Whether ``version`` (a string or a release tuple) is ``minimum`` or newer."""
    rel = release(version) if isinstance(version, str) else tuple(version)
    width = max(len(rel), len(minimum))
    return rel + (0,) * (width - len(rel)) >= minimum + (0,) * (width - len(minimum))


@functools.lru_cache(maxsize=1)
def jaxlib_version() -> str:
    """The running jaxlib's version string."""
    import jaxlib

    return jaxlib.__version__


@functools.lru_cache(maxsize=1)
def triton_version() -> str:
    import triton

    return triton.__version__


def has_ffi_call(jaxlib: str | tuple[int, ...]) -> bool:
    """jaxlib has ``triton_kernel_call_ffi`` (lowered with api_version 4 and an ``opaque``)."""
    return at_least(jaxlib, FFI_CALL)


def honours_module_image(jaxlib: str | tuple[int, ...]) -> bool:
    """jaxlib loads ``TritonKernel.module_image.object_file`` instead of compiling ``ptx``."""
    return at_least(jaxlib, MODULE_IMAGE)


def has_global_scratch(jaxlib: str | tuple[int, ...]) -> bool:
    """jaxlib allocates the global scratch memory a kernel declares (fields 12 and 13)."""
    return at_least(jaxlib, MODULE_IMAGE)


def has_tma_descriptors(jaxlib: str | tuple[int, ...]) -> bool:
    """jaxlib takes host-side TMA descriptors (``tensor_descriptor`` parameters, field 9)."""
    return at_least(jaxlib, MODULE_IMAGE)
