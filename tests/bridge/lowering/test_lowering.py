"""Lowering Triton and Gluon kernels for "cuda" and "rocm" on a machine without a GPU, and
checking what lands in the custom call: the machine code, the PTX, the launch parameters.

Lowerings as cache entries (``bridge.entries.lowerings``): a warm lowering is replayed from one
entry, the module is byte-identical to one built from the kernel entries, and nothing stale is
served after the kernel's source, a jitted dependency, Triton, jaxlib, a setting or a decision
changes (lowered for cuda: ``embed="ptx"`` under jaxlib < 0.11.1, inline above). These tests
take ``fresh``, a cache of their own; the others share the module's ``cache``.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import triton
import triton.language as tl
from bridge_helpers import (
    ELF_MAGIC,
    custom_calls,
    decoded,
    forget_lowerings,
    forget_programs,
    kernel_module,
    kernels_of,
    lowered_module,
)
from cli_support import kc, kc_json

import bridge
import kernelcache
from bridge import versions
from bridge.cli import tune
from bridge.compile import compiler as bridge_compile
from bridge.embed import ptxisa
from bridge.entries.kinds import derived_key
from bridge.identity import compiler_identity
from bridge.lowering import lower as bridge_call
from bridge.lowering import proto
from bridge.lowering import record as bridge_record
from bridge.lowering.configs import FETCHED
from bridge.vendors import backends
from examples import kernels as K
from examples import ops

F32 = jax.ShapeDtypeStruct((4096,), jnp.float32)
MODERN = versions.honours_module_image(versions.jaxlib_version())
#: the code object's target for gfx942: Triton 3.6 to 3.8, and Triton 3.9
HSACO_TRIPLES = (b"amdgcn-amd-amdhsa--gfx942", b"amdgpu9.42-amd-amdhsa-unknown-gfx942")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> kernelcache.Cache:
    """One kernel cache for the module: each kernel compiles once."""
    return kernelcache.Cache(root=tmp_path_factory.mktemp("bridge-kernels"))


def cubins(cache: kernelcache.Cache) -> dict[str, str]:
    """The key of each machine-code entry in ``cache``'s root, by the SHA-256 of its bytes (what
    the marker at the end of the embedded PTX names)."""
    keys = [path.stem for path in Path(cache.root).glob("*.cubin")]
    return {hashlib.sha256(cache.get(k, "cubin").data).hexdigest(): k for k in keys}


def marker(kernel: proto.TritonKernel) -> str:
    return kernel.ptx.rstrip().rsplit(" ", 1)[-1]


def add_fn(cache, **kw):
    return lambda x, y: ops.add(x, y, cache=cache, **kw)


# -- what is embedded -------------------------------------------------------------------
def test_cuda_inline_embeds_cubin_and_real_ptx(cache):
    (call,) = decoded(add_fn(cache, target="cuda:90", embed="inline"), F32, F32)
    (kernel,) = kernels_of(call)
    assert kernel.kernel_name == "add_kernel"
    assert kernel.HasField("module_image")
    cubin = kernel.module_image.object_file
    assert cubin[:4] == ELF_MAGIC
    assert kernel.module_image.kernel_name == "add_kernel"
    assert ".entry add_kernel" in kernel.ptx and ".target sm_90a" in kernel.ptx
    assert kernel.compute_capability == 90 and kernel.num_warps == 4 and kernel.num_ctas == 1
    # the PTX ends with the digest of the machine code: jaxlib's module cache (keyed on the
    # PTX text) never confuses two binaries
    assert marker(kernel) == hashlib.sha256(cubin).hexdigest()
    assert cache.get(cubins(cache)[marker(kernel)], "cubin").data == cubin
    # no absolute source paths anywhere in what is embedded
    files = [line for line in kernel.ptx.splitlines() if ".file" in line]
    assert files and all('"/' not in line for line in files), files
    assert str(Path(K.__file__).parent).encode() not in cubin


def test_cuda_ptx_mode_embeds_text_only(cache):
    (call,) = decoded(add_fn(cache, target="cuda:80", embed="ptx"), F32, F32)
    (kernel,) = kernels_of(call)
    assert not kernel.HasField("module_image")
    assert ".target sm_80" in kernel.ptx and kernel.compute_capability == 80


def test_rocm_inline_embeds_hsaco_and_a_token(cache):
    (call,) = decoded(add_fn(cache, target="hip:gfx942", embed="inline"), F32, F32, platform="rocm")
    (kernel,) = kernels_of(call)
    hsaco = kernel.module_image.object_file
    assert hsaco[:4] == ELF_MAGIC and any(t in hsaco for t in HSACO_TRIPLES)
    assert kernel.ptx == f"kernelcache:hsaco:{hashlib.sha256(hsaco).hexdigest()}"
    assert kernel.compute_capability == 0
    # 4 warps of 64 threads; jaxlib's HIP launcher also counts 64 threads per warp
    assert kernel.num_warps == 4


def test_inline_under_an_old_jaxlib_warns(cache, monkeypatch, caplog):
    monkeypatch.setattr(versions, "jaxlib_version", lambda: "0.10.0")
    with caplog.at_level("WARNING", logger="bridge"):
        (call,) = decoded(
            add_fn(cache, target="hip:gfx90a", embed="inline"), F32, F32, platform="rocm"
        )
    assert kernels_of(call)[0].module_image.object_file[:4] == ELF_MAGIC
    assert "ignores TritonKernel.module_image" in caplog.text


def test_rdna_warp_geometry_is_converted_for_jaxlib(cache):
    """gfx1100 runs wave32; jaxlib's HIP launcher counts 64 threads per warp."""
    (call,) = decoded(
        add_fn(cache, target="hip:gfx1100", embed="inline"), F32, F32, platform="rocm"
    )
    (kernel,) = kernels_of(call)
    assert kernel.num_warps == 2  # 4 warps x 32 threads = 128 threads = 2 jaxlib warps


def test_auto_embed_follows_the_running_jaxlib(cache):
    (call,) = decoded(add_fn(cache, target="cuda:90"), F32, F32)
    (kernel,) = kernels_of(call)
    assert kernel.HasField("module_image") == MODERN


def test_env_var_selects_embed_and_target(cache, monkeypatch):
    monkeypatch.setenv("KERNELCACHE_EMBED", "ptx")
    monkeypatch.setenv("KERNELCACHE_TARGET", "cuda:80")
    (call,) = decoded(add_fn(cache), F32, F32)
    (kernel,) = kernels_of(call)
    assert not kernel.HasField("module_image") and kernel.compute_capability == 80


