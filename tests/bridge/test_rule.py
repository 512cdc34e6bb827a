"""``bridge.triton_call_lowering``: TransformerEngine's lowering-rule API, in JAX primitives of
TE's shape (a primitive, its abstract evaluation, a lowering rule registered for "cuda" and
"rocm" that calls it), for plain, autotuned, aliased and Gluon kernels, for cuda:90,
hip:gfx942 and hip:gfx950 on a machine with no GPU; on the GPU machine they run
(``@pytest.mark.gpu``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import triton
import triton.language as tl
from bridge_helpers import cuda_devices, custom_calls, kernels_of, lowered_module, run_child
from jax.interpreters import mlir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

import bridge
from bridge.compile import compiler as bridge_compile
from bridge.lowering import proto

try:  # (jax 0.4.36 and later)
    from jax.extend.core import Primitive
except ImportError:  # pragma: no cover
    from jax.core import Primitive  # type: ignore[no-redef,attr-defined]


@triton.jit
def scale_kernel(x_ptr, out_ptr, n: tl.constexpr, S: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * S, mask=mask)


@triton.jit
def accumulate_kernel(acc_ptr, x_ptr, out_ptr, n: tl.constexpr, BLOCK: tl.constexpr):
    """out (aliased to acc) = acc + x: TE's in-place update through input_output_aliases."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    total = tl.load(acc_ptr + offs, mask=mask) + tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, total, mask=mask)


@triton.autotune(
    configs=[
        triton.Config({"BLOCK_SIZE": 256}),
        triton.Config({"BLOCK_SIZE": 512}, num_warps=8),
    ],
    key=["n_elements"],
)
@triton.jit
def absmax_kernel(x_ptr, out_ptr, n_elements: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """out = max |x| (TE's autotuned amax: an atomic max of each block's)."""
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    x = tl.load(x_ptr + offs, mask=offs < n_elements, other=0.0)
    tl.atomic_max(out_ptr, tl.max(tl.abs(x), axis=0))


@gluon.jit
def double_kernel(
    x_ptr,
    out_ptr,
    n_elements: gl.constexpr,
    BLOCK_SIZE: gl.constexpr,
    NUM_WARPS: gl.constexpr,
    WARP_SIZE: gl.constexpr,
):
    """AMD's fork's Gluon binding test: the layout's warps must match num_warps."""
    layout: gl.constexpr = gl.BlockedLayout([1], [WARP_SIZE], [NUM_WARPS], [0])
    offs = gl.program_id(0) * BLOCK_SIZE + gl.arange(0, BLOCK_SIZE, layout=layout)
    mask = offs < n_elements
    gl.store(out_ptr + offs, gl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)


def _primitive(name: str, abstract, lowering) -> Primitive:
    p = Primitive(name)
    p.multiple_results = False
    p.def_abstract_eval(abstract)
    p.def_impl(lambda *a, **kw: jax.jit(lambda *b: p.bind(*b, **kw))(*a))  # pragma: no cover
    for platform in ("cuda", "rocm"):
        mlir.register_lowering(p, lowering, platform=platform)
    return p


def _same(x, **_):
    return jax.core.ShapedArray(x.shape, x.dtype)


def _scale_rule(ctx, x):
    n = ctx.avals_in[0].size
    return bridge.triton_call_lowering(
        ctx,
        scale_kernel,
        x,
        grid=(triton.cdiv(n, 1024),),
        constexprs={"n": n, "S": 2.0, "BLOCK": 1024},
    )


def _accumulate_rule(ctx, acc, x):
    n = ctx.avals_in[0].size
    return bridge.triton_call_lowering(
        ctx,
        accumulate_kernel,
        acc,
        x,
        grid=(triton.cdiv(n, 512),),
        input_output_aliases={0: 0},
        constexprs={"n": n, "BLOCK": 512},
    )


def _absmax_rule(ctx, x):
    n = ctx.avals_in[0].size
    return bridge.triton_call_lowering(
        ctx,
        absmax_kernel,
        x,
        grid=lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),),
        constexprs={"n_elements": n},
        zeroed_outputs=(0,),  # (the bridge's own keyword: the maximum starts at 0)
    )


def _absmax_abstract(x):
    return jax.core.ShapedArray((1,), jnp.float32)


def _double_rule(ctx, x, *, warp_size):
    n = ctx.avals_in[0].size
    return bridge.triton_call_lowering(
        ctx,
        double_kernel,
        x,
        grid=(triton.cdiv(n, 1024),),
        constexprs={"n_elements": n, "BLOCK_SIZE": 1024, "NUM_WARPS": 4, "WARP_SIZE": warp_size},
        num_warps=4,
    )


scale_p = _primitive("kc_te_scale", _same, _scale_rule)
accumulate_p = _primitive("kc_te_accumulate", lambda acc, x: _same(acc), _accumulate_rule)
absmax_p = _primitive("kc_te_absmax", _absmax_abstract, _absmax_rule)
double32_p = _primitive("kc_te_double32", _same, lambda c, x: _double_rule(c, x, warp_size=32))
double64_p = _primitive("kc_te_double64", _same, lambda c, x: _double_rule(c, x, warp_size=64))

F32 = jax.ShapeDtypeStruct((4096,), jnp.float32)
PLATFORMS = {"cuda:90": "cuda", "hip:gfx942": "rocm", "hip:gfx950": "rocm"}


