"""On an NVIDIA GPU: results against jnp in every embedding the installed jaxlib allows, and the
multi-process story with JAX's persistent compilation cache.

Run on the GPU machine with:  python -m pytest -m gpu tests/bridge/call/test_call_gpu.py -v
"""

from __future__ import annotations

import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from bridge_helpers import COUNT_COMPILES, cuda_devices, decoded, kernels_of, run_child

import bridge
import kernelcache
from bridge import versions
from bridge.embed import modes as bridge_embed
from bridge.embed import ptxisa
from examples import kernels as K
from examples import ops

HAS_GPU = bool(cuda_devices())
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU")]
MODES = ["ptx", "inline"] if versions.honours_module_image(versions.jaxlib_version()) else ["ptx"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return kernelcache.Cache(root=tmp_path_factory.mktemp("gpu-kernels"))


def rand(shape, dtype=jnp.float32, seed=0):
    return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32).astype(dtype)


@pytest.mark.parametrize("embed", MODES)
def test_add(cache, embed):
    x, y = rand((100_000,)), rand((100_000,), seed=1)
    out = jax.jit(lambda a, b: ops.add(a, b, embed=embed, cache=cache))(x, y)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x + y))
    eager = ops.add(x, y, embed=embed, cache=cache)  # outside jit too
    np.testing.assert_array_equal(np.asarray(eager), np.asarray(x + y))


@pytest.mark.parametrize("embed", MODES)
def test_softmax(cache, embed):
    x = rand((256, 1000))
    out = jax.jit(lambda a: ops.softmax(a, embed=embed, cache=cache))(x)
    np.testing.assert_allclose(
        np.asarray(out), np.asarray(jax.nn.softmax(x, axis=-1)), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("embed", MODES)
def test_autotuned_bf16_matmul(cache, embed):
    a, b = rand((1024, 512), jnp.bfloat16), rand((512, 768), jnp.bfloat16, seed=1)
    out = jax.jit(lambda p, q: ops.matmul(p, q, embed=embed, cache=cache))(a, b)
    ref = jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32))
    np.testing.assert_allclose(
        np.asarray(out.astype(jnp.float32)), np.asarray(ref), rtol=2e-2, atol=2e-1
    )


@pytest.mark.parametrize("embed", MODES)
def test_gluon(cache, embed):
    x = rand((50_000,))
    out = jax.jit(lambda a: ops.gluon_scale(a, 3.0, warp_size=32, embed=embed, cache=cache))(x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(x * 3.0), rtol=1e-6)


def test_ptx_mode_hands_jaxlib_an_isa_its_ptxas_assembles(cache):
    """embed="ptx" whatever ISA Triton writes (Triton 3.9: 9.4; jaxlib 0.11.2's ptxas: 9.0)."""
    found = ptxisa.jaxlib_assembler(cache)
    assert found is not None and os.path.isfile(found.origin), found
    x, y = rand((8192,), seed=3), rand((8192,), seed=4)
    fn = lambda a, b: ops.add(a, b, embed="ptx", cache=cache, block=256)  # noqa: E731
    for call in decoded(fn, x, y):
        for kernel in kernels_of(call):
            assert ptxisa.written_isa(kernel.ptx) <= found.isa
    np.testing.assert_array_equal(np.asarray(jax.jit(fn)(x, y)), np.asarray(x + y))


def test_the_detected_isa_is_exactly_what_jaxlib_assembles(cache, monkeypatch):
    """PTX one ISA newer than detected is refused by jaxlib, whose ptxas names the detected
    ISA as its own: the detection is neither too old nor too new."""
    found = ptxisa.jaxlib_assembler(cache)
    assert found is not None
    major, minor = (int(p) for p in found.cuda.split(".")[:2])
    beyond = ptxisa.max_isa((major, minor + 1))
    assert beyond > found.isa

    def too_new(ptx, *args, **kwargs):
        return re.sub(r"\.version \d+\.\d+", f".version {ptxisa.isa_text(beyond)}", ptx, count=1)

    monkeypatch.setattr(bridge_embed, "assembled_ptx", too_new)
    x, y = rand((8192,), seed=5), rand((8192,), seed=6)
    fn = jax.jit(lambda a, b: ops.add(a, b, embed="ptx", cache=cache, block=128))
    current = re.escape(f"current version is '{ptxisa.isa_text(found.isa)}'")
    with pytest.raises(jax.errors.JaxRuntimeError, match=current):
        fn(x, y).block_until_ready()


