"""``triton_call``: a Triton or Gluon kernel as a JAX primitive.

Tracing a call records the kernel, the abstract arguments and the output layout. Lowering for
"cuda" or "rocm" resolves the target, binds every variant (autotune config) with Triton's own
binder, computes each kernel key without compiling, takes the kernel from the cache (compiling
only on a miss), and emits jaxlib's Triton custom call with the machine code embedded.

Across processes: the same call, target, software and embedding give a byte-identical opaque
(no temporary paths, no absolute source paths, deterministic metadata and serialization), so
JAX's persistent compilation cache hits; on a warm kernel cache no Triton compile runs.

Buffers: jaxlib hands the kernel its array arguments in operand-then-result order. Inputs that
come after an output in the kernel signature are made to fit by passing such outputs as
zero-filled operands aliased to their results (one memset); outputs after the last input are
plain results.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import jax.extend
import numpy as np

try:  # the public homes of the primitive registries (jax 0.8 - 0.11)
    from jax.interpreters import ad, batching, mlir

    _ = (ad.primitive_jvps, batching.primitive_batchers, mlir.register_lowering)
except (ImportError, AttributeError):  # pragma: no cover - later releases
    from jax._src.interpreters import ad, batching, mlir  # type: ignore[no-redef]

from . import backends, binding, embed, handoff, proto, record, specialize, targets, versions
from .artifacts import KernelBinary, as_cache
from .binding import ArgArray
from .errors import KernelArgumentError, OptionError, UnsupportedTransformation
from .kernels import KernelParts, decompose

if TYPE_CHECKING:
    from kernelcache import Cache

    from .artifacts import CacheArg

logger = logging.getLogger(__name__)

CUSTOM_CALL_FFI = "triton_kernel_call_ffi"
CUSTOM_CALL_LEGACY = "triton_kernel_call"


@dataclass(frozen=True, eq=False)
class CallSpec:
    """Everything about one ``triton_call`` site except the array values (the primitive's
    static parameter; compared by identity)."""

    parts: KernelParts
    named: Mapping[str, Any]  # every argument given, by parameter name (ArgArray for arrays)
    kwargs: Mapping[str, Any]  # kernel parameters the caller set by keyword
    options: Mapping[str, Any]  # backend options the caller set
    grid: Any
    zeroed: Any  # output indices/names, or a function of the bound arguments returning them
    n_operands: int
    out_avals: tuple[Any, ...]  # results, in custom-call order
    buffers: Mapping[int, int]  # id(ArgArray) -> buffer index (operands, then results)
    aliases: tuple[tuple[int, int], ...]  # (operand, result)
    restore: tuple[tuple[int, int], ...]  # (operand, result) whose input must survive autotuning
    outputs: tuple[ArgArray, ...]  # user-visible outputs, in the user's order
    target: str | targets.Target | None
    embed: str | None
    cache: CacheArg
    name: str
    metadata: bytes


# -- the primitive ------------------------------------------------------------------------
triton_call_p = jax.extend.core.Primitive("kernelcache_triton_call")
triton_call_p.multiple_results = True


def _impl(*args: Any, call: CallSpec) -> Any:
    return jax.jit(lambda *a: triton_call_p.bind(*a, call=call))(*args)


triton_call_p.def_impl(_impl)


@triton_call_p.def_abstract_eval
def _abstract_eval(*avals: Any, call: CallSpec) -> tuple[Any, ...]:
    return call.out_avals


def _no_jvp(primals: Any, tangents: Any, *, call: CallSpec) -> Any:
    raise UnsupportedTransformation(
        f"cannot differentiate the Triton kernel {call.parts.qualname}: JAX cannot see inside "
        "it. Wrap the call in jax.custom_vjp (or custom_jvp) with a backward kernel or a jnp rule"
    )


def _vmap(args: Sequence[Any], dims: Sequence[Any], *, call: CallSpec) -> Any:
    """Batching by running the kernel once per batch element (``lax.map``): exactly the
    results of separate calls, in sequence. Write a batched kernel for speed."""
    batched = [i for i, d in enumerate(dims) if d is not None]
    moved = [jax.numpy.moveaxis(args[i], dims[i], 0) for i in batched]

    def one(xs: Sequence[Any]) -> Any:
        full = list(args)
        for i, x in zip(batched, xs, strict=True):
            full[i] = x
        return tuple(triton_call_p.bind(*full, call=call))

    outs = jax.lax.map(one, tuple(moved))
    return list(outs), [0] * len(outs)


ad.primitive_jvps[triton_call_p] = _no_jvp
batching.primitive_batchers[triton_call_p] = _vmap


def _no_cpu(ctx: Any, *args: Any, call: CallSpec) -> Any:
    raise KernelArgumentError(
        f"the Triton kernel {call.parts.qualname} runs on NVIDIA (cuda) or AMD (rocm) GPUs, but "
        "this computation is being lowered for cpu: run it on a GPU, or cross-compile with "
        "jax.jit(f).trace(*args).lower(lowering_platforms=('cuda',)) and a target= "
    )


# -- tracing: from a call to a CallSpec ---------------------------------------------------
def _is_struct(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _is_array(x: Any) -> bool:
    if isinstance(x, (np.generic, bool, int, float)):
        return False
    return isinstance(x, (jax.Array, np.ndarray)) or isinstance(x, jax.core.Tracer)


class _Inputs:
    """Turns call arguments into Triton values: arrays into ArgArray placeholders (recorded as
    operands), NumPy scalars into Python ones, tuples element-wise."""

    def __init__(self) -> None:
        self.arrays: list[ArgArray] = []
        self.values: list[Any] = []

    def convert(self, value: Any) -> Any:
        if _is_array(value):
            arr = jax.numpy.asarray(value)
            placeholder = ArgArray(arr.shape, arr.dtype, ("in", len(self.arrays)))
            self.arrays.append(placeholder)
            self.values.append(arr)
            return placeholder
        if isinstance(value, tuple):
            items = [self.convert(v) for v in value]
            return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
        if isinstance(value, list):
            raise KernelArgumentError("pass tuples, not lists, as tuple arguments of a kernel")
        if isinstance(value, np.bool_):
            return bool(value)
        if isinstance(value, np.integer):
            return int(value)
        if isinstance(value, np.floating):
            return float(value)
        return value


def _param_index(parts: KernelParts, ref: Any, what: str) -> str:
    names = parts.arg_names
    if isinstance(ref, str):
        if ref not in names:
            raise KernelArgumentError(
                f"{what} {ref!r} is not a parameter of {parts.qualname} ({', '.join(names)})"
            )
        return ref
    if isinstance(ref, (int, np.integer)) and 0 <= int(ref) < len(names):
        return names[int(ref)]
    raise KernelArgumentError(
        f"{what} {ref!r} is not a parameter name or index of {parts.qualname}"
    )


def _outputs(
    parts: KernelParts, n_args: int, out_shape: Any, out_names: Any
) -> tuple[list[str], list[Any], Callable[[list[Any]], Any]]:
    """Output parameter names, their shapes, and how to rebuild the caller's structure."""
    names = parts.arg_names
    if isinstance(out_shape, Mapping):
        keys_ = [_param_index(parts, k, "out_shape key") for k in out_shape]
        if out_names is not None:
            given = [out_names] if isinstance(out_names, (str, int)) else list(out_names)
            if {_param_index(parts, n, "out_names entry") for n in given} != set(keys_):
                raise KernelArgumentError(
                    "out_names and the keys of out_shape name different parameters"
                )
        shapes = list(out_shape.values())
        return keys_, shapes, lambda outs: dict(zip(keys_, outs, strict=True))
    leaves, tree = jax.tree_util.tree_flatten(out_shape, is_leaf=_is_struct)
    if any(not _is_struct(leaf) for leaf in leaves):
        raise KernelArgumentError(
            "out_shape must hold objects with .shape and .dtype (e.g. jax.ShapeDtypeStruct)"
        )
    if out_names is not None:
        given = [out_names] if isinstance(out_names, (str, int)) else list(out_names)
        outs = [_param_index(parts, n, "out_names entry") for n in given]
        if len(outs) != len(leaves):
            raise KernelArgumentError(
                f"out_names names {len(outs)} output(s) but out_shape describes {len(leaves)}"
            )
    else:
        if n_args + len(leaves) > len(names):
            raise KernelArgumentError(
                f"{parts.qualname} has {len(names)} parameters ({', '.join(names)}); "
                f"{n_args} positional argument(s) and {len(leaves)} output(s) do not fit. "
                "Outputs follow the positional arguments unless out_names= or a dict out_shape= "
                "names them"
            )
        outs = names[n_args : n_args + len(leaves)]
    if len(set(outs)) != len(outs):
        raise KernelArgumentError(f"an output parameter is named twice: {outs}")
    for p in parts.fn.params:
        if p.name in outs and p.is_constexpr:
            raise KernelArgumentError(
                f"output {p.name} of {parts.qualname} is a tl.constexpr: outputs are pointer "
                "parameters. Outputs follow the positional arguments unless out_names= or a dict "
                "out_shape= names them"
            )
    return outs, leaves, lambda flat: jax.tree_util.tree_unflatten(tree, flat)


