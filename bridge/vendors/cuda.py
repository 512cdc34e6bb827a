"""NVIDIA's GPUs: the :class:`Cuda` vendor, ``CUDA``.

Cubins compiled for a compute capability, with the PTX they were compiled from; the backend's
``hash()`` runs ptxas, so its identity is memoized under the ptxas files Triton would pick.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from typing import Any, ClassVar

from kernelcache.plugin import EM_CUDA

from ..exceptions import TargetError
from .vendor import Arch, Driver, KiB, Vendor, file_row, frozen, register

_VERSION = 2


@functools.cache
def ptxas_fingerprint(target: str, arch: int) -> str:
    """A digest of what decides the identity of a backend whose ``hash()`` runs ptxas, for
    the target named ``target`` of compute capability ``arch``: the ptxas files Triton may
    pick."""
    from triton import knobs

    rows: list[Any] = []
    # (both: which one a release runs for an architecture is its own choice; 3.9 runs
    # ptxas_blackwell from sm_90 on)
    for name in ("ptxas", "ptxas_blackwell"):
        tool = vars(type(knobs.nvidia)).get(name)  # the descriptor: variable and default path
        if tool is None:
            continue
        configured = knobs.nvidia.__dict__.get(name) or knobs.getenv(tool.key)
        rows.append([configured])
        for path in (configured, tool.default_path):
            if path:
                rows.append(file_row(path, os.path.abspath(path)))
    doc = json.dumps([_VERSION, target, rows], separators=(",", ":"))
    return hashlib.sha256(doc.encode()).hexdigest()


@functools.cache
def ptxas_archs() -> tuple[int, ...] | None:
    """The compute capabilities the ptxas tools Triton may run know (the ``sm_XX`` values of
    their ``--gpu-name``), in order; None where none answers."""
    import subprocess

    from triton import knobs

    found: set[int] = set()
    for name in ("ptxas", "ptxas_blackwell"):
        try:
            tool = getattr(knobs.nvidia, name)
            text = subprocess.run(
                [tool.path, "--help"], capture_output=True, text=True, timeout=30
            ).stdout
        except (AttributeError, RuntimeError, OSError, subprocess.SubprocessError):
            continue
        names = text.partition("--gpu-name")[2].partition("\n--")[0]
        found.update(int(cc) for cc in re.findall(r"'sm_(\d+)[a-z]?'", names))
    return tuple(sorted(found)) or None


class Cuda(Vendor):
    """NVIDIA GPUs, through Triton's ``nvidia`` backend: cubins with their PTX. (Not a
    dataclass of its own: it adds no field, so it keeps :class:`Vendor`'s methods.)"""

    #: the oldest compute capability Triton compiles for
    min_compute_capability: ClassVar[int] = 50
    __setattr__ = __delattr__ = frozen

    def arch_of(self, raw: str, text: str) -> Arch:
        cc = int(raw)
        if cc < self.min_compute_capability:
            raise TargetError(
                f"target {text!r}: compute capability {cc} is older than Triton supports"
            )
        return cc

    def runs_on(self, ours: Arch, theirs: Arch) -> bool:
        """Cubins run on the same major architecture with an equal or newer minor version,
        except the architecture-specific sm_90a and newer, which need the exact device."""
        mine, other = int(ours), int(theirs)
        if mine >= 90:
            return mine == other
        return mine // 10 == other // 10 and other >= mine

    def proto_compute_capability(self, arch: Arch) -> int:
        return int(arch)

    def host_tma(self, arch: Arch) -> bool:
        return int(arch) >= 90

    def device_arch(self, device: Any) -> Arch | None:
        raw = str(getattr(device, "compute_capability", "") or "")
        if re.fullmatch(r"\d+\.\d+", raw):
            major, minor = raw.split(".")
            return int(major) * 10 + int(minor)
        return None

    def known_archs(self) -> tuple[Arch, ...] | None:
        """What ptxas knows (:func:`ptxas_archs`): Triton hands it ``sm_<capability>``."""
        return ptxas_archs()

    def backend_fingerprint(self, arch: Arch) -> str | None:
        """The backend's ``hash()`` runs ptxas: the ptxas files Triton would pick for ``arch``
        (:func:`ptxas_fingerprint`)."""
        return ptxas_fingerprint(f"{self.name}:{arch}", int(arch))


CUDA: Vendor = Cuda(
    name="cuda",
    package="nvidia",
    platform="cuda",
    maker="NVIDIA",
    title="CUDA",
    grammar=re.compile(r"(?:cuda|sm)[:_]?(\d{2,3})a?"),
    name_form="cuda:<compute capability>",
    examples=("cuda:90", "cuda:80"),
    install_hint="install the standard Triton wheel (pip install triton), which includes it",
    options_class="CUDAOptions",
    probe_arch=90,
    binary_ext="cubin",
    has_ptx=True,
    fallback_embed="ptx",
    inline_on_old_jaxlib="the PTX in each call is compiled by ptxas at XLA compile time instead",
    warp_size_default=32,
    jaxlib_threads_per_warp=32,
    max_threads_per_block=1024,
    elf_machine=EM_CUDA,
    driver=Driver(
        library="libcuda.so.1",
        jaxlib_triton="_cuda_triton",
        init="cuInit",
        device_get="cuDeviceGet",
        primary_context="cuDevicePrimaryCtxRetain",
        set_context="cuCtxSetCurrent",
        set_device=None,
        stream_create="cuStreamCreate",
        event_create="cuEventCreate",
        event_record="cuEventRecord",
        event_synchronize="cuEventSynchronize",
        event_elapsed=("cuEventElapsedTime_v2", "cuEventElapsedTime"),
        stream_synchronize="cuStreamSynchronize",
        bus_id="cuDeviceGetPCIBusId",
    ),
    # The largest shared memory one block may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin),
    # as NVIDIA's CUDA C++ Programming Guide gives it under "Technical Specifications per Compute
    # Capability" (maximum amount of shared memory per thread block: 163 KB on 8.0 and 8.7, 99 KB
    # on 8.6, 8.9 and 12.x, 227 KB on 9.0 and 10.x) and NVIDIA's CCCL computes it in
    # libcudacxx/include/cuda/__device/arch_traits.h (max_shared_memory_per_block_optin: shared
    # memory per SM less the 1 KiB the driver reserves for each block from sm_80 on).
    shared_memory={
        80: 163 * KiB,
        86: 99 * KiB,
        87: 163 * KiB,
        89: 99 * KiB,
        90: 227 * KiB,
        100: 227 * KiB,
        120: 99 * KiB,
    },
)
register(CUDA)
