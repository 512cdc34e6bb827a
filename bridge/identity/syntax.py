"""What a JIT function's source reads, as Triton's frontend walks it.

:func:`spelled`, without parsing: every name the source spells outside string literals and
comments (f-strings are code), a superset of what it reads. :func:`syntax`, parsed: the names it
loads and stores, the attributes it reads and the chain of each, and a ``getattr``/``hasattr``
whose name is computed. The describer looks names up by the first, and asks the second only
where a value has no description, to tell whether the code reads it (:func:`resolved` follows a
chain through modules, without running code).
"""

from __future__ import annotations

import ast
import functools
import re
import types
from collections.abc import Callable
from typing import Any, NamedTuple

from . import static_reads

#: Triton's names for Python builtins in kernel code that look attributes up
LOOKUPS = ("getattr", "hasattr")


class Syntax(NamedTuple):
    """What the syntax of a JIT function's source reads, exactly as Triton's frontend walks it:
    the names it loads and stores, every attribute it reads (with the literal names of
    ``getattr``/``hasattr``) and the chain each is read through (the name it starts from, None
    where it starts from an expression, then the attributes), and a ``getattr`` or ``hasattr``
    call whose name is computed (its text), if any."""

    loaded: frozenset[str]
    stored: frozenset[str]
    attributes: frozenset[str]
    chains: frozenset[tuple[str | None, tuple[str, ...]]]
    computed: str | None


def _chain(node: ast.expr, last: tuple[str, ...] = ()) -> tuple[str | None, tuple[str, ...]]:
    attrs = list(last)
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    head = node.id if isinstance(node, ast.Name) else None
    return head, tuple(reversed(attrs))


_QUOTED = r"""(?:'''[\s\S]*?'''|\"\"\"[\s\S]*?\"\"\"|'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")"""
#: an f-string (kept: its expressions are code), another string literal or a comment (dropped)
_LITERAL = re.compile(
    rf"(?P<f>(?<![A-Za-z0-9_])(?:[fF][rR]?|[rR][fF]){_QUOTED})"
    rf"|(?<![A-Za-z0-9_])(?:[rRbBuU]|[bB][rR]|[rR][bB])?{_QUOTED}|#[^\n]*"
)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@functools.lru_cache(maxsize=512)
def spelled(src: str) -> frozenset[str]:
    """Every name a JIT function's source spells outside string literals and comments: a
    superset of the names and attributes its syntax reads (:func:`syntax`), found without
    parsing."""
    return frozenset(_NAME.findall(_LITERAL.sub(r"\g<f>", src)))  # (f-strings kept)


@functools.lru_cache(maxsize=512)
def syntax(src: str) -> Syntax:
    """The :class:`Syntax` of a JIT function's source (parsed once per source and process)."""
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(src))
    except SyntaxError as e:
        none: frozenset[Any] = frozenset()
        return Syntax(none, none, none, none, f"(its source does not parse: {e.msg})")
    loaded: set[str] = set()
    stored: set[str] = set()
    attributes: set[str] = set()
    chains: set[tuple[str | None, tuple[str, ...]]] = set()
    computed = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else stored).add(node.id)
        elif isinstance(node, ast.arg):
            stored.add(node.arg)
        elif isinstance(node, ast.Attribute):
            attributes.add(node.attr)
            chains.add(_chain(node))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in LOOKUPS and len(node.args) >= 2:
                name = node.args[1]
                if isinstance(name, ast.Constant) and isinstance(name.value, str):
                    attributes.add(name.value)
                    chains.add(_chain(node.args[0], (name.value,)))
                elif computed is None:
                    computed = ast.unparse(node)
    return Syntax(
        frozenset(loaded), frozenset(stored), frozenset(attributes), frozenset(chains), computed
    )


#: what cannot be told without running code
UNKNOWN = object()


def scope(
    cells: dict[str, Any], glob: dict[str, Any], params: frozenset[str]
) -> Callable[[str], Any]:
    """How a JIT function finds a global name (a parameter: not known before the call)."""

    def find(name: str) -> Any:
        if name in params:
            return UNKNOWN
        if name in cells:
            return static_reads.cell(cells[name])
        return glob.get(name, UNKNOWN)

    return find


def resolved(
    found: Syntax, scope: Callable[[str], Any], head: str | None, attrs: tuple[str, ...]
) -> Any:
    """What the chain ``head.attrs`` finds without running code, through modules only;
    :data:`UNKNOWN` where that cannot be told (an expression, a local, another object)."""
    if head is None or head in found.stored:
        return UNKNOWN
    value = scope(head)
    for attr in attrs:
        if not isinstance(value, types.ModuleType):
            return UNKNOWN
        value = vars(value).get(attr, UNKNOWN)
    return value
