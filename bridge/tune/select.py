"""Which variants of an autotuned call a lowering emits, and measuring them.

With a decision in the cache for the call on this device (or one pinned for its target), only
the chosen variant is lowered: a plain kernel call, the same in every process. Without one, by
the call's autotune mode (``autotune=``, else ``$KERNELCACHE_AUTOTUNE``):

- ``decided`` (default): every variant, for jaxlib to autotune at the first run;
- ``runtime``: every variant, even where a decision exists;
- ``require``: an :class:`~bridge.errors.AutotuneError` naming ``kernelcache tune``;
- ``job``: one process measures (single flight through the cache's build lock: the others wait
  for its decision, and take over if it dies) and every process lowers the chosen variant. A
  decision under the device's key that cannot be used (malformed, or choosing a variant left
  out here) is measured again the same way, and replaced.

A variant left out of the call (it cannot compile or launch: see :mod:`bridge.compile.variants`) is
never emitted, measured or chosen; a decision that chose one is ignored, with a warning, as is
a document that is not a decision for the call (see :mod:`bridge.entries.decisions`).

Measuring runs each variant on the local GPU on synthetic inputs, the way jaxlib's autotuner
does: one launch each to estimate, then enough launches for a target time, repeated; the time of
a variant is its fastest repetition. Arrays of floating point numbers are filled with normally
distributed values, integer and boolean arrays with zeros (so that no index read from an array
points out of bounds); ``fill=`` overrides this per parameter. The measurer is replaceable
(:func:`use`), for machines without the GPU and for tests.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from kernelcache.process import warn_once

from ..call.arguments import leaf_arrays
from ..call.binding import ArgArray
from ..entries import decisions
from ..entries.decisions import Decision
from ..errors import AutotuneError

if TYPE_CHECKING:
    from kernelcache import Cache

    from ..call.tracing import CallSpec
    from ..compile.variants import Variants
    from ..identity.specialize import Specialization
    from ..targets import Target

logger = logging.getLogger(__name__)

#: how long the timed launches of one variant should take, as jaxlib aims for
TARGET_SECONDS = 0.01
#: the most launches one timing of a variant makes (jaxlib's cap)
MAX_LAUNCHES = 100
#: timings of each variant; its time is the fastest
REPEATS = 5
#: what fills an array parameter of a measured call: a number, or one of these
FILLS = ("random", "zeros", "ones")


@dataclasses.dataclass(frozen=True)
class Measured:
    """What measuring the variants of a call found: seconds per launch (None where a variant
    could not run, with the reason), and the relative spread of repeated timings."""

    times: tuple[float | None, ...]
    noise: float | None = None
    reasons: Mapping[int, str] = dataclasses.field(default_factory=dict)


class Measurer(Protocol):
    """Measures the variants of calls on one kind of device."""

    def device(self, target: Target, platform: str) -> str | None:
        """The kind of the local device that runs ``target`` (None: there is none)."""
        ...

    def measure(self, call: CallSpec, n: int, skip: frozenset[int] = frozenset()) -> Measured:
        """Time each of the ``n`` variants of ``call`` but those in ``skip`` (left out of the
        call: they cannot compile or launch; their times are None). ``skip`` is passed only
        when some variant is left out, so a measurer that never sees one may omit it."""
        ...


# -- the call's variants ----------------------------------------------------------------------
def select(
    call: CallSpec,
    variants: Variants,
    target: Target,
    platform: str,
    cache: Cache,
    mode: str,
) -> list[int]:
    """The indices of the variants a lowering of ``call`` emits (see the module docstring);
    never one left out of the call (see :mod:`bridge.compile.variants`).

    Raises:
        AutotuneError: ``mode`` is "require" and there is no decision, or "job" and no
            variant could run.
        NoConfigError: every variant is left out.
    """
    specs = variants.specs
    if call.choice is not None:
        return variants.viable([call.choice])
    if len(specs) < 2 or mode == "runtime":
        return variants.viable()
    device = _measurer.device(target, platform)
    keys = decisions.keys_of(call.parts, call.named, specs, [device] if device else [])
    names = [spec.key for spec in specs]
    where = f"{call.parts.qualname} on {device or target}"
    found = decisions.lookup(cache, keys, names)
    if found is not None and _usable(*found, variants, where):
        return [found[1].chosen]
    if mode == "decided":
        return variants.viable()
    if mode == "require":
        raise AutotuneError(
            f"no autotune decision for {where} ({len(specs)} configs), and "
            "KERNELCACHE_AUTOTUNE=require: record the job's calls (KERNELCACHE_RECORD=FILE) and "
            "run `kernelcache tune FILE` on this GPU, or pin a config with `kernelcache tune "
            "FILE --pin KERNEL=INDEX`; or use autotune='decided' to let jaxlib choose"
        )
    if device is None:
        warn_once(
            logger,
            ("tune-no-device", str(target)),
            "kernelcache: KERNELCACHE_AUTOTUNE=job needs the GPU the call runs on to measure "
            "its configs; there is no %s device here, so jaxlib autotunes at the first run",
            target,
        )
        return variants.viable()
    kept = variants.viable()
    left = variants.left_out()

    def tune() -> tuple[bytes, dict[str, Any]]:
        made = decide(call, specs, target, device, left)
        logger.info(
            "kernelcache: tuned %s: %s (margin %s)", where, made.config, _percent(made.margin)
        )
        return made.to_bytes(), made.metadata()

    art = cache.get_or_create(keys[0], decisions.EXT, tune)
    for again in (True, False):  # one that cannot be used is measured again, once
        made = decisions.parse(art.data, names)
        if isinstance(made, str):
            decisions.ignored(keys[0], art.meta.get("digest"), made)
        elif _usable(keys[0], made, variants, where):
            return [made.chosen]
        if again:
            art = cache.rebuild(keys[0], decisions.EXT, tune, stale=art)
    return kept


def _usable(key: str, made: Decision, variants: Variants, where: str) -> bool:
    """Whether the config ``made`` (the decision under ``key``) chooses can run here (a
    decision for a config left out of the call is ignored, with a warning)."""
    why = variants.left_out([made.chosen]).get(made.chosen)
    if why is None:
        return True
    warn_once(
        logger,
        ("decision-left-out", key, made.chosen),
        "kernelcache: ignoring the autotune decision %s for %s: it chooses config %d (%s), "
        "which is left out here: %s",
        key,
        where,
        made.chosen,
        made.config,
        why,
    )
    return False


def decide(
    call: CallSpec,
    specs: Sequence[Specialization],
    target: Target,
    device: str,
    left_out: Mapping[int, str] | None = None,
) -> Decision:
    """Measure the variants of ``call`` and choose (see :func:`bridge.entries.decisions.choose`).
    Those in ``left_out`` (index: why it cannot compile or launch) are not measured, never
    chosen, and listed with their reasons.

    Raises:
        AutotuneError: no variant could run.
    """
    left = dict(left_out or {})
    measured = (
        _measurer.measure(call, len(specs), skip=frozenset(left))
        if left
        else _measurer.measure(call, len(specs))
    )
    times = [None if i in left else t for i, t in enumerate(measured.times)]
    reasons = {**measured.reasons, **left}
    chosen = decisions.choose(times)
    if chosen is None:
        why = "; ".join(f"{specs[i].variant.description}: {r}" for i, r in sorted(reasons.items()))
        raise AutotuneError(f"no config of {call.parts.qualname} could run on {device}: {why}")
    return Decision(
        kernel=call.parts.qualname,
        target=str(target),
        device=device,
        variants=tuple(spec.key for spec in specs),
        configs=tuple(spec.variant.description for spec in specs),
        chosen=chosen,
        times=tuple(times),
        margin=decisions.margin(times, chosen),
        noise=measured.noise,
        reasons=dict(sorted(reasons.items())),
    )


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


# -- measuring on the local GPU -----------------------------------------------------------------
def operand_arrays(call: CallSpec) -> list[tuple[str, ArgArray]]:
    """The operands of ``call`` in custom-call order, each with its parameter's name."""
    found: dict[int, tuple[str, ArgArray]] = {}
    for name in call.parts.arg_names:
        for arr in leaf_arrays(call.named.get(name)):
            index = call.buffers.get(id(arr))
            if index is not None and index < call.n_operands:
                found[index] = (name, arr)
    return [found[i] for i in range(call.n_operands)]


