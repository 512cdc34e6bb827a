"""The import graph points one way: no cycle inside ``kernelcache`` or ``bridge``, and
``kernelcache`` never imports ``bridge``.

Read statically from every import statement of every module (function-level and
``TYPE_CHECKING`` imports included: tests/helpers/import_graph.py), so an import that runs only
on some path still counts.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from import_graph import import_graph, module_files
from support import REPO

PACKAGES = ("kernelcache", "bridge")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _describe(graph: dict[str, set[str]], component: list[str]) -> str:
    inside = set(component)
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & inside))}" for m in component)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_inside_a_package(package):
    graph = import_graph(REPO, (package,))
    assert len(graph) > 5, f"found only {sorted(graph)} under {REPO / package}"
    found = cycles(graph)
    assert not found, "import cycles: " + " | ".join(_describe(graph, c) for c in found)


def test_kernelcache_never_imports_bridge():
    graph = import_graph(REPO, PACKAGES)
    crossing = sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        if m.split(".")[0] == "kernelcache"
        for t in targets
        if t.split(".")[0] == "bridge"
    )
    assert not crossing, f"kernelcache imports the bridge: {crossing}"
    # (the bridge does import kernelcache: the graph sees imports across the packages)
    assert any(
        t.startswith("kernelcache") for m in graph if m.startswith("bridge") for t in graph[m]
    )


def test_the_checker_finds_cycles_through_any_kind_of_import(tmp_path):
    """The checker itself: cycles through relative, absolute, ``from . import`` and
    function-level imports are found, a one-way graph is clean, and the package's
    ``__init__`` counts as a module."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from .a import A\n",
        "a.py": "from . import b\nA = 1\n",
        "b.py": "def f():\n    import pkg.sub.c\n",
        "sub/__init__.py": "",
        "sub/c.py": "from ...pkg import a\n",  # back to a: a -> b -> sub.c -> a
        "d.py": "from . import VERSION\n",  # the package's __init__: __init__ -> a, not d
        "e.py": "from .a import A\n",  # one way
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.b"] == {"pkg.sub.c"} and graph["pkg.d"] == {"pkg"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c"]]
    (pkg / "sub" / "c.py").write_text("")
    assert cycles(import_graph(tmp_path, ("pkg",))) == []
    (pkg / "a.py").write_text(
        "A = 1\nif False:\n    from . import d\n"
    )  # __init__ -> a -> d -> __init__
    assert cycles(import_graph(tmp_path, ("pkg",))) == [["pkg", "pkg.a", "pkg.d"]]


def _kernelcache_sources() -> dict[Path, str]:
    return {path: path.read_text() for path in sorted((REPO / "kernelcache").rglob("*.py"))}


def test_kernelcache_sources_name_no_bridge_variable_field_or_directory():
    """What the bridge stores and reads is declared by the bridge (variables, metadata fields,
    the hand-off directory); kernelcache's sources name none of it."""
    import re

    import bridge.embed.handoff
    import bridge.entries.metadata
    import bridge.settings
    from kernelcache import schema

    variables = {var.name for var in bridge.settings.VARIABLES}
    # kernelcache's own fields (an entry's name, target, kind, ...) are shared vocabulary;
    # "kernel" is also the name of kernelcache's own column for an entry's `name`
    fields = set(bridge.entries.metadata.FIELDS) - schema.OWN_FIELDS - {"kernel"}
    assert variables and fields, "nothing to look for"
    found = []
    for path, text in _kernelcache_sources().items():
        words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
        strings = {
            node.value
            for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        }
        named = (variables & words) | (fields & strings)
        named |= {f for f in fields if "_" in f and f in words}  # also in prose and names
        if bridge.embed.handoff.HANDOFF_DIR in text:
            named.add(bridge.embed.handoff.HANDOFF_DIR)
        found += [f"{path.relative_to(REPO)}: {name}" for name in sorted(named)]
    assert not found, found


def test_every_kernelcache_exception_derives_from_its_base():
    import importlib
    import inspect

    from kernelcache.errors import KernelCacheError

    classes = []
    for name in module_files(REPO, ("kernelcache",)):
        if name.endswith("__main__"):
            continue
        module = importlib.import_module(name)
        classes += [
            c
            for c in vars(module).values()
            if inspect.isclass(c) and issubclass(c, BaseException) and c.__module__ == name
        ]
    assert len(classes) >= 8, classes
    stray = [
        f"{c.__module__}.{c.__qualname__}" for c in classes if not issubclass(c, KernelCacheError)
    ]
    assert not stray, stray


VENDOR_NAMES = {"cuda", "hip", "rocm", "nvidia", "amd"}


def _compares_a_vendor_name(node: ast.AST) -> bool:
    def names(value: ast.AST) -> bool:
        if isinstance(value, ast.Constant):
            return isinstance(value.value, str) and value.value.lower() in VENDOR_NAMES
        if isinstance(value, (ast.Tuple, ast.List, ast.Set)):
            return any(names(v) for v in value.elts)
        return False

    return isinstance(node, ast.Compare) and any(names(v) for v in (node.left, *node.comparators))


def test_no_backend_name_is_compared_outside_the_vendor_descriptors():
    """What differs by GPU vendor is asked of a target's vendor (bridge/vendors/);
    kernelcache gives targets no meaning at all."""
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if path.parent == REPO / "bridge" / "vendors":
                continue
            tree = ast.parse(path.read_text())
            found += [
                f"{path.relative_to(REPO)}:{node.lineno}"
                for node in ast.walk(tree)
                if _compares_a_vendor_name(node)
            ]
    assert not found, "compare the target's descriptor instead: " + ", ".join(found)
    sample = ast.parse("a == 'cuda'\nb in ('x', 'HIP')\nc == 'cudaX'").body
    assert [_compares_a_vendor_name(s.value) for s in sample] == [True, True, False]
