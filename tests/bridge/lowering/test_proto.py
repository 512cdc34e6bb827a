"""The bridge's TritonAnyKernelCall encoder against protobuf's and jaxlib's own ``to_proto``.

jaxlib's bindings import on a CPU-only machine when the CUDA plugin is installed; without it
the jaxlib parity tests are skipped (the bridge itself never needs the plugin to lower).
protobuf's serialization of the same content is the reference everywhere else.
"""

from __future__ import annotations

import functools
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import pytest
import triton
import triton.language as tl
from bridge_helpers import custom_calls, jaxlib_triton, lowered_module, run_child, to_protobuf
from callapi_kernels import device_tma_copy_kernel, tma_copy_kernel
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bridge
import kernelcache
from bridge import versions
from bridge.lowering import proto
from examples import kernels as K
from examples import ops

g = jaxlib_triton()
needs_jaxlib = pytest.mark.skipif(
    g is None, reason="jaxlib's Triton bindings (a GPU plugin) are not installed"
)


def our_kernel(name: str, warps: int, ctas: int, shared: int, ptx: str, cc: int):
    return proto.TritonKernel(
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


def our_param(kind: str, value: Any) -> proto.Parameter:
    if kind == "array":
        return proto.Parameter(array=proto.Array(bytes_to_zero=value[0], ptr_divisibility=value[1]))
    return proto.Parameter(**{kind: value})


def our_call(grid=(3, 2, 1)):
    return proto.TritonKernelCall(
        kernel=our_kernel("k", 8, 1, 1024, "// ptx text", 90),
        grid_0=grid[0],
        grid_1=grid[1],
        grid_2=grid[2],
        parameters=[our_param(kind, value) for kind, value in PARAMS],
    )


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
    ours = proto.TritonAnyKernelCall(kernel_call=our_call(), name="n", metadata=b"\x00md")
    theirs = their_call().to_proto("n", b"\x00md")
    assert proto.encode(ours) == theirs
    assert proto.parse_call(theirs) == to_protobuf(ours)
    assert g.get_serialized_metadata(zlib.compress(proto.encode(ours))) == b"\x00md"


@needs_jaxlib
def test_autotuned_call_bytes_equal_jaxlib():
    tuned = proto.TritonAutotunedKernelCall(
        name="tuned (k)",
        configs=[
            proto.Config(kernel_call=our_call(grid), description=desc)
            for grid, desc in (((3, 2, 1), "BM: 64"), ((6, 1, 1), "BM: 32"))
        ],
        input_output_aliases=[
            proto.InputOutputAlias(input_buffer_idx=1, output_buffer_idx=4, buffer_size_bytes=64)
        ],
    )
    ours = proto.TritonAnyKernelCall(autotuned_kernel_call=tuned, name="tuned", metadata=b"")
    theirs = g.TritonAutotunedKernelCall(
        "tuned (k)",
        [(their_call((3, 2, 1)), "BM: 64"), (their_call((6, 1, 1)), "BM: 32")],
        [(1, 4, 64)],
    ).to_proto("tuned", b"")
    assert proto.encode(ours) == theirs


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
    k = our_kernel("k", 4, 1, 0, "ptx", 90)
    k.module_image = proto.ModuleImage(object_file=b"\x7fELF\x00\x01", kernel_name="k")
    k.global_scratch_size, k.global_scratch_align = 128, 16
    data = proto.encode(proto.TritonAnyKernelCall(kernel_call=proto.TritonKernelCall(kernel=k)))
    back = proto.parse_call(data).kernel_call.kernel
    assert back.module_image.object_file == b"\x7fELF\x00\x01"
    assert (back.global_scratch_size, back.global_scratch_align) == (128, 16)
    # field 11 is a length-delimited field number 11 inside the kernel: tag 0x5a
    assert b"\x5a" in proto.encode(k)
    assert proto.decode_opaque(proto.compress(data)).kernel_call.kernel.kernel_name == "k"


def test_presence_follows_proto3():
    """Zero scalars without presence are left out; optional scalars, oneof members and
    sub-messages are written when set, even when zero or empty."""
    assert proto.encode(proto.TritonKernel()) == b""
    assert proto.encode(proto.TritonKernel(num_ctas=0)) == bytes.fromhex("5000")
    assert proto.encode(proto.TritonKernel(module_image=proto.ModuleImage())) == b"\x5a\x00"
    assert proto.encode(proto.Parameter(i32=0)) == bytes.fromhex("1800")
    assert proto.encode(proto.Parameter(bool_=False)) == bytes.fromhex("1000")
    assert proto.encode(proto.Parameter(array=proto.Array())) == bytes.fromhex("0a00")
    # negative int32: ten bytes, sign-extended to 64 bits
    assert proto.encode(proto.Parameter(i32=-1)) == bytes.fromhex("18ffffffffffffffffff01")
    assert proto.encode(proto.TritonKernelCall(grid_0=0, grid_1=1)) == bytes.fromhex("1801")


@pytest.mark.parametrize(
    "message, error",
    [
        (proto.Parameter(i32=2**31), ValueError),
        (proto.Parameter(u32=-1), ValueError),
        (proto.Parameter(u64=2**64), ValueError),
        (proto.Parameter(i64=1.5), TypeError),
        (proto.TritonAnyKernelCall(metadata="text"), TypeError),
        (proto.NvidiaDescriptor(shape=[-1]), ValueError),
    ],
)
def test_values_that_do_not_fit_are_refused_as_protobuf_refuses_them(message, error):
    with pytest.raises(error):
        proto.encode(message)
    with pytest.raises(error):
        to_protobuf(message)


def test_the_schema_is_jaxlibs():
    """The descriptor derived from the dataclasses: field numbers and types of triton.proto."""
    fd = proto.file_descriptor()
    kernel = next(m for m in fd.message_type if m.name == "TritonKernel")
    assert [(f.name, f.number, f.type) for f in kernel.field] == [
        ("kernel_name", 1, 9),
        ("num_warps", 2, 13),
        ("shared_mem_bytes", 3, 13),
        ("ptx", 4, 9),
        ("ttir", 5, 9),
        ("compute_capability", 6, 13),
        ("num_ctas", 10, 13),
        ("module_image", 11, 11),
        ("global_scratch_size", 12, 13),
        ("global_scratch_align", 13, 13),
    ]
    assert [f.proto3_optional for f in kernel.field][6:] == [True] * 4
    assert [(r.start, r.end) for r in kernel.reserved_range] == [(7, 8), (8, 9), (9, 10)]
    call = next(m for m in fd.message_type if m.name == "TritonKernelCall")
    (param,) = call.nested_type
    assert [(f.name, f.number) for f in param.field] == [
        ("array", 1),
        ("bool_", 2),
        ("i32", 3),
        ("u32", 4),
        ("i64", 5),
        ("u64", 6),
        ("f32", 7),
        ("f64", 8),
        ("tensor_descriptor", 9),
    ]
    assert {f.oneof_index for f in param.field} == {0}
    assert [m.name for m in param.nested_type] == ["Array", "TensorDescriptor"]


# -- the encoder against protobuf's, over random content ---------------------------------------
_INTS = {
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint64": (0, 2**64 - 1),
}


def _scalars(kind: str) -> st.SearchStrategy[Any]:
    if kind in _INTS:
        lo, hi = _INTS[kind]
        edges = sorted({0, 1, lo, hi, max(lo, -1)})
        return st.one_of(st.sampled_from(edges), st.integers(lo, hi))
    return {
        "bool": st.booleans(),
        "float": st.floats(width=32),
        "double": st.floats(),
        "string": st.one_of(st.just(""), st.text(max_size=20)),
        "bytes": st.one_of(st.just(b""), st.binary(max_size=20)),
    }[kind]


def _values(f: Any) -> st.SearchStrategy[Any]:
    one = _scalars(f.kind) if isinstance(f.kind, str) else st.deferred(lambda: messages_of(f.kind))
    if f.repeated:
        return st.lists(one, max_size=3)
    return st.one_of(st.none(), one) if f.explicit else one


@functools.cache
def messages_of(cls: type) -> st.SearchStrategy[Any]:
    """Messages of ``cls`` with random content: every field drawn, at most one member of each
    oneof set."""
    plain = {f.name: _values(f) for f in cls._proto_fields if f.oneof is None}
    groups: dict[str, list[Any]] = {}
    for f in cls._proto_fields:
        if f.oneof is not None:
            groups.setdefault(f.oneof, []).append(f)

    @st.composite
    def build(draw: Any) -> Any:
        kwargs = {name: draw(values) for name, values in plain.items()}
        for members in groups.values():
            chosen = draw(st.sampled_from([None, *members]))
            if chosen is not None:
                kwargs[chosen.name] = draw(_values(chosen).filter(lambda v: v is not None))
        return cls(**kwargs)

    return build()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages_of(proto.TritonAnyKernelCall))
