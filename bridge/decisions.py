"""Autotune decisions: which config of an autotuned call runs, decided once and kept in the cache.

A decision is an entry like a kernel: ``<key>.decision`` holds a small JSON document (the
variants it chose among, the chosen one, each one's measured time, the margin over the runner-up
and the measurement noise), its metadata says ``kind: decision``. It goes wherever entries go:
verified reads, read-only layers, the remote tier, bundles, ``ls``/``show``/``verify``/``prune``.

Its key is derived from everything the choice depends on: the ordered kernel keys of the call's
variants (the kernel source, its constexprs and options, the target, Triton's version), the
shapes and dtypes of the call's arrays and the values of the autotune ``key`` arguments, and the
device it was measured on (``device_kind``, e.g. "NVIDIA H200"). The driver and toolkit are not
part of it: a decision outlives their updates until it is tuned again. A decision made without a
device (pinned by an operator) holds for every device of its target, and is looked up after the
device's own.

A document read back is untrusted input: it is used only if it names exactly the call's variants
and a chosen index among them.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .binding import ArgArray

if TYPE_CHECKING:
    from kernelcache import Cache

    from .kernels import KernelParts
    from .specialize import Specialization

#: the extension and kind of a decision entry
EXT = "decision"
KIND = "decision"
FORMAT = 1
#: the device of a decision that holds for every device of its target (a pinned one)
ANY_DEVICE = "*"
#: a config whose time is within this fraction of the fastest one ties with it: the earliest
#: of the tied configs is chosen, so that two tunings of one machine agree
TIE = 0.02
#: the largest decision document read back
MAX_BYTES = 1 << 20
#: the most variants one decision chooses among
MAX_VARIANTS = 4096


@dataclass(frozen=True)
class Decision:
    """The choice among the variants of one autotuned call on one device.

    ``times`` are seconds per launch (None: the variant could not run, see ``reasons``);
    ``margin`` is how much slower the runner-up is (0.05: 5 %), ``noise`` the relative spread
    of repeated measurements; both None when nothing was measured (``pinned``).
    """

    kernel: str
    target: str
    device: str
    variants: tuple[str, ...]
    configs: tuple[str, ...]
    chosen: int
    times: tuple[float | None, ...] = ()
    margin: float | None = None
    noise: float | None = None
    pinned: bool = False
    reasons: Mapping[int, str] = field(default_factory=dict)

    @property
    def config(self) -> str:
        """The chosen config, as Triton prints it."""
        return self.configs[self.chosen]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "kernel": self.kernel,
            "target": self.target,
            "device": self.device,
            "variants": list(self.variants),
            "configs": list(self.configs),
            "chosen": self.chosen,
            "times": list(self.times),
            "margin": self.margin,
            "noise": self.noise,
            "pinned": self.pinned,
            "reasons": {str(i): r for i, r in sorted(self.reasons.items())},
        }

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()

    def metadata(self) -> dict[str, Any]:
        """The entry metadata of this decision."""
        return {
            "kind": KIND,
            "name": self.kernel.rpartition(":")[2] or self.kernel,
            "kernel": self.kernel,
            "target": self.target,
        }


def _finite(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and value >= 0


def parse(data: bytes, variants: Sequence[str]) -> Decision | str:
    """The decision in ``data`` if it chooses among exactly ``variants``; else why not."""
    if len(data) > MAX_BYTES:
        return "the decision is too large"
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return "the decision is not JSON"
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return "the decision has an unknown format"
    names = doc.get("variants")
    if names != list(variants):
        return "the decision chooses among other variants"
    n = len(variants)
    chosen, configs, times = doc.get("chosen"), doc.get("configs"), doc.get("times")
    if type(chosen) is not int or not 0 <= chosen < n:
        return "the decision's chosen variant is out of range"
    if not isinstance(configs, list) or len(configs) != n:
        return "the decision's configs do not match its variants"
    if not all(isinstance(c, str) and len(c) <= 4096 for c in configs):
        return "the decision's configs are not text"
    if not isinstance(times, list) or len(times) not in (0, n):
        return "the decision's times do not match its variants"
    if not all(t is None or _finite(t) for t in times):
        return "the decision's times are not durations"
    margin, noise, pinned = doc.get("margin"), doc.get("noise"), doc.get("pinned")
    if not all(v is None or _finite(v) for v in (margin, noise)) or type(pinned) is not bool:
        return "the decision's margin, noise or pinned flag is malformed"
    reasons = doc.get("reasons")
    if not isinstance(reasons, dict) or not all(
        isinstance(k, str) and k.isdigit() and int(k) < n and isinstance(v, str)
        for k, v in reasons.items()
    ):
        return "the decision's reasons are malformed"
    text = [doc.get("kernel"), doc.get("target"), doc.get("device")]
    kernel, target, device = [t if isinstance(t, str) and 0 < len(t) <= 1024 else "" for t in text]
    if not (kernel and target and device):
        return "the decision's kernel, target or device is malformed"
    return Decision(
        kernel=kernel,
        target=target,
        device=device,
        variants=tuple(variants),
        configs=tuple(configs),
        chosen=chosen,
        times=tuple(float(t) if t is not None else None for t in times),
        margin=None if margin is None else float(margin),
        noise=None if noise is None else float(noise),
        pinned=pinned,
        reasons={int(k): v for k, v in reasons.items()},
    )


def tuning_inputs(named: Mapping[str, Any], autotune_keys: Sequence[str]) -> dict[str, Any]:
    """What of a call's arguments a choice depends on besides its variants: the shape and dtype
    of every array (by parameter name) and the value of every autotune ``key`` argument."""
    arrays = {
        name: [list(value.shape), value.dtype_name]
        for name, value in sorted(named.items())
        if isinstance(value, ArgArray)
    }
    keys = {}
    for name in sorted(set(autotune_keys)):
        value = named.get(name)
        if isinstance(value, ArgArray):
            continue  # its shape and dtype are above
        keys[name] = (
            value if isinstance(value, (bool, int, float, str, type(None))) else repr(value)
        )
    return {"arrays": arrays, "key": keys}


def autotune_keys(parts: KernelParts) -> list[str]:
    """The argument names of the ``key`` of every autotune layer of the kernel."""
    names: list[str] = []
    for layer in parts.layers:
        for name in getattr(layer, "keys", None) or ():
            if isinstance(name, str) and name not in names:
                names.append(name)
    return names


def keys_of(
    parts: KernelParts,
    named: Mapping[str, Any],
    specs: Sequence[Specialization],
    devices: Sequence[str] = (),
) -> list[str]:
    """The keys under which a decision for a call (its kernel and arguments by parameter name)
    is looked up: each device kind's own, then the one pinned for every device of the target."""
    return keys_for(parts, named, [spec.key for spec in specs], devices)


