"""The bridge's TritonAnyKernelCall encoder against jaxlib's own ``to_proto``.

jaxlib's bindings import on a CPU-only machine when the CUDA plugin is installed; without it
the parity tests are skipped (the bridge itself never needs the plugin to lower).
"""

from __future__ import annotations

import zlib
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from bridge_helpers import custom_calls, jaxlib_triton, lowered_module

from bridge import proto
from examples import ops

g = jaxlib_triton()
needs_jaxlib = pytest.mark.skipif(
    g is None, reason="jaxlib's Triton bindings (a GPU plugin) are not installed"
)


def our_kernel(name: str, warps: int, ctas: int, shared: int, ptx: str, cc: int):
    return proto.messages()["TritonKernel"](
        kernel_name=name,
        num_warps=warps,
        num_ctas=ctas,
        shared_mem_bytes=shared,
        ptx=ptx,
        compute_capability=cc,
    )


PARAMS = [
    ("array", (0, 16)),
    ("array", (4096, 0)),
    ("i32", -7),
    ("u32", 2**32 - 1),
    ("i64", -(2**40)),
    ("u64", 2**64 - 1),
    ("f32", 0.5),
    ("f64", 1e300),
    ("bool_", True),
]
JAXLIB_DTYPE = {
    "i32": "i32",
    "u32": "u32",
    "i64": "i64",
    "u64": "u64",
    "f32": "fp32",
    "f64": "fp64",
    "bool_": "i1",
}


def our_call(grid=(3, 2, 1)):
    m = proto.messages()
    call = m["TritonKernelCall"](
        kernel=our_kernel("k", 8, 1, 1024, "// ptx text", 90),
        grid_0=grid[0],
        grid_1=grid[1],
        grid_2=grid[2],
    )
    for kind, value in PARAMS:
        p = call.parameters.add()
        if kind == "array":
            p.array.bytes_to_zero, p.array.ptr_divisibility = value
        else:
            setattr(p, kind, value)
    return call


def their_call(grid=(3, 2, 1)):
    kernel = g.TritonKernel("k", 8, 1, 1024, "// ptx text", "", 90)
    params = [
        g.create_array_parameter(*v)
        if kind == "array"
        else g.create_scalar_parameter(v, JAXLIB_DTYPE[kind])
        for kind, v in PARAMS
    ]
    return g.TritonKernelCall(kernel, *grid, params)


@needs_jaxlib
def test_kernel_call_bytes_equal_jaxlib():
    ours = proto.messages()["TritonAnyKernelCall"](
        kernel_call=our_call(), name="n", metadata=b"\x00md"
    )
    theirs = their_call().to_proto("n", b"\x00md")
    assert proto.serialize(ours) == theirs
    assert proto.parse_call(theirs) == ours
    assert g.get_serialized_metadata(zlib.compress(proto.serialize(ours))) == b"\x00md"


@needs_jaxlib
def test_autotuned_call_bytes_equal_jaxlib():
    m = proto.messages()
    ours = m["TritonAnyKernelCall"](name="tuned", metadata=b"")
    tuned = ours.autotuned_kernel_call
    tuned.name = "tuned (k)"
    for grid, desc in (((3, 2, 1), "BM: 64"), ((6, 1, 1), "BM: 32")):
        tuned.configs.add(description=desc).kernel_call.CopyFrom(our_call(grid))
    tuned.input_output_aliases.add(input_buffer_idx=1, output_buffer_idx=4, buffer_size_bytes=64)
    theirs = g.TritonAutotunedKernelCall(
        "tuned (k)",
        [(their_call((3, 2, 1)), "BM: 64"), (their_call((6, 1, 1)), "BM: 32")],
        [(1, 4, 64)],
    ).to_proto("tuned", b"")
    assert proto.serialize(ours) == theirs


@needs_jaxlib
def test_a_lowered_call_parses_like_jaxlib_builds_it():
    """Rebuild a lowered (PTX-embedded) call with jaxlib's constructors: same bytes."""
    f32 = jax.ShapeDtypeStruct((4096,), jnp.float32)
    fn = lambda x, y: ops.add(x, y, target="cuda:90", embed="ptx")  # noqa: E731
    (cc,) = custom_calls(lowered_module(fn, f32, f32))
    raw = zlib.decompress(cc["opaque"])
    msg = proto.parse_call(raw)
    k = msg.kernel_call.kernel
    kernel = g.TritonKernel(
        k.kernel_name,
        k.num_warps,
        k.num_ctas,
        k.shared_mem_bytes,
        k.ptx,
        k.ttir,
        k.compute_capability,
    )
    params = [
        g.create_array_parameter(p.array.bytes_to_zero, p.array.ptr_divisibility)
        if p.HasField("array")
        else g.create_scalar_parameter(p.i32, "i32")
        for p in msg.kernel_call.parameters
    ]
    kc = msg.kernel_call
    rebuilt = g.TritonKernelCall(kernel, kc.grid_0, kc.grid_1, kc.grid_2, params)
    assert rebuilt.to_proto(msg.name, msg.metadata) == raw


