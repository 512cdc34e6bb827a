"""A read set: what Triton's frontend read while it generated one kernel, as plain data that any
process can ask again (:func:`check`).

A read set is a list of rows ``[parent, op, operand, want]``, in the order the frontend made the
reads. ``parent`` is the row whose object the read was made on (``-1``: the kernel itself);
``op`` is one of

- ``"g"``: the global (or closure variable) ``operand`` of a JIT function, as Triton's code
  generator resolves it (its backend's module map applied), or of a ``constexpr_function`` or
  Python function whose call the witness could not make again (what its code can read);
- ``"a"``: the attribute ``operand`` of an object (a module followed through the module map, a
  ``constexpr`` unwrapped, as the code generator does);
- ``"i"``: the item of an object at the key ``operand`` (an argument, below);
- ``"c"``: a call of the object with ``operand = [args, kwargs]`` (a ``constexpr_function``, a
  function or class of the program's own), its result unwrapped from ``constexpr``;
- ``"b"``: a call of a Python built-in the code generator offers (``len``, ``isinstance``,
  ``getattr``, ...) named ``operand[0]``, with the arguments ``operand[1]``, made again without
  running code of the program (:func:`~.static_access.builtin`);

- ``"f"``: the source file of a JIT function as the binary's debug information names it
  (:func:`source_file`: relative to the import root, which the import path decides);
- ``"d"``: the defaults and keyword defaults of a function (what a call that cannot be made
  again takes where an argument is left out: :func:`~.reach.reachable`);
- ``"e"``: the environment variable ``operand``, read while the kernel compiled (those every
  key holds already, and those that only select devices or say where files go,
  :mod:`.compiler_identity`, are not kept), found as a keyed digest of its value
  (:func:`~.keyed_environment.environment_want`: nobody without the key can test a
  guess of it);
- ``"p"``: the constexpr argument ``operand`` of the kernel (by parameter name; plain values
  are in the kernel's key, so only objects are read this way);
- ``"ir"``: the digest of the IR the frontend gives in the specialization ``operand``
  (:func:`~.frontend.specialization`), where the read set is partial (it runs again);

and ``want`` is a digest of what the read found (:meth:`~.read_trace.Trace.want`). An argument is
``["v", value]`` (a plain value, :func:`exact`, made again by :func:`remake`), ``["r", row]``
(the object a row found) or ``["rk", row]`` (that object in a ``constexpr``).

What a read found is described by content, never by name or address: plain values exactly
(floats by their bits, so a NaN's sign counts; tuples item by item), a JIT function by its
source, settings and first line, Triton's own objects by where Triton defines them (only where
that very object is there, defined in Triton's files), a function by its code, any other object
by :func:`bridge.identity.jit.constant` where it has an exact description, and an object met
before by the row that first found it (so two names for one object, and one name for two,
tell apart). Invariant: :func:`check` gives the digests a frontend run now would record for the
same reads, so a kernel whose reads all find what they found is the kernel its frontend would
generate now (given the same source, arguments, options and compiler, which its key holds).

A call the witness cannot make again (a ``constexpr_function`` given a tensor) is recorded as
what its code can read (:mod:`.reach`: the globals, closure variables, defaults and module
attributes its code names, through the functions and classes found) and, as code may reach
values by no name (an import when it runs, a file), the read set is partial: it ends with the
``"ir"`` read, so the frontend vouches for what the witness cannot.

A read set comes from a shared root, a remote tier or a bundle: it is hostile input. Its rows
are checked against the kernel's code before any runs (:mod:`.admit`), reads run no code of
the objects they read, calls run only where the code allows them and under a deadline
(:mod:`.guard`), and nothing a check raises leaves it: a read set the code does not admit is
:class:`Refusal`.

A cached kernel or lowering is used only while :func:`stale` finds every read of its read sets
as it was; where one finds something else, the kernel of this version of the code is kept under
a key chained from the first (:func:`chained`), for at most :data:`MAX_HOPS` versions. Reads
are recorded at each compile by :mod:`.witness`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import types
from collections.abc import Callable, Sequence
from typing import Any

from ..entries import read_set_form
from ..exceptions import CheckInterrupted, RefusedReadSet
from . import admit, namespaces, static_access, static_reads
from .exact_values import ABSENT, language, remake, unwrap
from .guard import CHECK, Guard
from .keyed_environment import environment_want
from .namespaces import RUNS_CODE, python_function
from .read_trace import Trace
from .static_access import builtin

FORMAT = read_set_form.FORMAT


def _function(fn: Any, lacks: str) -> types.FunctionType:
    """:func:`python_function` of ``fn``, which a read needs.

    Raises:
        TypeError: ``fn`` has none (it has no ``lacks``).
    """
    inner = python_function(fn)
    if inner is None:
        raise TypeError(f"{type(fn).__name__} has no {lacks}")
    return inner


def scope_value(fn: Any, name: str, module_map: dict[str, Any]) -> Any:
    """The global or closure variable ``name`` of the JIT function ``fn`` (or a function, see
    :func:`python_function`), as Triton's code generator sees it (the module map applied)."""
    inner = _function(fn, "globals")
    code = inner.__code__
    closure = inner.__closure__
    if closure and name in code.co_freevars:
        try:
            value = closure[code.co_freevars.index(name)].cell_contents
        except ValueError:
            return ABSENT
    else:
        value = inner.__globals__.get(name, ABSENT)
    return mapped(value, module_map)