def test_calling_conventions_on_device(cache):
    x, y = rand((4096,)), rand((4096,), seed=1)
    call = lambda *a, **k: bridge.triton_call(*a, cache=cache, **k)  # noqa: E731
    # output first in the signature, named
    out = jax.jit(
        lambda v: call(
            v,
            v.size,
            2.0,
            kernel=K.scale_kernel,
            out_names="out_ptr",
            out_shape=v,
            grid=(4,),
            BLOCK=1024,
        )
    )(x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(2.0 * x))
    # in place
    out = jax.jit(
        lambda a, b: call(
            a,
            b,
            0.5,
            a.size,
            kernel=K.axpy_inplace_kernel,
            input_output_aliases=["y_ptr"],
            grid=(4,),
            BLOCK=1024,
        )
    )(y, x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(y + 0.5 * x), rtol=1e-6)
    # jax-triton 0.3.x dict aliasing
    out = jax.jit(
        lambda a, b: call(
            a,
            b,
            a.size,
            kernel=K.add_kernel,
            out_shape=a,
            input_output_aliases={0: 0},
            grid=(4,),
            BLOCK=1024,
        )
    )(x, y)
    np.testing.assert_allclose(np.asarray(out), np.asarray(x + y))
    # tuples
    h = rand((4096,), jnp.float16, seed=2)
    out = jax.jit(
        lambda a, b: call(
            (a, b), a.size, kernel=K.pair_sum_kernel, out_shape=a, grid=(4,), BLOCK=1024
        )
    )(x, h)
    np.testing.assert_allclose(np.asarray(out), np.asarray(x + h.astype(jnp.float32)), rtol=1e-3)
    # zeroed outputs: every call starts from zero
    count = jax.jit(
        lambda a: call(
            a,
            a.size,
            kernel=K.atomic_count_kernel,
            out_shape=jax.ShapeDtypeStruct((1,), jnp.int32),
            zeroed_outputs=(0,),
            grid=(4,),
            BLOCK=1024,
        )
    )
    expected = int(jnp.sum(x > 0))
    assert int(count(x)[0]) == expected and int(count(x)[0]) == expected
    # heuristics and do_not_specialize, two sizes each
    for n in (4096, 4000):
        v = rand((n,))
        out = jax.jit(
            lambda a: call(
                a,
                a.size,
                kernel=K.heuristic_copy_kernel,
                out_shape=a,
                grid=(-(-a.size // 256),),
                BLOCK=256,
            )
        )(v)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(v))
        out = jax.jit(
            lambda a: call(
                a,
                a.size,
                kernel=K.copy_dns_kernel,
                out_shape=a,
                grid=(-(-a.size // 256),),
                BLOCK=256,
            )
        )(v)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(v))
    # vmap runs the kernel per batch element
    xs = rand((3, 4096), seed=3)
    out = jax.jit(jax.vmap(lambda a: ops.add(a, y, cache=cache)))(xs)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(xs + y))


def test_autotuned_in_place_kernel_is_applied_once(cache):
    import triton
    import triton.language as tl

    @triton.autotune(
        configs=[triton.Config({"BLOCK": 256}), triton.Config({"BLOCK": 1024})], key=["n"]
    )
    @triton.jit
    def tuned_axpy(y_ptr, x_ptr, a, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(
            y_ptr + offs, tl.load(y_ptr + offs, mask=m) + a * tl.load(x_ptr + offs, mask=m), mask=m
        )

    x, y = rand((1 << 20,)), rand((1 << 20,), seed=1)
    out = jax.jit(
        lambda b, a: bridge.triton_call(
            b,
            a,
            2.0,
            b.size,
            kernel=tuned_axpy,
            input_output_aliases=["y_ptr"],
            grid=lambda m: (triton.cdiv(m["n"], m["BLOCK"]),),
            cache=cache,
        )
    )(y, x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(y + 2.0 * x), rtol=1e-6)


def test_a_target_for_another_gpu_is_a_clear_error(cache):
    other = "cuda:80" if cuda_devices()[0].compute_capability != "8.0" else "cuda:90"
    with pytest.raises(bridge.TargetError, match="does not run on this machine"):
        jax.jit(lambda a, b: ops.add(a, b, target=other, cache=cache)).lower(
            jnp.ones(8), jnp.ones(8)
        )


CHILD = (
    COUNT_COMPILES
    + r"""
import json, os
import jax, jax.numpy as jnp, numpy as np
hits = []
jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None)
import bridge
from bridge.compile import compiler as bridge_compile
from examples import kernels as K
from examples import ops
bridge.enable_jax_cache(os.environ["JAX_CACHE"])
x = jax.random.normal(jax.random.PRNGKey(0), (1 << 16,), jnp.float32)
a = jax.random.normal(jax.random.PRNGKey(1), (512, 256), jnp.float32).astype(jnp.bfloat16)
b = jax.random.normal(jax.random.PRNGKey(2), (256, 384), jnp.float32).astype(jnp.bfloat16)
f = jax.jit(lambda x, a, b: (ops.add(x, x), ops.matmul(a, b), ops.gluon_scale(x, 2.0)))
jax.block_until_ready((x, a, b))
hits.clear()  # count only the model's compilation, not the inputs'
s, c, g = f(x, a, b)
ref = jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32))
print(json.dumps({
    "jax_cache_hits": len(hits), "make_ir": counts["make_ir"],
    "bridge_compiles": bridge_compile.compile_count(),
    "add_ok": bool(jnp.array_equal(s, x + x)), "gluon_ok": bool(jnp.allclose(g, 2.0 * x)),
    "matmul_err": float(jnp.max(jnp.abs(c.astype(jnp.float32) - ref))),
}))
"""
)


def test_processes_share_the_jax_cache_and_survive_a_pruned_kernel_cache(tmp_path):
    env = {"KERNELCACHE_DIR": str(tmp_path / "kernels"), "JAX_CACHE": str(tmp_path / "jax")}
    first = run_child(CHILD, **env)
    assert first["add_ok"] and first["gluon_ok"] and first["matmul_err"] < 0.5
    assert first["bridge_compiles"] == 6  # add, 4 matmul configs, gluon
    second = run_child(CHILD, **env)
    assert second["jax_cache_hits"] >= 1, "JAX's persistent cache did not hit"
    assert second["make_ir"] == 0 and second["bridge_compiles"] == 0
    assert second["add_ok"] and second["gluon_ok"] and second["matmul_err"] < 0.5
    # prune the kernel cache entirely: the next process recompiles and still works
    shutil.rmtree(tmp_path / "kernels")
    os.makedirs(tmp_path / "kernels")
    third = run_child(CHILD, **env)
    assert third["add_ok"] and third["gluon_ok"] and third["matmul_err"] < 0.5
    assert third["bridge_compiles"] == 6
    # the recompiled kernels are byte-identical, so JAX's cache still hits
    assert third["jax_cache_hits"] >= 1


# -- jax-triton 0.4's call API on the device (the peer's test cases, ported) -------------------
# Each test names the peer test (jax-triton 0.4.1 tests/triton_call_test.py or gluon_test.py) it
# ports. Kernels: tests/helpers/callapi_kernels.py.
import callapi_kernels as CK  # noqa: E402

JAXLIB_TMA = versions.has_tma_descriptors(versions.jaxlib_version())


def _hopper() -> bool:
    devices = cuda_devices()
    return bool(devices) and float(devices[0].compute_capability) >= 9.0


needs_tma = pytest.mark.skipif(
    not (JAXLIB_TMA and _hopper()), reason="TMA needs jaxlib >= 0.11.1 and an sm_90+ GPU"
)


def jt_call(*args, **kw):
    """bridge.triton_call as a jax-triton 0.4 call site writes it (out_type=)."""
    return bridge.triton_call(*args, **kw)


def test_04_add_keyword_operands_and_constexpr_placement(cache):
    """triton_call_test: test_add, test_kwarg_operands_out_of_order, test_constexpr_before_operand,
    test_constexpr_defaults, test_grid_types."""
    x, y = rand((1000,)), rand((1000,), seed=1)
    for grid in (125, (125,), lambda m: 1000 // m["BLOCK_SIZE"], lambda m: (125,)):
        out = jax.jit(
            lambda a, b, grid=grid: jt_call(
                a,
                b,
                a.size,
                kernel=CK.add_kernel,
                out_type=jax.typeof(a),
                grid=grid,
                BLOCK_SIZE=8,
                cache=cache,
            )
        )(x, y)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(x + y))
    out = jt_call(
        x,
        n_elements=x.size,
        y_ptr=y,
        kernel=CK.add_kernel,
        out_type=x,
        grid=(8,),
        BLOCK_SIZE=128,
        cache=cache,
    )
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x + y))
    out = jt_call(
        x,
        y_ptr=y,
        n_elements=x.size,
        kernel=CK.constexpr_first_kernel,
        out_type=x,
        grid=(8,),
        BLOCK_SIZE=128,
        cache=cache,
    )
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x + y))
    out = jt_call(x, y, x.size, kernel=CK.add_default_kernel, out_type=x, grid=(125,), cache=cache)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x + y))
    # an output declared before an input: jax-triton 0.4 swaps the buffers; the bridge does not
    out = jt_call(
        x_ptr=x,
        n_elements=x.size,
        kernel=CK.output_first_kernel,
        out_type=x,
        grid=(8,),
        BLOCK_SIZE=128,
        cache=cache,
    )
    np.testing.assert_array_equal(np.asarray(out), np.asarray(2 * x))


