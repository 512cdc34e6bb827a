"""``triton_call``: a Triton or Gluon kernel as a JAX primitive.

Tracing a call (:mod:`bridge.tracing`) records the kernel, the abstract arguments and the
output layout, in the jax-triton 0.3 convention (``out_shape=``) or the 0.4 one (``out_type=``).
Lowering for "cuda" or "rocm" resolves the target, binds every variant (autotune config) with
Triton's own binder, computes each kernel key without compiling, takes the kernel from the cache
(compiling only on a miss), and emits jaxlib's Triton custom call with the machine code embedded.

Across processes: the same call, target, software and embedding give a byte-identical opaque
(no temporary paths, no absolute source paths, deterministic metadata and serialization), so
JAX's persistent compilation cache hits; on a warm kernel cache no Triton compile runs.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

try:  # the public homes of the primitive registries (jax 0.8 - 0.11)
    from jax.interpreters import ad, batching, mlir
    from jax.interpreters import partial_eval as pe

    _ = (ad.primitive_jvps, batching.primitive_batchers, mlir.register_lowering, pe.dce_rules)
except (ImportError, AttributeError):  # pragma: no cover - later releases
    from jax._src.interpreters import ad, batching, mlir  # type: ignore[no-redef]
    from jax._src.interpreters import partial_eval as pe  # type: ignore[no-redef]

from . import (
    backends,
    binding,
    embed,
    handoff,
    proto,
    record,
    specialize,
    targets,
    tma,
    tracing,
    versions,
)
from .artifacts import KernelBinary, as_cache
from .binding import ArgArray
from .errors import KernelArgumentError, OptionError, UnsupportedTransformation
from .kernels import decompose
from .tracing import CallSpec

if TYPE_CHECKING:
    from kernelcache import Cache

    from .artifacts import CacheArg

logger = logging.getLogger(__name__)

CUSTOM_CALL_FFI = versions.FFI_TARGET
CUSTOM_CALL_LEGACY = versions.LEGACY_TARGET


# -- the primitive ------------------------------------------------------------------------
def _primitive_class() -> Any:
    """``jax.extend.core.Primitive``, without importing all of ``jax.extend`` where JAX's own
    class is at hand (``import jax.extend`` loads Pallas: about 30 ms)."""
    try:
        from jax._src.core import Primitive
    except ImportError:  # pragma: no cover - a JAX that moved it: the public path
        import jax.extend

        return jax.extend.core.Primitive
    return Primitive


triton_call_p = _primitive_class()("kernelcache_triton_call")
triton_call_p.multiple_results = True


def _impl(*args: Any, call: CallSpec, has_side_effect: bool) -> Any:
    return jax.jit(lambda *a: triton_call_p.bind(*a, call=call, has_side_effect=has_side_effect))(
        *args
    )


triton_call_p.def_impl(_impl)


@triton_call_p.def_abstract_eval
def _abstract_eval(*avals: Any, call: CallSpec, has_side_effect: bool) -> tuple[Any, ...]:
    return call.out_avals


def _no_jvp(primals: Any, tangents: Any, *, call: CallSpec, has_side_effect: bool) -> Any:
    raise UnsupportedTransformation(
        f"cannot differentiate the Triton kernel {call.parts.qualname}: JAX cannot see inside "
        "it. Wrap the call in jax.custom_vjp (or custom_jvp) with a backward kernel or a jnp rule"
    )


def _vmap(args: Sequence[Any], dims: Sequence[Any], **params: Any) -> Any:
    """Batching by running the kernel once per batch element (``lax.map``): exactly the
    results of separate calls, in sequence. Write a batched kernel for speed."""
    batched = [i for i, d in enumerate(dims) if d is not None]
    moved = [jax.numpy.moveaxis(args[i], dims[i], 0) for i in batched]

    def one(xs: Sequence[Any]) -> Any:
        full = list(args)
        for i, x in zip(batched, xs, strict=True):
            full[i] = x
        return tuple(triton_call_p.bind(*full, **params))

    outs = jax.lax.map(one, tuple(moved))
    return list(outs), [0] * len(outs)


def _keep(used_outputs: list[bool], eqn: Any) -> tuple[list[bool], Any]:
    """JAX's dead-code elimination keeps every kernel call, as jax-triton 0.4 does. (Without
    ``has_side_effect=True``, XLA may still remove a call whose results are all unused.)"""
    return [True] * len(eqn.invars), eqn


ad.primitive_jvps[triton_call_p] = _no_jvp
batching.primitive_batchers[triton_call_p] = _vmap
pe.dce_rules[triton_call_p] = _keep


def _no_cpu(ctx: Any, *args: Any, call: CallSpec, has_side_effect: bool) -> Any:
    raise KernelArgumentError(
        f"the Triton kernel {call.parts.qualname} runs on NVIDIA (cuda) or AMD (rocm) GPUs, but "
        "this computation is being lowered for cpu: run it on a GPU, or cross-compile with "
        "jax.jit(f).trace(*args).lower(lowering_platforms=('cuda',)) and a target= "
    )


# -- lowering -----------------------------------------------------------------------------
def _zeroed(call: CallSpec, bound: binding.Bound) -> dict[int, int]:
    """id(ArgArray) -> bytes to zero before each launch, for this variant."""
    spec = call.zeroed(dict(bound.bound_args)) if callable(call.zeroed) else call.zeroed
    result: dict[int, int] = {}
    for ref in list(spec or ()):
        if isinstance(ref, str):
            arr = call.named.get(ref)
            if not isinstance(arr, ArgArray) or id(arr) not in call.writable:
                raise KernelArgumentError(
                    f"zeroed_outputs: {ref!r} is not an output parameter (or an input updated in "
                    "place)"
                )
        else:
            n = len(call.zero_targets)
            if not isinstance(ref, (int, np.integer)) or not 0 <= int(ref) < n:
                raise KernelArgumentError(
                    f"zeroed_outputs: {ref!r} is not an output index (0..{n - 1})"
                )
            arr = call.zero_targets[int(ref)]
        result[id(arr)] = arr.nbytes
    for name in bound.variant.zero:  # the autotuner's reset_to_zero
        arr = call.named.get(name)
        if not isinstance(arr, ArgArray) or id(arr) not in call.writable:
            writable = [
                n
                for n, v in call.named.items()
                if isinstance(v, ArgArray) and id(v) in call.writable
            ]
            raise KernelArgumentError(
                f"{call.parts.qualname}: reset_to_zero names {name}, which is not an output or an "
                f"input updated in place ({', '.join(writable) or 'none'}); JAX inputs cannot be "
                "overwritten"
            )
        result[id(arr)] = arr.nbytes
    return result


def _kernel_message(
    call: CallSpec, target: targets.Target, mode: str, kb: KernelBinary, cache: Cache, jaxlib: str
) -> proto.TritonKernel:
    meta = kb.meta  # read only fields the entry digest covers (kernelcache.schema.LAUNCH_FIELDS)
    name, shared, warps = str(meta["name"]), int(meta["shared"]), int(meta["num_warps"])
    threads = warps * target.warp_size
    if threads > targets.MAX_THREADS_PER_BLOCK:
        raise OptionError(
            f"{call.parts.qualname} compiled to {warps} warps of {target.warp_size} threads "
            f"({threads}) on {target}; the limit is {targets.MAX_THREADS_PER_BLOCK} threads"
        )
    if threads % target.jaxlib_warp_size:
        raise OptionError(
            f"{call.parts.qualname}: jaxlib launches {target.jaxlib_warp_size} threads per warp on "
            f"{target.platform}; {warps} warps of {target.warp_size} ({threads} threads) cannot be "
            f"launched: use an even num_warps"
        )
    if int(meta.get("profile_scratch_size", 0)):
        raise KernelArgumentError(
            f"{call.parts.qualname} was compiled with profiling instrumentation (it needs a "
            "profile scratch buffer, which jaxlib passes as a null pointer): unset Triton's "
            "instrumentation mode (TRITON_INSTRUMENTATION_MODE / proton) for JAX calls"
        )
    kernel = proto.TritonKernel(
        kernel_name=name,
        num_warps=threads // target.jaxlib_warp_size,
        num_ctas=int(meta.get("num_ctas", 1)),
        shared_mem_bytes=shared,
        compute_capability=int(target.arch) if target.backend == "cuda" else 0,
    )
    scratch = int(meta.get("global_scratch_size", 0))
    if scratch:
        if not versions.has_global_scratch(jaxlib):
            raise KernelArgumentError(
                f"{call.parts.qualname} needs {scratch} bytes of global scratch memory (device-side "
                f"tensor descriptors, tl.make_tensor_descriptor), which jaxlib {jaxlib} does not "
                "provide: use jaxlib >= 0.11.1"
            )
        kernel.global_scratch_size = scratch
        kernel.global_scratch_align = int(meta.get("global_scratch_align", 1))
    if mode == "path":
        kernel.ptx = handoff.materialize(str(cache.root), f"{kb.key}.{kb.ext}", kb.binary)
        return kernel
    if target.backend == "cuda":
        ptx = kb.ptx or ""
        if mode == "ptx" or not versions.honours_module_image(jaxlib):  # jaxlib runs ptxas
            where = f"{call.parts.qualname} on {target}"
            ptx = embed.assembled_ptx(ptx, target, where, cache, strict=mode == "ptx")
        kernel.ptx = embed.marked_ptx(ptx, kb.key)
    else:
        kernel.ptx = embed.hsaco_token(kb.key, str(meta.get("digest", "")))
    if mode == "inline":
        kernel.module_image = proto.ModuleImage(
            object_file=kb.binary, kernel_name=name, shared_mem_bytes=shared
        )
    return kernel


#: jaxlib's parameter for a scalar argument, by the field it travels in (binding.SCALAR_FIELDS)
_SCALARS: dict[str, Callable[[Any], proto.Parameter]] = {
    "bool_": lambda v: proto.Parameter(bool_=bool(v)),
    "i32": lambda v: proto.Parameter(i32=int(v)),
    "u32": lambda v: proto.Parameter(u32=int(v)),
    "i64": lambda v: proto.Parameter(i64=int(v)),
    "u64": lambda v: proto.Parameter(u64=int(v)),
    "f32": lambda v: proto.Parameter(f32=float(v)),
    "f64": lambda v: proto.Parameter(f64=float(v)),
}


def _descriptor(
    call: CallSpec, desc: Any, meta: Mapping[str, Any], zero: dict[int, int]
) -> list[proto.Parameter]:
    """jaxlib's parameters for one host-side descriptor: the TMA descriptor (field 9), then
    the shape (i32) and strides (i64), as Triton's CUDA launcher passes them."""
    where = f"{call.parts.qualname}: a tensor descriptor"
    if meta["is_im2col"] or meta["fp4_padded"]:
        kind = "im2col" if meta["is_im2col"] else "fp4-padded"
        raise KernelArgumentError(
            f"{where} is {kind}, which jaxlib's TMA descriptors cannot encode"
        )
    if id(desc.base) in zero:
        raise KernelArgumentError(
            f"{where}'s base cannot be zeroed by jaxlib (zeroed_outputs): zero the array before "
            "the call"
        )
    shape, strides = [int(d) for d in desc.shape], [int(d) for d in desc.strides]
    if any(not 1 <= d < 2**31 for d in shape) or any(not 0 <= s < 2**40 for s in strides):
        raise KernelArgumentError(f"{where}: shape {shape} or strides {strides} out of range")
    tensor = proto.NvidiaDescriptor(
        elem_type=tma.host_elem_type(meta["elem_type"], bool(desc.round_f32_to_tf32)),
        swizzle=meta["swizzle"],
        shape=shape,
        strides=strides,
        block_shape=list(meta["block_size"]),
        oob_fill=1 if desc.padding == "nan" else 0,
    )
    return [
        proto.Parameter(tensor_descriptor=proto.TensorDescriptor(nvidia=tensor)),
        *(proto.Parameter(i32=d) for d in shape),
        *(proto.Parameter(i64=s) for s in strides),
    ]


