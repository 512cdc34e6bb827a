"""On an NVIDIA GPU: autotune decisions measured by ``kernelcache tune`` and inside a job, and the
results of decided calls against jaxlib's own autotuning.

Run on the GPU machine with:  python -m pytest -m gpu tests/test_autotune_gpu.py -v
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

import bridge
import kernelcache
from bridge.cli import tune
from bridge.entries import decisions
from examples import ops

HAS_GPU = bool(cuda_devices())
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU")]
BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


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
    assert len(list(Path(cache.root).glob(f"*.{decisions.EXT}"))) == 1