def test_04_outputs_as_pytrees(cache):
    """triton_call_test: test_multiple_outputs; a dict out_type (sorted keys)."""
    a = jnp.array([42], jnp.int32)
    x, y = jt_call(a, kernel=CK.two_outputs_kernel, out_type=[a, a], grid=(1,), cache=cache)
    assert int(x[0]) == 42 and int(y[0]) == 43
    d = jt_call(a, kernel=CK.two_outputs_kernel, out_type={"b": a, "a": a}, grid=(1,), cache=cache)
    assert int(d["a"][0]) == 42 and int(d["b"][0]) == 43


@pytest.mark.parametrize("donate", [False, True])
def test_04_aliasing_and_zeroing(cache, donate):
    """triton_call_test: test_input_output_aliasing_simple/_scalar_before_array,
    test_input_output_aliasing_2outputs, test_zeroed_outputs."""
    x = rand((8,))

    def launch(v):
        return jt_call(
            8,
            v,
            kernel=CK.inc_kernel,
            out_type=jax.typeof(v),
            grid=(8,),
            BLOCK_SIZE=1,
            input_output_aliases={1: 0},
            cache=cache,
        )

    if donate:
        donating = jax.jit(launch, donate_argnums=(0,))
        arg = x + 0
        pointer = arg.unsafe_buffer_pointer()
        out = donating(arg)
        assert arg.is_deleted() and out.unsafe_buffer_pointer() == pointer
    else:
        out = launch(x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(x + 1))
    args = [rand((8,), seed=s) for s in range(4)]
    for first, aliases in ((True, {0: 0, 2: 1}), (False, {1: 0, 3: 1})):
        io = tuple(aliases)
        outs = jax.jit(
            lambda *a, first=first, aliases=aliases, io=io: jt_call(
                *a,
                8,
                kernel=CK.two_inout_kernel,
                out_type=tuple(a[i] for i in io),
                input_output_aliases=aliases,
                grid=(8,),
                BLOCK_SIZE=1,
                FIRST_INOUT=first,
                cache=cache,
            )
        )(*args)
        np.testing.assert_allclose(np.asarray(outs[0]), np.asarray(args[0] + args[1]), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(outs[1]), np.asarray(args[2] + args[3]), rtol=1e-6)
    x, y = rand((100_000,)), rand((100_000,), seed=1)
    for zeroed in ((0,), lambda _: (0,)):
        out = jt_call(
            x,
            y,
            x.size,
            kernel=CK.add_inplace_kernel,
            out_type=x,
            grid=(782,),
            BLOCK_SIZE=128,
            INPLACE_Y=True,
            input_output_aliases={1: 0},
            zeroed_outputs=zeroed,
            cache=cache,
        )
        np.testing.assert_array_equal(np.asarray(out), np.asarray(x))  # x + a zeroed y


