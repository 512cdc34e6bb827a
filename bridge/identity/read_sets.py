"""A read set: what Triton's frontend read while it generated one kernel, as plain data that any
process can ask again (:func:`check`).

A read set is a list of rows ``[parent, op, operand, want]``, in the order the frontend made the
reads (its form: :mod:`bridge.entries.metadata`). ``parent`` is the row whose object the read
was made on (``-1``: the kernel itself); ``op`` is one of ``"g"`` (a global or closure variable
of a function, as Triton's code generator resolves it), ``"a"`` (an attribute), ``"i"`` (an
item), ``"c"`` (a call of a ``constexpr_function`` or of a function or class of the program,
with ``[args, kwargs]``), ``"b"`` (a built-in the code generator offers, made again without
running code of the program: :func:`~.static_access.builtin`), ``"f"`` (a JIT function's source
file as the binary's debug information names it), ``"d"`` (a function's defaults), ``"e"`` (an
environment variable no key holds, as a keyed digest of its value:
:mod:`.keyed_environment`), ``"p"`` (a constexpr argument of the kernel that is an object) and
``"ir"`` (where the read set is partial: the digest of the IR the frontend gives in the
specialization ``operand``, made again); ``want`` is a digest of what the read found
(:meth:`Trace.want`). An argument is ``["v", value]`` (plain, :func:`exact`), ``["r", row]``
(the object a row found) or ``["rk", row]`` (that object in a ``constexpr``).

What a read found is described by content (:func:`~.exact_values.describe`), an object met
before by the row that first found it. Invariant: :func:`check` gives the digests a frontend run
now would record for the same reads, so a kernel whose reads all find what they found is the
kernel its frontend would generate now (its key holds the rest). A partial read set ends with
the ``"ir"`` read: the frontend vouches for what the witness could not follow.

A read set is hostile input (a shared root, a remote tier, a bundle): its rows are checked
against the kernel's code before any runs (:mod:`.admit`), reads run no code of what they read,
calls run only where the code allows them and under a deadline (:mod:`.guard`), and nothing a
check raises leaves it (a :class:`Refusal`). A lookup (:func:`follow`) uses an entry only while
:func:`stale` finds every read as it was, else the one under the key :func:`chained` from it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..entries import metadata
from ..exceptions import CheckInterrupted, RefusedReadSet
from . import admit, static_access, static_reads
from .admit import defaults, generated_attribute, module_map_of, remake, scope_value, source_file
from .exact_values import ABSENT, describe, exact, language, remember, remembered, unwrap
from .guard import CHECK, STATE, Guard, Watchdog
from .keyed_environment import environment_want
from .static_access import builtin
from .static_reads import RUNS_CODE

FORMAT = metadata.FORMAT
T = TypeVar("T")


class OnDemand:
    """A check's guard (:mod:`.guard`), made when a read first needs it (a call made again, an
    object described by its fields); a call made again is interrupted once the check has run
    ``seconds`` (:class:`~.guard.Watchdog`)."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds
        self.made: Guard | None = None
        self.watchdog: Watchdog | None = None

    def guard(self) -> Guard:
        if self.made is None:
            self.made = Guard(CHECK)
        return self.made

    def tracing(self) -> contextlib.AbstractContextManager[None]:
        return self.guard().tracing()

    def calling(self) -> contextlib.AbstractContextManager[list[Any]]:
        if self.watchdog is None:
            self.watchdog = Watchdog(max(0.0, self.end - time.monotonic()))
        return self.guard().calling()

    def strict(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # (a check refuses code of the program anywhere)

    def rearm(self) -> None:
        if self.made is not None:
            self.made.rearm()

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.close()


# -- what reads found ----------------------------------------------------------------------------
class Trace:
    """The objects reads found, by the row that first found each (a recorder's, or a
    :func:`check`'s: both describe what they find the same way)."""

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
        """The digest of what ``value``, found by ``row``, is (and remember it)."""
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
        want = self._described(value, row)  # (may raise: then ``value`` is not remembered)
        self.note(value, row)
        return want

    def _described(self, value: Any, row: int) -> str:
        known = remembered(value)
        if known is not None:
            return known
        desc = description(value)
        if desc is None:
            self.opaque.append(f"{type(value).__qualname__} (row {row})")
            return _digest(["opaque", row])
        want = _digest(desc)
        remember(value, desc, want)
        return want


def description(value: Any) -> Any:
    """:func:`~.exact_values.describe` of ``value``, where it runs no code of the program (in
    the guard open, if any: a recording's or a check's alike): None where it would."""
    guard = getattr(STATE, "guard", None)  # (read here: a check's may not be made yet)
    if guard is None:
        return describe(value)
    with guard.strict():
        try:
            return describe(value)
        except CheckInterrupted:
            guard.rearm()
            return None


def _digest(desc: Any) -> str:
    text = json.dumps(desc, separators=(",", ":"), default=repr)
    return text if len(text) <= 40 else hashlib.sha256(text.encode()).hexdigest()[:32]


# -- making reads again ---------------------------------------------------------------------------
def _argument(arg: Any, found: Sequence[Any]) -> Any:
    tag, body = arg
    if tag == "r":
        return found[int(body)]
    if tag == "rk":
        value = found[int(body)]
        tl = language()
        if issubclass(type(value), tl.constexpr) and type(value) is not tl.constexpr:
            raise ValueError("a constexpr of a subclass (constexpr() reads its value)")
        if not static_reads.own_class(value):  # (constexpr() asks isinstance of it)
            raise ValueError("an object that tells its own class, in a constexpr")
        return tl.constexpr(value)
    return remake(body)


def _call(fn: Any, operand: Any, found: Sequence[Any], guard: OnDemand | None) -> Any:
    args, kwargs = operand
    args = [_argument(a, found) for a in args]
    kwargs = {str(k): _argument(a, found) for k, a in kwargs}
    constexpr_function = static_reads.jit_classes()[1]
    if constexpr_function is not None and issubclass(type(fn), constexpr_function):
        fn, args, kwargs = (
            fn.fn,
            [unwrap(a) for a in args],
            {k: unwrap(v) for k, v in kwargs.items()},
        )
    if guard is None:
        return unwrap(fn(*args, **kwargs))
    with guard.tracing(), guard.calling():
        return unwrap(fn(*args, **kwargs))


def read(
    base: Any,
    op: str,
    operand: Any,
    found: Sequence[Any],
    given: Any,
    modules: Any,
    backend: Any,
    guard: OnDemand | None = None,
) -> Any:
    """What row ``[parent, op, operand, _]`` finds on ``base`` now (``modules``: the backend's
    module map; ``backend``: for an ``"ir"`` read; ``guard``: the check's, for a call);
    :data:`~.static_reads.RUNS_CODE` where the read would run code it may not."""
    if op == "ir":  # (the frontend generating the kernel, for a specialization admitted: not
        from .frontend import ir_again  # traced, as nothing of a check is but what may run code)

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
    if op == "c":
        return _call(base, operand, found, guard)
    if op == "b":
        return builtin(str(operand[0]), [_argument(a, found) for a in operand[1]])
    if op == "f":
        return source_file(base)
    if op == "d":
        return defaults(base)
    raise ValueError(f"not a read: {op!r:.20}")


@functools.lru_cache(maxsize=512)
def parse(text: str) -> tuple[tuple[int, str, Any, str], ...] | None:
    """The rows of a read set's text: None for anything :func:`~bridge.entries.metadata.problem` refuses."""
    if metadata.problem(text) is not None:
        return None
    doc = json.loads(text)
    if doc["format"] != FORMAT:
        return None
    rows = doc["rows"]
    return tuple((parent, op, operand, want) for parent, op, operand, want in rows)


def reads_ir(texts: Sequence[str]) -> bool:
    """Whether one of the read sets ``texts`` ends with the IR read (which a check makes only
    for a specialization it is given)."""
    return any((rows := parse(t)) is not None and rows and rows[-1][1] == "ir" for t in texts)


class Refusal(str):
    """What :func:`check` finds for a read set the kernel's code does not admit (:mod:`.admit`):
    a digest of the text like any other, with the ``reason``. Nothing of it runs."""

    reason: str

    def __new__(cls, text: str, reason: str) -> Refusal:
        made = super().__new__(cls, hashlib.sha256(b"refused\0" + text.encode()).hexdigest())
        made.reason = reason
        return made

    @property
    def said(self) -> str:
        """Why its entry is refused or set aside, as a refusal says it."""
        return f"a read set its code does not admit: {self.reason}"


class Unchecked(str):
    """What :func:`stale` finds for a read set ending with the IR where no specialization is
    given (a lowering's): only the kernel's own lookup can make that read."""


def wants(
    text: str,
    kernel: Any,
    given: Any,
    module_map: Any,
    backend: Any = None,
    expected: Callable[[], Sequence[Any]] | None = None,
) -> list[str] | Refusal | Unchecked | None:
    """What each read of ``text`` finds now, made again from ``kernel`` and ``given`` (its
    constexpr arguments by name); None: no read set; a :class:`Refusal`: a row the code does
    not admit (nothing runs). ``expected()``: the specializations an IR read may be for (None:
    :class:`Unchecked`). A failing read finds ``"error"``; nothing raised leaves here."""
    rows = parse(text)
    if rows is None:
        return None
    if not rows:
        return Refusal(text, "no reads (every compile reads its kernel's source file)")
    trace = Trace()
    found: list[Any] = []
    out: list[str] = []
    if expected is not None and rows and rows[-1][1] == "ir":  # (made here: the lookup's code)
        specializations = list(expected())
        expected = lambda: specializations  # noqa: E731
    ends = admit.CHECK_SECONDS
    deadline = time.monotonic() + ends
    try:
        admission = admit.Admission(kernel, given, expected)
        guard, outer = OnDemand(admit.CALL_SECONDS), getattr(STATE, "guard", None)
        STATE.guard = guard  # (this thread's guard, made if a read needs it)
        try:
            for index, (parent, op, operand, _) in enumerate(rows):
                if time.monotonic() > deadline:
                    raise CheckInterrupted(f"still checking at row {index} after {ends}s")
                base = kernel if parent < 0 else found[parent]
                value, want = _FAILED, "error"
                if base is not _FAILED:
                    admission.check(index, base, op, operand, found)
                    if op == "ir" and expected is None:
                        return Unchecked(reads_digest([text]))
                    value, want = _made(
                        trace, index, base, op, operand, found, given, module_map, backend, guard
                    )
                    if value is not _FAILED:
                        admission.found(value)
                found.append(value)
                out.append(want)
        finally:
            STATE.guard = outer
            guard.close()
    except RefusedReadSet as e:
        return Refusal(text, str(e))
    except KeyboardInterrupt:
        raise
    except (CheckInterrupted, MemoryError, RecursionError) as e:
        return Refusal(text, f"{type(e).__name__}: {e}"[:200])
    except BaseException as e:  # (nothing a hostile read set makes leaves the check)
        return Refusal(text, f"the check failed: {type(e).__name__}: {e}"[:200])
    return out


def _made(
    trace: Trace,
    index: int,
    base: Any,
    op: str,
    operand: Any,
    found: Sequence[Any],
    given: Any,
    module_map: Any,
    backend: Any,
    guard: OnDemand,
) -> tuple[Any, str]:
    """One read made again, and the digest of what it found (``"error"`` where it fails, or
    would run code it may not: :data:`~.static_reads.RUNS_CODE`)."""
    try:
        value = read(base, op, operand, found, given, module_map, backend, guard)
        if value is RUNS_CODE:
            return _FAILED, "error"
        return value, trace.want(value, index)
    except Exception:  # the user's code, run again: whatever it raises, the read differs
        return _FAILED, "error"


_FAILED: Any = object()


def check(
    text: str,
    kernel: Any,
    given: Any,
    module_map: Any,
    backend: Any = None,
    expected: Callable[[], Sequence[Any]] | None = None,
) -> str | None:
    """None where every read of the read set ``text`` finds what it found; else the digest of
    what they find now: a :class:`Refusal` where the code does not admit it, :class:`Unchecked`
    where it ends with an IR read and ``expected`` is not given (no read set: the text's)."""
    now = wants(text, kernel, given, module_map, backend, expected)
    rows = parse(text)
    if now is None or rows is None:
        return hashlib.sha256(b"unreadable\0" + text.encode()).hexdigest()
    if isinstance(now, str):
        return now
    if all(w == row[3] for w, row in zip(now, rows, strict=True)):
        return None
    return reads_digest(now)


def reads_digest(parts: Sequence[str]) -> str:
    """A 64-hex-digit digest of ``parts``, what reads found."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


# -- the read sets of a cached kernel or lowering, checked before it is used -------------------
def params(src: Any) -> dict[str, Any]:
    """The constexpr arguments of Triton's source object ``src`` given whole, by name."""
    names = src.fn.arg_names
    return {names[p[0]]: v for p, v in src.constants.items() if len(p) == 1 and p[0] < len(names)}


def stale(
    texts: Any,
    kernel: Any,
    given: Any,
    backend: Any,
    seen: dict[Any, Any] | None = None,
    expected: Callable[[], Sequence[Any]] | None = None,
) -> str | None:
    """None where every read of the read sets ``texts`` (of kernels of the JIT function
    ``kernel`` for ``backend``'s target, with the constexpr arguments ``given``) finds what it
    found; else what they find now (:func:`check`): a :class:`Refusal` or :class:`Unchecked`
    first. ``seen``: the checks made so far in one lowering of a program (nothing else runs
    between two calls' checks): one made again for the same kernel and objects is not."""
    if not texts or not all(isinstance(t, str) for t in texts):
        return Refusal("", "no read set (every compile of the bridge writes one)")
    modules = module_map_of(backend)
    now = [_check_once(text, kernel, given, modules, backend, seen, expected) for text in texts]
    for kind in (Refusal, Unchecked):
        first = next((n for n in now if isinstance(n, kind)), None)
        if first is not None:
            return first
    if all(n is None for n in now):
        return None
    return reads_digest([n or "" for n in now])


def _check_once(
    text: str,
    kernel: Any,
    given: Any,
    modules: Any,
    backend: Any,
    seen: dict[Any, Any] | None,
    expected: Callable[[], Sequence[Any]] | None,
) -> str | None:
    """:func:`check`, or its result for the same read set, kernel and objects of ``given``
    in ``seen`` (by their ids: the objects are kept alive there, so no other takes an id)."""
    rows = parse(text) if seen is not None else None
    if seen is None or rows is None:
        return check(text, kernel, given, modules, backend, expected)
    objects = (kernel, *(given.get(name, ABSENT) for name in _given_names(rows)))
    which: tuple[Any, ...] = (text, *map(id, objects))
    if expected is not None and any(op == "ir" for _, op, _, _ in rows):
        which += (tuple(sorted(admit.plain_json(e) for e in expected())),)
    found = seen.get(which)
    if found is None:
        found = seen[which] = (objects, check(text, kernel, given, modules, backend, expected))
    return found[1]


def _given_names(rows: Sequence[tuple[int, str, Any, str]]) -> list[str]:
    """The parameters whose arguments the reads ``rows`` take from ``given``: those of ``"p"``
    reads, and those an ``"ir"`` read's specialization names (:func:`~.frontend.ir_again`)."""
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


#: how many other versions of a kernel's reads one lookup follows before it compiles in memory
MAX_HOPS = 3


def chained(key: str, now: str) -> str:
    """The key under which the kernel (or lowering) of ``key`` is kept for code whose reads
    find ``now`` (:func:`stale`): each version of what the frontend reads has its own entry,
    as each set of header contents has its own result in ccache's manifest."""
    return reads_digest([key, now])


def follow(
    key: str, entry: Callable[[str], T | None], now: Callable[[str, Any], str | None]
) -> tuple[str | None, T | None]:
    """The one walk of a lookup (a kernel's, a stored lowering's, an audit's): the entry under
    ``key`` whose reads find what they found (``now(key, found)`` is None), else the one under
    the key :func:`chained` from what they find now, for at most :data:`MAX_HOPS` more keys;
    with the key it is (or is to be) stored under: ``(key, None)`` where nothing is stored
    there yet, ``(None, None)`` past the last hop (kept in memory only)."""
    for _ in range(MAX_HOPS + 1):
        found = entry(key)
        if found is None:
            return key, None
        differs = now(key, found)
        if differs is None:
            return key, found
        key = chained(key, differs)
    return None, None
