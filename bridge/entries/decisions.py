"""Autotune decisions: which config of an autotuned call runs, decided once and kept in the cache.

A decision is an entry like a kernel: ``<key>.decision`` holds a small JSON document (the
variants it chose among, the chosen one, each one's measured time, the margin over the runner-up
and the measurement noise), its metadata says ``kind: decision``. It goes wherever entries go:
verified reads, read-only layers, the remote tier, bundles, ``ls``/``show``/``verify``/``prune``.

Its key is derived from everything the choice depends on: the ordered kernel keys of the call's
variants (the kernel source, its constexprs and options, the target, Triton's version), the
shapes and dtypes of the call's arrays and the values of the autotune ``key`` arguments, and the
device it was measured on (``device_kind``, e.g. "NVIDIA H200"): named steps
(:func:`decision_steps`) digested as every key of named steps is
(:func:`kernelcache.keys.digest_of`). The driver and toolkit are not part of it: a decision
outlives their updates until it is tuned again. A decision made without a device (pinned by an
operator) holds for every device of its target, and is looked up after the device's own.

A document read back is untrusted input, read within bounds (its size, by the number of
variants: :data:`BYTES_PER_VARIANT`; JSON nesting caught) and checked field by field, then
across fields, by one table of rules (:data:`RULES`, each with what it says of a document that
breaks it): it is used
only if it names exactly the call's variants (in their order) and a chosen index among them
that ran, with times, reasons and flags that agree with them (a pinned decision holds for every
device and measured nothing; a measured one has a time per variant). Any other document under a
decision's key (malformed, stale, for other variants) is ignored as if absent, with one warning
per document and process naming its key and why.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeGuard

from kernelcache.plugin import digest_of, warn_once

from .kinds import EntryKind

if TYPE_CHECKING:
    from kernelcache import Cache

    from ..call.kernel_objects import KernelParts

#: an autotune decision, under its own key
DECISION = EntryKind("decision", role=None, sparse=True)

logger = logging.getLogger(__name__)


class Keyed(Protocol):
    """A variant with its kernel key (a :class:`bridge.identity.specialize.Specialization`)."""

    @property
    def key(self) -> str: ...


FORMAT = 1
#: the device of a decision that holds for every device of its target (a pinned one)
ANY_DEVICE = "*"
#: a config whose time is within this fraction of the fastest one ties with it: the earliest
#: of the tied configs is chosen, so that two tunings of one machine agree
TIE = 0.02
#: the largest decision document read back; one for N variants is at most
#: ``min(MAX_BYTES, BYTES_PER_VARIANT * (N + 1))``
MAX_BYTES = 1 << 20
#: the longest config description, and the longest reason a variant did not run (characters)
MAX_TEXT = 4096
#: what one variant may add to a document: its key, time, config and reason (each text escaped
#: as JSON may escape it, six bytes a character), with room to spare
BYTES_PER_VARIANT = 16 * MAX_TEXT
#: the most variants one decision chooses among
MAX_VARIANTS = 4096


class Decision(NamedTuple):
    """The choice among the variants of one autotuned call on one device.

    ``times`` are seconds per launch (None: the variant could not run, see ``reasons``);
    ``margin`` is how much slower the runner-up is (0.05: 5 %), ``noise`` the relative spread
    of repeated measurements; both None when nothing was measured (``pinned``). What measuring
    cost, where known: the ``launches`` of each variant, the GPU seconds ``spent`` in all and
    the ``wall`` seconds it took, who screened each variant (``by``, host and bus id) and who
    ran the final rounds (``final_by``).
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
    reasons: Mapping[int, str] = MappingProxyType({})
    launches: tuple[int, ...] = ()
    spent: float | None = None
    wall: float | None = None
    by: tuple[str, ...] = ()
    final_by: str = ""

    @property
    def config(self) -> str:
        """The chosen config, as Triton prints it."""
        return self.configs[self.chosen]

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # (pickled with its reasons as a dict: the default, a read-only mapping, is not picklable)
        return type(self), tuple(self._replace(reasons=dict(self.reasons)))

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
            "launches": list(self.launches),
            "spent": self.spent,
            "wall": self.wall,
            "by": list(self.by),
            "final_by": self.final_by,
        }

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()

    def describe(self) -> list[str]:
        """The decision for people: a line with the chosen config, pinned or the device it was
        measured on, the margin over the runner-up and the noise; then one line per config
        with its time (``*`` marks the chosen one) or why it could not run."""
        where = "pinned for every device" if self.pinned else f"measured on {self.device}"
        parts = [f"config {self.chosen} ({self.config}), {where}"]
        if self.margin is not None:
            parts.append(f"margin {100 * self.margin:.1f}%")
        if self.noise is not None:
            parts.append(f"noise {100 * self.noise:.1f}%")
        lines = [", ".join(parts)]
        if self.launches and self.spent is not None:
            gpus = sorted({b for b in (*self.by, self.final_by) if b})
            lines.append(
                f"  measured {sum(1 for n in self.launches if n)} configs, "
                f"{sum(self.launches)} launches, {self.spent:.3f} s of GPU time"
                + (f" ({self.wall:.3f} s)" if self.wall is not None else "")
                + (f" on {', '.join(gpus)}" if gpus else "")
            )
        times = self.times or (None,) * len(self.configs)
        for i, (config, t) in enumerate(zip(self.configs, times, strict=True)):
            why = self.reasons.get(i)
            shown = f"{t * 1e6:9.1f} us" if t is not None else f"{'-':>12}"
            mark = "*" if i == self.chosen else " "
            lines.append(f"  {mark} {i:3d} {shown}  {config}{' (' + why + ')' if why else ''}")
        return lines

    def metadata(self) -> dict[str, Any]:
        """The entry metadata of this decision."""
        return {
            "kind": DECISION.ext,
            "name": self.kernel.rpartition(":")[2] or self.kernel,
            "kernel": self.kernel,
            "target": self.target,
        }


