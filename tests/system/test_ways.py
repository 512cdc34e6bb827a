"""The ways a reader follows, measured by scripts/ways.py: a kernel key's from ``triton_call`` to
the store, and the root's through ``kernelcache prune``, each crossing at most 10 modules.

The key's way is its path in the call tree, from where it is made to the store's write; every
module it visits, side trips included, is held where it is. The measure itself is pinned on a
package made for it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from support import REPO, child_env

SCRIPT = REPO / "scripts" / "ways.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ways", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = sys.modules.setdefault("ways", importlib.util.module_from_spec(spec))
    if not hasattr(module, "trace"):
        spec.loader.exec_module(module)
    return module


ways = _script()


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both ways, each measured in a fresh interpreter (the script's command line)."""
    out = tmp_path_factory.mktemp("ways") / "ways.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "key", "prune", "--json", str(out)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode:  # not an AssertionError: the xfails below must not take it for theirs
        raise RuntimeError(f"scripts/ways.py failed:\n{done.stdout}{done.stderr}")
    return json.loads(out.read_text())


# -- the bounds ------------------------------------------------------------------------------
def test_a_kernel_keys_path_from_where_it_is_made_to_the_store_crosses_at_most_ten_modules(
    measured,
):
    key = measured["key"]
    assert len(set(key["path"])) <= ways.BOUND, key["path"]
    # (made by the one digest of named steps, for the kernel keys' module)
    assert key["path"][:2] == ["kernelcache.keys", "bridge.identity.kernel_keys"], key["path"]
    assert key["path"][-1].startswith("kernelcache.store")


#: every module a kernel key visits, side trips included (its validation, the failure memo, the
#: PTX companion, the lookup before the build): more than the path, since the cache's writes
#: and builds and each entry kind live in modules of their own (none over 500 lines); a change
#: that adds a side trip must say why, here
SIDE_TRIPS_INCLUDED = 13


def test_a_kernel_keys_side_trips_do_not_grow(measured):
    key = measured["key"]
    assert key["distinct"] <= SIDE_TRIPS_INCLUDED, key["modules"]


def test_prunes_root_crosses_at_most_ten_modules(measured):
    prune = measured["prune"]
    assert prune["distinct"] <= ways.BOUND, prune["modules"]


# -- what the scenarios measure -----------------------------------------------------------
def test_the_key_goes_from_the_bridge_to_the_stores_write_of_the_binary(measured):
    key = measured["key"]
    assert key["route"][0] == "kernelcache.keys", key["route"]  # (digest_of)
    assert key["route"][1].startswith("bridge."), key["route"]
    last = key["events"][-1]
    assert last["kind"] == "call" and last["module"].startswith("kernelcache.store")
    assert last["function"].rsplit(".", 1)[-1] in ("publish", "put")
    assert key["inside"] == ["kernelcache.store"]
    # nothing the store does with it is counted: no event comes from below a store frame
    assert key["distinct"] == len(key["modules"]) == len(set(key["route"]))
    assert key["calls"] + key["returns"] == sum(key["hops"].values())


def test_the_root_enters_at_the_command_and_opens_a_store(measured):
    prune = measured["prune"]
    assert prune["route"][0].startswith("kernelcache.cli"), prune["route"]
    assert prune["events"][0]["peer"] is None  # handed in from outside the project
    assert prune["inside"] == ["kernelcache.store"]
    # the store is its destination: the Store is built within it, from the bare root handed
    # to it by the command (Store(...), or a constructor of the class)
    stores = [f for f in prune["bare_to"] if f.startswith("kernelcache.store.root:Store.")]
    assert stores, prune["bare_to"]
    assert prune["bare_calls"] == sum(prune["bare_to"].values())