def test_parameters_match_the_kernel_abi(cache):
    (call,) = decoded(add_fn(cache, target="cuda:90"), F32, F32)
    kc = call.kernel_call
    assert (kc.grid_0, kc.grid_1, kc.grid_2) == (4, 1, 1)
    kinds = [p.WhichOneof("value") for p in kc.parameters]
    assert kinds == ["array", "array", "i32", "array"]
    assert [p.array.ptr_divisibility for p in kc.parameters if p.HasField("array")] == [16] * 3
    assert kc.parameters[2].i32 == 4096
    assert call.name == "add_kernel"


def test_custom_call_target_follows_jaxlib(cache, monkeypatch):
    (new,) = custom_calls(lowered_module(add_fn(cache, target="cuda:90"), F32, F32))
    if versions.has_ffi_call(versions.jaxlib_version()):
        assert new["target"] == "triton_kernel_call_ffi"
    monkeypatch.setattr(versions, "jaxlib_version", lambda: "0.9.2")
    (old,) = custom_calls(lowered_module(add_fn(cache, target="cuda:90"), F32, F32))
    assert old["target"] == "triton_kernel_call" and old["api_version"] == 2
    assert proto.decode_opaque(old["opaque"]).kernel_call.kernel.kernel_name == "add_kernel"


def test_autotuned_calls_use_the_legacy_target(cache):
    a = jax.ShapeDtypeStruct((256, 128), jnp.bfloat16)
    b = jax.ShapeDtypeStruct((128, 256), jnp.bfloat16)
    (cc,) = custom_calls(
        lowered_module(lambda x, y: ops.matmul(x, y, target="cuda:90", cache=cache), a, b)
    )
    assert cc["target"] == "triton_kernel_call" and cc["api_version"] == 2
    assert len(proto.decode_opaque(cc["opaque"]).autotuned_kernel_call.configs) == 4


def test_cache_entry_metadata(cache):
    (call,) = decoded(add_fn(cache, target="cuda:90", embed="inline"), F32, F32)
    key = cubins(cache)[marker(call.kernel_call.kernel)]
    art = cache.get(key, "cubin")
    meta = dict(art.meta)
    assert meta["name"] == "add_kernel" and meta["target"] == "cuda:90"
    assert meta["kernel"] == "examples.kernels:add_kernel"
    assert meta["num_warps"] == 4 and meta["num_ctas"] == 1 and meta["shared"] == 0
    assert meta["global_scratch_size"] == 0 and meta["producer"]["triton"] == triton.__version__
    text = json.dumps(meta)
    assert '"/' not in text, "absolute paths in the metadata"
    ptx = cache.get(derived_key(key, "ptx"), "ptx")
    assert ptx is not None and ".entry add_kernel" in ptx.data.decode()


# -- kernels ----------------------------------------------------------------------------
def test_softmax(cache):
    x = jax.ShapeDtypeStruct((64, 1000), jnp.float32)
    (call,) = decoded(lambda a: ops.softmax(a, target="cuda:90", cache=cache), x)
    (kernel,) = kernels_of(call)
    assert kernel.kernel_name == "softmax_kernel" and kernel.num_warps == 4
    assert call.kernel_call.grid_0 == 64


def test_autotuned_matmul_compiles_every_config(cache):
    a = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16)
    b = jax.ShapeDtypeStruct((256, 384), jnp.bfloat16)
    (call,) = decoded(lambda x, y: ops.matmul(x, y, target="cuda:90", cache=cache), a, b)
    tuned = call.autotuned_kernel_call
    assert len(tuned.configs) == 4
    grids = [(c.kernel_call.grid_0, c.kernel_call.grid_1) for c in tuned.configs]
    assert grids == [(4, 3), (4, 6), (8, 3), (8, 6)]
    warps = [c.kernel_call.kernel.num_warps for c in tuned.configs]
    assert warps == [8, 4, 4, 4]
    assert "BM: 128, BN: 128, BK: 64" in tuned.configs[0].description
    markers = {marker(c.kernel_call.kernel) for c in tuned.configs}
    assert len(markers) == 4 and markers <= cubins(cache).keys()
    assert all(c.kernel_call.kernel.shared_mem_bytes > 0 for c in tuned.configs)


def test_autotune_configs_conflicting_with_explicit_values_are_dropped(cache):
    a = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16)
    fn = lambda x, y: ops.matmul(x, y, target="cuda:90", cache=cache, BM=64)  # noqa: E731
    (call,) = decoded(fn, a, jax.ShapeDtypeStruct((256, 384), jnp.bfloat16))
    assert len(call.autotuned_kernel_call.configs) == 2
    with pytest.raises(bridge.KernelArgumentError, match="every autotune config"):
        decoded(
            lambda x, y: ops.matmul(x, y, target="cuda:90", cache=cache, BM=32),
            a,
            jax.ShapeDtypeStruct((256, 384), jnp.bfloat16),
        )


def test_heuristics_decide_a_constexpr(cache):
    def copy(x):
        return bridge.triton_call(
            x,
            x.size,
            kernel=K.heuristic_copy_kernel,
            out_shape=x,
            grid=(triton.cdiv(x.size, 256),),
            BLOCK=256,
            target="cuda:90",
            cache=cache,
        )

    (even,) = decoded(copy, jax.ShapeDtypeStruct((1024,), jnp.float32))
    (odd,) = decoded(copy, jax.ShapeDtypeStruct((1000,), jnp.float32))
    ke, ko = kernels_of(even)[0], kernels_of(odd)[0]
    assert ke.ptx != ko.ptx
    assert "setp" not in ke.ptx.split(".entry")[1].split("ret;")[0] or len(ke.ptx) < len(ko.ptx)