def _leaf_arrays(value: Any) -> list[ArgArray]:
    if isinstance(value, ArgArray):
        return [value]
    if isinstance(value, tuple):
        return [a for v in value for a in _leaf_arrays(v)]
    return []


def make_call(
    args: Sequence[Any],
    *,
    kernel: Any,
    out_shape: Any,
    grid: Any,
    out_names: Any = None,
    input_output_aliases: Any = None,
    zeroed_outputs: Any = (),
    options: Mapping[str, Any],
    metaparams: Mapping[str, Any],
    target: str | targets.Target | None = None,
    embed_mode: str | None = None,
    cache: CacheArg = None,
    name: str = "",
    serialized_metadata: bytes = b"",
) -> tuple[CallSpec, list[Any], Callable[[list[Any]], Any]]:
    """Plan a call: returns its CallSpec, the operand values, and a function that turns the
    custom call's results into what ``triton_call`` returns."""
    parts = decompose(kernel)
    names = parts.arg_names
    out_params, out_structs, rebuild = _outputs(parts, len(args), out_shape, out_names)
    in_params = [n for n in names if n not in out_params]
    if len(args) > len(in_params):
        raise KernelArgumentError(
            f"{parts.qualname} takes {len(in_params)} input argument(s) ({', '.join(in_params)}) "
            f"besides its output(s) {', '.join(out_params)}; {len(args)} were given"
        )
    given: dict[str, Any] = dict(zip(in_params, args, strict=False))
    kwargs: dict[str, Any] = {}
    for key, value in metaparams.items():
        if key in out_params:
            raise KernelArgumentError(f"{key} is an output of {parts.qualname}: do not pass it")
        if key in given:
            raise KernelArgumentError(f"{parts.qualname} got {key} both by position and by keyword")
        kwargs[key] = value
    inputs = _Inputs()
    named: dict[str, Any] = {}
    outputs: dict[str, ArgArray] = {}
    for n in names:
        if n in out_params:
            s = out_structs[out_params.index(n)]
            outputs[n] = named[n] = ArgArray(s.shape, s.dtype, ("out", out_params.index(n)))
        elif n in given or n in kwargs:
            named[n] = inputs.convert(given[n] if n in given else kwargs[n])
    kwargs = {k: named[k] for k in kwargs}

    # roles of input arrays: aliased to an output parameter (0.3.x dict form) or in-place (list)
    alias_of: dict[str, ArgArray] = {}  # output param -> the input array it aliases
    inplace: list[ArgArray] = []
    if isinstance(input_output_aliases, Mapping):
        for src, dst in input_output_aliases.items():
            if isinstance(src, str):
                found = _leaf_arrays(
                    named.get(_param_index(parts, src, "input_output_aliases key"))
                )
                if len(found) != 1:
                    raise KernelArgumentError(f"input_output_aliases: {src} is not one input array")
                arr = found[0]
            elif isinstance(src, (int, np.integer)) and 0 <= int(src) < len(inputs.arrays):
                arr = inputs.arrays[int(src)]
            else:
                raise KernelArgumentError(
                    f"input_output_aliases key {src!r}: use the index of an input array "
                    f"(0..{len(inputs.arrays) - 1}) or an input parameter name"
                )
            out = (
                dst
                if isinstance(dst, str)
                else (out_params[int(dst)] if 0 <= int(dst) < len(out_params) else None)
            )
            if out not in outputs:
                raise KernelArgumentError(f"input_output_aliases value {dst!r} is not an output")
            o = outputs[out]
            if (o.shape, o.jax_dtype) != (arr.shape, arr.jax_dtype):
                raise KernelArgumentError(
                    f"input_output_aliases: output {out} {o} cannot alias input {arr}: shapes and "
                    "dtypes must match"
                )
            if arr in alias_of.values():
                raise KernelArgumentError(f"input_output_aliases: {arr} is aliased twice")
            alias_of[out] = arr
    elif input_output_aliases:
        refs = input_output_aliases
        if isinstance(refs, (str, int)):
            refs = [refs]
        for ref in refs:
            found = _leaf_arrays(named.get(_param_index(parts, ref, "input_output_aliases entry")))
            if not found:
                raise KernelArgumentError(f"input_output_aliases: {ref!r} is not an input array")
            inplace.extend(a for a in found if a not in inplace)

    # buffer layout: array leaves in signature order; operands up to the last input
    leaves = [a for n in names if n in named for a in _leaf_arrays(named[n])]
    last_in = max((i for i, a in enumerate(leaves) if a.slot[0] == "in"), default=-1)
    operands: list[Any] = []
    op_arrays: list[ArgArray] = []
    plain: list[ArgArray] = []
    extra: list[tuple[ArgArray, int]] = []  # results aliasing an operand
    restore: list[tuple[int, int]] = []
    in_values = dict(zip(map(id, inputs.arrays), inputs.values, strict=True))
    for i, a in enumerate(leaves):
        if i > last_in:
            plain.append(a)
            continue
        k = len(op_arrays)
        op_arrays.append(a)
        if a.slot[0] == "in":
            operands.append(in_values[id(a)])
            if a in inplace:
                extra.append((a, k))
        else:  # an output before the last input: a zero-filled operand aliased to its result
            src = alias_of.get(_name_of(named, a))
            operands.append(
                in_values[id(src)] if src is not None else jax.numpy.zeros(a.shape, a.jax_dtype)
            )
            extra.append((a, k))
    results = plain + [a for a, _ in extra]
    n_ops = len(op_arrays)
    buffers = {id(a): i for i, a in enumerate(op_arrays)}
    buffers.update({id(a): n_ops + j for j, a in enumerate(plain)})
    aliases: list[tuple[int, int]] = []
    for j, (a, k) in enumerate(extra):
        aliases.append((k, len(plain) + j))
        if a.slot[0] == "in" or alias_of.get(_name_of(named, a)) is not None:
            restore.append((k, len(plain) + j))
    for out, src in alias_of.items():
        o = outputs[out]
        if id(o) in buffers and buffers[id(o)] >= n_ops:  # a plain result aliasing an input
            if src not in op_arrays:
                raise KernelArgumentError(f"input_output_aliases: {src} is not an operand")
            k = op_arrays.index(src)
            aliases.append((k, buffers[id(o)] - n_ops))
            restore.append((k, buffers[id(o)] - n_ops))
    if len({k for k, _ in aliases}) != len(aliases):
        raise KernelArgumentError("input_output_aliases: an input buffer is aliased to two outputs")

    out_avals = tuple(jax.core.ShapedArray(a.shape, a.jax_dtype) for a in results)
    user_outputs = [outputs[n] for n in out_params] + inplace
    result_index = {id(a): j for j, a in enumerate(results)}

    def finish(flat: list[Any]) -> Any:
        outs = [flat[result_index[id(a)]] for a in user_outputs]
        regular = rebuild(outs[: len(out_params)])
        extras = outs[len(out_params) :]
        if not extras:
            return regular
        if isinstance(regular, dict):
            return {
                **regular,
                **{_name_of(named, a): x for a, x in zip(inplace, extras, strict=True)},
            }
        if not out_params:
            return extras[0] if len(extras) == 1 else tuple(extras)
        head = regular if isinstance(regular, tuple) else (regular,)
        return (*head, *extras)

    spec = CallSpec(
        parts=parts,
        named=named,
        kwargs=kwargs,
        options=dict(options),
        grid=grid,
        zeroed=zeroed_outputs,
        n_operands=n_ops,
        out_avals=out_avals,
        buffers=buffers,
        aliases=tuple(aliases),
        restore=tuple(restore),
        outputs=tuple(user_outputs),
        target=target,
        embed=embed_mode,
        cache=cache,
        name=name or parts.name,
        metadata=bytes(serialized_metadata),
    )
    return spec, operands, finish


