"""Measuring the variants of an autotuned call on the local GPU, the way jaxlib's autotuner does.

One launch each to estimate, then enough launches for a target time, repeated; the time of a
variant is its fastest repetition. Arrays of floating point numbers are filled with normally
distributed values, integer and boolean arrays with zeros (so that no index read from an array
points out of bounds); ``fill=`` overrides this per parameter. The measurer is replaceable
(:func:`use`), for machines without the GPU and for tests; :mod:`.select` asks
:func:`current`.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..call.arguments import leaf_arrays
from ..call.binding import ArgArray

if TYPE_CHECKING:
    from ..call.tracing import CallSpec
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
