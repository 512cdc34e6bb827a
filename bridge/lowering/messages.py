"""Assembling jaxlib's messages for a lowered call: the ``TritonKernel`` of each compiled variant,
its parameters (arrays, scalars, host-side TMA descriptors), and the ``TritonAnyKernelCall``
that holds them.

Invariants: a message is built only from the call, the target's descriptor and the metadata
fields the cache entry's digest covers, so the same call gives the same bytes in every process;
what jaxlib cannot launch (too many threads, profiling scratch, global scratch or descriptors
it does not support) is an error here, never a module that fails to load.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import versions
from ..call import binding
from ..call.binding import SCALAR_FIELDS
from ..call.placeholders import ArgArray
from ..embed import handoff, modes
from ..exceptions import KernelArgumentError, OptionError
from . import proto

if TYPE_CHECKING:
    from kernelcache import Cache

    from ..call.tracing import CallSpec
    from ..compile.fetch import KernelBinary
    from ..vendors.targets import Target


def zeroed_bytes(call: CallSpec, bound: binding.Bound) -> dict[int, int]:
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
    for name in bound.variant.zero:  # the autotuner's reset_to_zero, zero_() in a pre_hook
        arr = call.named.get(name)
        if not isinstance(arr, ArgArray) or id(arr) not in call.writable:
            writable = [
                n
                for n, v in call.named.items()
                if isinstance(v, ArgArray) and id(v) in call.writable
            ]
            raise KernelArgumentError(
                f"{call.parts.qualname}: {name} is zeroed before each launch (reset_to_zero, or "
                "zero_() in a pre_hook), but it is not an output or an input updated in place "
                f"({', '.join(writable) or 'none'}); JAX inputs cannot be overwritten"
            )
        result[id(arr)] = arr.nbytes
    return result


#: the most blocks a cluster launch holds (CUDA's limit on the GPUs that have clusters, with the
#: non-portable size allowed; Triton's ``num_ctas``)
MAX_CTAS = 16


def launch_refusal(
    qualname: str, meta: Mapping[str, Any], target: Target, jaxlib: str
) -> Exception | None:
    """Why a kernel whose entry's metadata is ``meta`` cannot be launched through ``jaxlib``
    (the error to raise), or None. A cached entry it refuses is compiled again first (see
    :mod:`bridge.lowering.configs`): only a compile's own metadata is ever said to the user."""
    vendor = target.vendor
    warps = int(meta["num_warps"])
    threads = warps * target.warp_size
    if threads > vendor.max_threads_per_block:
        return OptionError(
            f"{qualname} compiled to {warps} warps of {target.warp_size} threads "
            f"({threads}) on {target}; the limit is {vendor.max_threads_per_block} threads"
        )
    if threads % vendor.jaxlib_threads_per_warp:
        return OptionError(
            f"{qualname}: jaxlib launches {vendor.jaxlib_threads_per_warp} threads per "
            f"warp on {target.platform}; {warps} warps of {target.warp_size} ({threads} threads) "
            "cannot be launched: use an even num_warps"
        )
    ctas = int(meta.get("num_ctas", 1))
    if not 1 <= ctas <= MAX_CTAS:
        return OptionError(
            f"{qualname} compiled to a cluster of {ctas} blocks on {target}; a cluster holds "
            f"at most {MAX_CTAS}"
        )
    if int(meta.get("profile_scratch_size", 0)):
        return KernelArgumentError(
            f"{qualname} was compiled with profiling instrumentation (it needs a "
            "profile scratch buffer, which jaxlib passes as a null pointer): unset Triton's "
            "instrumentation mode (TRITON_INSTRUMENTATION_MODE / proton) for JAX calls"
        )
    scratch = int(meta.get("global_scratch_size", 0))
    if scratch and not versions.has_global_scratch(jaxlib):
        return KernelArgumentError(
            f"{qualname} needs {scratch} bytes of global scratch memory (device-side "
            f"tensor descriptors, tl.make_tensor_descriptor), which jaxlib {jaxlib} does not "
            "provide: use jaxlib >= 0.11.1"
        )
    return None


