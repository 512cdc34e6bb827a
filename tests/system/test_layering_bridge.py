"""The bridge's folders are the stages a kernel passes through, and the imports say so.

Read statically from every import statement of every module (function-level and
``TYPE_CHECKING`` imports included: tests/helpers/import_graph.py): a module imports only
modules of its own stage or of earlier ones. Besides: every kind of entry the bridge stores is
declared once, as ``NAME = EntryKind("ext", ...)`` in a module of ``bridge/entries/``, only that
module names its extension, and every such entry is stored and looked up through its kind
(under that one name), no module of the bridge is over 500 lines, each
folder's ``__init__.py`` says what enters and what leaves it, and every exception class of the
bridge is declared in ``bridge/exceptions.py`` under ``kernelcache``'s base, the bridge uses
kernelcache only across a declared border (:data:`BORDER`), and every key it makes is the digest
of named steps (``kernelcache.keys.digest_of``) but those :data:`OWN_DIGEST` names.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
from dataclasses import dataclass
from pathlib import Path

import pytest
from import_graph import import_graph, module_files
from support import REPO

BRIDGE = REPO / "bridge"

#: the stages, in order; a module of a stage imports only modules of it and of those before it
STAGES: tuple[tuple[str, ...], ...] = (
    (
        "bridge.exceptions",
        "bridge.settings",
        "bridge.versions",
        "bridge.vendors",
    ),
    ("bridge.call",),
    ("bridge.entries",),
    ("bridge.embed",),
    ("bridge.identity",),
    ("bridge.readsets",),
    ("bridge.compile",),
    ("bridge.tune",),
    ("bridge.lowering",),
    (
        "bridge.api",
        "bridge.decorator",
        "bridge.jax_cache",
        "bridge.rule",
        "bridge.masquerade",
        "bridge",
    ),
    ("bridge.warm",),
    ("bridge.cli",),
)

#: where every kind of entry the bridge stores is declared: each in the module that owns its
#: documents
ENTRIES = BRIDGE / "entries"
#: kinds declared as a family, one per registered vendor's machine code (its ``binary_ext``), by
#: the function of the module that owns their documents that declares them
FAMILIES = {ENTRIES / "kernels.py": "kernel_kind"}
#: where the type of a kind is, with its verbs (:class:`bridge.entries.kinds.EntryKind`)
KINDS_MODULE = ENTRIES / "kinds.py"
#: the cache's verbs for an entry
VERBS = frozenset(
    {
        "get",
        "put",
        "replace",
        "quarantine",
        "get_or_create",
        "get_or_create_many",
        "get_or_create_each",
        "rebuild",
    }
)

MAX_LINES = 500


def stage(module: str) -> int:
    """The index in :data:`STAGES` of ``module`` (its longest matching prefix)."""
    best, found = -1, None
    for index, prefixes in enumerate(STAGES):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), index
    assert found is not None, f"{module} belongs to no stage: add it to STAGES"
    return found


def test_every_import_points_to_the_same_or_an_earlier_stage():
    graph = import_graph(REPO, ("bridge",))
    later = sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        for t in targets
        if t.startswith("bridge") and stage(t) > stage(m)
    )
    assert not later, "imports of a later stage: " + ", ".join(later)


def test_every_folder_is_a_stage_and_says_what_enters_and_leaves():
    folders = sorted(p.parent for p in BRIDGE.glob("*/__init__.py"))
    assert len(folders) >= 9, folders
    for folder in folders:
        name = f"bridge.{folder.name}"
        stage(name)
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
        assert doc and len(doc.split()) >= 20, f"{name}: its __init__.py needs a docstring"


def test_no_bridge_module_is_over_the_line_limit():
    long = []
    for path in sorted(BRIDGE.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            long.append(f"{path.relative_to(REPO)}: {lines}")
    assert not long, f"over {MAX_LINES} lines: {long}"


@dataclass(frozen=True)
class Declaration:
    """A kind as its module declares it: ``name = EntryKind("ext", ...)``, at the top level."""

    name: str
    ext: str
    path: Path
    line: int

    @property
    def module(self) -> str:
        return ".".join(self.path.relative_to(REPO).with_suffix("").parts)


def is_kind(node: ast.AST) -> bool:
    """Whether ``node`` makes a kind: ``EntryKind(...)`` or ``kinds.EntryKind(...)``."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (isinstance(func, ast.Name) and func.id == "EntryKind") or (
        isinstance(func, ast.Attribute) and func.attr == "EntryKind"
    )


