"""jaxlib's Triton custom-call wire format: typed messages and their deterministic encoding.

The schema of ``jaxlib/gpu/triton.proto`` (package ``jax_triton``) is declared once, here, as
dataclasses whose fields carry their field number and wire type: each message is a dataclass
registered with :func:`declare` under its protobuf name (nested names with dots), each of its
fields made by :func:`pb` (its number and type: a scalar type name of :data:`SCALARS`, or a
message class). The lowering builds these dataclasses and :func:`encode`
writes them in the proto3 wire format, without protobuf: importing protobuf and building a
descriptor pool costs more than the rest of a warm lowering. What is declared is the union of
the released schemas: ``num_ctas`` (10) since jaxlib 0.8.2, ``module_image`` (11), the global
scratch fields (12, 13) and the ``tensor_descriptor`` parameter (9) since 0.11.1. Older jaxlib
releases skip fields they do not know (a parameter they do not know is an error at run time:
the bridge checks the jaxlib before emitting one).

:func:`encode` writes exactly what protobuf's ``SerializeToString(deterministic=True)`` writes
for the same content: fields in field-number order; singular scalars without presence omitted
when they hold their default; ``optional`` scalars, oneof members and sub-messages written
whenever set (not None), even when zero or empty; repeated scalars packed; repeated messages in
order. The bytes of a message depend only on its content: the opaque of a custom call is the
same in every process.

Invariants of the declarations, checked when a message registers: its fields are declared in
field-number order (the order :func:`encode` writes them in); a repeated field holds messages or
packable scalars, never strings or bytes. A field's Python default says its presence: a list for
a repeated field, None where presence is explicit (an ``optional`` scalar, a oneof member, a
sub-message), else the type's zero (held at its zero, such a field is not written).
:data:`MESSAGES` holds every registered message class once, in declaration order.

For inspection and tests, :func:`decode_opaque` and :func:`parse_call` parse with protobuf
through a ``FileDescriptorProto`` derived from the same dataclasses (:func:`file_descriptor`).
"""

# ruff: noqa: RUF009  (``pb`` returns a ``dataclasses.field``, which ruff does not see)
from __future__ import annotations

import dataclasses
import functools
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

if TYPE_CHECKING:
    from google.protobuf import descriptor_pb2

_PACKAGE = "jax_triton"

#: protobuf's FieldDescriptorProto type number of a message field
_TYPE_MESSAGE = 11
_INT_RANGES = {
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint64": (0, 2**64 - 1),
}
_FLOAT32_MAX = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]


# -- how a message is declared ----------------------------------------------------------------
#: scalar wire types: name -> (protobuf's FieldDescriptorProto type number, wire type)
SCALARS = {
    "double": (1, 1),
    "float": (2, 5),
    "int64": (3, 0),
    "uint64": (4, 0),
    "int32": (5, 0),
    "bool": (8, 0),
    "string": (9, 2),
    "bytes": (12, 2),
    "uint32": (13, 0),
}


def pb(
    number: int,
    kind: str | type[Message],
    *,
    repeated: bool = False,
    optional: bool = False,
    oneof: str | None = None,
) -> Any:
    """A message field: its number and type (a scalar type name, or a message class).

    Its Python default says its presence: a list for repeated fields, None where presence is
    explicit (``optional`` scalars, oneof members, sub-messages), else the type's zero."""
    meta = dict(number=number, kind=kind, repeated=repeated, optional=optional, oneof=oneof)
    if repeated:
        return dataclasses.field(default_factory=list, metadata=meta)
    if optional or oneof is not None or not isinstance(kind, str):
        return dataclasses.field(default=None, metadata=meta)
    zero = {"string": "", "bytes": b"", "bool": False, "float": 0.0, "double": 0.0}
    return dataclasses.field(default=zero.get(kind, 0), metadata=meta)


@dataclass(frozen=True)
class Field:
    """A field of a message, as :func:`declare` reads it from the dataclass's field."""

    name: str
    number: int
    kind: str | type[Message]
    repeated: bool
    optional: bool
    oneof: str | None

    @property
    def explicit(self) -> bool:
        """Written whenever set (not None): an optional scalar, a oneof member, a message."""
        return self.optional or self.oneof is not None or not isinstance(self.kind, str)


