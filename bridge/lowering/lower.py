"""The lowerings of the ``triton_call`` primitive (:mod:`bridge.call.tracing`), one per registered
vendor's platform.

Lowering selects the target, binds every variant (autotune config) with Triton's own binder,
computes each kernel key without compiling, takes the kernels from the cache (compiling only on
a miss: :mod:`.configs`), leaves out the variants that cannot compile or launch
(:mod:`bridge.compile.variants`) and emits
jaxlib's Triton custom call with the messages :mod:`bridge.lowering.messages` builds.

Invariants: the same call, target, software and embedding give a byte-identical opaque in every
process (no temporary paths, no absolute source paths, deterministic metadata and
serialization), so JAX's persistent compilation cache hits; on a warm kernel cache no Triton
compile runs, but for the hits ``KERNELCACHE_AUDIT`` audits (:mod:`bridge.compile.hit_audit`).
What a call's lowering reads from the process (:class:`Setup`: the settings, the target,
embedding, cache and device they resolve to, the jaxlib's features, the software its key starts
with) is read once per lowered module for the calls that pass the same ``target``, ``embed``
and ``cache``. A hit imports neither the record seam (:mod:`.record`: only a process that
records) nor the tuning machinery (an autotuned call's decision is looked up for the setup's
device, as the default measurer names it, unless a measurer was installed).
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import jax

from kernelcache.plugin import count, warn_once

try:  # the public home of the lowering registry (jax 0.8 - 0.11)
    from jax.interpreters import mlir

    _ = mlir.register_lowering
except (ImportError, AttributeError):  # pragma: no cover - later releases
    from jax._src.interpreters import mlir  # type: ignore[no-redef]

from .. import versions
from ..call import kernel_objects
from ..call.tracing import CallSpec, triton_call_p
from ..embed import modes
from ..entries import lowerings
from ..entries.lowerings import Item, Lowered, Program
from ..exceptions import KernelArgumentError
from ..readsets import read_sets
from ..settings import as_cache
from ..vendors import backends, targets
from ..vendors.vendor import registered
from . import lowering_keys

if TYPE_CHECKING:
    from kernelcache import Cache
    from kernelcache.plugin import Settings

    from ..compile.variants import Memo
    from ..settings import BridgeSettings
    from ..tune.measure import Opaque

logger = logging.getLogger(__name__)

CUSTOM_CALL_FFI = versions.FFI_TARGET
CUSTOM_CALL_LEGACY = versions.LEGACY_TARGET


def _no_cpu(ctx: Any, *args: Any, call: CallSpec, has_side_effect: bool) -> Any:
    gpus = " or ".join(f"{v.maker} ({v.platform})" for v in registered())
    first = registered()[0].platform
    raise KernelArgumentError(
        f"the Triton kernel {call.parts.qualname} runs on {gpus} GPUs, but "
        "this computation is being lowered for cpu: run it on a GPU, or cross-compile with "
        f"jax.jit(f).trace(*args).lower(lowering_platforms=({first!r},)) and a target "
        "(target='cuda:90' or 'hip:gfx942', or $KERNELCACHE_TARGET)"
    )


# -- lowering -----------------------------------------------------------------------------


def custom_call_target(lowered: Lowered, ffi_call: bool, forward_compat: bool = False) -> str:
    """``triton_kernel_call_ffi`` where jaxlib has it, except for autotuned calls: those go
    through the legacy ``triton_kernel_call``, as TransformerEngine does after observing
    illegal memory accesses with autotuned kernels on the FFI target (TE PR #3077).

    Lowered for export (``forward_compat``), a call keeps the legacy target unless what it
    embeds already needs a jaxlib with the FFI target (inline machine code, tensor descriptors,
    global scratch: jaxlib >= 0.11.1), so an exported module runs on every jaxlib its contents
    allow. ``ffi_call``: the jaxlib it is lowered for has the FFI target (:class:`Setup`)."""
    if lowered.autotuned or not ffi_call:
        return CUSTOM_CALL_LEGACY
    if forward_compat and not versions.has_ffi_call(lowered.needs):
        return CUSTOM_CALL_LEGACY
    return CUSTOM_CALL_FFI


class Setup(NamedTuple):
    """What lowering a call reads from the process: its settings, and what they and the call's
    ``target``, ``embed`` and ``cache`` arguments resolve to (``context``: the start of its
    lowering key, None where lowerings are not stored; see :mod:`bridge.entries.lowerings`;
    ``ffi_call``: whether ``jaxlib`` has the FFI custom-call target)."""

    cfg: Settings
    ours: BridgeSettings
    target: targets.Target
    jaxlib: str
    ffi_call: bool
    mode: str
    cache: Cache
    device: Any
    context: dict[str, str] | None


def setup(call: CallSpec, platform: str, jaxlib: str | None = None) -> Setup:
    """Read the settings and resolve the target, embedding, cache and local device of ``call``
    for ``platform`` (see :class:`Setup`)."""
    from kernelcache.plugin import job_settings

    from ..settings import job_settings as bridge_settings

    cfg, ours = job_settings(), bridge_settings()  # (a variable that cannot be used: said once)
    target = targets.select_target(call.target, platform, ours)
    jaxlib = jaxlib or versions.jaxlib_version()
    mode = modes.choose_mode(call.embed, target, jaxlib, ours)
    cache = as_cache(call.cache, cfg)
    device = targets.local_device(target, platform)
    context = None if mode == "path" else lowering_keys.context(target, mode, jaxlib, device, cache)
    ffi_call = versions.has_ffi_call(jaxlib)
    return Setup(cfg, ours, target, jaxlib, ffi_call, mode, cache, device, context)


class _Module:
    """The module being lowered in one thread: its setups, each with the :class:`Program` of
    the calls that use it, by what those calls pass."""

    __slots__ = ("checked", "identities", "ref", "setups")

    def __init__(self, ref: weakref.ref[Any]) -> None:
        self.ref = ref
        self.setups: dict[tuple[Any, ...], tuple[Setup, Program]] = {}
        self.checked: dict[Any, Any] = {}  # the read sets checked (each program's ``checked``)
        self.identities: dict[int, tuple[Any, str]] = {}  # (each program's ``identities``)

    def close(self) -> None:
        """Store each program's lowerings (:meth:`Program.close`) and forget the setups."""
        found, self.setups, self.checked, self.identities = self.setups, {}, {}, {}
        for _, program in found.values():
            program.close()


#: the module each thread is lowering
_local = threading.local()


def _scoped_setup(call: CallSpec, platform: str, module: Any) -> tuple[Setup, Program]:
    """:func:`setup`, once per lowered ``module`` (an MLIR module) for the calls that pass the
    same ``target``, ``embed`` and ``cache`` (the settings are read once per lowering of a
    program), with the :class:`Program` of those calls."""
    scope: _Module | None = getattr(_local, "module", None)
    if scope is None or scope.ref() is not module:
        _close_module()  # (one open still: the end of its lowering was not reported)
        try:
            scope = _Module(weakref.ref(module))
        except TypeError:  # not weakly referable (or None): read for each call
            prepared = setup(call, platform)
            return prepared, Program(prepared.cache)
        _local.module = scope
    cache = call.cache
    which = (platform, call.target, call.embed, cache if isinstance(cache, str) else id(cache))
    found = scope.setups.get(which)
    if found is None:
        prepared = setup(call, platform)
        found = scope.setups[which] = (
            prepared,
            Program(prepared.cache, scope.checked, scope.identities),
        )
    return found


def _module_lowered(event: str, duration_secs: float, **kwargs: str | int) -> None:
    """JAX's report that a module's lowering ended (in this thread): its programs are
    complete."""
    if event == _MODULE_EVENT:
        _close_module()


def _close_module() -> None:
    """Forget the module this thread was lowering, if any, storing its programs."""
    scope: _Module | None = getattr(_local, "module", None)
    if scope is not None:
        _local.module = None
        scope.close()


#: what JAX reports (``jax.monitoring``) when it has lowered a jaxpr to an MLIR module
_MODULE_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
jax.monitoring.register_event_duration_secs_listener(_module_lowered)


def lower_call(call: CallSpec, platform: str, jaxlib: str | None = None) -> Lowered:
    """Build the opaque of ``call`` for ``platform``: from the lowering entry of an identical
    call lowered before (see :mod:`bridge.entries.lowerings`), else by specializing, fetching and
    assembling it (and keeping it as such an entry).

    This is the lowering minus the MLIR: usable to inspect what a call embeds.
    """
    prepared = setup(call, platform, jaxlib)
    return _lower_with(call, platform, prepared, Program(prepared.cache))


def _lower_with(call: CallSpec, platform: str, prepared: Setup, program: Program) -> Lowered:
    """:func:`lower_call` with its :class:`Setup`, as a call of ``program``."""
    target, cache = prepared.target, prepared.cache
    autotune = call.autotune or prepared.ours.autotune
    # the kernel's heuristics, prune functions and hooks run here, once per lowering
    every = kernel_objects.expand_variants(
        call.parts, call.named, call.kwargs, call.options, target
    )
    keyed = None
    if prepared.context is not None and call.choice is None and not _recording(prepared.ours):
        keyed = lowering_keys.lowering_key(
            call, target, prepared.context, every, program.identities
        )
    if keyed is not None:
        asked, steps = keyed[0], keyed[2]
        keyed, found = _checked_replay(call, keyed, prepared, platform, autotune, program, every)
        if found is not None and keyed is not None:
            # the kernels it launches were served from the cache: hits, as a lookup of each
            count(cache.root, hits=keyed[1] if found.lowered.autotuned else 1)
            instead = _audited(call, platform, prepared, autotune, every, found)
            if instead is not None:  # (not noted: no program entry is written with it)
                return instead
            program.note(found, call, target)
            return found.lowered
        if _explaining():
            from . import misses

            # (a key chained from the one asked: a stored lowering whose reads are stale)
            misses.explain(cache, call, target, steps, stale=keyed is None or keyed[0] != asked)
    lowered, state, names = _assembled(call, platform, prepared, autotune, every)
    if keyed is not None:
        lowerings.store(cache, keyed[0], call, target, state, lowered, names, keyed[2])
        if _explaining():
            from . import misses

            misses.stored(cache, call, target, keyed[2])
        variants = tuple(names) if len(names) > 1 else None
        program.note(Item(keyed[0], state, variants, lowered), call, target)
    return lowered


def _assembled(
    call: CallSpec,
    platform: str,
    prepared: Setup,
    autotune: str,
    every: list[kernel_objects.Variant],
    memo: Memo | None = None,
) -> tuple[Lowered, str, list[str]]:
    """``call`` lowered from its kernels (:func:`bridge.lowering.configs.assemble`: a miss, or
    an audit, whose ``memo`` is its own)."""
    from . import configs

    target, cache = prepared.target, prepared.cache
    return configs.assemble(
        call,
        every,
        target,
        platform,
        prepared.jaxlib,
        prepared.mode,
        cache,
        autotune,
        prepared.device,
        prepared.ours,
        memo,
    )


def _audited(
    call: CallSpec,
    platform: str,
    prepared: Setup,
    autotune: str,
    every: list[kernel_objects.Variant],
    found: Item,
) -> Lowered | None:
    """What ``call`` uses instead of ``found``, its stored lowering (or a program entry's item),
    where an audit of this hit (``KERNELCACHE_AUDIT``) finds that lowering it again, its kernels
    fetched again and each audited, gives another opaque (see
    :func:`bridge.compile.hit_audit.replayed`); None where ``found`` is used."""
    fraction = prepared.ours.audit
    if fraction <= 0:
        return None
    from ..compile import hit_audit

    about = (str(prepared.cache.root), call.parts.qualname, str(prepared.target))

    def again() -> tuple[Lowered, str]:
        lowered, state, _ = _assembled(call, platform, prepared, autotune, every, {})
        return lowered, state

    return hit_audit.replayed(found, about, fraction, again)


def _checked_replay(
    call: CallSpec,
    keyed: lowering_keys.Keyed,
    prepared: Setup,
    platform: str,
    autotune: str,
    program: Program,
    every: list[kernel_objects.Variant],
) -> tuple[lowering_keys.Keyed | None, Item | None]:
    """The stored lowering of ``call`` (:func:`_replay`) whose kernels' reads find what they
    found, and the key it is (or is to be) stored under: where a stored lowering's reads find
    something else, the lowering of this version of the code is kept under a key chained from
    it (:func:`bridge.readsets.read_sets.follow`); after a few versions, nowhere (None)."""
    target = prepared.target
    backend: list[Any] = []  # (made at the first stored lowering with reads)

    def check(lowered: Lowered) -> read_sets.Verdict:
        reads = lowered.reads
        backend[:] = backend or [backends.make_backend(target)]
        specs = None
        if read_sets.reads_ir(reads):  # (an IR read: for one of the call's own variants)
            specs = functools.cache(
                functools.partial(_specializations, call, every, target, program.cache)
            )
        return read_sets.stale(reads, call.parts.fn, call.named, backend[0], program.checked, specs)

    def stale(key: str, found: Item) -> read_sets.Verdict:
        now = check(found.lowered)
        if now.kind == read_sets.REFUSED:
            warn_once(
                logger,
                ("refused", key),
                "kernelcache: the stored lowering %s of %s holds a read set no compile of this "
                "code wrote (%s), so it is set aside",
                key,
                call.parts.qualname,
                now.reason,
            )
            program.refuse(key, found.state, now.said)
        return now

    def admit(lowered: Lowered) -> str | None:  # (the door of the remote tier)
        return read_sets.door(check(lowered))

    def stored(key: str) -> Item | None:
        return _replay(call, (key, *keyed[1:]), prepared, platform, autotune, program, admit)

    key, found = read_sets.follow(keyed[0], stored, stale)
    return (None if key is None else (key, keyed[1], keyed[2])), found


def _specializations(
    call: CallSpec, every: list[kernel_objects.Variant], target: targets.Target, cache: Any
) -> list[Any]:
    """What the frontend is given for each of ``call``'s variants (an IR read's
    specialization: :func:`bridge.identity.frontend.specialization`)."""
    from ..identity import frontend, specialize

    make, strict = specialize.specialize, len(every) == 1  # (one over a limit: left out)
    specs = [make(call.parts, call.named, v, target, cache, strict=strict) for v in every]
    return [frontend.specialization(s.source, s.bound.options) for s in specs]


def _replay(
    call: CallSpec,
    keyed: lowering_keys.Keyed,
    prepared: Setup,
    platform: str,
    autotune: str,
    program: Program,
    admit: Callable[[Lowered], str | None] | None = None,
) -> Item | None:
    """The stored lowering of ``call`` in the state its autotune mode and decision ask for;
    None where there is none (or the decision must be made or refused by the full lowering).
    ``admit``: the check of a lowering entry of the remote tier at its door."""
    key, count = keyed[0], keyed[1]
    names = None
    if count < 2 or autotune == "runtime":
        state = lowerings.EVERY
    else:
        names = program.variants(key)
        if names is None or len(names) != count:
            return None
        kind = _device_kind(prepared, platform)  # (an autotuned call: its decision)
        decided = lowerings.decided_state(program.cache, call, names, [kind] if kind else [])
        if decided is None and autotune != "decided":  # "require" refuses, "job" decides
            return None
        state = decided or lowerings.EVERY
    found = program.lowered(key, state, admit)
    if found is None:
        return None
    return Item(key, state, None if names is None else tuple(names), found)


def _recording(ours: BridgeSettings) -> bool:
    """Whether a lowered variant goes anywhere (:func:`bridge.lowering.record.wanted`): to
    ``$KERNELCACHE_RECORD``, or to a listener, which only that module registers (where it is
    not loaded there is none: a process that records nothing never imports it)."""
    if ours.record is not None:
        return True
    record = sys.modules.get("bridge.lowering.record")
    return record is not None and record.wanted(ours)


def _device_kind(prepared: Setup, platform: str) -> str | None:
    """The device a decision for ``prepared``'s target is looked up for: the measurer's
    (:func:`bridge.tune.measure.current`) where the tuning machinery is loaded, as it is where
    a measurer was installed; else the default measurer's answer, the kind of the setup's local
    device, without loading it."""
    measure = sys.modules.get("bridge.tune.measure")
    if measure is not None:
        return measure.current().device(prepared.target, platform)
    return targets.device_kind(prepared.device, prepared.target)


def _explaining() -> bool:
    """Whether a lowering miss is explained: JAX's own ``jax_explain_cache_misses`` is on."""
    return bool(getattr(jax.config, "jax_explain_cache_misses", False))


def variant_opaque(call: CallSpec, platform: str) -> Opaque:
    """``opaque(i)``: the custom-call opaque of ``call`` lowered as its variant i alone (what
    measuring variant i launches), its variants specialized once."""
    from . import configs

    prepared = setup(call, platform)
    every = kernel_objects.expand_variants(
        call.parts, call.named, call.kwargs, call.options, prepared.target
    )
    made = configs.Configs(
        call,
        every,
        prepared.target,
        prepared.jaxlib,
        prepared.mode,
        prepared.cache,
        prepared.device,
    )
    return made.alone


def lower_rule(
    ctx: Any, *operands: Any, call: CallSpec, has_side_effect: bool, platform: str
) -> Any:
    """The primitive's lowering rule for ``platform``: the call's custom call on ``operands``
    (also what :func:`bridge.rule.triton_call_lowering` ends in)."""
    # the module being lowered (a JAX without the attribute: the setup is read for each call)
    module = getattr(ctx.module_context, "module", None)
    prepared, program = _scoped_setup(call, platform, module)
    lowered = _lower_with(call, platform, prepared, program)
    aliases = dict(call.aliases)
    forward_compat = getattr(ctx, "is_forward_compat", lambda: False)()
    target = custom_call_target(lowered, prepared.ffi_call, forward_compat)
    if target == CUSTOM_CALL_FFI:
        rule = jax.ffi.ffi_lowering(
            target,
            api_version=4,
            operand_output_aliases=aliases,
            has_side_effect=has_side_effect,
        )
        attributes: dict[str, Any] = {"opaque": lowered.opaque}
        if call.cost_estimate:
            attributes["cost_estimate_json"] = json.dumps(dict(call.cost_estimate))
        return rule(ctx, *operands, **attributes)
    if call.cost_estimate:
        logger.debug(
            "cost_estimate of %s dropped: the legacy %s call has no attributes",
            call.parts.qualname,
            target,
        )
    rule = jax.ffi.ffi_lowering(
        target,
        api_version=2,
        backend_config=lowered.opaque,  # type: ignore[arg-type]  # raw bytes, as jaxlib expects
        operand_output_aliases=aliases,
        has_side_effect=has_side_effect,
    )
    return rule(ctx, *operands)


for _vendor in registered():
    mlir.register_lowering(
        triton_call_p,
        functools.partial(lower_rule, platform=_vendor.platform),
        platform=_vendor.platform,
    )
mlir.register_lowering(triton_call_p, _no_cpu, platform="cpu")