@triton.jit
def even_copy_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    """out = x, unmasked where a heuristic says n is a multiple of BLOCK."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = (offs >= 0) if EVEN else (offs < n)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


@pytest.mark.parametrize(
    "autotuned, sizes, answers",
    [
        (False, (1024, 1000), [[True], [False]]),  # jax-triton 0.4's test_heuristics
        (True, (1024, 1152), [[True, True], [True, False]]),  # test_autotune_with_heuristics
    ],
)
def test_heuristics_run_once_per_config_per_lowering(
    tmp_path, assembled, autotuned, sizes, answers
):
    """A heuristic that records its answers is called once per config in each lowering: the
    first (which compiles and stores it) and a warm one (served from its lowering entry)."""
    cache = kernelcache.Cache(tmp_path, readonly_roots=(), remote="")
    seen: list[bool] = []

    def even(args):
        seen.append(args["n"] % args["BLOCK"] == 0)
        return seen[-1]

    kernel = triton.heuristics({"EVEN": even})(even_copy_kernel)
    pinned = {"BLOCK": 128}
    if autotuned:
        configs = [triton.Config({"BLOCK": 128}), triton.Config({"BLOCK": 256})]
        kernel, pinned = triton.autotune(configs, key=["n"])(kernel), {}

    def copy(x):
        return bridge.triton_call(
            x,
            x.size,
            kernel=kernel,
            out_shape=x,
            grid=lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),),
            target="cuda:90",
            cache=cache,
            **pinned,
        )

    for n, want in zip(sizes, answers, strict=True):
        for lowering, built in (("first", 1), ("warm", 0)):
            seen.clear()
            assembled.clear()
            decoded(lambda x: copy(x), jax.ShapeDtypeStruct((n,), jnp.float32))  # (JAX lowers anew)
            assert seen == want, f"{lowering} lowering of n={n}"
            assert len(assembled) == built


def test_do_not_specialize_shares_one_binary(cache):
    def copy(x):
        return bridge.triton_call(
            x,
            x.size,
            kernel=K.copy_dns_kernel,
            out_shape=x,
            grid=(triton.cdiv(x.size, 256),),
            BLOCK=256,
            target="cuda:90",
            cache=cache,
        )

    (a,) = decoded(copy, jax.ShapeDtypeStruct((1024,), jnp.float32))
    (b,) = decoded(copy, jax.ShapeDtypeStruct((1000,), jnp.float32))
    (c,) = decoded(copy, jax.ShapeDtypeStruct((1,), jnp.float32))  # 1 would be a constexpr
    binaries = {kernels_of(x)[0].ptx for x in (a, b, c)}
    assert len(binaries) == 1
    assert [p.i32 for p in c.kernel_call.parameters if p.WhichOneof("value") == "i32"] == [1]


def test_integer_specialization_follows_triton(cache):
    """Without do_not_specialize, n=1 becomes a constexpr and n%16==0 a divisibility hint."""

    def add_n(x):
        return bridge.triton_call(
            x,
            x,
            x.size,
            kernel=K.add_kernel,
            out_shape=x,
            grid=(1,),
            BLOCK=256,
            target="cuda:90",
            cache=cache,
        )

    (one,) = decoded(add_n, jax.ShapeDtypeStruct((1,), jnp.float32))
    (many,) = decoded(add_n, jax.ShapeDtypeStruct((33,), jnp.float32))
    assert [p.WhichOneof("value") for p in one.kernel_call.parameters] == ["array"] * 3
    assert [p.WhichOneof("value") for p in many.kernel_call.parameters] == [
        "array",
        "array",
        "i32",
        "array",
    ]


def test_tuple_argument(cache):
    def pair(a, b):
        return bridge.triton_call(
            (a, b),
            a.size,
            kernel=K.pair_sum_kernel,
            out_shape=a,
            grid=(4,),
            BLOCK=1024,
            target="cuda:90",
            cache=cache,
        )

    (call,) = decoded(pair, F32, jax.ShapeDtypeStruct((4096,), jnp.float16))
    kinds = [p.WhichOneof("value") for p in call.kernel_call.parameters]
    assert kinds == ["array", "array", "i32", "array"]
    assert "ld.global.b16" in kernels_of(call)[0].ptx or ".f16" in kernels_of(call)[0].ptx


def test_scalar_types(cache):
    @triton.jit
    def scalars_kernel(x_ptr, f, big, flag, out_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        v = tl.load(x_ptr + offs) * f + big.to(tl.float32)
        if flag:
            v = -v
        tl.store(out_ptr + offs, v)

    def fn(x):
        return bridge.triton_call(
            x,
            0.5,
            2**40,
            True,
            kernel=scalars_kernel,
            out_shape=x,
            grid=(1,),
            BLOCK=128,
            target="cuda:90",
            cache=cache,
        )

    (call,) = decoded(fn, jax.ShapeDtypeStruct((128,), jnp.float32))
    params = call.kernel_call.parameters
    assert [p.WhichOneof("value") for p in params] == ["array", "f32", "i64", "bool_", "array"]
    assert params[1].f32 == 0.5 and params[2].i64 == 2**40 and params[3].bool_ is True


# -- naming outputs, aliasing, zeroing --------------------------------------------------
def test_out_names_put_outputs_anywhere(cache):
    def scale(x):
        return bridge.triton_call(
            x,
            x.size,
            2.0,
            kernel=K.scale_kernel,
            out_names="out_ptr",
            out_shape=x,
            grid=(4,),
            BLOCK=1024,
            target="cuda:90",
            cache=cache,
        )

    low = lowered_module(scale, F32)
    (cc,) = custom_calls(low)
    # out_ptr precedes x_ptr in the signature: it rides as a zero-filled aliased operand
    assert cc["operands"] == 2 and cc["results"] == 1 and "operand_index = 0" in cc["aliases"]
    assert "stablehlo.broadcast" in low.as_text() or "stablehlo.constant" in low.as_text()
    call = proto.decode_opaque(cc["opaque"])
    assert [p.WhichOneof("value") for p in call.kernel_call.parameters] == [
        "array",
        "array",
        "i32",
        "f32",
    ]
    out = jax.eval_shape(scale, F32)
    assert out.shape == (4096,)


def test_dict_out_shape_returns_a_dict(cache):
    def scale(x):
        return bridge.triton_call(
            x,
            x.size,
            2.0,
            kernel=K.scale_kernel,
            out_shape={"out_ptr": x},
            grid=(4,),
            BLOCK=1024,
            target="cuda:90",
            cache=cache,
        )

    out = jax.eval_shape(scale, F32)
    assert set(out) == {"out_ptr"} and out["out_ptr"].shape == (4096,)
    (call,) = decoded(scale, F32)
    assert kernels_of(call)[0].kernel_name == "scale_kernel"


def test_input_output_aliases_in_place(cache):
    def axpy(y, x):
        return bridge.triton_call(
            y,
            x,
            3.0,
            y.size,
            kernel=K.axpy_inplace_kernel,
            input_output_aliases=["y_ptr"],
            grid=(4,),
            BLOCK=1024,
            target="cuda:90",
            cache=cache,
        )

    (cc,) = custom_calls(lowered_module(axpy, F32, F32))
    assert cc["operands"] == 2 and cc["results"] == 1 and "operand_index = 0" in cc["aliases"]
    assert jax.eval_shape(axpy, F32, F32).shape == (4096,)


def test_input_output_aliases_dict_form(cache):
    """jax-triton 0.3.x: {input array index: output index}; the output has its own pointer."""

    def add_into_x(x, y):
        return bridge.triton_call(
            x,
            y,
            x.size,
            kernel=K.add_kernel,
            out_shape=x,
            input_output_aliases={0: 0},
            grid=(4,),
            BLOCK=1024,
            target="cuda:90",
            cache=cache,
        )

    (cc,) = custom_calls(lowered_module(add_into_x, F32, F32))
    assert cc["operands"] == 2 and cc["results"] == 1 and "operand_index = 0" in cc["aliases"]


def test_autotuned_in_place_call_restores_inputs(cache):
    @triton.autotune(
        configs=[triton.Config({"BLOCK": 256}), triton.Config({"BLOCK": 512})], key=["n"]
    )
    @triton.jit
    def tuned_axpy(y_ptr, x_ptr, a, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(
            y_ptr + offs,
            tl.load(y_ptr + offs, mask=mask) + a * tl.load(x_ptr + offs, mask=mask),
            mask=mask,
        )

    def fn(y, x):
        return bridge.triton_call(
            y,
            x,
            2.0,
            y.size,
            kernel=tuned_axpy,
            input_output_aliases=["y_ptr"],
            grid=lambda m: (triton.cdiv(m["n"], m["BLOCK"]),),
            target="cuda:90",
            cache=cache,
        )

    (call,) = decoded(fn, F32, F32)
    aliases = list(call.autotuned_kernel_call.input_output_aliases)
    # buffers are operands then results: operand 0 (y) is aliased to buffer 2 (result 0)
    assert [(a.input_buffer_idx, a.output_buffer_idx, a.buffer_size_bytes) for a in aliases] == [
        (0, 2, 4096 * 4)
    ]


def test_zeroed_outputs(cache):
    def count(x):
        return bridge.triton_call(
            x,
            x.size,
            kernel=K.atomic_count_kernel,
            out_shape=jax.ShapeDtypeStruct((1,), jnp.int32),
            zeroed_outputs=(0,),
            grid=(4,),
            BLOCK=1024,
            target="cuda:90",
            cache=cache,
        )

    (call,) = decoded(count, F32)
    arrays = [p.array for p in call.kernel_call.parameters if p.HasField("array")]
    assert [a.bytes_to_zero for a in arrays] == [0, 4]


# -- Gluon ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "target, platform, warp", [("cuda:90", "cuda", 32), ("hip:gfx942", "rocm", 64)]
)
def test_gluon_both_vendors(cache, target, platform, warp):
    def fn(x):
        return ops.gluon_scale(
            x,
            3.0,
            warp_size=warp,
            target=target,
            embed="inline",
            cache=cache,
        )

    (call,) = decoded(fn, F32, platform=platform)
    (kernel,) = kernels_of(call)
    assert kernel.kernel_name == "gluon_scale_kernel"
    assert kernel.module_image.object_file[:4] == ELF_MAGIC


def test_gluon_layout_needs_the_target_warp_size(cache):
    fn = lambda x: ops.gluon_scale(x, 3.0, warp_size=32, target="hip:gfx942", cache=cache)  # noqa: E731
    with pytest.raises(RuntimeError) as info:
        decoded(fn, F32, platform="rocm")
    assert any("64 threads per warp on hip:gfx942" in n for n in info.value.__notes__)


# -- options and errors -----------------------------------------------------------------
def test_backend_options_are_part_of_the_key(cache):
    def key_with(**kw):
        (call,) = decoded(add_fn(cache, target="cuda:90", **kw), F32, F32)
        return kernels_of(call)[0].ptx.rstrip().rsplit(" ", 1)[-1]

    base = key_with()
    assert key_with(maxnreg=64) != base
    assert key_with(enable_fp_fusion=False) != base
    assert key_with(num_warps=8) != base
    assert key_with() == base


def test_amd_options(cache):
    (call,) = decoded(add_fn(cache, target="hip:gfx942", waves_per_eu=2), F32, F32, platform="rocm")
    assert kernels_of(call)[0].kernel_name == "add_kernel"
    with pytest.raises(bridge.OptionError, match=r"waves_per_eu.*valid options are.*maxnreg"):
        decoded(add_fn(cache, target="cuda:90", waves_per_eu=2), F32, F32)


def test_unknown_option_lists_the_valid_ones(cache):
    with pytest.raises(bridge.OptionError, match=r"maxnregs.*parameters are x_ptr.*maxnreg"):
        jax.eval_shape(add_fn(cache, target="cuda:90", maxnregs=64), F32, F32)


def test_too_many_warps(cache):
    with pytest.raises(bridge.OptionError, match="1024"):
        decoded(add_fn(cache, target="cuda:90", num_warps=64), F32, F32)
    with pytest.raises(bridge.OptionError, match="num_warps <= 16"):
        decoded(add_fn(cache, target="hip:gfx942", num_warps=32), F32, F32, platform="rocm")


def test_launch_attributes_jaxlib_cannot_launch_with_are_refused(cache):
    """launch_pdl and launch_cooperative_grid are launch attributes of Triton's launcher; jaxlib's
    Triton call has no field for them, so turning one on is refused, in a call or a config."""
    with pytest.raises(
        bridge.OptionError, match=r"launch_pdl=True asks .*programmatic dependent launch.*no field"
    ):
        decoded(add_fn(cache, target="cuda:90", launch_pdl=True), F32, F32)
    for target, platform in (("cuda:90", "cuda"), ("hip:gfx942", "rocm")):
        with pytest.raises(bridge.OptionError, match=r"launch_cooperative_grid=True .*deadlock"):
            fn = add_fn(cache, target=target, launch_cooperative_grid=True)
            decoded(fn, F32, F32, platform=platform)
    off = add_fn(cache, target="cuda:90", launch_pdl=False, launch_cooperative_grid=False)
    assert decoded(off, F32, F32) == decoded(add_fn(cache, target="cuda:90"), F32, F32)

    configs = [triton.Config({"BLOCK": 256}), triton.Config({"BLOCK": 512, "launch_pdl": True})]
    tuned = triton.autotune(configs, key=["n"])(K.add_kernel)
    with pytest.raises(bridge.OptionError, match=r"autotune config BLOCK: 512.*launch_pdl=True"):
        decoded(
            lambda x, y: bridge.triton_call(
                x, y, x.size, kernel=tuned, out_shape=x, grid=(8,), target="cuda:90", cache=cache
            ),
            F32,
            F32,
        )


def test_bad_target_string(cache):
    with pytest.raises(bridge.TargetError, match="cuda:90"):
        jax.eval_shape(add_fn(cache, target="volta"), F32, F32)


def test_target_of_the_other_vendor(cache):
    with pytest.raises(bridge.TargetError, match="rocm target"):
        decoded(add_fn(cache, target="hip:gfx942"), F32, F32, platform="cuda")


def test_no_target_and_no_device(cache):
    with pytest.raises(bridge.TargetError, match="KERNELCACHE_TARGET"):
        decoded(add_fn(cache), F32, F32)


def test_embed_modes_that_cannot_work(cache, monkeypatch):
    with pytest.raises(bridge.EmbedError, match="ROCm"):
        decoded(add_fn(cache, target="cuda:90", embed="path"), F32, F32)
    with pytest.raises(bridge.EmbedError, match="CUDA"):
        decoded(add_fn(cache, target="hip:gfx942", embed="ptx"), F32, F32, platform="rocm")
    with pytest.raises(bridge.EmbedError, match="not one of"):
        decoded(add_fn(cache, target="cuda:90", embed="cubin"), F32, F32)


def test_bad_arguments(cache):
    with pytest.raises(bridge.KernelArgumentError, match="not a Triton kernel"):
        bridge.triton_call(jnp.ones(4), kernel=lambda x: x, out_shape=F32, grid=(1,))
    with pytest.raises(bridge.KernelArgumentError, match="do not fit"):
        jax.eval_shape(
            lambda x: bridge.triton_call(
                x, x, x, x, x, kernel=K.add_kernel, out_shape=x, grid=(1,)
            ),
            F32,
        )
    with pytest.raises(bridge.KernelArgumentError, match=r"BLOCK of .* is a tl.constexpr"):
        jax.eval_shape(
            lambda x: bridge.triton_call(x, x, x, x, kernel=K.add_kernel, out_shape=x, grid=(1,)),
            F32,
        )
    with pytest.raises(bridge.KernelArgumentError, match="both by position and by keyword"):
        jax.eval_shape(
            lambda x: bridge.triton_call(x, x, 3, kernel=K.add_kernel, out_shape=x, grid=(1,), n=3),
            F32,
        )
    with pytest.raises(
        bridge.KernelArgumentError, match=r"missing 1 required positional argument: .BLOCK"
    ):
        decoded(
            lambda x: bridge.triton_call(
                x,
                x,
                x.size,
                kernel=K.add_kernel,
                out_shape=x,
                grid=(1,),
                target="cuda:90",
                cache=cache,
            ),
            F32,
        )
    with pytest.raises(bridge.KernelArgumentError, match="empty dimension"):
        decoded(
            lambda x, y: bridge.triton_call(
                x,
                y,
                x.size,
                kernel=K.add_kernel,
                out_shape=x,
                grid=(0,),
                BLOCK=1024,
                target="cuda:90",
                cache=cache,
            ),
            F32,
            F32,
        )
    with pytest.raises(bridge.KernelArgumentError, match="complex64"):
        jax.eval_shape(
            lambda x: bridge.triton_call(
                x, x, 4, kernel=K.add_kernel, out_shape=x, grid=(1,), BLOCK=4
            ),
            jax.ShapeDtypeStruct((4,), jnp.complex64),
        )


def test_lowering_for_cpu_says_why(cache):
    with pytest.raises(bridge.KernelArgumentError, match="lowered for cpu"):
        lowered_module(add_fn(cache, target="cuda:90"), F32, F32, platform="cpu")


# -- JAX transformations ----------------------------------------------------------------
def test_grad_is_a_clear_error(cache):
    f = lambda x: jnp.sum(ops.add(x, x, target="cuda:90", cache=cache))  # noqa: E731
    with pytest.raises(bridge.UnsupportedTransformation, match="custom_vjp"):
        jax.jit(jax.grad(f)).trace(jnp.ones(4096)).lower(lowering_platforms=("cuda",))


def test_vmap_runs_the_kernel_per_batch_element(cache):
    f = jax.vmap(add_fn(cache, target="cuda:90"), in_axes=(0, None))
    batch = jax.ShapeDtypeStruct((3, 4096), jnp.float32)
    assert jax.eval_shape(f, batch, F32).shape == (3, 4096)
    low = lowered_module(f, batch, F32)
    assert "stablehlo.while" in low.as_text()
    (cc,) = custom_calls(low)
    assert proto.decode_opaque(cc["opaque"]).kernel_call.kernel.kernel_name == "add_kernel"


# -- the cache --------------------------------------------------------------------------
def test_a_miss_compiles_once_then_hits(tmp_path):
    FETCHED.clear()
    root = tmp_path / "cold"
    before = bridge_compile.compile_count()
    decoded(lambda x, y: ops.add(x, y, target="cuda:75", cache=str(root)), F32, F32)
    assert bridge_compile.compile_count() == before + 1
    FETCHED.clear()
    decoded(lambda x, y: ops.add(x, y, target="cuda:75", cache=str(root)), F32, F32)
    assert bridge_compile.compile_count() == before + 1
    names = sorted(p.suffix for p in root.iterdir() if p.is_file())
    assert names.count(".cubin") == 1 and names.count(".ptx") == 1


def test_pruned_ptx_companion_is_rebuilt(tmp_path):
    FETCHED.clear()
    cache = kernelcache.Cache(root=tmp_path / "c")
    (first,) = decoded(add_fn(cache, target="cuda:75"), F32, F32)
    for p in (tmp_path / "c").glob("*.ptx"):
        os.unlink(p)
    forget_lowerings(tmp_path / "c")
    FETCHED.clear()
    (second,) = decoded(add_fn(cache, target="cuda:75"), F32, F32)
    assert kernels_of(first)[0].ptx == kernels_of(second)[0].ptx
    assert len(list((tmp_path / "c").glob("*.ptx"))) == 1


def test_edited_launch_metadata_is_rebuilt_never_lowered(tmp_path):
    """num_warps 4 -> 8 and shared 0 -> 8 edited into a cached kernel's metadata (same size):
    the next lowering compiles again and launches with the real values."""
    FETCHED.clear()
    root = tmp_path / "c"
    decoded(add_fn(kernelcache.Cache(root=root), target="cuda:75"), F32, F32)
    (path,) = [p for p in root.glob("*.json") if json.loads(p.read_text())["ext"] == "cubin"]
    raw = path.read_bytes()
    edited = raw.replace(b'"num_warps":4', b'"num_warps":8').replace(b'"shared":0', b'"shared":8')
    assert edited != raw and len(edited) == len(raw)
    path.write_bytes(edited)
    forget_lowerings(root)
    FETCHED.clear()
    before = bridge_compile.compile_count()
    (call,) = decoded(add_fn(kernelcache.Cache(root=root), target="cuda:75"), F32, F32)
    (kernel,) = kernels_of(call)
    assert (kernel.num_warps, kernel.shared_mem_bytes) == (4, 0)
    assert bridge_compile.compile_count() == before + 1


def test_unwritable_cache_still_lowers(tmp_path):
    FETCHED.clear()
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    (call,) = decoded(
        lambda x, y: ops.add(x, y, target="cuda:75", cache=str(blocker / "sub")), F32, F32
    )
    assert kernels_of(call)[0].kernel_name == "add_kernel"


def test_record_listener_sees_plain_dicts(cache, tmp_path, monkeypatch):
    seen = []
    remove = bridge.on_lowered(seen.append)
    manifest = tmp_path / "record.jsonl"
    monkeypatch.setenv("KERNELCACHE_RECORD", str(manifest))
    try:
        decoded(
            lambda a, b: ops.matmul(a, b, target="cuda:90", cache=cache),
            jax.ShapeDtypeStruct((256, 128), jnp.bfloat16),
            jax.ShapeDtypeStruct((128, 256), jnp.bfloat16),
        )
    finally:
        remove()
    assert len(seen) == 4
    rec = seen[0]
    json.dumps(rec)
    assert rec["kernel"] == "examples.kernels:matmul_kernel" and rec["target"] == "cuda:90"
    assert rec["arguments"]["a_ptr"] == {"array": "bfloat16", "shape": [256, 128]}
    assert rec["variant"]["kwargs"] == {"BM": 128, "BN": 128, "BK": 64}
    lines = manifest.read_text().splitlines()
    assert len(lines) == 4 and {json.loads(line)["key"] for line in lines} == {
        r["key"] for r in seen
    }


def test_records_are_built_only_where_they_go(cache, monkeypatch):
    built = []
    real = bridge_record.build
    monkeypatch.setattr(bridge_record, "build", lambda *a: built.append(1) or real(*a))
    monkeypatch.delenv("KERNELCACHE_RECORD", raising=False)
    fn = lambda x, y: ops.add(x, y, block=512, target="cuda:90", cache=cache)  # noqa: E731
    decoded(fn, F32, F32)
    assert built == []
    seen = []
    remove = bridge.on_lowered(seen.append)
    try:
        decoded(lambda x, y: fn(x, y), F32, F32)  # a new function: JAX lowers it again
    finally:
        remove()
    assert len(built) == len(seen) == 1


def test_numpy_inputs_and_scalars(cache):
    x = np.arange(4096, dtype=np.float32)
    low = (
        jax.jit(lambda: ops.add(x, x, target="cuda:90", cache=cache))
        .trace()
        .lower(lowering_platforms=("cuda",))
    )
    (cc,) = custom_calls(low)
    assert cc["operands"] == 2


def test_bridge_kernel_decorator(cache):
    scale = bridge.kernel(K.scale_kernel, out_names="out_ptr", target="cuda:90", cache=cache)

    def fn(x):
        return scale[(4,)](x, x.size, 2.0, BLOCK=1024, out_shape=x)

    (call,) = decoded(fn, F32)
    assert kernels_of(call)[0].kernel_name == "scale_kernel"
    decorated = bridge.kernel(out_names="out_ptr")(K.scale_kernel)
    assert isinstance(decorated, bridge.Kernel) and decorated.defaults == {"out_names": "out_ptr"}
    with pytest.raises(bridge.KernelArgumentError, match="grid"):
        decorated(jnp.ones(4))


def test_recorded_specializations_compile_for_another_target(cache, tmp_path):
    from bridge import warm

    seen: list = []
    remove = bridge.on_lowered(seen.append)
    try:
        decoded(
            lambda a, b: ops.matmul(a, b, target="cuda:90", cache=cache),
            jax.ShapeDtypeStruct((256, 128), jnp.bfloat16),
            jax.ShapeDtypeStruct((128, 256), jnp.bfloat16),
        )
        decoded(add_fn(cache, target="cuda:90"), F32, F32)
    finally:
        remove()
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in seen + seen[:1]))
    elsewhere = kernelcache.Cache(root=tmp_path / "warm")
    keys = warm.compile_manifest(manifest, ["hip:gfx942"], cache=elsewhere)["hip:gfx942"]
    assert len(keys) == 5 and all(elsewhere.get(k, "hsaco") is not None for k in keys)
    # a later lowering for that target finds every kernel: nothing compiles
    FETCHED.clear()
    before = bridge_compile.compile_count()
    lowered = []
    remove = bridge.on_lowered(lowered.append)
    try:
        decoded(
            lambda a, b: ops.matmul(a, b, target="hip:gfx942", cache=elsewhere),
            jax.ShapeDtypeStruct((256, 128), jnp.bfloat16),
            jax.ShapeDtypeStruct((128, 256), jnp.bfloat16),
            platform="rocm",
        )
        decoded(add_fn(elsewhere, target="hip:gfx942"), F32, F32, platform="rocm")
    finally:
        remove()
    assert bridge_compile.compile_count() == before
    assert sorted(r["key"] for r in lowered) == sorted(keys)


def test_enable_jax_cache(tmp_path, monkeypatch):
    saved = {
        n: getattr(jax.config, n)
        for n in (
            "jax_compilation_cache_dir",
            "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes",
        )
    }
    try:
        monkeypatch.setenv("KERNELCACHE_DIR", str(tmp_path / "kc"))
        path = bridge.enable_jax_cache()
        assert path == tmp_path / "kc-jax" and path.is_dir()
        assert jax.config.jax_compilation_cache_dir == str(path)
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
        explicit = bridge.enable_jax_cache(tmp_path / "j", min_compile_time_secs=2.5)
        assert jax.config.jax_compilation_cache_dir == str(explicit)
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 2.5
    finally:
        for name, value in saved.items():
            jax.config.update(name, value)


def test_tritons_cache_invalidating_variables_change_the_key(cache, monkeypatch):
    def lower():
        (call,) = decoded(add_fn(cache, target="cuda:90", embed="ptx"), F32, F32)
        return kernels_of(call)[0].ptx

    with_lines = lower()
    monkeypatch.setenv("TRITON_DISABLE_LINE_INFO", "1")
    without = lower()
    assert with_lines.rsplit(" ", 1)[-1] != without.rsplit(" ", 1)[-1]
    assert ".file" in with_lines and ".file" not in without


def test_jax_export(cache):
    checks = [
        jax.export.DisabledSafetyCheck.custom_call(name)
        for name in ("triton_kernel_call_ffi", "triton_kernel_call")
    ]
    fn = jax.jit(add_fn(cache, target="cuda:90", embed="inline"))
    exported = jax.export.export(fn, platforms=["cuda"], disabled_checks=checks)(F32, F32)
    assert exported.platforms == ("cuda",)
    assert "triton_kernel_call" in exported.mlir_module()


# -- lowerings as cache entries (bridge.entries.lowerings) ------------------------------------
A = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16)
B = jax.ShapeDtypeStruct((256, 384), jnp.bfloat16)


@pytest.fixture
def fresh(tmp_path):
    """A cache of the test's own."""
    return kernelcache.Cache(tmp_path / "root", readonly_roots=(), remote="")


