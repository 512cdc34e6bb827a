"""What the reads of a read set found, described (:class:`Trace`): the digest a row keeps of
what its read found, the same way for a recorder (:mod:`.witness`) and for a check
(:mod:`.read_sets`).

A plain value by its exact description, an object met before by the row that first found it
(so two names for one object, and one name for two, tell apart), any other object by its
description (:func:`~.exact_values.describe`), made where no code of the program may run
(:func:`description`): one that has none, or that only code would give, is *opaque* (the read
set is partial). Descriptions that follow from what an object is (a module, Triton's own
object) or from that and a stamp (a function's code) are memoized per object.
"""

from __future__ import annotations

import hashlib
import json
import types
from typing import Any

from ..exceptions import CheckInterrupted
from .exact_values import ABSENT, describe, exact
from .guard import current
from .watch import mark


class Trace:
    """The objects reads found, by the row that first found each (a recorder's, or a
    :func:`check`'s: both describe what they find the same way)."""

    def __init__(self) -> None:
        self.rows: dict[int, int] = {}
        self.kept: list[Any] = []  # (the objects of ``rows``, alive while their ids are keys)
        self.opaque: list[str] = []

    def row_of(self, value: Any) -> int | None:
        return self.rows.get(id(value))

    def note(self, value: Any, row: int) -> None:
        """Remember ``value`` as found by ``row`` (unless met before)."""
        if exact(value) is None and id(value) not in self.rows:
            self.rows[id(value)] = row
            self.kept.append(value)

    def want(self, value: Any, row: int) -> str:
        """The digest of what ``value``, found by ``row``, is (and remember it)."""
        if value is ABSENT:
            return "absent"
        plain = exact(value)
        if plain is not None:
            return _digest(plain)
        first = self.rows.get(id(value))
        if first is not None:
            return f"same:{first}"
        want = self._described(value, row)  # (may raise: then ``value`` is not remembered)
        self.note(value, row)
        return want

    def _described(self, value: Any, row: int) -> str:
        known = _wants.get(id(value))
        if known is not None and known[0] is value:
            if known[1] is None or known[1] == _stamp(value, known[1][0]):
                return known[2]
        desc = description(value)
        if desc is None:
            self.opaque.append(f"{type(value).__qualname__} (row {row})")
            return _digest(["opaque", row])
        want = _digest(desc)
        if type(value) is types.ModuleType or desc[0] == "triton":
            _keep(value, None, want)
        elif desc[0] in ("jit", "fn", "cfn"):
            _keep(value, _stamp(value, desc[0]), want)
        return want


def description(value: Any) -> Any:
    """:func:`~.exact_values.describe` of ``value``, where it runs no code of the program (in
    the guard open, if any: a recording's or a check's alike): None where it would."""
    guard = current()
    if guard is None:
        return describe(value)
    with guard.strict():
        try:
            return describe(value)
        except CheckInterrupted:
            guard.rearm()
            return None


#: the wants of objects whose description follows from what they are (modules: their
#: attributes are reads of their own; Triton's objects: Triton's files are in every key) or
#: from that and a stamp (:func:`_stamp`), by id: (the object, its stamp then or None, its
#: want)
_wants: dict[int, tuple[Any, Any, str]] = {}
#: the most objects :data:`_wants` keeps (then it starts again)
MAX_KEPT = 4096


def _keep(value: Any, stamp: Any, want: str) -> None:
    if len(_wants) >= MAX_KEPT:
        _wants.clear()
    _wants[id(value)] = (value, stamp, want)


def _stamp(value: Any, kind: str) -> tuple[Any, ...]:
    """What the description of ``value`` (of ``kind``) follows from besides its identity: a
    JIT function's source, settings and first line; a function's code object, defaults and
    the objects it closes over (what they hold is read where it is used: calls are made
    again); a ``constexpr_function``'s code object (its calls are made again)."""
    if kind == "jit":
        return (kind, mark(value), getattr(value, "starting_line_number", None))
    if kind == "cfn":
        return (kind, value.fn.__code__)
    cells = []
    for cell in value.__closure__ or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:
            cells.append(ABSENT)
    return (kind, value.__code__, value.__defaults__, value.__kwdefaults__, *cells)


def _digest(desc: Any) -> str:
    text = json.dumps(desc, separators=(",", ":"), default=repr)
    return text if len(text) <= 40 else hashlib.sha256(text.encode()).hexdigest()[:32]