@pytest.mark.parametrize("jit", [False, True])
def test_04_refs_are_updated_in_place(cache, jit):
    """triton_call_test: test_ref_simple, test_ref_scalar_before_ref, test_ref_with_allocated_output,
    test_ref_in_tuple_with_allocated_output, test_autotune_with_ref_and_tuple;
    gluon_test: test_memcpy_inplace."""
    x = rand((8,))
    ref = jax.new_ref(x)

    def f(r):
        return jt_call(
            8, r, kernel=CK.inc_kernel, out_type=(), grid=(8,), BLOCK_SIZE=1, cache=cache
        )

    assert (jax.jit(f) if jit else f)(ref) == ()
    np.testing.assert_array_equal(np.asarray(ref[...]), np.asarray(x + 1))
    acc, bias = rand((8,), seed=1), rand((8,), seed=2)
    acc_ref = jax.new_ref(acc)

    def g(a, r, b):
        return jt_call(a, (r, b), kernel=CK.acc_kernel, out_type=a, grid=(8,), cache=cache)

    out = (jax.jit(g) if jit else g)(x, acc_ref, bias)
    np.testing.assert_allclose(np.asarray(out), np.asarray(x + acc + bias), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(acc_ref[...]), np.asarray(acc + x), rtol=1e-6)
    a, b = rand((8,), seed=3), rand((8,), seed=4)
    a_ref, b_ref = jax.new_ref(a), jax.new_ref(b)

    def h(p, q):
        return jt_call((p, q), 8, kernel=CK.inc_pair_kernel, out_type=(), grid=(8,), cache=cache)

    assert (jax.jit(h) if jit else h)(a_ref, b_ref) == ()
    # autotuned: every trial starts from the refs' values, so the update lands exactly once
    np.testing.assert_allclose(np.asarray(a_ref[...]), np.asarray(a + 1), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(b_ref[...]), np.asarray(b + 2), rtol=1e-6)
    src = rand((500,))
    dst = jax.new_ref(jnp.zeros_like(src))

    def copy(s, d):
        return jt_call(
            s,
            d,
            500,
            kernel=CK.gluon_memcpy_kernel,
            out_type=(),
            grid=(8,),
            num_warps=1,
            block_size=64,
            cache=cache,
        )

    (jax.jit(copy) if jit else copy)(src, dst)
    np.testing.assert_array_equal(np.asarray(dst[...]), np.asarray(src))


