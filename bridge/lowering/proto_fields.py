"""How a message of jaxlib's Triton wire schema is declared, for :mod:`.proto` to declare them.

A message is a dataclass registered with :func:`declare` under its protobuf name (nested names
with dots); each of its fields is made by :func:`pb`, which carries the field's number and type
(a scalar type name of :data:`SCALARS`, or a message class) in the dataclass field's metadata.
:func:`declare` turns that metadata into the message's :class:`Field` list, which is all that
:func:`.proto.encode` and :func:`.proto.file_descriptor` read of a message.

Invariants, checked when a message registers: its fields are declared in field-number order
(the order :func:`.proto.encode` writes them in); a repeated field holds messages or packable
scalars, never strings or bytes. A field's Python default says its presence: a list for a
repeated field, None where presence is explicit (an ``optional`` scalar, a oneof member, a
sub-message), else the type's zero (held at its zero, such a field is not written).
:data:`MESSAGES` holds every registered message class once, in declaration order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

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