def mapped(value: Any, module_map: dict[str, Any]) -> Any:
    """A global as the code generator keeps it: a module or one of its objects replaced by the
    backend's (found without running code of ``value``)."""
    if type(value) is types.ModuleType:
        return module_map.get(value.__name__, value)
    if not module_map:
        return value
    module = _static(value, "__module__")
    if type(module) is str and module in module_map:
        name = _static(value, "__name__")
        if type(name) is str:
            return getattr(module_map[module], name)
    return value


def _static(value: Any, name: str) -> Any:
    """:func:`~.namespaces.attribute`, None where there is none (or only code would give it)."""
    try:
        found = namespaces.attribute(value, name)
    except AttributeError:
        return None
    return None if found is RUNS_CODE else found


def follow(value: Any, module_map: dict[str, Any]) -> Any:
    """A module followed through the module map, as the code generator does before it reads
    an attribute; anything else as it is."""
    if type(value) is types.ModuleType:
        while (known := value.__name__) in module_map:
            value = module_map[known]
            if value.__name__ == known:
                break
    return value


def attribute(value: Any, name: str, module_map: dict[str, Any]) -> Any:
    """``getattr(value, name)`` as the code generator reads an attribute, where that runs no
    code of ``value`` (:func:`~.namespaces.attribute`): :data:`~.namespaces.RUNS_CODE` where only code
    would give it.

    Raises:
        AttributeError: ``value`` has no such attribute.
    """
    value = follow(value, module_map)
    if issubclass(type(value), language().constexpr) and name not in ("value", "type"):
        value = namespaces.attribute(value, "value")
    return namespaces.attribute(value, name)


def _argument(arg: Any, found: Sequence[Any]) -> Any:
    tag, body = arg
    if tag == "r":
        return found[int(body)]
    if tag == "rk":
        return language().constexpr(found[int(body)])
    return remake(body)


def _call(fn: Any, operand: Any, found: Sequence[Any], guard: Guard | None) -> Any:
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
    guard: Guard | None = None,
) -> Any:
    """Make one read again: what row ``[parent, op, operand, _]`` finds on ``base``
    (``given``: the kernel's constexpr arguments by parameter name; ``modules``: the backend's
    module map; ``backend``: the kernel's, for an ``"ir"`` read; ``guard``: the check's, for a
    call). :data:`~.namespaces.RUNS_CODE` where the read would run code it may not."""
    if op == "ir":  # (the frontend generating the kernel, for a specialization admitted)
        from .frontend import ir_again

        if guard is None:
            return ir_again(base, operand, given, backend)
        with guard.ours():
            return ir_again(base, operand, given, backend)
    if op == "p":
        return given.get(str(operand), ABSENT)
    if op == "e":
        return environment_want(str(operand), os.environ.get(str(operand)))
    if op == "g":
        return scope_value(base, str(operand), modules)
    if op == "a":
        return attribute(base, str(operand), modules)
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


def defaults(fn: Any) -> list[Any]:
    """The defaults and keyword defaults of the function ``fn`` (:func:`python_function`)."""
    inner = _function(fn, "defaults")
    return [inner.__defaults__, inner.__kwdefaults__]


def source_file(fn: Any) -> str:
    """The file of the JIT function ``fn`` as the compile writes it into the binary's debug
    information: relative to the longest import root that holds it
    (:func:`~.static_reads.relative_path`)."""
    inner = _function(fn, "source file")
    return static_reads.relative_path(inner.__code__.co_filename)