def test_encoding_equals_protobufs(message):
    assert proto.encode(message) == to_protobuf(message).SerializeToString(deterministic=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(messages_of(proto.Parameter), max_size=6), messages_of(proto.TritonKernel))
def test_parameters_and_kernels_equal_protobufs(params, kernel):
    message = proto.TritonKernelCall(kernel=kernel, parameters=params)
    assert proto.encode(message) == to_protobuf(message).SerializeToString(deterministic=True)


# -- what the lowering encodes ------------------------------------------------------------------
@triton.jit
def every_scalar_kernel(
    x_ptr,
    a: tl.int32,
    b: tl.uint32,
    c: tl.int64,
    d: tl.uint64,
    e: tl.float32,
    f: tl.float64,
    flag,
    out_ptr,
    BLOCK: tl.constexpr,
):
    offs = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs) * e + (a + b + c + d).to(tl.float32) + f.to(tl.float32)
    if flag:
        v = -v
    tl.store(out_ptr + offs, v)


@triton.autotune(configs=[triton.Config({"BLOCK": 256}), triton.Config({"BLOCK": 512})], key=["n"])
@triton.jit
def tuned_axpy_kernel(y_ptr, x_ptr, a, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y = tl.load(y_ptr + offs, mask=mask) + a * tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, y, mask=mask)


