"""The fields of a metadata document, one by one: the bounds every field keeps, the checks a
value is held to, the fields kernelcache gives a meaning (the launch metadata of machine code
among them) and those packages built on it declare with :func:`register_fields`.

Known fields have a type and a range (:data:`FIELDS`); any other field is allowed if it is
plain, bounded JSON (finite numbers, 64-bit integers, valid UTF-8 strings, nesting at most
:data:`MAX_DEPTH` deep). Declared fields may be registered as *covered*: the entry digest of
every document written afterwards covers them (kernelcache's ``name``, ``target`` and launch
fields always are).

The launch metadata of machine code (:data:`LAUNCH_CHECKS`) is kernelcache's own, not the
package's that writes it, so that a process that never imported that package (an operator's
box, a plain ``import kernelcache``) checks it the same way: ``put`` refuses ``num_warps=-1``
whoever calls it. Some launch fields are required (:data:`REQUIRED`): an entry of machine code
holds its name, target, warps, CTAs and shared memory; a PTX entry the name of the kernel it
defines. A document of such an extension without one of them (or holding it outside its
digest) is refused by ``put`` and corrupt wherever it is read: a reader never launches with a
default it made up for a field the writer left out. Optional fields mean their default when
absent.

Invariants: a check returns None, or what is wrong with the value (a phrase that follows the
field's name in a message); it never raises, whatever the value, and neither does
:func:`launch_problem`. Each check a constructor makes carries its ``spec`` (the constructor and
its arguments), so that two declarations of the same check are recognized as one
(:func:`same_check`); an integer check also carries its ``bounds``, for the fast path of
:func:`check_fields`. Changing a bound changes what is on disk: documents outside it are corrupt
to this reader.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import DeclarationError
from ..keys import KEY_PATTERN

#: bounds of plain JSON in fields the schema does not know
MAX_DEPTH = 16
MAX_INT = (1 << 63) - 1
MAX_FIELD_NAME = 64
#: the store's own fields that the entry digest (and a signature) covers
STORE_COVERED = ("format", "key", "ext", "size", "digest")
#: the list of caller fields a document's entry digest covers
COVERS_FIELD = "covers"
#: the HMAC of a Redis value or a bundle entry; never stored in a root
HMAC_FIELD = "hmac"
#: fields only the store writes; callers' metadata may not set them
RESERVED_FIELDS = frozenset({"format", "key", "ext", "size", "digest", "entry_digest", HMAC_FIELD})
#: the most caller fields one document's entry digest covers
MAX_COVERED = 64


def shown_value(value: object) -> str:
    """A short, printable rendering of a hostile value for a message."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**20 else "a huge integer"
    return text if len(text) <= 40 else text[:37] + "..."


# -- checks of a value ----------------------------------------------------------------------
FieldCheck = Callable[[Any], "str | None"]


def _made(check: FieldCheck, *spec: object) -> FieldCheck:
    check.spec = spec  # type: ignore[attr-defined]  # see same_check
    return check


def same_check(first: FieldCheck, second: FieldCheck) -> bool:
    """Whether two checks are the same: the same object, or made by the same constructor with
    the same arguments (``integer(1, 8)`` twice)."""
    spec = getattr(first, "spec", None)
    return first is second or (spec is not None and spec == getattr(second, "spec", None))


def integer(low: int, high: int) -> FieldCheck:
    """An integer from ``low`` to ``high``."""

    def check(value: Any) -> str | None:
        if type(value) is not int:
            return f"must be an integer, not {shown_value(value)}"
        if not low <= value <= high:
            return f"must be between {low} and {high}, not {shown_value(value)}"
        return None

    check.bounds = (low, high)  # type: ignore[attr-defined]  # the fast path of check_fields
    return _made(check, "integer", low, high)


def text(limit: int) -> FieldCheck:
    """Printable text of 1 to ``limit`` characters."""

    def check(value: Any) -> str | None:
        if not isinstance(value, str):
            return f"must be a string, not {shown_value(value)}"
        if not 0 < len(value) <= limit:
            return f"must be 1 to {limit} characters"
        if not value.isprintable():  # control characters, lone surrogates
            return f"must be printable text, not {shown_value(value)}"
        return None

    return _made(check, "text", limit)


