"""The GPU vendors the bridge compiles for: one descriptor per Triton backend.

A :class:`Vendor` holds everything that differs by vendor: the names Triton and JAX give it, the
grammar of its target names, launch geometry, its machine code and how jaxlib receives it, host
TMA support, and the largest shared memory one block may use per architecture. The descriptors
are registered by name; a :class:`~bridge.targets.Target` refers to its own.

Invariants: this is the only module of the bridge that compares vendor, backend or platform
names; every other module asks a target's descriptor. Adding a vendor is one descriptor passed
to :func:`register`, plus its tests. Nothing here imports jax or triton at import time.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kernelcache.formats import EM_AMDGPU, EM_CUDA

from ..errors import TargetError

logger = logging.getLogger(__name__)

Arch = int | str


@dataclass(frozen=True, eq=False)
class Vendor:
    """What the bridge needs to know about one of Triton's vendor backends.

    The methods are the rules that depend on the architecture; their defaults suit a vendor
    whose code runs only on the exact architecture it was compiled for. A descriptor is a
    singleton: compared by identity, pickled by name.
    """

    #: Triton's backend name, also the prefix of target names: "cuda"
    name: str
    #: Triton's vendor package (``triton.backends.<package>``): "nvidia"
    package: str
    #: JAX's platform name for these GPUs: "cuda"
    platform: str
    #: who makes the GPUs, and what the platform is called, in messages: "NVIDIA", "CUDA"
    maker: str
    title: str
    #: a target name: the prefix (name or an alias) and the architecture in group 1
    grammar: re.Pattern[str]
    #: how messages spell a target name of this vendor, and valid examples of one
    name_form: str
    examples: tuple[str, ...]
    #: how to get Triton's backend for this vendor when it is missing
    install_hint: str
    #: Triton's options dataclass in ``triton.backends.<package>.compiler``
    options_class: str
    #: an architecture whose options list the option names of the backend
    probe_arch: Arch
    #: the extension of the machine code Triton writes ("cubin"), and whether PTX comes with it
    binary_ext: str
    has_ptx: bool
    #: the ``embed=`` modes that work besides "auto", and what "auto" means for a jaxlib that
    #: ignores ``module_image``
    embed_modes: tuple[str, ...]
    fallback_embed: str
    #: what happens to inline machine code under a jaxlib that ignores ``module_image``
    inline_on_old_jaxlib: str
    #: threads per warp in the code where the architecture does not decide it, threads per
    #: warp in jaxlib's launch geometry (block size = num_warps x this), threads per block
    warp_size_default: int
    jaxlib_threads_per_warp: int
    max_threads_per_block: int
    #: the backend's ``hash()`` runs ptxas: memoize it by the ptxas files' identity
    hash_runs_ptxas: bool
    #: Triton's backend imports torch to specialize pointers on their 32-bit range (buffer
    #: ops); the bridge answers from the placeholder array's size instead
    pointer_range_specialization: bool
    #: the most shared memory (LDS) one block may use, in bytes, per architecture
    shared_memory: Mapping[Arch, int]
    #: the ELF ``e_machine`` of the machine code (None: not ELF); a compile's output is checked
    #: against it (see :func:`bridge.compile.compiler.output_problem`)
    elf_machine: int | None = None

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return by_name, (self.name,)

    def __repr__(self) -> str:
        return f"Vendor({self.name})"

    @property
    def uses_handoff(self) -> bool:
        """Whether machine code may be handed to jaxlib as a file (``embed="path"``)."""
        return "path" in self.embed_modes

    def parse_arch(self, text: str) -> Arch | None:
        """The architecture named by ``text`` (stripped, lower case), None if it is not one of
        this vendor's target names.

        Raises:
            TargetError: a name of this vendor for an architecture Triton cannot compile for.
        """
        m = self.grammar.fullmatch(text)
        return None if m is None else self.arch_of(m.group(1), text)

    def arch_of(self, raw: str, text: str) -> Arch:
        """The architecture from the text the grammar matched (``text`` for messages)."""
        return raw

    def warp_size(self, arch: Arch) -> int:
        """Threads per warp of code compiled for ``arch``."""
        return self.warp_size_default

    def runs_on(self, ours: Arch, theirs: Arch) -> bool:
        """Whether code compiled for ``ours`` loads on a device of architecture ``theirs``."""
        return ours == theirs

    def proto_compute_capability(self, arch: Arch) -> int:
        """``TritonKernel.compute_capability`` in jaxlib's message for ``arch``."""
        return 0

    def host_tma(self, arch: Arch) -> bool:
        """Whether jaxlib can pass host-side TMA descriptors to code for ``arch``."""
        return False

    def device_arch(self, device: Any) -> Arch | None:
        """The architecture of a JAX device of this platform, None if it cannot be read."""
        return None

    def max_shared_memory(self, arch: Arch) -> int | None:
        """The most shared memory one block may use on ``arch``, in bytes (None: unknown)."""
        return self.shared_memory.get(arch)

    def device_shared_memory(self, device: Any) -> int | None:
        """The most shared memory one block may use on a local JAX ``device``, read from the
        device itself. Hook, not read yet (None): a device attribute or Triton's
        ``driver.active.utils.get_device_properties(i)["max_shared_mem"]`` can answer it
        where the target is the local device; :meth:`max_shared_memory` answers for now."""
        return None


@dataclass(frozen=True, eq=False)
class _Nvidia(Vendor):
    #: the oldest compute capability Triton compiles for
    min_compute_capability: int = 50

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


@dataclass(frozen=True, eq=False)
class _Amd(Vendor):
    def warp_size(self, arch: Arch) -> int:
        """32 on gfx10 and newer (RDNA), else 64 (CDNA, GCN)."""
        digits = str(arch)[3:-2]
        major = int(digits) if digits.isdigit() else 0
        return 32 if major >= 10 else 64

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


KiB = 1024

NVIDIA: Vendor = _Nvidia(
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
    embed_modes=("inline", "ptx"),
    fallback_embed="ptx",
    inline_on_old_jaxlib="the PTX in each call is compiled by ptxas at XLA compile time instead",
    warp_size_default=32,
    jaxlib_threads_per_warp=32,
    max_threads_per_block=1024,
    hash_runs_ptxas=True,
    pointer_range_specialization=False,
    elf_machine=EM_CUDA,
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

AMD: Vendor = _Amd(
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
    embed_modes=("inline", "path"),
    fallback_embed="path",
    inline_on_old_jaxlib="it would look for a file named by the kernel's token and fail to load it",
    warp_size_default=64,
    jaxlib_threads_per_warp=64,
    max_threads_per_block=1024,
    hash_runs_ptxas=False,
    pointer_range_specialization=True,
    elf_machine=EM_AMDGPU,
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

_registry: dict[str, Vendor] = {}


def register(vendor: Vendor) -> Vendor:
    """Make ``vendor`` known by its name (and its platform to the lowering); returns it.

    Raises:
        ValueError: another descriptor has its name or platform.
    """
    for other in _registry.values():
        if other is not vendor and other.platform == vendor.platform:
            raise ValueError(f"platform {vendor.platform!r} belongs to {other.name}")
    if _registry.get(vendor.name, vendor) is not vendor:
        raise ValueError(f"a vendor named {vendor.name!r} is registered already")
    _registry[vendor.name] = vendor
    return vendor


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


register(NVIDIA)
register(AMD)