def test_04_options_side_effects_and_callables(cache):
    """triton_call_test: test_backend_options, test_has_side_effect_parameter,
    test_cost_estimate, test_callable_constexpr_and_cache, test_tuple_tensor_args,
    test_nested_tuple_tensor_args; gluon_test: test_memcpy, test_copy_scalar."""
    x, y = rand((8,)), rand((8,), seed=1)
    base = dict(kernel=CK.add_kernel, out_type=x, grid=(1,), BLOCK_SIZE=8, cache=cache)
    for extra in (
        {"backend_options": {"num_warps": 2}},
        {"has_side_effect": True},
        {"cost_estimate": {"flops": 8, "bytes_accessed": 96}},
        {"backend_options": {"enable_fp_fusion": False}, "num_warps": 1},
    ):
        out = jax.jit(lambda a, b, extra=extra: jt_call(a, b, 8, **base, **extra))(x, y)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(x + y))
    for fn, ref in ((CK.add_fn, x + y), (CK.mul_fn, x * y)):
        out = jt_call(
            x, y, kernel=CK.dispatch_kernel, out_type=x, grid=(1,), FN=fn, BLOCK_SIZE=8, cache=cache
        )
        np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-6)
    src = rand((16 * 1024 + 1,))
    out = jt_call(
        src,
        size=src.size,
        kernel=CK.gluon_memcpy_kernel,
        out_type=src,
        grid=(257,),
        num_warps=1,
        block_size=64,
        cache=cache,
    )
    np.testing.assert_array_equal(np.asarray(out), np.asarray(src))
    scalar = jnp.array(42.5, jnp.float32)  # a 0-d array in and out
    out = jt_call(
        scalar,
        kernel=CK.gluon_memcpy_kernel,
        out_type=scalar,
        grid=1,
        size=1,
        block_size=1,
        cache=cache,
    )
    assert float(out) == 42.5