def keys_for(
    parts: KernelParts,
    named: Mapping[str, Any],
    variants: Sequence[str],
    devices: Sequence[str] = (),
) -> list[str]:
    """:func:`keys_of` for the kernel keys of a call's variants."""
    inputs = tuning_inputs(named, autotune_keys(parts))
    return [decision_key(variants, inputs, d) for d in (*devices, ANY_DEVICE)]


def decision_key(variants: Sequence[str], inputs: Mapping[str, Any], device: str) -> str:
    """The cache key of the decision among ``variants`` for ``inputs`` on ``device``."""
    identity = {"decision": FORMAT, "variants": list(variants), "inputs": inputs, "device": device}
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def choose(times: Sequence[float | None], tie: float = TIE) -> int | None:
    """The variant to run: the earliest of those within ``tie`` of the fastest (None if none
    ran)."""
    ran = [t for t in times if t is not None]
    if not ran:
        return None
    best = min(ran)
    return next(i for i, t in enumerate(times) if t is not None and t <= best * (1 + tie))


def margin(times: Sequence[float | None], chosen: int) -> float | None:
    """How much slower the fastest other variant is than the chosen one (None: no other)."""
    others = [t for i, t in enumerate(times) if t is not None and i != chosen]
    own = times[chosen]
    if not others or own is None or own <= 0:
        return None
    return min(others) / own - 1


def find(cache: Cache, keys: Sequence[str], variants: Sequence[str]) -> Decision | None:
    """The first usable decision under ``keys`` (a device's own, then its target's)."""
    for key in keys:
        art = cache.get(key, EXT, counted=False)  # the hit rate is about kernels
        if art is None:
            continue
        found = parse(art.data, variants)
        if isinstance(found, Decision):
            return found
    return None
