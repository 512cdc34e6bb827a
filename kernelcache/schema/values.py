"""The checks a metadata field's value is held to: constructors of checks (an integer in a range,
printable text, a pattern, a list of objects, a power of two) and the bound on plain JSON that
every field the schema does not know must keep.

A check returns None, or what is wrong with the value (a phrase that follows the field's name
in a message); it never raises, whatever the value. Each check a constructor makes carries its
``spec`` (the constructor and its arguments), so that two declarations of the same check are
recognized as one (:func:`same_check`); an integer check also carries its ``bounds``, for the
fast path of :func:`kernelcache.schema.fields.check_fields`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from .format import MAX_DEPTH, MAX_FIELD_NAME, MAX_INT, shown_value

Check = Callable[[Any], "str | None"]


def _made(check: Check, *spec: object) -> Check:
    check.spec = spec  # type: ignore[attr-defined]  # see same_check
    return check


def same_check(first: Check, second: Check) -> bool:
    """Whether two checks are the same: the same object, or made by the same constructor with
    the same arguments (``integer(1, 8)`` twice)."""
    spec = getattr(first, "spec", None)
    return first is second or (spec is not None and spec == getattr(second, "spec", None))


def integer(low: int, high: int) -> Check:
    """An integer from ``low`` to ``high``."""

    def check(value: Any) -> str | None:
        if type(value) is not int:
            return f"must be an integer, not {shown_value(value)}"
        if not low <= value <= high:
            return f"must be between {low} and {high}, not {shown_value(value)}"
        return None

    check.bounds = (low, high)  # type: ignore[attr-defined]  # the fast path of check_fields
    return _made(check, "integer", low, high)


def text(limit: int) -> Check:
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


def pattern(regex: re.Pattern[str], what: str) -> Check:
    """A string that ``regex`` matches whole (``what`` says what it must be)."""

    def check(value: Any) -> str | None:
        if not isinstance(value, str) or regex.fullmatch(value) is None:
            return f"must be {what}, not {shown_value(value)}"
        return None

    return _made(check, "pattern", regex.pattern, regex.flags, what)


def objects(limit: int) -> Check:
    """A list of at most ``limit`` JSON objects of plain, bounded JSON."""

    def check(value: Any) -> str | None:
        if not isinstance(value, list) or len(value) > limit:
            return f"must be a list of at most {limit} objects, not {shown_value(value)}"
        for item in value:
            if not isinstance(item, dict):
                return f"must be a list of objects, not of {shown_value(item)}"
        return plain(value)

    return _made(check, "objects", limit)


def power_of_two(high: int) -> Check:
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
