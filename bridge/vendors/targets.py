"""Compile targets (``cuda:<compute capability>``, ``hip:<gfx arch>``, ...) and how a lowering
chooses one.

A target is explicit (the ``target=`` argument or ``$KERNELCACHE_TARGET``) or detected from the
local device of the platform being lowered for. With an explicit target, compiling and lowering
need no GPU at all. What differs by vendor is asked of the target's descriptor
(:mod:`bridge.vendors.vendor`), never decided here by name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..exceptions import TargetError
from .vendor import Arch, Vendor, by_name, by_platform, examples, parse_name

if TYPE_CHECKING:
    from ..settings import BridgeSettings

logger = logging.getLogger(__name__)


@dataclass(frozen=True, order=True)
class Target:
    """One GPU architecture Triton compiles for.

    ``backend`` is Triton's name for the vendor ("cuda", "hip"); ``arch`` the compute
    capability as an int (90 for sm_90) or the gfx architecture ("gfx942"); ``warp_size`` the
    threads per warp the code is compiled for; ``vendor`` the descriptor of ``backend``.

    Raises:
        TargetError: no vendor named ``backend`` is registered.
    """

    backend: str
    arch: Arch
    warp_size: int
    vendor: Vendor = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "vendor", by_name(self.backend))

    def __str__(self) -> str:
        return f"{self.backend}:{self.arch}"

    @property
    def platform(self) -> str:
        """The JAX platform name that runs this target ("cuda", "rocm")."""
        return self.vendor.platform

    def triton(self):  # -> triton.backends.compiler.GPUTarget
        """This target as Triton's ``GPUTarget``."""
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, self.warp_size)

    def runs_on(self, device: Target) -> bool:
        """Whether machine code compiled for this target loads on ``device``."""
        return self.vendor is device.vendor and self.vendor.runs_on(self.arch, device.arch)


def target_of(vendor: Vendor, arch: Arch) -> Target:
    """The target of ``vendor``'s architecture ``arch``, with the warp size it compiles for."""
    return Target(vendor.name, arch, vendor.warp_size(arch))


def parse_target(text: str | Target) -> Target:
    """Parse "cuda:90", "sm_90", "hip:gfx942", "rocm:gfx90a:sramecc+:xnack-", ...

    Raises:
        TargetError: the text is not a target; the message shows valid examples.
    """
    if isinstance(text, Target):
        return text
    if not isinstance(text, str):
        raise TargetError(f"a target is a string such as {examples()}; got {text!r}")
    return target_of(*parse_name(text))


def max_shared_memory(target: Target, device: Any = None) -> int | None:
    """The most shared memory one block may use on ``target``, in bytes (None: unknown): what
    the local ``device`` says where it can (see :meth:`Vendor.device_shared_memory`), else the
    vendor's table."""
    found = None if device is None else target.vendor.device_shared_memory(device)
    return found if found is not None else target.vendor.max_shared_memory(target.arch)


def detect_devices(platform: str) -> list[tuple[Any, Target]]:
    """This process's local JAX devices of ``platform``, each with its target (none on a
    CPU-only machine, or for another platform)."""
    vendor = by_platform(platform)
    if vendor is None:
        return []
    import jax

    try:
        devices = jax.local_devices(backend=platform)
    except RuntimeError:
        return []
    found = []
    for device in devices:
        arch = vendor.device_arch(device)
        if arch is not None:
            found.append((device, target_of(vendor, arch)))
    return found


def local_device(target: Target, platform: str) -> Any:
    """A local JAX device of ``platform`` that runs ``target``'s code (None: there is none)."""
    return next((d for d, local in detect_devices(platform) if target.runs_on(local)), None)


def device_kind(device: Any, target: Target) -> str | None:
    """What a decision names the local ``device`` that runs ``target`` by: its kind (the
    target where it has none); None where there is no such device."""
    return None if device is None else str(getattr(device, "device_kind", "") or target)


def detect(platform: str) -> list[Target]:
    """The targets of this process's local devices of JAX's ``platform`` (see
    :func:`detect_devices`), each once."""
    found: list[Target] = []
    for _, target in detect_devices(platform):
        if target not in found:
            found.append(target)
    return found


def select_target(
    explicit: str | Target | None, platform: str, cfg: BridgeSettings | None = None
) -> Target:
    """The target to compile for when lowering for ``platform``.

    Order: ``explicit`` (the call's ``target=``), then ``$KERNELCACHE_TARGET``, then the local
    device. When local devices of ``platform`` exist, the target must run on one of them.

    Raises:
        TargetError: malformed, for the other vendor, undetectable, or not runnable here.
    """
    from ..settings import settings

    source = "target="
    if explicit is None:
        explicit = (cfg or settings()).target
        source = "$KERNELCACHE_TARGET"
    local = detect(platform)
    if explicit is None:
        if not local:
            from kernelcache.plugin import misspelt

            unusable = _unusable_target()  # (set, to a value that cannot be used)
            if unusable is not None:
                raise TargetError(
                    f"no {platform} device here to detect the compile target from, and "
                    f"{unusable}: fix it, or pass target="
                )
            typo = misspelt("KERNELCACHE_TARGET")  # (the variable meant, set under another name)
            raise TargetError(
                f"no {platform} device here to detect the compile target from: "
                + (f"{typo} " if typo else "")
                + f"pass target= (e.g. {examples()}) or set KERNELCACHE_TARGET to cross-compile "
                "on this machine"
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


def _unusable_target() -> str | None:
    """What is wrong with ``$KERNELCACHE_TARGET``, where it is set to a value that cannot be
    used (a job took its default: detection); None otherwise."""
    from kernelcache import ConfigError
    from kernelcache.plugin import parse_variable

    from ..settings import VARIABLES

    try:
        parse_variable(next(v for v in VARIABLES if v.name == "KERNELCACHE_TARGET"))
    except ConfigError as e:
        return str(e)
    return None


def recorded_targets(
    given: Sequence[str], recorded: Iterable[str], manifest: str
) -> Callable[[Sequence[str]], list[str]]:
    """How a command over a manifest (``tune``, ``explain``) chooses its targets: the names
    ``given``, and :mod:`fnmatch` patterns (``cuda:*``) that select among the targets the
    manifest records (``recorded``). Returns, for a call recorded for some targets, the ones
    to work on: every name given and the call's own that a pattern selects; with nothing
    given, the call's own.

    Raises:
        TargetError: a name given is not a target, or a pattern selects none of ``recorded``
            (the message names ``manifest`` and what it records).
    """
    from kernelcache.plugin import is_pattern, matcher

    names = [str(parse_target(t)) for t in given if not is_pattern(t)]
    patterns = [t for t in given if is_pattern(t)]
    known = sorted(set(recorded))
    unmatched = [p for p in patterns if not any(map(matcher([p]), known))]
    if unmatched:
        raise TargetError(
            f"--target {', '.join(unmatched)} matches no target {manifest} records "
            f"(recorded: {', '.join(known) or 'none'})"
        )
    selects = matcher(patterns)

    def choose(own: Sequence[str]) -> list[str]:
        if not given:
            return list(own)
        return names + [t for t in own if selects(t) and t not in names]

    return choose