def pattern(regex: re.Pattern[str], what: str) -> FieldCheck:
    """A string that ``regex`` matches whole (``what`` says what it must be)."""

    def check(value: Any) -> str | None:
        if not isinstance(value, str) or regex.fullmatch(value) is None:
            return f"must be {what}, not {shown_value(value)}"
        return None

    return _made(check, "pattern", regex.pattern, regex.flags, what)


def objects(limit: int) -> FieldCheck:
    """A list of at most ``limit`` JSON objects of plain, bounded JSON."""

    def check(value: Any) -> str | None:
        if not isinstance(value, list) or len(value) > limit:
            return f"must be a list of at most {limit} objects, not {shown_value(value)}"
        for item in value:
            if not isinstance(item, dict):
                return f"must be a list of objects, not of {shown_value(item)}"
        return plain(value)

    return _made(check, "objects", limit)


def power_of_two(high: int) -> FieldCheck:
    """A power of two from 1 to ``high``."""
    bounded = integer(1, high)

    def check(value: Any) -> str | None:
        bad = bounded(value)
        if bad is None and value & (value - 1):
            return f"must be a power of two, not {value}"
        return bad

    return _made(check, "power_of_two", high)


def valid_name(name: object) -> bool:
    """Whether ``name`` can name a field: a string of at most ``MAX_FIELD_NAME`` characters
    that encodes as UTF-8."""
    return isinstance(name, str) and len(name) <= MAX_FIELD_NAME and utf8(name)


def plain(value: Any, depth: int = 0) -> str | None:
    """None if ``value`` is plain, bounded JSON; else what is wrong with it."""
    kind = type(value)
    if kind is str:
        return None if value.isascii() or utf8(value) else "holds a string that is not valid UTF-8"
    if kind is int:
        return None if -MAX_INT <= value <= MAX_INT else "holds an integer beyond 64 bits"
    if value is None or kind is bool:
        return None
    if kind is float:
        return None if math.isfinite(value) else f"holds {shown_value(value)}"
    if depth >= MAX_DEPTH and isinstance(value, (dict, list, tuple)):
        return f"nests deeper than {MAX_DEPTH} levels"
    if isinstance(value, dict):
        for name, item in value.items():
            if type(name) is not str or not (name.isascii() or utf8(name)):
                return "holds a name that is not valid UTF-8"
            if type(item) is not str or not item.isascii():
                bad = plain(item, depth + 1)
                if bad:
                    return bad
        return None
    if isinstance(value, (list, tuple)):  # a tuple is written as a list
        for item in value:
            if type(item) is not str or not item.isascii():
                bad = plain(item, depth + 1)
                if bad:
                    return bad
        return None
    if isinstance(value, (str, int, float)):  # subclasses (bool was handled above)
        return plain(kind.__mro__[-2](value), depth)
    return f"holds a {kind.__name__}, which is not JSON"


def utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (no lone surrogates)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# -- the launch metadata of machine code ---------------------------------------------------
_U32 = (1 << 32) - 1
_SHA256 = re.compile(r"[0-9a-f]{64}")

#: what machine code is launched or embedded with, and what each must be (besides ``name`` and
#: ``target``, kernelcache's own fields)
LAUNCH_CHECKS: Mapping[str, FieldCheck] = {
    "arch": text(64),
    "warp_size": integer(1, 1024),
    "num_warps": integer(1, 1024),
    "num_ctas": integer(1, 1024),
    "shared": integer(0, _U32),
    "global_scratch_size": integer(0, _U32),
    "global_scratch_align": power_of_two(1 << 20),
    "profile_scratch_size": integer(0, _U32),
    "tmem_size": integer(0, _U32),
    "tensordesc_meta": objects(64),
    "ptx_sha256": pattern(_SHA256, "64 lowercase hexadecimal digits"),
}
#: the launch fields, all covered by the entry digest of every document written
LAUNCH_FIELDS = frozenset(LAUNCH_CHECKS)
#: the fields an entry of each extension must hold (covered by its digest)
_MACHINE_CODE = frozenset({"name", "target", "num_warps", "num_ctas", "shared"})
REQUIRED: Mapping[str, frozenset[str]] = {
    "cubin": _MACHINE_CODE,
    "hsaco": _MACHINE_CODE,
    "ptx": frozenset({"name"}),
}