def synthetic(arr: ArgArray, fill: str | float, seed: int) -> Any:
    """A device array of ``arr``'s shape and dtype, filled as ``fill`` says (see FILLS)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    dtype = arr.jax_dtype
    if fill == "random" and not np.issubdtype(dtype, np.floating):
        fill = "zeros"  # integers are often indices: zeros never point out of bounds
    if fill == "random":
        draw = jax.random.normal(jax.random.PRNGKey(seed), arr.shape, jnp.float32)
        return draw.astype(dtype)
    value = fill if not isinstance(fill, str) else 1 if fill == "ones" else 0
    return jnp.full(arr.shape, value, dtype)


class JaxMeasurer:
    """Measures on the local GPU through JAX (see the module docstring)."""

    def __init__(self, fill: Mapping[str, str | float] | None = None) -> None:
        self.fill = dict(fill or {})
        self._kinds: dict[tuple[str, str], str | None] = {}  # a process's devices stay put

    def device(self, target: Target, platform: str) -> str | None:
        which = (str(target), platform)
        if which not in self._kinds:
            self._kinds[which] = self._device(target, platform)
        return self._kinds[which]

    def _device(self, target: Target, platform: str) -> str | None:
        from ..targets import detect_devices

        for device, local in detect_devices(platform):
            if target.runs_on(local):
                return str(getattr(device, "device_kind", "") or local) or None
        return None

    def measure(self, call: CallSpec, n: int, skip: frozenset[int] = frozenset()) -> Measured:
        import jax

        fill = self.fill
        ops = [
            synthetic(arr, fill.get(f"{call.parts.name}:{name}", fill.get(name, "random")), seed)
            for seed, (name, arr) in enumerate(operand_arrays(call))
        ]
        reasons: dict[int, str] = {}
        first: dict[int, float] = {}
        for i in range(n):
            if i in skip:
                continue
            run = _launches(call, i, 1)
            try:
                jax.block_until_ready(run(*ops))  # compile and warm up
                first[i] = _timed(run, ops)
            except jax.errors.JaxRuntimeError as e:
                reasons[i] = str(e).strip().splitlines()[0][:300]
        if not first:
            return Measured((None,) * n, None, reasons)
        launches = max(1, min(MAX_LAUNCHES, int(TARGET_SECONDS / max(min(first.values()), 1e-9))))
        times: list[float | None] = [None] * n
        spreads = []
        for i in first:
            run = _launches(call, i, launches)
            jax.block_until_ready(run(*ops))
            samples = [_timed(run, ops) / launches for _ in range(REPEATS)]
            times[i] = min(samples)
            spreads.append(max(samples) / min(samples) - 1 if min(samples) > 0 else 0.0)
        noise = statistics.median(spreads) if spreads else None
        return Measured(tuple(times), noise, reasons)


def _launches(call: CallSpec, index: int, count: int) -> Any:
    """A jitted function launching variant ``index`` of ``call`` ``count`` times in a row."""
    import jax

    from ..call.primitive import triton_call_p

    one = dataclasses.replace(call, choice=index, autotune="runtime")

    def run(*ops: Any) -> Any:
        out = None
        for _ in range(count):  # has_side_effect: XLA keeps every launch
            out = triton_call_p.bind(*ops, call=one, has_side_effect=True)
        return out

    return jax.jit(run)


def _timed(run: Any, ops: Sequence[Any]) -> float:
    import jax

    start = time.perf_counter()
    jax.block_until_ready(run(*ops))
    return time.perf_counter() - start


_measurer: Measurer = JaxMeasurer()


def current() -> Measurer:
    """The measurer this process uses."""
    return _measurer


def use(measurer: Measurer) -> Measurer:
    """Measure with ``measurer`` from now on in this process; returns the one it replaces."""
    global _measurer
    previous, _measurer = _measurer, measurer
    return previous
