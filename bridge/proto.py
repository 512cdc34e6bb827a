"""jaxlib's Triton custom-call wire format, built with the protobuf runtime.

The schema of ``jaxlib/gpu/triton.proto`` (package ``jax_triton``) is declared here as a
``FileDescriptorProto`` in a private descriptor pool: no protoc, no jaxlib plugin, no
version-dependent nanobind constructors. What is declared is the union of the released
schemas: ``num_ctas`` (10) since jaxlib 0.8.2, ``module_image`` (11), the global scratch
fields (12, 13) and the ``tensor_descriptor`` parameter (9) since 0.11.1. Older jaxlib releases
skip fields they do not know (a parameter they do not know is an error at run time: the bridge
checks the jaxlib before emitting one).

Fields are declared in field-number order and serialized deterministically, so the bytes of a
message depend only on its content: the opaque of a custom call is the same in every process.
"""

from __future__ import annotations

import functools
import zlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from google.protobuf import descriptor_pb2

_PACKAGE = "jax_triton"


def _field(
    msg: Any,
    name: str,
    number: int,
    kind: int,
    *,
    type_name: str | None = None,
    repeated: bool = False,
    oneof: int | None = None,
    optional: bool = False,
) -> None:
    from google.protobuf.descriptor_pb2 import FieldDescriptorProto as _F

    f = msg.field.add(name=name, number=number, type=kind)
    f.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
    if type_name:
        f.type_name = f".{_PACKAGE}.{type_name}"
    if optional:
        f.proto3_optional = True
        f.oneof_index = len(msg.oneof_decl)
        msg.oneof_decl.add(name=f"_{name}")
    elif oneof is not None:
        f.oneof_index = oneof


