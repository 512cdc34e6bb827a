"""Primitives whose kernels have the signatures TransformerEngine's own Triton kernels have:
pointers, sizes, strides, optional pointers and metas interleaved, every scalar passed in
``constexprs``. One primitive per calling pattern of TE's ``triton_call_lowering`` callers
(docs/bridge.md lists them), each with a plain ``jnp`` reference of what it computes; the
Gluon one (a layout in constexprs) is te_primitives' ``axpy_p``.

For tests/bridge/test_rule_te_patterns.py, on CPU (lowering for explicit targets) and on the GPU
machine (numerics); importable by child processes. TransformerEngine's files are not copied:
these kernels only share the shape of its signatures.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import triton
import triton.language as tl
from te_primitives import axpy_p, make_primitive

import bridge

ROWS, COLS, BLOCK_ROWS = 300, 8, 128
HIDDEN = 200


# -- a block cumsum: one operand, two results, then a size and four strides ---------------------
@triton.jit
def block_count_kernel(
    mask_ptr,
    cum_ptr,
    counts_ptr,
    num_rows,
    stride_mask_row,
    stride_mask_col,
    stride_cum_row,
    stride_cum_col,
    BLOCK: tl.constexpr,
):
    col, blk = tl.program_id(0), tl.program_id(1)
    rows = blk * BLOCK + tl.arange(0, BLOCK)
    inside = rows < num_rows
    m = tl.load(mask_ptr + rows * stride_mask_row + col * stride_mask_col, mask=inside, other=0)
    tl.store(cum_ptr + rows * stride_cum_row + col * stride_cum_col, tl.cumsum(m, 0), mask=inside)
    tl.store(counts_ptr + col * tl.num_programs(1) + blk, tl.sum(m, 0))


def _n_blocks(rows: int) -> int:
    return triton.cdiv(rows, BLOCK_ROWS)


def _block_count_rule(ctx, mask):
    rows, cols = ctx.avals_in[0].shape
    return bridge.triton_call_lowering(
        ctx,
        block_count_kernel,
        mask,
        grid=(cols, _n_blocks(rows)),
        constexprs={
            "num_rows": rows,
            "stride_mask_row": cols,
            "stride_mask_col": 1,
            "stride_cum_row": cols,
            "stride_cum_col": 1,
            "BLOCK": BLOCK_ROWS,
        },
    )


def _block_count_abstract(mask):
    rows, cols = mask.shape
    return [
        jax.core.ShapedArray(mask.shape, jnp.int32),
        jax.core.ShapedArray((cols, _n_blocks(rows)), jnp.int32),
    ]


# -- in place: two operands aliased to two results, the kernel has only their two pointers ------
@triton.jit
def add_offsets_kernel(
    cum_ptr, counts_ptr, num_rows, stride_row, stride_col, WIDTH: tl.constexpr, BLOCK: tl.constexpr
):
    col, blk = tl.program_id(0), tl.program_id(1)
    rows = blk * BLOCK + tl.arange(0, BLOCK)
    inside = rows < num_rows
    offs = tl.arange(0, WIDTH)
    before = tl.load(counts_ptr + col * tl.num_programs(1) + offs, mask=offs < blk, other=0)
    at = cum_ptr + rows * stride_row + col * stride_col
    tl.store(at, tl.load(at, mask=inside, other=0) + tl.sum(before, 0), mask=inside)


def _add_offsets_rule(ctx, cum, counts):
    rows, cols = ctx.avals_in[0].shape
    return bridge.triton_call_lowering(
        ctx,
        add_offsets_kernel,
        cum,
        counts,
        grid=(cols, _n_blocks(rows)),
        input_output_aliases={0: 0, 1: 1},
        constexprs={
            "num_rows": rows,
            "stride_row": cols,
            "stride_col": 1,
            "WIDTH": triton.next_power_of_2(_n_blocks(rows)),
            "BLOCK": BLOCK_ROWS,
        },
    )


# -- in place with the results in another order than the operands ------------------------------
@triton.jit
def bump_kernel(a_ptr, b_ptr, n_a, n_b, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(a_ptr + offs, tl.load(a_ptr + offs, mask=offs < n_a) + 1.0, mask=offs < n_a)
    tl.store(b_ptr + offs, tl.load(b_ptr + offs, mask=offs < n_b) + 10, mask=offs < n_b)


def _bump_rule(ctx, a, b):
    n_a, n_b = ctx.avals_in[0].size, ctx.avals_in[1].size
    return bridge.triton_call_lowering(
        ctx,
        bump_kernel,
        a,
        b,
        grid=(triton.cdiv(max(n_a, n_b), 256),),
        input_output_aliases={0: 1, 1: 0},
        constexprs={"n_a": n_a, "n_b": n_b, "BLOCK": 256},
    )


# -- optional inputs given as None, float scalars, a string constexpr ---------------------------
@triton.jit
def gate_kernel(
    s_ptr,
    bias_ptr,
    offsets_ptr,
    o_ptr,
    scale,
    lower_bound,
    T,
    H: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    USE_LOWER: tl.constexpr,
    CACHE: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    h = tl.program_id(1)
    inside = t < T
    x = tl.load(s_ptr + t * H + h, mask=inside, other=0.0, cache_modifier=CACHE)
    if HAS_BIAS:
        x += tl.load(bias_ptr + h)
    if offsets_ptr is not None:
        x += tl.load(offsets_ptr + h)
    if USE_LOWER:
        x = tl.maximum(x, lower_bound)
    tl.store(o_ptr + t * H + h, x * scale, mask=inside)


GATE_SCALE, GATE_LOWER = 0.5, -0.25


def _gate_rule(ctx, s, *bias):
    T, H = ctx.avals_in[0].shape
    return bridge.triton_call_lowering(
        ctx,
        gate_kernel,
        s,
        *bias,
        grid=(triton.cdiv(T, 64), H),
        constexprs={
            "scale": GATE_SCALE,
            "lower_bound": GATE_LOWER,
            "T": T,
            "H": H,
            "BLOCK": 64,
            "HAS_BIAS": bool(bias),
            "USE_LOWER": True,
            "CACHE": ".cg",
            "offsets_ptr": None,
            **({} if bias else {"bias_ptr": None}),
        },
        num_warps=2,
        num_stages=2,
    )


def gate_reference(s, bias=None):
    x = s if bias is None else s + bias[None, :]
    return jnp.maximum(x, GATE_LOWER) * GATE_SCALE


# -- an optional output given as None -------------------------------------------------------------
@triton.jit
def rownorm_kernel(x_ptr, y_ptr, sumsq_ptr, eps, n_cols, BD: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BD)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=inside, other=0.0)
    ss = tl.sum(x * x, 0)
    tl.store(y_ptr + row * n_cols + cols, x / tl.sqrt(ss + eps), mask=inside)
    if sumsq_ptr is not None:
        tl.store(sumsq_ptr + row, ss)


NORM_EPS = 1e-6


def _rownorm_rule(ctx, x, *, with_sumsq):
    rows, cols = ctx.avals_in[0].shape
    return bridge.triton_call_lowering(
        ctx,
        rownorm_kernel,
        x,
        grid=(rows,),
        constexprs={
            "eps": NORM_EPS,
            "n_cols": cols,
            "BD": triton.next_power_of_2(cols),
            **({} if with_sumsq else {"sumsq_ptr": None}),
        },
    )


def _rownorm_abstract(x, *, with_sumsq):
    y = jax.core.ShapedArray(x.shape, x.dtype)
    return [y, jax.core.ShapedArray(x.shape[:1], x.dtype)] if with_sumsq else [y]


def rownorm_reference(x):
    ss = jnp.sum(x * x, axis=1)
    return x / jnp.sqrt(ss + NORM_EPS)[:, None], ss


# -- autotuned, the block size pinned to the smallest config's, fixed grid, zero-size dummies ----
@triton.autotune(
    configs=[triton.Config({"BLOCK": b}) for b in (64, 128, 256)],
    key=["num_cols"],
)
@triton.jit
def scatter_rows_kernel(
    inp_ptr,
    dest_ptr,
    probs_ptr,
    pad_ptr,
    out_ptr,
    out_probs_ptr,
    num_cols,
    stride_inp_row,
    stride_out_row,
    WITH_PROBS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row, blk = tl.program_id(0), tl.program_id(1)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    inside = cols < num_cols
    dest = tl.load(dest_ptr + row)
    value = tl.load(inp_ptr + row * stride_inp_row + cols, mask=inside)
    tl.store(out_ptr + dest * stride_out_row + cols, value, mask=inside)
    if WITH_PROBS:
        if blk == 0:
            tl.store(out_probs_ptr + dest, tl.load(probs_ptr + row))


SMALLEST_BLOCK = min(c.kwargs["BLOCK"] for c in scatter_rows_kernel.configs)


def _scatter_rule(ctx, inp, dest, probs, pad, *, with_probs):
    rows, cols = ctx.avals_in[0].shape
    return bridge.triton_call_lowering(
        ctx,
        scatter_rows_kernel,
        inp,
        dest,
        probs,
        pad,
        grid=(rows, triton.cdiv(cols, SMALLEST_BLOCK)),
        constexprs={
            "num_cols": cols,
            "stride_inp_row": cols,
            "stride_out_row": cols,
            "WITH_PROBS": with_probs,
            "BLOCK": SMALLEST_BLOCK,
        },
    )


def _scatter_abstract(inp, dest, probs, pad, *, with_probs):
    out = jax.core.ShapedArray(inp.shape, inp.dtype)
    n = inp.shape[0] if with_probs else 0
    return [out, jax.core.ShapedArray((n,), probs.dtype)]


def scatter_inputs(with_probs: bool) -> list[jax.ShapeDtypeStruct]:
    n = ROWS if with_probs else 0
    return [
        jax.ShapeDtypeStruct((ROWS, HIDDEN), jnp.float32),
        jax.ShapeDtypeStruct((ROWS,), jnp.int32),
        jax.ShapeDtypeStruct((n,), jnp.float32),
        jax.ShapeDtypeStruct((0,), jnp.int32),
    ]


# -- TE's unpermute: autotuned, the block size pinned, a loop over routed rows, scalars given as
# jax's typed scalars (TypedInt: an int subclass carrying a dtype, with a __repr__ of its own,
# which TE's permutation rules pass in constexprs)
EXPERTS, TOKENS = 4, 64


def typed(value: int):
    """``value`` as jax's typed Python int (what TE's permutation rules pass as scalars)."""
    from jax._src.literals import TypedInt

    return TypedInt(value, jnp.dtype(jnp.int32))


@triton.autotune(
    configs=[triton.Config({"BLOCK_SIZE": b}) for b in (64, 128, 256)],
    key=["hidden_size"],
)
@triton.jit
def unpermute_kernel(
    input_ptr,
    row_id_map_ptr,
    merging_probs_ptr,
    permuted_probs_ptr,
    stride_map_token,
    stride_map_expert,
    stride_input_token,
    stride_output_token,
    stride_probs_token,
    output_ptr,
    unpermuted_probs_ptr,
    num_experts: tl.constexpr,
    hidden_size: tl.constexpr,
    WITH_MERGING_PROBS: tl.constexpr,
    PERMUTE_PROBS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    data_type = input_ptr.dtype.element_ty
    compute_type = tl.float32
    token, blk = tl.program_id(0), tl.program_id(1)
    cols = blk * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    inside = cols < hidden_size
    acc = tl.zeros((BLOCK_SIZE,), dtype=compute_type)
    routed = tl.load(
        row_id_map_ptr + token * stride_map_token + 2 * num_experts * stride_map_expert
    )
    for k in tl.range(routed):
        row = tl.load(row_id_map_ptr + token * stride_map_token + k * stride_map_expert)
        x = tl.load(input_ptr + row.to(tl.int64) * stride_input_token + cols, mask=inside)
        x = x.to(compute_type)
        if WITH_MERGING_PROBS:
            expert = tl.load(
                row_id_map_ptr + token * stride_map_token + (num_experts + k) * stride_map_expert
            )
            x *= tl.load(merging_probs_ptr + token * stride_probs_token + expert).to(compute_type)
        acc += x
        if PERMUTE_PROBS:
            tl.store(unpermuted_probs_ptr + token, tl.load(permuted_probs_ptr + row))
    tl.store(output_ptr + token * stride_output_token + cols, acc.to(data_type), mask=inside)


UNPERMUTE_BLOCK = min(c.kwargs["BLOCK_SIZE"] for c in unpermute_kernel.configs)


def _unpermute_rule(ctx, inp, row_id_map, merging_probs, permuted_probs):
    hidden = ctx.avals_in[0].shape[1]
    tokens, width = ctx.avals_in[1].shape
    return bridge.triton_call_lowering(
        ctx,
        unpermute_kernel,
        inp,
        row_id_map,
        merging_probs,
        permuted_probs,
        grid=(tokens, triton.cdiv(hidden, UNPERMUTE_BLOCK)),
        constexprs={
            "stride_map_token": typed(width),
            "stride_map_expert": typed(1),
            "stride_input_token": typed(hidden),
            "stride_output_token": typed(hidden),
            "stride_probs_token": typed(EXPERTS),
            "num_experts": typed(EXPERTS),
            "hidden_size": typed(hidden),
            "WITH_MERGING_PROBS": True,
            "PERMUTE_PROBS": False,
            "BLOCK_SIZE": UNPERMUTE_BLOCK,
        },
    )


def _unpermute_abstract(inp, row_id_map, merging_probs, permuted_probs):
    return [
        jax.core.ShapedArray((row_id_map.shape[0], inp.shape[1]), inp.dtype),
        jax.core.ShapedArray((0,), merging_probs.dtype),
    ]


def unpermute_inputs() -> list[jax.ShapeDtypeStruct]:
    return [
        jax.ShapeDtypeStruct((TOKENS * 2, HIDDEN), jnp.float32),
        jax.ShapeDtypeStruct((TOKENS, 2 * EXPERTS + 1), jnp.int32),
        jax.ShapeDtypeStruct((TOKENS, EXPERTS), jnp.float32),
        jax.ShapeDtypeStruct((0,), jnp.float32),
    ]


def unpermute_reference(inp, row_id_map, merging_probs):
    """What ``unpermute_kernel`` computes: each token's routed rows, weighted and summed."""
    routed = row_id_map[:, 2 * EXPERTS]
    out = jnp.zeros((row_id_map.shape[0], inp.shape[1]), jnp.float32)
    for k in range(EXPERTS):
        weight = jnp.take_along_axis(merging_probs, row_id_map[:, EXPERTS + k, None], axis=1)
        term = inp[jnp.clip(row_id_map[:, k], 0, inp.shape[0] - 1)] * weight
        out = out + jnp.where((k < routed)[:, None], term, 0.0)
    return out


