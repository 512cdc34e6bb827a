"""The fields of a metadata document and their checks.

Known fields have a type and a range (:data:`FIELDS`: kernelcache's own, plus those a package
built on it declares with :func:`register_fields`); any other field is allowed if it is plain,
bounded JSON (finite numbers, 64-bit integers, valid UTF-8 strings, nesting at most
:data:`~kernelcache.schema.format.MAX_DEPTH` deep). Declared fields may be registered as
*covered*: the entry digest of every document written afterwards covers them. Every check
returns a reason instead of raising.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import DeclarationError
from ..keys import KEY_PATTERN
from .format import (
    COVERS_FIELD,
    MAX_COVERED,
    MAX_DEPTH,
    MAX_FIELD_NAME,
    MAX_INT,
    RESERVED_FIELDS,
    _show,
)

# -- field checks: each returns None, or what is wrong ------------------------------------------
Check = Callable[[Any], "str | None"]


def integer(low: int, high: int) -> Check:
    """An integer from ``low`` to ``high``."""

    def check(value: Any) -> str | None:
        if type(value) is not int:
            return f"must be an integer, not {_show(value)}"
        if not low <= value <= high:
            return f"must be between {low} and {high}, not {_show(value)}"
        return None

    check.bounds = (low, high)  # type: ignore[attr-defined]  # the fast path of check_fields
    return check


def text(limit: int) -> Check:
    """Printable text of 1 to ``limit`` characters."""

    def check(value: Any) -> str | None:
        if not isinstance(value, str):
            return f"must be a string, not {_show(value)}"
        if not 0 < len(value) <= limit:
            return f"must be 1 to {limit} characters"
        if not value.isprintable():  # control characters, lone surrogates
            return f"must be printable text, not {_show(value)}"
        return None

    return check


def pattern(regex: re.Pattern[str], what: str) -> Check:
    """A string that ``regex`` matches whole (``what`` says what it must be)."""

    def check(value: Any) -> str | None:
        if not isinstance(value, str) or regex.fullmatch(value) is None:
            return f"must be {what}, not {_show(value)}"
        return None

    return check


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
        or not all(_valid_name(v) and v not in RESERVED_FIELDS for v in value)
        or value != sorted(set(value))
    ):
        return f"must be a sorted list of at most {MAX_COVERED} field names, not {_show(value)}"
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
        return f"must be a Unix time, not {_show(value)}"
    if not (0 <= value <= 1e11) or (isinstance(value, float) and not math.isfinite(value)):
        return f"must be a Unix time (0 to 1e11), not {_show(value)}"
    return None


_NAME_TEXT, _VERSION_TEXT = text(MAX_FIELD_NAME), text(128)
#: ``producer`` objects found valid, as their items
_valid_producers: set[tuple[tuple[str, str], ...]] = set()


def _producer(value: Any) -> str | None:
    if not isinstance(value, dict) or len(value) > 32:
        return f"must be an object of package versions, not {_show(value)}"
    items = tuple(value.items())
    if all(type(n) is str and type(v) is str for n, v in items) and items in _valid_producers:
        return None
    for name, version in items:
        bad = _NAME_TEXT(name) or _VERSION_TEXT(version)
        if bad:
            return f"must map package names to version strings ({_show(name)}: {bad})"
    if len(_valid_producers) < 64:
        _valid_producers.add(items)
    return None


def objects(limit: int) -> Check:
    """A list of at most ``limit`` JSON objects of plain, bounded JSON."""

    def check(value: Any) -> str | None:
        if not isinstance(value, list) or len(value) > limit:
            return f"must be a list of at most {limit} objects, not {_show(value)}"
        for item in value:
            if not isinstance(item, dict):
                return f"must be a list of objects, not of {_show(item)}"
        return _plain(value)

    return check


def power_of_two(high: int) -> Check:
    """A power of two from 1 to ``high``."""
    bounded = integer(1, high)

    def check(value: Any) -> str | None:
        bad = bounded(value)
        if bad is None and value & (value - 1):
            return f"must be a power of two, not {value}"
        return bad

    return check


#: the fields a document may hold and what each must be: kernelcache's own (below), and those
#: registered by packages built on it (:func:`register_fields`)
FIELDS: dict[str, Check] = {
    "created": _time,
    "producer": _producer,
    "name": KERNEL_NAME,
    "target": TARGET_NAME,
    "kind": text(64),
    "of": pattern(KEY_PATTERN, "a cache key"),
    COVERS_FIELD: _covers,
}
#: the fields kernelcache itself gives a meaning
OWN_FIELDS = frozenset(FIELDS)
#: integer fields and their ranges, checked inline by check_fields (the common case)
_INT_RANGES: dict[str, tuple[int, int]] = {}
#: the caller fields the entry digest of a new document covers: kernelcache's own (an entry's
#: name and target, which operators select by) and those registered as covered
_covered: set[str] = {"name", "target"}


def register_fields(checks: Mapping[str, Check], *, covered: frozenset[str] = frozenset()) -> None:
    """Declare the metadata fields of a package built on kernelcache: what each must be, and
    which of them the entry digest of every new document covers (those a reader acts on).

    A check for a field that already has one is added to it: a value must pass both.
    Declaring the same check again is a no-op.

    Raises:
        ValueError: a reserved field, a name that is not a field name, or too many covered
            fields.
    """
    for name, check in checks.items():
        if not name or name in RESERVED_FIELDS or name == COVERS_FIELD or not _valid_name(name):
            raise DeclarationError(f"{name!r} cannot be declared as a metadata field")
        known = FIELDS.get(name)
        if known is None:
            FIELDS[name] = check
        elif check is not known and check not in getattr(known, "parts", ()):
            FIELDS[name] = _both(known, check)
        bounds = getattr(check, "bounds", None)
        if known is None and bounds is not None:
            _INT_RANGES[name] = bounds
    unknown = set(covered) - FIELDS.keys()
    if unknown or len(_covered | set(covered)) > MAX_COVERED:
        raise DeclarationError(f"covered fields must be declared fields (at most {MAX_COVERED})")
    _covered.update(covered)


def _valid_name(name: object) -> bool:
    return isinstance(name, str) and len(name) <= MAX_FIELD_NAME and utf8(name)


def _both(first: Check, second: Check) -> Check:
    def check(value: Any) -> str | None:
        return first(value) or second(value)

    check.parts = (first, second)  # type: ignore[attr-defined]
    return check


def covered_fields() -> frozenset[str]:
    """The caller fields the entry digest of a document written now covers."""
    return frozenset(_covered)


def _plain(value: Any, depth: int = 0) -> str | None:
    """None if ``value`` is plain, bounded JSON; else what is wrong with it."""
    kind = type(value)
    if kind is str:
        return None if value.isascii() or utf8(value) else "holds a string that is not valid UTF-8"
    if kind is int:
        return None if -MAX_INT <= value <= MAX_INT else "holds an integer beyond 64 bits"
    if value is None or kind is bool:
        return None
    if kind is float:
        return None if math.isfinite(value) else f"holds {_show(value)}"
    if depth >= MAX_DEPTH and isinstance(value, (dict, list, tuple)):
        return f"nests deeper than {MAX_DEPTH} levels"
    if isinstance(value, dict):
        for name, item in value.items():
            if type(name) is not str or not (name.isascii() or utf8(name)):
                return "holds a name that is not valid UTF-8"
            if type(item) is not str or not item.isascii():
                bad = _plain(item, depth + 1)
                if bad:
                    return bad
        return None
    if isinstance(value, (list, tuple)):  # a tuple is written as a list
        for item in value:
            if type(item) is not str or not item.isascii():
                bad = _plain(item, depth + 1)
                if bad:
                    return bad
        return None
    if isinstance(value, (str, int, float)):  # subclasses (bool was handled above)
        return _plain(kind.__mro__[-2](value), depth)
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


def check_fields(doc: Mapping[str, Any]) -> str | None:
    """What is wrong with the fields of ``doc`` other than the store's own; None if nothing."""
    ranges = _INT_RANGES
    for name, value in doc.items():
        bounds = ranges.get(name)
        if bounds is not None and type(value) is int and bounds[0] <= value <= bounds[1]:
            continue
        check = FIELDS.get(name)
        if check is not None:
            bad = check(value)
            if bad:
                return f"metadata field {name!r} {bad}"
        elif name not in RESERVED_FIELDS:
            if not _valid_name(name):
                return f"metadata field {_show(name)} has an invalid name"
            bad = _plain(value)
            if bad:
                return f"metadata field {name!r} {bad}"
    return None