def _parameters(
    call: CallSpec,
    bound: binding.Bound,
    zero: dict[int, int],
    desc_meta: Sequence[Mapping[str, Any]] = (),
) -> list[proto.Parameter]:
    """jaxlib's parameters of ``bound``, in the kernel's order."""
    params: list[proto.Parameter] = []
    expected = 0
    descs = iter(desc_meta)
    for leaf in bound.leaves:
        if leaf.is_array or leaf.is_descriptor:
            arr = leaf.value.base if leaf.is_descriptor else leaf.value
            index = call.buffers.get(id(arr))
            if index != expected:
                raise AssertionError(f"buffer order mismatch at {leaf}: {index} != {expected}")
            expected += 1
        if leaf.is_descriptor:
            params += _descriptor(call, leaf.value, next(descs), zero)
        elif leaf.is_array:
            array = proto.Array(
                bytes_to_zero=zero.get(id(leaf.value), 0), ptr_divisibility=leaf.divisibility
            )
            params.append(proto.Parameter(array=array))
        else:
            params.append(_SCALARS[binding.SCALAR_FIELDS[leaf.type]](leaf.value))
    if expected != len(call.buffers):
        raise AssertionError("the kernel's array parameters do not match the buffers")
    return params


def _check_descriptors(call: CallSpec, spec: specialize.Specialization, jaxlib: str) -> int:
    """How many host-side descriptors ``spec`` takes, after checking the target and jaxlib can
    pass them."""
    n = sum(leaf.is_descriptor for leaf in spec.bound.leaves)
    target = spec.target
    if n and (target.backend != "cuda" or int(target.arch) < 90):
        raise KernelArgumentError(
            f"{call.parts.qualname} takes a tensor descriptor, which jaxlib passes as a TMA "
            f"descriptor: that needs a CUDA target with TMA (sm_90 or newer), not {target}. Pass "
            "the array as a pointer, or build the descriptor in the kernel "
            "(tl.make_tensor_descriptor)"
        )
    if n and not versions.has_tma_descriptors(jaxlib):
        raise KernelArgumentError(
            f"{call.parts.qualname} takes a tensor descriptor, which jaxlib {jaxlib} cannot pass "
            "(jaxlib's tensor_descriptor parameter): use jaxlib >= 0.11.1"
        )
    return n


