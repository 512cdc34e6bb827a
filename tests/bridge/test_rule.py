"""``bridge.triton_call_lowering``: TransformerEngine's lowering-rule API, in JAX primitives of
TE's shape (a primitive, its abstract evaluation, a lowering rule registered for "cuda" and
"rocm" that calls it), for plain, autotuned, aliased and Gluon kernels, for cuda:90,
hip:gfx942 and hip:gfx950 on a machine with no GPU; on the GPU machine they run
(``@pytest.mark.gpu``). The primitives and their kernels are in tests/helpers/te_primitives.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from bridge_helpers import cuda_devices, kernels_of, run_child
from support import HELPERS
from te_primitives import (
    F32,
    PLATFORMS,
    absmax_p,
    accumulate_p,
    double32_p,
    double64_p,
    lowered,
    make_primitive,
    same_shape,
    scale_kernel,
    scale_p,
)

import bridge
from bridge.compile import compiler as bridge_compile
from bridge.lowering import proto


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELCACHE_DIR", str(tmp_path / "root"))
    return tmp_path / "root"


@pytest.mark.parametrize("target", list(PLATFORMS))
def test_a_te_primitive_lowers_through_the_cache_as_triton_call_would(root, monkeypatch, target):
    """The rule's custom call is the one ``bridge.triton_call`` gives for the same call with
    TE's compile options (the same opaque), compiled once and found in the cache the next
    time."""
    compiles = bridge_compile.compile_count()
    (call,) = lowered(lambda x: scale_p.bind(x), target, F32, monkeypatch=monkeypatch)
    assert bridge_compile.compile_count() - compiles == 1
    (again,) = lowered(lambda x: scale_p.bind(x), target, F32, monkeypatch=monkeypatch)
    assert again["opaque"] == call["opaque"] and bridge_compile.compile_count() - compiles == 1

    def direct(x):
        return bridge.triton_call(
            x, kernel=scale_kernel, out_shape=x, grid=(4,), n=4096, S=2.0, BLOCK=1024,
            enable_fp_fusion=False, num_warps=4, num_stages=3,
        )  # fmt: skip

    (same,) = lowered(direct, target, F32, monkeypatch=monkeypatch)
    assert same["opaque"] == call["opaque"]


def test_aliases_are_jaxlibs_operand_output_aliases(root, monkeypatch):
    (call,) = lowered(
        lambda acc, x: accumulate_p.bind(acc, x), "cuda:90", F32, F32, monkeypatch=monkeypatch
    )
    assert "operand_index = 0" in call["aliases"]  # (result 0 is operand 0's buffer)


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
def test_an_autotuned_kernel_takes_its_constexprs_from_each_config(root, monkeypatch, target):
    """TE's autotuned amax: ``n_elements`` from the rule, ``BLOCK_SIZE`` and ``num_warps``
    from each config (the rule's own ``num_warps`` and ``num_stages`` ignored); the grid a
    function of them. Both configs are compiled and cached."""
    (call,) = lowered(lambda x: absmax_p.bind(x), target, F32, monkeypatch=monkeypatch)
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
    (call,) = lowered(lambda x: primitive.bind(x), target, F32, monkeypatch=monkeypatch)
    kernels = kernels_of(proto.decode_opaque(call["opaque"]))  # (the ROCm hand-off: two)
    assert kernels and {k.num_warps for k in kernels} == {4}


def test_a_kernel_whose_parameters_do_not_fit_is_named(root, monkeypatch):
    def rule(ctx, x):  # S is a scalar parameter but not a constexpr: TE's contract refuses it
        return bridge.triton_call_lowering(
            ctx, scale_kernel, x, grid=(4,), constexprs={"n": 4096, "BLOCK": 1024}
        )

    p = make_primitive("kc_te_unfit", same_shape, rule)
    with pytest.raises(bridge.KernelArgumentError, match="constexprs"):
        lowered(lambda x: p.bind(x), "cuda:90", F32, monkeypatch=monkeypatch)


def test_the_module_is_byte_identical_in_another_process(root, monkeypatch):
    code = f"""
    import hashlib, json, os, sys
    sys.path.insert(0, {str(HELPERS)!r})
    import jax, jax.numpy as jnp
    import te_primitives as T
    from bridge.compile import compiler
    calls = T.lowered(lambda x: T.scale_p.bind(x), "cuda:90", T.F32, monkeypatch=T.Env())
    print(json.dumps([hashlib.sha256(calls[0]["opaque"]).hexdigest(), compiler.compile_count()]))
    """
    first = run_child(code, KERNELCACHE_DIR=str(root))
    second = run_child(code, KERNELCACHE_DIR=str(root))
    assert first[0] == second[0] and (first[1], second[1]) == (1, 0)


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
