"""A check of a stored read set reads and compares; it never calls.

- An honest warm hit in a fresh process runs none of the program's functions: a kernel whose
  ``constexpr_function`` reads module globals (through a helper), served from its stored
  lowering and from its kernel entry alone; a process whose global changed compiles again.
- A forged read set, whatever path of names it walks (from the kernel's globals through
  Triton's, the standard library's and JAX's modules to ``sys.modules``, ``exec``,
  ``os._exit``) and whatever calls it names with whatever arguments, runs no code: while it is
  checked no Python frame but the bridge's own (and the standard library's JSON and hashing)
  is entered, nothing is allocated past 100 MiB, and nothing it says ends the process.
- What a check of one entry may do is bounded by the data's form: more read sets, rows or
  described values than a check makes is a refusal, made before any read.

Each on cuda:90 and hip:gfx942.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from bridge_helpers import forget_lowerings, kernel_module, run_child
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import HELPERS

TARGETS = {"cuda:90": "cuda", "hip:gfx942": "rocm"}

#: a kernel whose constexpr_function reads module globals, itself and through another
CFN_MODULE = """
import os
import triton
import triton.language as tl

SCALE = float(os.environ.get("CFN_SCALE", "2.0"))
CONFIG = {"offset": 0.5}


@triton.constexpr_function
def _base():
    return SCALE + CONFIG["offset"]


@triton.constexpr_function
def scale():
    return _base() * 2.0


@triton.jit
def kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * scale(), mask=mask)
"""

#: lowers the kernel of ``cfn_globals`` for the target, noting every function of the module
#: that runs while it lowers (a profiler on this thread), and what was compiled
CHILD = """
import hashlib, json, sys
sys.path[:0] = [{src!r}, {helpers!r}]
import jax, jax.numpy as jnp
import bridge
from bridge.compile import compiler
from bridge_helpers import custom_calls, lowered_module
import cfn_globals as mod

ran = []


def profile(frame, event, arg):
    if event == "call" and frame.f_code.co_filename == mod.__file__:
        ran.append(frame.f_code.co_name)


def fn(x):
    return bridge.triton_call(
        x, x.size, kernel=mod.kernel, out_shape=x, grid=(4,), BLOCK=1024, target={target!r},
        embed={embed!r},
    )


x = jax.ShapeDtypeStruct((4096,), jnp.float32)
sys.setprofile(profile)
(call,) = custom_calls(lowered_module(fn, x, platform={platform!r}))
sys.setprofile(None)
print(json.dumps([ran, compiler.compile_count(), hashlib.sha256(call["opaque"]).hexdigest()]))
"""


def _lower(src: Path, root: Path, target: str, embed: str | None, **env: str) -> list[Any]:
    code = CHILD.format(
        src=str(src), helpers=str(HELPERS), target=target, platform=TARGETS[target], embed=embed
    )
    return run_child(code, KERNELCACHE_DIR=str(root), **env)


@pytest.mark.parametrize("served", ["stored-lowering", "kernel-entry"])
@pytest.mark.parametrize("target", TARGETS)
def test_a_warm_hit_in_a_fresh_process_calls_none_of_the_programs_functions(
    tmp_path, target, served
):
    src = tmp_path / "src"
    src.mkdir()
    (src / "cfn_globals.py").write_text(CFN_MODULE)
    root = tmp_path / "root"
    # (a lowering handing HSACO over by path, the default on this jaxlib, is not stored)
    embed = "inline" if served == "stored-lowering" else None
    _, compiles, first = _lower(src, root, target, embed)
    assert compiles == 1  # (in the compiler process, which the profiler does not see)
    entries = [json.loads(p.read_text()) for p in root.glob("*.json")]
    (kernel,) = [e for e in entries if e.get("ext") in ("cubin", "hsaco")]
    assert json.loads(kernel["reads"])["partial"] == [], "the read set is partial: the IR decides"
    assert _lower(src, root, target, embed) == [[], 0, first]  # (this one stores its lowering)
    if served == "kernel-entry":  # (what is left: the kernel entry alone)
        forget_lowerings(root)
    else:
        assert _count_lowerings(root) > 0
    ran, compiles, again = _lower(src, root, target, embed)
    assert (ran, compiles, again) == ([], 0, first)
    ran, compiles, changed = _lower(src, root, target, embed, CFN_SCALE="3.0")
    assert compiles == 1 and changed != first  # (its reads find another SCALE: compiled)


def _count_lowerings(root: Path) -> int:
    return len([*root.glob("*.lowering"), *root.glob("*.program")])


# -- forged read sets ----------------------------------------------------------------------------
#: a kernel module whose globals lead, by namespace reads, anywhere: os, sys, builtins, jax
FORGE_MODULE = """
import os
import sys
import builtins
import jax
import triton
import triton.language as tl