def _descriptor_meta(meta: Mapping[str, Any], n: int) -> list[dict[str, Any]] | None:
    """The TMA metadata of an entry's ``n`` host-side descriptors, or None if it has not
    exactly that (an entry from an older bridge, or a damaged one)."""
    found = tma.descriptor_meta(meta.get("tensordesc_meta"))
    return found if found is not None and len(found) == n else None


#: kernels already fetched in this process: (key, target, cache root) -> KernelBinary
_memo: dict[tuple[str, str, str], KernelBinary] = {}


@dataclass(frozen=True)
class Lowered:
    """What a call lowers to: the opaque, the embedding, whether jaxlib autotunes it, and the
    oldest jaxlib release that can run it."""

    opaque: bytes
    embed: str
    autotuned: bool
    needs: tuple[int, ...] = (0,)


def custom_call_target(lowered: Lowered, jaxlib: str, forward_compat: bool = False) -> str:
    """``triton_kernel_call_ffi`` where jaxlib has it, except for autotuned calls: those go
    through the legacy ``triton_kernel_call``, as TransformerEngine does after observing
    illegal memory accesses with autotuned kernels on the FFI target (TE PR #3077).

    Lowered for export (``forward_compat``), a call keeps the legacy target unless what it
    embeds already needs a jaxlib with the FFI target (inline machine code, tensor descriptors,
    global scratch: jaxlib >= 0.11.1), so an exported module runs on every jaxlib its contents
    allow."""
    if lowered.autotuned or not versions.has_ffi_call(jaxlib):
        return CUSTOM_CALL_LEGACY
    if forward_compat and not versions.has_ffi_call(lowered.needs):
        return CUSTOM_CALL_LEGACY
    return CUSTOM_CALL_FFI


