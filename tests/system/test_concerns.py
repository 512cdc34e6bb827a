"""Modules are rooms by concern, not by line count.

500 lines is a hard limit (tests/system/test_layering_bridge.py and test_layering_core.py); below
it, what decides where code lives is its concern. The sign of a room made for a cap is a module
that serves one sibling only: no other module of the project imports it, and the two together
would fit under the limit. Such a module is part of that sibling's concern unless it has one of
its own, and then it is declared here (:data:`CONCERNS`) with what that concern is, the reason it
stands apart. A declared module that no longer fits the pattern leaves the table, so the table
never says more than is true. Module names are unique across the tree (one name, one room).

Read statically from every import statement (tests/helpers/import_graph.py), function-level and
``TYPE_CHECKING`` imports included.
"""

from __future__ import annotations

from pathlib import Path

from import_graph import import_graph, module_files
from support import REPO

PACKAGES = ("kernelcache", "bridge")
LIMIT = 500

#: module served by one sibling only, small enough to join it -> its own concern (why it stands
#: apart from that sibling)
CONCERNS: dict[str, str] = {
    "bridge.call.out_type": "jax-triton 0.4's out_type= convention, imported only by a call that uses it",
    "bridge.lowering.messages": "jaxlib's messages of one kernel: parameters, TMA descriptors, embedded code",
    "bridge.tune.jaxlib_launch": "launching one variant through jaxlib's own custom call, to measure it",
    "kernelcache.cli.diagnosis": "the doctor command: its checks shown, with their fixes",
    "kernelcache.cli.habits": "ccache's options, taken or explained: the habits of its users",
    "kernelcache.cli.manual": "the help command: the manual's pages, found where they were installed",
    "kernelcache.cli.shell": "what the operator's shell asks: the root alone, completion scripts",
    "kernelcache.cli.stats_text": "the statistics as a table and as Prometheus text",
    "kernelcache.cli.verification": "the verify command: problems by kind, and what a repair did",
    "kernelcache.remote.redis.cluster": "a Redis Cluster as the tier sees it: slot map, primaries, failover",
}


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def served_by_one_sibling() -> dict[str, str]:
    """{module: the one sibling that imports it} for every module no other module of the
    project imports and that would fit inside that sibling under :data:`LIMIT`."""
    graph = import_graph(REPO, PACKAGES)
    files = module_files(REPO, PACKAGES)
    importers: dict[str, set[str]] = {m: set() for m in graph}
    for module, targets in graph.items():
        for target in targets:
            importers[target].add(module)
    found = {}
    for module, users in importers.items():
        if files[module].name == "__init__.py":
            continue
        parent = module.rpartition(".")[0]
        if len(users) != 1:
            continue
        (user,) = users
        if user.rpartition(".")[0] != parent or files[user].name == "__init__.py":
            continue
        if _lines(files[module]) + _lines(files[user]) <= LIMIT:
            found[module] = user
    return found


def test_a_module_that_serves_one_sibling_and_fits_in_it_declares_its_own_concern():
    undeclared = {m: u for m, u in served_by_one_sibling().items() if m not in CONCERNS}
    assert not undeclared, (
        "these modules serve one sibling and would fit in it: merge each into it, or declare "
        f"its own concern in CONCERNS: {undeclared}"
    )


def test_every_declared_concern_is_still_a_module_that_serves_one_sibling():
    stale = sorted(set(CONCERNS) - set(served_by_one_sibling()))
    assert not stale, f"no longer served by one sibling only (remove from CONCERNS): {stale}"


def test_every_declared_concern_says_what_it_is():
    short = [m for m, why in CONCERNS.items() if len(why.split()) < 6]
    assert not short, f"say what the concern is, in a sentence: {short}"


def test_module_names_are_unique_across_the_tree():
    files = module_files(REPO, PACKAGES)
    seen: dict[str, list[str]] = {}
    for module, path in files.items():
        if path.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(path.name, []).append(module)
    twice = {name: mods for name, mods in seen.items() if len(mods) > 1}
    assert not twice, f"one name, one room: {twice}"