def _name_of(named: Mapping[str, Any], arr: ArgArray) -> str:
    for n, v in named.items():
        if v is arr or (isinstance(v, tuple) and arr in _leaf_arrays(v)):
            return n
    return ""


# -- lowering -----------------------------------------------------------------------------
def _zeroed(call: CallSpec, bound: binding.Bound) -> dict[int, int]:
    """id(ArgArray) -> bytes to zero before each launch, for this variant."""
    spec = call.zeroed(dict(bound.bound_args)) if callable(call.zeroed) else call.zeroed
    refs = list(spec or ())
    out_names = [n for n, v in call.named.items() if isinstance(v, ArgArray) and v.slot[0] == "out"]
    result: dict[int, int] = {}
    for ref in refs:
        if isinstance(ref, str):
            arr = call.named.get(ref)
            if not isinstance(arr, ArgArray) or arr.slot[0] != "out":
                raise KernelArgumentError(f"zeroed_outputs: {ref!r} is not an output parameter")
        else:
            outs = [a for a in call.outputs if a.slot[0] == "out"]
            if not 0 <= int(ref) < len(outs):
                raise KernelArgumentError(
                    f"zeroed_outputs: {ref!r} is not an output index (0..{len(outs) - 1})"
                )
            arr = outs[int(ref)]
        result[id(arr)] = arr.nbytes
    for n in bound.variant.zero:  # the autotuner's reset_to_zero
        arr = call.named.get(n)
        if not isinstance(arr, ArgArray) or arr.slot[0] != "out":
            raise KernelArgumentError(
                f"{call.parts.qualname}: reset_to_zero names {n}, which is not an output "
                f"({', '.join(out_names)}); JAX inputs cannot be overwritten"
            )
        result[id(arr)] = arr.nbytes
    return result