@pytest.fixture
def encoded(monkeypatch) -> list[tuple[proto.TritonAnyKernelCall, bytes]]:
    """Every TritonAnyKernelCall the lowering encodes, with its bytes."""
    seen: list[tuple[proto.TritonAnyKernelCall, bytes]] = []
    real = proto.encode

    def spy(message: Any) -> bytes:
        data = real(message)
        if isinstance(message, proto.TritonAnyKernelCall):
            seen.append((message, data))
        return data

    monkeypatch.setattr(proto, "encode", spy)
    return seen


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> kernelcache.Cache:
    return kernelcache.Cache(root=tmp_path_factory.mktemp("proto-kernels"))


F32 = jax.ShapeDtypeStruct((4096,), jnp.float32)
M32 = jax.ShapeDtypeStruct((32, 32), jnp.float32)


def _scalars_call(cache, x):
    return bridge.triton_call(
        x,
        -7,
        2**32 - 1,
        -(2**40),
        2**64 - 1,
        0.5,
        -1e300,
        True,
        kernel=every_scalar_kernel,
        out_shape=x,
        grid=(1,),
        BLOCK=128,
        target="cuda:90",
        cache=cache,
    )


def _tuned_in_place(cache, y, x):
    return bridge.triton_call(
        y,
        x,
        2.0,
        y.size,
        kernel=tuned_axpy_kernel,
        input_output_aliases=["y_ptr"],
        grid=lambda m: (triton.cdiv(m["n"], m["BLOCK"]),),
        target="cuda:90",
        cache=cache,
    )


def _zeroed(cache, x):
    return bridge.triton_call(
        x,
        x.size,
        kernel=K.atomic_count_kernel,
        out_shape=jax.ShapeDtypeStruct((1,), jnp.int32),
        zeroed_outputs=(0,),
        grid=(4,),
        BLOCK=1024,
        target="cuda:90",
        cache=cache,
    )


def _tuple(cache, x, y):
    return bridge.triton_call(
        (x, y),
        x.size,
        kernel=K.pair_sum_kernel,
        out_shape=x,
        grid=(4,),
        BLOCK=1024,
        target="cuda:90",
        cache=cache,
    )


def _host_descriptor(cache, x):
    desc = bridge.TensorDescriptor.from_array(x, block_shape=[32, 32], padding="nan")
    return bridge.triton_call(
        desc, kernel=tma_copy_kernel, out_type=x, grid=1, M=32, N=32, target="cuda:90", cache=cache
    )


def _global_scratch(cache, x):
    return bridge.triton_call(
        x,
        kernel=device_tma_copy_kernel,
        out_type=x,
        grid=1,
        M=32,
        N=32,
        target="cuda:90",
        cache=cache,
    )