def declarations() -> tuple[list[Declaration], list[str]]:
    """Every kind declared in the bridge's source, read statically; and where a kind is made
    in any other way (not assigned to one name at a module's top level, or its extension not
    written out)."""
    found: list[Declaration] = []
    odd: list[str] = []
    for path in sorted(BRIDGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        declared = {  # (a family's kinds: made by its function, their extensions the vendors')
            node
            for fn in tree.body
            if isinstance(fn, ast.FunctionDef) and FAMILIES.get(path) == fn.name
            for node in ast.walk(fn)
            if is_kind(node)
        }
        for node in tree.body:
            if not (isinstance(node, ast.Assign) and is_kind(node.value)):
                continue
            call = node.value
            assert isinstance(call, ast.Call)
            first = call.args[0] if call.args else None
            if (
                len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
            ):
                found.append(Declaration(node.targets[0].id, first.value, path, node.lineno))
                declared.add(call)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and is_kind(node) and node not in declared:
                odd.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found, odd


def test_every_kind_is_declared_once_under_its_own_name_by_a_module_of_entries():
    from bridge.entries.kernels import KERNELS
    from bridge.entries.kinds import EntryKind, declared_kinds
    from bridge.vendors.vendor import registered

    found, odd = declarations()
    assert not odd, "declare a kind as NAME = EntryKind('ext', ...) at top level: " + ", ".join(odd)
    family = list(KERNELS)  # (with a kind for each vendor a test registered since, if any)
    assert {vendor.binary_ext for vendor in registered()} <= set(family)
    assert sorted([*(d.ext for d in found), *family]) == sorted(k.ext for k in declared_kinds())
    names = [d.name for d in found]
    assert len(set(names)) == len(names), f"one name for each kind: {sorted(names)}"
    for d in found:
        where = f"{d.path.relative_to(REPO)}:{d.line}"
        assert d.path.parent == ENTRIES and d.path != KINDS_MODULE, f"{where}: not in entries/"
        kind = getattr(importlib.import_module(d.module), d.name)
        assert isinstance(kind, EntryKind) and kind.ext == d.ext, where


def test_only_the_module_that_declares_a_kind_names_its_extension():
    from bridge.entries.kinds import declared_kinds

    owners = {d.ext: d.path for d in declarations()[0]}
    extensions = {kind.ext for kind in declared_kinds()}
    assert extensions >= {"ptx", "decision"}, extensions

    def named(path: Path, value: object) -> bool:
        return isinstance(value, str) and value in extensions and owners.get(value) != path

    found = []
    for path in sorted(BRIDGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            values = []
            if isinstance(node, ast.Call):
                values = node.args[1:2]  # the extension argument of get/put/read(key, ext)
                values += [k.value for k in node.keywords if k.arg == "ext"]
            elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id.endswith("EXT") for t in node.targets
            ):
                values = [node.value]
            for value in values:
                if isinstance(value, ast.Constant) and named(path, value.value):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} {value.value!r}")
    assert not found, "name an extension through its kind (NAME.ext): " + ", ".join(found)


def test_every_entry_of_a_kind_goes_through_its_kind_under_one_name():
    found = declarations()[0]
    names = {d.name for d in found}
    where_declared = {(d.path, d.line) for d in found}
    calls: dict[str, list[str]] = {}
    aliases = []
    for path in sorted(BRIDGE.rglob("*.py")):
        where = str(path.relative_to(REPO))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                receiver = node.func.value  # cache.get(...), self.cache.put(...)
                if (
                    node.func.attr in VERBS
                    and path != KINDS_MODULE  # where a kind's verbs call the cache
                    and (
                        (isinstance(receiver, ast.Name) and receiver.id == "cache")
                        or (isinstance(receiver, ast.Attribute) and receiver.attr == "cache")
                    )
                ):
                    calls.setdefault(where, []).append(node.func.attr)
            elif isinstance(node, ast.Assign) and (path, node.lineno) not in where_declared:
                value = node.value  # EXT = FAILURE.ext, KIND = failures.FAILURE, FAILURE = ...
                if isinstance(value, ast.Attribute) and value.attr == "ext":
                    value = value.value
                if (
                    (isinstance(value, ast.Name) and value.id in names)
                    or (isinstance(value, ast.Attribute) and value.attr in names)
                    or any(isinstance(t, ast.Name) and t.id in names for t in node.targets)
                ):
                    aliases.append(f"{where}:{node.lineno}")
            elif isinstance(node, ast.ImportFrom):  # from .failures import FAILURE as F
                if any(a.asname and a.name in names for a in node.names):
                    aliases.append(f"{where}:{node.lineno}")
    calls = {where: sorted(verbs) for where, verbs in calls.items()}
    assert not calls, "store and look up entries through their kind"
    assert not aliases, "name a kind and its extension as its module does: " + ", ".join(aliases)