class Message:
    """A message of the schema: a dataclass registered with :func:`declare`."""

    _proto_name: ClassVar[str]
    _proto_fields: ClassVar[tuple[Field, ...]]
    _proto_reserved: ClassVar[tuple[int, ...]]


#: every message class, in declaration order
MESSAGES: list[type[Message]] = []
_M = TypeVar("_M", bound=type[Message])


def declare(name: str, reserved: tuple[int, ...] = ()) -> Callable[[_M], _M]:
    """Register a message dataclass as the message ``name`` (nested names with dots)."""

    def register(cls: _M) -> _M:
        declared = dataclasses.fields(cls)  # type: ignore[arg-type]
        fields = tuple(Field(f.name, **f.metadata) for f in declared)
        numbers = [f.number for f in fields]
        assert numbers == sorted(numbers), f"{name}: fields out of field-number order"
        for f in fields:
            assert not (f.repeated and f.kind in ("string", "bytes")), "only packable scalars"
        cls._proto_name, cls._proto_fields, cls._proto_reserved = name, fields, reserved
        MESSAGES.append(cls)
        return cls

    return register


# -- the schema (jaxlib/gpu/triton.proto) ---------------------------------------------------
@declare("ModuleImageProto")
@dataclass(kw_only=True)
class ModuleImage(Message):
    """Machine code jaxlib loads instead of compiling ``ptx`` (jaxlib >= 0.11.1)."""

    object_file: bytes = pb(1, "bytes")
    kernel_name: str = pb(2, "string")
    shared_mem_bytes: int = pb(3, "uint32")


@declare("TritonKernel", reserved=(7, 8, 9))
@dataclass(kw_only=True)
class TritonKernel(Message):
    kernel_name: str = pb(1, "string")
    num_warps: int = pb(2, "uint32")
    shared_mem_bytes: int = pb(3, "uint32")
    ptx: str = pb(4, "string")
    ttir: str = pb(5, "string")
    compute_capability: int = pb(6, "uint32")
    num_ctas: int | None = pb(10, "uint32", optional=True)
    module_image: ModuleImage | None = pb(11, ModuleImage, optional=True)
    global_scratch_size: int | None = pb(12, "uint32", optional=True)
    global_scratch_align: int | None = pb(13, "uint32", optional=True)


@declare("TritonKernelCall.Parameter.Array")
@dataclass(kw_only=True)
class Array(Message):
    bytes_to_zero: int = pb(1, "uint64")
    ptr_divisibility: int = pb(2, "uint64")


@declare("TritonKernelCall.Parameter.TensorDescriptor.Nvidia")
@dataclass(kw_only=True)
class NvidiaDescriptor(Message):
    """A host-side TMA descriptor: jaxlib encodes the CUtensorMap at every launch."""

    elem_type: int = pb(1, "uint32")
    swizzle: int = pb(2, "uint32")
    shape: list[int] = pb(3, "uint64", repeated=True)
    strides: list[int] = pb(4, "uint64", repeated=True)
    block_shape: list[int] = pb(5, "uint32", repeated=True)
    oob_fill: int = pb(6, "uint32")


@declare("TritonKernelCall.Parameter.TensorDescriptor")
@dataclass(kw_only=True)
class DescriptorParameter(Message):
    """A host-side descriptor parameter (jaxlib's ``Parameter.TensorDescriptor``), one member
    per backend."""

    nvidia: NvidiaDescriptor | None = pb(1, NvidiaDescriptor, oneof="backend")


@declare("TritonKernelCall.Parameter")
@dataclass(kw_only=True)
class Parameter(Message):
    """One kernel parameter: exactly one member of the ``value`` oneof is set."""

    array: Array | None = pb(1, Array, oneof="value")
    bool_: bool | None = pb(2, "bool", oneof="value")
    i32: int | None = pb(3, "int32", oneof="value")
    u32: int | None = pb(4, "uint32", oneof="value")
    i64: int | None = pb(5, "int64", oneof="value")
    u64: int | None = pb(6, "uint64", oneof="value")
    f32: float | None = pb(7, "float", oneof="value")
    f64: float | None = pb(8, "double", oneof="value")
    tensor_descriptor: DescriptorParameter | None = pb(9, DescriptorParameter, oneof="value")