def kernel_message(
    call: CallSpec, target: Target, mode: str, kb: KernelBinary, cache: Cache, jaxlib: str
) -> proto.TritonKernel:
    """The ``TritonKernel`` of one compiled variant, its machine code embedded as ``mode``."""
    vendor = target.vendor
    meta = kb.meta  # read only fields the entry digest covers (kernelcache.schema.LAUNCH_FIELDS)
    refused = launch_refusal(call.parts.qualname, meta, target, jaxlib)
    if refused is not None:
        raise refused
    name, shared, warps = str(meta["name"]), int(meta["shared"]), int(meta["num_warps"])
    threads = warps * target.warp_size
    kernel = proto.TritonKernel(
        kernel_name=name,
        num_warps=threads // vendor.jaxlib_threads_per_warp,
        num_ctas=int(meta.get("num_ctas", 1)),
        shared_mem_bytes=shared,
        compute_capability=vendor.proto_compute_capability(target.arch),
    )
    scratch = int(meta.get("global_scratch_size", 0))
    if scratch:
        kernel.global_scratch_size = scratch
        kernel.global_scratch_align = int(meta.get("global_scratch_align", 1))
    if mode == "path":
        kernel.ptx = handoff.materialize(
            str(cache.root), modes.handoff_name(kb.ext, kb.binary), kb.binary
        )
        return kernel
    if vendor.has_ptx:
        ptx = kb.ptx or ""
        if mode == "ptx" or not versions.honours_module_image(jaxlib):  # jaxlib runs ptxas
            where = f"{call.parts.qualname} on {target}"
            ptx = modes.assembled_ptx(ptx, target, where, cache, strict=mode == "ptx")
        kernel.ptx = modes.marked_ptx(ptx, kb.binary)
    else:
        kernel.ptx = modes.binary_token(kb.ext, kb.binary)
    if mode == "inline":
        kernel.module_image = proto.ModuleImage(
            object_file=kb.binary, kernel_name=name, shared_mem_bytes=shared
        )
    return kernel


#: jaxlib's parameter for a scalar argument, by the field it travels in (SCALAR_FIELDS)
_SCALARS: dict[str, Callable[[Any], proto.Parameter]] = {
    "bool_": lambda v: proto.Parameter(bool_=bool(v)),
    "i32": lambda v: proto.Parameter(i32=int(v)),
    "u32": lambda v: proto.Parameter(u32=int(v)),
    "i64": lambda v: proto.Parameter(i64=int(v)),
    "u64": lambda v: proto.Parameter(u64=int(v)),
    "f32": lambda v: proto.Parameter(f32=float(v)),
    "f64": lambda v: proto.Parameter(f64=float(v)),
}


def _descriptor_parameters(
    call: CallSpec, desc: Any, meta: Mapping[str, Any], zero: dict[int, int]
) -> list[proto.Parameter]:
    """jaxlib's parameters for one host-side descriptor: the TMA descriptor (field 9), then
    the shape (i32) and strides (i64), as Triton's CUDA launcher passes them."""
    from ..call import tma

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
        proto.Parameter(tensor_descriptor=proto.DescriptorParameter(nvidia=tensor)),
        *(proto.Parameter(i32=d) for d in shape),
        *(proto.Parameter(i64=s) for s in strides),
    ]


def parameters(
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
            params += _descriptor_parameters(call, leaf.value, next(descs), zero)
        elif leaf.is_array:
            array = proto.Array(
                bytes_to_zero=zero.get(id(leaf.value), 0), ptr_divisibility=leaf.divisibility
            )
            params.append(proto.Parameter(array=array))
        else:
            params.append(_SCALARS[SCALAR_FIELDS[leaf.type]](leaf.value))
    if expected != len(call.buffers):
        raise AssertionError("the kernel's array parameters do not match the buffers")
    return params


def host_descriptor_count(call: CallSpec, bound: binding.Bound, target: Target, jaxlib: str) -> int:
    """How many host-side descriptors a call bound as ``bound`` takes, after checking
    ``target`` and jaxlib can pass them."""
    n = sum(leaf.is_descriptor for leaf in bound.leaves)
    if n and not target.vendor.host_tma(target.arch):
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


def descriptor_meta(meta: Mapping[str, Any], n: int) -> list[dict[str, Any]] | None:
    """The TMA metadata of an entry's ``n`` host-side descriptors, or None if it has not
    exactly that (an entry from an older bridge, or a damaged one)."""
    from ..call import tma

    found = tma.descriptor_meta(meta.get("tensordesc_meta"))
    return found if found is not None and len(found) == n else None


def kernel_call(
    call: CallSpec,
    kernel: proto.TritonKernel,
    bound: binding.Bound,
    desc_meta: Sequence[Mapping[str, Any]],
    grid: tuple[int, int, int],
) -> proto.TritonKernelCall:
    """The ``TritonKernelCall`` of one variant: its kernel message, grid and parameters."""
    return proto.TritonKernelCall(
        kernel=kernel,
        grid_0=grid[0],
        grid_1=grid[1],
        grid_2=grid[2],
        parameters=parameters(call, bound, zeroed_bytes(call, bound), desc_meta),
    )


def any_kernel_call(
    call: CallSpec, configs: list[proto.Config], mode: str
) -> proto.TritonAnyKernelCall:
    """What the opaque holds: the one kernel call, or jaxlib's autotuned call over every
    config (also for one config handed over by path: see :mod:`bridge.embed.handoff`)."""
    anycall = proto.TritonAnyKernelCall(name=call.name, metadata=call.metadata)
    if len(configs) == 1 and mode != "path":
        anycall.kernel_call = configs[0].kernel_call
        return anycall
    if len(configs) == 1:  # jaxlib loads autotuned calls under its lock
        guard = f"{configs[0].description} (load guard)".strip()
        configs = [*configs, proto.Config(kernel_call=configs[0].kernel_call, description=guard)]
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
    return anycall
