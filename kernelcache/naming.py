"""Names as the commands select entries by them: a plain name or an :mod:`fnmatch` pattern
(:func:`is_pattern`, :func:`matcher`), and how an entry that holds several kernels lists their
names in one field (:data:`NAME_SEPARATOR`, :func:`kernel_names`).

Plain functions of text: nothing here touches disk.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable

#: how an entry that holds several kernels separates their names in its ``name`` and
#: ``kernel`` fields (a kernel's own name never holds it)
NAME_SEPARATOR = ", "


def kernel_names(value: str | None) -> list[str]:
    """The kernel names a ``name`` or ``kernel`` field lists (see :data:`NAME_SEPARATOR`)."""
    return value.split(NAME_SEPARATOR) if value else []


#: the characters that make a ``--kernel`` or ``--target`` value a pattern (:mod:`fnmatch`)
GLOB_CHARS = frozenset("*?[")


def is_pattern(value: str) -> bool:
    """Whether ``value`` is an :mod:`fnmatch` pattern rather than a plain name."""
    return not GLOB_CHARS.isdisjoint(value)


def matcher(patterns: Iterable[str]) -> Callable[[object], bool]:
    """A test of a metadata value against ``patterns``: names matched exactly and
    :mod:`fnmatch` patterns (``cuda:*``, ``hip:gfx9?2``, ``matmul_[ab]*``), case-sensitively.
    Anything but a string matches nothing."""
    exact = {p for p in patterns if not is_pattern(p)}
    globs = [re.compile(fnmatch.translate(p)).match for p in patterns if is_pattern(p)]

    def match(value: object) -> bool:
        if not isinstance(value, str):
            return False
        return value in exact or any(g(value) is not None for g in globs)

    return match