def module_text(fn, *avals) -> str:
    return lowered_module(fn, *avals).as_text()


def add(cache, **kw):
    return lambda x, y: ops.add(x, y, target="cuda:90", cache=cache, **kw)


def matmul(cache, **kw):
    return lambda x, y: ops.matmul(x, y, target="cuda:90", cache=cache, **kw)


def entries(root) -> dict[str, int]:
    found: dict[str, int] = {}
    for entry in kc_json(root, "ls", "--kind", "all")["entries"]:
        found[entry["ext"]] = found.get(entry["ext"], 0) + 1
    return found


@pytest.mark.parametrize("program", ["add", "autotuned"])
def test_a_warm_lowering_is_replayed_byte_identical(fresh, assembled, program):
    make, avals = (add, (F32, F32)) if program == "add" else (matmul, (A, B))
    cold = module_text(make(fresh), *avals)
    assert len(assembled) == 1
    FETCHED.clear()
    warm = module_text(make(fresh), *avals)
    assert len(assembled) == 1  # replayed: no binding, keying or reading of kernels
    assert forget_lowerings(fresh.root) >= 1
    FETCHED.clear()
    rebuilt = module_text(make(fresh), *avals)
    assert len(assembled) == 2
    assert cold == warm == rebuilt
    assert entries(fresh.root)["lowering"] == 1
    assert kc(fresh.root, "verify").returncode == 0


