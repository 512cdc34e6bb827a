"""A kernel's code and constexprs as kernel keys hold them: exact descriptions, or none.

:func:`identity` is the digest of a JIT function's description (:mod:`.describe`): its source,
first line and decorator settings and, by content, every value its frontend can read (helpers,
constexpr globals, modules' attributes, constexpr_functions and what they read). It is a
superset of what Triton's ``cache_key`` covers, computed without parsing the source.
:func:`constant` describes a constexpr argument the same way.

Both raise :class:`~bridge.exceptions.Undescribable` where the description cannot be proved
complete: the kernel is then *open*, keyed by the IR Triton's frontend produces for it
(:mod:`.frontend`), never by an approximate description.

An identity is memoized per function for the process, and used only while every value its
description read is as it was (:func:`.watch.unchanged`: the same objects, buffers and sets
by content). Triton's launcher checks the globals a kernel used the same way before each
launch; here a change gives a new identity, so the new code is lowered, never the old one.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Callable
from typing import Any

from ..exceptions import Undescribable
from .describe import describe
from .static_reads import PLAIN_TYPES, is_jit, plain_text
from .watch import Read, mark, unchanged

__all__ = ["Undescribable", "constant", "identity", "is_jit"]

#: identities by the id of their function: (a weak reference to it, its source and settings
#: then, the identity, what its description read)
_memo: dict[int, tuple[Callable[[], Any], tuple[Any, ...], str, tuple[Read, ...]]] = {}


def identity(fn: Any) -> str:
    """The identity of the JIT function ``fn`` (see the module docstring): a sha256 digest.

    Raises:
        Undescribable: something ``fn``'s frontend can read has no exact description (the
            message says what and why): the kernel is open.
    """
    now = mark(fn)
    known = _memo.get(id(fn))
    if known is not None and known[0]() is fn and known[1] == now and unchanged(known[3]):
        return known[2]
    doc, found = describe(fn)
    digest = hashlib.sha256(repr(doc).encode()).hexdigest()  # (plain lists and strings)
    try:
        _memo[id(fn)] = (_reference(fn, _memo), now, digest, found)
    except TypeError:  # (an object that cannot be referred to weakly: not memoized)
        pass
    return digest


def _reference(value: Any, memo: dict[int, Any]) -> Callable[[], Any]:
    """A weak reference to ``value`` that forgets its entry of ``memo`` when it dies."""
    key = id(value)

    def forget(ref: Any) -> None:
        entry = memo.get(key)
        if entry is not None and entry[0] is ref:
            del memo[key]

    return weakref.ref(value, forget)


#: descriptions of constexpr objects by their id, as :data:`_memo` holds identities: (a weak
#: reference to the object, its description, what the description read)
_constants: dict[int, tuple[Callable[[], Any], Any, tuple[Read, ...]]] = {}


def constant(value: Any) -> Any:
    """``value``, a constexpr, as plain data whose ``repr`` tells it from every value the
    frontend could compile differently (see :mod:`.describe`; a float by its bits, so that a
    NaN's sign counts). Memoized per object for the process while nothing its description read
    changed, as :func:`identity` is.

    Raises:
        Undescribable: ``value`` has no such description (the message says what and why).
    """
    kind = type(value)
    if kind in PLAIN_TYPES:
        return [kind.__name__, plain_text(value)]
    if kind is tuple and all(type(v) in PLAIN_TYPES for v in value):
        return ["tuple", [[type(v).__name__, plain_text(v)] for v in value]]
    known = _constants.get(id(value))
    if known is not None and known[0]() is value and unchanged(known[2]):
        return known[1]
    doc, found = describe(value)
    try:
        _constants[id(value)] = (_reference(value, _constants), doc, found)
    except TypeError:  # (not weakly referable: described at each use)
        pass
    return doc