REPRESENTATIVE = {
    "plain ptx": (
        lambda c, x, y: ops.add(x, y, target="cuda:90", embed="ptx", cache=c),
        [F32, F32],
        "cuda",
    ),
    "module_image inline": (
        lambda c, x, y: ops.add(x, y, target="cuda:90", embed="inline", cache=c),
        [F32, F32],
        "cuda",
    ),
    "rocm inline": (
        lambda c, x, y: ops.add(x, y, target="hip:gfx942", embed="inline", cache=c),
        [F32, F32],
        "rocm",
    ),
    "rocm path": (
        lambda c, x, y: ops.add(x, y, target="hip:gfx942", embed="path", cache=c),
        [F32, F32],
        "rocm",
    ),
    "autotuned": (
        lambda c, a, b: ops.matmul(a, b, target="cuda:90", cache=c),
        [jax.ShapeDtypeStruct((64, 64), jnp.bfloat16)] * 2,
        "cuda",
    ),
    "autotuned aliases": (_tuned_in_place, [F32, F32], "cuda"),
    "tuple": (_tuple, [F32, F32], "cuda"),
    "every scalar dtype": (_scalars_call, [jax.ShapeDtypeStruct((128,), jnp.float32)], "cuda"),
    "zeroed outputs": (_zeroed, [F32], "cuda"),
    "host tensor descriptor": (_host_descriptor, [M32], "cuda"),
    "global scratch": (_global_scratch, [M32], "cuda"),
}


@pytest.mark.parametrize("name", list(REPRESENTATIVE))
def test_lowered_opaques_equal_protobufs_encoding(name, cache, encoded, monkeypatch):
    """Each lowered opaque holds exactly the bytes protobuf makes of the same message."""
    monkeypatch.setattr(versions, "jaxlib_version", lambda: "0.11.2")
    fn, avals, platform = REPRESENTATIVE[name]
    (cc,) = custom_calls(lowered_module(lambda *a: fn(cache, *a), *avals, platform=platform))
    ((message, data),) = encoded
    assert zlib.decompress(cc["opaque"]) == data
    assert data == to_protobuf(message).SerializeToString(deterministic=True)
    if name == "every scalar dtype":
        params = message.kernel_call.parameters
        set_ = [[f.name for f in p._proto_fields if getattr(p, f.name) is not None] for p in params]
        assert set_ == [
            ["array"],
            ["i32"],
            ["u32"],
            ["i64"],
            ["u64"],
            ["f32"],
            ["f64"],
            ["bool_"],
            ["array"],
        ]


def test_lowering_never_imports_protobuf(tmp_path):
    out = run_child(
        """
        import json, sys
        import jax, jax.numpy as jnp
        from examples import ops
        f32 = jax.ShapeDtypeStruct((4096,), jnp.float32)
        fn = lambda x, y: ops.add(x, y, target="cuda:90")
        text = jax.jit(fn).trace(f32, f32).lower(lowering_platforms=("cuda",)).as_text()
        print(json.dumps({"lowered": "triton_kernel_call" in text,
                          "protobuf": sorted(m for m in sys.modules if m.startswith("google"))}))
        """,
        KERNELCACHE_DIR=str(tmp_path / "cache"),
    )
    assert out == {"lowered": True, "protobuf": []}


def our_descriptor_call() -> proto.TritonKernelCall:
    """A call whose parameters are a TMA descriptor (field 9), its shape and strides, and an
    array, as the bridge lowers a host-side tensor descriptor."""
    tensor = proto.NvidiaDescriptor(
        elem_type=7, swizzle=3, shape=[64, 32], strides=[32, 1], block_shape=[16, 32], oob_fill=1
    )
    return proto.TritonKernelCall(
        kernel=our_kernel("k", 4, 1, 0, "// ptx", 90),
        grid_0=1,
        parameters=[
            proto.Parameter(tensor_descriptor=proto.DescriptorParameter(nvidia=tensor)),
            *(proto.Parameter(i32=v) for v in (64, 32)),
            *(proto.Parameter(i64=v) for v in (32, 1)),
            proto.Parameter(array=proto.Array(ptr_divisibility=16)),
        ],
    )


def test_tensor_descriptor_parameter_wire_format():
    data = proto.encode(our_descriptor_call().parameters[0])
    # field 9 (length-delimited: tag 0x4a) holding field 1 (nvidia, 0x0a): elem_type (0x08),
    # swizzle (0x10), packed shape (0x1a), strides (0x22), block_shape (0x2a), oob_fill (0x30)
    assert data == bytes.fromhex("4a140a12080710031a024020220220012a0210203001")
    nvidia = proto.parse_call(
        proto.encode(proto.TritonAnyKernelCall(kernel_call=our_descriptor_call()))
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
    ours = proto.TritonAnyKernelCall(kernel_call=our_descriptor_call(), name="n")
    assert proto.encode(ours) == theirs
