"""On an NVIDIA GPU: autotune decisions measured by ``kernelcache tune`` and inside a job, and the
results of decided calls against jaxlib's own autotuning.

Run on the GPU machine with:  python -m pytest -m gpu tests/bridge/tune/test_autotune_gpu.py -v
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from bridge_helpers import cuda_devices, decoded
from support import REPO

import bridge
import kernelcache
from bridge.cli import tune
from bridge.entries.decisions import DECISION
from examples import ops

HAS_GPU = bool(cuda_devices())
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU")]
BENCHMARKS = REPO / "benchmarks"


def rand(shape, dtype=jnp.bfloat16, seed=0):
    return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32).astype(dtype)


def attention(q, k, v, **kw):
    sys.path.insert(0, str(BENCHMARKS))
    import triton
    from tuned_models import attention_fwd_kernel

    bh, ctx, dim = q.shape
    return bridge.triton_call(
        q,
        k,
        v,
        ctx,
        kernel=attention_fwd_kernel,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid=lambda meta: (triton.cdiv(ctx, meta["BLOCK_M"]), bh),
        HEAD_DIM=dim,
        SM_SCALE=1.0 / math.sqrt(dim),
        **kw,
    )


def matmul(a, b, **kw):
    return ops.matmul(a, b, **kw)


CASES = {
    "matmul": (matmul, lambda: (rand((2048, 1024)), rand((1024, 2048), seed=1))),
    "attention": (
        attention,
        lambda: (rand((8, 1024, 64)), rand((8, 1024, 64), seed=1), rand((8, 1024, 64), seed=2)),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_tune_decides_and_the_decided_call_matches_jaxlibs_choice(tmp_path, monkeypatch, case):
    fn, make = CASES[case]
    args = make()
    cache = kernelcache.Cache(tmp_path / "root", readonly_roots=(), remote="")
    manifest = tmp_path / "manifest.jsonl"
    monkeypatch.setenv("KERNELCACHE_RECORD", str(manifest))
    runtime = jax.jit(lambda *xs: fn(*xs, cache=cache, autotune="runtime"))(*args)
    monkeypatch.delenv("KERNELCACHE_RECORD")
    (result,) = tune.tune(str(manifest), cache)
    assert result.status == "tuned", result
    made = result.decision
    assert made.device == jax.devices()[0].device_kind and not made.pinned
    assert all(t is not None and t > 0 for t in made.times), made
    assert made.noise is not None and made.margin is not None
    decided = jax.jit(lambda *xs: fn(*xs, cache=cache, autotune="require"))(*args)
    np.testing.assert_allclose(
        np.asarray(decided, np.float32), np.asarray(runtime, np.float32), atol=3e-2, rtol=3e-2
    )
    (call,) = decoded(lambda *xs: fn(*xs, cache=cache, autotune="require"), *args)
    assert call.HasField("kernel_call"), "one plain kernel call"
    again = tune.tune(str(manifest), cache)
    assert [r.status for r in again] == ["present"]


def test_a_job_tunes_inside_its_first_lowering(tmp_path):
    a, b = rand((2048, 1024)), rand((1024, 2048), seed=1)
    cache = kernelcache.Cache(tmp_path / "root", readonly_roots=(), remote="")
    out = jax.jit(lambda x, y: matmul(x, y, cache=cache, autotune="job"))(a, b)
    want = jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32))
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want), atol=0.5, rtol=5e-2)
    (call,) = decoded(lambda x, y: matmul(x, y, cache=cache, autotune="require"), a, b)
    assert call.HasField("kernel_call")
    assert len(list(Path(cache.root).glob(f"*.{DECISION.ext}"))) == 1


def test_a_direct_launch_computes_what_the_custom_call_computes():
    """Measuring launches a config through jaxlib's own kernel call on buffers of its own:
    the output it leaves is the one the compiled program gives on the same inputs."""
    from bridge.call.tracing import triton_call_p
    from bridge.lowering.lower import variant_opaque
    from bridge.tune import jaxlib_launch, measure

    a, b = rand((512, 256)), rand((256, 384), seed=1)
    (call,) = [
        e.params["call"]
        for e in jax.make_jaxpr(lambda x, y: matmul(x, y, autotune="runtime"))(a, b).eqns
        if e.primitive is triton_call_p
    ]
    bench = measure.JaxMeasurer().bench(call, variant_opaque(call, "cuda"), [0, 1], "cuda")
    assert bench.lanes[0] == jaxlib_launch.lane("cuda", 0).name and "/" in bench.lanes[0]
    assert bench.run(0, 1, 0) > 0 and bench.run(1, 3, 0) > 0
    ops, results, _ = bench._buffers[0]
    one = jax.jit(measure._launches(call, 1, 1))(*ops)
    np.testing.assert_array_equal(np.asarray(results[0]), np.asarray(one[0]))


def _recorded_matmul(tmp_path, monkeypatch, a_shape, b_shape):
    """A cache and the manifest of one autotuned matmul of those shapes, run and recorded."""
    a, b = rand(a_shape), rand(b_shape, seed=1)
    cache = kernelcache.Cache(tmp_path / "root", readonly_roots=(), remote="")
    manifest = tmp_path / "manifest.jsonl"
    monkeypatch.setenv("KERNELCACHE_RECORD", str(manifest))
    jax.jit(lambda x, y: matmul(x, y, cache=cache, autotune="runtime"))(a, b)
    monkeypatch.delenv("KERNELCACHE_RECORD")
    return cache, manifest


def test_deciding_compiles_no_program_per_config(tmp_path, monkeypatch):
    """The 4-config matmul is decided with the programs JAX compiles counted: one makes the
    synthetic inputs; none launches a config."""
    cache, manifest = _recorded_matmul(tmp_path, monkeypatch, (1024, 512), (512, 1024))
    compiled = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, *_, **__: (
            compiled.append(event)
            if event == "/jax/core/compile/backend_compile_duration"
            else None
        )
    )
    (result,) = tune.tune(str(manifest), cache)
    assert result.status == "tuned" and len(compiled) <= 1, compiled
    made = result.decision
    assert sum(1 for n in made.launches if n) == len(made.variants) and made.spent > 0
    assert made.final_by and set(made.by) == {made.final_by}


@pytest.mark.skipif(len(cuda_devices()) < 2, reason="needs two NVIDIA GPUs")
def test_tune_spreads_the_configs_over_two_gpus(tmp_path, monkeypatch):
    cache, manifest = _recorded_matmul(tmp_path, monkeypatch, (2048, 1024), (1024, 2048))
    (result,) = tune.tune(str(manifest), cache, gpus=2)
    made = result.decision
    assert result.status == "tuned" and len(set(made.by)) == 2, made.by
