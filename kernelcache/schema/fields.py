"""The fields of a metadata document and their checks.

Known fields have a type and a range (:data:`FIELDS`: kernelcache's own, the launch metadata of
machine code (:mod:`.launch`), plus those a package built on it declares with
:func:`register_fields`); any other field is allowed if it is plain, bounded JSON (finite
numbers, 64-bit integers, valid UTF-8 strings, nesting at most
:data:`~kernelcache.schema.format.MAX_DEPTH` deep). Declared fields may be registered as
*covered*: the entry digest of every document written afterwards covers them (kernelcache's
``name``, ``target`` and launch fields always are). Every check returns a reason instead of
raising (the checks themselves: :mod:`.values`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from ..errors import DeclarationError
from ..keys import KEY_PATTERN
from .format import COVERS_FIELD, MAX_COVERED, MAX_FIELD_NAME, RESERVED_FIELDS, shown_value
from .launch import LAUNCH_CHECKS, LAUNCH_FIELDS
from .values import (
    Check,
    integer,
    objects,
    pattern,
    plain,
    power_of_two,
    same_check,
    text,
    utf8,
    valid_name,
)

__all__ = [
    "FIELDS",
    "KERNEL_NAME",
    "OWN_FIELDS",
    "TARGET_NAME",
    "Check",
    "check_fields",
    "covered_fields",
    "integer",
    "objects",
    "pattern",
    "power_of_two",
    "register_fields",
    "text",
    "utf8",
]

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
#: metadata of machine code: :mod:`.launch`), and those registered by packages built on it
#: (:func:`register_fields`)
FIELDS: dict[str, Check] = {
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


def register_fields(checks: Mapping[str, Check], *, covered: frozenset[str] = frozenset()) -> None:
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


def _refine_range(name: str, check: Check) -> None:
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


def _both(first: Check, second: Check) -> Check:
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
            bad = check(value)
            if bad:
                return f"metadata field {name!r} {bad}"
        elif name not in RESERVED_FIELDS:
            if not valid_name(name):
                return f"metadata field {shown_value(name)} has an invalid name"
            bad = plain(value)
            if bad:
                return f"metadata field {name!r} {bad}"
    return None
