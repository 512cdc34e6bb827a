"""What ``kernelcache doctor`` reports of a ROCm job started in this environment: the embedding
its kernels get under the installed jaxlib, and whether JAX's persistent compilation cache can
hit for the modules it lowers.

Inline HSACO (``TritonKernel.module_image``) where jaxlib honours it (>= 0.11.1): nothing is
handed over, and a module names its machine code by content, so the same kernel gives the same
module in every process. Elsewhere the hand-off path (:mod:`bridge.embed.handoff`): the same
string in every process, ``/proc/self/fd/<N>/<sha256>.hsaco``, only where a process can hold
descriptor ``N``; else each process hands over its own directory's path, its modules differ
from every other process's, and JAX's cache cannot hit. ``KERNELCACHE_EMBED`` is honoured as a
job would honour it. Neither jax nor triton is imported: the jaxlib's version is read from its
distribution's metadata.
"""

from __future__ import annotations

import os
from typing import Any

#: the target the report is for where ``KERNELCACHE_TARGET`` names no ROCm one (the embedding
#: is the vendor's, whatever the architecture)
ROCM_TARGET = "hip:gfx942"


def canonical_handoff() -> bool:
    """Whether a process started with this environment can hold the hand-off directory as
    descriptor :data:`~bridge.embed.handoff.HANDOFF_FD` (``/proc/self/fd`` exists, and the
    hard limit on open files lets the soft one rise past that number), so that the path it
    hands over is the canonical one."""
    import resource

    from ..embed.handoff import HANDOFF_FD

    if not os.path.isdir("/proc/self/fd"):
        return False
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return hard == resource.RLIM_INFINITY or hard > HANDOFF_FD


def _target() -> Any:
    """The ROCm target a job here lowers for: ``KERNELCACHE_TARGET``'s where it names one."""
    from ..exceptions import TargetError
    from ..vendors.targets import parse_target

    try:
        named = parse_target(os.environ.get("KERNELCACHE_TARGET") or ROCM_TARGET)
    except TargetError:  # (the variable's own check says what is wrong with it)
        named = None
    rocm = parse_target(ROCM_TARGET)
    return named if named is not None and named.vendor is rocm.vendor else rocm


def report(
    jaxlib: str | None = None, canonical: bool | None = None
) -> tuple[dict[str, Any] | None, list[Any]]:
    """``doctor``'s view of a ROCm job's embedding under ``jaxlib`` (default: the installed
    one's version; None and no check where jaxlib is not installed) and whether JAX's cache can
    hit, the hand-off descriptor ``canonical`` or not (default: :func:`canonical_handoff`)."""
    from importlib import metadata

    from kernelcache.cli import Check

    from .. import versions
    from ..embed import modes
    from ..embed.handoff import HANDOFF_FD
    from ..exceptions import EmbedError

    if jaxlib is None:
        try:
            jaxlib = metadata.version("jaxlib")
        except metadata.PackageNotFoundError:
            return None, []
    target = _target()
    asked = (os.environ.get("KERNELCACHE_EMBED") or "").strip().lower() or "auto"
    honours = versions.honours_module_image(jaxlib)
    minimum = ".".join(map(str, versions.MODULE_IMAGE))
    info: dict[str, Any] = {
        "jaxlib": jaxlib,
        "target": str(target),
        "asked": asked,
        "embed": None,
        "handoff_path": None,
        "jax_cache_can_hit": False,
    }
    try:
        mode = modes.choose_mode(asked, target, jaxlib)
    except EmbedError as e:
        return info, [Check("rocm embedding", "warn", f"a ROCm job cannot lower here: {e}")]
    info["embed"] = mode
    if mode == "inline":
        info["jax_cache_can_hit"] = True
        if honours:
            detail = (
                f"a ROCm job embeds HSACO inline (jaxlib {jaxlib} loads "
                "TritonKernel.module_image): no file is handed over, and a module names its "
                "machine code by content, so JAX's persistent cache can hit in every process"
            )
            return info, [Check("rocm embedding", "ok", detail)]
        detail = (
            f"KERNELCACHE_EMBED=inline: jaxlib {jaxlib} ignores TritonKernel.module_image, so "
            f"a ROCm job run under it {target.vendor.inline_on_old_jaxlib}; inline HSACO needs "
            f"jaxlib >= {minimum} (unset KERNELCACHE_EMBED to hand HSACO over by path)"
        )
        return info, [Check("rocm embedding", "warn", detail)]
    if asked == "path":
        loads = f", though jaxlib {jaxlib} loads inline HSACO" if honours else ""
        why = f"KERNELCACHE_EMBED=path{loads}"
    else:
        why = f"jaxlib {jaxlib} ignores TritonKernel.module_image; inline needs >= {minimum}"
    if canonical_handoff() if canonical is None else canonical:
        info["handoff_path"] = f"/proc/self/fd/{HANDOFF_FD}/<sha256>.hsaco"
        info["jax_cache_can_hit"] = True
        detail = (
            f"a ROCm job hands HSACO over by path ({why}): {info['handoff_path']}, named by "
            "the machine code and the same in every process, so JAX's persistent cache can hit"
        )
        return info, [Check("rocm embedding", "ok", detail)]
    detail = (
        f"a ROCm job hands HSACO over by path ({why}), but a process here cannot hold "
        f"descriptor {HANDOFF_FD} (the hard limit on open files is too low, or there is no "
        "/proc): each process hands over its own directory's path, its modules differ from "
        "every other process's, and JAX's persistent cache cannot hit; raise the limit "
        f"(ulimit -Hn {HANDOFF_FD + 1} or more), or run under jaxlib >= {minimum} (inline)"
    )
    return info, [Check("rocm embedding", "warn", detail)]