def _first_shape(x, *rest, **_):
    return [jax.core.ShapedArray(x.shape, x.dtype)]


def _multi(name, abstract, rule):
    p = make_primitive(name, abstract, rule)
    p.multiple_results = True
    return p


unpermute_p = _multi("kc_te_unpermute", _unpermute_abstract, _unpermute_rule)
block_count_p = _multi("kc_te_block_count", _block_count_abstract, _block_count_rule)
add_offsets_p = _multi(
    "kc_te_add_offsets",
    lambda cum, counts: [jax.core.ShapedArray(a.shape, a.dtype) for a in (cum, counts)],
    _add_offsets_rule,
)
bump_p = _multi(
    "kc_te_bump",
    lambda a, b: [jax.core.ShapedArray(x.shape, x.dtype) for x in (b, a)],
    _bump_rule,
)
gate_p = _multi("kc_te_gate", _first_shape, _gate_rule)
rownorm_p = _multi(
    "kc_te_rownorm",
    lambda x: _rownorm_abstract(x, with_sumsq=False),
    lambda c, x: _rownorm_rule(c, x, with_sumsq=False),
)
rownorm_sumsq_p = _multi(
    "kc_te_rownorm_sumsq",
    lambda x: _rownorm_abstract(x, with_sumsq=True),
    lambda c, x: _rownorm_rule(c, x, with_sumsq=True),
)
scatter_p = {
    flag: _multi(
        f"kc_te_scatter_{flag}",
        lambda *a, flag=flag: _scatter_abstract(*a, with_probs=flag),
        lambda c, *a, flag=flag: _scatter_rule(c, *a, with_probs=flag),
    )
    for flag in (False, True)
}

