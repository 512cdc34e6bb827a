"""What a kernel object is, and the variants its layers make of a call.

A kernel object is a Triton or Gluon ``JITFunction``, possibly wrapped in ``@triton.autotune``
and ``@triton.heuristics`` layers (in any order and number): :func:`decompose` takes it apart
(:class:`KernelParts`). Its layers make a call one or more :class:`Variant` s, applied the way
Triton's launcher applies them (:func:`expand_variants`): heuristics computed, autotune configs
pruned by Triton's own ``prune_configs_by`` functions and their hooks run on placeholders
(:mod:`bridge.call.hooks`). What each variant launches with, before Triton's binder sees it
(:mod:`.binding`): its arguments (:meth:`Variant.arguments`), its options
(:func:`launch_options`), every parameter's value (:func:`parameter_values`) and its grid
(:func:`eval_grid`); all of these are what a lowering's key is made of.

Invariants: nothing here imports jax, binds, specializes or compiles; Triton is imported when a
kernel is first taken apart.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..exceptions import KernelArgumentError, OptionError
from ..vendors.backends import triton
from ..vendors.targets import Target


@dataclass(frozen=True)
class KernelParts:
    """A kernel taken apart: the layers from the outside in, and the JIT function inside.

    ``layers`` holds Triton's own ``Autotuner`` and ``Heuristics`` objects; the bridge reads
    their configuration and applies it the way Triton's launcher does.
    """

    layers: tuple[Any, ...]
    fn: Any  # triton.runtime.jit.JITFunction (GluonJITFunction for Gluon)

    @property
    def name(self) -> str:
        return self.fn.__name__

    @property
    def qualname(self) -> str:
        """``module:qualname`` of the kernel function (how a manifest names it)."""
        return f"{self.fn.__module__}:{self.fn.__qualname__}"

    @property
    def is_gluon(self) -> bool:
        return bool(getattr(self.fn, "is_gluon", lambda: False)())

    @property
    def language(self) -> str:
        return "gluon" if self.is_gluon else "triton"

    @property
    def arg_names(self) -> list[str]:
        return list(self.fn.arg_names)


@functools.cache
def _classes() -> tuple[Any, Any]:
    """Triton's layer classes (autotune, heuristics) and its JIT function class."""
    triton()
    from triton.runtime.autotuner import Autotuner, Heuristics
    from triton.runtime.jit import JITFunction

    return (Autotuner, Heuristics), JITFunction


def decompose(kernel: Any) -> KernelParts:
    """Split ``kernel`` into its autotune/heuristics layers and its JIT function.

    Raises:
        KernelArgumentError: ``kernel`` is not a Triton or Gluon kernel.
    """
    layered, JITFunction = _classes()
    layers: list[Any] = []
    current: Any = kernel
    while isinstance(current, layered):
        layers.append(current)
        current = current.fn
    if not isinstance(current, JITFunction):
        raise KernelArgumentError(
            f"kernel={kernel!r} is not a Triton kernel: pass a function decorated with "
            "@triton.jit or @gluon.jit (optionally wrapped in @triton.autotune / "
            "@triton.heuristics)"
        )
    return KernelParts(tuple(layers), current)


def set_by_layers(parts: KernelParts) -> set[str]:
    """The parameters the kernel's autotune configs and heuristics set."""
    found: set[str] = set()
    for layer in parts.layers:
        for config in getattr(layer, "configs", ()):
            found.update(config.kwargs)
        found.update(getattr(layer, "values", {}))
    return found


@dataclass(frozen=True)
class Variant:
    """One compiled variant of a call: an autotune config (or the only one) after heuristics.

    ``kwargs`` are kernel parameters set by configs and heuristics (on top of the call's own),
    ``options`` backend options (the call's and the config's), ``zero`` parameter names to zero
    before every launch (``reset_to_zero``, ``zero_()`` in a pre_hook), ``description`` the
    autotune config as Triton prints it, ``args`` arguments a config's pre_hook changed (host
    descriptors with the block shape it set).
    """

    kwargs: Mapping[str, Any]
    options: Mapping[str, Any]
    description: str = ""
    zero: frozenset[str] = frozenset()
    args: Mapping[str, Any] = field(default_factory=dict)

    def arguments(self, named: Mapping[str, Any]) -> dict[str, Any]:
        """The call's arguments ``named`` as this variant launches them: its kwargs set, and
        the arguments its pre_hooks changed last (a descriptor passed by keyword is in both
        ``named`` and ``kwargs``, with the block shape the caller gave it)."""
        return _arguments(named, self.kwargs, self.args)


