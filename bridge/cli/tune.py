"""``kernelcache tune``: autotune decisions for the autotuned calls of a recorded manifest.

On a machine with the GPU, each recorded call with more than one variant is measured on
synthetic inputs (see :mod:`bridge.tune.select`) and its decision stored for this device. With
``--pin KERNEL=INDEX`` nothing is measured and no GPU is needed: config INDEX of KERNEL's own
list (0-based) is the decision for every device of each recorded target. Either way the
decision's key is the one a lowering of the call computes, so a job that lowers it runs the
chosen kernel. Configs that cannot compile or launch there (see :mod:`bridge.compile.variants`) are
never measured or chosen, and the decision lists them with their reasons; a pin compiles
nothing, so it refuses the configs the cache knows to be left out (a lowering ignores a
decision for any other, with a warning).

A pin replaces the decision pinned before; measuring keeps a usable decision already stored
(it reports it: "present") unless ``force``. A stored document that is not a usable decision is
replaced as if absent. Replacing is atomic in the writable root; a remote tier keeps its value,
with a warning (see :meth:`kernelcache.Cache.replace`).

Calls are replayed from their records: arguments (arrays as shapes and dtypes), the outputs,
and the grid of each config. A record that lacks what a measurement needs is reported and
skipped.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..compile.variants import Variants, known_left_out
from ..entries import decisions
from ..entries.decisions import ANY_DEVICE, DECISION, Decision
from ..exceptions import BridgeError, KernelArgumentError, PinError
from ..identity.specialize import Specialization, specialize_call
from ..lowering.lower import variant_opaque
from ..tune import measure, select
from ..vendors.targets import Target, local_device, parse_target, recorded_targets
from ..warm.manifest import RecordedCall, call_ident, import_kernel, read_manifest
from ..warm.planning import kernel_parts

if TYPE_CHECKING:
    from kernelcache import Cache

    from ..call.tracing import CallSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tuned:
    """What tuning one recorded call for one target did: ``status`` is "tuned", "pinned",
    "present" (a decision was there), "single" (one variant: nothing to choose) or "skipped"
    (with ``detail`` saying why)."""

    kernel: str
    target: str
    status: str
    decision: Decision | None = None
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        d = self.decision
        return {
            "kernel": self.kernel,
            "target": self.target,
            "status": self.status,
            "detail": self.detail,
            "decision": None if d is None else d.to_json(),
        }

    def line(self) -> str:
        d = self.decision
        head = f"{self.kernel} on {self.target}: {self.status}"
        if d is None:
            return f"{head}{': ' + self.detail if self.detail else ''}"
        first, *rest = d.describe()
        return "\n".join([f"{head} {first}", *rest])


@dataclass
class _Group:
    call: RecordedCall
    targets: list[str] = field(default_factory=list)
    grids: dict[str, list[int]] = field(default_factory=dict)  # target + variant kwargs -> grid
    variant_names: set[str] = field(default_factory=set)  # the kwargs a variant records
    outputs: list[str] | None = None


def _grid_key(target: str, variant_kwargs: Mapping[str, Any]) -> str:
    return json.dumps([target, variant_kwargs], sort_keys=True, default=repr)


def recorded_calls(manifest: str) -> list[_Group]:
    """The distinct calls of ``manifest``, each with its targets, grids and outputs."""
    groups: dict[str, _Group] = {}
    for rec in read_manifest(manifest):
        ident = call_ident(rec)
        group = groups.get(ident)
        if group is None:
            group = groups[ident] = _Group(RecordedCall.from_record(rec))
        target = str(rec.get("target") or "")
        if target and target not in group.targets:
            group.targets.append(target)
        variant = rec.get("variant") or {}
        grid = rec.get("grid")
        if isinstance(grid, list) and len(grid) == 3 and all(type(g) is int for g in grid):
            kwargs = variant.get("kwargs") or {}
            group.grids[_grid_key(target, kwargs)] = grid
            group.variant_names.update(kwargs)
        outputs = rec.get("outputs")
        if isinstance(outputs, list) and all(isinstance(o, str) for o in outputs):
            group.outputs = outputs
    return list(groups.values())


def _specs(group: _Group, target: Target, cache: Cache) -> list[Specialization]:
    named, kwargs, options = group.call.revived(target, [0])
    return specialize_call(kernel_parts(group.call), named, kwargs, options, target, cache)


def pinned_config(group: _Group, index: int) -> str:
    """The config ``index`` of the kernel's own config list, as a variant describes it.

    Raises:
        PinError: the kernel is not autotuned, or has no config ``index``.
    """
    parts = kernel_parts(group.call)
    configs = [layer.configs for layer in parts.layers if hasattr(layer, "configs")]
    if not configs:
        raise PinError(f"{group.call.kernel} is not autotuned: there is nothing to pin")
    own = configs[0]
    if not 0 <= index < len(own):
        raise PinError(
            f"--pin {group.call.kernel.rpartition(':')[2]}={index}: the kernel has "
            f"{len(own)} configs (0 to {len(own) - 1})"
        )
    return str(own[index])


def pin(group: _Group, target: Target, index: int, cache: Cache) -> Tuned:
    """Store config ``index`` (of the kernel's own config list) as the decision of ``group``'s
    call for every device of ``target``, in place of the one pinned before."""
    wanted = pinned_config(group, index)
    specs = _specs(group, target, cache)
    found = [
        i
        for i, s in enumerate(specs)
        if s.variant.description == wanted or s.variant.description.startswith(wanted + ", ")
    ]
    if len(found) != 1:
        return Tuned(
            group.call.kernel,
            str(target),
            "skipped",
            detail=f"config {index} ({wanted}) is not one variant of this call (it was pruned, "
            "or heuristics make several of it)",
        )
    left = known_left_out(specs, cache)  # nothing compiled: a pin needs no compiler
    if found[0] in left:
        return Tuned(
            group.call.kernel,
            str(target),
            "skipped",
            detail=f"config {index} ({wanted}) cannot run on {target}: {left[found[0]]}",
        )
    made = Decision(
        kernel=group.call.kernel,
        target=str(target),
        device=ANY_DEVICE,
        variants=tuple(s.key for s in specs),
        configs=tuple(s.variant.description for s in specs),
        chosen=found[0],
        pinned=True,
        reasons=left,
    )
    named, _, _ = group.call.revived(target, [0])
    key = decisions.keys_of(kernel_parts(group.call), named, specs)[0]
    if decisions.find(cache, [key], made.variants) != made:
        _store(cache, key, made)
    return Tuned(group.call.kernel, str(target), "pinned", made)


def _store(cache: Cache, key: str, made: Decision) -> None:
    """Store ``made`` under ``key`` in place of what is there (the caller decided to)."""
    DECISION.replace(cache, key, made.to_bytes(), made.metadata())


def traced_call(group: _Group, target: Target, cache: Cache) -> CallSpec:
    """``group``'s call as a lowering sees it, traced through ``bridge.triton_call`` on
    abstract arrays, with each variant's recorded grid.

    Raises:
        KernelArgumentError: the records lack the outputs or a grid.
    """
    import jax

    from ..api import triton_call
    from ..call.placeholders import ArgArray
    from ..call.plain import plain
    from ..lowering.lower import triton_call_p

    if group.outputs is None:
        raise KernelArgumentError(
            "its records do not say which arguments are outputs (recorded by an older "
            "kernelcache): record the job again"
        )
    parts = kernel_parts(group.call)
    named, kwargs, options = group.call.revived(target, [0])
    outputs = set(group.outputs)

    def abstract(value: Any) -> Any:
        if isinstance(value, ArgArray):
            return jax.ShapeDtypeStruct(value.shape, value.jax_dtype)
        return value

    positional = [
        named[n] for n in parts.arg_names if n in named and n not in outputs and n not in kwargs
    ]
    arrays = [i for i, v in enumerate(positional) if isinstance(v, ArgArray)]
    if any(isinstance(v, tuple) for v in positional):
        raise KernelArgumentError("tuple arguments cannot be replayed by tune yet")
    out_shape = {n: abstract(named[n]) for n in parts.arg_names if n in outputs}

    def grid(meta: Mapping[str, Any]) -> tuple[int, ...]:
        variant = {k: plain(meta[k]) for k in group.variant_names if k in meta}
        found = group.grids.get(_grid_key(str(target), variant))
        if found is None:
            raise KernelArgumentError(
                f"the grid of config {variant} was not recorded (record the job with "
                "KERNELCACHE_AUTOTUNE=runtime)"
            )
        return tuple(found)

    def launch(*xs: Any) -> Any:
        args = list(positional)
        for i, x in zip(arrays, xs, strict=True):
            args[i] = x
        return triton_call(
            *args,
            kernel=import_kernel(group.call.kernel),
            out_shape=out_shape,
            grid=grid,
            target=str(target),
            cache=cache,
            autotune="runtime",
            **kwargs,
            **options,
        )

    jaxpr = jax.make_jaxpr(launch)(*(abstract(positional[i]) for i in arrays))
    for eqn in jaxpr.eqns:
        if eqn.primitive is triton_call_p:
            return eqn.params["call"]
    raise KernelArgumentError("the replayed call did not reach the kernel")


def measure_group(
    group: _Group, target: Target, cache: Cache, platform: str, force: bool, gpus: int = 1
) -> Tuned:
    """Measure ``group``'s call for ``target`` on up to ``gpus`` of this machine's GPUs (the
    configs spread over them, the final rounds on the first) and store the decision."""
    kernel = group.call.kernel
    configs = [
        layer.configs for layer in kernel_parts(group.call).layers if hasattr(layer, "configs")
    ]
    if not configs or len(configs[0]) < 2:
        return Tuned(kernel, str(target), "single")  # not autotuned: nothing to choose
    device = measure.current().device(target, platform)
    if device is None:
        return Tuned(
            kernel,
            str(target),
            "skipped",
            detail=f"no {target} device here to measure on (--pin {kernel}=INDEX decides "
            "without a GPU)",
        )
    call = traced_call(group, target, cache)
    specs = specialize_call(call.parts, call.named, call.kwargs, call.options, target, cache)
    if len(specs) < 2:
        return Tuned(kernel, str(target), "single")
    key = decisions.keys_of(call.parts, call.named, specs, [device])[0]
    if not force:
        found = decisions.find(cache, [key], [s.key for s in specs])
        if found is not None:
            return Tuned(kernel, str(target), "present", found)
    left = Variants(specs, cache, device=local_device(target, platform)).left_out()
    start = time.monotonic()
    indices = select.measured(specs, left)
    bench = measure.current().bench(call, variant_opaque(call, platform), indices, platform, gpus)
    made = select.decide(call, specs, target, device, bench, cache, left, start=start)
    _store(cache, key, made)
    return Tuned(kernel, str(target), "tuned", made)


def tune(
    manifest: str,
    cache: Cache,
    *,
    pins: Mapping[str, int] | None = None,
    targets: Sequence[str] = (),
    force: bool = False,
    gpus: int = 1,
) -> list[Tuned]:
    """Decisions for every autotuned call of ``manifest`` (see the module docstring), for the
    recorded targets, or ``targets``: names, and :mod:`fnmatch` patterns (``cuda:*``) that
    select among the recorded ones (:func:`~bridge.vendors.targets.recorded_targets`). Problems with
    one call are reported, not raised.

    Raises:
        TargetError: a target given is malformed, or a pattern matches no target the manifest
            records.
        PinError: a pin names a config its kernel does not have (nothing is stored).
    """
    groups = recorded_calls(manifest)
    choose = recorded_targets(targets, (t for group in groups for t in group.targets), manifest)
    results: list[Tuned] = []
    wanted = {}
    for group in groups:
        kernel = group.call.kernel
        index = None if pins is None else pins.get(kernel, pins.get(kernel.rpartition(":")[2]))
        if index is not None:  # every pin checked before any decision is stored
            try:
                pinned_config(group, index)
            except PinError:
                raise
            except (BridgeError, ValueError):
                pass  # (reported below, per target, as the kernel's failure)
        wanted[id(group)] = index
    for group in groups:
        kernel = group.call.kernel
        index = wanted[id(group)]
        if pins is not None and index is None:
            continue
        for name in choose(group.targets):
            try:
                target = parse_target(name)
                if index is not None:
                    results.append(pin(group, target, index, cache))
                else:
                    platform = target.vendor.platform
                    results.append(measure_group(group, target, cache, platform, force, gpus))
            except (BridgeError, ValueError) as e:
                results.append(Tuned(kernel, name, "skipped", detail=str(e)))
    return results