@declare("TritonKernelCall")
@dataclass(kw_only=True)
class TritonKernelCall(Message):
    kernel: TritonKernel | None = pb(1, TritonKernel)
    grid_0: int = pb(2, "uint32")
    grid_1: int = pb(3, "uint32")
    grid_2: int = pb(4, "uint32")
    parameters: list[Parameter] = pb(5, Parameter, repeated=True)


@declare("TritonAutotunedKernelCall.Config")
@dataclass(kw_only=True)
class Config(Message):
    kernel_call: TritonKernelCall | None = pb(1, TritonKernelCall)
    description: str = pb(2, "string")


@declare("TritonAutotunedKernelCall.InputOutputAlias")
@dataclass(kw_only=True)
class InputOutputAlias(Message):
    input_buffer_idx: int = pb(1, "uint32")
    output_buffer_idx: int = pb(2, "uint32")
    buffer_size_bytes: int = pb(3, "uint64")


@declare("TritonAutotunedKernelCall")
@dataclass(kw_only=True)
class TritonAutotunedKernelCall(Message):
    name: str = pb(1, "string")
    configs: list[Config] = pb(2, Config, repeated=True)
    input_output_aliases: list[InputOutputAlias] = pb(3, InputOutputAlias, repeated=True)


@declare("TritonAnyKernelCall")
@dataclass(kw_only=True)
class TritonAnyKernelCall(Message):
    """What the opaque of jaxlib's Triton custom call holds (zlib-compressed)."""

    kernel_call: TritonKernelCall | None = pb(1, TritonKernelCall, oneof="value")
    autotuned_kernel_call: TritonAutotunedKernelCall | None = pb(
        2, TritonAutotunedKernelCall, oneof="value"
    )
    metadata: bytes = pb(3, "bytes")
    name: str = pb(4, "string")


# -- encoding ---------------------------------------------------------------------------------
def _varint(n: int, out: bytearray) -> None:
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _scalar(kind: str, value: Any, where: str) -> bytes:
    """The payload of one scalar (without its tag)."""
    out = bytearray()
    if kind in _INT_RANGES:
        if not isinstance(value, int):
            raise TypeError(f"{where}: {value!r} is not an int")
        lo, hi = _INT_RANGES[kind]
        if not lo <= value <= hi:
            raise ValueError(f"{where}: {value} is out of range for {kind}")
        _varint(value & 0xFFFFFFFFFFFFFFFF, out)  # negative: ten bytes, sign-extended
    elif kind == "bool":
        out.append(1 if value else 0)
    elif kind == "float":
        v = float(value)
        if v == v and abs(v) > _FLOAT32_MAX:  # as protobuf stores it: out of range is infinite
            v = float("inf") if v > 0 else float("-inf")
        out += struct.pack("<f", v)
    elif kind == "double":
        out += struct.pack("<d", float(value))
    else:  # string, bytes
        want = str if kind == "string" else (bytes, bytearray)
        if not isinstance(value, want):
            raise TypeError(f"{where}: {value!r} is not a {kind}")
        data = value.encode() if isinstance(value, str) else bytes(value)
        _varint(len(data), out)
        out += data
    return bytes(out)


def _is_default(kind: str, value: Any) -> bool:
    if kind in ("float", "double"):  # protobuf compares the bits: -0.0 is written
        return struct.pack("<d", float(value)) == b"\x00" * 8
    return not value


