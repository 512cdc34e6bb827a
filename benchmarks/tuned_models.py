"""Models with a realistic autotune space, for benchmarks/job_start.py: a bf16 matmul autotuned
over 16 configs and a flash-attention forward autotuned over 8 (24 kernel variants together).

The kernels follow jax-triton 0.3.x's convention (inputs and scalars, then the output pointer),
so the same call runs through the bridge and through jax-triton 0.3.1 and 0.4.1 (which takes
``out_shape=`` with a DeprecationWarning).

    fn, args, check = make_model(triton_call, "autotune", {})
    out = jax.jit(fn)(*args); assert check(out)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

MODELS = ("matmul16", "attention", "autotune")

#: 16 configs: tiles of 64/128 x 64/128, K steps of 32/64, 4 or 8 warps
MATMUL_CONFIGS = [
    triton.Config({"BM": bm, "BN": bn, "BK": bk}, num_warps=w, num_stages=3)
    for bm, bn, bk, w in itertools.product((64, 128), (64, 128), (32, 64), (4, 8))
]


@triton.autotune(configs=MATMUL_CONFIGS, key=["M", "N", "K"])
@triton.jit
def matmul16_kernel(
    a_ptr, b_ptr, M, N, K, c_ptr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):
    """C = A @ B for row-major bf16 A (MxK), B (KxN); fp32 accumulation, bf16 C."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        kk = k * BK + rk
        a = tl.load(
            a_ptr + rm[:, None] * K + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K)
        )
        b = tl.load(
            b_ptr + kk[:, None] * N + rn[None, :], mask=(kk[:, None] < K) & (rn[None, :] < N)
        )
        acc += tl.dot(a, b)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(c_ptr.dtype.element_ty), mask=mask)


#: 8 configs: query blocks of 64/128, key blocks of 32/64, 4 or 8 warps
ATTENTION_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=2)
    for bm, bn, w in itertools.product((64, 128), (32, 64), (4, 8))
]


@triton.autotune(configs=ATTENTION_CONFIGS, key=["N_CTX"])
@triton.jit
def attention_fwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    N_CTX,
    o_ptr,
    HEAD_DIM: tl.constexpr,
    SM_SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Flash-attention forward (non-causal), one (batch x head) per program column:
    O = softmax(Q K^T * SM_SCALE) V for row-major bf16 (BH, N_CTX, HEAD_DIM) tensors."""
    start_m = tl.program_id(0)
    base = tl.program_id(1) * N_CTX * HEAD_DIM
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m[:, None] < N_CTX
    q = tl.load(q_ptr + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=rows, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = SM_SCALE * 1.4426950408889634  # exp2 instead of exp
    for start_n in range(0, N_CTX, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(
            k_ptr + base + cols[None, :] * HEAD_DIM + offs_d[:, None],
            mask=cols[None, :] < N_CTX,
            other=0.0,
        )
        qk = tl.dot(q, k) * qk_scale
        qk = tl.where(cols[None, :] < N_CTX, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_ptr + base + cols[:, None] * HEAD_DIM + offs_d[None, :],
            mask=cols[:, None] < N_CTX,
            other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    acc = acc / l_i[:, None]
    out = o_ptr + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(out, acc.to(o_ptr.dtype.element_ty), mask=rows)


def make_model(
    triton_call: Callable[..., Any], model: str, extra: dict[str, Any]
) -> tuple[Callable[..., Any], tuple[Any, ...], Callable[[Any], bool]]:
    """The jitted function of ``model`` calling its kernels through ``triton_call`` (the
    bridge's or jax-triton's) with ``extra`` keywords, its arguments, and a check of its output
    against plain JAX (bf16 tolerances)."""
    import jax
    import jax.numpy as jnp

    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose from {', '.join(MODELS)}")
    key_a, key_b, key_q, key_k, key_v = jax.random.split(jax.random.PRNGKey(0), 5)
    m, k, n = 1024, 512, 1024
    a = jax.random.normal(key_a, (m, k), jnp.float32).astype(jnp.bfloat16)
    b = jax.random.normal(key_b, (k, n), jnp.float32).astype(jnp.bfloat16)
    bh, ctx, dim = 16, 512, 64
    q, kk, v = (
        jax.random.normal(key, (bh, ctx, dim), jnp.float32).astype(jnp.bfloat16)
        for key in (key_q, key_k, key_v)
    )
    scale = 1.0 / math.sqrt(dim)

    def matmul(a: Any, b: Any) -> Any:
        return triton_call(
            a,
            b,
            m,
            n,
            k,
            kernel=matmul16_kernel,
            out_shape=jax.ShapeDtypeStruct((m, n), jnp.bfloat16),
            grid=lambda meta: (triton.cdiv(m, meta["BM"]), triton.cdiv(n, meta["BN"])),
            **extra,
        )

    def attention(q: Any, k: Any, v: Any) -> Any:
        return triton_call(
            q,
            k,
            v,
            ctx,
            kernel=attention_fwd_kernel,
            out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
            grid=lambda meta: (triton.cdiv(ctx, meta["BLOCK_M"]), bh),
            HEAD_DIM=dim,
            SM_SCALE=scale,
            **extra,
        )

    def close(got: Any, want: Any) -> bool:
        got = jnp.asarray(got, jnp.float32)
        return bool(jnp.allclose(got, want, atol=5e-2, rtol=5e-2))

    def matmul_ref() -> Any:
        return jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32))

    def attention_ref() -> Any:
        f32 = [x.astype(jnp.float32) for x in (q, kk, v)]
        weights = jax.nn.softmax(jnp.einsum("bqd,bkd->bqk", f32[0], f32[1]) * scale, axis=-1)
        return jnp.einsum("bqk,bkd->bqd", weights, f32[2])

    if model == "matmul16":
        return (lambda a, b: (matmul(a, b),)), (a, b), lambda out: close(out[0], matmul_ref())
    if model == "attention":
        return (
            (lambda q, k, v: (attention(q, k, v),)),
            (q, kk, v),
            lambda out: close(out[0], attention_ref()),
        )
    return (
        (lambda a, b, q, k, v: (matmul(a, b), attention(q, k, v))),
        (a, b, q, kk, v),
        lambda out: close(out[0], matmul_ref()) and close(out[1], attention_ref()),
    )
