"""Compile targets: ``cuda:<compute capability>`` and ``hip:<gfx arch>``.

A target is explicit (the ``target=`` argument or ``$KERNELCACHE_TARGET``) or detected from the
local device of the platform being lowered for. With an explicit target, compiling and lowering
need no GPU at all, which is how CI machines pre-build kernels for other machines.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kernelcache.target_names import EXAMPLES as _EXAMPLES
from kernelcache.target_names import parse_target_name

from .errors import TargetError

if TYPE_CHECKING:
    from .settings import BridgeSettings

logger = logging.getLogger(__name__)

#: most threads a block may have on every NVIDIA and AMD GPU Triton supports
MAX_THREADS_PER_BLOCK = 1024
#: threads per warp that jaxlib's launcher assumes (block size = num_warps x this)
JAXLIB_THREADS_PER_WARP = {"cuda": 32, "hip": 64}


@dataclass(frozen=True, order=True)
class Target:
    """One GPU architecture Triton compiles for.

    ``backend`` is Triton's name ("cuda" or "hip"); ``arch`` the compute capability as an int
    (90 for sm_90) or the gfx architecture ("gfx942"); ``warp_size`` the threads per warp the
    code is compiled for (32 on NVIDIA and on RDNA, 64 on CDNA and GCN).
    """

    backend: str
    arch: int | str
    warp_size: int

    def __str__(self) -> str:
        return f"{self.backend}:{self.arch}"

    @property
    def vendor(self) -> str:
        """Triton's backend package for this target: "nvidia" or "amd"."""
        return "nvidia" if self.backend == "cuda" else "amd"

    @property
    def platform(self) -> str:
        """The JAX platform name that runs this target: "cuda" or "rocm"."""
        return "cuda" if self.backend == "cuda" else "rocm"

    @property
    def jaxlib_warp_size(self) -> int:
        """Threads per warp in jaxlib's launch geometry for this vendor."""
        return JAXLIB_THREADS_PER_WARP[self.backend]

    def triton(self):  # -> triton.backends.compiler.GPUTarget
        """This target as Triton's ``GPUTarget``."""
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, self.warp_size)

    def runs_on(self, device: Target) -> bool:
        """Whether machine code compiled for this target loads on ``device``.

        NVIDIA cubins run on the same major architecture with an equal or newer minor version,
        except the architecture-specific sm_90a and newer, which need the exact device. AMD code
        objects need the exact gfx architecture.
        """
        if self.backend != device.backend:
            return False
        if self.backend == "hip":
            return self.arch == device.arch
        ours, theirs = int(self.arch), int(device.arch)
        if ours >= 90:
            return ours == theirs
        return ours // 10 == theirs // 10 and theirs >= ours


def hip_warp_size(arch: str) -> int:
    """Threads per wavefront of a gfx architecture: 32 on gfx10 and newer (RDNA), else 64."""
    digits = arch[3:-2]
    major = int(digits) if digits.isdigit() else 0
    return 32 if major >= 10 else 64


def parse_target(text: str | Target) -> Target:
    """Parse "cuda:90", "sm_90", "hip:gfx942" or "rocm:gfx90a:sramecc+:xnack-".

    Raises:
        TargetError: the text is not a target; the message shows valid examples.
    """
    if isinstance(text, Target):
        return text
    if not isinstance(text, str):
        raise TargetError(f"a target is a string such as {_EXAMPLES}; got {text!r}")
    try:
        backend, arch = parse_target_name(text)
    except ValueError as e:
        raise TargetError(str(e)) from None
    if backend == "cuda":
        return Target("cuda", arch, 32)
    assert isinstance(arch, str)
    return Target("hip", arch, hip_warp_size(arch))


def detect(platform: str) -> list[Target]:
    """The targets of this process's local devices of ``platform`` ("cuda" or "rocm").

    Returns an empty list when there are none (a CPU-only machine, or another platform).
    """
    import jax

    try:
        devices = jax.local_devices(backend=platform)
    except RuntimeError:
        return []
    found: list[Target] = []
    for device in devices:
        target = _device_target(device, platform)
        if target is not None and target not in found:
            found.append(target)
    return found


def _device_target(device, platform: str) -> Target | None:
    raw = str(getattr(device, "compute_capability", "") or "")
    if platform == "cuda":
        if re.fullmatch(r"\d+\.\d+", raw):
            major, minor = raw.split(".")
            return Target("cuda", int(major) * 10 + int(minor), 32)
        return None
    arch = raw.split(":")[0].strip().lower()
    if not arch.startswith("gfx"):
        try:
            from jax._src.lib import gpu_triton

            arch = gpu_triton.get_arch_details(device.local_hardware_id or 0).split(":")[0]
        except (ImportError, AttributeError, RuntimeError, ValueError) as e:
            logger.debug("cannot read the gfx architecture of %s: %s", device, e)
            return None
    return Target("hip", arch, hip_warp_size(arch))


def resolve(
    explicit: str | Target | None, platform: str, cfg: BridgeSettings | None = None
) -> Target:
    """The target to compile for when lowering for ``platform``.

    Order: ``explicit`` (the call's ``target=``), then ``$KERNELCACHE_TARGET``, then the local
    device. When local devices of ``platform`` exist, the target must run on one of them.

    Raises:
        TargetError: malformed, for the other vendor, undetectable, or not runnable here.
    """
    from .settings import settings

    source = "target="
    if explicit is None:
        explicit = (cfg or settings()).target
        source = "$KERNELCACHE_TARGET"
    local = detect(platform)
    if explicit is None:
        if not local:
            raise TargetError(
                f"no {platform} device here to detect the compile target from: pass target= "
                f"(e.g. {_EXAMPLES}) or set KERNELCACHE_TARGET to cross-compile on this machine"
            )
        if len(local) > 1:
            logger.warning(
                "several GPU architectures present (%s); compiling for %s",
                ", ".join(map(str, local)),
                local[0],
            )
        return local[0]
    target = parse_target(explicit)
    if target.platform != platform:
        raise TargetError(
            f"{source} {target} is a {target.platform} target, but this computation is being "
            f"lowered for {platform}: use a {platform} target or lower for {target.platform}"
        )
    if local and not any(target.runs_on(device) for device in local):
        raise TargetError(
            f"{source} {target} does not run on this machine's {platform} devices "
            f"({', '.join(map(str, local))}): remove the target to compile for the local device, "
            "or cross-compile on a machine without these GPUs"
        )
    return target
