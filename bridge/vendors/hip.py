"""AMD's GPUs: the :class:`Hip` vendor, ``HIP``.

HSACO code objects compiled for a gfx architecture; where jaxlib ignores ``module_image`` the
code object is handed over by path (:mod:`bridge.embed.handoff`). Triton's backend would import torch
to specialize pointers; the bridge answers from the placeholder array instead.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from typing import Any

from kernelcache.plugin import EM_AMDGPU

from .vendor import Arch, Driver, KiB, Vendor, frozen, register

logger = logging.getLogger(__name__)


#: a module LLVM translates for the processor "help", which makes it list its processors
_PROBE_MODULE = "define void @f() {\n  ret void\n}\n"


@functools.cache
def llvm_processors() -> tuple[str, ...] | None:
    """The gfx processors of the AMDGPU target of the LLVM inside Triton (LLVM lists them on
    standard error when asked for the processor "help"), in order; None where it cannot be
    asked."""
    import os
    import tempfile

    try:
        from triton._C.libtriton import llvm
    except ImportError:
        return None
    with tempfile.TemporaryFile() as said:
        saved = os.dup(2)
        os.dup2(said.fileno(), 2)
        try:
            llvm.init_targets()
            # (3.9 added canonicalize_gep after is_object; an older release takes 7 arguments)
            for extra in ((), (False,)):
                try:
                    llvm.translate_to_asm(
                        _PROBE_MODULE, "amdgcn-amd-amdhsa", "help", "", [], False, False, *extra
                    )
                except TypeError:  # another release's signature: try the next
                    continue
                except (RuntimeError, ValueError):
                    pass
                break
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        said.seek(0)
        text = said.read().decode(errors="replace")
    processors = text.partition("Available CPUs")[2].partition("Available features")[0]
    found = re.findall(r"^\s+(gfx[0-9a-f]+)\s+-", processors, re.M)
    return tuple(sorted(set(found), key=lambda name: (len(name), name))) or None


class Hip(Vendor):
    """AMD's GPUs, through Triton's ``amd`` backend: HSACO code objects. (Not a dataclass of
    its own: it adds no field, so it keeps :class:`Vendor`'s methods.)"""

    __setattr__ = __delattr__ = frozen

    def warp_size(self, arch: Arch) -> int:
        """32 on gfx10 and newer (RDNA), else 64 (CDNA, GCN)."""
        digits = str(arch)[3:-2]
        major = int(digits) if digits.isdigit() else 0
        return 32 if major >= 10 else 64

    def known_archs(self) -> tuple[Arch, ...] | None:
        """What LLVM's AMDGPU target knows (:func:`llvm_processors`)."""
        return llvm_processors()

    def device_arch(self, device: Any) -> Arch | None:
        raw = str(getattr(device, "compute_capability", "") or "")
        arch = raw.split(":")[0].strip().lower()
        if not arch.startswith("gfx"):
            try:
                from jax._src.lib import gpu_triton

                arch = gpu_triton.get_arch_details(device.local_hardware_id or 0).split(":")[0]
            except (ImportError, AttributeError, RuntimeError, ValueError) as e:
                logger.debug("cannot read the gfx architecture of %s: %s", device, e)
                return None
        return arch

    def tensor_specialization(self, backend_class: type) -> Callable[..., str] | None:
        """Triton's AMD backend imports torch to specialize pointers on their 32-bit range
        (buffer ops); without torch, the bridge answers from the placeholder array's size in
        bytes (placeholder arrays carry ``ptr_range()``)."""

        def get_tensor_specialization(arg: Any, **kwargs: Any) -> str:
            try:
                return backend_class.get_tensor_specialization(arg, **kwargs)  # type: ignore[attr-defined]
            except ImportError:
                from triton import knobs
                from triton.backends.compiler import BaseBackend

                spec = BaseBackend.get_tensor_specialization(arg, **kwargs)
                if knobs.amd.use_buffer_ops and arg.ptr_range() <= 2**31 - 1:
                    spec += "S"
                return spec

        return get_tensor_specialization


HIP: Vendor = Hip(
    name="hip",
    package="amd",
    platform="rocm",
    maker="AMD",
    title="ROCm",
    grammar=re.compile(r"(?:hip|rocm)[:_]?(gfx[0-9a-f]{3,5})(?::[a-z0-9+:-]*)?"),
    name_form="hip:<gfx arch>",
    examples=("hip:gfx942", "hip:gfx90a"),
    install_hint="install a Triton build with the AMD backend (the ROCm build of Triton)",
    options_class="HIPOptions",
    probe_arch="gfx942",
    binary_ext="hsaco",
    has_ptx=False,
    fallback_embed="path",
    inline_on_old_jaxlib="it would look for a file named by the kernel's token and fail to load it",
    warp_size_default=64,
    jaxlib_threads_per_warp=64,
    max_threads_per_block=1024,
    elf_machine=EM_AMDGPU,
    # HIP's runtime API under the same calls (no AMD GPU has measured through it here)
    driver=Driver(
        library="libamdhip64.so",
        jaxlib_triton="_hip_triton",
        init="hipInit",
        device_get=None,
        primary_context=None,
        set_context=None,
        set_device="hipSetDevice",
        stream_create="hipStreamCreateWithFlags",
        event_create="hipEventCreateWithFlags",
        event_record="hipEventRecord",
        event_synchronize="hipEventSynchronize",
        event_elapsed=("hipEventElapsedTime",),
        stream_synchronize="hipStreamSynchronize",
        bus_id="hipDeviceGetPCIBusId",
    ),
    # LDS one workgroup may use, as Triton's AMD backend sizes it: third_party/amd/lib/
    # TritonAMDGPUToLLVM/TargetInfo.cpp, TargetInfo::getSharedMemorySize (160 KiB on CDNA4,
    # i.e. gfx950; 64 KiB on CDNA2 and CDNA3). LLVM's AMDGPU backend enforces the same limits
    # (its tests: "local memory (163844) exceeds limit (163840)" on gfx950, 64 KiB on gfx942).
    shared_memory={
        "gfx90a": 64 * KiB,
        "gfx942": 64 * KiB,
        "gfx950": 160 * KiB,
    },
)
register(HIP)
