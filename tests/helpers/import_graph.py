"""The import graph of packages, read statically from every import statement of every module
(function-level and ``TYPE_CHECKING`` imports included), so an import that runs only on some
path still counts; for the layering tests (tests/system/test_layering*.py).

``from . import name`` is an edge to the submodule ``name`` when there is one, else to the
package's ``__init__``; the implicit import of a module's parent packages is not an edge.
"""

from __future__ import annotations

import ast
from pathlib import Path


def module_files(base: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """{dotted module name: file} of every module of the packages."""
    found = {}
    for package in packages:
        for path in sorted((base / package).rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that the import statements of module ``name`` name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                origin = ".".join([*base, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            for alias in node.names:
                sub = f"{origin}.{alias.name}"
                targets.add(sub if sub in modules else origin)
    edges = set()
    for target in targets:
        while target and target not in modules:  # `import a.b.c` of a name inside a module
            target = target.rpartition(".")[0]
        if target and target != name:
            edges.add(target)
    return edges


def import_graph(base: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """{module: the modules of ``packages`` it imports}, from the files under ``base``."""
    modules = module_files(base, packages)
    return {name: _imported(name, path, modules) for name, path in modules.items()}
