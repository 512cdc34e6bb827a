"""What the bridge stores in an entry's metadata, declared to kernelcache's schema: each field's
type and range.

The launch metadata of a kernel (its name, target, warps, CTAs, shared memory, scratch sizes,
the TMA metadata of tensor descriptors, the PTX's digest: everything a kernel is launched or
embedded with) is part of kernelcache's on-disk format: kernelcache declares those fields
itself (:data:`kernelcache.schema.LAUNCH_CHECKS`), covers them by the entry digest
(:data:`kernelcache.schema.LAUNCH_FIELDS`) and requires those a machine-code entry cannot be launched without
(:data:`kernelcache.schema.REQUIRED`), whether or not the bridge is imported. The bridge
declares only what is its own: a stricter check of ``target`` (a target it knows), and the
fields that describe an entry without being launched with.

``components`` (the ingredients of the entry's key, see :func:`bridge.identity.kernel_keys.key_components`)
only explains misses: nothing is launched with it, so the digest does not cover it, and an entry
without it (written by an earlier version) is served all the same.

The form of a read set, the ``reads`` field of a kernel entry and of a stored lowering (what
the frontend read while it generated the kernel, :mod:`bridge.readsets.read_sets`, as rows of
``[parent, op, operand, want]``), is declared here too: a read set is data from a shared root,
a remote tier or a bundle, so its text is checked at every door before anything reads it
(:func:`problem`), without Triton: JSON of the current :data:`FORMAT` (those of
:data:`EARLIER`, earlier versions', are read sets that find nothing: a miss); at most
:data:`MAX_ROWS` rows; each row's operation one of :data:`OPS` (the one table of the reads:
each one's operand form, whether a check makes it again or takes it as decided, and its words
for a person), its parent an earlier row (or -1, the kernel), its operand of that operation's
form; names that are identifiers, never a dunder but those Python calls by itself
(:data:`IMPLICIT`); values plain (:func:`plain`) and of bounded size; the IR read, if any, last.
A check of the rows reads and compares and never calls (:mod:`bridge.readsets.read_sets`).
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kernelcache.plugin import FieldCheck, integer, register_fields, text

from ..vendors.vendor import parse_name


def _target(value: Any) -> str | None:
    try:
        parse_name(value)
    except (ValueError, AttributeError, TypeError):
        return f"must be a target name such as cuda:90 or hip:gfx942, not {value!r:.40}"
    return None


def _reads(value: Any) -> str | None:
    """A read set's text, whole (:func:`problem`: what a lookup checks
    before it makes any read, checked here at every door)."""
    bad = text(49 << 10)(value)
    if bad:
        return bad
    why = problem(value)
    return None if why is None else f"must be a read set ({why})"[:200]


def _components(value: Any) -> str | None:
    if not isinstance(value, dict) or len(value) > 32:
        return f"must be an object of at most 32 named components, not {value!r:.40}"
    for name, part in value.items():
        bad = text(64)(name) or text(128)(part)
        if bad:
            return f"must map component names to short strings ({name!r:.40}: {bad})"
    return None


#: the bridge's own fields and what each must be (``target``: added to kernelcache's check)
FIELDS: dict[str, FieldCheck] = {
    "target": _target,
    "kernel": text(1024),
    "language": text(64),
    "num_stages": integer(0, 1024),
    "components": _components,
    "reads": _reads,
}
#: what a kernel is used on (the reads of its frontend, checked before it is launched): the
#: entry digest covers it
COVERED = frozenset({"reads"})
register_fields(FIELDS, covered=COVERED)


# -- the form of a read set ---------------------------------------------------------------------
#: the form of read sets this version writes and reads
FORMAT = 3
#: earlier versions' forms, read as read sets that find nothing (a miss): format 2's checks
#: made calls again, where format 3 records what decides them
EARLIER = (1, 2)
#: the built-ins Triton's code generator offers kernel code by name (its ``builtin_namespace``)
BUILTIN_NAMES = ("len", "list", "range", "float", "int", "isinstance", "getattr", "hasattr")
#: the built-ins that read an attribute: reads a check makes as ``"a"`` makes one, not results
#: it takes as decided
LOOKUPS = ("getattr", "hasattr")
#: the methods Python calls on a class or its objects by itself: the only dunders a read names
IMPLICIT = ("__init__", "__new__", "__post_init__", "__call__")
#: the most reasons a partial read set gives, and the longest one (:func:`bounded_reasons`
#: makes any list of reasons fit: the recorder writes through it, the form check admits it)
MAX_REASONS = 12
MAX_REASON = 300
#: the most rows, and items of one value, a read set holds
MAX_ROWS = 2000
MAX_ITEMS = 64
#: the longest string or name a read set holds
MAX_TEXT = 256
#: the largest integer a read set holds (a kernel's values are 64-bit)
MAX_INT = 1 << 64

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,127}")
_HEX = re.compile(r"[0-9a-f]*")


@functools.lru_cache(maxsize=512)
def problem(text: Any) -> str | None:
    """What is wrong with ``text`` as a read set (see the module docstring), None where
    nothing is (an earlier version's read set, of :data:`EARLIER`, is read as one that finds nothing:
    never admitted). Never raises."""
    if not isinstance(text, str):
        return "must be a read set's text"
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return "is not JSON"
    if isinstance(doc, dict) and doc.get("format") in EARLIER:
        return None
    if (
        not isinstance(doc, dict)
        or doc.get("format") != FORMAT
        or set(doc)
        - {
            "format",
            "rows",
            "partial",
        }
    ):
        return f"must be an object of format {FORMAT} with rows and partial"
    partial, rows = doc.get("partial", []), doc.get("rows")
    if (
        not isinstance(partial, list)
        or len(partial) > MAX_REASONS
        or not all(_text(p, MAX_REASON) for p in partial)
    ):
        return f"partial must be a list of at most {MAX_REASONS} strings of {MAX_REASON} characters"
    if not isinstance(rows, list) or len(rows) > MAX_ROWS:
        return f"rows must be a list of at most {MAX_ROWS}"
    for index, row in enumerate(rows):
        why = row_problem(index, row, len(rows))
        if why is not None:
            return f"row {index}: {why}"
    return None


def bounded_reasons(reasons: Sequence[str]) -> list[str]:
    """``reasons`` (why a read set is partial) as a read set keeps them: each cut to
    :data:`MAX_REASON` characters, the same one once, and past :data:`MAX_REASONS` the rest
    counted in the last one. What it returns always passes :func:`problem`."""
    kept: list[str] = []
    for reason in reasons:
        cut = str(reason)[:MAX_REASON]
        if cut not in kept:
            kept.append(cut)
    if len(kept) <= MAX_REASONS:
        return kept
    rest = len(kept) - (MAX_REASONS - 1)
    return [*kept[: MAX_REASONS - 1], f"and {rest} more reasons"]


def _text(value: Any, most: int = MAX_TEXT) -> bool:
    return isinstance(value, str) and len(value) <= most


def _name(value: Any, dunders: Sequence[str] = ()) -> bool:
    """An identifier as Python reads it (ASCII or not, NFKC-normalized) that is no dunder but
    those in ``dunders``."""
    if not _text(value, 128) or not value.isidentifier():
        return False
    if not value.isascii() and unicodedata.normalize("NFKC", value) != value:
        return False
    return not (value.startswith("__") and value.endswith("__")) or value in dunders


def row_problem(index: int, row: Any, count: int) -> str | None:
    """What is wrong with ``row``, row ``index`` of ``count`` (see :func:`problem`)."""
    if not isinstance(row, list) or len(row) != 4:
        return "must be [parent, op, operand, want]"
    parent, op, operand, want = row
    if type(parent) is not int or not -1 <= parent < index:
        return "its parent must be an earlier row or -1"
    if op not in OPS:
        return f"no such read: {op!r:.20}"
    if not _text(want, 64):
        return "what it found must be a short string"
    if op == "ir" and (parent != -1 or index != count - 1):
        return "the IR read must be the last read, of the kernel"
    return OPS[op].form(operand, index)


def _call_problem(operand: Any, index: int) -> str | None:
    if not isinstance(operand, list) or len(operand) != 2:
        return "a call must be [args, kwargs]"
    args, kwargs = operand
    why = _arguments_problem(args, index, 32)
    if why is not None:
        return why
    if not isinstance(kwargs, list) or len(kwargs) > 32:
        return "keyword arguments must be a short list"
    for item in kwargs:
        if not isinstance(item, list) or len(item) != 2 or not _name(item[0]):
            return "a keyword argument must be [identifier, argument]"
        why = _argument_problem(item[1], index)
        if why is not None:
            return why
    return None


def _arguments_problem(args: Any, index: int, most: int) -> str | None:
    if not isinstance(args, list) or len(args) > most:
        return f"arguments must be a list of at most {most}"
    for arg in args:
        why = _argument_problem(arg, index)
        if why is not None:
            return why
    return None


def _argument_problem(arg: Any, index: int) -> str | None:
    if not isinstance(arg, list) or len(arg) != 2:
        return "an argument must be [kind, value]"
    tag, body = arg
    if tag in ("r", "rk"):
        ok = type(body) is int and 0 <= body < index
        return None if ok else "an argument must be found by an earlier row"
    if tag == "v":
        return None if plain(body) else "an argument's value must be plain and small"
    return f"no such argument: {tag!r:.20}"


def plain(desc: Any, depth: int = 0) -> bool:
    """Whether ``desc`` describes a plain value of bounded size
    (:func:`~bridge.identity.namespaces.exact`'s form: nothing here makes the value)."""
    if desc == "N":
        return True
    if not isinstance(desc, list) or len(desc) != 2 or depth > 4:
        return False
    tag, body = desc
    if tag == "b":
        return body in (0, 1) and type(body) is int
    if tag == "i":
        return _text(body, 21) and re.fullmatch(r"-?\d{1,20}", body) is not None
    if tag in ("f", "j"):
        return _text(body, 32) and len(body) == (16 if tag == "f" else 32) and _hexed(body)
    if tag == "s":
        return _text(body)
    if tag == "y":
        return _text(body, 2 * MAX_TEXT) and _hexed(body)
    if tag in ("t", "l"):
        ok = isinstance(body, list) and len(body) <= MAX_ITEMS
        return ok and all(plain(v, depth + 1) for v in body)
    if tag == "k":
        return plain(body, depth + 1)
    if tag == "d":
        return _text(body, 32) and _NAME.fullmatch(body) is not None
    if tag == "dp":
        return (
            isinstance(body, list)
            and len(body) == 3
            and plain(body[0], depth + 1)
            and (type(body[1]) is int or _text(body[1], 32))
            and type(body[2]) is bool
        )
    if tag == "db":
        return (
            isinstance(body, list)
            and 2 <= len(body) <= 9
            and all(plain(v, depth + 1) for v in body)
        )
    return False


def _hexed(text: str) -> bool:
    return len(text) % 2 == 0 and _HEX.fullmatch(text) is not None


def _specialization_problem(made: Any) -> str | None:
    if not isinstance(made, dict) or set(made) != {
        "gluon",
        "kind",
        "signature",
        "constants",
        "attrs",
        "options",
    }:
        return "the IR read's specialization must hold exactly its six parts"
    if type(made["gluon"]) is not bool:
        return "gluon must be true or false"
    kind = made["kind"]
    if not isinstance(kind, list) or len(kind) != 3 or not all(_text(k) for k in kind):
        return "kind must name a class of Triton's"
    for part in ("signature", "constants", "attrs", "options"):
        rows = made[part]
        if not isinstance(rows, list) or len(rows) > 256:
            return f"{part} must be a list of at most 256"
        for row in rows:
            if not isinstance(row, list) or len(row) != 2:
                return f"each of {part} must be a pair"
            name, value = row
            named = _text(name, 128) if part in ("signature", "options") else plain(name)
            param = isinstance(value, list) and value[:1] == ["param"] and len(value) == 2
            if not named or not (plain(value) or (param and _name(value[1]))):
                return f"{part} must pair names with plain values"
    return None


# -- the operations of a read set: one table ---------------------------------------------------
@dataclass(frozen=True)
class ReadOp:
    """An operation a row of a read set names: what it reads, for a person (``one``,
    ``several``; ``words(base, operand, argument)``: what one row reads, ``base`` the name of
    the object it reads on (None: the kernel), ``argument`` the words of an argument); what is
    wrong with its operand (``form(operand, row)``); and how a check treats it: made again and
    compared (:func:`bridge.readsets.read_sets.read`), or taken as found where ``decided`` (a
    call: its callee, arguments and the reads its code can make decide it, and none is made)."""

    one: str
    several: str
    form: Callable[[Any, int], str | None]
    words: Callable[[str | None, Any, Callable[[Any], str]], str]
    decided: Callable[[Any], bool] = lambda operand: False


def _identifier(dunders: Sequence[str] = ()) -> Callable[[Any, int], str | None]:
    return lambda operand, _: (
        None if _name(operand, dunders) else "must name an identifier (no dunder)"
    )


def _nothing(operand: Any, _: int) -> str | None:
    return None if operand == "" else "takes no operand"


def _variable(operand: Any, _: int) -> str | None:
    ok = _text(operand, 128) and _VARIABLE.fullmatch(operand)
    return None if ok else "must name an environment variable"


def _builtin(operand: Any, index: int) -> str | None:
    if not isinstance(operand, list) or len(operand) != 2 or operand[0] not in BUILTIN_NAMES:
        return f"must be [a built-in of {', '.join(BUILTIN_NAMES)}, arguments]"
    return _arguments_problem(operand[1], index, 3)


def _call_words(base: str | None, operand: Any, argument: Callable[[Any], str]) -> str:
    args, kwargs = operand if isinstance(operand, list) and len(operand) == 2 else ([], [])
    shown = [argument(a) for a in args] + [f"{k}={argument(a)}" for k, a in kwargs]
    return f"{base or 'the kernel'}({', '.join(shown)})"


#: the operations a row may name, by the name a row holds
OPS: dict[str, ReadOp] = {
    "f": ReadOp("source file", "source files", _nothing,
                lambda base, _, __: f"the source file of {base or 'the kernel'}"),
    "g": ReadOp("global", "globals", _identifier(),
                lambda base, name, _: str(name) if base is None else f"{name} (in {base})"),
    "a": ReadOp("attribute", "attributes", _identifier(IMPLICIT),
                lambda base, name, _: f"{base or 'the kernel'}.{name}"),
    "i": ReadOp("item", "items", _argument_problem,
                lambda base, key, argument: f"{base or 'the kernel'}[{argument(key)}]"),
    "c": ReadOp("call", "calls", _call_problem, _call_words,
                decided=lambda operand: True),
    "b": ReadOp("built-in", "built-ins", _builtin,
                lambda _, operand, argument: f"{operand[0]}({', '.join(map(argument, operand[1]))})",
                decided=lambda operand: operand[0] not in LOOKUPS),
    "d": ReadOp("defaults", "defaults", _nothing,
                lambda base, _, __: f"the defaults of {base or 'the kernel'}"),
    "p": ReadOp("constexpr argument", "constexpr arguments", _identifier(),
                lambda _, name, __: str(name)),
    "e": ReadOp("environment variable", "environment variables", _variable,
                lambda _, name, __: str(name)),
    "ir": ReadOp("IR", "IR",
                 lambda made, _: None if made is None else _specialization_problem(made),
                 lambda _, __, ___: "the IR Triton's frontend gives for this specialization"),
}  # fmt: skip


def worded(op: str, operand: Any, base: str | None, argument: Callable[[Any], str]) -> str:
    """What a row ``[_, op, operand, _]`` reads, for a person: ``base`` the name of the object
    it reads on (None: the kernel), ``argument`` the words of an argument of it."""
    return OPS[op].words(base, operand, argument)