def _schema() -> descriptor_pb2.FileDescriptorProto:
    from google.protobuf import descriptor_pb2

    _F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(
        name="kernelcache/bridge/triton.proto", package=_PACKAGE, syntax="proto3"
    )
    image = fd.message_type.add(name="ModuleImageProto")
    _field(image, "object_file", 1, _F.TYPE_BYTES)
    _field(image, "kernel_name", 2, _F.TYPE_STRING)
    _field(image, "shared_mem_bytes", 3, _F.TYPE_UINT32)

    kernel = fd.message_type.add(name="TritonKernel")
    _field(kernel, "kernel_name", 1, _F.TYPE_STRING)
    _field(kernel, "num_warps", 2, _F.TYPE_UINT32)
    _field(kernel, "shared_mem_bytes", 3, _F.TYPE_UINT32)
    _field(kernel, "ptx", 4, _F.TYPE_STRING)
    _field(kernel, "ttir", 5, _F.TYPE_STRING)
    _field(kernel, "compute_capability", 6, _F.TYPE_UINT32)
    _field(kernel, "num_ctas", 10, _F.TYPE_UINT32, optional=True)
    _field(kernel, "module_image", 11, _F.TYPE_MESSAGE, type_name="ModuleImageProto", optional=True)
    _field(kernel, "global_scratch_size", 12, _F.TYPE_UINT32, optional=True)
    _field(kernel, "global_scratch_align", 13, _F.TYPE_UINT32, optional=True)
    for start in (7, 8, 9):
        kernel.reserved_range.add(start=start, end=start + 1)

    call = fd.message_type.add(name="TritonKernelCall")
    param = call.nested_type.add(name="Parameter")
    array = param.nested_type.add(name="Array")
    _field(array, "bytes_to_zero", 1, _F.TYPE_UINT64)
    _field(array, "ptr_divisibility", 2, _F.TYPE_UINT64)
    param.oneof_decl.add(name="value")
    _field(
        param, "array", 1, _F.TYPE_MESSAGE, type_name="TritonKernelCall.Parameter.Array", oneof=0
    )
    for number, (name, kind) in enumerate(
        [
            ("bool_", _F.TYPE_BOOL),
            ("i32", _F.TYPE_INT32),
            ("u32", _F.TYPE_UINT32),
            ("i64", _F.TYPE_INT64),
            ("u64", _F.TYPE_UINT64),
            ("f32", _F.TYPE_FLOAT),
            ("f64", _F.TYPE_DOUBLE),
        ],
        start=2,
    ):
        _field(param, name, number, kind, oneof=0)
    tensor = param.nested_type.add(name="TensorDescriptor")
    nvidia = tensor.nested_type.add(name="Nvidia")
    _field(nvidia, "elem_type", 1, _F.TYPE_UINT32)
    _field(nvidia, "swizzle", 2, _F.TYPE_UINT32)
    _field(nvidia, "shape", 3, _F.TYPE_UINT64, repeated=True)
    _field(nvidia, "strides", 4, _F.TYPE_UINT64, repeated=True)
    _field(nvidia, "block_shape", 5, _F.TYPE_UINT32, repeated=True)
    _field(nvidia, "oob_fill", 6, _F.TYPE_UINT32)
    tensor.oneof_decl.add(name="backend")
    _field(
        tensor,
        "nvidia",
        1,
        _F.TYPE_MESSAGE,
        type_name="TritonKernelCall.Parameter.TensorDescriptor.Nvidia",
        oneof=0,
    )
    _field(
        param,
        "tensor_descriptor",
        9,
        _F.TYPE_MESSAGE,
        type_name="TritonKernelCall.Parameter.TensorDescriptor",
        oneof=0,
    )
    _field(call, "kernel", 1, _F.TYPE_MESSAGE, type_name="TritonKernel")
    _field(call, "grid_0", 2, _F.TYPE_UINT32)
    _field(call, "grid_1", 3, _F.TYPE_UINT32)
    _field(call, "grid_2", 4, _F.TYPE_UINT32)
    _field(
        call,
        "parameters",
        5,
        _F.TYPE_MESSAGE,
        type_name="TritonKernelCall.Parameter",
        repeated=True,
    )

    tuned = fd.message_type.add(name="TritonAutotunedKernelCall")
    config = tuned.nested_type.add(name="Config")
    _field(config, "kernel_call", 1, _F.TYPE_MESSAGE, type_name="TritonKernelCall")
    _field(config, "description", 2, _F.TYPE_STRING)
    alias = tuned.nested_type.add(name="InputOutputAlias")
    _field(alias, "input_buffer_idx", 1, _F.TYPE_UINT32)
    _field(alias, "output_buffer_idx", 2, _F.TYPE_UINT32)
    _field(alias, "buffer_size_bytes", 3, _F.TYPE_UINT64)
    _field(tuned, "name", 1, _F.TYPE_STRING)
    _field(
        tuned,
        "configs",
        2,
        _F.TYPE_MESSAGE,
        type_name="TritonAutotunedKernelCall.Config",
        repeated=True,
    )
    _field(
        tuned,
        "input_output_aliases",
        3,
        _F.TYPE_MESSAGE,
        type_name="TritonAutotunedKernelCall.InputOutputAlias",
        repeated=True,
    )

    anycall = fd.message_type.add(name="TritonAnyKernelCall")
    anycall.oneof_decl.add(name="value")
    _field(anycall, "kernel_call", 1, _F.TYPE_MESSAGE, type_name="TritonKernelCall", oneof=0)
    _field(
        anycall,
        "autotuned_kernel_call",
        2,
        _F.TYPE_MESSAGE,
        type_name="TritonAutotunedKernelCall",
        oneof=0,
    )
    _field(anycall, "metadata", 3, _F.TYPE_BYTES)
    _field(anycall, "name", 4, _F.TYPE_STRING)
    return fd


@functools.lru_cache(maxsize=1)
def messages() -> dict[str, type]:
    """The message classes by name: TritonKernel, TritonKernelCall, TritonAnyKernelCall, ...

    protobuf is imported here, at the first lowering, not with the bridge."""
    from google.protobuf import descriptor_pool

    pool = descriptor_pool.DescriptorPool()
    pool.Add(_schema())
    try:
        from google.protobuf.message_factory import GetMessageClass
    except ImportError:  # protobuf < 4.22
        from google.protobuf.message_factory import MessageFactory

        GetMessageClass = MessageFactory(pool).GetPrototype
    names = [
        "ModuleImageProto",
        "TritonKernel",
        "TritonKernelCall",
        "TritonAutotunedKernelCall",
        "TritonAnyKernelCall",
    ]
    return {n: GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{n}")) for n in names}


def serialize(message: Any) -> bytes:
    """Deterministic bytes of ``message``."""
    return message.SerializeToString(deterministic=True)


def parse_call(data: bytes) -> Any:
    """Parse (uncompressed) TritonAnyKernelCall bytes."""
    msg = messages()["TritonAnyKernelCall"]()
    msg.ParseFromString(data)
    return msg


def compress(data: bytes) -> bytes:
    """The opaque jaxlib expects: zlib-compressed serialized TritonAnyKernelCall (level 1:
    machine code compresses little further, and lowering stays fast)."""
    return zlib.compress(data, 1)


def decode_opaque(opaque: bytes) -> Any:
    """Parse an opaque (zlib-compressed TritonAnyKernelCall) for inspection and tests."""
    return parse_call(zlib.decompress(opaque))
