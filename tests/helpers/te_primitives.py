"""JAX primitives of TransformerEngine's shape (a primitive, its abstract evaluation, a
lowering rule registered for "cuda" and "rocm" that calls ``bridge.triton_call_lowering``) and
their Triton and Gluon kernels: plain, aliased, autotuned and Gluon (with a layout in
constexprs too). For the lowering-rule tests (tests/bridge/test_rule.py,
tests/bridge/test_rule_te_patterns.py) and the masquerade's; importable by child processes.

TransformerEngine's own files are not copied here: these are primitives of its shape.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import triton
import triton.language as tl
from bridge_helpers import custom_calls, lowered_module
from jax.interpreters import mlir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

import bridge

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


def make_primitive(name: str, abstract, lowering) -> Primitive:
    """A primitive named ``name`` whose ``lowering`` is registered for "cuda" and "rocm"."""
    p = Primitive(name)
    p.multiple_results = False
    p.def_abstract_eval(abstract)
    p.def_impl(lambda *a, **kw: jax.jit(lambda *b: p.bind(*b, **kw))(*a))  # pragma: no cover
    for platform in ("cuda", "rocm"):
        mlir.register_lowering(p, lowering, platform=platform)
    return p


def same_shape(x, **_):
    """The abstract evaluation of a primitive whose result is shaped as its first operand."""
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
        num_warps=4,  # (ignored, as TE ignores them: each config has its own)
        num_stages=2,
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


scale_p = make_primitive("kc_te_scale", same_shape, _scale_rule)
accumulate_p = make_primitive("kc_te_accumulate", lambda acc, x: same_shape(acc), _accumulate_rule)
absmax_p = make_primitive("kc_te_absmax", _absmax_abstract, _absmax_rule)
double32_p = make_primitive(
    "kc_te_double32", same_shape, lambda c, x: _double_rule(c, x, warp_size=32)
)
double64_p = make_primitive(
    "kc_te_double64", same_shape, lambda c, x: _double_rule(c, x, warp_size=64)
)


# -- Gluon: a layout object and scalars in constexprs, fp fusion chosen by the caller ------------
@gluon.jit
def axpy_kernel(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK: gl.constexpr, LAYOUT: gl.constexpr):
    """out = alpha * x + y, ``alpha`` and ``n`` scalar parameters bound by constexprs."""
    offs = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=LAYOUT)
    mask = offs < n
    x = gl.load(x_ptr + offs, mask=mask)
    gl.store(out_ptr + offs, alpha * x + gl.load(y_ptr + offs, mask=mask), mask=mask)


AXPY_ALPHA = 3.0


def _axpy_rule(ctx, x, y, *, warp_size, fusion):
    n = ctx.avals_in[0].size
    return bridge.triton_call_lowering(
        ctx,
        axpy_kernel,
        x,
        y,
        grid=(triton.cdiv(n, 512),),
        constexprs={
            "alpha": AXPY_ALPHA,
            "n": n,
            "BLOCK": 512,
            "LAYOUT": gl.BlockedLayout([1], [warp_size], [4], [0]),
        },
        num_warps=4,
        enable_fp_fusion=fusion,
    )


#: (warp size, fp fusion) -> the axpy primitive (one result, as a list)
axpy_p = {}
for _ws in (32, 64):
    for _fusion in (False, True):
        axpy_p[(_ws, _fusion)] = make_primitive(
            f"kc_te_axpy_{_ws}_{_fusion}",
            lambda x, y: [same_shape(x)],
            lambda c, x, y, w=_ws, f=_fusion: _axpy_rule(c, x, y, warp_size=w, fusion=f),
        )
        axpy_p[(_ws, _fusion)].multiple_results = True


F32 = jax.ShapeDtypeStruct((4096,), jnp.float32)
PLATFORMS = {"cuda:90": "cuda", "hip:gfx942": "rocm", "hip:gfx950": "rocm"}


def lowered(fn, target: str, *avals, monkeypatch):
    """The custom calls of ``fn`` lowered for ``target`` (set with ``monkeypatch``)."""
    monkeypatch.setenv("KERNELCACHE_TARGET", target)
    return custom_calls(lowered_module(fn, *avals, platform=PLATFORMS[target]))


class Env:
    """``monkeypatch.setenv`` for a child process (the environment is its own)."""

    def setenv(self, name: str, value: str) -> None:
        import os

        os.environ[name] = value