def _arguments(
    named: Mapping[str, Any], kwargs: Mapping[str, Any], args: Mapping[str, Any]
) -> dict[str, Any]:
    """``named``, then ``kwargs``, then ``args`` (see :meth:`Variant.arguments`)."""
    return {**named, **kwargs, **args}


def _conflicts(config: Any, fixed: Mapping[str, Any]) -> list[str]:
    if not fixed:  # (the call pinned nothing: the config's values need not be built)
        return []
    return [k for k, v in config.all_kwargs().items() if k in fixed and fixed[k] != v]


def _hooks(layer: Any, config: Any) -> list[tuple[str, Any, dict[str, Any]]]:
    """The hooks Triton's autotuner runs around a launch of ``config``, in its order."""
    found: list[tuple[str, Any, dict[str, Any]]] = []
    if config.pre_hook is not None:
        found.append(("pre_hook", config.pre_hook, {}))
    if layer.user_defined_pre_hook:
        found.append(("pre_hook", layer.pre_hook, {}))
    if layer.user_defined_post_hook:
        found.append(("post_hook", layer.post_hook, {"exception": None}))
    return found


def expand_variants(
    parts: KernelParts,
    named: Mapping[str, Any],
    kwargs: Mapping[str, Any],
    options: Mapping[str, Any],
    target: Target,
) -> list[Variant]:
    """Apply the kernel's autotune and heuristics layers from the outside in, for ``target``.

    ``named`` are the call's arguments by parameter name, ``kwargs`` the kernel parameters the
    caller set by keyword, ``options`` the backend options the caller set. An autotune config
    that contradicts a value the caller set explicitly is dropped (the call pinned it); Triton's
    own ``prune_configs_by`` functions then run on what is left. A name in a config's kwargs
    that is an option of the target's backend is a compile option of that config, as in Triton.
    The hooks of each config run on placeholders (see :mod:`bridge.call.hooks`).

    Raises:
        OptionError: an option ``target``'s backend does not have, or too many threads.
        KernelArgumentError: a config sets a name that is neither a parameter nor an option, a
            hook does what a compiled program cannot, or no config is left.
    """
    from ..vendors import backends

    backends.check_options(target, set(options))
    if not parts.layers:  # a plain kernel: its one variant is the call
        return [Variant(dict(kwargs), dict(options), "", frozenset(), {})]
    from triton.runtime.autotuner import Autotuner, Heuristics

    params = set(parts.arg_names)
    valid = backends.option_names(target.vendor) - backends.DERIVED_OPTIONS

    def expand(
        i: int,
        kw: dict[str, Any],
        opts: dict[str, Any],
        desc: list[str],
        zero: frozenset[str],
        args: dict[str, Any],
    ) -> list[Variant]:
        if i == len(parts.layers):
            return [Variant(kw, opts, ", ".join(desc), zero, args)]
        layer = parts.layers[i]
        if isinstance(layer, Heuristics):
            kw = dict(kw)
            for name, rule in layer.values.items():
                kw[name] = rule(_arguments(named, kw, args))
            return expand(i + 1, kw, opts, desc, zero, args)
        assert isinstance(layer, Autotuner)
        fixed = {**kw, **opts}
        configs = [c for c in layer.configs if not _conflicts(c, fixed)]
        if not configs:
            clash = sorted({k for c in layer.configs for k in _conflicts(c, fixed)})
            raise KernelArgumentError(
                f"{parts.qualname}: every autotune config contradicts the value(s) you passed for "
                f"{', '.join(clash)}; do not pass autotuned parameters, or pass values some config has"
            )
        nargs = _arguments(named, kw, args)
        if layer.early_config_prune:
            configs = list(layer.early_config_prune(configs, nargs, **kw))
            if not configs:
                raise KernelArgumentError(f"{parts.qualname}: early_config_prune left no config")
        if layer.perf_model and layer.configs_top_k:
            top_k = layer.configs_top_k
            if isinstance(top_k, float) and top_k <= 1.0:
                top_k = int(len(configs) * top_k)
            if len(configs) > top_k:
                est = {c: layer.perf_model(**{**nargs, **c.all_kwargs()}) for c in configs}
                configs = sorted(configs, key=lambda c: est[c])[:top_k]
        zero = zero | frozenset(layer.reset_to_zero)
        out: list[Variant] = []
        for config in configs:
            values = config.all_kwargs()
            unknown = [k for k in config.kwargs if k not in params and k not in valid]
            if unknown:
                raise KernelArgumentError(
                    f"{parts.qualname}: autotune config {config} sets {', '.join(unknown)}, which "
                    f"are neither parameters of the kernel ({', '.join(parts.arg_names)}) nor "
                    f"options of Triton's {target.vendor.package} backend for {target} "
                    f"({', '.join(sorted(valid))})"
                )
            ckw = {k: v for k, v in values.items() if k in params}
            copts = {k: v for k, v in values.items() if k not in params}
            found = _hooks(layer, config)
            more_zero: frozenset[str] = frozenset()
            descriptors: Mapping[str, Any] = {}
            if found:
                from . import hooks

                effects = hooks.run_hooks(
                    found, {**nargs, **values}, parts.qualname, parts.is_gluon
                )
                more_zero, descriptors = effects.zero, effects.descriptors
            out += expand(
                i + 1,
                {**kw, **ckw},
                {**opts, **copts},
                [*desc, str(config)],
                zero | more_zero,
                {**args, **descriptors},
            )
        return out

    return expand(0, dict(kwargs), dict(options), [], frozenset(), {})


