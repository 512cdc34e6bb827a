"""Plain values as keys describe them: exact ``int``, ``float``, ``complex``, ``str``,
``bytes``, ``bool`` and None (:data:`PLAIN`), each by its type and a text (:func:`plain_text`).

The text is the value's ``repr``, but a float's and a complex number's are their bits: ``repr``
shows every NaN as ``nan``, whatever its sign and payload, and a NaN given to a kernel reaches
its machine code bit for bit. Invariant: two plain values have the same text only where they
are the same value of the same type (``0.0`` and ``-0.0`` apart, every NaN apart from the
others).
"""

from __future__ import annotations

import struct
from typing import Any

#: values described by type and text (exact types only: a subclass may behave otherwise)
PLAIN = (int, float, str, bytes, bool, type(None), complex)
PLAIN_TYPES = frozenset(PLAIN)


def plain_text(value: Any) -> str:
    """A plain value (of :data:`PLAIN`, or a tuple or frozenset of them, as a code object's
    constants are) as text that tells it from every other (see the module docstring). The text
    of a float or a complex starts with its kind, which no ``repr`` of another plain value
    does."""
    kind = type(value)
    if kind is float:
        return "float:" + struct.pack("<d", value).hex()
    if kind is complex:
        return "complex:" + struct.pack("<dd", value.real, value.imag).hex()
    if kind is tuple:
        return "(" + "".join(plain_text(v) + ", " for v in value) + ")"
    if kind is frozenset:  # (its iteration order varies between processes)
        return f"frozenset({sorted(plain_text(v) for v in value)!r})"
    return repr(value)
