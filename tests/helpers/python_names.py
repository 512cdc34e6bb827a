"""The names a piece of Python code uses without defining them (what a documentation block
that does not run stands in for), read statically with :mod:`ast`."""

from __future__ import annotations

import ast
import builtins


def defined_names(code: str) -> set[str]:
    """The names ``code`` binds anywhere: imports, assignments, functions, classes, their
    parameters, loop and ``with`` targets, exception names."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            found.add(node.id)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            found.add(node.name)
    return found


def undefined_names(code: str) -> set[str]:
    """The names ``code`` reads that it never binds and that are not builtins."""
    used = {
        n.id
        for n in ast.walk(ast.parse(code))
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    }
    return used - defined_names(code) - set(dir(builtins))