@needs_tma
@pytest.mark.parametrize("shape", [(32, 32), (8, 64), (16, 128)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "float8_e5m2", "int32", "int8", "uint16"])
def test_04_host_tma_descriptor(cache, shape, dtype):
    """triton_call_test: test_host_side_tma_copy (zero padding; NaN padding and TF32 below)."""
    x = (jax.random.uniform(jax.random.PRNGKey(0), shape) * 100).astype(dtype)
    desc = bridge.TensorDescriptor.from_array(x, block_shape=list(shape))
    out = jax.jit(
        lambda d: jt_call(
            d,
            kernel=CK.tma_copy_kernel,
            out_type=d.base,
            grid=1,
            M=shape[0],
            N=shape[1],
            cache=cache,
        )
    )(desc)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x))


@needs_tma
def test_04_host_tma_padding_and_tf32(cache):
    """Out-of-bounds rows read as NaN or zero as the descriptor says; round_f32_to_tf32 rounds
    like lax.reduce_precision(exponent 8, mantissa 10)."""
    x = jax.random.uniform(jax.random.PRNGKey(0), (32, 32), jnp.float32)
    for padding, fill in (("nan", np.nan), ("zero", 0.0)):
        desc = bridge.TensorDescriptor(x, (32, 24), (32, 1), (32, 32), padding=padding)
        out = np.asarray(
            jt_call(desc, kernel=CK.tma_copy_kernel, out_type=x, grid=1, M=32, N=32, cache=cache)
        )
        np.testing.assert_array_equal(out[:, :24], np.asarray(x)[:, :24])
        np.testing.assert_array_equal(out[:, 24:], np.full((32, 8), fill, np.float32))
    desc = bridge.TensorDescriptor.from_array(x, [32, 32], round_f32_to_tf32=True)
    out = jt_call(desc, kernel=CK.tma_copy_kernel, out_type=x, grid=1, M=32, N=32, cache=cache)
    expected = jax.lax.reduce_precision(x, exponent_bits=8, mantissa_bits=10)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(expected))


@needs_tma
@pytest.mark.parametrize("shape", [(32, 32), (8, 64), (16, 128)])
def test_04_device_tma_descriptors(cache, shape):
    """triton_call_test: test_device_side_tma_copy; gluon_test: test_device_desc_tma_copy
    (global scratch memory, TritonKernel fields 12/13)."""
    x = jax.random.uniform(jax.random.PRNGKey(0), shape, jnp.float32)
    for kernel in (CK.device_tma_copy_kernel, CK.gluon_device_tma_copy_kernel):
        out = jt_call(
            x, kernel=kernel, out_type=jax.typeof(x), grid=1, M=shape[0], N=shape[1], cache=cache
        )
        np.testing.assert_array_equal(np.asarray(out), np.asarray(x))


@needs_tma
@pytest.mark.parametrize("shape, swizzle", [((16, 32), 128), ((16, 16), 64), ((16, 8), 32)])
def test_04_gluon_host_tma_descriptor(cache, shape, swizzle):
    """gluon_test: test_host_desc_tma_copy."""
    from triton.experimental.gluon import language as gl

    x = jax.random.uniform(jax.random.PRNGKey(0), shape, jnp.float32)
    layout = gl.NVMMASharedLayout(swizzle, element_bitwidth=32, rank=2)
    desc = bridge.TensorDescriptor.from_array(x, block_shape=list(shape), layout=layout)
    out = jt_call(
        desc,
        kernel=CK.gluon_host_tma_copy_kernel,
        out_type=x,
        grid=1,
        M=shape[0],
        N=shape[1],
        cache=cache,
    )
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x))