def _kernel_message(
    call: CallSpec, target: targets.Target, mode: str, kb: KernelBinary, cache: Cache, jaxlib: str
) -> Any:
    m = proto.messages()
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
    if meta.get("tensordesc"):
        raise KernelArgumentError(
            f"{call.parts.qualname} uses tensor descriptors, which jaxlib's Triton call cannot pass"
        )
    kernel = m["TritonKernel"](
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
                f"{call.parts.qualname} needs {scratch} bytes of global scratch memory, which "
                f"jaxlib {jaxlib} does not provide: use jaxlib >= 0.11.1"
            )
        kernel.global_scratch_size = scratch
        kernel.global_scratch_align = int(meta.get("global_scratch_align", 1))
    if mode == "path":
        kernel.ptx = handoff.materialize(str(cache.root), f"{kb.key}.{kb.ext}", kb.binary)
        return kernel
    if target.backend == "cuda":
        kernel.ptx = embed.marked_ptx(kb.ptx or "", kb.key)
    else:
        kernel.ptx = embed.hsaco_token(kb.key, str(meta.get("digest", "")))
    if mode == "inline":
        kernel.module_image.object_file = kb.binary
        kernel.module_image.kernel_name = name
        kernel.module_image.shared_mem_bytes = shared
    return kernel