#: exceptions of the bridge that are not errors a user catches, and why
NOT_ERRORS: dict[str, str] = {}


def test_every_bridge_exception_is_declared_in_exceptions_under_kernelcaches_base():
    from kernelcache.errors import KernelCacheError

    stray, outside = [], []
    for name in module_files(REPO, ("bridge",)):
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == name
                and not value.__name__.startswith("_")
            ):
                if name != "bridge.exceptions":
                    outside.append(f"{name}.{value.__qualname__}")
                named = f"{name}.{value.__qualname__}"
                if not issubclass(value, KernelCacheError) and named not in NOT_ERRORS:
                    stray.append(named)
    assert not outside, f"declare these in bridge/exceptions.py: {outside}"
    assert not stray, f"not KernelCacheErrors: {stray}"


@pytest.mark.parametrize(
    ("module", "expected"),
    [("bridge", 9), ("bridge.call.binding", 1), ("bridge.vendors.cuda", 0), ("bridge.cli", 11)],
)
def test_the_stage_of_a_module_is_its_longest_prefix(module, expected):
    assert stage(module) == expected


#: what the bridge may import of kernelcache, its plugin surface: its
#: public API (``kernelcache``), what a package built on it uses (``kernelcache.plugin``: the
#: variables, metadata fields and directories it declares, and the foundation it shares) and,
#: for the commands it adds, ``kernelcache.cli``; nothing else
BORDER = frozenset({"kernelcache", "kernelcache.plugin", "kernelcache.cli"})
#: the most modules the border may hold besides ``kernelcache`` itself
BORDER_MODULES = 4


def test_the_border_is_kernelcache_and_at_most_four_declared_modules():
    assert "kernelcache" in BORDER and len(BORDER - {"kernelcache"}) <= BORDER_MODULES


def kernelcache_imports() -> dict[str, set[str]]:
    """The kernelcache modules each bridge module imports (any depth, static)."""
    found: dict[str, set[str]] = {}
    for path in sorted(BRIDGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("kernelcache")
            ):  # (a submodule imported by name from its package is that submodule)
                package = importlib.import_module(node.module)
                for alias in node.names:
                    if inspect.ismodule(getattr(package, alias.name, None)):
                        names.append(f"{node.module}.{alias.name}")
            for name in names:
                if name == "kernelcache" or name.startswith("kernelcache."):
                    found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return found


def test_the_border_is_faces_and_foundation_modules_only():
    """Every module of :data:`BORDER` is kernelcache's own face, a folder's face or a module
    of its top level: the bridge never reaches inside a folder."""
    for name in BORDER:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        origin = Path(spec.origin).relative_to(REPO)
        inside = origin.parts[1:-1] if origin.name != "__init__.py" else origin.parts[1:-2]
        assert not inside, f"{name} is a module inside a folder: import it through the face"


def test_the_bridge_uses_kernelcache_only_across_its_declared_border():
    beyond = {m: sorted(users) for m, users in kernelcache_imports().items() if m not in BORDER}
    assert beyond == {}, "import these through the public API or add them to BORDER, saying why"


#: functions that make a key without named steps, and why (every other ``*_key`` function of
#: the bridge digests through kernelcache.keys.digest_of, the one digest of named steps)
OWN_DIGEST = {
    "bridge.entries.kinds.derived_key": "a companion's key from its owner's and a role, pinned "
    "by tests/bridge/entries/test_kinds.py: changing it orphans every stored companion",
}


def test_every_key_of_the_bridge_is_the_digest_of_named_steps():
    own = {}
    for module, path in module_files(REPO, ("bridge",)).items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef) or not node.name.endswith("_key"):
                continue
            hashes = any(
                isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name)
                and n.value.id == "hashlib"
                for n in ast.walk(node)
            )
            if hashes:
                own[f"{module}.{node.name}"] = node.lineno
    assert set(own) == set(OWN_DIGEST), f"make these keys with digest_of of named steps: {own}"