def test_03_call_sites_on_device(cache):
    """jax-triton 0.3 call sites next to their 0.4 spelling: same results."""
    x = rand((8,))
    old = bridge.triton_call(
        x, x.size, kernel=K.copy_dns_kernel, out_shape=x, grid=(1,), BLOCK=8, cache=cache
    )
    new = jt_call(x, x.size, kernel=K.copy_dns_kernel, out_type=x, grid=(1,), BLOCK=8, cache=cache)
    np.testing.assert_array_equal(np.asarray(old), np.asarray(new))
    # the same alias dict, two meanings: 0.3 counts arrays only, 0.4 counts the scalar too
    y = rand((8,), seed=1)
    old = bridge.triton_call(
        x,
        y,
        8,
        kernel=CK.add_inplace_kernel,
        input_output_aliases=["x_ptr"],
        grid=(1,),
        BLOCK_SIZE=8,
        INPLACE_Y=False,
        cache=cache,
    )
    new = jt_call(
        x,
        y,
        8,
        kernel=CK.add_inplace_kernel,
        out_type=x,
        input_output_aliases={0: 0},
        grid=(1,),
        BLOCK_SIZE=8,
        INPLACE_Y=False,
        cache=cache,
    )
    np.testing.assert_allclose(np.asarray(old), np.asarray(x + y), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(new), np.asarray(x + y), rtol=1e-6)


# -- jax.export: export, serialize, deserialize, run ------------------------------------------------
needs_flatbuffers = pytest.mark.skipif(
    __import__("importlib").util.find_spec("flatbuffers") is None,
    reason="jax.export serialization needs flatbuffers (pip install flatbuffers)",
)
EXPORT_CHILD = r"""
import sys
sys.modules["triton"] = None  # importing triton fails in this process
import json, jax, jax.numpy as jnp, numpy as np
blob = open(sys.argv[1], "rb").read()
exported = jax.export.deserialize(bytearray(blob))
x = jnp.arange(4096, dtype=jnp.float32)
out = exported.call(x, x * 2)
print(json.dumps({"ok": bool(jnp.array_equal(out, x * 3)), "triton": sys.modules.get("triton") is not None}))
"""


@needs_flatbuffers
@pytest.mark.parametrize("embed", MODES)
def test_export_round_trip_runs(cache, embed, tmp_path):
    """Export (as on a machine without a GPU: platforms=["cuda"], a target), serialize,
    deserialize and run; with inline machine code also in a process where Triton cannot be
    imported."""
    checks = [
        jax.export.DisabledSafetyCheck.custom_call(n) for n in bridge.CUSTOM_CALL_TARGET_NAMES
    ]
    cc = cuda_devices()[0].compute_capability.replace(".", "")
    f = jax.jit(lambda a, b: ops.add(a, b, target=f"cuda:{cc}", embed=embed, cache=cache))
    spec = jax.ShapeDtypeStruct((4096,), jnp.float32)
    blob = jax.export.export(f, platforms=["cuda"], disabled_checks=checks)(spec, spec).serialize()
    back = jax.export.deserialize(blob)
    x = jnp.arange(4096, dtype=jnp.float32)
    np.testing.assert_array_equal(np.asarray(back.call(x, x * 2)), np.asarray(x * 3))
    if embed == "inline":
        path = tmp_path / "add.jax_exported"
        path.write_bytes(blob)
        result = run_child(EXPORT_CHILD.replace("sys.argv[1]", repr(str(path))))
        assert result == {"ok": True, "triton": False}


# -- Triton's autotuner: per-config descriptor blocks and zeroing pre_hooks -------------------------
# Kernels: tests/helpers/autotuner_kernels.py (lowered on CPU by tests/bridge/tune/test_autotune.py).
import autotuner_kernels as AK  # noqa: E402

from bridge.cli import tune  # noqa: E402


def tma_double(x, cache, **kw):
    """2 * x through AK.tma_double: its descriptor made with a dummy [1, 1] block, which each
    config's pre_hook replaces with the config's (BM, BN)."""
    desc = bridge.TensorDescriptor.from_array(x, [1, 1])
    m, n = x.shape
    return bridge.triton_call(
        desc, m, n, kernel=AK.tma_double, out_shape=x, grid=AK.tma_grid, cache=cache, **kw
    )


TMA_BLOCKS = [(32, 64), (64, 32), (16, 128)]


