"""A read set: what Triton's frontend read while it generated one kernel, as plain data that any
process compares with what the same reads find now (:func:`stale`). A check reads and
compares; it never calls.

A read set is a list of rows ``[parent, op, operand, want]``, in the order the frontend made the
reads. ``parent`` is the row whose object the read was made on (``-1``: the kernel itself);
``op`` is one of :data:`~bridge.entries.metadata.OPS` (the one table of reads: their forms, how
a check treats each, their words); ``want`` is a digest of what the read found
(:meth:`Trace.want`), an object described by content, or named by the row that first found it.
An argument is ``["v", value]`` (plain, :func:`exact`), ``["r", row]`` (the object a row found)
or ``["rk", row]`` (that object in a ``constexpr``).

A check makes each namespace read again (no descriptor but Python's own binding, no
``__getattr__``, no ``__eq__`` or ``__hash__`` of the program's) and compares what it finds. A
*decided* row (a call, a built-in that reads no attribute, any read of what a decided row found)
is never made: its callee, arguments and the reads its code can make (recorded by :mod:`.reach`)
decide it. A read set whose calls its reads do not decide is *partial* and ends with the
``"ir"`` read, which runs Triton's frontend for the lookup's own specialization and compares.

Invariant: a check gives the digests a frontend run now would record for the same reads. A
read set is hostile input (a shared root, a remote tier, a bundle): nothing it says runs code,
and what a check of one entry may do is bounded (:data:`MAX_READ_SETS`, :data:`MAX_ENTRY_ROWS`,
:data:`MAX_PARTS`): past a bound it is refused. Every outcome is a :class:`Verdict`; nothing a
check meets leaves it as an exception. The walk of a lookup over the keys chained from what
reads find (:func:`follow`, one hop of it :func:`hop`) and the door policy of a remote tier
(:func:`door`) are here, shared by the fetch of kernels, the lowering and the commands.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from ..entries import metadata
from ..exceptions import OverBudget
from ..identity.exact_values import ABSENT, describe, remember, remembered
from ..identity.keyed_environment import environment_want
from ..identity.namespaces import (
    budget,
    defaults,
    exact,
    generated_attribute,
    module_map_of,
    plain_json,
    remake,
    scope_value,
    source_file,
    unwrap,
)
from ..identity.static_reads import RUNS_CODE
from . import static_access

FORMAT = metadata.FORMAT
#: the most read sets one entry holds (a stored lowering: one per kernel it embeds), the most
#: rows they hold together, and the most values and items a check of the entry describes
MAX_READ_SETS = 256
MAX_ENTRY_ROWS = 32768
MAX_PARTS = 250_000
T = TypeVar("T")
#: the specializations an IR read may be for, asked only where one is made (None: none is)
Expected = Callable[[], Sequence[Any]] | None


class Verdict(NamedTuple):
    """What a check found of an entry's read sets: ``kind`` one of :data:`FRESH`,
    :data:`CHANGED` (``now``: the digest of what the reads find now, the next key's ingredient),
    :data:`REFUSED` (``reason``: data no compile of this code writes, or past a bound) or
    :data:`UNCHECKED` (an IR read, and no specialization given to make it for)."""

    kind: str
    now: str = ""
    reason: str = ""

    @property
    def fresh(self) -> bool:
        return self.kind == FRESH

    @property
    def said(self) -> str:
        """Why its entry is refused or set aside, as a refusal says it."""
        return f"a read set no compile of this code wrote: {self.reason}"


FRESH, CHANGED, REFUSED, UNCHECKED = "fresh", "changed", "refused", "unchecked"


def refused(reason: str, *texts: str) -> Verdict:
    """A refusal for ``reason`` of the read sets ``texts`` (its ``now``: a digest of them, so
    that a lookup passing it chains the same key in every process)."""
    now = hashlib.sha256("\0".join(["refused", *texts]).encode()).hexdigest()
    return Verdict(REFUSED, now, reason[:200])


# -- what reads found ----------------------------------------------------------------------------
class Trace:
    """The objects reads found, by the row that first found each (a recorder's, or a
    check's: both describe what they find the same way)."""

    def __init__(self) -> None:
        self.rows: dict[int, int] = {}
        self.kept: list[Any] = []  # (the objects of ``rows``, alive while their ids are keys)
        self.opaque: list[str] = []
        #: the digests of plain values met, by id: (the value, kept alive; its digest)
        self.plain: dict[int, tuple[Any, str]] = {}

    def row_of(self, value: Any) -> int | None:
        return self.rows.get(id(value))

    def note(self, value: Any, row: int) -> None:
        """Remember ``value`` as found by ``row`` (unless met before)."""
        if exact(value) is None and id(value) not in self.rows:
            self.rows[id(value)] = row
            self.kept.append(value)

    def want(self, value: Any, row: int) -> str:
        """The digest of what ``value``, found by ``row``, is (and remember it).

        Raises:
            OverBudget: describing it went past the budget open (:func:`~bridge.identity.namespaces.budget`).
        """
        if value is ABSENT:
            return "absent"
        known = self.plain.get(id(value))
        if known is not None and known[0] is value:
            return known[1]
        plain = exact(value)
        if plain is not None:
            digest = _digest(plain)
            self.plain[id(value)] = (value, digest)
            return digest
        first = self.rows.get(id(value))
        if first is not None:
            return f"same:{first}"
        want = self._described(value, row)
        self.note(value, row)
        return want

    def _described(self, value: Any, row: int) -> str:
        known = remembered(value)
        if known is not None:
            return known
        desc = describe(value)
        if desc is None:
            self.opaque.append(f"{type(value).__qualname__} (row {row})")
            return _digest(["opaque", row])
        want = _digest(desc)
        remember(value, desc, want)
        return want


def _digest(desc: Any) -> str:
    text = json.dumps(desc, separators=(",", ":"), default=repr)
    return text if len(text) <= 40 else hashlib.sha256(text.encode()).hexdigest()[:32]


# -- the reads a check makes again ---------------------------------------------------------------
#: what a decided row finds at a check: nothing is made (see the module docstring)
DECIDED: Any = type("Decided", (), {"__repr__": lambda self: "<decided>"})()
_FAILED: Any = type("Failed", (), {"__repr__": lambda self: "<failed>"})()


def _argument(arg: Any, found: Sequence[Any]) -> Any:
    tag, body = arg
    return found[int(body)] if tag in ("r", "rk") else remake(body)


def read(
    base: Any, op: str, operand: Any, found: Sequence[Any], given: Any, modules: Any, backend: Any
) -> Any:
    """What row ``[parent, op, operand, _]`` finds on ``base`` now, by a namespace read
    (``modules``: the backend's module map; ``backend``: for an ``"ir"`` read);
    :data:`~bridge.identity.static_reads.RUNS_CODE` where only code would find it (none runs).

    Raises:
        whatever a read of what is not there raises (AttributeError, LookupError, TypeError,
        ValueError: the read differs).
    """
    if op == "ir":  # (the frontend generating the kernel, for the lookup's own specialization)
        from ..identity.frontend import ir_again

        return ir_again(base, operand, given, backend)
    if op == "p":
        return given.get(str(operand), ABSENT)
    if op == "e":
        return environment_want(str(operand), os.environ.get(str(operand)))
    if op == "g":
        return scope_value(base, str(operand), modules)
    if op == "a":
        return generated_attribute(base, str(operand), modules)
    if op == "i":
        return static_access.item(base, unwrap(_argument(operand, found)))
    if op == "b":  # (getattr and hasattr: a built-in that is decided is never made)
        return static_access.builtin(str(operand[0]), [_argument(a, found) for a in operand[1]])
    if op == "f":
        return source_file(base)
    if op == "d":
        return defaults(base)
    raise ValueError(f"not a read: {op!r:.20}")


def _decided(op: str, operand: Any, base: Any, found: Sequence[Any]) -> bool:
    """Whether a row is decided (see the module docstring)."""
    if metadata.OPS[op].decided(operand) or base is DECIDED:
        return True
    args = [operand] if op == "i" else operand[1] if op == "b" else []
    return any(a[0] in ("r", "rk") and found[int(a[1])] is DECIDED for a in args)


@functools.lru_cache(maxsize=512)
def parse(text: str) -> tuple[tuple[int, str, Any, str], ...] | None:
    """The rows of a read set's text: None for anything :func:`~bridge.entries.metadata.problem`
    refuses or an earlier version wrote."""
    if metadata.problem(text) is not None:
        return None
    doc = json.loads(text)
    if doc["format"] != FORMAT:
        return None
    return tuple((parent, op, operand, want) for parent, op, operand, want in doc["rows"])


def reads_ir(texts: Sequence[str]) -> bool:
    """Whether one of the read sets ``texts`` ends with the IR read (which a check makes only
    for a specialization it is given)."""
    return any((rows := parse(t)) is not None and rows and rows[-1][1] == "ir" for t in texts)


def wants(
    text: str, kernel: Any, given: Any, modules: Any, backend: Any = None, expected: Expected = None
) -> list[str] | Verdict:
    """What each read of ``text`` finds now, made again from ``kernel`` and ``given`` (its
    constexpr arguments by name): a decided row's as it was; a read that fails finds
    ``"error"``. A :class:`Verdict` instead where the text is no read set of this version
    (:data:`CHANGED`), refused, or ends with an IR read not made (``expected()``: the
    specializations an IR read may be for; None: :data:`UNCHECKED`). Never raises."""
    rows = parse(text)
    if rows is None:
        return Verdict(CHANGED, hashlib.sha256(b"unreadable\0" + text.encode()).hexdigest())
    if not rows:
        return refused("no reads (every compile reads its kernel's source file)", text)
    if rows[-1][1] == "ir":
        if expected is None:
            return Verdict(UNCHECKED, reads_digest([text]))
        if plain_json(rows[-1][2]) not in {plain_json(e) for e in expected()}:
            return refused("an IR read of a specialization the lookup is not for", text)
    trace = Trace()
    found: list[Any] = []
    out: list[str] = []
    try:
        for index, (parent, op, operand, want) in enumerate(rows):
            base = kernel if parent < 0 else found[parent]
            if _decided(op, operand, base, found):
                found.append(DECIDED)
                out.append(want)
                continue
            value = _FAILED
            if base is not _FAILED:
                try:
                    value = read(base, op, operand, found, given, modules, backend)
                except OverBudget:
                    raise
                except Exception:  # (a read of what is not there, or the frontend failing now)
                    value = _FAILED
            if value is RUNS_CODE:  # (only code would find it: none runs, the read differs)
                value = _FAILED
            found.append(value)
            out.append("error" if value is _FAILED else trace.want(value, index))
    except OverBudget:
        return refused(f"its reads describe more than {MAX_PARTS:,} values", text)
    except RecursionError:
        return refused("a value nested past what a check describes", text)
    return out


def check(
    text: str, kernel: Any, given: Any, modules: Any, backend: Any = None, expected: Expected = None
) -> Verdict:
    """The :class:`Verdict` of the read set ``text`` (see :func:`wants`)."""
    now = wants(text, kernel, given, modules, backend, expected)
    if isinstance(now, Verdict):
        return now
    rows = parse(text)
    assert rows is not None  # (wants parsed it)
    if all(w == row[3] for w, row in zip(now, rows, strict=True)):
        return Verdict(FRESH)
    return Verdict(CHANGED, reads_digest(now))


def reads_digest(parts: Sequence[str]) -> str:
    """A 64-hex-digit digest of ``parts``, what reads found."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


# -- the read sets of a cached kernel or lowering, checked before it is used -------------------
def params(src: Any) -> dict[str, Any]:
    """The constexpr arguments of Triton's source object ``src`` given whole, by name."""
    names = src.fn.arg_names
    return {names[p[0]]: v for p, v in src.constants.items() if len(p) == 1 and p[0] < len(names)}


def bounds(texts: Sequence[Any]) -> str | None:
    """Why an entry holding the read sets ``texts`` is past what a check of one entry may do
    (:data:`MAX_READ_SETS`, :data:`MAX_ENTRY_ROWS`), None where it is within."""
    if len(texts) > MAX_READ_SETS:
        return f"{len(texts)} read sets (at most {MAX_READ_SETS})"
    rows = sum(len(parse(t) or ()) for t in texts if isinstance(t, str))
    if rows > MAX_ENTRY_ROWS:
        return f"{rows} reads in all (at most {MAX_ENTRY_ROWS})"
    return None


def stale(
    texts: Any,
    kernel: Any,
    given: Any,
    backend: Any,
    seen: dict[Any, Any] | None = None,
    expected: Expected = None,
) -> Verdict:
    """The :class:`Verdict` of the read sets ``texts`` of one entry (of kernels of the JIT
    function ``kernel`` for ``backend``'s target, with the constexpr arguments ``given``): a
    refusal or an unchecked IR read first, else :data:`CHANGED` where any read finds
    something else. ``seen``: the checks made so far in one lowering of a program (nothing
    else runs between two calls' checks): one made again for the same kernel and objects is
    not. Never raises; no garbage collection runs while it checks (a collection runs the
    finalizers and callbacks of whatever it finds)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        if not texts or not all(isinstance(t, str) for t in texts):
            return refused("no read set (every compile of the bridge writes one)")
        why = bounds(texts)
        if why is not None:
            return refused(why, *texts)
        modules = module_map_of(backend)
        with budget(MAX_PARTS):
            now = [_check_once(t, kernel, given, modules, backend, seen, expected) for t in texts]
    except OverBudget:
        return refused(f"its reads describe more than {MAX_PARTS:,} values", *texts)
    finally:
        if collecting:
            gc.enable()
    for kind in (REFUSED, UNCHECKED):
        first = next((n for n in now if n.kind == kind), None)
        if first is not None:
            return first
    if all(n.fresh for n in now):
        return Verdict(FRESH)
    return Verdict(CHANGED, reads_digest([n.now for n in now]))


def _check_once(
    text: str,
    kernel: Any,
    given: Any,
    modules: Any,
    backend: Any,
    seen: dict[Any, Any] | None,
    expected: Expected,
) -> Verdict:
    """:func:`check`, or its result for the same read set, kernel and objects of ``given``
    in ``seen`` (by their ids: the objects are kept alive there, so no other takes an id)."""
    rows = parse(text) if seen is not None else None
    if seen is None or rows is None:
        return check(text, kernel, given, modules, backend, expected)
    objects = (kernel, *(given.get(name, ABSENT) for name in _given_names(rows)))
    which: tuple[Any, ...] = (text, *map(id, objects))
    if expected is not None and any(op == "ir" for _, op, _, _ in rows):
        which += (tuple(sorted(plain_json(e) for e in expected())),)
    found = seen.get(which)
    if found is None:
        found = seen[which] = (objects, check(text, kernel, given, modules, backend, expected))
    return found[1]


def _given_names(rows: Sequence[tuple[int, str, Any, str]]) -> list[str]:
    """The parameters whose arguments the reads ``rows`` take from ``given``: those of ``"p"``
    reads, and those an ``"ir"`` read's specialization names (:func:`~bridge.identity.frontend.ir_again`)."""
    names = []
    for _, op, operand, _ in rows:
        if op == "p":
            names.append(str(operand))
        elif op == "ir" and isinstance(operand, dict):
            constants = operand.get("constants")  # (untrusted: any JSON value)
            for item in constants if isinstance(constants, list) else ():
                value = item[1] if isinstance(item, list) and len(item) == 2 else None
                if isinstance(value, list) and value[:1] == ["param"] and len(value) > 1:
                    names.append(str(value[1]))
    return names


def door(verdict: Verdict) -> str | None:
    """The door policy for an entry of a remote tier, checked before any copy of it is made
    here: a refused one is refused at the door (why); any other is published, and the lookup
    judges it (a stale one is another version of the code's)."""
    return verdict.said if verdict.kind == REFUSED else None


# -- the one walk of a lookup --------------------------------------------------------------------
#: how many other versions of a kernel's reads one lookup follows before it compiles in memory
MAX_HOPS = 3


def chained(key: str, now: str) -> str:
    """The key under which the kernel (or lowering) of ``key`` is kept for code whose reads
    find ``now`` (a :data:`CHANGED` verdict's): each version of what the frontend reads has
    its own entry."""
    return reads_digest([key, now])


def hop(key: str, verdict: Verdict, hops: int) -> str | None:
    """The key a lookup goes on to from ``key`` (reached after ``hops`` hops), whose entry's
    reads find what ``verdict`` says: the one :func:`chained` from it, None past
    :data:`MAX_HOPS` (the kernel or lowering is then kept in memory only)."""
    return None if hops >= MAX_HOPS else chained(key, verdict.now)


def follow(
    key: str, entry: Callable[[str], T | None], judge: Callable[[str, Any], Verdict]
) -> tuple[str | None, T | None]:
    """The one walk of a lookup (a lowering's, an audit's, ``explain``'s; the fetch of kernels
    makes the same hops, :func:`hop`, for many keys at once): the entry under ``key`` whose
    reads find what they found (``judge(key, found)`` is fresh), else the one under the next
    key; with the key it is (or is to be) stored under: ``(key, None)`` where nothing is stored
    there yet, ``(None, None)`` past the last hop. A refused or unchecked entry is passed as one
    that finds something else."""
    hops = 0
    while True:
        found = entry(key)
        if found is None:
            return key, None
        verdict = judge(key, found)
        if verdict.fresh:
            return key, found
        after = hop(key, verdict, hops)
        if after is None:
            return None, None
        key, hops = after, hops + 1