def _parameters(call_msg: Any, call: CallSpec, bound: binding.Bound, zero: dict[int, int]) -> None:
    expected = 0
    for leaf in bound.leaves:
        p = call_msg.parameters.add()
        if leaf.is_array:
            index = call.buffers.get(id(leaf.value))
            if index != expected:
                raise AssertionError(f"buffer order mismatch at {leaf}: {index} != {expected}")
            expected += 1
            p.array.bytes_to_zero = zero.get(id(leaf.value), 0)
            p.array.ptr_divisibility = leaf.divisibility
        else:
            field = binding.SCALAR_FIELDS[leaf.type]
            value = leaf.value
            setattr(
                p,
                field,
                bool(value)
                if field == "bool_"
                else float(value)
                if field in ("f32", "f64")
                else int(value),
            )
    if expected != len(call.buffers):
        raise AssertionError("the kernel's array parameters do not match the buffers")


#: kernels already fetched in this process: (key, target, cache root) -> KernelBinary
_memo: dict[tuple[str, str, str], KernelBinary] = {}


@dataclass(frozen=True)
class Lowered:
    """What a call lowers to: the opaque, the embedding, and whether jaxlib autotunes it."""

    opaque: bytes
    embed: str
    autotuned: bool


def custom_call_target(lowered: Lowered, jaxlib: str, forward_compat: bool = False) -> str:
    """``triton_kernel_call_ffi`` where jaxlib has it, except for autotuned calls: those go
    through the legacy ``triton_kernel_call``, as TransformerEngine does after observing
    illegal memory accesses with autotuned kernels on the FFI target (TE PR #3077)."""
    if versions.has_ffi_call(jaxlib) and not forward_compat and not lowered.autotuned:
        return CUSTOM_CALL_FFI
    return CUSTOM_CALL_LEGACY


