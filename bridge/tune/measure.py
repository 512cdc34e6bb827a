"""Measuring the configs of an autotuned call on local GPUs: the call's buffers made once per GPU,
each config launched directly through jaxlib's kernel call (:mod:`.jaxlib_launch`), timed by events.

Deciding a call compiles no XLA program per config: its cost is the kernels' running time
(:mod:`.rounds` says how many launches each config gets). Where direct launches are not
possible (no driver library, a jaxlib without the legacy kernel call), each config is launched
by a small jitted program instead, as before, and said once; a config jaxlib refuses is run
that way once, for the message that says why.

Arrays of floating point numbers are filled with normally distributed values, integer and
boolean arrays with zeros (so that no index read from an array points out of bounds); ``fill=``
overrides this per parameter. The measurer is replaceable (:func:`use`), for machines without
the GPU and for tests; :mod:`.select` asks :func:`current`.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from kernelcache.plugin import warn_once

from ..call.placeholders import ArgArray
from ..call.tracing import leaf_arrays
from ..exceptions import BridgeError, Unlaunchable

if TYPE_CHECKING:
    from ..call.tracing import CallSpec
    from ..vendors.targets import Target
    from . import jaxlib_launch
    from .rounds import Bench

logger = logging.getLogger(__name__)

#: what fills an array parameter of a measured call: a number, or one of these
FILLS = ("random", "zeros", "ones")
#: a config's custom-call opaque, by its index (raises where the config cannot be launched)
Opaque = Callable[[int], bytes]


class Measurer(Protocol):
    """Makes the configs of calls ready to measure on one kind of device."""

    def device(self, target: Target, platform: str) -> str | None:
        """The kind of the local device that runs ``target`` (None: there is none)."""
        ...

    def bench(
        self, call: CallSpec, opaque: Opaque, indices: Sequence[int], platform: str, gpus: int = 1
    ) -> Bench:
        """The configs ``indices`` of ``call`` ready to launch on up to ``gpus`` local GPUs of
        ``platform`` that run its target (``opaque(i)``: config i's custom-call opaque)."""
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
    """A traced array of ``arr``'s shape and dtype, filled as ``fill`` says (see FILLS)."""
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
    """Measures on the local GPUs (see the module docstring)."""

    def __init__(self, fill: Mapping[str, str | float] | None = None) -> None:
        self.fill = dict(fill or {})
        self._kinds: dict[tuple[str, str], str | None] = {}  # a process's devices stay put

    def device(self, target: Target, platform: str) -> str | None:
        which = (str(target), platform)
        if which not in self._kinds:
            from ..vendors.targets import device_kind

            found = _devices(target, platform)
            self._kinds[which] = device_kind(found[0] if found else None, target)
        return self._kinds[which]

    def bench(
        self, call: CallSpec, opaque: Opaque, indices: Sequence[int], platform: str, gpus: int = 1
    ) -> Bench:
        from ..vendors.targets import select_target

        devices = _devices(select_target(call.target, platform), platform)[: max(1, gpus)]
        if not devices:
            raise Unlaunchable(f"no local {platform} GPU runs {call.parts.qualname}")
        return JaxBench(call, opaque, indices, platform, devices, self.fill)


def _devices(target: Target, platform: str) -> list[Any]:
    from ..vendors.targets import detect_devices

    return [device for device, local in detect_devices(platform) if target.runs_on(local)]


class JaxBench:
    """A call's configs ready to launch on some local GPUs (see :class:`~.rounds.Bench`)."""

    def __init__(
        self,
        call: CallSpec,
        opaque: Opaque,
        indices: Sequence[int],
        platform: str,
        devices: Sequence[Any],
        fill: Mapping[str, str | float],
    ) -> None:
        self.call, self.platform, self.devices = call, platform, list(devices)
        self._opaques: dict[int, bytes | str] = {}
        for i in indices:  # built here, in one thread: lowering code is not shared by lanes
            try:
                self._opaques[i] = opaque(i)
            except (BridgeError, ValueError) as e:  # the config's own error is its reason
                self._opaques[i] = str(e) or type(e).__name__
        from . import jaxlib_launch  # (launching: not what a lookup of a decision needs)

        self._lanes: list[jaxlib_launch.Lane] | None = []
        try:
            for device in self.devices:
                self._lanes.append(jaxlib_launch.lane(platform, int(device.local_hardware_id)))
        except (Unlaunchable, AttributeError, TypeError) as e:
            warn_once(
                logger,
                ("direct-launch", platform),
                "kernelcache: measuring configs with a compiled program each (slower): %s",
                e,
            )
            self._lanes = None
        host = socket.gethostname()
        self.lanes = (
            [lane.name for lane in self._lanes]
            if self._lanes
            else [f"{host}/{device}" for device in self.devices]
        )
        self._buffers = [_buffers(call, fill, device) for device in self.devices]
        self._programs: dict[tuple[int, int, int], Any] = {}

    def run(self, index: int, launches: int, lane: int) -> float:
        made = self._opaques.get(index)
        if made is None or isinstance(made, str):
            raise Unlaunchable(made or f"config {index} was not prepared")
        ops, _, pointers = self._buffers[lane]
        if self._lanes is None:
            return self._compiled(index, launches, lane, ops)
        try:
            return self._lanes[lane].time(made, pointers, launches)
        except Unlaunchable:
            self._compiled(index, 1, lane, ops)  # raises with jaxlib's message
            raise

    def _compiled(self, index: int, launches: int, lane: int, arrays: Sequence[Any]) -> float:
        """Seconds of ``launches`` launches of config ``index`` by a jitted program (compiled
        and warmed on first use)."""
        import jax

        which = (index, launches, lane)
        program = self._programs.get(which)
        try:
            if program is None:
                program = self._programs[which] = _launches(self.call, index, launches)
                jax.block_until_ready(program(*arrays))
            start = time.perf_counter()
            jax.block_until_ready(program(*arrays))
            return time.perf_counter() - start
        except jax.errors.JaxRuntimeError as e:
            raise Unlaunchable(str(e).strip().splitlines()[0][:300]) from e


def _buffers(
    call: CallSpec, fill: Mapping[str, str | float], device: Any
) -> tuple[list[Any], list[Any], list[int]]:
    """``call``'s operands (synthetic, see the module docstring) and results on ``device``,
    made by one jitted program, with the device pointers of its buffers in custom-call order
    (an aliased result shares its operand's buffer)."""
    import jax
    import jax.numpy as jnp

    named = operand_arrays(call)
    aliased = {result: operand for operand, result in call.aliases}
    fresh = [aval for r, aval in enumerate(call.out_avals) if r not in aliased]

    def make() -> tuple[list[Any], list[Any]]:
        ops = [
            synthetic(arr, fill.get(f"{call.parts.name}:{name}", fill.get(name, "random")), seed)
            for seed, (name, arr) in enumerate(named)
        ]
        return ops, [jnp.zeros(aval.shape, aval.dtype) for aval in fresh]

    with jax.default_device(device):
        ops, results = jax.block_until_ready(jax.jit(make)())
    pointers = [x.unsafe_buffer_pointer() for x in ops]
    made = iter(results)
    for r in range(len(call.out_avals)):
        pointers.append(
            pointers[aliased[r]] if r in aliased else next(made).unsafe_buffer_pointer()
        )
    return ops, results, pointers


def _launches(call: CallSpec, index: int, count: int) -> Any:
    """A jitted function launching variant ``index`` of ``call`` ``count`` times in a row."""
    import jax

    from ..call.tracing import triton_call_p

    one = dataclasses.replace(call, choice=index, autotune="runtime")

    def run(*ops: Any) -> Any:
        out = None
        for _ in range(count):  # has_side_effect: XLA keeps every launch
            out = triton_call_p.bind(*ops, call=one, has_side_effect=True)
        return out

    return jax.jit(run)


_measurer: Measurer = JaxMeasurer()


def current() -> Measurer:
    """The measurer this process uses."""
    return _measurer


def use(measurer: Measurer) -> Measurer:
    """Measure with ``measurer`` from now on in this process; returns the one it replaces."""
    global _measurer
    previous, _measurer = _measurer, measurer
    return previous