MASK = jax.ShapeDtypeStruct((ROWS, COLS), jnp.int32)
COUNTS = jax.ShapeDtypeStruct((COLS, _n_blocks(ROWS)), jnp.int32)
GATE_S = jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32)
GATE_BIAS = jax.ShapeDtypeStruct((COLS,), jnp.float32)
NORM_X = jax.ShapeDtypeStruct((64, HIDDEN), jnp.float32)
VEC = jax.ShapeDtypeStruct((4096,), jnp.float32)
SMALL = jax.ShapeDtypeStruct((1000,), jnp.int32)


def warp_size(target: str) -> int:
    """The warp size a Gluon layout is written for on ``target`` (64 on CDNA)."""
    return 32 if target.startswith("cuda") else 64


#: each pattern's lowering, as ``(function, avals)`` for :func:`te_primitives.lowered`
def patterns(target: str) -> dict[str, tuple]:
    ws = warp_size(target)
    return {
        "block_count": (block_count_p.bind, (MASK,)),
        "add_offsets": (add_offsets_p.bind, (MASK, COUNTS)),
        "bump": (bump_p.bind, (VEC, SMALL)),
        "gate": (gate_p.bind, (GATE_S,)),
        "gate_bias": (gate_p.bind, (GATE_S, GATE_BIAS)),
        "rownorm": (rownorm_p.bind, (NORM_X,)),
        "rownorm_sumsq": (rownorm_sumsq_p.bind, (NORM_X,)),
        "scatter": (scatter_p[False].bind, tuple(scatter_inputs(False))),
        "scatter_probs": (scatter_p[True].bind, tuple(scatter_inputs(True))),
        "unpermute": (unpermute_p.bind, tuple(unpermute_inputs())),
        "axpy": (axpy_p[(ws, False)].bind, (VEC, VEC)),
        "axpy_fused": (axpy_p[(ws, True)].bind, (VEC, VEC)),
    }