def lower_call(call: CallSpec, platform: str, jaxlib: str | None = None) -> Lowered:
    """Build the opaque of ``call`` for ``platform``.

    This is the lowering minus the MLIR: usable to inspect what a call embeds.
    """
    from kernelcache.config import settings

    cfg = settings()
    target = targets.resolve(call.target, platform, cfg)
    jaxlib = jaxlib or versions.jaxlib_version()
    backends.check_options(target, set(call.options))
    mode = embed.resolve(call.embed, target, jaxlib, cfg)
    cache = as_cache(call.cache, cfg)
    m = proto.messages()
    configs = []
    for spec in specialize.specialize_call(
        call.parts, call.named, call.kwargs, call.options, target, cache
    ):
        bound = spec.bound
        memo_key = (spec.key, str(target), str(cache.root))
        kb = _memo.get(memo_key)
        if kb is None:
            kb = _memo[memo_key] = specialize.fetch(spec, cache)
        grid = binding.eval_grid(call.grid, bound.bound_args)
        kernel_call = m["TritonKernelCall"](
            kernel=_kernel_message(call, target, mode, kb, cache, jaxlib),
            grid_0=grid[0],
            grid_1=grid[1],
            grid_2=grid[2],
        )
        _parameters(kernel_call, call, bound, _zeroed(call, bound))
        configs.append((kernel_call, spec.variant.description))
        record.emit(_record(call, target, spec.key, bound, grid), cfg)
    anycall = m["TritonAnyKernelCall"](name=call.name, metadata=call.metadata)
    if len(configs) == 1 and mode != "path":
        anycall.kernel_call.CopyFrom(configs[0][0])
    else:
        tuned = anycall.autotuned_kernel_call
        tuned.name = f"{call.name} ({call.parts.qualname})"
        if len(configs) == 1:  # see bridge.handoff: jaxlib loads autotuned calls under its lock
            configs.append((configs[0][0], f"{configs[0][1]} (load guard)".strip()))
        for kernel_call, description in configs:
            c = tuned.configs.add(description=description)
            c.kernel_call.CopyFrom(kernel_call)
        for k, j in call.restore:
            tuned.input_output_aliases.add(
                input_buffer_idx=k,
                output_buffer_idx=call.n_operands + j,
                buffer_size_bytes=int(np.prod(call.out_avals[j].shape))
                * call.out_avals[j].dtype.itemsize,
            )
    opaque = proto.compress(proto.serialize(anycall))
    return Lowered(opaque, mode, anycall.HasField("autotuned_kernel_call"))


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


def _lower(ctx: Any, *operands: Any, call: CallSpec, platform: str) -> Any:
    lowered = lower_call(call, platform)
    aliases = dict(call.aliases)
    forward_compat = getattr(ctx, "is_forward_compat", lambda: False)()
    target = custom_call_target(lowered, versions.jaxlib_version(), forward_compat)
    if target == CUSTOM_CALL_FFI:
        rule = jax.ffi.ffi_lowering(target, api_version=4, operand_output_aliases=aliases)
        return rule(ctx, *operands, opaque=lowered.opaque)
    rule = jax.ffi.ffi_lowering(
        target,
        api_version=2,
        backend_config=lowered.opaque,  # type: ignore[arg-type]  # raw bytes, as jaxlib expects
        operand_output_aliases=aliases,
    )
    return rule(ctx, *operands)


mlir.register_lowering(triton_call_p, functools.partial(_lower, platform="cuda"), platform="cuda")
mlir.register_lowering(triton_call_p, functools.partial(_lower, platform="rocm"), platform="rocm")
mlir.register_lowering(triton_call_p, _no_cpu, platform="cpu")


