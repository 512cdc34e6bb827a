"""Kernels for the jax-triton 0.4 call API tests (tests/bridge/call/test_call_api.py on CPU,
tests/bridge/call/test_call_gpu.py on an H200): the peer's test kernels, in this project's style.

Gluon kernels use the mbarrier API every supported Triton has (allocate_shared_memory with an
MBarrierLayout, ``expect`` with the byte count), and the TMA copies under their current names
(``async_load`` / ``async_store`` since Triton 3.7; ``async_copy_*`` before)."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper as gh

tma_load = getattr(gh.tma, "async_load", None) or gh.tma.async_copy_global_to_shared
tma_store = getattr(gh.tma, "async_store", None) or gh.tma.async_copy_shared_to_global


@triton.jit
def add_kernel(x_ptr, y_ptr, n_elements, output_ptr, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    m = offs < n_elements
    x = tl.load(x_ptr + offs, mask=m)
    tl.store(output_ptr + offs, x + tl.load(y_ptr + offs, mask=m), mask=m)


@triton.jit
def add_default_kernel(x_ptr, y_ptr, n_elements, output_ptr, BLOCK_SIZE: tl.constexpr = 8):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    m = offs < n_elements
    x = tl.load(x_ptr + offs, mask=m)
    tl.store(output_ptr + offs, x + tl.load(y_ptr + offs, mask=m), mask=m)


@triton.jit
def add_inplace_kernel(x_ptr, y_ptr, n_elements, BLOCK_SIZE: tl.constexpr, INPLACE_Y: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    m = offs < n_elements
    out = tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m)
    if INPLACE_Y:
        tl.store(y_ptr + offs, out, mask=m)
    else:
        tl.store(x_ptr + offs, out, mask=m)


@triton.jit
def inc_kernel(n_elements, x_in_out_ptr, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    m = offs < n_elements
    tl.store(x_in_out_ptr + offs, tl.load(x_in_out_ptr + offs, mask=m) + 1, mask=m)


@triton.jit
def constexpr_first_kernel(x_ptr, BLOCK_SIZE: tl.constexpr, y_ptr, n_elements, output_ptr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    m = offs < n_elements
    x = tl.load(x_ptr + offs, mask=m)
    tl.store(output_ptr + offs, x + tl.load(y_ptr + offs, mask=m), mask=m)


@triton.jit
def output_first_kernel(out_ptr, x_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    m = offs < n_elements
    tl.store(out_ptr + offs, 2 * tl.load(x_ptr + offs, mask=m), mask=m)


@triton.jit
def two_outputs_kernel(a_ptr, x_ptr, y_ptr):
    a = tl.load(a_ptr)
    tl.store(x_ptr, a)
    tl.store(y_ptr, a + 1)


@triton.jit
def acc_kernel(x_ptr, acc_and_bias, out_ptr):
    acc_ptr = acc_and_bias[0]
    pid = tl.program_id(0)
    x = tl.load(x_ptr + pid)
    acc = tl.load(acc_ptr + pid)
    tl.store(out_ptr + pid, x + acc + tl.load(acc_and_bias[1] + pid))
    tl.store(acc_ptr + pid, acc + x)


@triton.jit
def default_operand_kernel(x_ptr, out_ptr, n_elements=8, BLOCK_SIZE: tl.constexpr = 8):
    offs = tl.arange(0, BLOCK_SIZE)
    m = offs < n_elements
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m), mask=m)


@triton.jit
def add_fn(x, y):
    return x + y


@triton.jit
def mul_fn(x, y):
    return x * y


@triton.jit
def dispatch_kernel(x_ptr, y_ptr, output_ptr, FN: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    offs = tl.arange(0, BLOCK_SIZE)
    tl.store(output_ptr + offs, FN(tl.load(x_ptr + offs), tl.load(y_ptr + offs)))


@triton.autotune(
    configs=[triton.Config({"BLOCK_SIZE": 1}, num_warps=1), triton.Config({"BLOCK_SIZE": 8})],
    key=["n_elements"],
)
@triton.jit
def inc_pair_kernel(pair, n_elements, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    m = offs < n_elements
    tl.store(pair[0] + offs, tl.load(pair[0] + offs, mask=m) + 1, mask=m)
    tl.store(pair[1] + offs, tl.load(pair[1] + offs, mask=m) + 2, mask=m)


@triton.jit
def tma_copy_kernel(in_desc, out_ptr, M: tl.constexpr, N: tl.constexpr):
    block = in_desc.load([0, 0])
    offs = tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :]
    tl.store(out_ptr + offs, block)


@triton.jit
def device_tma_copy_kernel(in_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr):
    d_in = tl.make_tensor_descriptor(in_ptr, shape=[M, N], strides=[N, 1], block_shape=[M, N])
    d_out = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[N, 1], block_shape=[M, N])
    d_out.store([0, 0], d_in.load([0, 0]))


@gluon.jit
def gluon_host_tma_copy_kernel(in_desc, out_ptr, M: gl.constexpr, N: gl.constexpr):
    out_desc = gh.tma.make_tensor_descriptor(
        out_ptr, shape=[M, N], strides=[N, 1], block_shape=[M, N], layout=in_desc.layout
    )
    smem = gl.allocate_shared_memory(in_desc.dtype, [M, N], in_desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], gh.mbarrier.MBarrierLayout())
    gh.mbarrier.init(bar, count=1)
    gh.mbarrier.expect(bar, in_desc.block_type.nbytes)
    tma_load(in_desc, [0, 0], bar, smem)
    gh.mbarrier.wait(bar, phase=0)
    gh.mbarrier.invalidate(bar)
    tma_store(out_desc, [0, 0], smem)
    gh.tma.store_wait(0)


@gluon.jit
def gluon_device_tma_copy_kernel(in_ptr, out_ptr, M: gl.constexpr, N: gl.constexpr):
    layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([M, N], gl.float32)
    in_desc = gh.tma.make_tensor_descriptor(
        in_ptr, shape=[M, N], strides=[N, 1], block_shape=[M, N], layout=layout
    )
    out_desc = gh.tma.make_tensor_descriptor(
        out_ptr, shape=[M, N], strides=[N, 1], block_shape=[M, N], layout=layout
    )
    smem = gl.allocate_shared_memory(gl.float32, [M, N], layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], gh.mbarrier.MBarrierLayout())
    gh.mbarrier.init(bar, count=1)
    gh.mbarrier.expect(bar, in_desc.block_type.nbytes)
    tma_load(in_desc, [0, 0], bar, smem)
    gh.mbarrier.wait(bar, phase=0)
    gh.mbarrier.invalidate(bar)
    tma_store(out_desc, [0, 0], smem)
    gh.tma.store_wait(0)


@gluon.jit
def gluon_memcpy_kernel(in_ptr, out_ptr, size: gl.constexpr, block_size: gl.constexpr):
    pid = gl.program_id(0)
    start = pid * block_size
    end = min(start + block_size, size)
    for i in range(start, end):
        gl.store(out_ptr + i, gl.load(in_ptr + i))


@triton.jit
def two_inout_kernel(
    ptr0, ptr1, ptr2, ptr3, n_elements, BLOCK_SIZE: tl.constexpr, FIRST_INOUT: tl.constexpr
):
    """FIRST_INOUT: ptr0 += ptr1 and ptr2 += ptr3; else ptr1 += ptr0 and ptr3 += ptr2."""
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    m = offs < n_elements
    if FIRST_INOUT:
        io0, io1, i0, i1 = ptr0, ptr2, ptr1, ptr3
    else:
        io0, io1, i0, i1 = ptr1, ptr3, ptr0, ptr2
    tl.store(io0 + offs, tl.load(io0 + offs, mask=m) + tl.load(i0 + offs, mask=m), mask=m)
    tl.store(io1 + offs, tl.load(io1 + offs, mask=m) + tl.load(i1 + offs, mask=m), mask=m)