@needs_tma
def test_per_config_descriptor_blocks_reach_the_launch(tmp_path, monkeypatch):
    """Every config of an autotuned TMA kernel runs with its own descriptor block: jaxlib
    autotuning over all of them, and each one alone through a pinned decision."""
    x = rand((256, 512), jnp.float16)
    want = np.asarray(x) * 2  # exact in fp16
    base = kernelcache.Cache(tmp_path / "base", readonly_roots=(), remote="")
    manifest = tmp_path / "manifest.jsonl"
    monkeypatch.setenv("KERNELCACHE_RECORD", str(manifest))
    (every,) = decoded(lambda a: tma_double(a, base, autotune="runtime"), x)
    monkeypatch.delenv("KERNELCACHE_RECORD")
    configs = every.autotuned_kernel_call.configs
    assert [c.kernel_call.grid_0 for c in configs] == [256 // bm for bm, _ in TMA_BLOCKS]
    got = jax.jit(lambda a: tma_double(a, base, autotune="runtime"))(x)
    np.testing.assert_array_equal(np.asarray(got), want)
    for i, (bm, bn) in enumerate(TMA_BLOCKS):
        # a layer of its own for each pin: kernels from the base, the decision on top
        pinned = kernelcache.Cache(tmp_path / f"pin{i}", readonly_roots=(base.root,), remote="")
        (result,) = tune.tune(str(manifest), pinned, pins={"tma_double_kernel": i})
        assert result.status == "pinned", result.detail
        (alone,) = decoded(lambda a, c=pinned: tma_double(a, c, autotune="require"), x)
        assert alone.HasField("kernel_call"), f"config {i} alone"
        assert (alone.kernel_call.grid_0, alone.kernel_call.grid_1) == (256 // bm, 512 // bn)
        desc = alone.kernel_call.parameters[0].tensor_descriptor.nvidia
        assert desc.block_shape[0] == bm  # the TMA box: Triton splits rows over 128 bytes
        got = jax.jit(lambda a, c=pinned: tma_double(a, c, autotune="require"))(x)
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=f"config {i}: {bm}x{bn}")


def attention_reference(q, k, v, causal):
    """softmax(q k^T / sqrt(d)) v per head, in float32."""
    q, k, v = (a.astype(jnp.float32) for a in (q, k, v))
    s = jnp.einsum("hqd,hkd->hqk", q, k) * q.shape[-1] ** -0.5
    if causal:
        n = q.shape[1]
        s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), s, -jnp.inf)
    return jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(s, axis=-1), v)


@needs_tma
@pytest.mark.parametrize("causal", [False, True])
def test_descriptors_passed_by_keyword_run_with_the_blocks_their_pre_hook_sets(cache, causal):
    """AK.attention passes dummy-block descriptors by keyword; each config's pre_hook gives
    them the config's blocks. Every config alone (pinned by its blocks) and jaxlib's autotuning
    over all of them compute the attention."""
    q, k, v = (rand((4, 512, 64), jnp.float16, seed=i) for i in range(3))
    want = np.asarray(attention_reference(q, k, v, causal))
    runs = [{"autotune": "runtime"}] + [
        {"BLOCK_M": m, "BLOCK_N": n} for m, n in AK.ATTENTION_BLOCKS
    ]
    for kw in runs:
        got = jax.jit(lambda a, b, c, kw=kw: AK.attention(a, b, c, causal, cache=cache, **kw))(
            q, k, v
        )
        np.testing.assert_allclose(
            np.asarray(got, np.float32), want, rtol=2e-2, atol=2e-2, err_msg=str(kw)
        )


def test_a_zeroing_pre_hook_zeroes_the_output_before_each_launch(cache):
    """AK.sum_kernel atomically adds into out[0], so it is right only if out is zeroed before
    each launch, which the configs' pre_hook asks for (nargs["out_ptr"].zero_()). The output's
    buffer starts as 1000 (aliased to an input): without the zeroing the sum would be off by
    that, and by every earlier launch of jaxlib's autotuning."""
    x = rand((100_000,))
    want = float(np.asarray(x, np.float64).sum())
    one = jax.ShapeDtypeStruct((1,), jnp.float32)

    def total(a, init, **kw):
        return bridge.triton_call(
            a,
            a.size,
            init,
            kernel=AK.sum_zeroing,
            out_type=one,
            input_output_aliases={2: 0},
            grid=AK.sum_grid,
            cache=cache,
            **kw,
        )

    init = jnp.full((1,), 1000.0, jnp.float32)
    for kw in ({"autotune": "runtime"}, {"BLOCK": 128}, {"BLOCK": 512}):
        for _ in range(2):
            got = float(jax.jit(lambda a, i, kw=kw: total(a, i, **kw))(x, init)[0])
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=0.05, err_msg=str(kw))