#: the longest duration a document may hold, in seconds (a year: no measurement takes longer)
MAX_SECONDS = 365 * 86400.0


def is_duration(value: Any) -> TypeGuard[float]:
    """Whether ``value`` is a number of seconds, 0 to :data:`MAX_SECONDS` (an int compared to
    that bound is never converted to a float: ``10**400`` is refused, not an OverflowError)."""
    return type(value) in (int, float) and 0 <= value <= MAX_SECONDS


def _index(text: Any, n: int) -> bool:
    """Whether ``text`` is a variant's index among ``n`` written as JSON keys are: decimal
    ASCII digits (at most 9: Python refuses to read a number of thousands)."""
    return (
        isinstance(text, str)
        and 0 < len(text) <= 9
        and text.isascii()
        and text.isdigit()
        and int(text) < n
    )


def _text(value: Any, most: int) -> TypeGuard[str]:
    return isinstance(value, str) and 0 < len(value) <= most


#: a check of a decision document given the number of its variants; each assumes the rules
#: before it in :data:`RULES` hold
Rule = Callable[[Mapping[str, Any], int], bool]


def _numbers(doc: Mapping[str, Any], *names: str) -> bool:
    """Whether each of ``names`` is absent, null or a finite duration."""
    return all(doc.get(name) is None or is_duration(doc.get(name)) for name in names)


def _per_variant(value: Any, n: int) -> TypeGuard[list[Any]]:
    """Whether ``value`` is a list with one item per variant, or empty."""
    return isinstance(value, list) and len(value) in (0, n)


#: what a decision document must be, field by field and then across fields, in the order it is
#: checked, each rule with what is said of a document that breaks it (see the module docstring)
RULES: tuple[tuple[Rule, str], ...] = (
    (
        lambda d, n: type(d.get("chosen")) is int and 0 <= d["chosen"] < n,
        "the decision's chosen variant is out of range",
    ),
    (
        lambda d, n: isinstance(d.get("configs"), list) and len(d["configs"]) == n,
        "the decision's configs do not match its variants",
    ),
    (
        lambda d, n: all(isinstance(c, str) and len(c) <= MAX_TEXT for c in d["configs"]),
        "the decision's configs are not text",
    ),
    (
        lambda d, n: _per_variant(d.get("times"), n),
        "the decision's times do not match its variants (stale times)",
    ),
    (
        lambda d, n: all(t is None or is_duration(t) for t in d["times"]),
        "the decision's times are not durations",
    ),
    (
        lambda d, n: _numbers(d, "margin", "noise") and type(d.get("pinned")) is bool,
        "the decision's margin, noise or pinned flag is malformed",
    ),
    (
        lambda d, n: (
            isinstance(d.get("reasons"), dict)
            and all(_index(k, n) and _text(v, MAX_TEXT) for k, v in d["reasons"].items())
        ),
        "the decision's reasons are malformed",
    ),
    (
        lambda d, n: all(_text(d.get(f), 1024) for f in ("kernel", "target", "device")),
        "the decision's kernel, target or device is malformed",
    ),
    (
        lambda d, n: (
            not d["pinned"] or (d["device"] == ANY_DEVICE and not d["times"] and not _measured(d))
        ),
        "the decision is pinned but names a device or measurements",
    ),
    (
        lambda d, n: d["pinned"] or d["device"] != ANY_DEVICE,
        "the decision was measured but names no device",
    ),
    (
        lambda d, n: d["pinned"] or (bool(d["times"]) and d["times"][d["chosen"]] is not None),
        "the decision was measured but its chosen variant has no time",
    ),
    (
        lambda d, n: str(d["chosen"]) not in d["reasons"],
        "the decision chooses a variant it says cannot run",
    ),
    (
        lambda d, n: _per_variant(d.get("launches", []), n),
        "the decision's launches do not match its variants",
    ),
    (
        lambda d, n: all(type(k) is int and 0 <= k for k in d.get("launches", [])),
        "the decision's launches are not counts",
    ),
    (
        lambda d, n: (
            _per_variant(d.get("by", []), n)
            and all(_text(b, 1024) or b == "" for b in d.get("by", []))
        ),
        "the decision's measurers do not match its variants",
    ),
    (
        lambda d, n: (
            _numbers(d, "spent", "wall")
            and (d.get("final_by", "") == "" or _text(d.get("final_by"), 1024))
        ),
        "the decision's measuring time or final measurer is malformed",
    ),
)