# -- the measure, on a package made for it ------------------------------------------------
DEMO = {
    "__init__.py": "",
    "a.py": """
        from . import b, c

        def start(value):
            return _inner(value)  # one module: no crossing

        def _inner(value):
            with c.holding(value) as held:  # into c, and back (a yield is a return)
                return b.unwrap(b.Box(held))  # into b twice; back with its return
    """,
    "b.py": """
        from . import c

        class Box:
            def __init__(self, value):
                self.value = value

        def unwrap(box):
            return c.same(box.value)
    """,
    "d.py": """
        from . import b

        def born():
            value = make()  # made in d, and returned within it: no crossing yet
            with_side_trip(value)
            return b.unwrap(b.Box(value))

        def make():
            return "made in d"

        def with_side_trip(value):
            from . import c

            return c.same(value) is value
    """,
    "c.py": """
        import contextlib

        @contextlib.contextmanager
        def holding(value):
            yield value

        def same(value):
            return value
    """,
}


@pytest.fixture
def demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    package = tmp_path / "waysdemo"
    package.mkdir()
    for name, text in DEMO.items():
        (package / name).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "waysdemo" or m.startswith("waysdemo.")]:
        monkeypatch.delitem(sys.modules, name)
    return importlib.import_module("waysdemo.a")


def test_the_measure_counts_crossings_not_calls(demo):
    value = "a value to follow"
    got: list[Any] = []
    way = ways.way(
        lambda x: x == value, lambda: got.append(demo.start(value)), packages=("waysdemo",)
    )
    assert got == [value]
    a, b, c = "waysdemo.a", "waysdemo.b", "waysdemo.c"
    # start (from outside), holding and its yield back (the generator's resumption is no call),
    # Box(value), unwrap(box), same(value) and the two returns; within a, no crossing
    assert way.route == [a, c, a, b, b, c, b, a]
    assert way.distinct == 3 and way.modules == [a, c, b]
    assert way.reentries == {a: 2, b: 2, c: 1}
    assert (way.calls, way.returns, way.bare_calls) == (5, 3, 4)
    assert way.opened == ["Box"]
    assert way.hops == {
        f"outside -> {a}": 1,
        f"{a} -> {c}": 1,
        f"{c} -> {a}": 1,
        f"{a} -> {b}": 2,
        f"{b} -> {c}": 1,
        f"{c} -> {b}": 1,
        f"{b} -> {a}": 1,
    }


def test_a_way_ends_where_told_and_leaves_out_its_destination(demo):
    value = "a value to follow"
    traced = ways.trace(
        lambda: demo.start(value), lambda x: "v" if x == value else None, ("waysdemo",)
    )
    to_box = traced.way("v", until=lambda e: e.function == "Box.__init__")
    assert to_box.route == ["waysdemo.a", "waysdemo.c", "waysdemo.a", "waysdemo.b"]
    # what b does with it (the call of c.same, and its return) is b's own work
    into_b = traced.way("v", inside=("waysdemo.b",))
    assert into_b.route == [
        "waysdemo.a",
        "waysdemo.c",
        "waysdemo.a",
        "waysdemo.b",
        "waysdemo.b",
        "waysdemo.a",
    ]
    with pytest.raises(LookupError):
        traced.way("v", until=lambda e: False)
    with pytest.raises(LookupError):
        traced.way("another value")


def test_the_path_is_the_call_tree_between_where_a_value_is_made_and_where_it_ends(demo):
    """The path leaves out side trips: a function handed the value that hands it back (or on
    to nothing) is off it, however many modules it crosses."""
    import waysdemo.d as d

    traced = ways.trace(d.born, lambda x: "v" if x == "made in d" else None, ("waysdemo",))
    way = traced.way("v", until=lambda e: e.function == "same" and e.below[0] == "waysdemo.b")
    # made in d.make, up to d.born, then down through b.unwrap into c.same; the first c.same
    # (from with_side_trip) is a side trip
    assert way.path == ["waysdemo.d", "waysdemo.b", "waysdemo.c"]
    assert way.path_returns == 0  # make returns within d
    value = "a value to follow"
    traced = ways.trace(
        lambda: demo.start(value), lambda x: "v" if x == value else None, ("waysdemo",)
    )
    to_same = traced.way("v", until=lambda e: e.function == "same")
    # handed in from outside: the path is the stack at its end; holding (c) is a side trip
    assert to_same.route[:2] == ["waysdemo.a", "waysdemo.c"]
    assert to_same.path == ["waysdemo.a", "waysdemo.b", "waysdemo.c"]
