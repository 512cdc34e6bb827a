"""On an NVIDIA GPU: results against jnp in every embedding the installed jaxlib allows, and the
multi-process story with JAX's persistent compilation cache.

Run on the GPU machine with:  python -m pytest -m gpu tests/test_bridge_gpu.py -v
"""

from __future__ import annotations

import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from bridge_helpers import TESTS, decoded, kernels_of, run_child

import bridge
import kernelcache
from bridge import embed as bridge_embed
from bridge import ptxisa, versions
from examples import kernels as K
from examples import ops


def _cuda_devices() -> list:
    try:
        return jax.devices("cuda")
    except RuntimeError:
        return []


HAS_GPU = bool(_cuda_devices())
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
    other = "cuda:80" if _cuda_devices()[0].compute_capability != "8.0" else "cuda:90"
    with pytest.raises(bridge.TargetError, match="does not run on this machine"):
        jax.jit(lambda a, b: ops.add(a, b, target=other, cache=cache)).lower(
            jnp.ones(8), jnp.ones(8)
        )


CHILD = (
    f"TESTS = {str(TESTS)!r}\n"
    + r"""
import json, os, sys
sys.path.insert(0, TESTS)
counts = {"make_ir": 0}
import triton.compiler.compiler as tc
from triton.experimental.gluon import _runtime as gr
for owner in (tc.ASTSource, gr.GluonASTSource):
    original = owner.make_ir
    def counted(self, *a, _original=original, **k):
        counts["make_ir"] += 1
        return _original(self, *a, **k)
    owner.make_ir = counted
import jax, jax.numpy as jnp, numpy as np
hits = []
jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None)
import bridge
from bridge import compile as bridge_compile
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