# -- the public call ----------------------------------------------------------------------
def triton_call(
    *args: Any,
    kernel: Any,
    out_shape: Any = (),
    grid: Any,
    num_warps: int | None = None,
    num_stages: int | None = None,
    input_output_aliases: Mapping[Any, Any] | Sequence[Any] | None = None,
    zeroed_outputs: Sequence[Any] | Callable[[dict[str, Any]], Sequence[Any]] = (),
    out_names: str | Sequence[str] | None = None,
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

    Works under ``jax.jit`` and eagerly. Call sites of jax-triton 0.3.x run unchanged: inputs and
    scalars positional, output pointers after them in the kernel signature, ``out_shape`` a
    ShapeDtypeStruct or a sequence of them, metaparameters (constexprs) as keywords.

    Args:
        *args: inputs in signature order: arrays, Python/NumPy scalars, tuples of them.
        kernel: a ``@triton.jit`` or ``@gluon.jit`` function, optionally wrapped in
            ``@triton.autotune`` (every config compiled and cached; jaxlib picks the fastest at
            the first run) and ``@triton.heuristics``.
        out_shape: the outputs: a ShapeDtypeStruct-like object, a sequence (pytree) of them,
            or a dict ``{parameter name: shape}`` that names the output parameters anywhere in
            the signature (then the result is a dict).
        grid: up to three ints, or a function of the bound arguments (every parameter by name,
            including autotuned and heuristic values) returning them.
        num_warps, num_stages: compile options (Triton's defaults for the target when None).
        input_output_aliases: ``{input array index or parameter name: output index or name}``
            (the output's buffer starts as the input's), or a sequence of input parameter
            names/indices updated in place and returned after the outputs.
        zeroed_outputs: outputs (indices or names) zeroed before every launch, or a function of
            the bound arguments returning them.
        out_names: output parameter names, matching ``out_shape``'s leaves in order.
        target: "cuda:90", "hip:gfx942", ... (default ``$KERNELCACHE_TARGET``, else the device).
        embed: "auto", "inline", "ptx" or "path" (default ``$KERNELCACHE_EMBED``, else auto).
        cache: a ``kernelcache.Cache``, a cache root directory, or None for the default cache.
        name, serialized_metadata: the custom call's name and metadata (as in jax-triton).
        compute_capability: jax-triton's way to say ``target=f"cuda:{cc}"``.
        **metaparams: kernel parameters by name (constexprs and runtime values), and options of
            the target's Triton backend (``num_ctas``, ``maxnreg``, ``enable_fp_fusion``,
            ``waves_per_eu``, ...). Unknown names are an error that lists the valid ones.

    Returns:
        The outputs, in the structure of ``out_shape``, followed by in-place updated inputs.
    """
    if custom_call_target_name not in (None, CUSTOM_CALL_FFI, CUSTOM_CALL_LEGACY):
        raise KernelArgumentError(
            f"custom_call_target_name={custom_call_target_name!r}: the bridge emits jaxlib's "
            f"{CUSTOM_CALL_FFI} or {CUSTOM_CALL_LEGACY}, whichever the running jaxlib needs"
        )
    if compute_capability is not None:
        if target is not None:
            raise KernelArgumentError("pass target= or compute_capability=, not both")
        target = f"cuda:{int(compute_capability)}"
    elif target is not None:
        targets.parse_target(target)
    parts = decompose(kernel)
    params = set(parts.arg_names)
    options = {
        k: v for k, v in (("num_warps", num_warps), ("num_stages", num_stages)) if v is not None
    }
    kernel_kwargs: dict[str, Any] = {}
    for key, value in metaparams.items():
        if key in params:
            kernel_kwargs[key] = value
        else:
            options[key] = value
    known = backends.option_names("cuda") | backends.option_names("hip")
    unknown = sorted(set(options) - known) if known else []
    if unknown:
        raise OptionError(
            f"unknown keyword argument(s) {', '.join(unknown)} for {parts.qualname}: its "
            f"parameters are {', '.join(parts.arg_names)}; compile options are "
            f"{', '.join(sorted(known - backends.DERIVED_OPTIONS))}"
        )
    derived = sorted(set(options) & backends.DERIVED_OPTIONS)
    if derived:
        raise OptionError(f"{', '.join(derived)} follow(s) from the target: pass target= instead")
    call, operands, finish = make_call(
        args,
        kernel=kernel,
        out_shape=out_shape,
        grid=grid,
        out_names=out_names,
        input_output_aliases=input_output_aliases,
        zeroed_outputs=zeroed_outputs,
        options=options,
        metaparams=kernel_kwargs,
        target=target,
        embed_mode=embed,
        cache=cache,
        name=name,
        serialized_metadata=serialized_metadata,
    )
    results = triton_call_p.bind(*operands, call=call)
    return finish(list(results))