def test_an_edited_lowering_entry_is_never_served(fresh, assembled):
    cold = module_text(add(fresh), F32, F32)
    assert forget_programs(fresh.root) == 1  # the call's own entry is read (edited programs:
    (path,) = Path(fresh.root).glob("*.lowering")  # tests/bridge/entries/test_lowerings.py)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    assert module_text(add(fresh), F32, F32) == cold
    assert len(assembled) == 2  # the edited entry was refused, the lowering built again
    forget_programs(fresh.root)
    assert module_text(add(fresh), F32, F32) == cold
    assert len(assembled) == 2  # and kept again


KERNEL = """
SCALE = tl.constexpr({scale})

@triton.jit
def helper(x):
    return x {helper}

@triton.jit{decorator}
def kernel(x_ptr, n, y_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, helper(tl.load(x_ptr + offs, mask=mask)) * SCALE {kernel}, mask=mask)
"""
UNCHANGED = {"kernel": "", "helper": "+ 1.0", "scale": "1.0", "decorator": ""}


def lower_module_kernel(module, cache):
    def fn(x):
        return bridge.triton_call(
            x,
            x.size,
            kernel=module.kernel,
            out_shape=x,
            grid=(x.size // 256,),
            BLOCK=256,
            target="cuda:90",
            cache=cache,
        )

    (call,) = decoded(fn, F32)
    return call


@pytest.mark.parametrize(
    "edit",
    [
        {"kernel": "* 2.0"},
        {"helper": "+ 2.0"},
        {"scale": "2.0"},
        {"decorator": "(do_not_specialize=['n'])"},
    ],
    ids=["source", "jitted-dependency", "constexpr-global", "decorator-setting"],
)
def test_an_edited_kernel_or_dependency_is_lowered_again(tmp_path, fresh, assembled, edit):
    name = f"lowerings_kernel_{'_'.join(edit)}"
    first = kernel_module(tmp_path, name, KERNEL.format(**UNCHANGED))
    before = kernels_of(lower_module_kernel(first, fresh))[0].ptx
    assert kernels_of(lower_module_kernel(first, fresh))[0].ptx == before
    assert len(assembled) == 1
    changed = kernel_module(tmp_path, name, KERNEL.format(**{**UNCHANGED, **edit}))
    after = kernels_of(lower_module_kernel(changed, fresh))[0].ptx
    assert len(assembled) == 2 and after != before
    assert entries(fresh.root)["lowering"] == 2


def test_values_of_different_types_key_differently():
    """The key holds the ``repr`` of each value's canonical form: values that print alike but
    specialize differently (an int and a bool, a float, a string, an int subclass, a tuple)
    never share a key."""
    import enum

    from bridge.lowering import lowering_keys

    class Flag(enum.IntEnum):
        ON = 1

    values = [1, True, 1.0, "1", Flag.ON, (1,), {"1": 1}, None, 0, False, "", ()]
    shown = [repr(lowering_keys._canon(v, {})) for v in values]
    assert len(set(shown)) == len(values), shown


def test_an_extern_library_is_keyed_by_its_file(tmp_path):
    """A kernel key holds an extern library's content; a lowering key holds its file's identity
    (and, through the compiler's fingerprint, that of the backends' own device libraries)."""
    import os

    from bridge.lowering import lowering_keys

    lib = tmp_path / "lib.bc"
    lib.write_bytes(b"one")
    options = {"extern_libs": {"libdevice": str(lib)}, "num_warps": 4}
    before = repr(lowering_keys._canon(lowering_keys._libraries(options), {}))
    lib.write_bytes(b"other")
    os.utime(lib, ns=(1, 1))
    assert repr(lowering_keys._canon(lowering_keys._libraries(options), {})) != before
    assert lowering_keys._libraries({"num_warps": 4}) == {"num_warps": 4}
    import triton

    base = os.path.dirname(os.path.abspath(triton.__file__))
    names = [row[0] for row in compiler_identity._library_rows(base)]
    assert any("libdevice" in n for n in names) and any(n.startswith("amd") for n in names)


def _other_triton(monkeypatch):
    monkeypatch.setattr(compiler_identity, "triton_fingerprint", lambda: "another triton")


def _other_jaxlib(monkeypatch):
    release = versions.jaxlib_version()
    major, minor, micro = (int(p) for p in release.split(".")[:3])
    monkeypatch.setattr(versions, "jaxlib_version", lambda: f"{major}.{minor}.{micro}.post1")


def _other_ptxas(monkeypatch):
    found = ptxisa.jaxlib_assembler()
    other = ptxisa.Assembler(cuda="13.9", isa=99, origin="a newer ptxas")  # takes any PTX
    assert found != other
    monkeypatch.setattr(ptxisa, "jaxlib_assembler", lambda cache=None: other)


def _triton_setting(monkeypatch):
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0" if backends.default_fp_fusion() else "1")


@pytest.mark.parametrize(
    "change",
    [_other_triton, _other_jaxlib, _other_ptxas, _triton_setting],
    ids=["triton", "jaxlib", "jaxlib-ptxas", "triton-setting"],
)
def test_a_changed_toolchain_or_setting_is_lowered_again(fresh, assembled, monkeypatch, change):
    # embed="ptx": the PTX is assembled by jaxlib's ptxas whatever jaxlib is installed
    module_text(add(fresh, embed="ptx"), F32, F32)
    module_text(add(fresh, embed="ptx"), F32, F32)
    assert len(assembled) == 1
    change(monkeypatch)
    module_text(add(fresh, embed="ptx"), F32, F32)
    assert len(assembled) == 2
    module_text(add(fresh, embed="ptx"), F32, F32)
    assert len(assembled) == 2  # kept under its own key


def test_a_decision_made_later_replaces_the_autotuned_lowering_and_a_setting_restores_it(
    tmp_path, fresh, monkeypatch
):
    (before,) = decoded(matmul(fresh), A, B)
    assert len(before.autotuned_kernel_call.configs) == 4
    manifest = tmp_path / "manifest.jsonl"
    monkeypatch.setenv("KERNELCACHE_RECORD", str(manifest))
    decoded(matmul(fresh, autotune="runtime"), A, B)
    monkeypatch.delenv("KERNELCACHE_RECORD")
    (result,) = tune.tune(str(manifest), fresh, pins={"matmul_kernel": 2})
    assert result.status == "pinned"
    (after,) = decoded(matmul(fresh), A, B)
    assert after.HasField("kernel_call")  # the decision's one kernel, not the stored four
    assert after.kernel_call.kernel == before.autotuned_kernel_call.configs[2].kernel_call.kernel
    (again,) = decoded(matmul(fresh), A, B)
    assert again == after
    assert entries(fresh.root)["lowering"] == 2  # every config, and the decided one
    monkeypatch.setenv("KERNELCACHE_AUTOTUNE", "runtime")  # a setting: jaxlib autotunes again
    (runtime,) = decoded(matmul(fresh), A, B)
    assert runtime == before


def test_a_held_lock_on_a_lowering_entry_costs_no_wait(tmp_path, assembled):
    """Another process writing the same lowering entry (its key's lock held for as long as
    it likes): the lowering neither waits for it nor fails, and keeps nothing itself."""
    import time

    cache = kernelcache.Cache(tmp_path / "root", readonly_roots=(), remote="", lock_timeout=20)
    cold = module_text(add(cache), F32, F32)
    (path,) = Path(cache.root).glob("*.lowering")
    key = path.stem
    forget_lowerings(cache.root)
    held = cache.store.lock(key, shared=False, timeout=1)
    assert held is not None
    try:
        started = time.monotonic()
        assert module_text(add(cache), F32, F32) == cold
        assert time.monotonic() - started < 10  # not the lock timeout (20 s)
    finally:
        held.release()
    assert len(assembled) == 2 and not list(Path(cache.root).glob("*.lowering"))


def _lowering(head: bytes, opaque: bytes = b"x", size: int | None = None) -> bytes:
    return struct.pack(">4sI", b"KCL1", len(head) if size is None else size) + head + opaque


ODD_LOWERINGS = {
    "empty": b"",
    "short": b"KCL1\x00",
    "magic": b"XXXX" + _lowering(b"{}")[4:],
    "size-lie": _lowering(b'{"embed": "ptx"}', size=1 << 31),
    "not-json": _lowering(b"\xff\xfe{"),
    "not-an-object": _lowering(b"[1, 2]"),
    "embed-type": _lowering(b'{"embed": 5, "autotuned": false, "needs": [0]}'),
    "autotuned-type": _lowering(b'{"embed": "ptx", "autotuned": 1, "needs": [0]}'),
    "needs-negative": _lowering(b'{"embed": "ptx", "autotuned": false, "needs": [-1]}'),
    "needs-nan": _lowering(b'{"embed": "ptx", "autotuned": false, "needs": [NaN]}'),
    "deep": _lowering(b"[" * 100_000 + b"]" * 100_000),
}
ODD_VARIANTS = {
    "not-json": b"\xff",
    "not-a-list": b'{"variants": 5}',
    "not-strings": b'{"variants": [1, 2, 3, 4]}',
    "lone-surrogate": b'{"variants": ["\\ud800", "a", "b", "c"]}',
    "huge": b'{"variants": ["' + b"a" * 100_000 + b'"]}',
}


@pytest.mark.parametrize("raw", ODD_LOWERINGS.values(), ids=ODD_LOWERINGS.keys())
def test_an_odd_lowering_entry_is_a_miss(fresh, assembled, raw):
    cold = module_text(add(fresh), F32, F32)
    (path,) = Path(fresh.root).glob("*.lowering")
    forget_lowerings(fresh.root)
    fresh.put(path.stem, "lowering", raw, {"kind": "lowering"})
    assert module_text(add(fresh), F32, F32) == cold
    assert len(assembled) == 2


@pytest.mark.parametrize("raw", ODD_VARIANTS.values(), ids=ODD_VARIANTS.keys())
def test_an_odd_variants_entry_is_a_miss(fresh, assembled, raw):
    cold = module_text(matmul(fresh), A, B)
    forget_programs(fresh.root)
    (path,) = Path(fresh.root).glob("*.variants")
    path.with_suffix(".json").unlink()
    path.unlink()
    fresh.put(path.stem, "variants", raw, {"kind": "lowering"})
    assert module_text(matmul(fresh), A, B) == cold
    assert len(assembled) == 2


def test_a_program_reads_the_settings_once_per_lowering(fresh, monkeypatch):
    made: list[tuple[object, ...]] = []
    real = bridge_call.setup
    monkeypatch.setattr(
        bridge_call,
        "setup",
        lambda call, *a: made.append((call.target, call.cache)) or real(call, *a),
    )

    def program():  # a new function each time: JAX caches the lowering of a traced one
        def run(x, y):
            z = ops.add(x, y, target="cuda:90", cache=fresh)
            z = ops.add(z, y, target="cuda:90", cache=fresh)
            return ops.add(z, x, target="cuda:90", cache=fresh, embed="ptx")

        return run

    first = module_text(program(), F32, F32)
    assert len(made) == 2  # one per (target, embed, cache) the calls pass
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0" if backends.default_fp_fusion() else "1")
    second = module_text(program(), F32, F32)
    assert len(made) == 4  # read again for the next lowering, which sees the new setting
    assert second != first