def lower_call(call: CallSpec, platform: str, jaxlib: str | None = None) -> Lowered:
    """Build the opaque of ``call`` for ``platform``.

    This is the lowering minus the MLIR: usable to inspect what a call embeds.
    """
    from kernelcache.config import settings

    from .settings import settings as bridge_settings

    cfg, ours = settings(), bridge_settings()
    target = targets.resolve(call.target, platform, ours)
    jaxlib = jaxlib or versions.jaxlib_version()
    mode = embed.resolve(call.embed, target, jaxlib, ours)
    cache = as_cache(call.cache, cfg)
    configs: list[proto.Config] = []
    needs = versions.MODULE_IMAGE if mode == "inline" else (0,)
    specs = specialize.specialize_call(
        call.parts, call.named, call.kwargs, call.options, target, cache
    )
    memo_keys = [(spec.key, str(target), str(cache.root)) for spec in specs]
    n_descs = {
        mk: _check_descriptors(call, spec, jaxlib)
        for mk, spec in zip(memo_keys, specs, strict=True)
    }
    missing = {mk: spec for mk, spec in zip(memo_keys, specs, strict=True) if mk not in _memo}
    usable = [
        (lambda meta, n=n_descs[mk]: _descriptor_meta(meta, n) is not None) if n_descs[mk] else None
        for mk in missing
    ]
    # every variant at once: compiled here or by another process, whichever is free first
    fetched = specialize.fetch_many(list(missing.values()), cache, usable)
    _memo.update(zip(missing, fetched, strict=True))
    for spec, memo_key in zip(specs, memo_keys, strict=True):
        bound = spec.bound
        n_desc = n_descs[memo_key]
        kb = _memo[memo_key]
        desc_meta = _descriptor_meta(kb.meta, n_desc) if n_desc else []
        if desc_meta is None:
            raise KernelArgumentError(
                f"{call.parts.qualname}: Triton compiled its {n_desc} tensor descriptor(s) for "
                f"{target} without TMA metadata; pass the arrays as pointers"
            )
        grid = binding.eval_grid(call.grid, bound.bound_args)
        kernel = _kernel_message(call, target, mode, kb, cache, jaxlib)
        if n_desc or kernel.global_scratch_size is not None:
            needs = versions.MODULE_IMAGE
        kernel_call = proto.TritonKernelCall(
            kernel=kernel,
            grid_0=grid[0],
            grid_1=grid[1],
            grid_2=grid[2],
            parameters=_parameters(call, bound, _zeroed(call, bound), desc_meta),
        )
        configs.append(proto.Config(kernel_call=kernel_call, description=spec.variant.description))
        if record.wanted(ours):
            record.emit(_record(call, target, spec.key, bound, grid), ours)
    anycall = proto.TritonAnyKernelCall(name=call.name, metadata=call.metadata)
    if len(configs) == 1 and mode != "path":
        anycall.kernel_call = configs[0].kernel_call
    else:
        if len(configs) == 1:  # see bridge.handoff: jaxlib loads autotuned calls under its lock
            guard = f"{configs[0].description} (load guard)".strip()
            configs.append(proto.Config(kernel_call=configs[0].kernel_call, description=guard))
        aliases = [
            proto.InputOutputAlias(
                input_buffer_idx=k,
                output_buffer_idx=call.n_operands + j,
                buffer_size_bytes=int(np.prod(call.out_avals[j].shape))
                * call.out_avals[j].dtype.itemsize,
            )
            for k, j in call.restore
        ]
        anycall.autotuned_kernel_call = proto.TritonAutotunedKernelCall(
            name=f"{call.name} ({call.parts.qualname})",
            configs=configs,
            input_output_aliases=aliases,
        )
    opaque = proto.compress(proto.encode(anycall))
    return Lowered(opaque, mode, anycall.autotuned_kernel_call is not None, tuple(needs))