def encode(message: Message) -> bytes:
    """The wire-format bytes of ``message`` (one of this module's message dataclasses), as
    protobuf's deterministic serialization writes them.

    Raises:
        TypeError / ValueError: a field's value does not fit its type.
    """
    out = bytearray()
    for f in type(message)._proto_fields:
        value = getattr(message, f.name)
        if f.repeated:
            if not value:
                continue
            if isinstance(f.kind, str):  # packed
                _varint(f.number << 3 | 2, out)
                body = b"".join(_scalar(f.kind, v, f.name) for v in value)
                _varint(len(body), out)
                out += body
            else:
                for item in value:
                    body = encode(item)
                    _varint(f.number << 3 | 2, out)
                    _varint(len(body), out)
                    out += body
            continue
        if value is None:
            if f.explicit:
                continue
            raise TypeError(f"{type(message).__name__}.{f.name} is None")
        if isinstance(f.kind, str):
            if not f.explicit and _is_default(f.kind, value):
                continue
            _varint(f.number << 3 | SCALARS[f.kind][1], out)
            out += _scalar(f.kind, value, f"{type(message).__name__}.{f.name}")
        else:
            body = encode(value)
            _varint(f.number << 3 | 2, out)
            _varint(len(body), out)
            out += body
    return bytes(out)


def compress(data: bytes) -> bytes:
    """The opaque jaxlib expects: zlib-compressed serialized TritonAnyKernelCall (level 1:
    machine code compresses little further, and lowering stays fast)."""
    return zlib.compress(data, 1)


# -- decoding with protobuf (inspection and tests) --------------------------------------------
def file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """The schema as a protobuf ``FileDescriptorProto``, derived from the message dataclasses."""
    from google.protobuf import descriptor_pb2

    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(
        name="kernelcache/bridge/triton.proto", package=_PACKAGE, syntax="proto3"
    )
    made: dict[str, Any] = {}
    for cls in sorted(MESSAGES, key=lambda c: c._proto_name.count(".")):  # parents first
        parent, _, short = cls._proto_name.rpartition(".")
        msg = (made[parent].nested_type if parent else fd.message_type).add(name=short)
        made[cls._proto_name] = msg
        oneofs: dict[str, int] = {}
        for f in cls._proto_fields:
            if f.oneof is not None and f.oneof not in oneofs:
                oneofs[f.oneof] = len(msg.oneof_decl)
                msg.oneof_decl.add(name=f.oneof)
        for f in cls._proto_fields:
            field = msg.field.add(name=f.name, number=f.number)
            field.label = F.LABEL_REPEATED if f.repeated else F.LABEL_OPTIONAL
            if isinstance(f.kind, str):
                field.type = SCALARS[f.kind][0]
            else:
                field.type = _TYPE_MESSAGE
                field.type_name = f".{_PACKAGE}.{f.kind._proto_name}"
            if f.oneof is not None:
                field.oneof_index = oneofs[f.oneof]
        for f in cls._proto_fields:  # synthetic oneofs of proto3 optional fields come last
            if f.optional:
                field = next(x for x in msg.field if x.number == f.number)
                field.proto3_optional = True
                field.oneof_index = len(msg.oneof_decl)
                msg.oneof_decl.add(name=f"_{f.name}")
        for number in cls._proto_reserved:
            msg.reserved_range.add(start=number, end=number + 1)
    return fd


@functools.lru_cache(maxsize=1)
def messages() -> dict[str, type]:
    """protobuf's message classes by name (TritonKernel, TritonKernelCall, TritonAnyKernelCall,
    ...), for parsing. Lowering never needs them."""
    from google.protobuf import descriptor_pool

    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_descriptor())
    try:
        from google.protobuf.message_factory import GetMessageClass
    except ImportError:  # protobuf < 4.22
        from google.protobuf.message_factory import MessageFactory

        GetMessageClass = MessageFactory(pool).GetPrototype
    return {
        cls._proto_name: GetMessageClass(
            pool.FindMessageTypeByName(f"{_PACKAGE}.{cls._proto_name}")
        )
        for cls in MESSAGES
    }


def parse_call(data: bytes) -> Any:
    """Parse (uncompressed) TritonAnyKernelCall bytes with protobuf."""
    msg = messages()["TritonAnyKernelCall"]()
    msg.ParseFromString(data)
    return msg


def decode_opaque(opaque: bytes) -> Any:
    """Parse an opaque (zlib-compressed TritonAnyKernelCall) for inspection and tests."""
    return parse_call(zlib.decompress(opaque))