def _measured(doc: Mapping[str, Any]) -> bool:
    return doc.get("margin") is not None or doc.get("noise") is not None


def parse(data: bytes, variants: Sequence[str]) -> Decision | str:
    """The decision in ``data`` if it chooses among exactly ``variants``; else why not."""
    most = min(MAX_BYTES, BYTES_PER_VARIANT * (len(variants) + 1))
    if len(data) > most:
        return (
            f"the decision is too large ({len(data):,} bytes; one for {len(variants)} variants "
            f"has at most {most:,})"
        )
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return "the decision is not JSON (or nested too deeply)"
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return "the decision has an unknown format"
    if doc.get("variants") != list(variants):
        return "the decision chooses among other variants (or in another order)"
    n = len(variants)
    for holds, why in RULES:
        try:
            held = holds(doc, n)
        except (ValueError, OverflowError, TypeError):  # (a value no rule foresaw: broken)
            held = False
        if not held:
            return why
    chosen, times, reasons = doc["chosen"], doc["times"], doc["reasons"]
    margin, noise, spent, wall = (doc.get(f) for f in ("margin", "noise", "spent", "wall"))
    launches, by = doc.get("launches", []), doc.get("by", [])
    kernel, target, device = doc["kernel"], doc["target"], doc["device"]
    return Decision(
        kernel=kernel,
        target=target,
        device=device,
        variants=tuple(variants),
        configs=tuple(doc["configs"]),
        chosen=chosen,
        times=tuple(float(t) if t is not None else None for t in times),
        margin=None if margin is None else float(margin),
        noise=None if noise is None else float(noise),
        pinned=doc["pinned"],
        reasons={int(k): v for k, v in reasons.items()},
        launches=tuple(launches),
        spent=None if spent is None else float(spent),
        wall=None if wall is None else float(wall),
        by=tuple(by),
        final_by=doc.get("final_by", ""),
    )


def tuning_inputs(named: Mapping[str, Any], autotune_keys: Sequence[str]) -> dict[str, Any]:
    """What of a call's arguments a choice depends on besides its variants: the shape and dtype
    of every array (by parameter name) and the value of every autotune ``key`` argument."""
    from ..call.placeholders import ArgArray  # (numpy: not needed to read a decision)

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
    specs: Sequence[Keyed],
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


def decision_steps(
    variants: Sequence[str], inputs: Mapping[str, Any], device: str
) -> dict[str, str]:
    """The named steps of the key of the decision among ``variants`` for ``inputs`` on
    ``device``: the document format, the variants' kernel keys in order, the tuning inputs
    (:func:`tuning_inputs`) and the device kind."""

    def text(value: Any) -> str:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)

    return {
        "format": str(FORMAT),
        "variants": text(list(variants)),
        "inputs": text(inputs),
        "device": device,
    }


def decision_key(variants: Sequence[str], inputs: Mapping[str, Any], device: str) -> str:
    """The cache key of the decision among ``variants`` for ``inputs`` on ``device``: the digest
    of its steps (:func:`kernelcache.keys.digest_of`, as kernel and lowering keys are made)."""
    return digest_of(decision_steps(variants, inputs, device))


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


def lookup(
    cache: Cache, keys: Sequence[str], variants: Sequence[str]
) -> tuple[str, Decision] | None:
    """The first usable decision under ``keys`` (a device's own, then its target's), with its
    key; a document that is not one is warned about (see the module docstring) and skipped."""
    for key in keys:
        art = DECISION.get(cache, key)
        if art is None:
            continue
        found = parse(art.data, variants)
        if isinstance(found, Decision):
            return key, found
        ignored(key, art.meta.get("digest"), found)
    return None


def find(cache: Cache, keys: Sequence[str], variants: Sequence[str]) -> Decision | None:
    """The decision :func:`lookup` finds, without its key."""
    found = lookup(cache, keys, variants)
    return None if found is None else found[1]


def ignored(key: str, document: object, why: str) -> None:
    """Warn, once per process for the ``document`` (its digest) under ``key``, that the
    decision there is ignored, and why."""
    warn_once(
        logger,
        ("decision-ignored", key, document),
        "kernelcache: ignoring the autotune decision %s: %s; the call is lowered as without one "
        "(`kernelcache tune MANIFEST --force`, or --pin, replaces it)",
        key,
        why,
    )
