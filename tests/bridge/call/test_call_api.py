"""jax-triton 0.4's call API (``out_type=``, flattened aliases, keyword operands, refs,
``backend_options=``, ``has_side_effect=``, ``cost_estimate=``, tensor descriptors) beside the
0.3 convention, checked on CPU by lowering for "cuda" and decoding what lands in the custom call.
The same calls run on an H200 in tests/bridge/call/test_call_gpu.py."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import triton
import triton.language as tl
from artifact_images import elf_image, launch
from bridge_helpers import custom_calls, decoded, kernel_keys, kernels_of, lowered_module
from callapi_kernels import (
    acc_kernel,
    add_default_kernel,
    add_fn,
    add_inplace_kernel,
    add_kernel,
    constexpr_first_kernel,
    default_operand_kernel,
    device_tma_copy_kernel,
    dispatch_kernel,
    gluon_host_tma_copy_kernel,
    inc_kernel,
    inc_pair_kernel,
    mul_fn,
    output_first_kernel,
    tma_copy_kernel,
    two_outputs_kernel,
)
from support import REPO, child_env
from triton.experimental.gluon import language as gl

import bridge
import kernelcache
from bridge import versions
from bridge.call import tma
from bridge.compile import fetch
from bridge.compile.compiler import Compiled
from bridge.lowering import proto

F8 = jax.ShapeDtypeStruct((8,), jnp.float32)
F64 = jax.ShapeDtypeStruct((64,), jnp.float32)
M32 = jax.ShapeDtypeStruct((32, 32), jnp.float32)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> kernelcache.Cache:
    return kernelcache.Cache(root=tmp_path_factory.mktemp("callapi-kernels"))


@pytest.fixture
def jaxlib_0112(monkeypatch):
    """Lower as if jaxlib 0.11.2 ran (tensor descriptors and global scratch need >= 0.11.1)."""
    monkeypatch.setattr(versions, "jaxlib_version", lambda: "0.11.2")


def call(*args, **kw):
    kw.setdefault("target", "cuda:90")
    return bridge.triton_call(*args, **kw)


def kinds(c):
    return [p.WhichOneof("value") for p in c.kernel_call.parameters]


def eqn_of(jaxpr):
    (eqn,) = [e for e in jaxpr.eqns if e.primitive.name == "kernelcache_triton_call"]
    return eqn


# -- out_type ----------------------------------------------------------------------------------
def test_out_type_fills_the_parameter_no_argument_fills(cache):
    f = lambda x, y: call(  # noqa: E731
        x,
        y,
        x.size,
        kernel=add_kernel,
        out_type=jax.typeof(x),
        grid=(8,),
        BLOCK_SIZE=8,
        cache=cache,
    )
    (c,) = decoded(f, F64, F64)
    assert kinds(c) == ["array", "array", "i32", "array"]
    (cc,) = custom_calls(lowered_module(f, F64, F64))
    assert cc["operands"] == 2 and cc["results"] == 1
    assert jax.eval_shape(f, F64, F64).shape == (64,)


def test_out_type_pytrees_come_back_in_their_structure(cache):
    a = jax.ShapeDtypeStruct((1,), jnp.int32)
    lst = jax.eval_shape(
        lambda v: call(v, kernel=two_outputs_kernel, out_type=[v, v], grid=(1,), cache=cache), a
    )
    assert isinstance(lst, list) and len(lst) == 2
    # a dict is a pytree: keys sorted, "a" fills the first free parameter (x_ptr), "b" the next
    d = jax.eval_shape(
        lambda v: call(
            v,
            kernel=two_outputs_kernel,
            out_type={"b": jax.ShapeDtypeStruct((1,), jnp.int32), "a": v},
            grid=(1,),
            cache=cache,
        ),
        a,
    )
    assert set(d) == {"a", "b"}
    (c,) = decoded(
        lambda v: call(v, kernel=two_outputs_kernel, out_type=(v, v), grid=(1,), cache=cache), a
    )
    assert kinds(c) == ["array", "array", "array"]


def test_out_type_and_out_shape_together_are_an_error():
    with pytest.raises(bridge.KernelArgumentError, match=r"both out_type= .* and out_shape="):
        jax.eval_shape(
            lambda x: call(x, x, 8, kernel=add_kernel, out_type=x, out_shape=x, grid=(1,)), F8
        )
    with pytest.raises(bridge.KernelArgumentError, match="out_names= places outputs"):
        jax.eval_shape(
            lambda x: call(
                x, x, 8, kernel=add_kernel, out_type=x, out_names="output_ptr", grid=(1,)
            ),
            F8,
        )


def test_output_count_must_match_the_missing_parameters():
    with pytest.raises(bridge.KernelArgumentError, match="2 unaliased outputs, but 1 kernel"):
        jax.eval_shape(
            lambda x: call(x, x, 8, kernel=add_kernel, out_type=(x, x), grid=(1,), BLOCK_SIZE=8),
            F8,
        )


# -- binding like a Python call ------------------------------------------------------------------
def test_keyword_operands_any_order_and_static_scalars(cache):
    def f(x, y):
        return call(
            y_ptr=y,
            n_elements=x.size,
            x_ptr=x,
            kernel=add_kernel,
            out_type=jax.typeof(x),
            grid=(1,),
            BLOCK_SIZE=64,
            cache=cache,
        )

    jaxpr = jax.make_jaxpr(f)(jnp.zeros(64), jnp.ones(64))
    eqn = eqn_of(jaxpr)
    # the operands in declaration order (x, y), the scalar baked in: not an operand
    assert eqn.invars == list(jaxpr.jaxpr.invars)
    spec = eqn.params["call"]
    assert spec.named["n_elements"] == 64 and spec.kwargs["BLOCK_SIZE"] == 64
    (c,) = decoded(f, F64, F64)
    assert kinds(c) == ["array", "array", "i32", "array"] and c.kernel_call.parameters[2].i32 == 64


def test_keyword_conflicting_with_a_positional_is_an_error():
    with pytest.raises(TypeError, match="multiple values for argument 'x_ptr'"):
        jax.eval_shape(
            lambda x: call(x, x_ptr=x, kernel=add_kernel, out_type=x, grid=(1,), BLOCK_SIZE=8),
            F8,
        )


def test_constexpr_declared_before_operands(cache):
    f = lambda x, y: call(  # noqa: E731
        x,
        y_ptr=y,
        n_elements=x.size,
        kernel=constexpr_first_kernel,
        out_type=jax.typeof(x),
        grid=(1,),
        BLOCK_SIZE=64,
        cache=cache,
    )
    (c,) = decoded(f, F64, F64)
    assert kinds(c) == ["array", "array", "i32", "array"]
    # with out_shape= (0.3) the output would land on the constexpr: a clear error says why
    with pytest.raises(bridge.KernelArgumentError, match=r"with out_type= .*jax-triton 0.4"):
        jax.eval_shape(
            lambda x: call(x, kernel=constexpr_first_kernel, out_shape=x, grid=(1,)), F64
        )


def test_an_output_before_an_input_gets_its_own_buffer(cache):
    """jax-triton 0.4 hands such a kernel swapped buffers; the bridge passes the output as a
    zero-filled operand aliased to its result."""
    f = lambda x: call(  # noqa: E731
        x_ptr=x,
        n_elements=x.size,
        kernel=output_first_kernel,
        out_type=x,
        grid=(1,),
        BLOCK_SIZE=64,
        cache=cache,
    )
    (cc,) = custom_calls(lowered_module(f, F64))
    assert cc["operands"] == 2 and cc["results"] == 1 and "operand_index = 0" in cc["aliases"]


def test_missing_constexprs_take_the_kernel_defaults(cache):
    for kw in ({}, {"BLOCK_SIZE": 8}):
        for out in ("out_type", "out_shape"):
            (c,) = decoded(
                lambda x, y, kw=kw, out=out: call(
                    x,
                    y,
                    x.size,
                    kernel=add_default_kernel,
                    grid=(8,),
                    cache=cache,
                    **{out: x},
                    **kw,
                ),
                F64,
                F64,
            )
            assert kinds(c) == ["array", "array", "i32", "array"]


def test_non_constexpr_defaults_fill_what_outputs_leave(cache):
    (c,) = decoded(
        lambda x: call(x, kernel=default_operand_kernel, out_type=x, grid=(1,), cache=cache), F8
    )
    # out_ptr took the output; n_elements kept its default (8)
    assert kinds(c) == ["array", "array", "i32"] and c.kernel_call.parameters[2].i32 == 8


def test_callable_constexprs_key_the_kernel(cache):
    def key(fn):
        (found,) = kernel_keys(
            lambda x, y: call(
                x,
                y,
                kernel=dispatch_kernel,
                out_type=x,
                grid=(1,),
                FN=fn,
                BLOCK_SIZE=8,
                cache=cache,
                embed="ptx",
            ),
            F8,
            F8,
        )
        return found

    assert key(add_fn) != key(mul_fn)
    assert key(add_fn) == key(add_fn)
    seen: list = []
    remove = bridge.on_lowered(seen.append)
    try:
        key(mul_fn)
    finally:
        remove()
    assert seen[0]["kwargs"]["FN"] == {"jit": "callapi_kernels:mul_fn"}


def test_tuples_and_scalar_before_tuple(cache):
    @triton.jit
    def scale_add(scale, xy, output_ptr, BLOCK_SIZE: tl.constexpr):
        offs = tl.arange(0, BLOCK_SIZE)
        tl.store(
            output_ptr + offs,
            scale * (tl.load(xy[0] + offs) + tl.load(xy[1] + offs).to(tl.float32)),
        )

    h = jax.ShapeDtypeStruct((8,), jnp.float16)
    (c,) = decoded(
        lambda x, y: call(
            3.0, (x, y), kernel=scale_add, out_type=x, grid=(1,), BLOCK_SIZE=8, cache=cache
        ),
        F8,
        h,
    )
    assert kinds(c) == ["f32", "array", "array", "array"]


# -- aliases and zeroing, 0.4 style ----------------------------------------------------------------
def test_alias_indices_count_flattened_operands_and_aliased_outputs_take_no_parameter(cache):
    """jax-triton 0.4: {1: 0} is the second operand (the scalar is the first); the output has no
    pointer of its own."""
    f = lambda x: call(  # noqa: E731
        8,
        x,
        kernel=inc_kernel,
        out_type=jax.typeof(x),
        grid=(8,),
        BLOCK_SIZE=1,
        input_output_aliases={1: 0},
        cache=cache,
    )
    (cc,) = custom_calls(lowered_module(f, F8))
    assert cc["operands"] == 1 and cc["results"] == 1 and "operand_index = 0" in cc["aliases"]
    assert kinds(proto.decode_opaque(cc["opaque"])) == ["i32", "array"]
    # the same by keyword, in the other order
    g = lambda x: call(  # noqa: E731
        x_in_out_ptr=x,
        n_elements=8,
        kernel=inc_kernel,
        out_type=x,
        grid=(8,),
        BLOCK_SIZE=1,
        input_output_aliases={1: 0},
        cache=cache,
    )
    (cc2,) = custom_calls(lowered_module(g, F8))
    assert cc2["opaque"] == cc["opaque"]


def test_alias_errors_name_what_is_wrong():
    def inc(aliases, size=8):
        return lambda x: call(
            size,
            x,
            kernel=inc_kernel,
            out_type=x,
            grid=(8,),
            BLOCK_SIZE=1,
            input_output_aliases=aliases,
        )

    with pytest.raises(bridge.KernelArgumentError, match="not an array"):
        jax.eval_shape(inc({0: 0}), F8)
    with pytest.raises(bridge.KernelArgumentError, match="index into the 2 flattened operands"):
        jax.eval_shape(inc({2: 0}), F8)
    with pytest.raises(bridge.KernelArgumentError, match="not an index into the 1 flattened"):
        jax.eval_shape(inc({1: 1}), F8)
    with pytest.raises(bridge.KernelArgumentError, match="is a dict"):
        jax.eval_shape(inc(["x_in_out_ptr"]), F8)
    with pytest.raises(ValueError, match="must be a bijection"):
        jax.eval_shape(
            lambda x, y: call(
                x,
                y,
                8,
                kernel=add_inplace_kernel,
                out_type=x,
                grid=(1,),
                BLOCK_SIZE=8,
                INPLACE_Y=False,
                input_output_aliases={0: 0, 1: 0},
            ),
            F8,
            F8,
        )
    with pytest.raises(bridge.KernelArgumentError, match="shapes and dtypes must match"):
        jax.eval_shape(
            lambda x: call(
                8,
                x,
                kernel=inc_kernel,
                out_type=jax.ShapeDtypeStruct((8,), jnp.int32),
                grid=(8,),
                BLOCK_SIZE=1,
                input_output_aliases={1: 0},
            ),
            F8,
        )


def test_zeroing_an_aliased_output_zeroes_its_input(cache):
    f = lambda x, y: call(  # noqa: E731
        x,
        y,
        x.size,
        kernel=add_inplace_kernel,
        out_type=jax.typeof(x),
        grid=(8,),
        BLOCK_SIZE=8,
        INPLACE_Y=True,
        input_output_aliases={1: 0},
        zeroed_outputs=(0,),
        cache=cache,
    )
    (c,) = decoded(f, F64, F64)
    assert [p.array.bytes_to_zero for p in c.kernel_call.parameters if p.HasField("array")] == [
        0,
        256,
    ]
    (cc,) = custom_calls(lowered_module(f, F64, F64))
    assert cc["operands"] == 2 and cc["results"] == 1 and "operand_index = 1" in cc["aliases"]


# -- refs ------------------------------------------------------------------------------------------
def test_a_ref_is_updated_in_place(cache):
    def f(r):
        return call(8, r, kernel=inc_kernel, out_type=(), grid=(8,), BLOCK_SIZE=1, cache=cache)

    ref = jax.new_ref(jnp.zeros(8))
    jaxpr = jax.make_jaxpr(f)(ref)
    assert jaxpr.out_avals == []  # nothing returned: the ref is written
    assert [str(e.primitive) for e in jaxpr.eqns] == ["get", "kernelcache_triton_call", "swap"]
    (cc,) = custom_calls(jax.jit(f).trace(ref).lower(lowering_platforms=("cuda",)))
    assert cc["operands"] == 1 and cc["results"] == 1 and "operand_index = 0" in cc["aliases"]
    # in the 0.3 convention too (no out_shape): the ref is an in-place input
    g = lambda r: bridge.triton_call(  # noqa: E731
        8, r, kernel=inc_kernel, grid=(8,), BLOCK_SIZE=1, target="cuda:90", cache=cache
    )
    assert jax.make_jaxpr(g)(ref).out_avals == []


def test_refs_in_tuples_with_outputs_and_autotuning(cache):
    def f(x, acc_ref, bias):
        return call(x, (acc_ref, bias), kernel=acc_kernel, out_type=x, grid=(8,), cache=cache)

    x = jnp.zeros(8)
    ref = jax.new_ref(jnp.zeros(8))
    (cc,) = custom_calls(jax.jit(f).trace(x, ref, x).lower(lowering_platforms=("cuda",)))
    # operands x, acc, bias; results: out (plain), acc (aliased to operand 1)
    assert cc["operands"] == 3 and cc["results"] == 2 and "operand_index = 1" in cc["aliases"]
    assert jax.eval_shape(lambda a, b: f(a, jax.new_ref(b), b), F8, F8).shape == (8,)

    def tuned(a_ref, b_ref):
        return call((a_ref, b_ref), 8, kernel=inc_pair_kernel, out_type=(), grid=(8,), cache=cache)

    lowered = (
        jax.jit(tuned).trace(jax.new_ref(x), jax.new_ref(x)).lower(lowering_platforms=("cuda",))
    )
    (cc,) = custom_calls(lowered)
    call_msg = proto.decode_opaque(cc["opaque"])
    restore = [
        (a.input_buffer_idx, a.output_buffer_idx)
        for a in call_msg.autotuned_kernel_call.input_output_aliases
    ]
    assert restore == [(0, 2), (1, 3)]  # both refs survive the autotuning trials


def test_ref_misuse_is_a_clear_error():
    ref = jax.new_ref(jnp.zeros(8))
    with pytest.raises(ValueError, match="cannot be combined with Ref"):
        call(
            8,
            ref,
            kernel=inc_kernel,
            out_type=(),
            grid=(8,),
            BLOCK_SIZE=1,
            input_output_aliases={1: 0},
        )
    with pytest.raises(bridge.KernelArgumentError, match="same ref is passed twice"):
        call(
            ref,
            ref,
            8,
            kernel=add_inplace_kernel,
            out_type=(),
            grid=(1,),
            BLOCK_SIZE=8,
            INPLACE_Y=True,
        )

    def sliced(r):
        return call(4, r.at[0:4], kernel=inc_kernel, out_type=(), grid=(4,), BLOCK_SIZE=1)

    with pytest.raises(bridge.KernelArgumentError, match=r"transformed ref \(ref.at"):
        jax.make_jaxpr(sliced)(ref)


# -- options, side effects, cost -------------------------------------------------------------------
def test_backend_options(cache, tmp_path):
    def lower(**kw):
        (c,) = decoded(
            lambda x, y: call(
                x, y, 8, kernel=add_kernel, out_type=x, grid=(1,), BLOCK_SIZE=8, cache=cache, **kw
            ),
            F8,
            F8,
        )
        return kernels_of(c)[0]

    assert lower(backend_options={"num_warps": 2}).num_warps == 2
    assert lower(backend_options={"debug": True}).kernel_name == "add_kernel"
    with pytest.raises(
        ValueError, match=r"num_warps both as explicit arguments and in ``backend_options``"
    ):
        lower(num_warps=4, backend_options={"num_warps": 2})
    with pytest.raises(ValueError, match="backend_options"):
        lower(maxnreg=64, backend_options={"maxnreg": 32})
    with pytest.raises(bridge.OptionError, match=r"maxnregs.*compile options are .*maxnreg"):
        lower(backend_options={"maxnregs": 64})
    # values need not be hashable
    import triton.backends.nvidia as nv

    libdevice = str(next(Path(nv.__file__).parent.rglob("libdevice*.bc")))
    assert (
        lower(backend_options={"extern_libs": {"libdevice": libdevice}}).kernel_name == "add_kernel"
    )


def test_has_side_effect_survives_dce_and_reaches_the_custom_call(cache):
    def f(x, y, **kw):
        call(
            x, y, x.size, kernel=add_kernel, out_type=x, grid=(1,), BLOCK_SIZE=8, cache=cache, **kw
        )
        return x

    jaxpr = jax.make_jaxpr(lambda x, y: f(x, y, has_side_effect=True))(jnp.zeros(8), jnp.zeros(8))
    assert eqn_of(jaxpr).params["has_side_effect"] is True
    from jax.interpreters import partial_eval as pe

    kept, _ = pe.dce_jaxpr(jaxpr.jaxpr, [False])
    assert len([e for e in kept.eqns if e.primitive.name == "kernelcache_triton_call"]) == 1
    text = lowered_module(lambda x, y: f(x, y, has_side_effect=True), F8, F8).as_text()
    assert "triton_kernel_call" in text and "has_side_effect = true" in text
    plain = jax.make_jaxpr(lambda x, y: f(x, y))(jnp.zeros(8), jnp.zeros(8))
    assert eqn_of(plain).params["has_side_effect"] is False
    with pytest.MonkeyPatch.context() as mp:  # the legacy target carries the flag too
        mp.setattr(versions, "jaxlib_version", lambda: "0.9.2")
        legacy = lowered_module(lambda x, y: f(x, y, has_side_effect=True), F8, F8).as_text()
    assert "@triton_kernel_call(" in legacy and "has_side_effect = true" in legacy


def test_cost_estimate_rides_on_the_ffi_call(cache):
    f = lambda x, y: call(  # noqa: E731
        x,
        y,
        x.size,
        kernel=add_kernel,
        out_type=x,
        grid=(1,),
        BLOCK_SIZE=8,
        cache=cache,
        cost_estimate={"flops": 123, "bytes_accessed": 456},
    )
    if versions.has_ffi_call(versions.jaxlib_version()):
        hlo = lowered_module(f, F8, F8).compiler_ir("hlo").as_hlo_text()
        assert '"flops": 123' in hlo.replace("\\22", '"') and "bytes_accessed" in hlo
    with pytest.raises(bridge.KernelArgumentError, match="cost_estimate must be a dict"):
        jax.eval_shape(
            lambda x: call(x, x, 8, kernel=add_kernel, out_type=x, grid=(1,), cost_estimate=5), F8
        )


def test_float_scalars_that_overflow_fp32_are_an_error(cache):
    @triton.jit
    def add_scalar(x_ptr, y, output_ptr):
        tl.store(output_ptr, tl.load(x_ptr) + y)

    def lower(v):
        return decoded(
            lambda x: call(
                x,
                v,
                kernel=add_scalar,
                out_type=jax.ShapeDtypeStruct((), x.dtype),
                grid=1,
                cache=cache,
            ),
            F8,
        )

    (c,) = lower(1e-30)
    assert kinds(c) == ["array", "f32", "array"]
    (c,) = lower(np.float32(42.0))
    assert c.kernel_call.parameters[1].f32 == 42.0
    lower(float("inf"))
    with pytest.raises(bridge.KernelArgumentError, match=r"overflows fp32.*tl\.float64"):
        lower(1e39)


# -- tensor descriptors ----------------------------------------------------------------------------
def test_host_descriptor_becomes_a_tma_parameter(cache, jaxlib_0112):
    def f(x, **kw):
        desc = bridge.TensorDescriptor.from_array(x, block_shape=[32, 32], **kw)
        return call(desc, kernel=tma_copy_kernel, out_type=x, grid=1, M=32, N=32, cache=cache)

    (c,) = decoded(f, M32)
    assert kinds(c) == ["tensor_descriptor", "i32", "i32", "i64", "i64", "array"]
    t = c.kernel_call.parameters[0].tensor_descriptor.nvidia
    assert (t.elem_type, t.swizzle, t.oob_fill) == (7, 3, 0)  # CU_TENSOR_MAP_DATA_TYPE_FLOAT32
    assert (
        list(t.shape) == [32, 32] and list(t.strides) == [32, 1] and list(t.block_shape) == [32, 32]
    )
    assert [p.i32 for p in c.kernel_call.parameters[1:3]] == [32, 32]
    assert [p.i64 for p in c.kernel_call.parameters[3:5]] == [32, 1]
    (nan,) = decoded(lambda x: f(x, padding="nan", round_f32_to_tf32=True), M32)
    t = nan.kernel_call.parameters[0].tensor_descriptor.nvidia
    assert (t.elem_type, t.oob_fill) == (11, 1)  # TFLOAT32, NaN fill
    # the same kernel binary: padding and rounding are per call, not per kernel
    assert kernels_of(c)[0].ptx == kernels_of(nan)[0].ptx
    (cc,) = custom_calls(lowered_module(f, M32))
    assert cc["operands"] == 1 and cc["results"] == 1
    # the cache entry carries the whole TMA metadata as plain JSON
    (key,) = kernel_keys(lambda x: f(x), M32)  # (a new function: JAX lowers it again)
    meta = cache.get(key, "cubin").meta
    assert meta["tensordesc_meta"] == [
        {
            "swizzle": 3,
            "elem_size": 4,
            "elem_type": 7,
            "block_size": [32, 32],
            "fp4_padded": False,
            **({"is_im2col": False} if "is_im2col" in meta["tensordesc_meta"][0] else {}),
        }
    ]
    json.dumps(meta)


def test_descriptor_dtypes_and_pytree(cache, jaxlib_0112):
    for dtype, elem in [(jnp.float16, 6), (jnp.int32, 3), (jnp.int8, 0), (jnp.uint16, 1)]:
        s = jax.ShapeDtypeStruct((16, 128), dtype)
        (c,) = decoded(
            lambda x: call(
                bridge.TensorDescriptor.from_array(x, [16, 128]),
                kernel=tma_copy_kernel,
                out_type=x,
                grid=1,
                M=16,
                N=128,
                cache=cache,
            ),
            s,
        )
        assert c.kernel_call.parameters[0].tensor_descriptor.nvidia.elem_type == elem, dtype
    # a descriptor is a pytree: it passes through jit with its base as the only leaf
    desc = bridge.TensorDescriptor.from_array(jnp.zeros((32, 32)), [32, 32], padding="nan")
    leaves, tree = jax.tree_util.tree_flatten(desc)
    assert len(leaves) == 1 and jax.tree_util.tree_unflatten(tree, leaves).padding == "nan"
    out = jax.eval_shape(
        jax.jit(lambda d: call(d, kernel=tma_copy_kernel, out_type=d.base, grid=1, M=32, N=32)),
        desc,
    )
    assert out.shape == (32, 32)


def test_a_jax_triton_descriptor_is_accepted(cache, jaxlib_0112):
    class TensorDescriptor:  # what jax_triton.TensorDescriptor looks like
        def __init__(self, base):
            self.base, self.shape, self.strides = base, base.shape, (base.shape[1], 1)
            self.block_shape, self.layout, self.padding, self.round_f32_to_tf32 = (
                (32, 32),
                None,
                "zero",
                False,
            )

    (c,) = decoded(
        lambda x: call(
            TensorDescriptor(x), kernel=tma_copy_kernel, out_type=x, grid=1, M=32, N=32, cache=cache
        ),
        M32,
    )
    assert kinds(c)[0] == "tensor_descriptor"


def test_descriptor_errors(cache, monkeypatch):
    def f(x, target="cuda:90", **kw):
        desc = bridge.TensorDescriptor.from_array(x, [32, 32], **kw)
        return call(
            desc, kernel=tma_copy_kernel, out_type=x, grid=1, M=32, N=32, cache=cache, target=target
        )

    monkeypatch.setattr(versions, "jaxlib_version", lambda: "0.11.0")
    with pytest.raises(bridge.KernelArgumentError, match=r"jaxlib 0.11.0 cannot pass.*>= 0.11.1"):
        decoded(f, M32)
    monkeypatch.setattr(versions, "jaxlib_version", lambda: "0.11.2")
    with pytest.raises(bridge.KernelArgumentError, match=r"TMA \(sm_90 or newer\), not cuda:80"):
        decoded(lambda x: f(x, target="cuda:80"), M32)
    with pytest.raises(bridge.KernelArgumentError, match="padding='nan' needs a floating-point"):
        jax.eval_shape(lambda x: f(x, padding="nan"), jax.ShapeDtypeStruct((32, 32), jnp.int32))
    with pytest.raises(bridge.KernelArgumentError, match="round_f32_to_tf32=True needs a float32"):
        jax.eval_shape(
            lambda x: f(x, round_f32_to_tf32=True), jax.ShapeDtypeStruct((32, 32), jnp.float16)
        )
    with pytest.raises(bridge.KernelArgumentError, match="strides must be 16-byte aligned"):
        jax.eval_shape(lambda x: f(x), jax.ShapeDtypeStruct((32, 3), jnp.float32))
    with pytest.raises(bridge.KernelArgumentError, match="padding must be 'zero' or 'nan'"):
        bridge.TensorDescriptor.from_array(jnp.zeros((4, 4)), [4, 4], padding="inf")
    with pytest.raises(bridge.KernelArgumentError, match="layout= is for Gluon kernels"):
        jax.eval_shape(lambda x: f(x, layout=gl.NVMMASharedLayout(128, 32, 2)), M32)


def test_gluon_host_descriptor(cache, jaxlib_0112):
    layout = gl.NVMMASharedLayout(128, element_bitwidth=32, rank=2)

    def f(x, layout=layout):
        desc = bridge.TensorDescriptor.from_array(x, block_shape=[16, 32], layout=layout)
        return call(
            desc, kernel=gluon_host_tma_copy_kernel, out_type=x, grid=1, M=16, N=32, cache=cache
        )

    (c,) = decoded(f, jax.ShapeDtypeStruct((16, 32), jnp.float32))
    assert kinds(c) == ["tensor_descriptor", "i32", "i32", "i64", "i64", "array"]
    t = c.kernel_call.parameters[0].tensor_descriptor.nvidia
    assert (t.swizzle, list(t.block_shape)) == (3, [16, 32])
    assert kernels_of(c)[0].global_scratch_size == 128  # the device-side output descriptor
    with pytest.raises(
        bridge.KernelArgumentError, match="Gluon kernel; its tensor descriptors need"
    ):
        jax.eval_shape(lambda x: f(x, layout=None), jax.ShapeDtypeStruct((16, 32), jnp.float32))


def test_device_side_descriptors_get_global_scratch(cache, monkeypatch):
    def f(x):
        return call(x, kernel=device_tma_copy_kernel, out_type=x, grid=1, M=32, N=32, cache=cache)

    monkeypatch.setattr(versions, "jaxlib_version", lambda: "0.11.2")
    (c,) = decoded(f, M32)
    kernel = kernels_of(c)[0]
    assert (kernel.global_scratch_size, kernel.global_scratch_align) == (256, 128)
    monkeypatch.setattr(versions, "jaxlib_version", lambda: "0.10.2")
    with pytest.raises(bridge.KernelArgumentError, match=r"global scratch.*jaxlib >= 0.11.1"):
        decoded(lambda x: f(x), M32)  # a new function: jax would reuse the first lowering


def test_descriptor_metadata_is_validated():
    good = {
        "swizzle": 3,
        "elem_size": 4,
        "elem_type": 7,
        "block_size": [32, 32],
        "fp4_padded": False,
    }
    assert tma.descriptor_meta([good]) == [{**good, "is_im2col": False}]
    for bad in (
        None,
        {"swizzle": 3},
        [{**good, "swizzle": 9}],
        [{**good, "block_size": [32, 512]}],
        [{**good, "block_size": "32"}],
        [{**good, "elem_size": 3}],
        [{**good, "fp4_padded": 0}],
        [{**good, "is_im2col": "no"}],
        [{k: v for k, v in good.items() if k != "elem_type"}],
        [[1, 2]],
    ):
        assert tma.descriptor_meta(bad) is None, bad


def test_an_entry_without_what_the_lowering_needs_is_compiled_again(tmp_path, caplog):
    cache = kernelcache.Cache(root=tmp_path / "c")
    key = "ab" * 32
    cache.put(key, "cubin", elf_image(b"old"), launch(name="k"))
    built = []

    def build():
        built.append(1)
        return Compiled(elf_image(b"new"), None, {})

    kb = fetch.fetch_request(
        cache,
        fetch.Request(
            key,
            "cubin",
            build,
            lambda c: launch(name="k", tensordesc_meta=[]),
            False,
            usable=lambda meta: "tensordesc_meta" in meta,
        ),
    )
    assert (
        kb.binary == elf_image(b"new")
        and kb.meta["tensordesc_meta"] == []
        and kb.built
        and built == [1]
    )
    assert "compiling it again in memory" in caplog.text
    kb = fetch.fetch_request(
        cache, fetch.Request(key, "cubin", build, lambda c: {}, False, usable=lambda m: True)
    )
    assert kb.binary == elf_image(b"old") and built == [1]


def test_descriptor_calls_are_recorded_and_warmed_for_the_same_key(cache, jaxlib_0112, tmp_path):
    from bridge import warm

    seen: list = []
    remove = bridge.on_lowered(seen.append)
    try:
        decoded(
            lambda x: call(
                bridge.TensorDescriptor.from_array(x, [32, 32]),
                kernel=tma_copy_kernel,
                out_type=x,
                grid=1,
                M=32,
                N=32,
                cache=cache,
            ),
            M32,
        )
    finally:
        remove()
    (rec,) = seen
    assert rec["arguments"]["in_desc"]["tensordesc"]["block_shape"] == [32, 32]
    assert "problem" not in rec
    elsewhere = kernelcache.Cache(root=tmp_path / "warm")
    assert warm.compile_record(rec, "cuda:90", elsewhere) == rec["key"]


# -- names, export, import cost ----------------------------------------------------------------------
def test_custom_call_target_names_and_a_cheap_import():
    assert bridge.CUSTOM_CALL_TARGET_NAME == "triton_kernel_call_ffi"
    assert set(bridge.CUSTOM_CALL_TARGET_NAMES) == {"triton_kernel_call_ffi", "triton_kernel_call"}
    code = (
        "import sys, bridge; bridge.CUSTOM_CALL_TARGET_NAMES; "
        "print(sorted(m for m in ('jax', 'triton', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, cwd=str(REPO)
    )
    assert out.stdout.strip() == "[]", out.stderr


def test_export_serialize_deserialize_carries_the_kernel(cache):
    pytest.importorskip("flatbuffers", reason="jax.export serialization needs flatbuffers")
    checks = [
        jax.export.DisabledSafetyCheck.custom_call(n) for n in bridge.CUSTOM_CALL_TARGET_NAMES
    ]
    fn = jax.jit(
        lambda x, y: call(
            x,
            y,
            x.size,
            kernel=add_kernel,
            out_type=x,
            grid=(8,),
            BLOCK_SIZE=8,
            cache=cache,
            embed="inline",
        )
    )
    exported = jax.export.export(fn, platforms=["cuda"], disabled_checks=checks)(F64, F64)
    back = jax.export.deserialize(exported.serialize())
    assert (
        back.platforms == ("cuda",)
        and back.in_avals == (jax.core.ShapedArray((64,), jnp.float32),) * 2
    )
    text = back.mlir_module()
    # inline machine code makes an export carry the FFI target (the jaxlib it needs has it): a
    # jax-triton style disabled_checks naming only CUSTOM_CALL_TARGET_NAME suffices
    assert "@triton_kernel_call_ffi" in text
    only_ffi = [jax.export.DisabledSafetyCheck.custom_call(bridge.CUSTOM_CALL_TARGET_NAME)]
    jax.export.export(fn, platforms=["cuda"], disabled_checks=only_ffi)(F64, F64).serialize()
    # the deserialized module still holds the kernel: the opaque decodes to the cubin
    lowered = jax.jit(back.call).trace(F64, F64).lower(lowering_platforms=("cuda",))
    (cc,) = custom_calls(lowered)
    (kernel,) = kernels_of(proto.decode_opaque(cc["opaque"]))
    assert kernel.kernel_name == "add_kernel" and kernel.module_image.object_file[:4] == b"\x7fELF"


def test_exported_ptx_calls_use_the_legacy_target(cache):
    checks = [
        jax.export.DisabledSafetyCheck.custom_call(n) for n in bridge.CUSTOM_CALL_TARGET_NAMES
    ]
    fn = jax.jit(
        lambda x, y: call(
            x,
            y,
            x.size,
            kernel=add_kernel,
            out_type=x,
            grid=(8,),
            BLOCK_SIZE=8,
            cache=cache,
            embed="ptx",
        )
    )
    text = jax.export.export(fn, platforms=["cuda"], disabled_checks=checks)(F64, F64).mlir_module()
    assert "@triton_kernel_call(" in text


# -- jax-triton 0.3 call sites, unchanged ------------------------------------------------------------
def test_03_call_sites_keep_their_meaning(cache):
    """The same dict {0: 0} means 'array 0 starts output 0, which has its own pointer' under
    out_shape= and 'operand 0 is updated in place' under out_type=; nothing warns."""

    @triton.jit
    def scaled_inc(n, x_ptr, out_ptr, BLOCK_SIZE: tl.constexpr):
        offs = tl.arange(0, BLOCK_SIZE)
        m = offs < n
        tl.store(
            out_ptr + offs, tl.load(out_ptr + offs, mask=m) + tl.load(x_ptr + offs, mask=m), mask=m
        )

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f = lambda x: bridge.triton_call(  # noqa: E731
            8,
            x,
            kernel=scaled_inc,
            out_shape=x,
            input_output_aliases={0: 0},
            grid=(1,),
            BLOCK_SIZE=8,
            target="cuda:90",
            cache=cache,
        )
        (c,) = decoded(f, F8)
        assert kinds(c) == ["i32", "array", "array"]
        (cc,) = custom_calls(lowered_module(f, F8))
        assert cc["operands"] == 1 and cc["results"] == 1 and "operand_index = 0" in cc["aliases"]
        # outputs after the positional arguments, a tuple out_shape, a list of in-place inputs
        pair = jax.eval_shape(
            lambda a: bridge.triton_call(
                a, kernel=two_outputs_kernel, out_shape=(a, a), grid=(1,), target="cuda:90"
            ),
            jax.ShapeDtypeStruct((1,), jnp.int32),
        )
        assert isinstance(pair, tuple) and len(pair) == 2
        named = jax.eval_shape(
            lambda a: bridge.triton_call(
                a,
                kernel=two_outputs_kernel,
                out_shape={"y_ptr": a, "x_ptr": a},
                grid=(1,),
                target="cuda:90",
            ),
            jax.ShapeDtypeStruct((1,), jnp.int32),
        )
        assert isinstance(named, dict) and set(named) == {"x_ptr", "y_ptr"}
        inplace = jax.eval_shape(
            lambda x, y: bridge.triton_call(
                x,
                y,
                8,
                kernel=add_inplace_kernel,
                input_output_aliases=["y_ptr"],
                grid=(1,),
                BLOCK_SIZE=8,
                INPLACE_Y=True,
                target="cuda:90",
            ),
            F8,
            F8,
        )
        assert inplace.shape == (8,)


def test_03_keywords_name_metadata_and_compute_capability(cache):
    def f(x, y, **kw):
        return bridge.triton_call(
            x, y, x.size, kernel=add_kernel, out_shape=x, grid=(1,), BLOCK_SIZE=8, cache=cache, **kw
        )

    (c,) = decoded(
        lambda x, y: f(
            x,
            y,
            compute_capability=80,
            name="my_add",
            serialized_metadata=b"\x01meta",
            custom_call_target_name="triton_kernel_call",
        ),
        F8,
        F8,
    )
    assert (c.name, c.metadata) == ("my_add", b"\x01meta")
    assert kernels_of(c)[0].compute_capability == 80 and ".target sm_80" in kernels_of(c)[0].ptx
    with pytest.raises(bridge.KernelArgumentError, match="custom_call_target_name='mine'"):
        jax.eval_shape(lambda x, y: f(x, y, custom_call_target_name="mine"), F8, F8)
    with pytest.raises(bridge.KernelArgumentError, match="target= or compute_capability="):
        jax.eval_shape(lambda x, y: f(x, y, compute_capability=80, target="cuda:90"), F8, F8)
