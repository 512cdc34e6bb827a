"""Example Triton and Gluon kernels (plain Triton: no JAX, no bridge).

Used by the tests and the benchmark, and a starting point for your own. The signatures follow
jax-triton 0.3.x's convention where they can (inputs and scalars, then output pointers); a few
put the output elsewhere to show ``out_names``. :mod:`examples.ops` calls them from JAX.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


# -- elementwise --------------------------------------------------------------------------
@triton.jit
def add_kernel(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
    """out = x + y (jax-triton 0.3.x convention: inputs and scalars, then the output pointer)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


@triton.jit
def scale_kernel(out_ptr, x_ptr, n, scale, BLOCK: tl.constexpr):
    """out = x * scale, with the output pointer *first* in the signature."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * scale, mask=mask)


@triton.jit
def axpy_inplace_kernel(y_ptr, x_ptr, a, n, BLOCK: tl.constexpr):
    """y += a * x, in place."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, y + a * tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton.jit
def pair_sum_kernel(ptrs, n, out_ptr, BLOCK: tl.constexpr):
    """out = ptrs[0] + ptrs[1]: a tuple argument."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(ptrs[0] + offs, mask=mask)
    b = tl.load(ptrs[1] + offs, mask=mask)
    tl.store(out_ptr + offs, a + b, mask=mask)


@triton.jit(do_not_specialize=["n"])
def copy_dns_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    """out = x, with ``n`` never specialized (one binary for every n)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def heuristic_copy_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    """out = x; masks only when ``n`` is not a multiple of BLOCK (a heuristic decides)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        tl.store(out_ptr + offs, tl.load(x_ptr + offs))
    else:
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton.jit
def atomic_count_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    """out[0] += number of positive elements (needs a zeroed output)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.atomic_add(out_ptr, tl.sum((x > 0).to(tl.int32), axis=0))


# -- softmax --------------------------------------------------------------------------------
@triton.jit
def softmax_kernel(x_ptr, n_cols, stride, out_ptr, BLOCK: tl.constexpr):
    """Row-wise softmax; one program per row."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    out = num / tl.sum(num, axis=0)
    tl.store(out_ptr + row * stride + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


# -- matmul (autotuned) ----------------------------------------------------------------------
MATMUL_CONFIGS = [
    triton.Config({"BM": 128, "BN": 128, "BK": 64}, num_warps=8, num_stages=3),
    triton.Config({"BM": 128, "BN": 64, "BK": 64}, num_warps=4, num_stages=4),
    triton.Config({"BM": 64, "BN": 128, "BK": 64}, num_warps=4, num_stages=4),
    triton.Config({"BM": 64, "BN": 64, "BK": 32}, num_warps=4, num_stages=4),
]


@triton.autotune(configs=MATMUL_CONFIGS, key=["M", "N", "K"])
@triton.jit
def matmul_kernel(
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
            a_ptr + rm[:, None] * K + kk[None, :],
            mask=(rm[:, None] < M) & (kk[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            b_ptr + kk[:, None] * N + rn[None, :],
            mask=(kk[:, None] < K) & (rn[None, :] < N),
            other=0.0,
        )
        acc = tl.dot(a, b, acc)
    tl.store(
        c_ptr + rm[:, None] * N + rn[None, :],
        acc.to(tl.bfloat16),
        mask=(rm[:, None] < M) & (rn[None, :] < N),
    )


# -- Gluon ----------------------------------------------------------------------------------
@gluon.jit
def gluon_scale_kernel(x_ptr, n, scale, out_ptr, BLOCK: gl.constexpr, WARP_SIZE: gl.constexpr):
    """out = x * scale with an explicit blocked layout (threads per warp = the target's)."""
    layout: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[4],
        threads_per_warp=[WARP_SIZE],
        warps_per_cta=[gl.num_warps()],
        order=[0],
    )
    offs = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=layout)
    mask = offs < n
    gl.store(out_ptr + offs, gl.load(x_ptr + offs, mask=mask) * scale, mask=mask)
