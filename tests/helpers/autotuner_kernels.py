"""Kernels whose autotune lists use what Triton's autotuner accepts: backend options in a
config, configs that cannot compile or launch, and pre_hooks that shape host descriptors or
zero outputs (tests/bridge/tune/test_autotune.py, tests/bridge/call/test_call_gpu.py). Importable by child
processes and by ``kernelcache warm``."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


# -- backend options in a config ----------------------------------------------------------------
@triton.jit
def fma_kernel(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
    """out = x * y + x: one fused multiply-add unless FP fusion is off."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * y + x, mask=mask)


FUSION_CONFIGS = [
    triton.Config({"BLOCK": 256}),
    triton.Config({"BLOCK": 256, "enable_fp_fusion": False}),
]
fma_fusion = triton.autotune(configs=FUSION_CONFIGS, key=["n"])(fma_kernel)


@triton.jit
def dot_kernel(a_ptr, b_ptr, c_ptr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """c = a @ b for one (BM, BK) x (BK, BN) block."""
    rm, rn, rk = tl.arange(0, BM), tl.arange(0, BN), tl.arange(0, BK)
    a = tl.load(a_ptr + rm[:, None] * BK + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * BN + rn[None, :])
    tl.store(c_ptr + rm[:, None] * BN + rn[None, :], tl.dot(a, b))


NONKDIM_CONFIGS = [
    triton.Config({"BM": 32, "BN": 32, "BK": 32, "matrix_instr_nonkdim": 16}),
    triton.Config({"BM": 32, "BN": 32, "BK": 32, "matrix_instr_nonkdim": 32}),
]
dot_nonkdim = triton.autotune(configs=NONKDIM_CONFIGS, key=[])(dot_kernel)


# -- configs that cannot compile ----------------------------------------------------------------
@triton.jit
def _check_block(BLOCK: tl.constexpr):
    tl.static_assert(BLOCK <= 256, "BLOCK must be at most 256")


def copy_configs(*blocks: int, nested: bool = False) -> list[triton.Config]:
    return [triton.Config({"BLOCK": b, "NESTED": nested}) for b in blocks]


@triton.autotune(configs=copy_configs(128, 512, 256, 1024), key=["n"])
@triton.jit
def bounded_copy_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr, NESTED: tl.constexpr):
    """out = x, for blocks of at most 256 elements (checked in a helper when NESTED)."""
    if NESTED:
        _check_block(BLOCK)
    else:
        tl.static_assert(BLOCK <= 256, "BLOCK must be at most 256")
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


bounded_copy = bounded_copy_kernel
bounded_copy_nested = triton.autotune(configs=copy_configs(128, 512, nested=True), key=["n"])(
    bounded_copy_kernel.fn
)
never_fits = triton.autotune(configs=copy_configs(512, 1024), key=["n"])(bounded_copy_kernel.fn)


# -- configs with more threads than a block may have on some targets -----------------------------
@triton.jit
def plain_copy_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


#: 4, 32 and 64 warps: 64 is over 1024 threads everywhere, 32 on a CDNA GPU (a wave of 64)
wide_copy = triton.autotune(
    configs=[triton.Config({"BLOCK": 1024}, num_warps=w) for w in (4, 32, 64)], key=["n"]
)(plain_copy_kernel)
only_too_wide = triton.autotune(
    configs=[triton.Config({"BLOCK": 1024}, num_warps=w) for w in (64, 128)], key=["n"]
)(plain_copy_kernel)


@triton.jit
def broken_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    """A kernel with a bug: not a config that cannot compile, but an error."""
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs) + undefined_name)  # noqa: F821


broken = triton.autotune(configs=[triton.Config({"BLOCK": 64})], key=[])(broken_kernel)


# -- configs that cannot launch: too much shared memory -----------------------------------------
@triton.jit
def matmul_kernel(
    a_ptr, b_ptr, M, N, K, c_ptr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):
    """c = a @ b, fp16 row-major, dimensions multiples of the blocks."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.float16))


#: 256x256x128 in 4 stages needs 524,288 B of shared memory on sm_90, 393,216 B of LDS on gfx942
HUGE = triton.Config({"BM": 256, "BN": 256, "BK": 128}, num_warps=8, num_stages=4)
SMALL = triton.Config({"BM": 32, "BN": 32, "BK": 32}, num_warps=4, num_stages=2)
matmul_huge = triton.autotune(configs=[HUGE, SMALL], key=["M", "N", "K"])(matmul_kernel)
matmul_only_huge = triton.autotune(configs=[HUGE], key=["M", "N", "K"])(matmul_kernel)


def matmul_grid(meta):
    return (triton.cdiv(meta["M"], meta["BM"]), triton.cdiv(meta["N"], meta["BN"]))


# -- pre_hooks ------------------------------------------------------------------------------
def shape_descriptors(nargs):
    """Give each host descriptor the config's block (the descriptors are made with a dummy
    [1, 1] block); a pointer argument is left alone."""
    if not isinstance(nargs["x_desc"], TensorDescriptor):
        return
    nargs["x_desc"].block_shape = [nargs["BM"], nargs["BN"]]


TMA_CONFIGS = [
    triton.Config({"BM": 32, "BN": 64}, num_warps=4, pre_hook=shape_descriptors),
    triton.Config({"BM": 64, "BN": 32}, num_warps=4, pre_hook=shape_descriptors),
    triton.Config({"BM": 16, "BN": 128}, num_warps=4, pre_hook=shape_descriptors),
]


@triton.autotune(configs=TMA_CONFIGS, key=["M", "N"])
@triton.jit
def tma_double_kernel(x_desc, M, N, out_ptr, BM: tl.constexpr, BN: tl.constexpr):
    """out = 2 * x, tile by tile: x through a host TMA descriptor (or a pointer)."""
    pm, pn = tl.program_id(0), tl.program_id(1)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    if isinstance(x_desc, tl.tensor_descriptor):
        x = x_desc.load([pm * BM, pn * BN])
    else:
        x = tl.load(x_desc + rm[:, None] * N + rn[None, :])
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], x * 2)


tma_double = tma_double_kernel


def tma_grid(meta):
    return (triton.cdiv(meta["M"], meta["BM"]), triton.cdiv(meta["N"], meta["BN"]))


@triton.jit
def sum_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    """out[0] += the sum of x: correct only if out starts zeroed."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.atomic_add(out_ptr, tl.sum(x, axis=0))


