"""JAX functions that call the example kernels through the bridge.

Each works under ``jax.jit`` and eagerly, and passes ``target=``, ``embed=``, ``cache=`` and any
other ``triton_call`` keyword through, so it can be lowered for another GPU on a machine without
one.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import triton

import bridge

from .kernels import add_kernel, gluon_scale_kernel, matmul_kernel, softmax_kernel


def add(x: jax.Array, y: jax.Array, *, block: int = 1024, **kw: Any) -> jax.Array:
    return bridge.triton_call(
        x,
        y,
        x.size,
        kernel=add_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(triton.cdiv(x.size, block),),
        BLOCK=block,
        **kw,
    )


def softmax(x: jax.Array, **kw: Any) -> jax.Array:
    rows, cols = x.shape
    block = triton.next_power_of_2(cols)
    return bridge.triton_call(
        x,
        cols,
        cols,
        kernel=softmax_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(rows,),
        BLOCK=block,
        num_warps=4 if block <= 2048 else 8,
        **kw,
    )


def matmul(a: jax.Array, b: jax.Array, **kw: Any) -> jax.Array:
    (m, k), (_, n) = a.shape, b.shape
    return bridge.triton_call(
        a,
        b,
        m,
        n,
        k,
        kernel=matmul_kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.bfloat16),
        grid=lambda meta: (triton.cdiv(m, meta["BM"]), triton.cdiv(n, meta["BN"])),
        **kw,
    )


def gluon_scale(
    x: jax.Array, scale: float, *, warp_size: int | None = None, block: int = 1024, **kw: Any
) -> jax.Array:
    """out = x * scale with a Gluon kernel whose layout has ``warp_size`` threads per warp.

    ``warp_size`` defaults to the warp size of ``target=`` (32 on NVIDIA and RDNA, 64 on CDNA
    such as gfx942), else 32. A recorded call replays with each warm target's warp size: the
    ``WARP_SIZE`` parameter follows the target (see docs/warm.md).
    """
    if warp_size is None:
        target = kw.get("target")
        warp_size = bridge.parse_target(target).warp_size if target else 32
    return bridge.triton_call(
        x,
        x.size,
        scale,
        kernel=gluon_scale_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(triton.cdiv(x.size, block),),
        BLOCK=block,
        WARP_SIZE=warp_size,
        num_warps=4,
        **kw,
    )