HIT = []


def trip(*args, **kwargs):
    HIT.append(args)
    return 1.0


@triton.constexpr_function
def pick(n):
    return float(n)


@triton.jit
def kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * pick(2), mask=mask)
"""
#: what a check may enter as Python frames: the bridge's own code, and the standard library's
#: modules it uses itself (on the read set's text, paths, its own context managers)
OWN = (
    "/bridge/", "/kernelcache/", "/json/", "/hashlib.py", "/functools.py", "/enum.py", "/re/",
    "/contextlib.py", "<frozen posixpath>",
)  # fmt: skip


@pytest.fixture(scope="module", params=list(TARGETS))
def forge(request, tmp_path_factory) -> dict[str, Any]:
    """The kernel compiled once for the target: what a check is given, its own read set."""
    from bridge_helpers import custom_calls, lowered_module

    import bridge
    import kernelcache
    from bridge.identity import namespaces
    from bridge.vendors import backends, targets

    target = request.param
    base = tmp_path_factory.mktemp("forge")
    module = kernel_module(base, f"forge_{TARGETS[target]}", FORGE_MODULE)
    root = base / "root"
    import jax
    import jax.numpy as jnp

    def fn(x):
        return bridge.triton_call(
            x,
            x.size,
            kernel=module.kernel,
            out_shape=x,
            grid=(4,),
            BLOCK=1024,
            target=target,
            cache=kernelcache.Cache(str(root)),
        )

    avals = jax.ShapeDtypeStruct((4096,), jnp.float32)
    custom_calls(lowered_module(fn, avals, platform=TARGETS[target]))
    (text,) = [
        d["reads"]
        for d in (json.loads(p.read_text()) for p in root.glob("*.json"))
        if d.get("ext") in ("cubin", "hsaco")
    ]
    backend = backends.make_backend(targets.parse_target(target))
    return {
        "module": module,
        "kernel": module.kernel,
        "given": {"BLOCK": 1024},
        "backend": backend,
        "modules": namespaces.module_map_of(backend),
        "text": text,
    }


def _check(forge: dict[str, Any], text: str) -> tuple[Any, list[str], int]:
    """The verdict of ``text``, the foreign Python frames entered while it was made, and the
    peak of what it allocated."""
    from bridge.readsets import read_sets

    entered: list[str] = []
    made = read_sets.Verdict.__new__.__code__  # (a NamedTuple's, made by the standard library)

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is not made:
            name = frame.f_code.co_filename
            if not any(part in name for part in OWN):
                entered.append(f"{name}:{frame.f_code.co_name}")

    forge["module"].HIT.clear()
    gc.collect()  # (what the test made before: not the check's)
    tracemalloc.start()
    sys.setprofile(profile)
    try:
        verdict = read_sets.stale(
            [text], forge["kernel"], forge["given"], forge["backend"], expected=lambda: []
        )
    finally:
        sys.setprofile(None)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return verdict, entered + [f"HIT {h}" for h in forge["module"].HIT], peak


def _with_rows(forge: dict[str, Any], rows: list[list[Any]]) -> str:
    """The compile's own read set, with ``rows`` after its rows (the wants made right: what a
    forger who can run the same reads writes, so that every namespace read holds)."""
    from bridge.readsets import read_sets

    doc = json.loads(forge["text"])
    kept = [r for r in doc["rows"] if r[1] != "ir"]
    first = len(kept)
    shifted = [[p + first if p >= 0 else p, op, o, w] for p, op, o, w in rows]
    doc["rows"], doc["partial"] = kept + shifted, []
    text = json.dumps(doc)
    now = read_sets.wants(text, forge["kernel"], forge["given"], forge["modules"], forge["backend"])
    if isinstance(now, list):  # (each want as the reads find it: the read set holds)
        doc["rows"] = [[*r[:3], w] for r, w in zip(doc["rows"], now, strict=True)]
    return json.dumps(doc)


def _arg(row: int) -> list[Any]:
    return ["r", row]


#: forged rows (parents relative to the first forged row: -1 is the kernel), each of which
#: would run code were a check to make its calls
FORGED = {
    "exec-through-builtins": [
        [-1, "g", "builtins", ""],
        [0, "a", "exec", ""],
        [1, "c", [[["v", ["s", "import os; os._exit(7)"]]], []], ""],
    ],
    "os-exit": [
        [-1, "g", "os", ""],
        [0, "a", "_exit", ""],
        [1, "c", [[["v", ["i", "7"]]], []], ""],
    ],
    "sys-modules-to-subprocess": [
        [-1, "g", "sys", ""],
        [0, "a", "modules", ""],
        [1, "i", ["v", ["s", "os"]], ""],
        [2, "a", "system", ""],
        [3, "c", [[["v", ["s", "touch /tmp/kc-forged-76"]]], []], ""],
    ],
    "jax-calls-a-found-function": [
        [-1, "g", "jax", ""],
        [0, "a", "tree_util", ""],
        [1, "a", "tree_map", ""],
        [-1, "g", "trip", ""],
        [2, "c", [[_arg(3), ["v", ["t", [["i", "1"]]]]], []], ""],
    ],
    "a-sleep-in-c": [
        [-1, "g", "os", ""],
        [0, "a", "sys", ""],
        [-1, "g", "builtins", ""],
        [2, "a", "__import__", ""],
        [3, "c", [[["v", ["s", "time"]]], []], ""],
        [4, "a", "sleep", ""],
        [5, "c", [[["v", ["i", "25"]]], []], ""],
    ],
    "a-program-function-given-anything": [
        [-1, "g", "pick", ""],
        [0, "c", [[["v", ["i", "7"]]], []], ""],
        [-1, "g", "trip", ""],
        [2, "c", [[_arg(0)], [["x", _arg(1)]]], ""],
    ],
    "numpy-allocating": [
        [-1, "g", "jax", ""],
        [0, "a", "numpy", ""],
        [1, "a", "ones", ""],
        [2, "c", [[["v", ["t", [["i", "20000"], ["i", "20000"]]]]], []], ""],
    ],
    "builtins-on-found-objects": [
        [-1, "g", "trip", ""],
        [-1, "b", ["len", [_arg(0)]], ""],
        [-1, "b", ["isinstance", [_arg(0), _arg(0)]], ""],
        [-1, "b", ["getattr", [_arg(0), ["v", ["s", "value"]]]], ""],
    ],
}


@pytest.mark.parametrize("rows", FORGED.values(), ids=FORGED.keys())
def test_a_forged_read_set_runs_no_code(forge, rows):
    start = time.process_time()
    verdict, entered, peak = _check(forge, _with_rows(forge, rows))
    cpu = time.process_time() - start
    assert entered == [], f"a check entered code that is not its own: {entered}"
    assert not os.path.exists("/tmp/kc-forged-76")
    # (the CPU this process spent, not the wall time: a loaded machine does not change it)
    assert peak < 100 << 20 and cpu < 1.0
    assert verdict.kind in ("fresh", "changed")  # (whatever it says, it says it as data)


def test_the_compiles_own_read_set_holds(forge):
    verdict, entered, _ = _check(forge, forge["text"])
    assert verdict.fresh and entered == []


#: every verdict a check gives
KINDS = ("fresh", "changed", "refused", "unchecked")
#: names a walk may take: the kernel's globals, then what their namespaces hold
ROOTS = ["builtins", "os", "sys", "jax", "tl", "triton", "trip", "pick", "HIT"]


def _names(value: Any) -> list[str]:
    """The names in ``value``'s own namespace (a module's, a class's, an object's), read as a
    forger would read them to choose a walk."""
    space = getattr(value, "__dict__", None) if not isinstance(value, dict) else None
    if isinstance(space, dict) or type(space).__name__ == "mappingproxy":
        return sorted(str(k) for k in space if isinstance(k, str) and k.isidentifier())[:200]
    return []


@st.composite
def _walks(draw: Any, module: Any) -> list[list[Any]]:
    """Rows of a forged read set: walks of names from the kernel's globals through whatever
    their namespaces hold, with calls, built-ins and items on what they find."""
    rows: list[list[Any]] = []
    found: list[Any] = []
    for _ in range(draw(st.integers(1, 12))):
        choice = draw(st.sampled_from(["g", "a", "a", "a", "c", "b", "i"]))
        if choice == "g" or not found:
            name = draw(st.sampled_from(ROOTS))
            rows.append([-1, "g", name, ""])
            found.append(getattr(module, name, None))
            continue
        at = draw(st.integers(0, len(found) - 1))
        if choice == "a":
            names = _names(found[at]) or ["__init__"]
            name = draw(st.sampled_from(names))
            rows.append([at, "a", name, ""])
            found.append(vars(found[at]).get(name) if hasattr(found[at], "__dict__") else None)
        elif choice == "c":
            args = draw(st.lists(st.sampled_from([["v", ["i", "3"]], ["v", ["s", "x"]], _arg(at)])))
            rows.append([at, "c", [args[:3], []], ""])
            found.append(None)
        elif choice == "b":
            name = draw(st.sampled_from(["len", "list", "range", "isinstance", "getattr", "int"]))
            rows.append([-1, "b", [name, [_arg(at), ["v", ["s", "value"]]][:2]], ""])
            found.append(None)
        else:
            rows.append(
                [at, "i", draw(st.sampled_from([["v", ["s", "os"]], ["v", ["i", "0"]]])), ""]
            )
            found.append(None)
    return rows


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_walk_of_names_runs_no_code(forge, data):
    from bridge.entries import metadata

    rows = data.draw(_walks(forge["module"]))
    text = _with_rows(forge, rows)
    if metadata.problem(text) is not None:
        return  # (refused at the door: never checked)
    verdict, entered, peak = _check(forge, text)
    assert entered == [] and peak < 100 << 20 and verdict.kind in KINDS
    assert not os.path.exists("/tmp/kc-forged-76")


def test_read_sets_past_what_a_check_of_one_entry_does_are_refused_before_any_read(forge):
    from bridge.readsets import read_sets

    start = time.process_time()
    many = read_sets.stale([forge["text"]] * 600, forge["kernel"], forge["given"], forge["backend"])
    assert many.kind == "refused" and "600 read sets" in many.reason
    rows = json.loads(forge["text"])["rows"]
    doc = {"format": read_sets.FORMAT, "partial": [], "rows": rows[:1] * 1900}
    long = read_sets.stale(
        [json.dumps(doc)] * 20, forge["kernel"], forge["given"], forge["backend"]
    )
    assert long.kind == "refused" and "reads in all" in long.reason
    assert time.process_time() - start < 1.0