def zero_output(nargs):
    nargs["out_ptr"].zero_()


ZEROING_CONFIGS = [
    triton.Config({"BLOCK": 128}, pre_hook=zero_output),
    triton.Config({"BLOCK": 512}, pre_hook=zero_output),
]
PLAIN_CONFIGS = [triton.Config({"BLOCK": 128}), triton.Config({"BLOCK": 512})]
sum_zeroing = triton.autotune(configs=ZEROING_CONFIGS, key=["n"])(sum_kernel)
sum_plain = triton.autotune(configs=PLAIN_CONFIGS, key=["n"])(sum_kernel)
sum_reset = triton.autotune(configs=PLAIN_CONFIGS, key=["n"], reset_to_zero=["out_ptr"])(sum_kernel)


def sum_grid(meta):
    return (triton.cdiv(meta["n"], meta["BLOCK"]),)


def read_data(nargs):
    """What a torch-minded hook might do: read an input's data."""
    nargs["x_ptr"].data_ptr()


sum_reading = triton.autotune(
    configs=[triton.Config({"BLOCK": 128}, pre_hook=read_data)], key=["n"]
)(sum_kernel)


def shape_by_duck_typing(nargs):
    """shape_descriptors as hooks written without imports test: a pointer has no block_shape."""
    if hasattr(nargs["x_desc"], "block_shape"):
        nargs["x_desc"].block_shape = [nargs["BM"], nargs["BN"]]


tma_double_duck = triton.autotune(
    configs=[
        triton.Config({"BM": 32, "BN": 64}, num_warps=4, pre_hook=shape_by_duck_typing),
        triton.Config({"BM": 64, "BN": 32}, num_warps=4, pre_hook=shape_by_duck_typing),
    ],
    key=["M", "N"],
)(tma_double_kernel.fn)


# -- host descriptors passed by keyword, shaped by a pre_hook -----------------------------------
def attention_blocks(nargs):
    """Give the dummy-block descriptors of q, k and v the config's blocks."""
    head = nargs["HEAD_DIM"]
    nargs["desc_q"].block_shape = [nargs["BLOCK_M"], head]
    nargs["desc_k"].block_shape = [nargs["BLOCK_N"], head]
    nargs["desc_v"].block_shape = [nargs["BLOCK_N"], head]


#: (BLOCK_M, BLOCK_N) of each attention config; BLOCK_M is a multiple of BLOCK_N
ATTENTION_BLOCKS = [(64, 32), (64, 64), (128, 64)]


@triton.autotune(
    configs=[
        triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=4, pre_hook=attention_blocks)
        for m, n in ATTENTION_BLOCKS
    ],
    key=["N_CTX", "HEAD_DIM", "CAUSAL"],
)
@triton.jit
def attention_kernel(
    desc_q,
    desc_k,
    desc_v,
    scale,
    N_CTX,
    out_ptr,
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """out = softmax(q k^T * scale) v per head, q, k, v and out (heads * N_CTX, HEAD_DIM) fp16
    row-major, read through host descriptors; query block by query block with a running
    maximum and sum (keys after the query masked out when CAUSAL)."""
    start_m = tl.program_id(0)
    row0 = tl.program_id(1) * N_CTX
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    q = desc_q.load([row0 + start_m * BLOCK_M, 0])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    end = (start_m + 1) * BLOCK_M if CAUSAL else N_CTX
    for start_n in range(0, end, BLOCK_N):
        k = desc_k.load([row0 + start_n, 0])
        s = tl.dot(q, k.T) * scale
        if CAUSAL:
            cols = start_n + tl.arange(0, BLOCK_N)
            s = tl.where(rows[:, None] >= cols[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = desc_v.load([row0 + start_n, 0])
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_new
    out = (acc / l_i[:, None]).to(tl.float16)
    cols = tl.arange(0, HEAD_DIM)
    tl.store(out_ptr + (row0 + rows)[:, None] * HEAD_DIM + cols[None, :], out)


def attention(q, k, v, causal, by_keyword=True, **kw):
    """attention_kernel on q, k, v (heads, n_ctx, head_dim) fp16 as a jax-triton 0.4 call site
    writes it: host descriptors with a dummy [1, 1] block, passed by keyword (or positionally),
    the output described by out_type."""
    import jax

    import bridge

    heads, n_ctx, head = q.shape
    descs = [
        bridge.TensorDescriptor.from_array(a.reshape(heads * n_ctx, head), [1, 1])
        for a in (q, k, v)
    ]
    args = (*descs, head**-0.5, n_ctx)
    names = ("desc_q", "desc_k", "desc_v", "scale", "N_CTX")
    out = bridge.triton_call(
        *(() if by_keyword else args),
        **(dict(zip(names, args, strict=True)) if by_keyword else {}),
        HEAD_DIM=head,
        CAUSAL=causal,
        kernel=attention_kernel,
        out_type=jax.ShapeDtypeStruct((heads * n_ctx, head), q.dtype),
        grid=lambda meta: (triton.cdiv(n_ctx, meta["BLOCK_M"]), heads),
        **kw,
    )
    return out.reshape(q.shape)