def launch_options(parts: KernelParts, variant: Variant) -> dict[str, Any]:
    """The options of ``variant`` with what Triton's launcher adds before binding
    (``JITFunction.run``: ``debug`` and the instrumentation mode, from Triton's knobs).

    Raises:
        OptionError: an option the bridge cannot honour (``ir_override``, or a launch
            attribute jaxlib cannot launch with: :func:`bridge.vendors.backends.check_launch_options`).
    """
    from triton import knobs

    from ..vendors import backends

    options = dict(variant.options)
    if "ir_override" in options:
        raise OptionError("ir_override is not supported: the kernel cache keys on the source")
    where = parts.qualname + (
        f" (autotune config {variant.description})" if variant.description else ""
    )
    backends.check_launch_options(options, where)
    options["debug"] = options.get("debug", parts.fn.debug) or knobs.runtime.debug
    options["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    return options


def parameter_values(
    parts: KernelParts, named: Mapping[str, Any], variant: Variant
) -> dict[str, Any] | None:
    """Every parameter's value in ``variant`` (defaults applied), as Triton's binder gives it
    (:func:`.binding.bound_arguments`) but without specializing anything; None where the
    arguments do not bind (missing or surplus: :func:`.binding.bound_arguments` says which)."""
    call = variant.arguments(named)
    values = {}
    for param in parts.fn.params:
        if param.name in call:
            values[param.name] = call.pop(param.name)
        elif param.default is not inspect.Parameter.empty:
            values[param.name] = param.default
        else:
            return None
    return None if call else values


def eval_grid(grid: Any, bound_args: Mapping[str, Any]) -> tuple[int, int, int]:
    """The launch grid: an int, a tuple of up to three ints, or a function of the bound
    arguments (every kernel parameter by name, as Triton passes them) returning one.

    Raises:
        KernelArgumentError: not one to three positive integers within the hardware limits.
    """
    value = grid(dict(bound_args)) if callable(grid) else grid
    if isinstance(value, (int, np.integer)):
        value = (value,)
    try:
        dims = tuple(map(int, value))
    except (TypeError, ValueError):
        raise KernelArgumentError(f"grid must be up to three integers, got {value!r}") from None
    if not 1 <= len(dims) <= 3:
        raise KernelArgumentError(f"grid must have one to three dimensions, got {value!r}")
    dims = dims + (1,) * (3 - len(dims))
    if any(d < 1 for d in dims):
        raise KernelArgumentError(
            f"grid {dims} has an empty dimension: a launch needs at least one program per axis"
        )
    if dims[0] >= 2**31 or dims[1] > 65535 or dims[2] > 65535:
        raise KernelArgumentError(f"grid {dims} exceeds the launch limits (2**31-1, 65535, 65535)")
    return dims  # type: ignore[return-value]