def test_module_image_and_scratch_fields_round_trip():
    m = proto.messages()
    k = our_kernel("k", 4, 1, 0, "ptx", 90)
    k.module_image.object_file = b"\x7fELF\x00\x01"
    k.module_image.kernel_name = "k"
    k.module_image.shared_mem_bytes = 0
    k.global_scratch_size, k.global_scratch_align = 128, 16
    data = proto.serialize(m["TritonAnyKernelCall"](kernel_call=m["TritonKernelCall"](kernel=k)))
    back = proto.parse_call(data).kernel_call.kernel
    assert back.module_image.object_file == b"\x7fELF\x00\x01"
    assert (back.global_scratch_size, back.global_scratch_align) == (128, 16)
    # field 11 is a length-delimited field number 11 inside the kernel: tag 0x5a
    assert b"\x5a" in proto.serialize(k)


def test_serialization_is_deterministic_and_field_ordered():
    a = proto.serialize(proto.messages()["TritonAnyKernelCall"](kernel_call=our_call(), name="x"))
    b = proto.serialize(proto.messages()["TritonAnyKernelCall"](name="x", kernel_call=our_call()))
    assert a == b
    assert proto.decode_opaque(proto.compress(a)).name == "x"


def our_descriptor_call() -> Any:
    """A call whose parameters are a TMA descriptor (field 9), its shape and strides, and an
    array, as the bridge lowers a host-side tensor descriptor."""
    m = proto.messages()
    call = m["TritonKernelCall"](kernel=our_kernel("k", 4, 1, 0, "// ptx", 90), grid_0=1)
    t = call.parameters.add().tensor_descriptor.nvidia
    t.elem_type, t.swizzle, t.oob_fill = 7, 3, 1
    t.shape.extend([64, 32])
    t.strides.extend([32, 1])
    t.block_shape.extend([16, 32])
    for v in (64, 32):
        call.parameters.add().i32 = v
    for v in (32, 1):
        call.parameters.add().i64 = v
    call.parameters.add().array.ptr_divisibility = 16
    return call


def test_tensor_descriptor_parameter_wire_format():
    data = proto.serialize(our_descriptor_call().parameters[0])
    # field 9 (length-delimited: tag 0x4a) holding field 1 (nvidia, 0x0a): elem_type (0x08),
    # swizzle (0x10), packed shape (0x1a), strides (0x22), block_shape (0x2a), oob_fill (0x30)
    assert data == bytes.fromhex("4a140a12080710031a024020220220012a0210203001")
    nvidia = proto.parse_call(
        proto.serialize(proto.messages()["TritonAnyKernelCall"](kernel_call=our_descriptor_call()))
    ).kernel_call.parameters[0]
    assert nvidia.WhichOneof("value") == "tensor_descriptor"
    t = nvidia.tensor_descriptor.nvidia
    assert list(t.shape) == [64, 32] and list(t.block_shape) == [16, 32] and t.oob_fill == 1


@pytest.mark.skipif(
    g is None or not hasattr(g, "create_tma_descriptor_parameter"),
    reason="jaxlib's TMA descriptor binding (jaxlib >= 0.11.1 with a GPU plugin) is not installed",
)
def test_tensor_descriptor_bytes_equal_jaxlib():
    kernel = g.TritonKernel("k", 4, 1, 0, "// ptx", "", 90)
    params = [
        g.create_tma_descriptor_parameter(
            elem_type=7,
            swizzle=3,
            shape=[64, 32],
            strides=[32, 1],
            block_shape=[16, 32],
            oob_fill=1,
        ),
        *(g.create_scalar_parameter(v, "i32") for v in (64, 32)),
        *(g.create_scalar_parameter(v, "i64") for v in (32, 1)),
        g.create_array_parameter(0, 16),
    ]
    theirs = g.TritonKernelCall(kernel, 1, 0, 0, params).to_proto("n", b"")
    ours = proto.messages()["TritonAnyKernelCall"](kernel_call=our_descriptor_call(), name="n")
    assert proto.serialize(ours) == theirs