def _record(
    call: CallSpec,
    target: targets.Target,
    key: str,
    bound: binding.Bound,
    grid: tuple[int, int, int],
) -> dict[str, Any]:
    return {
        "version": record.RECORD_VERSION,
        "kernel": call.parts.qualname,
        "language": call.parts.language,
        "target": str(target),
        "key": key,
        "arguments": record.plain(dict(call.named)),
        "kwargs": record.plain(dict(call.kwargs)),
        "options": record.plain(dict(call.options)),
        "config": bound.variant.description,
        "variant": {
            "kwargs": record.plain(dict(bound.variant.kwargs)),
            "options": record.plain(dict(bound.variant.options)),
        },
        "signature": record.plain(dict(bound.signature)),
        "constexprs": {",".join(map(str, k)): record.plain(v) for k, v in bound.constexprs.items()},
        "grid": list(grid),
    }


def _lower(ctx: Any, *operands: Any, call: CallSpec, has_side_effect: bool, platform: str) -> Any:
    lowered = lower_call(call, platform)
    aliases = dict(call.aliases)
    forward_compat = getattr(ctx, "is_forward_compat", lambda: False)()
    target = custom_call_target(lowered, versions.jaxlib_version(), forward_compat)
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


mlir.register_lowering(triton_call_p, functools.partial(_lower, platform="cuda"), platform="cuda")
mlir.register_lowering(triton_call_p, functools.partial(_lower, platform="rocm"), platform="rocm")
mlir.register_lowering(triton_call_p, _no_cpu, platform="cpu")