def _lowered(fn, target: str, *avals, monkeypatch):
    monkeypatch.setenv("KERNELCACHE_TARGET", target)
    return custom_calls(lowered_module(fn, *avals, platform=PLATFORMS[target]))


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELCACHE_DIR", str(tmp_path / "root"))
    return tmp_path / "root"


@pytest.mark.parametrize("target", list(PLATFORMS))
def test_a_te_primitive_lowers_through_the_cache_as_triton_call_would(root, monkeypatch, target):
    """The rule's custom call is the one ``bridge.triton_call`` gives for the same call (the
    same opaque), compiled once and found in the cache the next time."""
    compiles = bridge_compile.compile_count()
    (call,) = _lowered(lambda x: scale_p.bind(x), target, F32, monkeypatch=monkeypatch)
    assert bridge_compile.compile_count() - compiles == 1
    (again,) = _lowered(lambda x: scale_p.bind(x), target, F32, monkeypatch=monkeypatch)
    assert again["opaque"] == call["opaque"] and bridge_compile.compile_count() - compiles == 1

    def direct(x):
        return bridge.triton_call(
            x, kernel=scale_kernel, out_shape=x, grid=(4,), n=4096, S=2.0, BLOCK=1024,
            enable_fp_fusion=False,
        )  # fmt: skip

    (same,) = _lowered(direct, target, F32, monkeypatch=monkeypatch)
    assert same["opaque"] == call["opaque"]


def test_aliases_are_jaxlibs_operand_output_aliases(root, monkeypatch):
    (call,) = _lowered(
        lambda acc, x: accumulate_p.bind(acc, x), "cuda:90", F32, F32, monkeypatch=monkeypatch
    )
    assert "operand_index = 0" in call["aliases"]  # (result 0 is operand 0's buffer)


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
def test_an_autotuned_kernel_takes_its_constexprs_from_each_config(root, monkeypatch, target):
    """TE's autotuned amax: ``n_elements`` from the rule, ``BLOCK_SIZE`` and ``num_warps``
    from each config; the grid a function of them. Both configs are compiled and cached."""
    (call,) = _lowered(lambda x: absmax_p.bind(x), target, F32, monkeypatch=monkeypatch)
    message = proto.decode_opaque(call["opaque"])
    warps = sorted(k.num_warps for k in kernels_of(message))
    assert len(warps) == 2 and warps[-1] == 8
    grids = sorted(c.kernel_call.grid_0 for c in message.autotuned_kernel_call.configs)
    assert grids == [8, 16]


@pytest.mark.parametrize(
    ("target", "primitive"),
    [("cuda:90", double32_p), ("hip:gfx942", double64_p), ("hip:gfx950", double64_p)],
)
def test_a_gluon_kernel_lowers_with_its_layout(root, monkeypatch, target, primitive):
    (call,) = _lowered(lambda x: primitive.bind(x), target, F32, monkeypatch=monkeypatch)
    kernels = kernels_of(proto.decode_opaque(call["opaque"]))  # (the ROCm hand-off: two)
    assert kernels and {k.num_warps for k in kernels} == {4}


def test_a_kernel_whose_parameters_do_not_fit_is_named(root, monkeypatch):
    def rule(ctx, x):  # S is a scalar parameter but not a constexpr: TE's contract refuses it
        return bridge.triton_call_lowering(
            ctx, scale_kernel, x, grid=(4,), constexprs={"n": 4096, "BLOCK": 1024}
        )

    p = _primitive("kc_te_unfit", _same, rule)
    with pytest.raises(bridge.KernelArgumentError, match="constexprs"):
        _lowered(lambda x: p.bind(x), "cuda:90", F32, monkeypatch=monkeypatch)


def test_the_module_is_byte_identical_in_another_process(root, monkeypatch):
    code = """
    import hashlib, json, os, sys
    sys.path.insert(0, "tests")
    import jax, jax.numpy as jnp
    import test_lowering_rule as T
    from bridge.compile import compiler
    calls = T._lowered(lambda x: T.scale_p.bind(x), "cuda:90", T.F32, monkeypatch=T.Env())
    print(json.dumps([hashlib.sha256(calls[0]["opaque"]).hexdigest(), compiler.compile_count()]))
    """
    first = run_child(code, KERNELCACHE_DIR=str(root))
    second = run_child(code, KERNELCACHE_DIR=str(root))
    assert first[0] == second[0] and (first[1], second[1]) == (1, 0)


class Env:
    """``monkeypatch.setenv`` for a child process (the environment is its own)."""

    def setenv(self, name: str, value: str) -> None:
        import os

        os.environ[name] = value


# -- on the GPU machine ------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not cuda_devices(), reason="needs an NVIDIA GPU")
def test_te_primitives_run_on_the_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELCACHE_DIR", str(tmp_path / "root"))
    x = jax.random.normal(jax.random.PRNGKey(0), (4096,), jnp.float32)
    acc = jnp.arange(4096, dtype=jnp.float32)
    np.testing.assert_allclose(jax.jit(scale_p.bind)(x), x * 2.0, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(accumulate_p.bind)(acc, x), acc + x, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(absmax_p.bind)(x), jnp.max(jnp.abs(x))[None], rtol=1e-6)
    np.testing.assert_allclose(jax.jit(double32_p.bind)(x), x * 2.0, rtol=1e-6)
    assert len(list((tmp_path / "root").glob("*.cubin"))) == 5  # (scale, accumulate, 2+1)