def launch_problem(ext: str, doc: Mapping[str, Any]) -> str | None:
    """Why the document ``doc`` of an entry of extension ``ext`` lacks launch metadata it must
    hold (:data:`REQUIRED`), or holds it outside its digest; None when it has it all (and
    for extensions that require none). The fields' values are checked with the document's
    other fields (:func:`kernelcache.schema.fields.check_fields`). Never raises."""
    required = REQUIRED.get(ext)
    if required is None:
        return None
    covers = doc.get(COVERS_FIELD)
    if required <= doc.keys() and isinstance(covers, list) and required.issubset(covers):
        return None  # (every entry written whole: one pass)
    missing = sorted(name for name in required if name not in doc)
    if missing:
        return (
            f"incomplete launch metadata: a .{ext} entry holds {_listed(sorted(required))}, "
            f"and this one has no {_listed(missing)}"
        )
    uncovered = sorted(
        name for name in required if not isinstance(covers, list) or name not in covers
    )
    return (
        f"incomplete launch metadata: its digest does not cover {_listed(uncovered)}, "
        f"which a .{ext} entry is launched with"
    )


def _listed(names: list[str]) -> str:
    return ", ".join(repr(name) for name in names)


# -- the fields ----------------------------------------------------------------------------
#: ``covers`` lists found valid (most documents of a root name the same fields)
_valid_covers: set[tuple[str, ...]] = set()


def _covers(value: Any) -> str | None:
    known = tuple(value) if type(value) is list else None
    try:
        if known in _valid_covers:  # equal to a list of names found valid: one
            return None
    except TypeError:  # holds an unhashable value: checked below, and refused
        known = None
    if (
        not isinstance(value, list)
        or len(value) > MAX_COVERED
        or not all(valid_name(v) and v not in RESERVED_FIELDS for v in value)
        or value != sorted(set(value))
    ):
        return (
            f"must be a sorted list of at most {MAX_COVERED} field names, not {shown_value(value)}"
        )
    if known is not None and len(_valid_covers) < 64:
        _valid_covers.add(known)  # (every item is a valid name: a str)
    return None


#: what a target name looks like to kernelcache, which gives targets no meaning (a package
#: built on it may register a stricter check): at most 64 letters, digits and ``_.+-``, in
#: parts separated by single colons (``cuda:90``, ``hip:gfx90a:xnack-``; not ``cuda:``)
_TARGET = re.compile(r"(?=.{1,64}\Z)[A-Za-z0-9][A-Za-z0-9_.+-]*(?::[A-Za-z0-9_.+-]+)*", re.DOTALL)
#: kernelcache's own rules for the two fields operators select entries by (``--target``,
#: ``--kernel``), whatever stricter checks packages register
TARGET_NAME = pattern(_TARGET, "a target name such as cuda:90")
KERNEL_NAME = text(1024)