# -- the public call ----------------------------------------------------------------------
def _options(
    parts: Any,
    explicit: Mapping[str, Any],
    keywords: Mapping[str, Any],
    backend_options: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The backend options of a call: explicit keywords, option keywords and
    ``backend_options`` (a name given twice is an error; unknown names are listed)."""
    options = {**explicit, **keywords}
    if backend_options is not None:
        if not isinstance(backend_options, Mapping):
            raise OptionError(
                f"backend_options must be a dict of compile options, not {backend_options!r}"
            )
        conflicts = sorted(set(backend_options) & set(options))
        if conflicts:
            raise OptionError(
                f"Cannot specify {', '.join(conflicts)} both as explicit arguments and in "
                "``backend_options``"
            )
        options.update(backend_options)
    known = backends.option_names("cuda") | backends.option_names("hip")
    unknown = sorted(set(options) - known) if known else []
    if unknown:
        raise OptionError(
            f"unknown keyword argument(s) {', '.join(map(str, unknown))} for {parts.qualname}: "
            f"its parameters are {', '.join(parts.arg_names)}; compile options are "
            f"{', '.join(sorted(known - backends.DERIVED_OPTIONS))}"
        )
    derived = sorted(set(options) & backends.DERIVED_OPTIONS)
    if derived:
        raise OptionError(f"{', '.join(derived)} follow(s) from the target: pass target= instead")
    return options


def triton_call(
    *args: Any,
    kernel: Any,
    out_shape: Any = None,
    out_type: Any = None,
    grid: Any,
    num_warps: int | None = None,
    num_stages: int | None = None,
    input_output_aliases: Mapping[Any, Any] | Sequence[Any] | None = None,
    zeroed_outputs: Sequence[Any] | Callable[[dict[str, Any]], Sequence[Any]] = (),
    out_names: str | Sequence[str] | None = None,
    backend_options: Mapping[str, Any] | None = None,
    has_side_effect: bool = False,
    cost_estimate: Mapping[str, Any] | None = None,
    target: str | None = None,
    embed: str | None = None,
    cache: CacheArg = None,
    name: str = "",
    serialized_metadata: bytes = b"",
    compute_capability: int | None = None,
    custom_call_target_name: str | None = None,
    **metaparams: Any,
) -> Any:
    """Call a Triton or Gluon kernel on JAX arrays.

    Works under ``jax.jit`` and eagerly. Call sites of jax-triton 0.3 (``out_shape=``) and 0.4
    (``out_type=``) run unchanged; the keyword describing the outputs selects the convention
    (see :mod:`bridge.tracing` and docs/bridge.md).

    Args:
        *args: the kernel's arguments: arrays, ``jax.Ref`` (updated in place), Python/NumPy
            scalars, ``bridge.TensorDescriptor``, tuples of these. With ``out_shape=`` they
            are the inputs in signature order; with ``out_type=`` they bind like a Python call.
        kernel: a ``@triton.jit`` or ``@gluon.jit`` function, optionally wrapped in
            ``@triton.autotune`` (every config compiled and cached; jaxlib picks the fastest at
            the first run) and ``@triton.heuristics``.
        out_shape: jax-triton 0.3: a ShapeDtypeStruct-like object or a pytree of them, the
            output pointers being the parameters after the positional arguments; or a dict
            ``{parameter name: shape}`` naming the output parameters (then the result is a dict).
        out_type: jax-triton 0.4: a pytree of ShapeDtypeStruct-like objects (dicts included);
            the outputs fill the non-constexpr parameters no argument fills, in order, and the
            result has the same structure.
        grid: up to three ints, or a function of the bound arguments (every parameter by name,
            including autotuned and heuristic values) returning them.
        num_warps, num_stages: compile options (Triton's defaults for the target when None).
        input_output_aliases: with ``out_shape=``: ``{input array index or parameter name:
            output index or name}`` (the output's buffer starts as the input's), or a sequence
            of input parameters updated in place and returned after the outputs. With
            ``out_type=``: ``{flattened operand index: flattened output index}``; the aliased
            output has no parameter of its own.
        zeroed_outputs: outputs (indices, or parameter names) zeroed before every launch, or a
            function of the bound arguments returning them.
        out_names: output parameter names, matching ``out_shape``'s leaves in order.
        backend_options: compile options as a dict (jax-triton 0.4); an option also given as a
            keyword is an error.
        has_side_effect: keep the call even where its results are unused.
        cost_estimate: ``{"flops": ..., "bytes_accessed": ...}`` for profilers (attached to the
            FFI custom call as ``cost_estimate_json``).
        target: "cuda:90", "hip:gfx942", ... (default ``$KERNELCACHE_TARGET``, else the device).
        embed: "auto", "inline", "ptx" or "path" (default ``$KERNELCACHE_EMBED``, else auto).
        cache: a ``kernelcache.Cache``, a cache root directory, or None for the default cache.
        name, serialized_metadata: the custom call's name and metadata (as in jax-triton).
        compute_capability: jax-triton's way to say ``target=f"cuda:{cc}"``.
        **metaparams: kernel parameters by name (constexprs, scalars, arrays), and options of
            the target's Triton backend (``num_ctas``, ``maxnreg``, ``enable_fp_fusion``,
            ``waves_per_eu``, ...). Unknown names are an error that lists the valid ones.

    Returns:
        The outputs, in the structure of ``out_type`` / ``out_shape`` (0.3: followed by inputs
        updated in place). Refs are updated in place and not returned.
    """
    if custom_call_target_name not in (None, CUSTOM_CALL_FFI, CUSTOM_CALL_LEGACY):
        raise KernelArgumentError(
            f"custom_call_target_name={custom_call_target_name!r}: the bridge emits jaxlib's "
            f"{CUSTOM_CALL_FFI} or {CUSTOM_CALL_LEGACY}, whichever the running jaxlib needs"
        )
    if out_shape is not None and out_type is not None:
        raise KernelArgumentError(
            "Cannot specify both out_type= (jax-triton 0.4: outputs fill the parameters no "
            "argument fills) and out_shape= (jax-triton 0.3: outputs follow the positional "
            "arguments); pass one"
        )
    if compute_capability is not None:
        if target is not None:
            raise KernelArgumentError("pass target= or compute_capability=, not both")
        target = f"cuda:{int(compute_capability)}"
    elif target is not None:
        targets.parse_target(target)
    if cost_estimate is not None and not isinstance(cost_estimate, Mapping):
        raise KernelArgumentError(
            f"cost_estimate must be a dict such as {{'flops': 1e9, 'bytes_accessed': 1e6}}, not "
            f"{cost_estimate!r}"
        )
    parts = decompose(kernel)
    params = set(parts.arg_names)
    kernel_kwargs = {k: v for k, v in metaparams.items() if k in params}
    explicit = {
        k: v for k, v in (("num_warps", num_warps), ("num_stages", num_stages)) if v is not None
    }
    option_kwargs = {k: v for k, v in metaparams.items() if k not in params}
    options = _options(parts, explicit, option_kwargs, backend_options)
    inputs = tracing.Inputs(parts)
    if out_type is not None:
        if out_names is not None:
            raise KernelArgumentError(
                "out_names= places outputs in the out_shape= (jax-triton 0.3) convention; with "
                "out_type= the outputs fill the parameters no argument fills"
            )
        plan = tracing.plan_04(parts, inputs, args, kernel_kwargs, out_type, input_output_aliases)
    else:
        plan = tracing.plan_03(
            parts,
            inputs,
            args,
            kernel_kwargs,
            () if out_shape is None else out_shape,
            out_names,
            input_output_aliases,
        )
        if inputs.refs and input_output_aliases:
            raise KernelArgumentError(
                "input_output_aliases cannot be combined with Ref arguments. Refs express "
                "input/output aliasing implicitly"
            )
    call, operands, finish = tracing.make_call(
        parts,
        inputs,
        plan,
        grid=grid,
        zeroed_outputs=zeroed_outputs,
        options=options,
        target=target,
        embed_mode=embed,
        cache=cache,
        name=name,
        serialized_metadata=serialized_metadata,
        cost_estimate=cost_estimate,
    )
    results = triton_call_p.bind(*operands, call=call, has_side_effect=bool(has_side_effect))
    return finish(list(results))