@functools.lru_cache(maxsize=512)
def parse(text: str) -> tuple[tuple[int, str, Any, str], ...] | None:
    """The rows of a read set's text: None for anything :func:`~bridge.entries.read_set_form.problem` refuses."""
    if read_set_form.problem(text) is not None:
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
    """What :func:`check` and :func:`stale` find for a read set the kernel's code does not
    admit (:mod:`.admit`): a digest like any other (of the text: a key chained from it is the
    text's), with the ``reason``. Nothing of such a read set runs."""

    reason: str

    def __new__(cls, text: str, reason: str) -> Refusal:
        made = super().__new__(cls, hashlib.sha256(b"refused\0" + text.encode()).hexdigest())
        made.reason = reason
        return made


class Unchecked(str):
    """What :func:`stale` finds for a read set that ends with the IR where no specialization
    is given (a lowering's): only the kernel's own lookup can make that read."""


def wants(
    text: str,
    kernel: Any,
    given: Any,
    module_map: Any,
    backend: Any = None,
    expected: Callable[[], Sequence[Any]] | None = None,
) -> list[str] | Refusal | Unchecked | None:
    """What each read of the read set ``text`` finds now, made again from ``kernel`` (the JIT
    function the reads start from) and ``given`` (its constexpr arguments by parameter name);
    None where ``text`` is not a read set, a :class:`Refusal` where the code does not admit a
    row (nothing of it runs). ``expected()``: the specializations an IR read may be for (None:
    an IR read finds :class:`Unchecked`). A read that fails (or whose object failed) finds
    ``"error"``; nothing the reads raise leaves here."""
    rows = parse(text)
    if rows is None:
        return None
    trace = Trace()
    found: list[Any] = []
    out: list[str] = []
    if expected is not None and rows and rows[-1][1] == "ir":  # (made here: the lookup's code)
        specializations = list(expected())
        expected = lambda: specializations  # noqa: E731
    try:
        admission = admit.Admission(kernel, given, expected)
        with Guard(CHECK, seconds=admit.CALL_SECONDS).armed() as guard:
            for index, (parent, op, operand, _) in enumerate(rows):
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
    guard: Guard,
) -> tuple[Any, str]:
    """One read made again, and the digest of what it found (``"error"`` where it fails, or
    would run code it may not: :data:`~.namespaces.RUNS_CODE`)."""
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
    """None where every read of the read set ``text`` finds what it found; else the digest
    of what they find now (what tells this process's code from the one the reads were made
    in): a :class:`Refusal` where the code does not admit it, :class:`Unchecked` where it ends
    with an IR read and ``expected`` is not given. A text that is no read set holds nothing:
    its digest is that of the text."""
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
    """A 64-hex-digit digest of ``parts``, what reads found (not a key: keys are
    :func:`kernelcache.keys.digest_of`'s)."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


# -- the read sets of a cached kernel or lowering, checked before it is used -------------------
def params(src: Any) -> dict[str, Any]:
    """The constexpr arguments of Triton's source object ``src``, by parameter name (those
    given whole: an item of a tuple argument is the tuple's)."""
    names = src.fn.arg_names
    return {names[p[0]]: v for p, v in src.constants.items() if len(p) == 1 and p[0] < len(names)}


_maps: dict[type, dict[str, Any]] = {}


def module_map_of(backend: Any) -> dict[str, Any]:
    """The module map of ``backend`` (what its code generator replaces Triton's modules by),
    asked once per backend class."""
    found = _maps.get(type(backend))
    if found is None:
        found = _maps[type(backend)] = dict(backend.get_module_map())
    return found


def stale(
    texts: Any,
    kernel: Any,
    given: Any,
    backend: Any,
    seen: dict[Any, Any] | None = None,
    expected: Callable[[], Sequence[Any]] | None = None,
) -> str | None:
    """None where every read of the read sets ``texts`` (those of kernels of the JIT function
    ``kernel`` compiled for ``backend``'s target, with the constexpr arguments ``given`` by
    parameter name) finds what it found; else the digest of what they find now (see
    :func:`check`): the first :class:`Refusal` where the code does not admit one, else the
    first :class:`Unchecked` where one ends with the IR and ``expected`` (the specializations
    the lookup is for) is not given.

    ``seen``: the checks made so far in one lowering of a program, where nothing but the
    lowering runs between two calls' checks (as the settings are read once per lowering): a
    read set checked again there for the same kernel and the same objects of ``given`` that it
    reads is not made again."""
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


#: how many other versions of a kernel's reads one lookup follows (each a :func:`chained` key)
#: before it compiles in memory
MAX_HOPS = 3


def chained(key: str, now: str) -> str:
    """The key under which the kernel (or lowering) of ``key`` is kept for code whose reads
    find ``now`` (:func:`stale`): each version of what the frontend reads has its own entry,
    as each set of header contents has its own result in ccache's manifest."""
    return reads_digest([key, now])
