"""kernelcache's folders form layers, and each module imports only from its own folder and
the layers below it; no module of kernelcache is longer than :data:`MAX_LINES` lines.

Layers, bottom to top: the foundation (the modules at the top of the package), ``schema``,
``store``, ``stats``, ``remote`` and ``maintenance`` (side by side: neither imports the
other), ``capacity`` (the size cap: its passes are maintenance's prunes), ``cache``, ``bundle`` and ``doctor`` (side by side), ``cli``. The package's
``__init__`` (the public API) and ``kernelcache.plugin`` (the plugin surface) may import from
any layer, and no module of the package imports either. Read statically with
:func:`import_graph` (tests/helpers/import_graph.py), so function-level and
``TYPE_CHECKING`` imports count too.
"""

from __future__ import annotations

from import_graph import import_graph
from support import REPO

MAX_LINES = 500

#: folder -> its layer (the foundation, the top-level modules, is 0)
LAYERS = {
    "schema": 1,
    "store": 2,
    "stats": 3,
    "remote": 4,
    "maintenance": 4,
    "capacity": 5,
    "cache": 6,
    "bundle": 7,
    "doctor": 7,
    "cli": 8,
}
FOUNDATION = {
    "_version",
    "config",
    "errors",
    "formats",
    "fsio",
    "keys",
    "naming",
    "optional",
    "problem",
    "process",
    "progress",
    "signing_key",
    "table",
    "toolchains",
    "units",
}


#: the surfaces: the package's ``__init__`` (the public API) and the plugin surface, which
#: declare names of any layer and are imported by none
SURFACES = {"kernelcache", "kernelcache.plugin"}


def _place(module: str) -> tuple[str, int] | None:
    """(folder, layer) of a kernelcache module; None for a surface (:data:`SURFACES`)."""
    parts = module.split(".")
    if module in SURFACES:
        return None
    if parts[1] in LAYERS:
        return parts[1], LAYERS[parts[1]]
    assert parts[1] in FOUNDATION, f"{module}: put it in a layer (LAYERS or FOUNDATION)"
    return "", 0


def _wrong_way(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        here = _place(module)
        if here is None:
            continue
        for target in sorted(targets):
            there = _place(target) if target.startswith("kernelcache") else ("", -1)
            if there is None:
                found.append(f"{module} -> {target} (the surfaces are for users and plugins)")
            elif there[0] != here[0] and there[1] >= here[1] and there[1] >= 0:
                found.append(f"{module} -> {target}")
    return found


def test_every_import_points_down_the_layers():
    graph = import_graph(REPO, ("kernelcache",))
    assert len(graph) > 50, sorted(graph)
    wrong = _wrong_way(graph)
    assert not wrong, "imports against the layers: " + "; ".join(wrong)


def test_the_checker_finds_an_import_up_or_across():
    graph = {
        "kernelcache.store.root": {"kernelcache.schema.fields", "kernelcache.keys"},
        "kernelcache.schema.fields": {"kernelcache.store.layout"},  # up
        "kernelcache.remote.base": {"kernelcache.maintenance.scan"},  # across, same layer
        "kernelcache.keys": {"kernelcache"},  # the public API
        "kernelcache.cli.app": {"kernelcache.cache.builds", "kernelcache.cli.output"},
    }
    assert _wrong_way(graph) == [
        "kernelcache.keys -> kernelcache (the surfaces are for users and plugins)",
        "kernelcache.remote.base -> kernelcache.maintenance.scan",
        "kernelcache.schema.fields -> kernelcache.store.layout",
    ]


def test_no_module_is_longer_than_the_limit():
    lines = {
        path.relative_to(REPO): len(path.read_text().splitlines())
        for path in sorted((REPO / "kernelcache").rglob("*.py"))
    }
    long = [f"{path}: {n} lines" for path, n in lines.items() if n > MAX_LINES]
    assert not long, long


def private_imports(packages: tuple[str, ...] = ("kernelcache", "bridge")) -> list[str]:
    """Every ``from M import _name`` in ``packages`` (at any depth): a name private to M used
    by another module (which should then be public in M)."""
    import ast

    found = []
    for package in packages:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                    for alias in node.names:
                        if alias.name.startswith("_") and not alias.name.startswith("__"):
                            rel = path.relative_to(REPO)
                            found.append(f"{rel}: from {node.module} import {alias.name}")
    return found


def test_no_module_imports_a_private_name_of_another():
    assert private_imports() == []