def _time(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a Unix time, not {shown_value(value)}"
    if not (0 <= value <= 1e11) or (isinstance(value, float) and not math.isfinite(value)):
        return f"must be a Unix time (0 to 1e11), not {shown_value(value)}"
    return None


_NAME_TEXT, _VERSION_TEXT = text(MAX_FIELD_NAME), text(128)
#: ``producer`` objects found valid, as their items
_valid_producers: set[tuple[tuple[str, str], ...]] = set()


def _producer(value: Any) -> str | None:
    if not isinstance(value, dict) or len(value) > 32:
        return f"must be an object of package versions, not {shown_value(value)}"
    items = tuple(value.items())
    if all(type(n) is str and type(v) is str for n, v in items) and items in _valid_producers:
        return None
    for name, version in items:
        bad = _NAME_TEXT(name) or _VERSION_TEXT(version)
        if bad:
            return f"must map package names to version strings ({shown_value(name)}: {bad})"
    if len(_valid_producers) < 64:
        _valid_producers.add(items)
    return None


#: the fields a document may hold and what each must be: kernelcache's own (below, and the launch
#: metadata of machine code, above), and those registered by packages built on it
#: (:func:`register_fields`)
FIELDS: dict[str, FieldCheck] = {
    "created": _time,
    "producer": _producer,
    "name": KERNEL_NAME,
    "target": TARGET_NAME,
    "kind": text(64),
    "of": pattern(KEY_PATTERN, "a cache key"),
    COVERS_FIELD: _covers,
    **LAUNCH_CHECKS,
}
#: the fields kernelcache itself gives a meaning
OWN_FIELDS = frozenset(FIELDS)
#: integer fields and their ranges, checked inline by check_fields (the common case): the range
#: of every integer field whose checks are all ranges (a refined one: their intersection)
_INT_RANGES: dict[str, tuple[int, int]] = {
    name: check.bounds  # type: ignore[attr-defined]
    for name, check in FIELDS.items()
    if getattr(check, "bounds", None) is not None
}
#: the caller fields the entry digest of a new document covers: kernelcache's own (an entry's
#: name and target, which operators select by, and the launch metadata of machine code) and
#: those registered as covered
COVERED: set[str] = {"name", "target", *LAUNCH_FIELDS}


def register_fields(
    checks: Mapping[str, FieldCheck], *, covered: frozenset[str] = frozenset()
) -> None:
    """Declare the metadata fields of a package built on kernelcache: what each must be, and
    which of them the entry digest of every new document covers (those a reader acts on).

    A check for a field that already has one is added to it: a value must pass both.
    Declaring the same check again (the same object, or one made by the same constructor with
    the same arguments, such as kernelcache's own ``num_warps``) is a no-op, and so is
    declaring a field covered that already is.

    Raises:
        ValueError: a reserved field, a name that is not a field name, or too many covered
            fields.
    """
    for name in checks:
        if not name or name in RESERVED_FIELDS or name == COVERS_FIELD or not valid_name(name):
            raise DeclarationError(f"{name!r} cannot be declared as a metadata field")
    for name, check in checks.items():
        known = FIELDS.get(name)
        if known is None:
            FIELDS[name] = check
            bounds = getattr(check, "bounds", None)
            if bounds is not None:
                _INT_RANGES[name] = bounds
        elif not any(same_check(part, check) for part in getattr(known, "parts", (known,))):
            FIELDS[name] = _both(known, check)
            _refine_range(name, check)
    unknown = set(covered) - FIELDS.keys()
    if unknown or len(COVERED | set(covered)) > MAX_COVERED:
        raise DeclarationError(f"covered fields must be declared fields (at most {MAX_COVERED})")
    COVERED.update(covered)


def _refine_range(name: str, check: FieldCheck) -> None:
    """Keep the fast path of ``name`` exact once ``check`` is added to its checks: the
    intersection of both ranges, or none where ``check`` is not a range."""
    known = _INT_RANGES.get(name)
    bounds = getattr(check, "bounds", None)
    if known is None:
        return
    if bounds is None or getattr(check, "spec", ("",))[0] != "integer":
        del _INT_RANGES[name]
    else:
        _INT_RANGES[name] = (max(known[0], bounds[0]), min(known[1], bounds[1]))


def _both(first: FieldCheck, second: FieldCheck) -> FieldCheck:
    def check(value: Any) -> str | None:
        return first(value) or second(value)

    check.parts = (*getattr(first, "parts", (first,)), second)  # type: ignore[attr-defined]
    return check


def covered_fields() -> frozenset[str]:
    """The caller fields the entry digest of a document written now covers."""
    return frozenset(COVERED)


def check_fields(doc: Mapping[str, Any]) -> str | None:
    """What is wrong with the fields of ``doc`` other than the store's own; None if nothing."""
    ranges = _INT_RANGES
    for name, value in doc.items():
        bounds = ranges.get(name)
        if bounds is not None and type(value) is int and bounds[0] <= value <= bounds[1]:
            continue
        check = FIELDS.get(name)
        if check is not None:
            try:
                bad = check(value)
            except Exception as e:  # (a field's check that fails on a value refuses it)
                bad = f"cannot be checked ({type(e).__name__})"
            if bad:
                return f"metadata field {name!r} {bad}"
        elif name not in RESERVED_FIELDS:
            if not valid_name(name):
                return f"metadata field {shown_value(name)} has an invalid name"
            bad = plain(value)
            if bad:
                return f"metadata field {name!r} {bad}"
    return None
